//! What a requesting agent keeps between calls: the peers' offers, their
//! health, breakers, back-pressure and repricing, the context sent per hop,
//! and the [`Event`]s of its story. An agent's server ([`crate::agent`])
//! feeds it with the heartbeats, back-pressure and context requests its
//! workers send back; the [`crate::planner`] reads it to route and delegate.
//! It depends on neither, so the two do not depend on each other.
//!
//! ```
//! use scd_atp::requester::short;
//!
//! assert_eq!(short("did:key:z6MkhaXgBZDvotDkL5257faiztiGiC2QtKLGpbnnEGta2doK"), "…EGta2doK");
//! ```

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use serde::Serialize;
use tokio::sync::mpsc::UnboundedSender;
use tonic::Status;

use crate::context::{HopLedger, ScdLink, Transfer};
use crate::fault::{self, Backpressure, CircuitBreakers, HealthMonitor, PoisonDetector};
use crate::handshake::Offer;
use crate::identity::now_s;
use crate::routing::{self, Candidate, Constraints, Repricer, RoutingParams};
use crate::store::Ledger;
use crate::{pb, Result};

/// Peer offers remembered (heartbeats are taken only from their DIDs).
pub const MAX_KNOWN_OFFERS: usize = 4096;

/// What happened, for the demo's story and its JSON. Fields: `task` is the
/// task id; agents are short DIDs ([`short`]) or, for peers not yet known by
/// DID, their URLs.
#[allow(missing_docs)]
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Event {
    /// A probe round ended.
    Probed { task: String, round: u32, offers: Vec<String>, down: Vec<String>, declined: Vec<String> },
    /// A peer's circuit is open: it is skipped.
    Skipped { task: String, agent: String },
    /// Algorithm 1 chose a route.
    Routed {
        task: String,
        pattern: String,
        agents: Vec<String>,
        quality: f64,
        latency_ms: u64,
        cost: f64,
        score: f64,
        candidates: usize,
    },
    /// A contract was signed by both sides.
    Contracted { task: String, agent: String, contract: String },
    /// The route's offer of an agent had closed (or would before a contract
    /// reached it): it was asked again, and its fresh offer verified.
    Reoffered { task: String, agent: String, age_ms: u64 },
    /// SCD's minimal sufficient context went with the task.
    ContextSent {
        task: String,
        agent: String,
        full_tokens: u64,
        sent_tokens: u64,
        chunks: usize,
        withheld: Vec<String>,
    },
    /// The worker asked for more context (§6.3).
    ContextRequested {
        task: String,
        agent: String,
        question: String,
        confidence: f64,
        chunks: usize,
        /// The receiver's budget left after this answer.
        remaining_tokens: u32,
    },
    /// A durable checkpoint arrived.
    Checkpoint { task: String, agent: String, step: u32 },
    /// The worker failed (died, missed heartbeats, or failed the task).
    AgentFailed { task: String, agent: String, why: String },
    /// The task moved to the next agent of its route.
    Failover { task: String, from: String, to: String, resumed_after: u32 },
    /// A circuit changed state.
    Circuit { agent: String, from: String, to: String },
    /// A route was skipped (back-pressure, a full queue, a refusal).
    Rerouted { task: String, agent: String, why: String },
    /// A task waited for an agent's back-pressure to ease.
    Buffered { task: String, agent: String, ms: u64 },
    /// A worker signalled back-pressure.
    Backpressure { agent: String, queue_depth: u32, action: String },
    /// The task is poison: back to the originator.
    Poison { task: String, diagnostics: String },
    /// Done.
    Completed { task: String, agent: String, latency_ms: u64, quality: f64, resumed_after: u32 },
    /// Observed figures moved past a §7.3 threshold (or an agent failed):
    /// the next task's routes are computed from the new estimates.
    Repriced { agent: String, why: String },
    /// A proof was appended (countersigned, or this side's alone when the
    /// worker refused: then `note` says so) and trust recomputed.
    Trust { agent: String, task_type: String, score: f64, samples: u32, log_size: u64, note: String },
}

/// A task delegated by this agent, as its RequestContext handler sees it.
pub(crate) struct Delegation {
    pub(crate) worker: String,
    pub(crate) transfer: Arc<Transfer>,
    /// The chunks its workers asked for and got, across failovers (bounded
    /// by the receiver's budget, which the SCD session enforces): a resumed
    /// worker gets those its predecessor's checkpoint names, since a
    /// checkpoint carries chunk ids, not copies.
    pub(crate) sent: Vec<pb::ContextChunk>,
    /// Where the current worker's answers start in `sent`: its rating counts
    /// `sent[got_from..]`, not what a predecessor was sent.
    pub(crate) got_from: usize,
    /// The receiver's budget (or the context) ran out while the current
    /// worker asked: a shortfall from then on is not its fault.
    pub(crate) starved: bool,
}

impl Delegation {
    /// The delegation of a task to `worker`, after `before` (a failed
    /// worker's): what was sent carries over for resuming, what the worker
    /// got and whether it was starved start afresh.
    pub(crate) fn handed_to(worker: &str, transfer: Arc<Transfer>, before: Option<Delegation>) -> Delegation {
        let sent = before.map(|d| d.sent).unwrap_or_default();
        Delegation { worker: worker.to_string(), transfer, got_from: sent.len(), sent, starved: false }
    }

    /// The chunks the current worker asked for and got.
    pub(crate) fn got(&self) -> &[pb::ContextChunk] {
        &self.sent[self.got_from..]
    }

    /// Records an answer to the current worker's context request.
    fn answered(&mut self, reply: &pb::ContextResponse) {
        self.sent.extend(reply.chunks.iter().cloned());
        self.starved |= reply.remaining_tokens == 0 || !reply.reason.is_empty();
    }
}

/// Requester-side state of an agent (shared with its server: workers call
/// back with heartbeats, back-pressure and context requests).
pub struct PlannerState {
    pub(crate) scd_url: String,
    pub(crate) scd: tokio::sync::OnceCell<ScdLink>,
    pub(crate) delegations: Mutex<HashMap<String, Delegation>>,
    /// Worker health from heartbeats.
    pub health: Mutex<HealthMonitor>,
    /// One breaker per peer (keyed by URL: a dead peer has no DID to show).
    pub breakers: Mutex<CircuitBreakers>,
    /// Failures per task across agents.
    pub poison: Mutex<PoisonDetector>,
    /// Back-pressure per worker.
    pub pressure: Mutex<Backpressure>,
    /// Estimates repriced from interaction proofs.
    pub repricer: Mutex<Repricer>,
    /// Tokens sent vs full context, per hop.
    pub hops: Mutex<HopLedger>,
    /// The latest offer of each peer DID: one DID per peer URL (a peer that
    /// rotates DIDs replaces its own), at most [`MAX_KNOWN_OFFERS`].
    pub(crate) offers: Mutex<HashMap<String, Offer>>,
    pub(crate) events: Mutex<Option<UnboundedSender<Event>>>,
    pub(crate) started: Instant,
}

impl PlannerState {
    /// Requester state using the SCD service at `scd_url` (connected on first use).
    pub fn new(scd_url: &str) -> PlannerState {
        PlannerState {
            scd_url: scd_url.to_string(),
            scd: tokio::sync::OnceCell::new(),
            delegations: Mutex::default(),
            health: Mutex::new(HealthMonitor::new()),
            breakers: Mutex::new(CircuitBreakers::new(fault::BreakerParams::default())),
            poison: Mutex::new(PoisonDetector::new(fault::PoisonParams::default())),
            pressure: Mutex::new(Backpressure::new(fault::BackpressureParams::default())),
            repricer: Mutex::new(Repricer::new(routing::RepricerParams::default())),
            hops: Mutex::default(),
            offers: Mutex::default(),
            events: Mutex::new(None),
            started: Instant::now(),
        }
    }

    /// Sends every [`Event`] to `tx` from now on.
    pub fn subscribe(&self, tx: UnboundedSender<Event>) {
        *self.events.lock().unwrap() = Some(tx);
    }

    pub(crate) fn emit(&self, e: Event) {
        tracing::info!(?e, "atp");
        if let Some(tx) = self.events.lock().unwrap().as_ref() {
            let _ = tx.send(e);
        }
    }

    pub(crate) fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// The SCD client (connected once).
    pub async fn scd(&self) -> Result<&ScdLink> {
        self.scd.get_or_try_init(|| ScdLink::connect(&self.scd_url)).await
    }

    /// Answers a worker's RequestContext through the task's SCD session.
    pub async fn answer_context_request(
        &self,
        me: &str,
        req: &pb::ContextRequest,
    ) -> Result<pb::ContextResponse, Status> {
        let transfer = {
            let delegations = self.delegations.lock().unwrap();
            let Some(d) = delegations.get(&req.task_id) else {
                return Err(Status::not_found(format!(
                    "context.task_id: {:?} is not a task this agent delegated",
                    req.task_id
                )));
            };
            if Some(d.worker.as_str()) != req.from.as_ref().map(|a| a.uuid.as_str()) {
                return Err(Status::permission_denied("context.from: the task is delegated to another agent"));
            }
            d.transfer.clone()
        };
        let scd = self.scd().await.map_err(Status::from)?;
        let reply = scd.answer(&transfer.session, req).await.map_err(Status::from)?;
        if let Some(d) = self.delegations.lock().unwrap().get_mut(&req.task_id) {
            d.answered(&reply);
        }
        let worker = req.from.as_ref().map(|a| a.uuid.clone()).unwrap_or_default();
        if let Err(e) = self.hops.lock().unwrap().record_response(&req.task_id, me, &worker, &reply) {
            tracing::warn!(error = %e, "accounting a context response");
        }
        self.emit(Event::ContextRequested {
            task: req.task_id.clone(),
            agent: short(&worker),
            question: req.specific_question.clone(),
            confidence: req.current_confidence,
            chunks: reply.chunks.len(),
            remaining_tokens: reply.remaining_tokens,
        });
        Ok(reply)
    }

    pub(crate) fn routed(&self, task_id: &str, route: &routing::RouteChoice, candidates: usize) {
        self.emit(Event::Routed {
            task: task_id.to_string(),
            pattern: route.pattern.name().to_string(),
            agents: route.agents.iter().map(|a| short(a)).collect(),
            quality: route.quality,
            latency_ms: route.latency_ms,
            cost: route.cost,
            score: route.score,
            candidates,
        });
    }

    /// Refuses heartbeats and back-pressure from agents that never offered
    /// to this one (their state would grow without bound otherwise).
    pub fn check_peer(&self, from: &Option<pb::AgentId>, field: &str) -> Result<(), Status> {
        let did = from.as_ref().map_or("", |a| a.uuid.as_str());
        if self.offers.lock().unwrap().contains_key(did) {
            Ok(())
        } else {
            Err(Status::permission_denied(format!("{field}: {did} is not a peer that made this agent an offer")))
        }
    }

    /// A worker's heartbeat.
    pub fn heartbeat(&self, hb: &pb::Heartbeat) {
        self.health.lock().unwrap().beat_pb(hb, self.now_ms());
    }

    /// A worker's back-pressure signal.
    pub fn backpressure(&self, bp: &pb::Backpressure) {
        let did = bp.from.as_ref().map(|a| a.uuid.clone()).unwrap_or_default();
        let status = self.health.lock().unwrap().status(&did, self.now_ms());
        let action = self.pressure.lock().unwrap().signal(bp, status, self.now_ms());
        self.emit(Event::Backpressure {
            agent: short(&did),
            queue_depth: bp.queue_depth,
            action: format!("{action:?}"),
        });
    }

    /// A peer's report of a circuit it opened (informational).
    pub fn circuit_report(&self, cb: &pb::CircuitBreak) {
        tracing::info!(from = ?cb.from, target = ?cb.target, state = cb.state, "peer reported a circuit break");
    }

    /// Routes this agent would take for `query`, from the offers it has seen.
    pub fn routes(&self, ledger: &Mutex<Ledger>, query: &pb::RouteQuery) -> Result<Vec<pb::Route>> {
        let task_type = pb::TaskType::try_from(query.task_type).unwrap_or(pb::TaskType::Unspecified);
        let exclude: HashSet<&str> = query.exclude.iter().map(|a| a.uuid.as_str()).collect();
        let offers: Vec<Offer> =
            self.offers.lock().unwrap().values().filter(|o| !exclude.contains(o.did())).cloned().collect();
        let cands = self.candidates(ledger, &offers, task_type);
        let constraints = constraints(&query.qos.unwrap_or_default());
        let max = if query.max_routes == 0 { 8 } else { query.max_routes.min(64) } as usize;
        let routes = routing::route(&cands, task_type, &constraints, &RoutingParams::default());
        Ok(routes.iter().take(max).map(|r| r.to_pb()).collect())
    }

    /// Routing candidates from verified offers: trust from this agent's
    /// ledger (Definition 3 over the proofs it evaluated itself, or the
    /// cold-start prior below the minimum interactions) with the referrals
    /// an offer's verified evidence carries from evaluators established in
    /// that ledger ([`crate::trust::TrustBook::with_evidence`]: a peer's
    /// self-chosen history counts only through raters this agent trusts),
    /// which prunes routes below `min_trust`; estimates repriced from
    /// interaction proofs. Routes are
    /// recomputed for every task from the current figures, so a repricing
    /// trigger takes effect at the next task.
    pub(crate) fn candidates(
        &self,
        ledger: &Mutex<Ledger>,
        offers: &[Offer],
        task_type: pb::TaskType,
    ) -> Vec<Candidate> {
        let held = ledger.lock().unwrap(); // once for all the offers
        let mut cands: Vec<Candidate> = offers
            .iter()
            .map(|o| Candidate::from_capability(o.did(), &o.capability(), trust_in(&held, o, task_type)))
            .collect();
        drop(held);
        // these figures are what the routes are computed with: the
        // baseline the repricing thresholds are measured from
        let mut repricer = self.repricer.lock().unwrap();
        repricer.apply(&mut cands);
        repricer.repriced(self.now_ms(), &cands);
        drop(repricer);
        cands
    }

    pub(crate) fn remember_offers(&self, offers: &[Offer]) {
        let mut known = self.offers.lock().unwrap();
        for o in offers {
            known.retain(|did, k| k.url != o.url || did == o.did());
            // the oldest offer gives way
            crate::bounded::bounded_insert(&mut known, MAX_KNOWN_OFFERS, o.did().to_string(), o.clone(), |k| {
                k.offer.timestamp.map(|t| (t.seconds, t.nanos))
            });
        }
    }

    /// The offers remembered (for tests of their bound).
    #[doc(hidden)]
    pub fn known_offers(&self) -> usize {
        self.offers.lock().unwrap().len()
    }

    pub(crate) fn breaker_failure(&self, url: &str, did: Option<&str>) {
        let t = self.breakers.lock().unwrap().record_failure(url, self.now_ms());
        if let Some(t) = t {
            self.emit(Event::Circuit {
                agent: did.map_or_else(|| url.to_string(), short),
                from: format!("{:?}", t.from),
                to: format!("{:?}", t.to),
            });
        }
    }

    pub(crate) fn breaker_success(&self, url: &str, did: &str) {
        let t = self.breakers.lock().unwrap().record_success(url, self.now_ms());
        if let Some(t) = t {
            self.emit(Event::Circuit { agent: short(did), from: format!("{:?}", t.from), to: format!("{:?}", t.to) });
        }
    }
}

/// QoS with 0 = unbounded, as routing constraints.
pub(crate) fn constraints(q: &pb::QoSConstraints) -> Constraints {
    Constraints {
        min_quality: q.min_quality,
        max_latency_ms: if q.max_latency_ms == 0 { u64::MAX } else { q.max_latency_ms },
        max_cost: if q.max_cost <= 0.0 { f64::INFINITY } else { q.max_cost },
        min_trust: q.min_trust,
    }
}

/// The last 8 characters of a DID, for logs and stories.
pub fn short(did: &str) -> String {
    let tail: String = did.chars().rev().take(8).collect::<Vec<_>>().into_iter().rev().collect();
    if did.len() > 8 {
        format!("…{tail}")
    } else {
        tail
    }
}

/// The trust routing gives `offer`'s agent for `task_type`: this agent's
/// book, with the offer's evidence (which [`Offer::evidence_holds`] checks).
pub(crate) fn trust_of(ledger: &Mutex<Ledger>, offer: &Offer, task_type: pb::TaskType) -> f64 {
    trust_in(&ledger.lock().unwrap(), offer, task_type)
}

/// [`trust_of`] in a ledger already locked, for a caller that reads many
/// offers under one lock.
fn trust_in(ledger: &Ledger, offer: &Offer, task_type: pb::TaskType) -> f64 {
    let evidence = offer.offer.trust_evidence.as_ref().map_or(&[][..], |e| &e.proofs[..]);
    ledger.book().with_evidence(offer.did(), Some(task_type), now_s(), evidence)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn offer(url: &str, did: &str, at: i64) -> Offer {
        let offer = pb::CapabilityOffer {
            from: Some(pb::AgentId { uuid: did.into() }),
            timestamp: Some(pb::Timestamp { seconds: at, nanos: 0 }),
            ..Default::default()
        };
        Offer { url: url.into(), offer, asked_at: std::time::Instant::now() }
    }

    #[test]
    fn a_peer_rotating_its_did_keeps_one_offer_and_the_offers_are_bounded() {
        let st = PlannerState::new("http://127.0.0.1:1");
        for i in 0..100 {
            st.remember_offers(&[offer("http://10.0.0.1:7700", &format!("did:key:z{i}"), i)]);
        }
        assert_eq!(st.known_offers(), 1, "one DID per peer URL");
        let peer = |did: &str| Some(pb::AgentId { uuid: did.into() });
        assert!(st.check_peer(&peer("did:key:z99"), "heartbeat.from").is_ok());
        assert!(st.check_peer(&peer("did:key:z98"), "heartbeat.from").is_err(), "a shed DID no longer counts");
        let many: Vec<Offer> = (0..MAX_KNOWN_OFFERS + 10)
            .map(|i| offer(&format!("http://10.1.0.{i}:1"), &format!("d{i}"), i as i64))
            .collect();
        st.remember_offers(&many);
        assert_eq!(st.known_offers(), MAX_KNOWN_OFFERS);
        assert!(st.check_peer(&peer(&format!("d{}", MAX_KNOWN_OFFERS + 9)), "f").is_ok(), "the newest is kept");
        assert!(st.check_peer(&peer("d0"), "f").is_err(), "the oldest gave way");
    }

    /// A failed-over task's next worker is rated on what it was sent: the
    /// chunks its predecessor asked for stay for resuming but are not its
    /// own, and a predecessor's starved budget does not excuse it.
    #[test]
    fn a_successor_starts_with_nothing_got_and_not_starved() {
        let transfer = Arc::new(Transfer {
            diff: pb::ContextDiff::default(),
            session: crate::context::SessionHandle::detached(),
            full_tokens: 0,
            sent_tokens: 0,
        });
        let chunk = |id: &str| pb::ContextChunk { chunk_id: id.into(), ..Default::default() };
        let mut first = Delegation::handed_to("did:a", transfer.clone(), None);
        first.answered(&pb::ContextResponse { chunks: vec![chunk("x#0")], remaining_tokens: 40, ..Default::default() });
        assert!(!first.starved);
        first.answered(&pb::ContextResponse { chunks: vec![chunk("x#1")], remaining_tokens: 0, ..Default::default() });
        assert!(first.starved && first.got().len() == 2 && first.sent.len() == 2);
        let next = Delegation::handed_to("did:b", transfer, Some(first));
        assert_eq!(next.worker, "did:b");
        assert!(!next.starved && next.got().is_empty());
        let kept: Vec<&str> = next.sent.iter().map(|c| c.chunk_id.as_str()).collect();
        assert_eq!(kept, ["x#0", "x#1"], "kept for a resume that names them");
    }

    /// Trust steers routing: a fresh agent vouched for (in its offer's
    /// evidence, built by its own ledger and checked as the planner checks
    /// it) by an agent this requester rated is routed past a min_trust
    /// that the 0.5 prior does not meet; the same evidence from a stranger
    /// is not, evidence that does not hold is refused before routing, and
    /// this side's own bad ratings prune an agent.
    #[test]
    fn evidence_from_a_rater_we_trust_lifts_a_fresh_agent_over_min_trust() {
        use crate::identity::{Identity, SignMessages as _, Verifier};
        use crate::store::Store;
        let dir = tempfile::tempdir().unwrap();
        let (me, b, stranger) = (Identity::generate(), Identity::generate(), Identity::generate());
        let (vouched, unknown) = (Identity::generate(), Identity::generate());
        let resolver: Arc<dyn crate::identity::Resolver> = Arc::new(crate::identity::DidResolver::new());
        let ledger_of = |who: &Identity| {
            let store = Arc::new(Store::open(&dir.path().join(who.did().replace(':', "_"))).unwrap());
            Ledger::open(store, who.did(), Default::default(), resolver.clone()).unwrap()
        };
        let ledger = Mutex::new(ledger_of(&me));
        let verifier = Verifier::new(resolver.clone(), Arc::new(Store::open(&dir.path().join("v")).unwrap()));
        let analysis = pb::TaskType::Analysis;
        let proof = |eval: &Identity, subj: &Identity, q: f64| {
            let mut p = pb::InteractionProof {
                evaluator: Some(eval.agent_id()),
                subject: Some(subj.agent_id()),
                task_id: format!("t-{}", crate::identity::fresh_nonce()),
                task_type: analysis as i32,
                quality_score: q,
                ..Default::default()
            };
            eval.stamp_and_sign(&mut p);
            subj.countersign(&mut p);
            p
        };
        for _ in 0..3 {
            ledger.lock().unwrap().append(proof(&me, &b, 0.9)).unwrap();
        }
        // what an agent's offer shows: the proofs about it in its own log
        let evidence_of = |who: &Identity, rater: &Identity, q: f64| {
            let mut own = ledger_of(who);
            for _ in 0..3 {
                own.append(proof(rater, who, q)).unwrap();
            }
            own.evidence(analysis, 8)
        };
        let offer_of = |who: &Identity, url: &str, evidence: pb::TrustEvidence| Offer {
            url: url.into(),
            offer: pb::CapabilityOffer {
                from: Some(who.agent_id()),
                capability: Some(pb::Capability {
                    task_type: analysis as i32,
                    estimated_quality: 0.9,
                    estimated_latency_ms: 100,
                    cost_per_task: 0.01,
                }),
                trust_proof: evidence.merkle_root.clone(),
                trust_evidence: Some(evidence),
                ..Default::default()
            },
            asked_at: std::time::Instant::now(),
        };
        let offers = [
            offer_of(&vouched, "http://10.0.0.1:1", evidence_of(&vouched, &b, 0.9)),
            offer_of(&unknown, "http://10.0.0.2:1", evidence_of(&unknown, &stranger, 1.0)),
        ];
        assert!(offers.iter().all(|o| o.evidence_holds(&verifier)), "real evidence holds");
        // evidence that does not hold: a proof swapped for one its root does
        // not include, a root other than the offered one, a proof about another
        let mut swapped = offers[0].clone();
        swapped.offer.trust_evidence.as_mut().unwrap().proofs[0] = proof(&b, &vouched, 1.0);
        let mut rerooted = offers[0].clone();
        rerooted.offer.trust_proof = vec![0; 32];
        let mut borrowed = offers[1].clone();
        borrowed.offer.from = Some(vouched.agent_id());
        for bad in [&swapped, &rerooted, &borrowed] {
            assert!(!bad.evidence_holds(&verifier), "{:?}", bad.offer.trust_proof);
        }
        let st = PlannerState::new("http://127.0.0.1:1");
        let c = routing::Constraints { min_quality: 0.5, max_latency_ms: 10_000, max_cost: 1.0, min_trust: 0.6 };
        let routed = |st: &PlannerState| {
            let held: Vec<Offer> = offers.iter().filter(|o| o.evidence_holds(&verifier)).cloned().collect();
            let cands = st.candidates(&ledger, &held, analysis);
            let routes = routing::route(&cands, analysis, &c, &RoutingParams::default());
            routes.iter().filter(|r| r.agents.len() == 1).map(|r| r.agents[0].clone()).collect::<Vec<_>>()
        };
        assert_eq!(routed(&st), vec![vouched.did().to_string()], "the stranger's vouching adds nothing");
        // three bad ratings of this side's own outweigh any referral
        for _ in 0..3 {
            ledger.lock().unwrap().append(proof(&me, &vouched, 0.0)).unwrap();
        }
        assert!(routed(&st).is_empty());
    }
}
