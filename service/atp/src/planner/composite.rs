//! Composite routes (§7.4): a pattern's best route run stage by stage.

use std::sync::Arc;

use super::driver::agreed;
use super::driver::member_probe;
use super::driver::Planner;
use super::failure::Failure;
use super::failure::FailureKind;
use super::failure::StageFailure;
use super::job::answer_of;
use super::job::majority_answer;
use super::job::Job;
use super::job::Outcome;
use super::job::PatternRun;
use super::job::StageRun;
use crate::context::Transfer;
use crate::handshake::{self, Offer};
use crate::requester::constraints;
use crate::requester::short;
use crate::routing::{self, Pattern, RoutingParams};
use crate::{pb, Error, Result};

/// A route's offers and the probe they answered (a fresh offer answers it
/// again).
pub(super) struct Offered<'a> {
    pub(super) offers: &'a [Offer],
    pub(super) probe: &'a pb::CapabilityProbe,
}

impl Planner {
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
        let probe = pb::CapabilityProbe { qos: Some(n.qos), ..probe };
        let offered = Offered { offers: &offers, probe: &probe };
        let run = self.execute(job, &job.task_id, &route, &offered, task_qos, &mut transfer).await;
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
    /// the id `<prefix>.<stage>.<agent>`, contracted on its agent's offer
    /// while that is open and on a fresh one after ([`Planner::current`]);
    /// the first stage to fail ends it.
    pub(super) async fn execute(
        &self,
        job: &Job,
        prefix: &str,
        route: &routing::RouteChoice,
        offered: &Offered<'_>,
        qos: pb::QoSConstraints,
        transfer: &mut Option<Arc<Transfer>>,
    ) -> Result<PatternRun, StageFailure> {
        let st = self.state();
        let probe = offered.probe;
        let offer_of = |did: &str| {
            offered.offers.iter().find(|o| o.did() == did).ok_or_else(|| StageFailure {
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
                    let done = self.stage(&j, offer_of(&agent)?, probe, qos, transfer).await?;
                    previous = Some(j.task_id.clone());
                    run.answer = Some(done.answer.clone());
                    run.stages.push(done);
                }
                routing::Stage::Escalate { agent, min_confidence } => {
                    let j = step(&agent, "cascade");
                    let done = self.stage(&j, offer_of(&agent)?, probe, qos, transfer).await?;
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
                        async move { self.stage(j, offer, probe, qos, &mut t).await }
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

    /// One stage of a composite route: [`Planner::delegate`] to one agent,
    /// on its offer while that is open, else on its fresh one ([`Planner::current`]).
    async fn stage(
        &self,
        job: &Job,
        offer: &Offer,
        probe: &pb::CapabilityProbe,
        qos: pb::QoSConstraints,
        transfer: &mut Option<Arc<Transfer>>,
    ) -> Result<StageRun, StageFailure> {
        let offer = &self.current(job, offer, probe).await?;
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
}
