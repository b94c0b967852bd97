//! The [`Planner`]: the agent it plans for, its peers, the composite
//! patterns it may choose, and the time bounds its steps share.

use std::sync::Arc;
use std::time::Duration;

use tonic::transport::Channel;

use super::job::Job;
use crate::agent::Node;
use crate::handshake::{self, Offer, PeerFailure};
use crate::requester::{short, Event, PlannerState};
use crate::routing::Pattern;
use crate::{pb, Result};

/// The requester driver: delegates jobs to a set of peers.
pub struct Planner {
    pub(super) node: Arc<Node>,
    pub(super) peers: Vec<(String, Channel)>,
    pub(super) composites: Vec<Pattern>,
}

/// The longest a planner holds a task back for an agent's back-pressure.
pub(super) const MAX_BUFFER: Duration = Duration::from_secs(2);

/// The longest a planner waits for any result of a running task.
pub(super) const RESULT_SILENCE: Duration = Duration::from_secs(30);

/// The longest a worker may take to answer SubmitTask or open its result
/// stream (the contract's own bound, 4 × T_OFFER).
pub(super) const CALL_TIMEOUT: Duration = Duration::from_millis(4 * handshake::T_OFFER.as_millis() as u64);

/// Tries at a countersignature when the transport fails or the worker is
/// busy; after them a missing countersignature is a violation like a refusal
/// (a worker must not escape its rating by dropping the call).
pub(super) const PROOF_ATTEMPTS: u32 = 3;
/// The wait before the second try (doubling after).
pub(super) const PROOF_BACKOFF: Duration = Duration::from_millis(200);

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

    pub(super) fn state(&self) -> &PlannerState {
        &self.node.planner
    }

    /// The peers whose circuit lets a call through now (layer 5); the
    /// others are reported skipped.
    pub(super) fn open_peers(&self, job: &Job) -> Vec<(String, Channel)> {
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

    pub(super) fn account_probe(&self, job: &Job, n: &handshake::Negotiation) {
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
    pub(super) fn evidence_ok(&self, o: &Offer) -> bool {
        o.evidence_holds(&self.node.verifier)
    }
}

/// What a probe asks when composites may be chosen: the task's latency, cost
/// and trust bounds, without its quality floor.
pub(super) fn member_probe(qos: pb::QoSConstraints) -> pb::QoSConstraints {
    pb::QoSConstraints { min_quality: 0.0, ..qos }
}

/// The constraints an agent contracts to: the task's, with the quality it
/// offered when that is below q_min. Routing may count on more (a
/// composite's model, or the quality this side measured of it, which can
/// exceed its offer), but an agent is held to its own word, and one asked
/// for more than it offered refuses the contract.
pub(super) fn agreed(qos: pb::QoSConstraints, offer: &Offer) -> pb::QoSConstraints {
    pb::QoSConstraints { min_quality: qos.min_quality.min(offer.capability().estimated_quality), ..qos }
}
