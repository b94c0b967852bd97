//! One agent's state ([`Node`]): its identity, contracts and jobs, the
//! simulated work, heartbeats, back-pressure and requests for context.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{watch, Semaphore};
use tonic::transport::Channel;
use tonic::Status;

use super::config::AgentConfig;
use super::reading::chunk_ref;
use super::reading::cited;
use super::reading::confidence;
use super::reading::merge_chunks;
use super::reading::missing;
use crate::context::THETA;
use crate::handshake::{self, OfferTerms};
use crate::identity::SignMessages as _;
use crate::identity::{Identity, Signed, Verifier};
use crate::requester::PlannerState;
use crate::store::Ledger;
pub use crate::work::{WorkOrder, WorkReport};
use crate::{pb, Error, Result};
use scd_did::time::now_s;

/// A job's key: (submitter DID, task id).
type JobKey = (String, String);

pub(super) fn job_key(submitter: &Option<pb::AgentId>, task_id: &str) -> JobKey {
    (sender(submitter).to_string(), task_id.to_string())
}

/// Offers remembered for contracts (oldest dropped first).
pub(super) const MAX_OPEN_OFFERS: usize = 4096;
/// Contracts and tasks remembered.
pub(super) const MAX_CONTRACTS: usize = 4096;

/// A contract this agent accepted.
#[derive(Debug, Clone)]
pub(super) struct Contract {
    pub(super) contract: pb::ContractAccept,
    pub(super) accepted: Instant,
}

/// A task this agent runs (or ran), keyed by its submitter's DID and its
/// task id: one requester's ids never reach another's jobs.
pub(super) struct Job {
    /// Its results, numbered: only the latest step's is kept, and the final
    /// one after it, so a job holds one checkpoint at most, however many
    /// steps (a reader slower than the steps skips to the latest).
    pub(super) results: watch::Sender<Vec<(u64, pb::TaskResult)>>,
    /// The number of the last result pushed.
    pub(super) pushed: AtomicU64,
    /// Whether its interaction proof was countersigned (one per task).
    pub(super) proved: std::sync::atomic::AtomicBool,
    /// The countersigned proof's digest and the ack it got (unstamped): the
    /// same proof sent again (its answer was lost) gets that ack again,
    /// freshly stamped, instead of a refusal.
    pub(super) proof_ack: Mutex<Option<([u8; 32], pb::ProofAck)>>,
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
    pub(super) offers: Mutex<HashMap<u64, (String, Instant)>>,
    pub(super) contracts: Mutex<HashMap<String, Contract>>,
    pub(super) jobs: Mutex<HashMap<JobKey, Arc<Job>>>,
    /// requester URL → requester DID → tasks running for it (heartbeat
    /// targets; each heartbeat names its receiver)
    pub(super) contacts: Mutex<HashMap<String, HashMap<String, usize>>>,
    pub(super) queue: Arc<Semaphore>,
    pub(super) running: Arc<Semaphore>,
    pub(super) heartbeat_seq: AtomicU64,
    /// The requester side (SCD sessions, health of workers, breakers).
    pub planner: PlannerState,
    /// The audit trail of the context transfers it sends (one `AtpTransfer`
    /// record per delegation), once [`Node::set_audit`] gave it one.
    pub(super) audit: std::sync::OnceLock<Arc<scd_audit::AuditLog>>,
    /// Each sender DID's rate ([`AgentConfig::rate_per_did`]).
    pub(super) limiter: scd_net::rate::DidRateLimiter,
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
    pub(super) fn verify<M: Signed>(&self, msg: &M) -> Result<(), Status> {
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
    pub(super) fn check_receiver(&self, to: &Option<pb::AgentId>, field: &str) -> Result<(), Status> {
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
    pub(super) fn terms(&self, probe: &pb::CapabilityProbe) -> OfferTerms {
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
            ttl_ms: self.config.offer_ttl_ms,
        }
    }

    /// RESOURCE_EXHAUSTED for a task that finds the queue full, with the
    /// time the queue takes to drain as the retry hint (in the message and
    /// as `retry-after-ms`).
    pub(super) fn queue_full(&self) -> Status {
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
    pub(super) fn backpressure(&self, to: &Option<pb::AgentId>) -> pb::Backpressure {
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

    pub(super) fn contract_for_task(&self, task: &pb::TaskSubmit) -> Result<Contract, Status> {
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
    pub(super) async fn run(
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

pub(super) fn push(job: &Job, r: pb::TaskResult) {
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

pub(super) fn sender(id: &Option<pb::AgentId>) -> &str {
    id.as_ref().map_or("", |a| a.uuid.as_str())
}

/// Gives freed heap back to the system when dropped (glibc's
/// `malloc_trim`, off the async threads, one at a time). A task's context
/// is up to 16 MiB in a thousand allocations; glibc keeps such freed memory
/// in its per-thread arenas, so without this a worker's RSS after a flood
/// of large tasks stays near its peak (measured by `scd-dev atp flood`).
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

pub(super) fn is_final(r: &pb::TaskResult) -> bool {
    r.status != pb::TaskStatus::Running as i32
}
