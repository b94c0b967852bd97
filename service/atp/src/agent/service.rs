//! The tonic service of `atp.v1.AtpService` over a [`Node`](super::Node).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tokio_stream::Stream;
use tonic::{Request, Response, Status};

use super::node::is_final;
use super::node::job_key;
use super::node::sender;
use super::node::Contract;
use super::node::Job;
use super::node::Node;
use super::node::MAX_CONTRACTS;
use super::node::MAX_OPEN_OFFERS;
use super::reading::check_context;
use super::reading::check_reply_to;
use crate::bounded::bounded_insert;
use crate::handshake::{self};
use crate::identity::SignMessages as _;
pub use crate::work::WorkOrder;
use crate::{pb, Result};

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
            Some((_, at)) if at.elapsed() > Duration::from_millis(node.config.offer_ttl_ms) => {
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
