//! How one agent runs: its [`AgentConfig`].

use std::time::Duration;

use crate::{handshake, pb};

/// How one agent runs.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    /// What it can do.
    pub capabilities: Vec<pb::Capability>,
    /// Its AtpService URL as peers reach it (`http://127.0.0.1:PORT`).
    pub public_url: String,
    /// The SCD service it uses when it delegates (`--scd`).
    pub scd_url: String,
    /// Tasks it queues beyond the ones running; a full queue answers
    /// RESOURCE_EXHAUSTED and signals back-pressure.
    pub max_queue: usize,
    /// Tasks it runs at once.
    pub max_running: usize,
    /// Heartbeat interval (T_fail = 3 × this at the requester).
    pub heartbeat: Duration,
    /// The context budget it asks for in its offers (tokens), for a task
    /// outside its specialization.
    pub context_budget_tokens: u32,
    /// Its specialization, embedded by SCD as a query (`--specialization`):
    /// a task that fits it gets a smaller requirement
    /// ([`handshake::context_requirement`]); none = the whole budget always.
    pub specialization: Option<pb::Embedding>,
    /// Caps and idle timeouts of its listener (a peer is an adversary until
    /// verified: one must not hold every socket).
    pub connections: scd_net::ConnLimits,
    /// Hosts a contract's `reply_to` may name besides the address the
    /// contract came from (`--reply-to-host`): the worker sends heartbeats
    /// and context requests there, so a requester may not aim it elsewhere.
    pub reply_to_hosts: Vec<String>,
    /// Signed messages per second one sender DID may send (its bucket's
    /// refill, paper §11.2), checked after its signature and before the
    /// fsync'd replay-log write.
    pub rate_per_did: f64,
    /// Messages one sender DID may send at once after being idle.
    pub burst_per_did: u32,
    /// TLS of its listener (`--tls-cert`/`--tls-key`, mTLS with
    /// `--client-ca`); plaintext when `None`.
    pub server_tls: Option<tonic::transport::ServerTlsConfig>,
    /// TLS toward `https://` peers (`--peer-ca`, and `--peer-cert`/
    /// `--peer-key` for mTLS); without it an `https://` peer is refused.
    pub client_tls: Option<tonic::transport::ClientTlsConfig>,
    /// How long its offers stay open for a contract (their `ttl_ms`; a
    /// contract on an older one is refused).
    pub offer_ttl_ms: u64,
}

impl AgentConfig {
    /// A config with the defaults: queue 8, 2 running, heartbeat 1 s, 512-token budget,
    /// offers open [`handshake::OFFER_TTL_MS`].
    pub fn new(capabilities: Vec<pb::Capability>, public_url: String, scd_url: String) -> AgentConfig {
        AgentConfig {
            capabilities,
            public_url,
            scd_url,
            max_queue: 8,
            max_running: 2,
            heartbeat: Duration::from_secs(1),
            context_budget_tokens: 512,
            specialization: None,
            connections: scd_net::ConnLimits::default(),
            reply_to_hosts: Vec::new(),
            rate_per_did: 100.0,
            burst_per_did: 200,
            server_tls: None,
            client_tls: None,
            offer_ttl_ms: handshake::OFFER_TTL_MS,
        }
    }
}
