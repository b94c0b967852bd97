//! Layer 1 after a delegation: the interaction proof, countersigned by
//! the worker.

use super::driver::Planner;
use super::driver::CALL_TIMEOUT;
use super::driver::PROOF_ATTEMPTS;
use super::driver::PROOF_BACKOFF;
use super::job::Job;
use crate::handshake::{self, Offer};
use crate::identity::now_s;
use crate::identity::SignMessages as _;
use crate::requester::{short, Event};
use crate::routing::{self};
use crate::work::{self, WorkReport};
use crate::{merkle, pb, Result};

impl Planner {
    /// Layer 1: the interaction proof of a finished delegation, with the
    /// quality this side measured ([`work::assess`]; 0 on a contract
    /// violation), countersigned by the worker and appended to this agent's
    /// log. A worker that refuses to countersign, or whose answer does not
    /// verify, is still rated: the proof is logged with quality 0 and the
    /// refusal noted as a violation, signed by this side alone. Returns the
    /// quality recorded.
    pub(super) async fn prove(
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
pub(super) struct Seen<'a> {
    pub(super) latency_ms: u64,
    /// The highest step a verified checkpoint (or the resumed one) showed.
    pub(super) steps: u32,
    /// The chunks sent with the task (the adaptive ones are in its delegation).
    pub(super) sent_up_front: &'a [pb::ContextChunk],
}
