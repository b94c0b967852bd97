//! An ATP agent: a tonic server of `atp.v1.AtpService` plus the clients it
//! uses to reach its peers.
//!
//! Every agent answers probes with signed offers (layer 2), accepts
//! contracts, runs the tasks it is contracted for (their "work" is
//! simulated: a number of steps, each checkpointed, whose length comes from
//! the agent's declared latency), asks its requester for more context when
//! its confidence drops below θ (layer 3), sends heartbeats and back-pressure
//! to its requesters (layer 5), and countersigns the interaction proofs its
//! requesters send it, appending them to its Merkle log (layer 1).
//!
//! The requester side (probing, routing, SCD transfers, failover) is in
//! [`crate::planner`]; a planner is an agent too, so its workers can reach
//! it with RequestContext, SendHeartbeat and ReportBackpressure.
//!
//! Every signed message goes through the [`Verifier`] first: unsigned,
//! tampered, foreign-key, stale or replayed messages are UNAUTHENTICATED.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{watch, Semaphore};
use tokio_stream::Stream;
use tonic::transport::Channel;
use tonic::{Request, Response, Status};

use crate::bounded::bounded_insert;
use crate::context::THETA;
use crate::handshake::{self, OfferTerms};
use crate::identity::SignMessages as _;
use crate::identity::{Identity, Signed, Verifier};
use crate::requester::PlannerState;
use crate::store::Ledger;
use crate::work::{normalize, reading_text};
pub use crate::work::{WorkOrder, WorkReport, MAX_NEEDS, MAX_PAYLOAD_BYTES, MAX_STEPS};
use crate::{pb, Error, Result};

/// A job's key: (submitter DID, task id).
type JobKey = (String, String);

fn job_key(submitter: &Option<pb::AgentId>, task_id: &str) -> JobKey {
    (sender(submitter).to_string(), task_id.to_string())
}

/// The most chunks a task's context (or its checkpoint) may hold.
pub const MAX_CONTEXT_CHUNKS: usize = 1024;
/// The longest chunk id or field name, in bytes.
pub const MAX_CHUNK_NAME_BYTES: usize = 256;

/// Checks the shape of a context a peer sent: at most
/// [`MAX_CONTEXT_CHUNKS`] chunks (and withheld fields), names of at most
/// [`MAX_CHUNK_NAME_BYTES`]; the error names the field and the limit.
fn check_context(diff: &pb::ContextDiff, field: &str) -> Result<(), Status> {
    if diff.chunks.len() > MAX_CONTEXT_CHUNKS || diff.withheld_fields.len() > MAX_CONTEXT_CHUNKS {
        return Err(Status::invalid_argument(format!(
            "{field}: {} chunks and {} withheld fields, over the limit of {MAX_CONTEXT_CHUNKS} each",
            diff.chunks.len(),
            diff.withheld_fields.len()
        )));
    }
    let long = |s: &str| s.len() > MAX_CHUNK_NAME_BYTES;
    if let Some(i) = diff.chunks.iter().position(|c| long(&c.chunk_id) || long(&c.field)) {
        return Err(Status::invalid_argument(format!(
            "{field}.chunks[{i}]: a chunk_id or field over {MAX_CHUNK_NAME_BYTES} bytes"
        )));
    }
    if diff.withheld_fields.iter().any(|f| long(f)) {
        return Err(Status::invalid_argument(format!(
            "{field}.withheld_fields: a name over {MAX_CHUNK_NAME_BYTES} bytes"
        )));
    }
    Ok(())
}

/// Offers remembered for contracts (oldest dropped first).
const MAX_OPEN_OFFERS: usize = 4096;
/// Contracts and tasks remembered.
const MAX_CONTRACTS: usize = 4096;

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
}

impl AgentConfig {
    /// A config with the defaults: queue 8, 2 running, heartbeat 1 s, 512-token budget.
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
        }
    }
}

/// A contract this agent accepted.
#[derive(Debug, Clone)]
struct Contract {
    contract: pb::ContractAccept,
    accepted: Instant,
}

/// A task this agent runs (or ran), keyed by its submitter's DID and its
/// task id: one requester's ids never reach another's jobs.
struct Job {
    /// Its results, numbered: only the latest step's is kept, and the final
    /// one after it, so a job holds one checkpoint at most, however many
    /// steps (a reader slower than the steps skips to the latest).
    results: watch::Sender<Vec<(u64, pb::TaskResult)>>,
    /// The number of the last result pushed.
    pushed: AtomicU64,
    /// Whether its interaction proof was countersigned (one per task).
    proved: std::sync::atomic::AtomicBool,
    /// The countersigned proof's digest and the ack it got (unstamped): the
    /// same proof sent again (its answer was lost) gets that ack again,
    /// freshly stamped, instead of a refusal.
    proof_ack: Mutex<Option<([u8; 32], pb::ProofAck)>>,
}

/// State shared by the server, its background loops and its planner.
pub struct Node {
    /// Who this agent is.
    pub identity: Identity,
    /// Checks every signed message that arrives.
    pub verifier: Verifier,
    /// Interaction proofs, trust, checkpoints (durable).
    pub ledger: Mutex<Ledger>,
    /// How it runs.
    pub config: AgentConfig,
    offers: Mutex<HashMap<u64, (String, Instant)>>,
    contracts: Mutex<HashMap<String, Contract>>,
    jobs: Mutex<HashMap<JobKey, Arc<Job>>>,
    /// requester URL → requester DID → tasks running for it (heartbeat
    /// targets; each heartbeat names its receiver)
    contacts: Mutex<HashMap<String, HashMap<String, usize>>>,
    queue: Arc<Semaphore>,
    running: Arc<Semaphore>,
    heartbeat_seq: AtomicU64,
    /// The requester side (SCD sessions, health of workers, breakers).
    pub planner: PlannerState,
    /// The audit trail of the context transfers it sends (one `AtpTransfer`
    /// record per delegation), once [`Node::set_audit`] gave it one.
    audit: std::sync::OnceLock<Arc<scd_audit::AuditLog>>,
    /// Each sender DID's rate ([`AgentConfig::rate_per_did`]).
    limiter: scd_net::rate::DidRateLimiter,
}

/// Runs `f` (blocking I/O) so that the runtime moves its other tasks off
/// this thread meanwhile; directly on a current-thread runtime.
fn blocking<T>(f: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current() {
        Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => tokio::task::block_in_place(f),
        _ => f(),
    }
}

impl Node {
    /// An agent's state.
    pub fn new(identity: Identity, verifier: Verifier, ledger: Ledger, config: AgentConfig) -> Arc<Node> {
        Arc::new(Node {
            identity,
            verifier,
            ledger: Mutex::new(ledger),
            queue: Arc::new(Semaphore::new(config.max_queue + config.max_running)),
            running: Arc::new(Semaphore::new(config.max_running)),
            planner: PlannerState::new(&config.scd_url),
            limiter: scd_net::rate::DidRateLimiter::new(config.rate_per_did, config.burst_per_did),
            config,
            offers: Mutex::default(),
            contracts: Mutex::default(),
            jobs: Mutex::default(),
            contacts: Mutex::default(),
            heartbeat_seq: AtomicU64::new(0),
            audit: std::sync::OnceLock::new(),
        })
    }

    /// Records every context transfer this agent sends in `log` (usually
    /// [`crate::store::Store::audit_log`] of its own store); false when it
    /// already had a log (the first one stays).
    pub fn set_audit(&self, log: Arc<scd_audit::AuditLog>) -> bool {
        self.audit.set(log).is_ok()
    }

    /// The audit trail, if [`Node::set_audit`] gave it one.
    pub fn audit_log(&self) -> Option<&Arc<scd_audit::AuditLog>> {
        self.audit.get()
    }

    /// A peer's endpoint, over TLS for an `https://` URL ([`handshake::channel_with`]).
    pub fn channel(&self, url: &str) -> Result<tonic::transport::Channel> {
        handshake::channel_with(url, self.config.client_tls.as_ref())
    }

    /// This agent's DID.
    pub fn did(&self) -> &str {
        self.identity.did()
    }

    /// A signed message's checks: its signature (no I/O), then whether its
    /// sender has rate left, then the clock and the durable replay log (an
    /// fsync'd write, in `block_in_place`); only a message that passed all
    /// of them takes from its sender's rate, so replayed or stale copies of
    /// someone's message drain nothing. A sender over its rate is
    /// RESOURCE_EXHAUSTED with `retry-after-ms`, and its nonce is not used
    /// up.
    fn verify<M: Signed>(&self, msg: &M) -> Result<(), Status> {
        let did = self.verifier.check_signature(msg).map_err(Status::from)?;
        if let Err(wait) = self.limiter.peek_at(did, Instant::now()) {
            let ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX).max(1);
            let mut s = Status::resource_exhausted(format!(
                "the sender is over its rate: {} messages/s, burst {} (--rate-per-did, --burst-per-did); retry after {ms} ms",
                self.config.rate_per_did, self.config.burst_per_did
            ));
            s.metadata_mut().insert("retry-after-ms", ms.into());
            return Err(s);
        }
        blocking(|| self.verifier.verify(msg)).map_err(Status::from)?;
        // concurrent messages may all have peeked one request: at most that
        // many past the burst
        let _ = self.limiter.check_at(did, Instant::now());
        Ok(())
    }

    /// Refuses a signed message naming another receiver (or none): one
    /// requester's view of a worker cannot be replayed to another.
    fn check_receiver(&self, to: &Option<pb::AgentId>, field: &str) -> Result<(), Status> {
        match to.as_ref().map(|a| a.uuid.as_str()) {
            Some(did) if did == self.did() => Ok(()),
            Some(_) => Err(Status::invalid_argument(format!("{field}: this message is for another agent"))),
            None => Err(Status::invalid_argument(format!(
                "{field}: missing (the receiver's DID is signed, so that the message cannot be replayed to another)"
            ))),
        }
    }

    /// Tasks queued or running here.
    pub fn load(&self) -> (u32, f64) {
        let capacity = self.config.max_queue + self.config.max_running;
        let busy = capacity - self.queue.available_permits();
        (busy as u32, busy as f64 / capacity as f64)
    }

    fn status(&self) -> pb::AgentStatus {
        match self.load().1 {
            l if l >= 1.0 => pb::AgentStatus::Overloaded,
            l if l >= 0.75 => pb::AgentStatus::Degraded,
            _ => pb::AgentStatus::Healthy,
        }
    }

    /// Offer terms for a probe, from this agent's own log, and the context
    /// it asks for the probed task.
    fn terms(&self, probe: &pb::CapabilityProbe) -> OfferTerms {
        let ledger = self.ledger.lock().unwrap();
        let task_type = pb::TaskType::try_from(probe.task_type).unwrap_or(pb::TaskType::Unspecified);
        let now = now_s();
        OfferTerms {
            capabilities: self.config.capabilities.clone(),
            // its record as others rated it (in its own book their ratings
            // are not established, so `trust` would always be the prior)
            trust_score: ledger.book().own_record(Some(task_type), now).score,
            evidence: ledger.evidence(task_type, 8),
            requirement: handshake::context_requirement(
                self.config.context_budget_tokens,
                self.config.specialization.as_ref(),
                probe,
            ),
        }
    }

    /// RESOURCE_EXHAUSTED for a task that finds the queue full, with the
    /// time the queue takes to drain as the retry hint (in the message and
    /// as `retry-after-ms`).
    fn queue_full(&self) -> Status {
        let (busy, _) = self.load();
        let per_task_ms = self.config.capabilities.iter().map(|c| c.estimated_latency_ms).max().unwrap_or(1000).max(1);
        let ms = (per_task_ms * u64::from(busy.max(1)) / self.config.max_running.max(1) as u64).max(1);
        let capacity = self.config.max_queue + self.config.max_running;
        let mut refused = Status::resource_exhausted(format!(
            "queue full: {capacity} tasks queued or running (--max-queue {}); retry after {ms} ms",
            self.config.max_queue
        ));
        if let Ok(v) = ms.to_string().parse() {
            refused.metadata_mut().insert("retry-after-ms", v);
        }
        refused
    }

    /// A signed back-pressure signal of this agent's current queue, for the
    /// requester `to`.
    fn backpressure(&self, to: &Option<pb::AgentId>) -> pb::Backpressure {
        let (busy, load) = self.load();
        let per_task_ms = self.config.capabilities.iter().map(|c| c.estimated_latency_ms).max().unwrap_or(1000).max(1);
        let drain_ms = per_task_ms * u64::from(busy) / self.config.max_running.max(1) as u64;
        let mut bp = pb::Backpressure {
            from: Some(self.identity.agent_id()),
            queue_depth: busy,
            recommended_rate: self.config.max_running as f64 * 1000.0 / per_task_ms as f64,
            estimated_drain_ms: drain_ms,
            current_load: load,
            to: to.clone(),
            ..Default::default()
        };
        self.identity.stamp_and_sign(&mut bp);
        bp
    }

    /// Starts the heartbeat loop: every interval, a signed heartbeat to each
    /// requester with a task running here. Stops when the node is dropped.
    pub fn start_heartbeats(self: &Arc<Self>) {
        let weak = Arc::downgrade(self);
        let every = self.config.heartbeat;
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            let mut channels: HashMap<String, Channel> = HashMap::new();
            loop {
                tick.tick().await;
                let Some(node) = weak.upgrade() else { return };
                let targets: Vec<(String, String)> = node
                    .contacts
                    .lock()
                    .unwrap()
                    .iter()
                    .flat_map(|(u, by)| by.iter().filter(|(_, n)| **n > 0).map(|(did, _)| (u.clone(), did.clone())))
                    .collect();
                for (url, requester) in targets {
                    let ch = match channels.get(&url) {
                        Some(ch) => ch.clone(),
                        None => match node.channel(&url) {
                            Ok(ch) => channels.entry(url.clone()).or_insert(ch).clone(),
                            Err(_) => continue,
                        },
                    };
                    let (busy, load) = node.load();
                    let mut hb = pb::Heartbeat {
                        from: Some(node.identity.agent_id()),
                        sequence: node.heartbeat_seq.fetch_add(1, Ordering::Relaxed) + 1,
                        queue_depth: busy,
                        load_factor: load,
                        status: node.status() as i32,
                        active_tasks: (node.config.max_running - node.running.available_permits()) as u32,
                        interval_ms: every.as_millis() as u64,
                        to: Some(pb::AgentId { uuid: requester }),
                        ..Default::default()
                    };
                    node.identity.stamp_and_sign(&mut hb);
                    let mut client = pb::atp_service_client::AtpServiceClient::new(ch);
                    match tokio::time::timeout(every, client.send_heartbeat(hb)).await {
                        Ok(Ok(_)) => {}
                        Ok(Err(e)) => tracing::debug!(%url, error = %e, "heartbeat refused"),
                        Err(_) => tracing::debug!(%url, "heartbeat timed out"),
                    }
                }
            }
        });
    }

    fn contract_for_task(&self, task: &pb::TaskSubmit) -> Result<Contract, Status> {
        let contracts = self.contracts.lock().unwrap();
        let Some(c) = contracts.get(&task.contract_id) else {
            return Err(Status::failed_precondition(
                "task.contract_id: no open contract with this agent (unknown, expired, or used: a contract serves one task)",
            ));
        };
        let from = sender(&task.from);
        if sender(&c.contract.from) != from {
            return Err(Status::permission_denied("task.contract_id: the contract is another agent's"));
        }
        if c.contract.task_id != task.task_id || c.contract.task_type != task.task_type {
            return Err(Status::failed_precondition("task: the contract is for another task id or task type"));
        }
        if c.accepted.elapsed() > Duration::from_millis(c.contract.expires_ms) {
            return Err(Status::failed_precondition("task.contract_id: the contract has expired"));
        }
        Ok(c.clone())
    }

    /// Runs a task: asks for context while unsure, then steps through the
    /// work order, checkpointing each step.
    async fn run(
        self: Arc<Self>,
        mut task: pb::TaskSubmit,
        order: WorkOrder,
        contract: Contract,
        job: Arc<Job>,
        queued: tokio::sync::OwnedSemaphorePermit,
    ) {
        let reply_to = contract.contract.reply_to.clone();
        let started = Instant::now();
        // however the job ends, its task's memory goes back to the system
        let _trim = TrimHeap;
        let _running = self.running.clone().acquire_owned().await;
        let cap = self.config.capabilities.iter().find(|c| c.task_type == task.task_type).copied().unwrap_or_default();
        // a checkpoint names the chunks its agent held; their text comes with
        // the task's context (the requester sends those it had given), never
        // from the checkpoint; taken out of the task, not copied (a context
        // may be 16 MiB)
        let mut context = task.context.take().unwrap_or_default();
        let resumed_after = task.resume_from.as_ref().map_or(0, |c| c.step_number);
        let mut report = WorkReport { title: order.title.clone(), resumed_after, ..Default::default() };
        report.confidence = confidence(&order, &context);
        // layer 3, §6.3: ask the requester for each missing need
        if report.confidence < THETA && !reply_to.is_empty() {
            for need in missing(&order, &context) {
                match self.ask(&reply_to, &contract.contract, &task.task_id, report.confidence, &need).await {
                    Ok(chunks) => {
                        report.context_requests += 1;
                        merge_chunks(&mut context, &chunks);
                    }
                    Err(e) => tracing::warn!(task = %task.task_id, error = %e, "context request failed"),
                }
                if confidence(&order, &context) >= THETA {
                    break;
                }
            }
        }
        report.final_confidence = confidence(&order, &context);
        report.chunks = cited(&order, &context);
        let step_ms = cap.estimated_latency_ms / u64::from(order.steps.max(1));
        for step in resumed_after + 1..=order.steps {
            tokio::time::sleep(Duration::from_millis(step_ms)).await;
            if let (Some(why), 2) = (&order.fail, step) {
                let mut r = self.result(&task, pb::TaskStatus::Failed, started);
                r.error = format!("work order failed at step 2: {why}");
                self.identity.stamp_and_sign(&mut r);
                push(&job, r);
                self.finish(&reply_to, sender(&task.from));
                drop(queued);
                return;
            }
            let mut cp = pb::TaskCheckpoint {
                task_id: task.task_id.clone(),
                agent: Some(self.identity.agent_id()),
                step_number: step,
                intermediate_state: serde_json::to_vec(
                    &serde_json::json!({ "title": order.title, "step": step, "of": order.steps }),
                )
                .unwrap_or_default(),
                // the chunks it holds by id and score, not copies: a step's
                // checkpoint stays small however large the context
                context: Some(pb::ContextDiff {
                    chunks: context.chunks.iter().map(chunk_ref).collect(),
                    ..Default::default()
                }),
                ..Default::default()
            };
            self.identity.stamp_and_sign(&mut cp);
            report.steps_run += 1;
            let mut r = self.result(&task, pb::TaskStatus::Running, started);
            r.checkpoint = Some(cp);
            self.identity.stamp_and_sign(&mut r);
            push(&job, r);
        }
        let mut r = self.result(&task, pb::TaskStatus::Completed, started);
        r.quality_self_report = cap.estimated_quality;
        r.actual_cost = cap.cost_per_task;
        r.payload = serde_json::to_vec(&report).unwrap_or_default();
        self.identity.stamp_and_sign(&mut r);
        push(&job, r);
        self.finish(&reply_to, sender(&task.from));
        drop(queued);
    }

    /// A task for `requester` at `reply_to` ended: one heartbeat target less.
    fn finish(&self, reply_to: &str, requester: &str) {
        let mut contacts = self.contacts.lock().unwrap();
        if let Some(by) = contacts.get_mut(reply_to) {
            if let Some(n) = by.get_mut(requester) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    by.remove(requester);
                }
            }
            if by.is_empty() {
                contacts.remove(reply_to);
            }
        }
    }

    fn result(&self, task: &pb::TaskSubmit, status: pb::TaskStatus, started: Instant) -> pb::TaskResult {
        pb::TaskResult {
            from: Some(self.identity.agent_id()),
            task_id: task.task_id.clone(),
            elapsed_ms: started.elapsed().as_millis() as u64,
            status: status as i32,
            ..Default::default()
        }
    }

    /// One adaptive context request to the requester (§6.3).
    async fn ask(
        &self,
        reply_to: &str,
        contract: &pb::ContractAccept,
        task_id: &str,
        confidence: f64,
        need: &str,
    ) -> Result<Vec<pb::ContextChunk>> {
        let mut req = pb::ContextRequest {
            from: Some(self.identity.agent_id()),
            to: contract.from.clone(),
            task_id: task_id.to_string(),
            current_confidence: confidence,
            specific_question: need.to_string(),
            reasoning: format!("the work needs \"{need}\" and the context sent does not mention it"),
            ..Default::default()
        };
        self.identity.stamp_and_sign(&mut req);
        let requester = sender(&contract.from).to_string();
        let mut client = pb::atp_service_client::AtpServiceClient::new(self.channel(reply_to)?);
        let reply = client
            .request_context(req)
            .await
            .map_err(|s| Error::Peer {
                did: requester.clone(),
                rpc: "RequestContext",
                status: s.code(),
                message: s.message().into(),
            })?
            .into_inner();
        self.verifier.verify(&reply).map_err(|e| Error::Peer {
            did: requester,
            rpc: "RequestContext",
            status: tonic::Code::Unauthenticated,
            message: e.to_string(),
        })?;
        Ok(reply.chunks)
    }
}

fn push(job: &Job, r: pb::TaskResult) {
    let n = job.pushed.fetch_add(1, Ordering::SeqCst) + 1;
    job.results.send_modify(|v| {
        // keep the latest step's result (a reader still gets the last
        // checkpoint before the final result), drop the one before it
        if !is_final(&r) && v.last().is_some_and(|(_, last)| !is_final(last)) {
            v.pop();
        }
        v.push((n, r));
    });
}

fn sender(id: &Option<pb::AgentId>) -> &str {
    id.as_ref().map_or("", |a| a.uuid.as_str())
}

pub use scd_did::time::now_s;

/// A chunk without its text: what a checkpoint holds of it.
fn chunk_ref(c: &pb::ContextChunk) -> pb::ContextChunk {
    pb::ContextChunk {
        index: c.index,
        data: Vec::new(),
        relevance_score: c.relevance_score,
        chunk_id: c.chunk_id.clone(),
        field: c.field.clone(),
        tokens: c.tokens,
    }
}

/// The share of the order's needs found in the context (1.0 without needs).
pub fn confidence(order: &WorkOrder, context: &pb::ContextDiff) -> f64 {
    if order.needs.is_empty() {
        return 1.0;
    }
    let found = order.needs.len() - missing(order, context).len();
    found as f64 / order.needs.len() as f64
}

/// The order's needs the context does not hold (read in order, so a need
/// across two neighbouring chunks is held).
fn missing(order: &WorkOrder, context: &pb::ContextDiff) -> Vec<String> {
    let reading = reading_text(&context.chunks);
    order.needs.iter().filter(|n| !reading.holds(&normalize(n))).cloned().collect()
}

/// The chunk ids a report cites (at most [`crate::work::MAX_REPORT_CHUNKS`]):
/// those holding one of the order's needs first (every chunk a need
/// straddles), as that is what the requester checks, then the others in
/// context order.
fn cited(order: &WorkOrder, context: &pb::ContextDiff) -> Vec<String> {
    let reading = reading_text(&context.chunks);
    let mut ids: Vec<String> = Vec::new();
    let mut seen: std::collections::HashSet<&str> = std::collections::HashSet::new();
    let used = order.needs.iter().flat_map(|n| reading.holding(&normalize(n)));
    for c in used.chain(context.chunks.iter()) {
        if ids.len() >= crate::work::MAX_REPORT_CHUNKS {
            break;
        }
        if seen.insert(c.chunk_id.as_str()) {
            ids.push(c.chunk_id.clone());
        }
    }
    ids
}

/// Adds the chunks of `more` not in `context` yet (by id), in one pass.
fn merge_chunks(context: &mut pb::ContextDiff, more: &[pb::ContextChunk]) {
    let mut seen: std::collections::HashSet<String> = context.chunks.iter().map(|k| k.chunk_id.clone()).collect();
    for c in more {
        if context.chunks.len() >= MAX_CONTEXT_CHUNKS {
            tracing::warn!(limit = MAX_CONTEXT_CHUNKS, "context answer past the chunk limit; the rest is dropped");
            break;
        }
        if seen.insert(c.chunk_id.clone()) {
            context.chunks.push(c.clone());
        }
    }
}

/// Why `reply_to` may not be called back for a contract that came from
/// `peer`: it must name that address (`localhost` for a loopback one) or one
/// of `allowed`. The host is not quoted back.
pub fn check_reply_to(
    url: &str,
    peer: Option<std::net::SocketAddr>,
    allowed: &[String],
) -> std::result::Result<(), String> {
    let uri: tonic::codegen::http::Uri = url.parse().map_err(|_| "contract.reply_to: not a URL".to_string())?;
    if !matches!(uri.scheme_str(), Some("http" | "https")) {
        return Err("contract.reply_to: not an http or https URL".into());
    }
    let host = uri.host().unwrap_or_default().trim_start_matches('[').trim_end_matches(']');
    if allowed.iter().any(|a| a.eq_ignore_ascii_case(host)) {
        return Ok(());
    }
    let from = peer.map(|p| p.ip().to_canonical());
    let same = match host.parse::<std::net::IpAddr>() {
        Ok(ip) => from == Some(ip.to_canonical()),
        Err(_) => host.eq_ignore_ascii_case("localhost") && from.is_some_and(|ip| ip.is_loopback()),
    };
    if same {
        Ok(())
    } else {
        Err("contract.reply_to: its host is neither the address this contract came from nor a --reply-to-host; \
             an agent calls back only its requester"
            .into())
    }
}

/// The tonic service of one agent.
#[derive(Clone)]
pub struct AgentService(pub Arc<Node>);

type ResultStream = std::pin::Pin<Box<dyn Stream<Item = Result<pb::TaskResult, Status>> + Send>>;

#[tonic::async_trait]
impl pb::atp_service_server::AtpService for AgentService {
    async fn probe(&self, request: Request<pb::CapabilityProbe>) -> Result<Response<pb::CapabilityOffer>, Status> {
        let probe = request.into_inner();
        self.0.verify(&probe)?;
        let node = &self.0;
        // the terms read the probe's embedding: checked first
        handshake::check_probe(&probe)?;
        let offer = handshake::offer_for(&node.identity, &probe, &node.terms(&probe))?;
        let requester = sender(&probe.from).to_string();
        bounded_insert(
            &mut node.offers.lock().unwrap(),
            MAX_OPEN_OFFERS,
            offer.nonce,
            (requester, Instant::now()),
            |v| v.1,
        );
        Ok(Response::new(offer))
    }

    async fn accept_contract(&self, request: Request<pb::ContractAccept>) -> Result<Response<pb::ContractAck>, Status> {
        let peer = request.remote_addr();
        let contract = request.into_inner();
        let node = &self.0;
        node.verify(&contract)?;
        if sender(&contract.to) != node.did() {
            return Err(Status::invalid_argument("contract.to: this contract is for another agent"));
        }
        let from = sender(&contract.from).to_string();
        let offered = node.offers.lock().unwrap().remove(&contract.offer_nonce);
        let refuse = match offered {
            None => Some("contract.offer_nonce: no open offer of this agent has this nonce".to_string()),
            Some((to, _)) if to != from => Some("contract.offer_nonce: the offer was made to another agent".into()),
            Some((_, at)) if at.elapsed() > Duration::from_millis(handshake::OFFER_TTL_MS) => {
                Some("contract.offer_nonce: the offer has expired".into())
            }
            Some(_) => {
                let cap = node.config.capabilities.iter().find(|c| c.task_type == contract.task_type);
                match cap.map(|c| handshake::meets(c, &contract.agreed_qos.unwrap_or_default())) {
                    None => Some("contract.task_type: not a capability of this agent".into()),
                    Some(Err(why)) => Some(format!("contract.agreed_qos: {why}")),
                    Some(Ok(())) if node.channel(&contract.reply_to).is_err() => {
                        Some("contract.reply_to: not a URL this agent can reach".into())
                    }
                    Some(Ok(())) => check_reply_to(&contract.reply_to, peer, &node.config.reply_to_hosts).err(),
                }
            }
        };
        let mut ack = pb::ContractAck {
            contract_id: contract.contract_id.clone(),
            accepted: refuse.is_none(),
            from: Some(node.identity.agent_id()),
            reason: refuse.clone().unwrap_or_default(),
            ..Default::default()
        };
        node.identity.stamp_and_sign(&mut ack);
        if refuse.is_none() {
            let id = contract.contract_id.clone();
            bounded_insert(
                &mut node.contracts.lock().unwrap(),
                MAX_CONTRACTS,
                id,
                Contract { contract, accepted: Instant::now() },
                |c| c.accepted,
            );
        }
        Ok(Response::new(ack))
    }

    async fn submit_task(&self, request: Request<pb::TaskSubmit>) -> Result<Response<pb::TaskAck>, Status> {
        let task = request.into_inner();
        let node = self.0.clone();
        node.verify(&task)?;
        if sender(&task.to) != node.did() {
            return Err(Status::invalid_argument("task.to: this task is for another agent"));
        }
        let contract = node.contract_for_task(&task)?;
        let order = WorkOrder::parse(&task.payload).map_err(|e| Status::invalid_argument(e.to_string()))?;
        if let Some(cp) = &task.resume_from {
            if cp.step_number > order.steps {
                return Err(Status::invalid_argument(format!(
                    "task.resume_from.step_number: {} is past the order's {} steps",
                    cp.step_number, order.steps
                )));
            }
        }
        for (diff, field) in [
            (task.context.as_ref(), "task.context"),
            (task.resume_from.as_ref().and_then(|c| c.context.as_ref()), "task.resume_from.context"),
        ] {
            if let Some(diff) = diff {
                check_context(diff, field)?;
            }
        }
        if let Some(diff) = &task.context {
            let withheld: std::collections::HashSet<&str> = diff.withheld_fields.iter().map(String::as_str).collect();
            if let Some(c) = diff.chunks.iter().find(|c| withheld.contains(c.field.as_str())) {
                return Err(Status::invalid_argument(format!(
                    "task.context: chunk {} is from withheld field {}",
                    c.chunk_id, c.field
                )));
            }
        }
        if let Some(cp) = &task.resume_from {
            // the checkpoint is the failed agent's, signed by it; its nonce
            // was seen by the requester, not here
            node.verifier.check_signature(cp).map_err(Status::from)?;
            if cp.task_id != task.task_id {
                return Err(Status::invalid_argument("task.resume_from: the checkpoint is another task's"));
            }
        }
        let reply_to = contract.contract.reply_to.clone();
        let Ok(permit) = node.queue.clone().try_acquire_owned() else {
            let bp = node.backpressure(&task.from);
            tokio::spawn(report_backpressure(node.channel(&reply_to), reply_to, bp));
            return Err(node.queue_full());
        };
        let key = job_key(&task.from, &task.task_id);
        let mut jobs = node.jobs.lock().unwrap();
        // a running job is never replaced, resumed or not; a finished one
        // only by a resume
        let finished = |j: &Job| j.results.borrow().last().is_some_and(|(_, r)| is_final(r));
        if jobs.get(&key).is_some_and(|j| !finished(j) || task.resume_from.is_none()) {
            return Err(Status::already_exists("task.task_id: this requester's task of that id is already here"));
        }
        // a contract serves one task: taken now (another submit under it
        // finds none)
        if node.contracts.lock().unwrap().remove(&task.contract_id).is_none() {
            return Err(Status::failed_precondition("task.contract_id: the contract was just used for another task"));
        }
        let (tx, _) = watch::channel(Vec::new());
        let job = Arc::new(Job {
            results: tx,
            pushed: AtomicU64::new(0),
            proved: Default::default(),
            proof_ack: Default::default(),
        });
        if jobs.len() >= MAX_CONTRACTS {
            // forget finished jobs first
            jobs.retain(|_, j| !finished(j));
        }
        jobs.insert(key, job.clone());
        drop(jobs);
        *node
            .contacts
            .lock()
            .unwrap()
            .entry(reply_to.clone())
            .or_default()
            .entry(sender(&task.from).to_string())
            .or_default() += 1;
        if node.load().1 >= 0.75 {
            tokio::spawn(report_backpressure(node.channel(&reply_to), reply_to, node.backpressure(&task.from)));
        }
        let ack = pb::TaskAck { task_id: task.task_id.clone(), accepted: true, reason: String::new() };
        tokio::spawn(node.clone().run(task, order, contract, job, permit));
        Ok(Response::new(ack))
    }

    type StreamResultsStream = ResultStream;

    async fn stream_results(&self, request: Request<pb::TaskQuery>) -> Result<Response<ResultStream>, Status> {
        let query = request.into_inner();
        let node = &self.0;
        node.verify(&query)?;
        // another requester's task of that id is as good as absent
        let job = node.jobs.lock().unwrap().get(&job_key(&query.from, &query.task_id)).cloned();
        let Some(job) = job else {
            return Err(Status::not_found("task_id: no task of this requester with that id here"));
        };
        let mut rx = job.results.subscribe();
        let stream = async_stream_results(move |tx| async move {
            // the results not sent yet, by number (a reader slower than the
            // steps gets the latest one)
            let mut sent = 0;
            loop {
                let batch: Vec<(u64, pb::TaskResult)> =
                    rx.borrow_and_update().iter().filter(|(n, _)| *n > sent).cloned().collect();
                for (n, r) in batch {
                    sent = n;
                    let last = is_final(&r);
                    if tx.send(Ok(r)).await.is_err() || last {
                        return;
                    }
                }
                if rx.changed().await.is_err() {
                    return;
                }
            }
        });
        Ok(Response::new(stream))
    }

    async fn request_context(
        &self,
        request: Request<pb::ContextRequest>,
    ) -> Result<Response<pb::ContextResponse>, Status> {
        let req = request.into_inner();
        let node = &self.0;
        node.verify(&req)?;
        let mut reply = node.planner.answer_context_request(node.did(), &req).await?;
        reply.from = Some(node.identity.agent_id());
        node.identity.stamp_and_sign(&mut reply);
        Ok(Response::new(reply))
    }

    async fn query_route(&self, request: Request<pb::RouteQuery>) -> Result<Response<pb::RouteResponse>, Status> {
        let query = request.into_inner();
        self.0.verify(&query)?;
        let routes = self.0.planner.routes(&self.0.ledger, &query).map_err(Status::from)?;
        Ok(Response::new(pb::RouteResponse { routes }))
    }

    async fn send_heartbeat(&self, request: Request<pb::Heartbeat>) -> Result<Response<pb::HeartbeatAck>, Status> {
        let hb = request.into_inner();
        self.0.verify(&hb)?;
        self.0.check_receiver(&hb.to, "heartbeat.to")?;
        self.0.planner.check_peer(&hb.from, "heartbeat.from")?;
        self.0.planner.heartbeat(&hb);
        Ok(Response::new(pb::HeartbeatAck { sequence: hb.sequence }))
    }

    async fn report_backpressure(
        &self,
        request: Request<pb::Backpressure>,
    ) -> Result<Response<pb::BackpressureAck>, Status> {
        let bp = request.into_inner();
        self.0.verify(&bp)?;
        self.0.check_receiver(&bp.to, "backpressure.to")?;
        self.0.planner.check_peer(&bp.from, "backpressure.from")?;
        self.0.planner.backpressure(&bp);
        Ok(Response::new(pb::BackpressureAck { acknowledged: true }))
    }

    async fn report_circuit_break(
        &self,
        request: Request<pb::CircuitBreak>,
    ) -> Result<Response<pb::CircuitBreakAck>, Status> {
        let cb = request.into_inner();
        self.0.verify(&cb)?;
        self.0.planner.circuit_report(&cb);
        Ok(Response::new(pb::CircuitBreakAck { acknowledged: true }))
    }

    async fn submit_interaction_proof(
        &self,
        request: Request<pb::InteractionProof>,
    ) -> Result<Response<pb::ProofAck>, Status> {
        let mut proof = request.into_inner();
        let node = &self.0;
        // the very proof this agent countersigned, sent again because its
        // answer was lost: the same ack (before the replay check refuses it)
        let digest: [u8; 32] = <sha2::Sha256 as sha2::Digest>::digest(prost::Message::encode_to_vec(&proof)).into();
        let known = node.jobs.lock().unwrap().get(&job_key(&proof.evaluator, &proof.task_id)).cloned();
        let repeated = known.and_then(|job| {
            job.proof_ack.lock().unwrap().as_ref().filter(|(d, _)| *d == digest).map(|(_, ack)| ack.clone())
        });
        if let Some(mut ack) = repeated {
            node.identity.stamp_and_sign(&mut ack);
            return Ok(Response::new(ack));
        }
        node.verify(&proof)?;
        if sender(&proof.subject) != node.did() {
            return Err(Status::invalid_argument("proof.subject: this proof is about another agent"));
        }
        if !(0.0..=1.0).contains(&proof.quality_score) {
            return Err(Status::invalid_argument(format!(
                "proof.quality_score: {} is outside [0, 1]",
                proof.quality_score
            )));
        }
        // only for a task this agent ran for the evaluator, once
        let job = node.jobs.lock().unwrap().get(&job_key(&proof.evaluator, &proof.task_id)).cloned();
        let Some(job) = job else {
            return Err(Status::failed_precondition(format!(
                "proof.task_id: {:?} is not a task this agent ran for the evaluator",
                proof.task_id
            )));
        };
        if job.proved.swap(true, Ordering::SeqCst) {
            return Err(Status::already_exists(format!("proof.task_id: {:?} is already rated", proof.task_id)));
        }
        node.identity.countersign(&mut proof);
        let (index, root, inclusion) = node.ledger.lock().unwrap().append(proof.clone()).map_err(Status::from)?;
        tracing::info!(task = %proof.task_id, index, quality = proof.quality_score, "interaction proof countersigned");
        let mut ack = pb::ProofAck {
            accepted: true,
            responder_signature: proof.responder_signature,
            merkle_root: root.to_vec(),
            inclusion: Some(inclusion),
            from: Some(node.identity.agent_id()),
            ..Default::default()
        };
        *job.proof_ack.lock().unwrap() = Some((digest, ack.clone()));
        node.identity.stamp_and_sign(&mut ack);
        Ok(Response::new(ack))
    }

    async fn exchange(&self, request: Request<pb::AtpMessage>) -> Result<Response<pb::AtpMessage>, Status> {
        use pb::atp_message::Payload;
        let env = request.into_inner();
        let node = &self.0;
        node.verify(&env)?;
        if env.receiver_did != node.did() {
            return Err(Status::invalid_argument("envelope.receiver_did: this envelope is for another agent"));
        }
        let inner_sender = match &env.payload {
            Some(Payload::Probe(m)) => sender(&m.from),
            Some(Payload::Heartbeat(m)) => sender(&m.from),
            Some(Payload::Backpressure(m)) => sender(&m.from),
            Some(Payload::CircuitBreak(m)) => sender(&m.from),
            Some(_) => {
                return Err(Status::unimplemented(format!(
                    "envelope.type: {} is served by its typed RPC only",
                    env.r#type
                )))
            }
            None => return Err(Status::invalid_argument("envelope.payload: missing")),
        };
        if inner_sender != env.sender_did {
            return Err(Status::unauthenticated("envelope: the payload's sender is not the envelope's sender"));
        }
        let svc = self.clone();
        let (kind, payload) = match env.payload {
            Some(Payload::Probe(p)) => (
                pb::MessageType::CapabilityOffer,
                Some(Payload::Offer(
                    pb::atp_service_server::AtpService::probe(&svc, Request::new(p)).await?.into_inner(),
                )),
            ),
            Some(Payload::Heartbeat(h)) => {
                pb::atp_service_server::AtpService::send_heartbeat(&svc, Request::new(h)).await?;
                (pb::MessageType::Heartbeat, None)
            }
            Some(Payload::Backpressure(b)) => {
                pb::atp_service_server::AtpService::report_backpressure(&svc, Request::new(b)).await?;
                (pb::MessageType::Backpressure, None)
            }
            Some(Payload::CircuitBreak(c)) => {
                pb::atp_service_server::AtpService::report_circuit_break(&svc, Request::new(c)).await?;
                (pb::MessageType::CircuitBreak, None)
            }
            _ => unreachable!("checked above"),
        };
        let mut reply = pb::AtpMessage {
            message_id: format!("msg-{:032x}", rand::random::<u128>()),
            sender_did: node.did().to_string(),
            receiver_did: env.sender_did,
            r#type: kind as i32,
            protocol_version: 1,
            payload,
            ..Default::default()
        };
        node.identity.stamp_and_sign(&mut reply);
        Ok(Response::new(reply))
    }
}

/// Largest ATP message accepted (a task with its context).
pub const MAX_MESSAGE_BYTES: usize = 16 << 20;
/// Concurrent calls per connection.
const MAX_CONCURRENT_STREAMS: u32 = 64;

/// Gives freed heap back to the system when dropped (glibc's
/// `malloc_trim`, off the async threads, one at a time). A task's context
/// is up to 16 MiB in a thousand allocations; glibc keeps such freed memory
/// in its per-thread arenas, so without this a worker's RSS after a flood
/// of large tasks stays near its peak (measured by `scd atp flood`).
struct TrimHeap;

impl Drop for TrimHeap {
    fn drop(&mut self) {
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        {
            static TRIMMING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
            if TRIMMING.swap(true, std::sync::atomic::Ordering::AcqRel) {
                return;
            }
            let trim = || {
                // SAFETY: malloc_trim only walks and releases the allocator's
                // free memory; it takes no pointers of ours
                unsafe { libc::malloc_trim(0) };
                TRIMMING.store(false, std::sync::atomic::Ordering::Release);
            };
            match tokio::runtime::Handle::try_current() {
                Ok(rt) => drop(rt.spawn_blocking(trim)),
                Err(_) => trim(),
            }
        }
    }
}

/// Admits a SubmitTask call before its body is read: a task (up to
/// [`MAX_MESSAGE_BYTES`]) is decoded only while the queue has room and
/// fewer than its slots are being decoded at once; otherwise the call is
/// answered RESOURCE_EXHAUSTED at once, with the queue's drain time as the
/// retry hint. So a flood of maximal tasks costs the worker at most its
/// slots' worth of decoding, whatever the peers send, and a refusal costs
/// no decode at all.
#[derive(Clone)]
struct SubmitGate {
    node: Arc<Node>,
    decoding: Arc<Semaphore>,
}

impl<S> tower_layer::Layer<S> for SubmitGate {
    type Service = Gated<S>;

    fn layer(&self, inner: S) -> Gated<S> {
        Gated { inner, gate: self.clone() }
    }
}

/// See [`SubmitGate`].
#[derive(Clone)]
struct Gated<S> {
    inner: S,
    gate: SubmitGate,
}

const SUBMIT_TASK: &str = "/atp.v1.AtpService/SubmitTask";

impl<S, B> tonic::codegen::Service<http::Request<B>> for Gated<S>
where
    S: tonic::codegen::Service<http::Request<B>, Response = http::Response<tonic::body::Body>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = S::Error;
    type Future = std::pin::Pin<Box<dyn std::future::Future<Output = Result<Self::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        if req.uri().path() != SUBMIT_TASK {
            return Box::pin(self.inner.call(req));
        }
        let node = &self.gate.node;
        let permit = self.gate.decoding.clone().try_acquire_owned().ok().filter(|_| node.queue.available_permits() > 0);
        let Some(permit) = permit else {
            return Box::pin(std::future::ready(Ok(node.queue_full().into_http())));
        };
        let fut = self.inner.call(req);
        Box::pin(async move {
            let resp = fut.await;
            drop(permit);
            resp
        })
    }
}

/// Serves `node` on `listener` until `shutdown` resolves: `atp.v1.AtpService`
/// plus gRPC health and reflection; starts the heartbeat loop.
pub async fn serve(
    node: Arc<Node>,
    listener: tokio::net::TcpListener,
    shutdown: impl std::future::Future<Output = ()> + Send,
) -> Result<()> {
    let (health_reporter, health) = tonic_health::server::health_reporter();
    health_reporter.set_serving::<pb::atp_service_server::AtpServiceServer<AgentService>>().await;
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(pb::DESCRIPTOR)
        .build_v1()
        .map_err(|e| Error::Invalid { field: "reflection".into(), reason: e.to_string() })?;
    node.start_heartbeats();
    let gate = SubmitGate {
        decoding: Arc::new(Semaphore::new(node.config.max_queue + node.config.max_running)),
        node: node.clone(),
    };
    let node_limits = node.config.connections;
    let tls = node.config.server_tls.clone();
    let svc = pb::atp_service_server::AtpServiceServer::new(AgentService(node))
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES);
    let guard = scd_net::ConnGuard::new(node_limits);
    let incoming = guard.incoming(listener);
    let mut builder = tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(Duration::from_secs(30)))
        .http2_keepalive_timeout(Some(Duration::from_secs(10)));
    if let Some(tls) = tls {
        builder = builder
            .tls_config(tls)
            .map_err(|e| Error::Transport { what: "TLS of atp.v1".into(), message: e.to_string() })?;
    }
    builder
        .layer(guard.layer())
        .layer(gate)
        .max_concurrent_streams(MAX_CONCURRENT_STREAMS)
        .concurrency_limit_per_connection(MAX_CONCURRENT_STREAMS as usize)
        .add_service(health)
        .add_service(reflection)
        .add_service(svc)
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await
        .map_err(|e| Error::Transport { what: "serving atp.v1".into(), message: e.to_string() })
}

fn is_final(r: &pb::TaskResult) -> bool {
    r.status != pb::TaskStatus::Running as i32
}

async fn report_backpressure(ch: Result<tonic::transport::Channel>, url: String, bp: pb::Backpressure) {
    let Ok(ch) = ch else { return };
    let mut client = pb::atp_service_client::AtpServiceClient::new(ch);
    if let Err(e) = client.report_backpressure(bp).await {
        tracing::debug!(%url, error = %e, "back-pressure not delivered");
    }
}

/// A stream fed by a spawned producer through a bounded channel.
fn async_stream_results<F, Fut>(producer: F) -> ResultStream
where
    F: FnOnce(tokio::sync::mpsc::Sender<Result<pb::TaskResult, Status>>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    tokio::spawn(producer(tx));
    Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn work_orders_are_strict() {
        let ok = WorkOrder::parse(br#"{"title":"fix","steps":3,"needs":["retry"]}"#).unwrap();
        assert_eq!(ok.steps, 3);
        assert_eq!(WorkOrder::parse(br#"{"title":"fix"}"#).unwrap().steps, 4);
        let cases: [(&[u8], &str); 5] = [
            (br#"{"title":"fix","stpes":3}"#, "task.payload.stpes: unknown field"),
            (br#"{"title":"fix","steps":0}"#, "task.payload.steps: 0 (1 to 100)"),
            (br#"{"title":"fix","steps":101}"#, "task.payload.steps: 101 (1 to 100)"),
            (br#"{"title":"fix"} x"#, "task.payload: trailing characters"),
            (br#"{"steps":1}"#, "task.payload"),
        ];
        for (payload, want) in cases {
            let err = WorkOrder::parse(payload).unwrap_err().to_string();
            assert!(err.starts_with(want), "{err} (wanted {want})");
        }
        let big = vec![b' '; MAX_PAYLOAD_BYTES + 1];
        assert_eq!(
            WorkOrder::parse(&big).unwrap_err().to_string(),
            format!("task.payload: {} bytes (limit 65536)", MAX_PAYLOAD_BYTES + 1)
        );
        let needs = serde_json::json!({"title": "x", "needs": vec!["a"; MAX_NEEDS + 1]}).to_string();
        assert!(WorkOrder::parse(needs.as_bytes())
            .unwrap_err()
            .to_string()
            .starts_with("task.payload.needs: 33 needs"));
    }

    #[test]
    fn a_job_holds_its_latest_checkpoint_then_only_its_final_result() {
        let (tx, rx) = watch::channel(Vec::new());
        let job =
            Job { results: tx, pushed: AtomicU64::new(0), proved: Default::default(), proof_ack: Default::default() };
        let result = |status: pb::TaskStatus, step: u32| pb::TaskResult {
            status: status as i32,
            checkpoint: Some(pb::TaskCheckpoint { step_number: step, ..Default::default() }),
            ..Default::default()
        };
        for step in 1..=100 {
            push(&job, result(pb::TaskStatus::Running, step));
            let held = rx.borrow();
            assert_eq!(held.len(), 1, "step {step}");
            assert_eq!((held[0].0, held[0].1.checkpoint.as_ref().unwrap().step_number), (u64::from(step), step));
        }
        push(&job, result(pb::TaskStatus::Completed, 0));
        let held = rx.borrow();
        let kept: Vec<(u64, i32)> = held.iter().map(|(n, r)| (*n, r.status)).collect();
        assert_eq!(kept, [(100, pb::TaskStatus::Running as i32), (101, pb::TaskStatus::Completed as i32)]);
    }

    #[test]
    fn contexts_past_the_chunk_limits_are_refused_naming_them() {
        let chunk = |id: String| pb::ContextChunk { chunk_id: id, field: "f".into(), ..Default::default() };
        let many = pb::ContextDiff {
            chunks: (0..=MAX_CONTEXT_CHUNKS).map(|i| chunk(format!("f#{i}"))).collect(),
            ..Default::default()
        };
        let e = check_context(&many, "task.context").unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
        assert_eq!(e.message(), "task.context: 1025 chunks and 0 withheld fields, over the limit of 1024 each");
        let long = pb::ContextDiff { chunks: vec![chunk("x".repeat(300))], ..Default::default() };
        let e = check_context(&long, "task.resume_from.context").unwrap_err();
        assert!(
            e.message().starts_with("task.resume_from.context.chunks[0]: a chunk_id or field over 256 bytes"),
            "{e:?}"
        );
        assert!(!e.message().contains("xxx"), "the name is quoted");
        let mut ctx = pb::ContextDiff::default();
        merge_chunks(&mut ctx, &many.chunks);
        assert_eq!(ctx.chunks.len(), MAX_CONTEXT_CHUNKS, "an answer does not grow a context past the limit");
        check_context(&ctx, "task.context").unwrap();
    }

    #[test]
    fn reply_to_must_be_the_requesters_own_address_or_allowed() {
        let peer = |a: &str| Some(a.parse::<std::net::SocketAddr>().unwrap());
        let allowed = vec!["planner.internal".to_string()];
        for (url, from, ok) in [
            ("http://10.0.0.5:7700", peer("10.0.0.5:41000"), true),
            ("https://10.0.0.5:7700", peer("[::ffff:10.0.0.5]:41000"), true),
            ("http://[2001:db8::1]:7700", peer("[2001:db8::1]:5"), true),
            ("http://localhost:7700", peer("127.0.0.1:5"), true),
            ("http://planner.internal:7700", peer("10.9.9.9:5"), true),
            ("http://10.0.0.6:7700", peer("10.0.0.5:41000"), false),
            ("http://localhost:7700", peer("10.0.0.5:5"), false),
            ("http://victim.example:80", peer("10.0.0.5:5"), false),
            ("http://10.0.0.5:7700", None, false),
            ("ftp://10.0.0.5/x", peer("10.0.0.5:5"), false),
        ] {
            assert_eq!(check_reply_to(url, from, &allowed).is_ok(), ok, "{url} from {from:?}");
        }
    }

    #[test]
    fn confidence_is_the_share_of_needs_found() {
        let order = WorkOrder {
            title: "t".into(),
            steps: 1,
            needs: vec!["Retry policy".into(), "idempotency".into()],
            fail: None,
        };
        let chunk = |id: &str, text: &str| pb::ContextChunk {
            chunk_id: id.into(),
            data: text.as_bytes().to_vec(),
            ..Default::default()
        };
        let mut ctx = pb::ContextDiff { chunks: vec![chunk("a#0", "the retry policy doubles")], ..Default::default() };
        assert_eq!(confidence(&order, &ctx), 0.5);
        assert_eq!(missing(&order, &ctx), vec!["idempotency".to_string()]);
        merge_chunks(&mut ctx, &[chunk("a#0", "dup"), chunk("b#1", "the IDEMPOTENCY key")]);
        assert_eq!(ctx.chunks.len(), 2);
        assert_eq!(confidence(&order, &ctx), 1.0);
        let none = WorkOrder { needs: vec![], ..order.clone() };
        assert_eq!(confidence(&none, &pb::ContextDiff::default()), 1.0);
        // a report cites the need-bearing chunks first, whatever their place
        let mut many = pb::ContextDiff {
            chunks: (0..100).map(|i| chunk(&format!("f#{i}"), "filler")).collect(),
            ..Default::default()
        };
        many.chunks.push(chunk("late#0", "our retry policy"));
        let ids = cited(&order, &many);
        assert_eq!(ids.len(), crate::work::MAX_REPORT_CHUNKS);
        assert_eq!((ids[0].as_str(), ids[1].as_str()), ("late#0", "f#0"));
        // a need cut by a chunk boundary: found, and both halves cited first
        let at = |id: &str, index: u32, text: &str| pb::ContextChunk { index, field: "a".into(), ..chunk(id, text) };
        let cut = pb::ContextDiff {
            chunks: vec![at("a#0", 0, "filler"), at("a#2", 2, "policy holds"), at("a#1", 1, "our retry")],
            ..Default::default()
        };
        assert_eq!(missing(&order, &cut), vec!["idempotency".to_string()]);
        assert_eq!(cited(&order, &cut), ["a#1", "a#2", "a#0"]);
    }
}
