//! Fresh offers for a route's later stages. An offer stays open for a
//! contract `ttl_ms` after it is made; a stage that starts after earlier
//! stages ran may find its agent's offer closed (the agent refuses the
//! contract), so its agent is asked again first, through the same probe,
//! and its fresh offer verified as the route's offers were.

use std::time::Duration;

use super::driver::Planner;
use super::failure::Failure;
use super::failure::FailureKind;
use super::failure::StageFailure;
use super::job::Job;
use crate::handshake::{self, Offer, PeerFailure, Round};
use crate::identity::Verifier;
use crate::pb;
use crate::requester::{short, trust_of, Event};

/// How long before its close an offer is asked again: the bound a peer
/// has to answer a handshake message (T_offer), so that a contract sent now
/// reaches the agent while its offer is open.
pub(super) const CONTRACT_MARGIN: Duration = handshake::T_OFFER;

impl Planner {
    /// `offer`, when it stays open past [`CONTRACT_MARGIN`] by its own
    /// `ttl_ms`; otherwise its agent's fresh offer to `probe` (the probe the
    /// route's offers answered), verified by [`reoffer`].
    pub(super) async fn current(
        &self,
        job: &Job,
        offer: &Offer,
        probe: &pb::CapabilityProbe,
    ) -> Result<Offer, StageFailure> {
        if offer.open_for(CONTRACT_MARGIN) {
            return Ok(offer.clone());
        }
        let node = &self.node;
        let fail = |failure| StageFailure { did: offer.did().to_string(), url: offer.url.clone(), failure };
        let channel = node.channel(&offer.url).map_err(|e| fail(Failure::agent(e)))?;
        let peer = [(offer.url.clone(), channel)];
        let round = handshake::probe_round(&node.identity, &node.verifier, &peer, probe).await;
        let task_type = pb::TaskType::try_from(probe.task_type).unwrap_or(pb::TaskType::Unspecified);
        let trust = |o: &Offer| trust_of(&node.ledger, o, task_type);
        let fresh = reoffer(offer, round, &node.verifier, trust).map_err(fail)?;
        let st = self.state();
        st.emit(Event::Reoffered {
            task: job.task_id.clone(),
            agent: short(offer.did()),
            age_ms: offer.asked_at.elapsed().as_millis() as u64,
        });
        st.remember_offers(std::slice::from_ref(&fresh));
        Ok(fresh)
    }
}

/// The fresh offer of `chosen`'s agent from `round`, a probe round to it
/// alone (which verified the offer's signature and sender, its reply to the
/// probe's nonce, its figures' ranges, task type and QoS), checked as the
/// route's offers were: the same agent (DID), trust evidence that holds,
/// and terms no worse than the route was chosen on, by `trust` too. An
/// invalid re-offer is rejected (against the agent's circuit); worse terms
/// are a refusal: the route is planned again, without this agent, rather
/// than run on figures Algorithm 1 did not choose. A fresh offer that would
/// close before a contract reaches it is refused too.
pub(super) fn reoffer(
    chosen: &Offer,
    round: Round,
    verifier: &Verifier,
    trust: impl Fn(&Offer) -> f64,
) -> Result<Offer, Failure> {
    let rejected = |why: String| Failure { why: format!("re-offer rejected: {why}"), kind: FailureKind::Rejected };
    if let Some((_, why)) = round.failures.into_iter().next() {
        return Err(match why {
            PeerFailure::Declined(why) => {
                Failure { why: format!("re-offer declined: {why}"), kind: FailureKind::Refused }
            }
            PeerFailure::Down(why) => Failure { why: format!("re-offer: {why}"), kind: FailureKind::Agent },
            PeerFailure::Invalid(why) => rejected(why),
        });
    }
    let Some(fresh) = round.offers.into_iter().next() else {
        return Err(Failure { why: "re-offer: no answer".into(), kind: FailureKind::Agent });
    };
    if fresh.did() != chosen.did() {
        return Err(rejected(format!("it is from {}, not {}", short(fresh.did()), short(chosen.did()))));
    }
    if !fresh.evidence_holds(verifier) {
        return Err(rejected("its trust evidence does not hold".into()));
    }
    let (was, now) = (chosen.capability(), fresh.capability());
    let mut worse = Vec::new();
    if now.estimated_quality < was.estimated_quality {
        worse.push(format!("quality {:.3} < {:.3}", now.estimated_quality, was.estimated_quality));
    }
    if now.estimated_latency_ms > was.estimated_latency_ms {
        worse.push(format!("latency {} ms > {} ms", now.estimated_latency_ms, was.estimated_latency_ms));
    }
    if now.cost_per_task > was.cost_per_task {
        worse.push(format!("cost {:.4} > {:.4}", now.cost_per_task, was.cost_per_task));
    }
    let (trust_was, trust_now) = (trust(chosen), trust(&fresh));
    if trust_now < trust_was {
        worse.push(format!("trust {trust_now:.3} < {trust_was:.3}"));
    }
    if !worse.is_empty() {
        let why = format!("re-offer worse than the route was chosen on ({}): planning again", worse.join(", "));
        return Err(Failure { why, kind: FailureKind::Refused });
    }
    if !fresh.open_for(CONTRACT_MARGIN) {
        let why = format!(
            "re-offer open {} ms, not past a contract's {} ms margin",
            fresh.offer.ttl_ms,
            CONTRACT_MARGIN.as_millis()
        );
        return Err(Failure { why, kind: FailureKind::Refused });
    }
    Ok(fresh)
}
