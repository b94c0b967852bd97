//! `scd atp …`: the ATP stack (see the `scd-atp` crate).

use std::io::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context as _};
use clap::{Args, Subcommand};
use scd_atp::agent::{AgentConfig, Node};
use scd_atp::identity::{DidResolver, Identity, Verifier};
use scd_atp::pb;
use scd_atp::store::{Ledger, Store};

/// ATP subcommands.
#[derive(Debug, Subcommand)]
pub enum AtpCommand {
    /// Run one ATP agent (atp.v1.AtpService over gRPC).
    Agent(Box<AgentArgs>),
}

/// `scd atp agent`.
#[derive(Debug, Args)]
pub struct AgentArgs {
    /// Address to serve atp.v1 on (port 0 = any; the ready line names it).
    #[arg(long, env = "SCD_ATP_ADDR", default_value = "127.0.0.1:7700")]
    pub addr: SocketAddr,
    /// The URL peers reach this agent at: its contracts' reply_to, where
    /// workers send heartbeats and context requests (default: the --addr it
    /// listens on; needed when that is 0.0.0.0 or [::], which no peer can
    /// call). Its scheme is https with --tls-cert, else http.
    #[arg(long, env = "SCD_ATP_PUBLIC_URL")]
    pub public_url: Option<String>,
    /// The SCD service this agent uses when it delegates.
    #[arg(long, env = "SCD_ATP_SCD", default_value = "http://127.0.0.1:50051")]
    pub scd: String,
    /// TYPE:QUALITY:LATENCY_MS:COST, repeatable; TYPE is code_generation,
    /// analysis, creative_writing or data_processing.
    #[arg(long = "capability", required = true)]
    pub capabilities: Vec<String>,
    /// Identity file (Ed25519 key and DID), created on first start with
    /// mode 0600; the key is never printed.
    #[arg(long, env = "SCD_ATP_IDENTITY", default_value = "atp-identity.json")]
    pub identity: PathBuf,
    /// Directory of the embedded store (proofs, trust, seen nonces, checkpoints).
    #[arg(long, env = "SCD_ATP_STORE", default_value = "atp-store")]
    pub store: PathBuf,
    /// Audit trail of the context transfers this agent sends (one
    /// `AtpTransfer` record each, in the store's file): off, summary or chunks.
    #[arg(long, env = "SCD_ATP_AUDIT_LEVEL", default_value = "summary")]
    pub audit_level: scd_audit::AuditLevel,
    /// Transfer records older than this are removed (e.g. 7d, 12h).
    #[arg(long, env = "SCD_ATP_AUDIT_MAX_AGE", value_parser = super::parse_duration)]
    pub audit_max_age: Option<Duration>,
    /// The oldest transfer records are removed past this summed JSON size
    /// in bytes (default 1 GiB; `none` keeps every record).
    #[arg(long, env = "SCD_ATP_AUDIT_MAX_BYTES", value_parser = super::parse_audit_max_bytes)]
    pub audit_max_bytes: Option<super::AuditMaxBytes>,
    /// Directory of did:wba documents (<dir>/<host>/did.json) for verifying
    /// did:wba peers; no network lookups.
    #[arg(long, env = "SCD_ATP_DID_DIR")]
    pub did_dir: Option<PathBuf>,
    /// Sign as this did:wba (e.g. did:wba:agents.example.com:coder) instead of
    /// the key's did:key; its document is served on --http-addr.
    #[arg(long, env = "SCD_ATP_DID_WBA")]
    pub did_wba: Option<String>,
    /// Serve this agent's DID document over HTTP here: GET
    /// /.well-known/did.json (did:wba:host or did:key) or /<path>/did.json
    /// (did:wba:host:path…).
    #[arg(long, env = "SCD_ATP_HTTP_ADDR")]
    pub http_addr: Option<SocketAddr>,
    /// Heartbeat interval to requesters (T_fail there = 3 × this).
    #[arg(long, default_value_t = 1000)]
    pub heartbeat_ms: u64,
    /// Tasks queued beyond the running ones; a full queue answers RESOURCE_EXHAUSTED.
    #[arg(long, default_value_t = 8)]
    pub max_queue: usize,
    /// Tasks run at once.
    #[arg(long, default_value_t = 2)]
    pub max_running: usize,
    /// Context budget (tokens) this agent asks for in its offers, for a task
    /// outside its --specialization.
    #[arg(long, default_value_t = 512)]
    pub context_budget: u32,
    /// What this agent specializes in, in words (embedded through --scd at
    /// start): for a task that fits it, its offers ask for up to half the
    /// budget (paper §6.2 step 2).
    #[arg(long, env = "SCD_ATP_SPECIALIZATION")]
    pub specialization: Option<String>,
    /// A host a contract's reply_to may name besides the address the
    /// contract came from (repeatable; e.g. a requester behind a proxy).
    /// The agent sends heartbeats and context requests to reply_to, so by
    /// default it calls back only the requester's own address.
    #[arg(long = "reply-to-host", env = "SCD_ATP_REPLY_TO_HOSTS", value_delimiter = ',')]
    pub reply_to_hosts: Vec<String>,
    /// Signed messages per second one sender DID may send (paper §11.2);
    /// over it: RESOURCE_EXHAUSTED with retry-after-ms.
    #[arg(long, env = "SCD_ATP_RATE_PER_DID", default_value_t = 100.0)]
    pub rate_per_did: f64,
    /// Messages one sender DID may send at once after being idle.
    #[arg(long, env = "SCD_ATP_BURST_PER_DID", default_value_t = 200, value_parser = clap::value_parser!(u32).range(1..))]
    pub burst_per_did: u32,
    /// Caps and idle timeouts of the ATP listener.
    #[command(flatten)]
    pub grpc_conn: crate::config::GrpcConnArgs,
    /// Serve atp.v1 over TLS with this certificate chain (PEM); peers then
    /// reach this agent at https://.
    #[arg(long, env = "SCD_ATP_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert (PEM).
    #[arg(long, env = "SCD_ATP_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// mTLS: peers must present a certificate signed by this CA (PEM).
    #[arg(long, env = "SCD_ATP_CLIENT_CA", requires = "tls_cert")]
    pub client_ca: Option<PathBuf>,
    /// The CA that signed https:// peers' certificates (PEM): heartbeats,
    /// back-pressure and context requests to a requester's https:// reply_to
    /// go over TLS checked against it. Without it an https:// peer is refused.
    #[arg(long, env = "SCD_ATP_PEER_CA")]
    pub peer_ca: Option<PathBuf>,
    /// This agent's certificate toward https:// peers that ask for one (mTLS).
    #[arg(long, env = "SCD_ATP_PEER_CERT", requires = "peer_key", requires = "peer_ca")]
    pub peer_cert: Option<PathBuf>,
    /// The private key of --peer-cert (PEM).
    #[arg(long, env = "SCD_ATP_PEER_KEY", requires = "peer_cert")]
    pub peer_key: Option<PathBuf>,
}

/// A capability from `TYPE:QUALITY:LATENCY_MS:COST`.
pub fn parse_capability(s: &str) -> anyhow::Result<pb::Capability> {
    let parts: Vec<&str> = s.split(':').collect();
    let [kind, quality, latency, cost] = parts[..] else {
        bail!("--capability {s:?}: expected TYPE:QUALITY:LATENCY_MS:COST");
    };
    let task_type = match kind {
        "code_generation" => pb::TaskType::CodeGeneration,
        "analysis" => pb::TaskType::Analysis,
        "creative_writing" => pb::TaskType::CreativeWriting,
        "data_processing" => pb::TaskType::DataProcessing,
        _ => bail!(
            "--capability {s:?}: TYPE {kind:?} is not code_generation, analysis, creative_writing or data_processing"
        ),
    };
    let quality: f64 = quality.parse().with_context(|| format!("--capability {s:?}: QUALITY"))?;
    if !(0.0..=1.0).contains(&quality) {
        bail!("--capability {s:?}: QUALITY {quality} is outside [0, 1]");
    }
    let latency: u64 =
        latency.parse().with_context(|| format!("--capability {s:?}: LATENCY_MS (whole milliseconds)"))?;
    if latency == 0 || latency > 3_600_000 {
        bail!("--capability {s:?}: LATENCY_MS {latency} is outside 1 to 3600000");
    }
    let cost: f64 = cost.parse().with_context(|| format!("--capability {s:?}: COST"))?;
    if !cost.is_finite() || cost < 0.0 {
        bail!("--capability {s:?}: COST {cost} is not a cost ≥ 0");
    }
    Ok(pb::Capability {
        task_type: task_type as i32,
        estimated_quality: quality,
        estimated_latency_ms: latency,
        cost_per_task: cost,
    })
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread().enable_all().build().context("starting the async runtime")
}

/// Runs `scd atp agent`.
pub fn agent(args: AgentArgs) -> anyhow::Result<()> {
    let capabilities = checked_capabilities(&args)?;
    let connections = args.grpc_conn.limits()?;
    let server_tls = crate::tls::server_config(&crate::tls::ServerTlsFiles {
        cert: args.tls_cert.clone(),
        key: args.tls_key.clone(),
        client_ca: args.client_ca.clone(),
    })?;
    let client_tls =
        crate::tls::peer_config(args.peer_ca.as_deref(), args.peer_cert.as_deref().zip(args.peer_key.as_deref()))?;
    let mut identity = Identity::load_or_create(&args.identity)?;
    if let Some(did) = &args.did_wba {
        if !did.starts_with("did:wba:") {
            bail!("--did-wba {did:?}: must start with did:wba:");
        }
        identity = identity.with_did(did)?;
    }
    let store = Arc::new(Store::open(&args.store)?);
    let resolver: Arc<dyn scd_atp::identity::Resolver> = match &args.did_dir {
        Some(dir) => Arc::new(DidResolver::with_wba_dir(dir)),
        None => Arc::new(DidResolver::new()),
    };
    let retention = super::audit_retention(args.audit_max_age, args.audit_max_bytes)?;
    let audit = store.audit_log(args.audit_level, retention)?;
    let verifier = Verifier::new(resolver.clone(), store.clone());
    let ledger = Ledger::open(store, identity.did(), scd_atp::trust::TrustParams::default(), resolver)?;
    if args.specialization.as_deref().is_some_and(|t| t.trim().is_empty() || t.len() > 4096) {
        bail!("--specialization: must be 1 to 4096 bytes of text");
    }
    runtime()?.block_on(async move {
        let specialization = embed_specialization(&args).await?;
        let listener = tokio::net::TcpListener::bind(args.addr)
            .await
            .with_context(|| format!("--addr {}: cannot listen", args.addr))?;
        let addr = listener.local_addr()?;
        let url = public_url(args.public_url.as_deref(), addr, server_tls.is_some())?;
        let mut config = AgentConfig::new(capabilities, url, args.scd.clone());
        config.server_tls = server_tls;
        config.client_tls = client_tls;
        config.heartbeat = Duration::from_millis(args.heartbeat_ms);
        config.max_queue = args.max_queue;
        config.max_running = args.max_running;
        config.context_budget_tokens = args.context_budget;
        config.specialization = specialization;
        config.connections = connections;
        config.reply_to_hosts = args.reply_to_hosts.clone();
        config.rate_per_did = args.rate_per_did;
        config.burst_per_did = args.burst_per_did;
        let document = (did_document_path(identity.did()), identity.did_document_json());
        let node = Node::new(identity, verifier, ledger, config);
        node.set_audit(Arc::new(audit));
        let mut ready = serde_json::json!({
            "event": "ready",
            "did": node.did(),
            "addr": addr.to_string(),
            "url": node.config.public_url,
        });
        if let Some(http) = args.http_addr {
            ready["http"] = serve_did_document(http, document).await?.into();
        }
        let mut stdout = std::io::stdout().lock();
        writeln!(stdout, "{ready}")?;
        stdout.flush()?;
        drop(stdout);
        tracing::info!(did = node.did(), %addr, "atp agent serving");
        scd_atp::agent::serve(node, listener, crate::server::shutdown_signal()).await?;
        Ok(())
    })
}

/// The agent's capabilities from `--capability`, one per task type, and
/// its flags checked against their ranges.
fn checked_capabilities(args: &AgentArgs) -> anyhow::Result<Vec<pb::Capability>> {
    let capabilities = args.capabilities.iter().map(|c| parse_capability(c)).collect::<anyhow::Result<Vec<_>>>()?;
    for (i, c) in capabilities.iter().enumerate() {
        if capabilities[..i].iter().any(|d| d.task_type == c.task_type) {
            bail!(
                "--capability: two capabilities for {}",
                pb::TaskType::try_from(c.task_type).map_or("?", |t| t.as_str_name())
            );
        }
    }
    if !(args.rate_per_did.is_finite() && args.rate_per_did >= scd_net::rate::DidRateLimiter::MIN_RATE_PER_S) {
        bail!(
            "--rate-per-did {}: must be at least {} messages/s",
            args.rate_per_did,
            scd_net::rate::DidRateLimiter::MIN_RATE_PER_S
        );
    }
    if args.heartbeat_ms == 0 || args.heartbeat_ms > 60_000 {
        bail!("--heartbeat-ms {}: must be 1 to 60000", args.heartbeat_ms);
    }
    if args.max_running == 0 || args.max_running > 1024 || args.max_queue > 65_536 {
        bail!("--max-running must be 1 to 1024 and --max-queue at most 65536");
    }
    if args.context_budget == 0 {
        bail!("--context-budget 0: must be at least 1 token");
    }
    Ok(capabilities)
}

/// The task embedding of `--specialization`, from SCD.
async fn embed_specialization(args: &AgentArgs) -> anyhow::Result<Option<pb::Embedding>> {
    let Some(text) = &args.specialization else { return Ok(None) };
    let task = scd_atp::context::Task::new(text);
    let scd = scd_atp::context::ScdLink::connect(&args.scd)
        .await
        .with_context(|| format!("--specialization: reaching SCD at {} to embed it", args.scd))?;
    let e = scd.embed_task(&task).await.context("--specialization: embedding it")?;
    Ok(Some(e))
}

/// Serves the agent's DID document (`document`: its path and body) over
/// HTTP on `http` (`--http-addr`); returns the address it listens on.
async fn serve_did_document(http: SocketAddr, document: (String, serde_json::Value)) -> anyhow::Result<String> {
    let listener =
        tokio::net::TcpListener::bind(http).await.with_context(|| format!("--http-addr {http}: cannot listen"))?;
    let local = listener.local_addr()?.to_string();
    let (path, doc) = document;
    let body = serde_json::to_string_pretty(&doc)?;
    let router = axum::Router::new().route(
        &path,
        axum::routing::get(move || {
            let body = body.clone();
            async move { ([(http::header::CONTENT_TYPE, "application/did+json")], body) }
        }),
    );
    let limits = crate::http::HttpLimits::default();
    tokio::spawn(crate::http::serve_router(listener, router, limits, |_| {}));
    Ok(local)
}

/// The URL peers reach an agent listening on `addr` at: `given`
/// (`--public-url`), checked, or the address itself. Its scheme must be the
/// one served (`tls`); an address on every interface is no URL to call.
pub fn public_url(given: Option<&str>, addr: SocketAddr, tls: bool) -> anyhow::Result<String> {
    let scheme = if tls { "https" } else { "http" };
    let Some(given) = given else {
        if addr.ip().is_unspecified() {
            bail!(
                "--addr {addr} listens on every interface, which no peer can call back: give --public-url, \
                 the URL peers reach this agent at"
            );
        }
        return Ok(format!("{scheme}://{addr}"));
    };
    let uri: http::Uri = given.parse().map_err(|_| anyhow::anyhow!("--public-url: not a URL"))?;
    if uri.scheme_str() != Some(scheme) {
        bail!("--public-url: must be an {scheme}:// URL, as this agent serves {scheme} (--tls-cert decides)");
    }
    let host = uri.host().unwrap_or_default().trim_start_matches('[').trim_end_matches(']');
    if host.is_empty() || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_unspecified()) {
        bail!("--public-url: needs a host peers can reach (not 0.0.0.0 or [::])");
    }
    if uri.path() != "/" || uri.query().is_some() {
        bail!("--public-url: scheme, host and port only (atp.v1 is served at the root)");
    }
    Ok(format!("{scheme}://{}", uri.authority().expect("a URL with a host has an authority")))
}

/// Where a DID's document is served: `/.well-known/did.json` for
/// `did:wba:host` (and did:key), `/a/b/did.json` for `did:wba:host:a:b`.
pub fn did_document_path(did: &str) -> String {
    let segments: Vec<&str> = did.strip_prefix("did:wba:").map(|r| r.split(':').skip(1).collect()).unwrap_or_default();
    if segments.is_empty() {
        "/.well-known/did.json".into()
    } else {
        format!("/{}/did.json", segments.join("/"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_public_url_is_one_peers_can_call() {
        let any: SocketAddr = "0.0.0.0:7700".parse().unwrap();
        let lo: SocketAddr = "127.0.0.1:7700".parse().unwrap();
        assert_eq!(public_url(None, lo, false).unwrap(), "http://127.0.0.1:7700");
        assert_eq!(public_url(None, lo, true).unwrap(), "https://127.0.0.1:7700");
        assert_eq!(public_url(Some("http://agent.lan:7700/"), any, false).unwrap(), "http://agent.lan:7700");
        assert_eq!(public_url(Some("https://[2001:db8::7]:443"), any, true).unwrap(), "https://[2001:db8::7]:443");
        for (given, addr, tls, why) in [
            (None, any, false, "--addr 0.0.0.0:7700 listens on every interface"),
            (None, "[::]:7700".parse().unwrap(), false, "give --public-url"),
            (Some("agent.lan:7700"), any, false, "--public-url: must be an http:// URL"),
            (Some("http://agent.lan:7700"), any, true, "--public-url: must be an https:// URL"),
            (Some("http://0.0.0.0:7700"), any, false, "--public-url: needs a host"),
            (Some("http://[::]:7700"), any, false, "--public-url: needs a host"),
            (Some("http://agent.lan:7700/atp"), any, false, "--public-url: scheme, host and port only"),
            (Some("http://agent.lan:7700/?x=1"), any, false, "--public-url: scheme, host and port only"),
            (Some("not a url"), any, false, "--public-url: not a URL"),
        ] {
            let e = public_url(given, addr, tls).unwrap_err().to_string();
            assert!(e.starts_with(why) || e.contains(why), "{given:?}: {e}");
        }
    }

    #[test]
    fn did_documents_are_served_where_did_wba_says() {
        assert_eq!(did_document_path("did:wba:example.com"), "/.well-known/did.json");
        assert_eq!(did_document_path("did:wba:example.com%3A8443"), "/.well-known/did.json");
        assert_eq!(did_document_path("did:wba:example.com:agents:coder"), "/agents/coder/did.json");
        assert_eq!(did_document_path("did:key:z6Mkabc"), "/.well-known/did.json");
    }

    #[test]
    fn capabilities_parse_strictly() {
        let c = parse_capability("code_generation:0.9:800:0.02").unwrap();
        assert_eq!((c.task_type, c.estimated_quality, c.estimated_latency_ms, c.cost_per_task), (1, 0.9, 800, 0.02));
        for (bad, why) in [
            ("code_generation:0.9:800", "expected TYPE:QUALITY:LATENCY_MS:COST"),
            ("coding:0.9:800:0.02", "TYPE \"coding\" is not"),
            ("analysis:1.2:800:0.02", "QUALITY 1.2 is outside [0, 1]"),
            ("analysis:0.9:0:0.02", "LATENCY_MS 0 is outside"),
            ("analysis:0.9:8.5:0.02", "LATENCY_MS (whole milliseconds)"),
            ("analysis:0.9:800:-1", "COST -1 is not a cost"),
        ] {
            let err = format!("{:#}", parse_capability(bad).unwrap_err());
            assert!(err.contains(why), "{bad}: {err}");
        }
    }
}
