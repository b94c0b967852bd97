//! The requester side of an agent: it delegates a task through all five
//! layers.
//!
//! One task, in order (ARCHITECTURE.md draws it):
//!
//! 1. **context (3)**: SCD embeds the task (e_task) over gRPC;
//! 2. **handshake (2)**: a signed probe carrying e_task goes to every peer
//!    whose circuit is not open; offers are verified (signature, nonce,
//!    Merkle evidence); no offer → retries with relaxed constraints, then
//!    escalation;
//! 3. **routing (4)**: offers become candidates (trust from this agent's
//!    ledger, estimates repriced from interaction proofs) and Algorithm 1
//!    ranks the routes; the best is contracted;
//! 4. **context (3)**: SCD compresses the context to the offer's
//!    requirement; the task carries the minimal sufficient context (chunk
//!    ids and scores), never confidential fields; the worker's RequestContext
//!    calls are answered through the SCD session;
//! 5. **fault (5)**: results stream back with checkpoints, stored durably;
//!    a broken stream or missed heartbeats (T_fail) fail the worker over to
//!    the next route, resuming from the last checkpoint; breakers open after
//!    3 consecutive failures; a task that fails on 3 distinct agents within
//!    60 s is poison and goes back to the originator;
//! 6. **trust (1)**: a signed interaction proof goes to the worker, comes
//!    back countersigned with its Merkle inclusion proof, and is appended to
//!    this agent's log; a contract violation makes it a negative proof.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio_stream::StreamExt;
use tonic::transport::Channel;
use tonic::Status;

use crate::agent::Node;
use crate::context::{ContextFile, Task, Transfer};
use crate::fault::{self};
use crate::handshake::{self, Offer, PeerFailure};
use crate::identity::now_s;
use crate::identity::SignMessages as _;
use crate::requester::{constraints, Delegation};
pub use crate::requester::{short, Event, PlannerState};
use crate::routing::{self, Pattern, RoutingParams};
use crate::work::{self, WorkOrder, WorkReport};
use crate::{merkle, pb, Error, Result};

/// A task to delegate.
#[derive(Debug, Clone)]
pub struct Job {
    /// Unique id.
    pub task_id: String,
    /// What kind of work.
    pub task_type: pb::TaskType,
    /// The task as SCD sees it.
    pub task: Task,
    /// The work order (payload).
    pub order: WorkOrder,
    /// The context to draw from.
    pub context: ContextFile,
    /// Constraints.
    pub qos: pb::QoSConstraints,
}

/// How a delegated task ended (agents by DID).
#[allow(missing_docs)]
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum Outcome {
    /// Completed by `agent` after `failovers` failovers. Along a composite
    /// route `agent` and `report` are the answering stage's (the last to run,
    /// the best of a merge, the majority's), `quality` its measured quality,
    /// `cost` the stages' sum, `latency_ms` the route's, and `stages` each
    /// stage as it ran (empty for a single agent).
    Completed {
        agent: String,
        report: WorkReport,
        failovers: u32,
        latency_ms: u64,
        quality: f64,
        cost: f64,
        #[serde(skip_serializing_if = "Vec::is_empty")]
        stages: Vec<StageRun>,
    },
    /// Poison: not retried.
    Poison { diagnostics: String, failovers: u32 },
    /// No agent could finish it.
    Lost { why: String, failovers: u32 },
}

/// One stage of a composite route, as it ran.
#[derive(Debug, Clone, Serialize)]
pub struct StageRun {
    /// The stage's task id (`<task>.<stage>.<agent>`).
    pub task_id: String,
    /// Who ran it (DID).
    pub agent: String,
    /// Its self-reported quality.
    pub quality: f64,
    /// Its confidence once it had the context it asked for.
    pub confidence: f64,
    /// Submit to final result.
    pub latency_ms: u64,
    /// What it cost.
    pub cost: f64,
    /// Its simulated answer: a digest of the evidence (chunk ids) it used.
    pub answer: String,
    /// Its report.
    #[serde(skip)]
    pub report: WorkReport,
}

/// A composite route as it ran.
#[derive(Debug, Clone, Serialize)]
pub struct PatternRun {
    /// The pattern's name.
    #[serde(serialize_with = "pattern_name")]
    pub pattern: Pattern,
    /// The route's agents (DIDs), in plan order.
    pub route: Vec<String>,
    /// The stages that ran (a cascade stops early).
    pub stages: Vec<StageRun>,
    /// The merged answer (best, majority, or the last stage's).
    pub answer: Option<String>,
}

fn pattern_name<S: serde::Serializer>(p: &Pattern, s: S) -> std::result::Result<S::Ok, S::Error> {
    s.serialize_str(p.name())
}

/// A simulated answer: agents that used the same evidence answer alike.
fn answer_of(report: &WorkReport) -> String {
    use sha2::Digest;
    let mut ids = report.chunks.clone();
    ids.sort();
    let digest = sha2::Sha256::digest(ids.join("\n").as_bytes());
    digest[..6].iter().map(|b| format!("{b:02x}")).collect()
}

/// The answer more than half the stages gave, if any.
fn majority_answer(results: &[StageRun]) -> Option<String> {
    let mut counts: HashMap<&str, usize> = HashMap::new();
    for r in results {
        *counts.entry(r.answer.as_str()).or_default() += 1;
    }
    counts.into_iter().find(|(_, n)| 2 * n > results.len()).map(|(a, _)| a.to_string())
}

/// What a probe asks when composites may be chosen: the task's latency, cost
/// and trust bounds, without its quality floor.
fn member_probe(qos: pb::QoSConstraints) -> pb::QoSConstraints {
    pb::QoSConstraints { min_quality: 0.0, ..qos }
}

/// The constraints an agent contracts to: the task's, with the quality it
/// offered when that is below q_min. Routing may count on more (a
/// composite's model, or the quality this side measured of it, which can
/// exceed its offer), but an agent is held to its own word, and one asked
/// for more than it offered refuses the contract.
fn agreed(qos: pb::QoSConstraints, offer: &Offer) -> pb::QoSConstraints {
    pb::QoSConstraints { min_quality: qos.min_quality.min(offer.capability().estimated_quality), ..qos }
}

/// The requester driver: delegates jobs to a set of peers.
pub struct Planner {
    node: Arc<Node>,
    peers: Vec<(String, Channel)>,
    composites: Vec<Pattern>,
}

/// The longest a planner holds a task back for an agent's back-pressure.
const MAX_BUFFER: Duration = Duration::from_secs(2);

/// The longest a planner waits for any result of a running task.
const RESULT_SILENCE: Duration = Duration::from_secs(30);

/// The longest a worker may take to answer SubmitTask or open its result
/// stream (the contract's own bound, 4 × T_OFFER).
const CALL_TIMEOUT: Duration = Duration::from_millis(4 * handshake::T_OFFER.as_millis() as u64);

/// Tries at a countersignature when the transport fails or the worker is
/// busy; after them a missing countersignature is a violation like a refusal
/// (a worker must not escape its rating by dropping the call).
const PROOF_ATTEMPTS: u32 = 3;
/// The wait before the second try (doubling after).
const PROOF_BACKOFF: Duration = Duration::from_millis(200);

impl Planner {
    /// A planner for `node` over peers at these URLs. [`Planner::run`]
    /// chooses among single agents and Algorithm 1's two-agent draft-refine
    /// routes ([`Planner::with_composites`] changes which composites).
    pub fn new(node: Arc<Node>, peer_urls: &[String]) -> Result<Planner> {
        let peers = peer_urls.iter().map(|u| Ok((u.clone(), node.channel(u)?))).collect::<Result<_>>()?;
        Ok(Planner { node, peers, composites: vec![Pattern::DraftRefine] })
    }

    /// The composite patterns [`Planner::run`] may choose, each where
    /// Theorem 4's condition holds ([`routing::route_composites`]: it meets
    /// the constraints for less than the cheapest single agent that does);
    /// none leaves single agents only.
    pub fn with_composites(mut self, patterns: &[Pattern]) -> Planner {
        self.composites = patterns.iter().copied().filter(|p| *p != Pattern::Single).collect();
        self
    }

    /// The agent it plans for (its identity, ledger and peers' state).
    pub fn node(&self) -> &Arc<Node> {
        &self.node
    }

    fn state(&self) -> &PlannerState {
        &self.node.planner
    }

    /// Delegates `job` through the five layers until it completes, is
    /// poison, or no agent is left.
    pub async fn run(&self, job: &Job) -> Result<Outcome> {
        let st = self.state();
        // a poison task is not retried, even when it is submitted again;
        // failures older than the poison window are forgotten
        let known = {
            let mut poison = st.poison.lock().unwrap();
            poison.prune(st.now_ms());
            poison.poison(&job.task_id).map(|p| p.to_string())
        };
        if let Some(diagnostics) = known {
            return Ok(Outcome::Poison { diagnostics, failovers: 0 });
        }
        let scd = st.scd().await?;
        let e_task = scd.embed_task(&job.task).await?;
        // a composite's members need not meet q_min alone: with composites
        // allowed every capable peer is asked, and the router decides
        let probe_qos = if self.composites.is_empty() { job.qos } else { member_probe(job.qos) };
        let probe = pb::CapabilityProbe {
            from: Some(self.node.identity.agent_id()),
            task_type: job.task_type as i32,
            qos: Some(probe_qos),
            context_embedding: Some(e_task),
            task_id: job.task_id.clone(),
            ..Default::default()
        };
        // peers tried, by URL: a peer that rotates its DID is still the peer
        // that failed
        let mut tried: HashSet<String> = HashSet::new();
        let mut transfer: Option<Arc<Transfer>> = None;
        let mut failovers = 0;
        let mut last_failed: Option<String> = None;
        // probe rounds whose offers all miss the route constraints relax
        // them further, as rounds without offers do (§5.3)
        let mut relaxed = 0;
        let result = loop {
            // layer 5: skip peers whose circuit is open
            let peers = self.open_peers(job);
            // layer 2: probe → offers (retries relax the constraints)
            let negotiation =
                handshake::negotiate_from(&self.node.identity, &self.node.verifier, &peers, &probe, relaxed).await;
            let negotiation = match negotiation {
                Ok(n) => n,
                Err(e) => break Outcome::Lost { why: e.to_string(), failovers },
            };
            self.account_probe(job, &negotiation);
            let offers: Vec<Offer> =
                negotiation.offers.into_iter().filter(|o| !tried.contains(&o.url) && self.evidence_ok(o)).collect();
            st.remember_offers(&offers);
            // layer 4: rank routes (single agents, and composites that meet
            // the constraints for less than any single agent that does)
            let cands = st.candidates(&self.node.ledger, &offers, job.task_type);
            // the task's constraints, relaxed as often as the probe's were
            let task_qos = handshake::relax(&job.qos, negotiation.rounds.saturating_sub(1));
            let c = constraints(&task_qos);
            let routes =
                routing::route_composites(&cands, job.task_type, &c, &RoutingParams::default(), &self.composites);
            let Some(best) = self.admit(job, &routes).await else {
                // the next probe round relaxes once more than this one did
                relaxed = negotiation.rounds;
                if relaxed > handshake::MAX_RETRIES {
                    let why = format!(
                        "escalated: no route among {} offers meets the constraints, relaxed {relaxed} times",
                        offers.len()
                    );
                    break Outcome::Lost { why, failovers };
                }
                continue;
            };
            st.routed(&job.task_id, best, cands.len());
            if best.pattern != Pattern::Single {
                // a composite route runs whole; a failed stage fails the
                // route over like a failed agent (its stages start again,
                // under ids of their own)
                if let Some(from) = last_failed.take() {
                    let to = short(&best.agents[0]);
                    st.emit(Event::Failover { task: job.task_id.clone(), from: short(&from), to, resumed_after: 0 });
                }
                let prefix = if failovers == 0 { job.task_id.clone() } else { format!("{}.f{failovers}", job.task_id) };
                let started = Instant::now();
                match self.execute(job, &prefix, best, &offers, task_qos, &mut transfer).await {
                    Ok(run) => match Outcome::of_route(run, failovers, started.elapsed()) {
                        Some(done) => break done,
                        None => break Outcome::Lost { why: "the composite route ran no stage".into(), failovers },
                    },
                    Err(f) => {
                        tried.insert(f.url.clone());
                        if let Some(end) = self.failed(job, &f.did, &f.url, f.failure, &mut failovers, &mut last_failed)
                        {
                            break end;
                        }
                    }
                }
                continue;
            }
            let Some(offer) = offers.iter().find(|o| o.did() == best.agents[0]) else {
                break Outcome::Lost { why: "route names an agent without an offer".into(), failovers };
            };
            tried.insert(offer.url.clone());
            if let Some(from) = last_failed.take() {
                let resumed_after =
                    self.node.ledger.lock().unwrap().store().checkpoint(&job.task_id)?.map_or(0, |c| c.step_number);
                st.emit(Event::Failover {
                    task: job.task_id.clone(),
                    from: short(&from),
                    to: short(offer.did()),
                    resumed_after,
                });
            }
            match self.delegate(job, offer, agreed(task_qos, offer), &mut transfer).await {
                Ok(done) => break done.with_failovers(failovers),
                Err(f) => {
                    if let Some(end) = self.failed(job, offer.did(), &offer.url, f, &mut failovers, &mut last_failed) {
                        break end;
                    }
                }
            }
        };
        if let Some(t) = &transfer {
            if let Err(e) = scd.close(&t.session).await {
                tracing::debug!(error = %e, "closing the SCD session");
            }
        }
        st.delegations.lock().unwrap().remove(&job.task_id);
        Ok(result)
    }

    /// What a failed delegation to `did` at `url` does to the task: `Some`
    /// ends it (ours failed, or it is poison), `None` moves it to the next
    /// route (a refusal or rejection is not the task's fault; an agent's
    /// failure counts against its circuit and toward poison).
    fn failed(
        &self,
        job: &Job,
        did: &str,
        url: &str,
        f: Failure,
        failovers: &mut u32,
        last_failed: &mut Option<String>,
    ) -> Option<Outcome> {
        let st = self.state();
        let task = job.task_id.clone();
        match f {
            Failure { why, kind: FailureKind::Local } => {
                Some(Outcome::Lost { why: format!("this agent's side failed: {why}"), failovers: *failovers })
            }
            Failure { why, kind: FailureKind::Refused } => {
                // back-pressure or a refusal: not the agent's fault, not
                // the task's; the next route gets it
                st.emit(Event::Rerouted { task, agent: short(did), why });
                None
            }
            Failure { why, kind: FailureKind::Rejected } => {
                st.breaker_failure(url, Some(did));
                st.emit(Event::Rerouted { task, agent: short(did), why });
                None
            }
            Failure { why, kind: FailureKind::Agent } => {
                st.emit(Event::AgentFailed { task: task.clone(), agent: short(did), why: why.clone() });
                st.breaker_failure(url, Some(did));
                let reason = st.repricer.lock().unwrap().agent_failed(did).to_string();
                st.emit(Event::Repriced { agent: short(did), why: reason });
                // distinct peers by URL: DIDs are free, so one peer
                // rotating them cannot make a task poison alone
                let poison = st.poison.lock().unwrap().record_failure(&task, url, &why, st.now_ms());
                if let Some(p) = poison {
                    st.emit(Event::Poison { task, diagnostics: p.to_string() });
                    return Some(Outcome::Poison { diagnostics: p.to_string(), failovers: *failovers });
                }
                *failovers += 1;
                *last_failed = Some(did.to_string());
                None
            }
        }
    }

    /// Layer 5 back-pressure on the ranked routes: the first route whose
    /// agents admit a task now; a single agent that asked to be paced or
    /// buffered is waited for (at most [`MAX_BUFFER`]) when it is the best
    /// left, one that asked for rerouting is skipped, and a composite route
    /// runs now or not at all (every member must admit the task).
    async fn admit<'r>(&self, job: &Job, routes: &'r [routing::RouteChoice]) -> Option<&'r routing::RouteChoice> {
        let st = self.state();
        let mut wait: Option<(&routing::RouteChoice, u64)> = None;
        for r in routes {
            if r.pattern != Pattern::Single {
                let now = st.now_ms();
                let busy = {
                    let mut pressure = st.pressure.lock().unwrap();
                    r.agents.iter().find(|a| pressure.admit(a, now) != fault::Admit::Go).cloned()
                };
                match busy {
                    None => return Some(r),
                    Some(a) => st.emit(Event::Rerouted {
                        task: job.task_id.clone(),
                        agent: short(&a),
                        why: "it signalled back-pressure".into(),
                    }),
                }
                continue;
            }
            let decision = st.pressure.lock().unwrap().admit(&r.agents[0], st.now_ms());
            match decision {
                fault::Admit::Go => {
                    if let Some((_, ms)) = wait {
                        tracing::debug!(waited_for = ms, "a later route admits now");
                    }
                    return Some(r);
                }
                fault::Admit::WaitMs(ms) => {
                    wait = wait.or(Some((r, ms)));
                }
                fault::Admit::Reroute => {
                    st.emit(Event::Rerouted {
                        task: job.task_id.clone(),
                        agent: short(&r.agents[0]),
                        why: "it signalled back-pressure".into(),
                    });
                }
            }
        }
        let (r, ms) = wait?;
        let ms = ms.min(MAX_BUFFER.as_millis() as u64);
        st.emit(Event::Buffered { task: job.task_id.clone(), agent: short(&r.agents[0]), ms });
        tokio::time::sleep(Duration::from_millis(ms)).await;
        Some(r)
    }

    /// Runs `job` along the best route of a composite `pattern` (§7.4):
    /// Algorithm 1 over the pattern models ([`routing::route_patterns`]),
    /// then the route's [`routing::plan`], stage by stage, every stage a
    /// contracted agent over the wire with the task's SCD context:
    /// draft-refine and pipeline run in sequence (each stage's order names
    /// the previous output), parallel-merge keeps the best result, ensemble
    /// takes the majority answer (a worker's answer is the evidence it used,
    /// so workers that saw the same chunks agree), cascade stops at the first
    /// agent whose confidence reaches 0.7. A failed stage fails the run (no
    /// failover inside a composite route; [`Planner::run`] fails over).
    pub async fn run_pattern(&self, job: &Job, pattern: Pattern) -> Result<PatternRun> {
        let st = self.state();
        let scd = st.scd().await?;
        let probe = pb::CapabilityProbe {
            from: Some(self.node.identity.agent_id()),
            task_type: job.task_type as i32,
            qos: Some(member_probe(job.qos)),
            context_embedding: Some(scd.embed_task(&job.task).await?),
            task_id: job.task_id.clone(),
            ..Default::default()
        };
        let peers = self.open_peers(job);
        let n = handshake::negotiate(&self.node.identity, &self.node.verifier, &peers, &probe).await?;
        self.account_probe(job, &n);
        let offers: Vec<Offer> = n.offers.into_iter().filter(|o| self.evidence_ok(o)).collect();
        st.remember_offers(&offers);
        let cands = st.candidates(&self.node.ledger, &offers, job.task_type);
        let task_qos = handshake::relax(&job.qos, n.rounds.saturating_sub(1));
        let routes = routing::route_patterns(&cands, job.task_type, &constraints(&task_qos), &RoutingParams::default());
        let Some(route) = routes.into_iter().find(|r| r.pattern == pattern) else {
            return Err(Error::CannotMeet {
                reason: format!("no {} route among {} offers meets the constraints", pattern.name(), offers.len()),
            });
        };
        st.routed(&job.task_id, &route, cands.len());
        let mut transfer: Option<Arc<Transfer>> = None;
        let run = self.execute(job, &job.task_id, &route, &offers, task_qos, &mut transfer).await;
        if let Some(t) = &transfer {
            let _ = scd.close(&t.session).await;
        }
        run.map_err(|f| Error::Peer {
            did: f.did,
            rpc: "stage",
            status: tonic::Code::Unavailable,
            message: f.failure.why,
        })
    }

    /// Runs a composite `route`'s [`routing::plan`] stage by stage (see
    /// [`Planner::run_pattern`]), each stage a delegation of its own under
    /// the id `<prefix>.<stage>.<agent>`; the first stage to fail ends it.
    async fn execute(
        &self,
        job: &Job,
        prefix: &str,
        route: &routing::RouteChoice,
        offers: &[Offer],
        qos: pb::QoSConstraints,
        transfer: &mut Option<Arc<Transfer>>,
    ) -> Result<PatternRun, StageFailure> {
        let st = self.state();
        let offer_of = |did: &str| {
            offers.iter().find(|o| o.did() == did).ok_or_else(|| StageFailure {
                did: did.to_string(),
                url: String::new(),
                failure: Failure { why: "the route names an agent without an offer".into(), kind: FailureKind::Local },
            })
        };
        let mut run =
            PatternRun { pattern: route.pattern, route: route.agents.clone(), stages: Vec::new(), answer: None };
        let mut previous: Option<String> = None;
        for (i, stage) in routing::plan(route).stages.into_iter().enumerate() {
            let step = |agent: &str, role: &str| {
                let mut stage_job = job.clone();
                stage_job.task_id = format!("{prefix}.{}.{}", i + 1, short(agent).trim_start_matches('…'));
                stage_job.order.title = match &previous {
                    Some(p) => format!("{} ({role}, from {p})", job.order.title),
                    None => format!("{} ({role})", job.order.title),
                };
                stage_job
            };
            match stage {
                routing::Stage::Call { agent, role } => {
                    let j = step(&agent, &format!("{role:?}").to_lowercase());
                    let done = self.stage(&j, offer_of(&agent)?, qos, transfer).await?;
                    previous = Some(j.task_id.clone());
                    run.answer = Some(done.answer.clone());
                    run.stages.push(done);
                }
                routing::Stage::Escalate { agent, min_confidence } => {
                    let j = step(&agent, "cascade");
                    let done = self.stage(&j, offer_of(&agent)?, qos, transfer).await?;
                    let sure = done.confidence >= min_confidence;
                    run.answer = Some(done.answer.clone());
                    run.stages.push(done);
                    if sure {
                        break;
                    }
                    previous = Some(j.task_id.clone());
                }
                routing::Stage::Parallel { agents, merge } => {
                    let jobs: Vec<Job> = agents.iter().map(|a| step(a, "parallel")).collect();
                    let members: Vec<&Offer> = agents.iter().map(|a| offer_of(a)).collect::<Result<_, _>>()?;
                    if transfer.is_none() {
                        // compute the context once, before the fan-out
                        let requirement = members[0].offer.context_requirements.clone().unwrap_or_default();
                        let scd = st.scd().await.map_err(|e| StageFailure::local(members[0], e))?;
                        let t = scd.compress(&job.task, &job.context.fields, &requirement).await;
                        *transfer = Some(Arc::new(t.map_err(|e| StageFailure::local(members[0], e))?));
                    }
                    let calls = jobs.iter().zip(&members).map(|(j, offer)| {
                        let mut t = transfer.clone();
                        async move { self.stage(j, offer, qos, &mut t).await }
                    });
                    let results: Vec<StageRun> =
                        futures_util::future::join_all(calls).await.into_iter().collect::<Result<_, _>>()?;
                    run.answer = match merge {
                        routing::Merge::Best => {
                            results.iter().max_by(|a, b| a.quality.total_cmp(&b.quality)).map(|r| r.answer.clone())
                        }
                        routing::Merge::MajorityVote => majority_answer(&results),
                    };
                    run.stages.extend(results);
                }
            }
        }
        Ok(run)
    }

    /// One stage of a composite route: [`Planner::delegate`] to one agent.
    async fn stage(
        &self,
        job: &Job,
        offer: &Offer,
        qos: pb::QoSConstraints,
        transfer: &mut Option<Arc<Transfer>>,
    ) -> Result<StageRun, StageFailure> {
        let out = self.delegate(job, offer, agreed(qos, offer), transfer).await;
        self.state().delegations.lock().unwrap().remove(&job.task_id);
        let fail = |failure| StageFailure { did: offer.did().to_string(), url: offer.url.clone(), failure };
        match out.map_err(fail)? {
            Outcome::Completed { agent, report, latency_ms, quality, cost, .. } => Ok(StageRun {
                task_id: job.task_id.clone(),
                answer: answer_of(&report),
                confidence: report.final_confidence,
                agent,
                quality,
                latency_ms,
                cost,
                report,
            }),
            other => Err(fail(Failure { why: format!("stage {}: {other:?}", job.task_id), kind: FailureKind::Agent })),
        }
    }

    /// The peers whose circuit lets a call through now (layer 5); the
    /// others are reported skipped.
    fn open_peers(&self, job: &Job) -> Vec<(String, Channel)> {
        let st = self.state();
        let now = st.now_ms();
        let peers: Vec<(String, Channel)> = {
            let mut breakers = st.breakers.lock().unwrap();
            self.peers.iter().filter(|(url, _)| breakers.allow(url, now)).cloned().collect()
        };
        for (url, _) in self.peers.iter().filter(|(u, _)| !peers.iter().any(|(p, _)| p == u)) {
            st.emit(Event::Skipped { task: job.task_id.clone(), agent: url.clone() });
        }
        peers
    }

    fn account_probe(&self, job: &Job, n: &handshake::Negotiation) {
        let st = self.state();
        let mut down = Vec::new();
        let mut declined = Vec::new();
        for (url, why) in &n.failures {
            match why {
                PeerFailure::Down(_) | PeerFailure::Invalid(_) => {
                    st.breaker_failure(url, None);
                    down.push(url.clone());
                }
                PeerFailure::Declined(_) => declined.push(url.clone()),
            }
        }
        for o in &n.offers {
            st.breaker_success(&o.url, o.did());
        }
        st.emit(Event::Probed {
            task: job.task_id.clone(),
            round: n.rounds,
            offers: n.offers.iter().map(|o| short(o.did())).collect(),
            down,
            declined,
        });
    }

    /// Whether an offer's trust evidence holds ([`Offer::evidence_holds`]).
    fn evidence_ok(&self, o: &Offer) -> bool {
        o.evidence_holds(&self.node.verifier)
    }

    /// Contract, transfer, submit and follow one agent; `Err` = it failed.
    async fn delegate(
        &self,
        job: &Job,
        offer: &Offer,
        qos: pb::QoSConstraints,
        transfer: &mut Option<Arc<Transfer>>,
    ) -> Result<Outcome, Failure> {
        let st = self.state();
        let node = &self.node;
        let did = offer.did().to_string();
        let channel = node.channel(&offer.url).map_err(Failure::agent)?;
        let contract = handshake::contract_for(&node.identity, offer, &job.task_id, qos, &node.config.public_url);
        handshake::accept(&node.verifier, channel.clone(), contract.clone()).await.map_err(|e| match e {
            // a declined contract (offer expired, QoS no longer met) is a refusal
            Error::CannotMeet { .. } => Failure { why: e.to_string(), kind: FailureKind::Refused },
            e => Failure::agent(e),
        })?;
        st.emit(Event::Contracted {
            task: job.task_id.clone(),
            agent: short(&did),
            contract: contract.contract_id.clone(),
        });
        // layer 3: the minimal sufficient context, computed once per task
        if transfer.is_none() {
            let requirement = offer.offer.context_requirements.clone().unwrap_or_default();
            let scd = st.scd().await.map_err(Failure::local)?;
            *transfer = Some(Arc::new(
                scd.compress(&job.task, &job.context.fields, &requirement).await.map_err(Failure::local)?,
            ));
        }
        let t = transfer.clone().expect("set above");
        let sent = {
            let mut delegations = st.delegations.lock().unwrap();
            let d = Delegation::handed_to(&did, t.clone(), delegations.remove(&job.task_id));
            let sent = d.sent.clone();
            delegations.insert(job.task_id.clone(), d);
            sent
        };
        st.hops.lock().unwrap().record_transfer(&job.task_id, node.did(), &did, &t);
        if let Some(log) = node.audit_log() {
            let budget = offer.offer.context_requirements.as_ref().map_or(0, |r| r.max_context_tokens);
            let rec = t.audit_record(node.did(), &did, &job.task, budget);
            log.append_async(vec![rec]).await.map_err(|e| Failure::local(e.into()))?;
        }
        st.emit(Event::ContextSent {
            task: job.task_id.clone(),
            agent: short(&did),
            full_tokens: t.full_tokens,
            sent_tokens: t.sent_tokens,
            chunks: t.diff.chunks.len(),
            withheld: t.diff.withheld_fields.clone(),
        });
        let resume_from = node.ledger.lock().unwrap().store().checkpoint(&job.task_id).map_err(Failure::local)?;
        // the steps this side has seen done: the resumed checkpoint's, then
        // each verified checkpoint of this worker's (its own word on its
        // quality takes no part in the rating)
        let mut steps_seen = resume_from.as_ref().map_or(0, |cp| cp.step_number);
        // a resumed worker gets the chunks its predecessor's checkpoint names
        // that were asked for (the checkpoint holds their ids, not copies)
        let mut context = t.diff.clone();
        if let Some(named) = resume_from.as_ref().and_then(|cp| cp.context.as_ref()) {
            let named: HashSet<&str> = named.chunks.iter().map(|c| c.chunk_id.as_str()).collect();
            let mut have: HashSet<String> = context.chunks.iter().map(|c| c.chunk_id.clone()).collect();
            for c in sent.iter().filter(|c| named.contains(c.chunk_id.as_str())) {
                if have.insert(c.chunk_id.clone()) {
                    context.chunks.push(c.clone());
                }
            }
        }
        let mut task = pb::TaskSubmit {
            from: Some(node.identity.agent_id()),
            to: offer.offer.from.clone(),
            task_id: job.task_id.clone(),
            task_type: job.task_type as i32,
            payload: serde_json::to_vec(&job.order).unwrap_or_default(),
            context: Some(context.clone()),
            contract_id: contract.contract_id.clone(),
            resume_from,
            ..Default::default()
        };
        node.identity.stamp_and_sign(&mut task);
        let mut client = pb::atp_service_client::AtpServiceClient::new(channel);
        // heartbeats it sent for earlier tasks are stale: T_fail counts from
        // the hand-over, so a worker that freezes before its first heartbeat
        // for this task fails too (a frozen process keeps its stream open)
        st.health.lock().unwrap().expect(&did, st.now_ms());
        let submitted = Instant::now();
        // a worker frozen before it answers is an agent failure, not a hang
        let answer = |rpc: &str| Failure {
            why: format!("{rpc}: no answer within {} ms", CALL_TIMEOUT.as_millis()),
            kind: FailureKind::Agent,
        };
        let ack = tokio::time::timeout(CALL_TIMEOUT, client.submit_task(task))
            .await
            .map_err(|_| answer("SubmitTask"))?
            .map_err(|s| Failure::status("SubmitTask", &s))?
            .into_inner();
        if !ack.accepted {
            return Err(Failure { why: format!("task refused: {}", ack.reason), kind: FailureKind::Refused });
        }
        let mut query =
            pb::TaskQuery { task_id: job.task_id.clone(), from: Some(node.identity.agent_id()), ..Default::default() };
        node.identity.stamp_and_sign(&mut query);
        let mut stream = tokio::time::timeout(CALL_TIMEOUT, client.stream_results(query))
            .await
            .map_err(|_| answer("StreamResults"))?
            .map_err(|s| Failure::status("StreamResults", &s))?
            .into_inner();
        let mut watchdog = tokio::time::interval(Duration::from_millis(100));
        // one deadline, moved on by each result (a timeout made afresh in
        // the select would restart at every watchdog tick and never fire,
        // and a worker that beats but sends nothing would hold the task)
        let silence = tokio::time::sleep(RESULT_SILENCE);
        tokio::pin!(silence);
        loop {
            let next = tokio::select! {
                r = stream.next() => Ok(r),
                _ = &mut silence => Err(()),
                _ = watchdog.tick() => {
                    // layer 5: T_fail = 3 × the worker's heartbeat interval
                    if st.health.lock().unwrap().failed(st.now_ms()).contains(&did) {
                        return Err(Failure { why: "no heartbeat for 3 × its interval".into(), kind: FailureKind::Agent });
                    }
                    continue;
                }
            };
            let result = match next {
                Err(_) => {
                    return Err(Failure {
                        why: format!("no result for {} s", RESULT_SILENCE.as_secs()),
                        kind: FailureKind::Agent,
                    })
                }
                Ok(None) => {
                    return Err(Failure {
                        why: "result stream ended before a final result".into(),
                        kind: FailureKind::Agent,
                    })
                }
                Ok(Some(Err(s))) => return Err(Failure::status("StreamResults", &s)),
                Ok(Some(Ok(r))) => {
                    silence.as_mut().reset(tokio::time::Instant::now() + RESULT_SILENCE);
                    r
                }
            };
            if let Err(e) = node.verifier.verify(&result) {
                return Err(Failure { why: format!("result: {e}"), kind: FailureKind::Agent });
            }
            match pb::TaskStatus::try_from(result.status) {
                Ok(pb::TaskStatus::Running) => {
                    if let Some(cp) = &result.checkpoint {
                        // the worker's own, for this task; kept without chunk
                        // text (a checkpoint names chunks; the next worker gets
                        // their text from here, not from a predecessor)
                        let by_worker = cp.agent.as_ref().map(|a| a.uuid.as_str()) == Some(did.as_str());
                        if by_worker && node.verifier.check_signature(cp).is_ok() && cp.task_id == job.task_id {
                            if cp.context.as_ref().is_some_and(|c| c.chunks.iter().any(|k| !k.data.is_empty())) {
                                tracing::warn!(agent = %did, "a checkpoint carried chunk text; not kept");
                                continue;
                            }
                            node.ledger.lock().unwrap().store().put_checkpoint(cp).map_err(Failure::local)?;
                            // a step counts only when it is the next one, within the
                            // order: one checkpoint claiming the last step is not all
                            if cp.step_number == steps_seen + 1 && cp.step_number <= job.order.steps {
                                steps_seen = cp.step_number;
                            }
                            st.emit(Event::Checkpoint {
                                task: job.task_id.clone(),
                                agent: short(&did),
                                step: cp.step_number,
                            });
                        }
                    }
                }
                Ok(pb::TaskStatus::Completed) => {
                    let latency_ms = submitted.elapsed().as_millis() as u64;
                    let report: WorkReport = serde_json::from_slice(&result.payload).unwrap_or_default();
                    let seen = Seen { latency_ms, steps: steps_seen, sent_up_front: &context.chunks };
                    let quality = self.prove(job, offer, &qos, &result, &report, seen).await;
                    st.breaker_success(&offer.url, &did);
                    st.emit(Event::Completed {
                        task: job.task_id.clone(),
                        agent: short(&did),
                        latency_ms,
                        quality,
                        resumed_after: report.resumed_after,
                    });
                    return Ok(Outcome::Completed {
                        agent: did,
                        report,
                        failovers: 0,
                        latency_ms,
                        quality,
                        cost: result.actual_cost,
                        stages: Vec::new(),
                    });
                }
                _ => return Err(Failure { why: result.error.clone(), kind: FailureKind::Agent }),
            }
        }
    }

    /// Layer 1: the interaction proof of a finished delegation, with the
    /// quality this side measured ([`work::assess`]; 0 on a contract
    /// violation), countersigned by the worker and appended to this agent's
    /// log. A worker that refuses to countersign, or whose answer does not
    /// verify, is still rated: the proof is logged with quality 0 and the
    /// refusal noted as a violation, signed by this side alone. Returns the
    /// quality recorded.
    async fn prove(
        &self,
        job: &Job,
        offer: &Offer,
        qos: &pb::QoSConstraints,
        result: &pb::TaskResult,
        report: &WorkReport,
        seen: Seen<'_>,
    ) -> f64 {
        let st = self.state();
        let node = &self.node;
        // what this worker was sent: with the task (a resumed one's named
        // chunks included) and in answer to its own requests, never what a
        // failed predecessor asked for
        let mut sent = seen.sent_up_front.to_vec();
        let mut starved = false;
        if let Some(d) = st.delegations.lock().unwrap().get(&job.task_id).filter(|d| d.worker == offer.did()) {
            sent.extend(d.got().iter().cloned());
            starved = d.starved;
        }
        // the needs it could have found: in the shareable context, or only in
        // what was sent when this side's budget for the receiver was spent
        let findable: Vec<String> = if starved {
            vec![work::reading_text(&sent).text]
        } else {
            job.context.fields.iter().filter(|f| !f.confidential).map(|f| work::normalize(&f.content)).collect()
        };
        let measured = work::assess(&job.order, seen.steps, &report.chunks, &sent, &findable);
        let mut note = handshake::violation(qos, seen.latency_ms, result.actual_cost, measured);
        let mut proof = pb::InteractionProof {
            evaluator: Some(node.identity.agent_id()),
            subject: offer.offer.from.clone(),
            task_id: job.task_id.clone(),
            task_type: job.task_type as i32,
            quality_score: if note.is_some() { 0.0 } else { measured },
            latency_ms: seen.latency_ms,
            cost: result.actual_cost,
            note: note.clone().unwrap_or_default(),
            ..Default::default()
        };
        node.identity.stamp_and_sign(&mut proof);
        let logged = match self.countersigned(offer, &proof).await {
            Ok(responder_signature) => {
                proof.responder_signature = responder_signature;
                node.ledger.lock().unwrap().append(proof.clone()).map(|_| ())
            }
            Err(why) => {
                tracing::warn!(agent = offer.did(), why, "interaction proof not countersigned; rated 0");
                let refused = format!("contract violation: countersignature refused ({why})");
                let refused = match &note {
                    Some(n) => format!("{n}; {refused}"),
                    None => refused,
                };
                proof.quality_score = 0.0;
                proof.note = refused.clone();
                note = Some(refused);
                node.identity.stamp_and_sign(&mut proof);
                node.ledger.lock().unwrap().append_own(proof.clone()).map(|_| ())
            }
        };
        if let Err(e) = logged {
            tracing::warn!(error = %e, "appending the proof");
            return proof.quality_score;
        }
        let (trust, log_size) = {
            let ledger = node.ledger.lock().unwrap();
            (ledger.trust(offer.did(), Some(job.task_type), now_s()), ledger.len())
        };
        let repriced = st.repricer.lock().unwrap().observe(&routing::Observation::from(&proof));
        if let Some(why) = repriced {
            st.emit(Event::Repriced { agent: short(offer.did()), why: why.to_string() });
        }
        st.emit(Event::Trust {
            agent: short(offer.did()),
            task_type: job.task_type.as_str_name().to_string(),
            score: trust.score,
            samples: trust.samples,
            log_size,
            note: note.unwrap_or_default(),
        });
        proof.quality_score
    }

    /// Asks the proof's subject to countersign it: its responder signature,
    /// or why there is none (a refusal, an answer that does not verify: the
    /// ack must be the subject's signed word for the root and inclusion, or
    /// no answer through [`PROOF_ATTEMPTS`] tries a transport failure or a
    /// busy worker is given, [`PROOF_BACKOFF`] apart and doubling).
    async fn countersigned(&self, offer: &Offer, proof: &pb::InteractionProof) -> Result<Vec<u8>, String> {
        let mut backoff = PROOF_BACKOFF;
        let mut last = String::new();
        for attempt in 0..PROOF_ATTEMPTS {
            if attempt > 0 {
                tokio::time::sleep(backoff).await;
                backoff *= 2;
            }
            match self.countersign_once(offer, proof).await {
                Ok(signature) => return Ok(signature),
                Err(Countersign::Transient(why)) => {
                    tracing::debug!(agent = offer.did(), attempt, why, "countersignature: trying again");
                    last = why;
                }
                Err(Countersign::Refused(why)) => return Err(why),
            }
        }
        Err(format!("no answer in {PROOF_ATTEMPTS} tries; the last: {last}"))
    }

    /// One SubmitInteractionProof call, bounded by [`CALL_TIMEOUT`].
    async fn countersign_once(&self, offer: &Offer, proof: &pb::InteractionProof) -> Result<Vec<u8>, Countersign> {
        let node = &self.node;
        let channel = node.channel(&offer.url).map_err(|e| Countersign::Refused(e.to_string()))?;
        let mut client = pb::atp_service_client::AtpServiceClient::new(channel);
        let answer =
            tokio::time::timeout(CALL_TIMEOUT, client.submit_interaction_proof(proof.clone())).await.map_err(|_| {
                Countersign::Transient(format!(
                    "SubmitInteractionProof: no answer within {} ms",
                    CALL_TIMEOUT.as_millis()
                ))
            })?;
        let ack = match answer {
            Ok(ack) => ack.into_inner(),
            Err(s) => {
                let why = format!("SubmitInteractionProof answered {:?}", s.code());
                return Err(match s.code() {
                    tonic::Code::Unavailable
                    | tonic::Code::DeadlineExceeded
                    | tonic::Code::Cancelled
                    | tonic::Code::ResourceExhausted => Countersign::Transient(why),
                    _ => Countersign::Refused(why),
                });
            }
        };
        let mut countersigned = proof.clone();
        countersigned.responder_signature = ack.responder_signature.clone();
        let signed_by_subject =
            node.verifier.verify(&ack).is_ok() && ack.from.as_ref().map(|a| a.uuid.as_str()) == Some(offer.did());
        if !signed_by_subject {
            return Err("the ack is not signed by the subject".into());
        }
        if node.verifier.check_proof(&countersigned).is_err() {
            return Err("the countersignature does not verify".into());
        }
        if !ack.inclusion.as_ref().is_some_and(|inc| merkle::verify_inclusion(inc, &ack.merkle_root)) {
            return Err("the inclusion proof does not verify".into());
        }
        Ok(ack.responder_signature)
    }
}

/// Why one countersignature call gave none.
enum Countersign {
    /// The transport failed or the worker was busy: worth another try.
    Transient(String),
    /// An answer that is a refusal, or does not verify.
    Refused(String),
}

impl From<&str> for Countersign {
    fn from(why: &str) -> Countersign {
        Countersign::Refused(why.to_string())
    }
}

/// What this side saw of a delegation, for its rating.
struct Seen<'a> {
    latency_ms: u64,
    /// The highest step a verified checkpoint (or the resumed one) showed.
    steps: u32,
    /// The chunks sent with the task (the adaptive ones are in its delegation).
    sent_up_front: &'a [pb::ContextChunk],
}

/// A composite route's stage that failed, and its agent.
#[derive(Debug)]
struct StageFailure {
    did: String,
    url: String,
    failure: Failure,
}

impl StageFailure {
    fn local(offer: &Offer, e: Error) -> StageFailure {
        StageFailure { did: offer.did().to_string(), url: offer.url.clone(), failure: Failure::local(e) }
    }
}

/// Why a delegation to one agent failed.
#[derive(Debug)]
struct Failure {
    why: String,
    kind: FailureKind,
}

/// Whose fault a failed delegation is.
#[derive(Debug, Clone, Copy, PartialEq)]
enum FailureKind {
    /// The agent's: counts against its circuit and toward poison; fail over.
    Agent,
    /// A refusal (queue full, contract declined): try the next route.
    Refused,
    /// The agent called our message invalid or unauthorised: a peer's word,
    /// so it is not obeyed (a hostile peer would make every task be
    /// abandoned) but counted against its circuit, and the next route gets
    /// the task; not toward poison (peers could otherwise mark any task).
    Rejected,
    /// Ours (SCD down, store error): stop.
    Local,
}

impl Failure {
    fn agent(e: Error) -> Failure {
        Failure { why: e.to_string(), kind: FailureKind::Agent }
    }

    fn local(e: Error) -> Failure {
        Failure { why: e.to_string(), kind: FailureKind::Local }
    }

    fn status(rpc: &str, s: &Status) -> Failure {
        let kind = match s.code() {
            tonic::Code::ResourceExhausted | tonic::Code::FailedPrecondition | tonic::Code::AlreadyExists => {
                FailureKind::Refused
            }
            tonic::Code::InvalidArgument | tonic::Code::Unauthenticated | tonic::Code::PermissionDenied => {
                FailureKind::Rejected
            }
            _ => FailureKind::Agent,
        };
        Failure { why: format!("{rpc}: {:?}: {}", s.code(), s.message()), kind }
    }
}

impl Outcome {
    fn with_failovers(self, n: u32) -> Outcome {
        match self {
            Outcome::Completed { agent, report, latency_ms, quality, cost, stages, .. } => {
                Outcome::Completed { agent, report, failovers: n, latency_ms, quality, cost, stages }
            }
            other => other,
        }
    }

    /// A composite route that ran to its end. The answering stage is the
    /// last to run along a sequence or a cascade, the best-rated of a
    /// parallel merge, and an ensemble's first voter for the majority answer
    /// (its best-rated when no majority formed).
    fn of_route(run: PatternRun, failovers: u32, took: Duration) -> Option<Outcome> {
        let best = run.stages.iter().enumerate().max_by(|a, b| a.1.quality.total_cmp(&b.1.quality)).map(|x| x.0);
        let answering = match run.pattern {
            Pattern::ParallelMerge => best,
            Pattern::Ensemble => {
                run.answer.as_ref().and_then(|a| run.stages.iter().position(|s| &s.answer == a)).or(best)
            }
            _ => run.stages.len().checked_sub(1),
        }?;
        let s = &run.stages[answering];
        Some(Outcome::Completed {
            agent: s.agent.clone(),
            report: s.report.clone(),
            failovers,
            latency_ms: took.as_millis() as u64,
            quality: s.quality,
            cost: run.stages.iter().map(|s| s.cost).sum(),
            stages: run.stages,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_limits_are_unbounded_for_routing() {
        let c = constraints(&pb::QoSConstraints { min_quality: 0.8, max_latency_ms: 0, max_cost: 0.0, min_trust: 0.1 });
        assert_eq!(c.max_latency_ms, u64::MAX);
        assert!(c.max_cost.is_infinite());
        let c =
            constraints(&pb::QoSConstraints { min_quality: 0.8, max_latency_ms: 900, max_cost: 0.5, min_trust: 0.1 });
        assert_eq!((c.max_latency_ms, c.max_cost), (900, 0.5));
    }

    #[test]
    fn short_dids() {
        assert_eq!(short("did:key:z6MkhaXgBZDvotDkL5257faiztiGiC2QtKLGpbnnEGta2doK"), "…EGta2doK");
        assert_eq!(short("abc"), "abc");
    }
}
