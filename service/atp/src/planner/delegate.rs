//! One delegation: contract, context transfer, submit, and the results
//! followed to the end.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_stream::StreamExt;
use tonic::transport::Channel;

use super::driver::Planner;
use super::driver::CALL_TIMEOUT;
use super::driver::RESULT_SILENCE;
use super::failure::Failure;
use super::failure::FailureKind;
use super::job::Job;
use super::job::Outcome;
use super::prove::Seen;
use crate::context::Transfer;
use crate::handshake::{self, Offer};
use crate::identity::SignMessages as _;
use crate::requester::Delegation;
use crate::requester::{short, Event};
use crate::work::WorkReport;
use crate::{pb, Error, Result};

impl Planner {
    /// Contract, transfer, submit and follow one agent; `Err` = it failed.
    pub(super) async fn delegate(
        &self,
        job: &Job,
        offer: &Offer,
        qos: pb::QoSConstraints,
        transfer: &mut Option<Arc<Transfer>>,
    ) -> Result<Outcome, Failure> {
        let did = offer.did().to_string();
        let (channel, contract) = self.contract(job, offer, qos).await?;
        let (t, sent) = self.hand_over(job, offer, &did, transfer).await?;
        let resume_from = self.node.ledger.lock().unwrap().store().checkpoint(&job.task_id).map_err(Failure::local)?;
        // the steps this side has seen done: the resumed checkpoint's, then
        // each verified checkpoint of this worker's (its own word on its
        // quality takes no part in the rating)
        let steps_seen = resume_from.as_ref().map_or(0, |cp| cp.step_number);
        let context = resumed_context(&t.diff, &sent, resume_from.as_ref());
        let task = pb::TaskSubmit {
            from: Some(self.node.identity.agent_id()),
            to: offer.offer.from.clone(),
            task_id: job.task_id.clone(),
            task_type: job.task_type as i32,
            payload: serde_json::to_vec(&job.order).unwrap_or_default(),
            context: Some(context.clone()),
            contract_id: contract.contract_id.clone(),
            resume_from,
            ..Default::default()
        };
        let (stream, submitted) = self.submit(job, &did, task, channel).await?;
        let handed = Handed { did, submitted, steps_seen, context };
        self.follow(job, offer, qos, stream, handed).await
    }

    /// Layer 2: the contract with the offer's agent, accepted by it.
    async fn contract(
        &self,
        job: &Job,
        offer: &Offer,
        qos: pb::QoSConstraints,
    ) -> Result<(Channel, pb::ContractAccept), Failure> {
        let node = &self.node;
        let channel = node.channel(&offer.url).map_err(Failure::agent)?;
        let contract = handshake::contract_for(&node.identity, offer, &job.task_id, qos, &node.config.public_url);
        handshake::accept(&node.verifier, channel.clone(), contract.clone()).await.map_err(|e| match e {
            // a declined contract (offer expired, QoS no longer met) is a refusal
            Error::CannotMeet { .. } => Failure { why: e.to_string(), kind: FailureKind::Refused },
            e => Failure::agent(e),
        })?;
        self.state().emit(Event::Contracted {
            task: job.task_id.clone(),
            agent: short(offer.did()),
            contract: contract.contract_id.clone(),
        });
        Ok((channel, contract))
    }

    /// Layer 3: the minimal sufficient context (computed once per task),
    /// handed to `did`: recorded in its delegation, the hop ledger and the
    /// audit trail. Returns it with the chunks the task was sent so far.
    async fn hand_over(
        &self,
        job: &Job,
        offer: &Offer,
        did: &str,
        transfer: &mut Option<Arc<Transfer>>,
    ) -> Result<(Arc<Transfer>, Vec<pb::ContextChunk>), Failure> {
        let st = self.state();
        let node = &self.node;
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
            let d = Delegation::handed_to(did, t.clone(), delegations.remove(&job.task_id));
            let sent = d.sent.clone();
            delegations.insert(job.task_id.clone(), d);
            sent
        };
        st.hops.lock().unwrap().record_transfer(&job.task_id, node.did(), did, &t);
        if let Some(log) = node.audit_log() {
            let budget = offer.offer.context_requirements.as_ref().map_or(0, |r| r.max_context_tokens);
            let rec = t.audit_record(node.did(), did, &job.task, budget);
            log.append_async(vec![rec]).await.map_err(|e| Failure::local(e.into()))?;
        }
        st.emit(Event::ContextSent {
            task: job.task_id.clone(),
            agent: short(did),
            full_tokens: t.full_tokens,
            sent_tokens: t.sent_tokens,
            chunks: t.diff.chunks.len(),
            withheld: t.diff.withheld_fields.clone(),
        });
        Ok((t, sent))
    }

    /// Signs and submits `task` to `did`, then opens its result stream;
    /// returns the stream and when the task was handed over.
    async fn submit(
        &self,
        job: &Job,
        did: &str,
        mut task: pb::TaskSubmit,
        channel: Channel,
    ) -> Result<(tonic::Streaming<pb::TaskResult>, Instant), Failure> {
        let st = self.state();
        let node = &self.node;
        node.identity.stamp_and_sign(&mut task);
        let mut client = pb::atp_service_client::AtpServiceClient::new(channel);
        // heartbeats it sent for earlier tasks are stale: T_fail counts from
        // the hand-over, so a worker that freezes before its first heartbeat
        // for this task fails too (a frozen process keeps its stream open)
        st.health.lock().unwrap().expect(did, st.now_ms());
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
        let stream = tokio::time::timeout(CALL_TIMEOUT, client.stream_results(query))
            .await
            .map_err(|_| answer("StreamResults"))?
            .map_err(|s| Failure::status("StreamResults", &s))?
            .into_inner();
        Ok((stream, submitted))
    }

    /// Layer 5: follows the result stream to the task's final result,
    /// keeping the worker's checkpoints; a silent stream, a broken one or
    /// missed heartbeats are the worker's failure.
    async fn follow(
        &self,
        job: &Job,
        offer: &Offer,
        qos: pb::QoSConstraints,
        mut stream: tonic::Streaming<pb::TaskResult>,
        mut handed: Handed,
    ) -> Result<Outcome, Failure> {
        let st = self.state();
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
                    if st.health.lock().unwrap().failed(st.now_ms()).contains(&handed.did) {
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
            if let Err(e) = self.node.verifier.verify(&result) {
                return Err(Failure { why: format!("result: {e}"), kind: FailureKind::Agent });
            }
            match pb::TaskStatus::try_from(result.status) {
                Ok(pb::TaskStatus::Running) => {
                    if let Some(cp) = &result.checkpoint {
                        self.keep_checkpoint(job, &handed.did, cp, &mut handed.steps_seen)?;
                    }
                }
                Ok(pb::TaskStatus::Completed) => return Ok(self.completed(job, offer, qos, &result, handed).await),
                _ => return Err(Failure { why: result.error.clone(), kind: FailureKind::Agent }),
            }
        }
    }

    /// Keeps a running task's checkpoint when it is the worker's own, for
    /// this task, and holds no chunk text (a checkpoint names chunks; the
    /// next worker gets their text from here, not from a predecessor).
    fn keep_checkpoint(
        &self,
        job: &Job,
        did: &str,
        cp: &pb::TaskCheckpoint,
        steps_seen: &mut u32,
    ) -> Result<(), Failure> {
        let node = &self.node;
        let by_worker = cp.agent.as_ref().map(|a| a.uuid.as_str()) == Some(did);
        if !(by_worker && node.verifier.check_signature(cp).is_ok() && cp.task_id == job.task_id) {
            return Ok(());
        }
        if cp.context.as_ref().is_some_and(|c| c.chunks.iter().any(|k| !k.data.is_empty())) {
            tracing::warn!(agent = %did, "a checkpoint carried chunk text; not kept");
            return Ok(());
        }
        node.ledger.lock().unwrap().store().put_checkpoint(cp).map_err(Failure::local)?;
        // a step counts only when it is the next one, within the
        // order: one checkpoint claiming the last step is not all
        if cp.step_number == *steps_seen + 1 && cp.step_number <= job.order.steps {
            *steps_seen = cp.step_number;
        }
        self.state().emit(Event::Checkpoint { task: job.task_id.clone(), agent: short(did), step: cp.step_number });
        Ok(())
    }

    /// A completed task: rated and proven (layer 1), its agent's circuit
    /// told of the success.
    async fn completed(
        &self,
        job: &Job,
        offer: &Offer,
        qos: pb::QoSConstraints,
        result: &pb::TaskResult,
        handed: Handed,
    ) -> Outcome {
        let st = self.state();
        let latency_ms = handed.submitted.elapsed().as_millis() as u64;
        let report: WorkReport = serde_json::from_slice(&result.payload).unwrap_or_default();
        let seen = Seen { latency_ms, steps: handed.steps_seen, sent_up_front: &handed.context.chunks };
        let quality = self.prove(job, offer, &qos, result, &report, seen).await;
        st.breaker_success(&offer.url, &handed.did);
        st.emit(Event::Completed {
            task: job.task_id.clone(),
            agent: short(&handed.did),
            latency_ms,
            quality,
            resumed_after: report.resumed_after,
        });
        Outcome::Completed {
            agent: handed.did,
            report,
            failovers: 0,
            latency_ms,
            quality,
            cost: result.actual_cost,
            stages: Vec::new(),
        }
    }
}

/// What a delegation handed its worker, for following it.
struct Handed {
    did: String,
    submitted: Instant,
    /// The highest step a verified checkpoint (or the resumed one) showed.
    steps_seen: u32,
    /// The context the task carried.
    context: pb::ContextDiff,
}

/// The context a task carries: the transfer's, plus, for a resumed worker,
/// the chunks its predecessor's checkpoint names that were asked for (the
/// checkpoint holds their ids, not copies).
fn resumed_context(
    diff: &pb::ContextDiff,
    sent: &[pb::ContextChunk],
    resume_from: Option<&pb::TaskCheckpoint>,
) -> pb::ContextDiff {
    let mut context = diff.clone();
    if let Some(named) = resume_from.and_then(|cp| cp.context.as_ref()) {
        let named: HashSet<&str> = named.chunks.iter().map(|c| c.chunk_id.as_str()).collect();
        let mut have: HashSet<String> = context.chunks.iter().map(|c| c.chunk_id.clone()).collect();
        for c in sent.iter().filter(|c| named.contains(c.chunk_id.as_str())) {
            if have.insert(c.chunk_id.clone()) {
                context.chunks.push(c.clone());
            }
        }
    }
    context
}
