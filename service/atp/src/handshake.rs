//! Layer 2: the capability handshake (paper §5).
//!
//! probe → offer → contract, at most three round trips (Property 3):
//!
//! 1. the requester sends a signed [`pb::CapabilityProbe`] (task type, QoS,
//!    the task embedding from SCD, a nonce) to every candidate;
//! 2. each candidate that can meet it answers a signed
//!    [`pb::CapabilityOffer`] with `in_reply_to` = the probe's nonce, its
//!    trust evidence and its context requirement ([`offer_for`]);
//! 3. the requester picks an offer and sends a signed
//!    [`pb::ContractAccept`]; the contractor acknowledges it, signed.
//!
//! No acceptable offer within [`T_OFFER`] → the probe is retried with the
//! constraints relaxed by [`RELAX_STEP`] per try ([`relax`]), at most
//! [`MAX_RETRIES`] times, then the requester escalates to its originator
//! ([`Error::Escalated`]).
//!
//! ```
//! use scd_atp::handshake::{meets, relax};
//! use scd_atp::pb::{Capability, QoSConstraints, TaskType};
//! let cap = Capability { task_type: TaskType::CodeGeneration as i32, estimated_quality: 0.85,
//!                        estimated_latency_ms: 500, cost_per_task: 0.02 };
//! let qos = QoSConstraints { min_quality: 0.9, max_latency_ms: 1000, max_cost: 0.05, min_trust: 0.0 };
//! assert!(meets(&cap, &qos).is_err());            // 0.85 < 0.9
//! assert!(meets(&cap, &relax(&qos, 1)).is_ok());  // 0.85 ≥ 0.81 after one 10 % relaxation
//! ```

use std::time::{Duration, Instant};

use futures_util::future::join_all;
use tonic::transport::{Channel, Endpoint};

use crate::identity::SignMessages as _;
use crate::identity::{Identity, Verifier};
use crate::{pb, Error, Result};

/// T_offer: how long a requester waits for offers (§5.3).
pub const T_OFFER: Duration = Duration::from_millis(500);
/// Retries with relaxed constraints before escalating (§5.3).
pub const MAX_RETRIES: u32 = 3;
/// How much each retry relaxes the constraints.
pub const RELAX_STEP: f64 = 0.10;
/// How long an offer stays valid (an agent's default; its offers state
/// theirs in `ttl_ms`, [`OfferTerms::ttl_ms`]).
pub const OFFER_TTL_MS: u64 = 10_000;
/// How long a contract stays valid after it is accepted.
pub const CONTRACT_TTL_MS: u64 = 600_000;

/// `qos` relaxed `tries` times by [`RELAX_STEP`]: minimum quality and trust
/// ×0.9 per try, maximum latency and cost ×1.1 per try (0 = unbounded stays 0).
pub fn relax(qos: &pb::QoSConstraints, tries: u32) -> pb::QoSConstraints {
    let down = (1.0 - RELAX_STEP).powi(tries as i32);
    let up = (1.0 + RELAX_STEP).powi(tries as i32);
    pb::QoSConstraints {
        min_quality: qos.min_quality * down,
        min_trust: qos.min_trust * down,
        max_latency_ms: (qos.max_latency_ms as f64 * up).round() as u64,
        max_cost: qos.max_cost * up,
    }
}

/// Whether a capability meets the constraints (the responder's check, and
/// the requester's check of an offer); the error names the first miss.
/// `max_latency_ms` / `max_cost` of 0 mean unbounded.
pub fn meets(cap: &pb::Capability, qos: &pb::QoSConstraints) -> std::result::Result<(), String> {
    if cap.estimated_quality < qos.min_quality {
        return Err(format!("quality {:.3} < min_quality {:.3}", cap.estimated_quality, qos.min_quality));
    }
    if qos.max_latency_ms > 0 && cap.estimated_latency_ms > qos.max_latency_ms {
        return Err(format!("latency {} ms > max_latency_ms {}", cap.estimated_latency_ms, qos.max_latency_ms));
    }
    if qos.max_cost > 0.0 && cap.cost_per_task > qos.max_cost {
        return Err(format!("cost {:.4} > max_cost {:.4}", cap.cost_per_task, qos.max_cost));
    }
    Ok(())
}

/// Checks the parts of a probe that signatures do not: a known task type and
/// sane QoS numbers. The error names the field.
pub fn check_probe(probe: &pb::CapabilityProbe) -> Result<()> {
    let invalid = |field: &str, reason: String| Err(Error::Invalid { field: field.into(), reason });
    match pb::TaskType::try_from(probe.task_type) {
        Ok(pb::TaskType::Unspecified) | Err(_) => {
            return invalid("probe.task_type", format!("{} is not a task type (1 to 4)", probe.task_type))
        }
        Ok(_) => {}
    }
    let qos = probe.qos.unwrap_or_default();
    for (field, v) in [("probe.qos.min_quality", qos.min_quality), ("probe.qos.min_trust", qos.min_trust)] {
        if !(0.0..=1.0).contains(&v) {
            return invalid(field, format!("{v} is outside [0, 1]"));
        }
    }
    if !qos.max_cost.is_finite() || qos.max_cost < 0.0 {
        return invalid("probe.qos.max_cost", format!("{} is not a cost ≥ 0", qos.max_cost));
    }
    if let Some(e) = &probe.context_embedding {
        if e.values.len() != e.dimensions as usize || e.values.len() > MAX_EMBEDDING_DIM {
            return invalid(
                "probe.context_embedding",
                format!("{} values for {} dimensions (at most {MAX_EMBEDDING_DIM})", e.values.len(), e.dimensions),
            );
        }
    }
    Ok(())
}

/// The longest latency an offer may claim (a day).
pub const MAX_OFFER_LATENCY_MS: u64 = 86_400_000;
/// The largest cost an offer may claim per task.
pub const MAX_OFFER_COST: f64 = 1e6;

/// Checks the figures of an offer that signatures do not: a quality and a
/// trust in [0, 1], a cost ≥ 0 and a latency of at least 1 ms, all finite
/// and bounded, and a lifetime (`ttl_ms`) of at least [`T_OFFER`]; a figure
/// out of range would otherwise win every route. The error names the field
/// and the range, not the value.
pub fn check_offer(offer: &pb::CapabilityOffer) -> std::result::Result<(), String> {
    let Some(cap) = offer.capability else { return Err("offer.capability: missing".into()) };
    let unit = |v: f64| v.is_finite() && (0.0..=1.0).contains(&v);
    if !unit(cap.estimated_quality) {
        return Err("offer.capability.estimated_quality: outside [0, 1]".into());
    }
    if !unit(offer.trust_score) {
        return Err("offer.trust_score: outside [0, 1]".into());
    }
    if !(cap.cost_per_task.is_finite() && (0.0..=MAX_OFFER_COST).contains(&cap.cost_per_task)) {
        return Err(format!("offer.capability.cost_per_task: outside [0, {MAX_OFFER_COST}]"));
    }
    if !(1..=MAX_OFFER_LATENCY_MS).contains(&cap.estimated_latency_ms) {
        return Err(format!("offer.capability.estimated_latency_ms: outside [1, {MAX_OFFER_LATENCY_MS}]"));
    }
    // an offer that closes before a contract could reach it (or that states
    // no lifetime: proto3's 0) would win a route only to be re-asked
    if u128::from(offer.ttl_ms) < T_OFFER.as_millis() {
        return Err(format!("offer.ttl_ms: under the {} ms an offer must stay open", T_OFFER.as_millis()));
    }
    Ok(())
}

/// The largest task embedding a probe may carry.
pub const MAX_EMBEDDING_DIM: usize = 4096;

/// What a responder knows about itself when it answers a probe.
#[derive(Debug, Clone)]
pub struct OfferTerms {
    /// Its declared capabilities.
    pub capabilities: Vec<pb::Capability>,
    /// Its trust for the probed task type, as its own log shows it.
    pub trust_score: f64,
    /// Its Merkle log's root and recent proofs.
    pub evidence: pb::TrustEvidence,
    /// The context it needs (paper §6.2 step 2).
    pub requirement: pb::ContextRequirement,
    /// How long its offer stays open for a contract (`ttl_ms`).
    pub ttl_ms: u64,
}

/// E5 cosines between a task and an agent's specialization (both embedded
/// as queries) at or below this are outside the specialization (fit 0).
/// Set from e5-small: a payments specialization scored 0.88–0.92 against
/// payments tasks and 0.75–0.79 against a haiku or a recipe; another
/// encoder may need other values.
pub const FIT_FLOOR: f64 = 0.80;
/// At or above this the task is squarely within it (fit 1).
pub const FIT_CEIL: f64 = 0.92;
/// The share of its context budget an agent does without at fit 1.
pub const SPECIALIST_SAVING: f64 = 0.5;

/// How well a task fits an agent's specialization, in [0, 1]: their
/// cosine mapped linearly from [`FIT_FLOOR`] (0) to [`FIT_CEIL`] (1). 0
/// without either embedding, or when their dimensions differ (another
/// encoder's vectors say nothing here).
pub fn fit(specialization: Option<&pb::Embedding>, e_task: Option<&pb::Embedding>) -> f64 {
    let (Some(a), Some(b)) = (specialization, e_task) else { return 0.0 };
    if a.values.len() != b.values.len() || a.values.is_empty() {
        return 0.0;
    }
    let dot: f64 = a.values.iter().zip(&b.values).map(|(x, y)| x * y).sum();
    let norm = |v: &[f64]| v.iter().map(|x| x * x).sum::<f64>().sqrt();
    let cos = dot / (norm(&a.values) * norm(&b.values));
    if !cos.is_finite() {
        return 0.0;
    }
    ((cos - FIT_FLOOR) / (FIT_CEIL - FIT_FLOOR)).clamp(0.0, 1.0)
}

/// Paper §6.2 step 2: the context an agent asks for a probed task, from the
/// task's embedding and its own specialization. A specialist brings the
/// domain's background itself and asks only for the task's evidence: its
/// budget shrinks by [`SPECIALIST_SAVING`] × [`fit`] (the least relevant
/// chunks are the ones it does without, as SCD ranks them); a task outside
/// its specialization gets the whole budget. Never more than the task's
/// context holds when the probe says (`context_tokens`), never below 1.
pub fn context_requirement(
    budget_tokens: u32,
    specialization: Option<&pb::Embedding>,
    probe: &pb::CapabilityProbe,
) -> pb::ContextRequirement {
    let f = fit(specialization, probe.context_embedding.as_ref());
    let mut tokens = (f64::from(budget_tokens) * (1.0 - SPECIALIST_SAVING * f)).round() as u32;
    if probe.context_tokens > 0 {
        tokens = tokens.min(u32::try_from(probe.context_tokens).unwrap_or(u32::MAX));
    }
    pb::ContextRequirement { max_context_tokens: tokens.max(1), ..Default::default() }
}

/// The signed offer answering `probe`, or why this agent cannot meet it
/// (then it sends no offer: FAILED_PRECONDITION).
pub fn offer_for(identity: &Identity, probe: &pb::CapabilityProbe, terms: &OfferTerms) -> Result<pb::CapabilityOffer> {
    check_probe(probe)?;
    let qos = probe.qos.unwrap_or_default();
    let mut misses = Vec::new();
    let cap = terms.capabilities.iter().filter(|c| c.task_type == probe.task_type).find(|c| match meets(c, &qos) {
        Ok(()) => true,
        Err(why) => {
            misses.push(why);
            false
        }
    });
    let Some(cap) = cap else {
        let type_name = pb::TaskType::try_from(probe.task_type).map(|t| t.as_str_name()).unwrap_or("?");
        let reason = if misses.is_empty() { format!("no capability for {type_name}") } else { misses.join("; ") };
        return Err(Error::CannotMeet { reason });
    };
    // no refusal on min_trust here: the figure offered is the agent's own
    // record, which any requester can lower with free DIDs' ratings of jobs
    // it ran; the requester prunes on min_trust with its own book
    let mut offer = pb::CapabilityOffer {
        from: Some(identity.agent_id()),
        in_reply_to: probe.nonce,
        capability: Some(*cap),
        trust_score: terms.trust_score,
        trust_proof: terms.evidence.merkle_root.clone(),
        ttl_ms: terms.ttl_ms,
        context_requirements: Some(terms.requirement.clone()),
        trust_evidence: Some(terms.evidence.clone()),
        task_id: probe.task_id.clone(),
        ..Default::default()
    };
    identity.stamp_and_sign(&mut offer);
    Ok(offer)
}

/// A peer's plaintext gRPC endpoint (lazy: connecting happens on the first
/// call); an `https://` URL is an error here (see [`channel_with`]).
pub fn channel(url: &str) -> Result<Channel> {
    channel_with(url, None)
}

/// A peer's gRPC endpoint: `https://` over TLS with `tls` (the peers' CA,
/// and this agent's certificate for mTLS; the name checked is the URL's
/// host), `http://` in plaintext. An `https://` URL without a TLS
/// configuration is an error, never a silent plaintext connection.
pub fn channel_with(url: &str, tls: Option<&tonic::transport::ClientTlsConfig>) -> Result<Channel> {
    let invalid = |reason: String| Error::Invalid { field: "peer url".into(), reason };
    let mut endpoint = Endpoint::from_shared(url.to_string())
        .map_err(|e| invalid(format!("{url}: {e}")))?
        .connect_timeout(T_OFFER)
        .tcp_nodelay(true);
    if url.get(..8).is_some_and(|s| s.eq_ignore_ascii_case("https://")) {
        let tls = tls.ok_or_else(|| invalid(format!("{url}: https:// needs the peers' CA (--peer-ca)")))?;
        endpoint = endpoint.tls_config(tls.clone()).map_err(|e| invalid(format!("{url}: TLS: {e}")))?;
    }
    Ok(endpoint.connect_lazy())
}

/// An offer and where it came from.
#[derive(Debug, Clone)]
pub struct Offer {
    /// The offerer's AtpService URL.
    pub url: String,
    /// The verified offer.
    pub offer: pb::CapabilityOffer,
    /// When the probe it answers was sent, by this side's clock: the offer
    /// was made after that, so it stays open at least until `asked_at` +
    /// its `ttl_ms` ([`Offer::open_for`]).
    pub asked_at: Instant,
}

impl Offer {
    /// Whether the offer is still open `margin` from now by its own
    /// `ttl_ms`, counted from [`Offer::asked_at`] (never later than the
    /// offerer's own clock starts it); a `ttl_ms` of 0 is closed.
    pub fn open_for(&self, margin: Duration) -> bool {
        let ttl = Duration::from_millis(self.offer.ttl_ms);
        match (self.asked_at.checked_add(ttl), Instant::now().checked_add(margin)) {
            (Some(closes), Some(needed)) => needed < closes,
            // a lifetime past what the clock can hold is open
            (None, _) => true,
            (Some(_), None) => false,
        }
    }

    /// The offerer's DID.
    pub fn did(&self) -> &str {
        self.offer.from.as_ref().map_or("", |a| a.uuid.as_str())
    }

    /// The capability offered.
    pub fn capability(&self) -> pb::Capability {
        self.offer.capability.unwrap_or_default()
    }

    /// Whether its trust evidence holds: the root is the one offered, every
    /// inclusion proof verifies against it, and each proof is about the
    /// offerer and carries both signatures. An offer without evidence is a
    /// cold start (it holds). Routing counts evidence only from offers for
    /// which this is true.
    pub fn evidence_holds(&self, verifier: &Verifier) -> bool {
        let Some(ev) = &self.offer.trust_evidence else { return true };
        if ev.merkle_root != self.offer.trust_proof || !crate::merkle::verify_evidence(ev) {
            return false;
        }
        ev.proofs.iter().zip(&ev.inclusion).all(|(p, inc)| {
            verifier.check_proof(p).is_ok()
                && p.subject.as_ref().map(|a| a.uuid.as_str()) == Some(self.did())
                && crate::merkle::verify_inclusion(inc, &ev.merkle_root)
                && inc.leaf_hash == crate::merkle::leaf_hash(&prost::Message::encode_to_vec(p))
        })
    }
}

/// One round of probing: the offers that arrived in time and verified, and
/// the peers that failed (unreachable, timed out, refused or forged).
#[derive(Debug, Default)]
pub struct Round {
    /// Verified offers.
    pub offers: Vec<Offer>,
    /// (url, why) for every peer that did not offer.
    pub failures: Vec<(String, PeerFailure)>,
}

/// Why a peer gave no offer.
#[derive(Debug, Clone, PartialEq)]
pub enum PeerFailure {
    /// Unreachable or no answer within T_offer: counts against its circuit.
    Down(String),
    /// It answered that it cannot meet the probe (not a fault).
    Declined(String),
    /// Its offer failed verification (signature, nonce, capability).
    Invalid(String),
}

/// Sends `probe` (from this identity, signed here) to every peer at once and collects the
/// offers that arrive within [`T_OFFER`] and verify: signature, sender,
/// `in_reply_to`, task type and QoS.
pub async fn probe_round(
    identity: &Identity,
    verifier: &Verifier,
    peers: &[(String, Channel)],
    probe: &pb::CapabilityProbe,
) -> Round {
    let calls = peers.iter().map(|(url, ch)| {
        let mut probe = pb::CapabilityProbe { from: Some(identity.agent_id()), ..probe.clone() };
        identity.stamp_and_sign(&mut probe);
        let mut client = pb::atp_service_client::AtpServiceClient::new(ch.clone());
        async move {
            let nonce = probe.nonce;
            let asked_at = Instant::now();
            let reply = tokio::time::timeout(T_OFFER, client.probe(probe)).await;
            (url.clone(), nonce, asked_at, reply)
        }
    });
    let qos = probe.qos.unwrap_or_default();
    let mut round = Round::default();
    for (url, nonce, asked_at, reply) in join_all(calls).await {
        let offer = match reply {
            Err(_) => {
                round.failures.push((url, PeerFailure::Down(format!("no offer within {} ms", T_OFFER.as_millis()))));
                continue;
            }
            Ok(Err(status)) if status.code() == tonic::Code::FailedPrecondition => {
                round.failures.push((url, PeerFailure::Declined(status.message().to_string())));
                continue;
            }
            Ok(Err(status)) => {
                round.failures.push((url, PeerFailure::Down(format!("{:?}: {}", status.code(), status.message()))));
                continue;
            }
            Ok(Ok(r)) => r.into_inner(),
        };
        let check = verifier.verify(&offer).map_err(|e| e.to_string()).and_then(|()| {
            check_offer(&offer)?;
            if offer.in_reply_to != nonce {
                return Err(format!("in_reply_to {} is not the probe's nonce {nonce}", offer.in_reply_to));
            }
            let cap = offer.capability.unwrap_or_default();
            if cap.task_type != probe.task_type {
                return Err(format!("offers task type {} for a probe of {}", cap.task_type, probe.task_type));
            }
            meets(&cap, &qos)
        });
        match check {
            Ok(()) => round.offers.push(Offer { url, offer, asked_at }),
            Err(why) => round.failures.push((url, PeerFailure::Invalid(why))),
        }
    }
    round
}

/// The outcome of [`negotiate`].
#[derive(Debug, Default)]
pub struct Negotiation {
    /// The verified offers of the successful round.
    pub offers: Vec<Offer>,
    /// Probe rounds sent (1 = no retry).
    pub rounds: u32,
    /// The constraints the offers met (relaxed after retries).
    pub qos: pb::QoSConstraints,
    /// Every peer failure seen, per round.
    pub failures: Vec<(String, PeerFailure)>,
}

/// Probes `peers` and, while no acceptable offer arrives, retries with the
/// constraints relaxed 10 % per try, up to [`MAX_RETRIES`] times; then
/// [`Error::Escalated`] for the originator, with every failure.
pub async fn negotiate(
    identity: &Identity,
    verifier: &Verifier,
    peers: &[(String, Channel)],
    probe: &pb::CapabilityProbe,
) -> Result<Negotiation> {
    negotiate_from(identity, verifier, peers, probe, 0).await
}

/// [`negotiate`] starting at retry `first` (the constraints already relaxed
/// `first` times by earlier rounds): the total never exceeds [`MAX_RETRIES`].
pub async fn negotiate_from(
    identity: &Identity,
    verifier: &Verifier,
    peers: &[(String, Channel)],
    probe: &pb::CapabilityProbe,
    first: u32,
) -> Result<Negotiation> {
    let base = probe.qos.unwrap_or_default();
    let mut out = Negotiation::default();
    for tries in first..=MAX_RETRIES {
        let qos = relax(&base, tries);
        let probe = pb::CapabilityProbe { qos: Some(qos), ..probe.clone() };
        let round = probe_round(identity, verifier, peers, &probe).await;
        out.rounds = tries + 1;
        out.qos = qos;
        out.failures.extend(round.failures);
        if !round.offers.is_empty() {
            out.offers = round.offers;
            return Ok(out);
        }
        tracing::debug!(round = tries + 1, "no acceptable offer; relaxing constraints");
    }
    let failures = out.failures.iter().map(|(url, why)| format!("{url}: {why:?}")).collect::<Vec<_>>().join("; ");
    Err(Error::Escalated { rounds: out.rounds, failures })
}

/// The signed contract accepting `offer` for `task_id`.
pub fn contract_for(
    identity: &Identity,
    offer: &Offer,
    task_id: &str,
    qos: pb::QoSConstraints,
    reply_to: &str,
) -> pb::ContractAccept {
    let cap = offer.capability();
    let mut contract = pb::ContractAccept {
        from: Some(identity.agent_id()),
        to: offer.offer.from.clone(),
        agreed_qos: Some(qos),
        context_plan: "scd: minimal sufficient context; adaptive requests below confidence 0.7".into(),
        contract_id: format!("ct-{:032x}", rand::random::<u128>()),
        expires_ms: CONTRACT_TTL_MS,
        context_requirement: offer.offer.context_requirements.clone(),
        task_id: task_id.to_string(),
        task_type: cap.task_type,
        offer_nonce: offer.offer.nonce,
        reply_to: reply_to.to_string(),
        ..Default::default()
    };
    identity.stamp_and_sign(&mut contract);
    contract
}

/// Sends `contract` and verifies the signed acknowledgement.
pub async fn accept(verifier: &Verifier, channel: Channel, contract: pb::ContractAccept) -> Result<pb::ContractAck> {
    let to = contract.to.as_ref().map(|a| a.uuid.clone()).unwrap_or_default();
    let mut client = pb::atp_service_client::AtpServiceClient::new(channel);
    let ack = tokio::time::timeout(T_OFFER * 4, client.accept_contract(contract.clone()))
        .await
        .map_err(|_| Error::Timeout { what: format!("contract ack from {to}"), ms: (T_OFFER * 4).as_millis() as u64 })?
        .map_err(|s| Error::Peer {
            did: to.clone(),
            rpc: "AcceptContract",
            status: s.code(),
            message: s.message().into(),
        })?
        .into_inner();
    verifier.verify(&ack).map_err(|e| Error::Peer {
        did: to.clone(),
        rpc: "AcceptContract",
        status: tonic::Code::Unauthenticated,
        message: format!("ack: {e}"),
    })?;
    if ack.from.as_ref().map(|a| a.uuid.as_str()) != Some(to.as_str()) || ack.contract_id != contract.contract_id {
        return Err(Error::Peer {
            did: to,
            rpc: "AcceptContract",
            status: tonic::Code::InvalidArgument,
            message: "ack is for another contract or from another agent".into(),
        });
    }
    if !ack.accepted {
        return Err(Error::CannotMeet { reason: format!("{to} refused the contract: {}", ack.reason) });
    }
    Ok(ack)
}

/// A contract violation seen when a result comes back: what the negative
/// interaction proof's note says, or `None` when the contract was kept.
pub fn violation(agreed: &pb::QoSConstraints, latency_ms: u64, cost: f64, quality: f64) -> Option<String> {
    let mut v = Vec::new();
    if agreed.max_latency_ms > 0 && latency_ms > agreed.max_latency_ms {
        v.push(format!("latency {latency_ms} ms > agreed {} ms", agreed.max_latency_ms));
    }
    if agreed.max_cost > 0.0 && cost > agreed.max_cost * (1.0 + 1e-9) {
        v.push(format!("cost {cost:.4} > agreed {:.4}", agreed.max_cost));
    }
    if quality < agreed.min_quality {
        v.push(format!("quality {quality:.3} < agreed {:.3}", agreed.min_quality));
    }
    (!v.is_empty()).then(|| format!("contract violation: {}", v.join(", ")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::{DidResolver, MemoryNonceLog};

    fn test_verifier() -> Verifier {
        Verifier::new(std::sync::Arc::new(DidResolver::new()), std::sync::Arc::new(MemoryNonceLog::default()))
    }

    fn cap(q: f64, lat: u64, cost: f64) -> pb::Capability {
        pb::Capability {
            task_type: pb::TaskType::CodeGeneration as i32,
            estimated_quality: q,
            estimated_latency_ms: lat,
            cost_per_task: cost,
        }
    }

    fn qos() -> pb::QoSConstraints {
        pb::QoSConstraints { min_quality: 0.9, max_latency_ms: 1000, max_cost: 0.05, min_trust: 0.5 }
    }

    #[test]
    fn relaxing_compounds_ten_percent_per_try() {
        let r = relax(&qos(), 3);
        assert!((r.min_quality - 0.9 * 0.729).abs() < 1e-12, "{r:?}");
        assert!((r.min_trust - 0.5 * 0.729).abs() < 1e-12);
        assert_eq!(r.max_latency_ms, 1331);
        assert!((r.max_cost - 0.05 * 1.331).abs() < 1e-12);
        assert_eq!(relax(&qos(), 0), qos());
        let unbounded = pb::QoSConstraints { max_latency_ms: 0, max_cost: 0.0, ..qos() };
        assert_eq!(relax(&unbounded, 2).max_latency_ms, 0);
    }

    #[test]
    fn meets_names_the_first_miss() {
        assert_eq!(meets(&cap(0.95, 500, 0.01), &qos()), Ok(()));
        assert_eq!(meets(&cap(0.85, 500, 0.01), &qos()).unwrap_err(), "quality 0.850 < min_quality 0.900");
        assert_eq!(meets(&cap(0.95, 1500, 0.01), &qos()).unwrap_err(), "latency 1500 ms > max_latency_ms 1000");
        assert_eq!(meets(&cap(0.95, 500, 0.10), &qos()).unwrap_err(), "cost 0.1000 > max_cost 0.0500");
        let unbounded = pb::QoSConstraints { max_latency_ms: 0, max_cost: 0.0, ..qos() };
        assert_eq!(meets(&cap(0.95, 1_000_000, 9.0), &unbounded), Ok(()));
    }

    #[test]
    fn violations_are_named() {
        assert_eq!(violation(&qos(), 900, 0.05, 0.95), None);
        let v = violation(&qos(), 1200, 0.06, 0.8).unwrap();
        assert_eq!(v, "contract violation: latency 1200 ms > agreed 1000 ms, cost 0.0600 > agreed 0.0500, quality 0.800 < agreed 0.900");
    }

    #[test]
    fn offers_out_of_range_are_refused_naming_the_field() {
        let good = pb::CapabilityOffer {
            capability: Some(cap(0.9, 500, 0.02)),
            trust_score: 0.5,
            ttl_ms: OFFER_TTL_MS,
            ..Default::default()
        };
        check_offer(&good).unwrap();
        check_offer(&pb::CapabilityOffer { ttl_ms: 500, ..good.clone() }).unwrap();
        let with = |c: pb::Capability, trust: f64| pb::CapabilityOffer {
            capability: Some(c),
            trust_score: trust,
            ttl_ms: OFFER_TTL_MS,
            ..Default::default()
        };
        for (offer, field) in [
            (with(cap(1.5, 500, 0.02), 0.5), "estimated_quality"),
            (with(cap(f64::NAN, 500, 0.02), 0.5), "estimated_quality"),
            (with(cap(0.9, 500, -1.0), 0.5), "cost_per_task"),
            (with(cap(0.9, 500, f64::INFINITY), 0.5), "cost_per_task"),
            (with(cap(0.9, 0, 0.02), 0.5), "estimated_latency_ms"),
            (with(cap(0.9, u64::MAX, 0.02), 0.5), "estimated_latency_ms"),
            (with(cap(0.9, 500, 0.02), 2.0), "trust_score"),
            (pb::CapabilityOffer { ttl_ms: 0, ..good.clone() }, "ttl_ms: under the 500 ms"),
            (pb::CapabilityOffer { ttl_ms: 499, ..good.clone() }, "ttl_ms: under the 500 ms"),
            (pb::CapabilityOffer::default(), "capability: missing"),
        ] {
            let e = check_offer(&offer).unwrap_err();
            assert!(e.starts_with("offer.") && e.contains(field), "{field}: {e}");
        }
    }

    #[test]
    fn bad_probes_name_the_field() {
        let ok = pb::CapabilityProbe { task_type: 1, qos: Some(qos()), ..Default::default() };
        assert!(check_probe(&ok).is_ok());
        let cases = [
            (pb::CapabilityProbe { task_type: 0, ..ok.clone() }, "probe.task_type"),
            (pb::CapabilityProbe { task_type: 9, ..ok.clone() }, "probe.task_type"),
            (
                pb::CapabilityProbe { qos: Some(pb::QoSConstraints { min_quality: 1.5, ..qos() }), ..ok.clone() },
                "probe.qos.min_quality",
            ),
            (
                pb::CapabilityProbe { qos: Some(pb::QoSConstraints { max_cost: f64::NAN, ..qos() }), ..ok.clone() },
                "probe.qos.max_cost",
            ),
            (
                pb::CapabilityProbe {
                    context_embedding: Some(pb::Embedding { dimensions: 3, values: vec![0.0; 2] }),
                    ..ok.clone()
                },
                "probe.context_embedding",
            ),
        ];
        for (probe, field) in cases {
            let err = check_probe(&probe).unwrap_err().to_string();
            assert!(err.starts_with(field), "{err}");
        }
    }

    #[test]
    fn the_requirement_follows_the_tasks_fit_with_the_specialization() {
        let e = |v: &[f64]| pb::Embedding { dimensions: v.len() as u32, values: v.to_vec() };
        // cos = 0.92 → fit 1; cos = 0.80 → fit 0; cos = 0.86 → fit 0.5
        let spec = e(&[1.0, 0.0]);
        let at = |cos: f64| e(&[cos, (1.0 - cos * cos).sqrt()]);
        let probe = |emb: Option<pb::Embedding>, tokens: u64| pb::CapabilityProbe {
            context_embedding: emb,
            context_tokens: tokens,
            ..Default::default()
        };
        let budget = |p: &pb::CapabilityProbe| context_requirement(1000, Some(&spec), p).max_context_tokens;
        assert_eq!(budget(&probe(Some(at(0.95)), 0)), 500, "a specialist's task: half the budget");
        assert_eq!(budget(&probe(Some(at(0.92)), 0)), 500);
        assert_eq!(budget(&probe(Some(at(0.86)), 0)), 750);
        assert_eq!(budget(&probe(Some(at(0.80)), 0)), 1000, "outside it: the whole budget");
        assert_eq!(budget(&probe(Some(at(0.10)), 0)), 1000);
        // no e_task, another encoder's dimensions, a zero vector: no adaptation
        assert_eq!(budget(&probe(None, 0)), 1000);
        assert_eq!(budget(&probe(Some(e(&[0.9, 0.1, 0.0])), 0)), 1000);
        assert_eq!(budget(&probe(Some(e(&[0.0, 0.0])), 0)), 1000);
        assert_eq!(context_requirement(1000, None, &probe(Some(at(0.95)), 0)).max_context_tokens, 1000);
        // never more than the task's context holds, never 0
        assert_eq!(budget(&probe(Some(at(0.10)), 300)), 300);
        assert_eq!(context_requirement(1, Some(&spec), &probe(Some(at(0.95)), 0)).max_context_tokens, 1);
    }

    fn terms() -> OfferTerms {
        OfferTerms {
            capabilities: vec![cap(0.95, 500, 0.02)],
            trust_score: 0.8,
            evidence: pb::TrustEvidence { merkle_root: vec![7; 32], log_size: 4, ..Default::default() },
            requirement: pb::ContextRequirement { max_context_tokens: 512, ..Default::default() },
            ttl_ms: OFFER_TTL_MS,
        }
    }

    #[test]
    fn an_offer_answers_the_probe_signed() {
        let me = Identity::generate();
        let probe = pb::CapabilityProbe {
            task_type: 1,
            qos: Some(qos()),
            nonce: 42,
            task_id: "t1".into(),
            ..Default::default()
        };
        let offer = offer_for(&me, &probe, &terms()).unwrap();
        assert_eq!(offer.in_reply_to, 42);
        assert_eq!(offer.from.as_ref().unwrap().uuid, me.did());
        assert_eq!(offer.trust_proof, vec![7; 32]);
        assert_eq!(offer.task_id, "t1");
        assert!(!offer.signature.is_empty() && offer.nonce != 0);
        let verifier = test_verifier();
        verifier.verify(&offer).unwrap();
    }

    #[test]
    fn no_offer_when_the_probe_cannot_be_met() {
        let me = Identity::generate();
        let probe = pb::CapabilityProbe { task_type: 2, qos: Some(qos()), ..Default::default() };
        assert_eq!(
            offer_for(&me, &probe, &terms()).unwrap_err().to_string(),
            "cannot meet the probe: no capability for TASK_TYPE_ANALYSIS"
        );
        let probe = pb::CapabilityProbe {
            task_type: 1,
            qos: Some(pb::QoSConstraints { min_quality: 0.99, ..qos() }),
            ..Default::default()
        };
        assert!(offer_for(&me, &probe, &terms())
            .unwrap_err()
            .to_string()
            .contains("quality 0.950 < min_quality 0.990"));
        // a min_trust above its own record is the requester's to apply, not a refusal
        let probe = pb::CapabilityProbe {
            task_type: 1,
            qos: Some(pb::QoSConstraints { min_trust: 0.9, ..qos() }),
            ..Default::default()
        };
        assert_eq!(offer_for(&me, &probe, &terms()).unwrap().trust_score, 0.8);
    }

    /// A real agent on loopback offering `cap` (its store in `dir`).
    async fn agent(dir: &std::path::Path, cap: pb::Capability) -> String {
        use crate::agent::{AgentConfig, Node};
        use crate::store::{Ledger, Store};
        let identity = Identity::generate();
        let store = std::sync::Arc::new(Store::open(dir).unwrap());
        let resolver: std::sync::Arc<dyn crate::identity::Resolver> = std::sync::Arc::new(DidResolver::new());
        let ledger = Ledger::open(store.clone(), identity.did(), Default::default(), resolver.clone()).unwrap();
        let verifier = Verifier::new(resolver, store);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let node = Node::new(
            identity,
            verifier,
            ledger,
            AgentConfig::new(vec![cap], url.clone(), "http://127.0.0.1:1".into()),
        );
        tokio::spawn(crate::agent::serve(node, listener, std::future::pending()));
        url
    }

    #[tokio::test]
    async fn a_peer_advertising_impossible_figures_makes_no_offer() {
        // a signed, well-formed offer whose figures would win every route
        let me = Identity::generate();
        let probe = pb::CapabilityProbe { task_type: 1, qos: Some(qos()), ..Default::default() };
        for hostile in [cap(1.5, 500, 0.02), cap(0.95, 500, -5.0), cap(0.95, 0, 0.02)] {
            let dir = tempfile::tempdir().unwrap();
            let url = agent(dir.path(), hostile).await;
            let round = probe_round(&me, &test_verifier(), &[(url.clone(), channel(&url).unwrap())], &probe).await;
            assert!(round.offers.is_empty(), "{hostile:?} was offered");
            assert!(
                matches!(&round.failures[..], [(_, PeerFailure::Invalid(why))] if why.starts_with("offer.capability.")),
                "{:?}",
                round.failures
            );
        }
    }

    #[tokio::test]
    async fn a_retry_relaxes_the_constraints_until_an_offer_fits() {
        let dir = tempfile::tempdir().unwrap();
        // min_quality 0.9 · 0.9^k first reaches 0.75 at k = 2 (0.729): the third round
        let url = agent(dir.path(), cap(0.75, 500, 0.02)).await;
        let me = Identity::generate();
        let peers = vec![(url.clone(), channel(&url).unwrap())];
        let probe = pb::CapabilityProbe { task_type: 1, qos: Some(qos()), ..Default::default() };
        let n = negotiate(&me, &test_verifier(), &peers, &probe).await.unwrap();
        assert_eq!(n.rounds, 3, "{n:?}");
        assert!((n.qos.min_quality - 0.9 * 0.81).abs() < 1e-12);
        assert_eq!(n.offers.len(), 1);
        assert_eq!(n.failures.len(), 2);
        assert!(n
            .failures
            .iter()
            .all(|(_, f)| matches!(f, PeerFailure::Declined(why) if why.contains("quality 0.750 < min_quality"))));
        // past three retries (0.9 · 0.729 = 0.656 > 0.6): escalation to the originator
        let dir2 = tempfile::tempdir().unwrap();
        let url = agent(dir2.path(), cap(0.6, 500, 0.02)).await;
        let peers = vec![(url.clone(), channel(&url).unwrap())];
        let err = negotiate(&me, &test_verifier(), &peers, &probe).await.unwrap_err();
        assert!(matches!(err, Error::Escalated { rounds: 4, .. }), "{err}");
    }

    #[tokio::test]
    async fn a_silent_peer_is_down_after_t_offer() {
        // accepts TCP and never answers: the probe times out at T_offer
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((sock, _)) = listener.accept().await {
                held.push(sock);
            }
        });
        let me = Identity::generate();
        let peers = vec![(url.clone(), channel(&url).unwrap())];
        let probe = pb::CapabilityProbe { task_type: 1, qos: Some(qos()), ..Default::default() };
        let round = probe_round(&me, &test_verifier(), &peers, &probe).await;
        assert!(round.offers.is_empty());
        assert_eq!(round.failures, vec![(url, PeerFailure::Down("no offer within 500 ms".into()))]);
    }

    #[tokio::test]
    async fn an_unreachable_peer_is_down_within_t_offer_and_escalates_after_three_retries() {
        let me = Identity::generate();
        let verifier = test_verifier();
        // a port nobody listens on
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let url = format!("http://127.0.0.1:{port}");
        let peers = vec![(url.clone(), channel(&url).unwrap())];
        let probe = pb::CapabilityProbe { task_type: 1, qos: Some(qos()), ..Default::default() };
        let err = negotiate(&me, &verifier, &peers, &probe).await.unwrap_err();
        match err {
            Error::Escalated { rounds, failures } => {
                assert_eq!(rounds, MAX_RETRIES + 1);
                assert_eq!(failures.matches(&url).count(), 4, "{failures}");
            }
            other => panic!("{other}"),
        }
    }
}
