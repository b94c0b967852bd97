//! [`Planner::run`]: probe rounds, routes, failover, until the task
//! completes, is poison, or no agent is left.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::composite::Offered;
use super::driver::agreed;
use super::driver::member_probe;
use super::driver::Planner;
use super::driver::MAX_BUFFER;
use super::failure::Failure;
use super::failure::FailureKind;
use super::job::Job;
use super::job::Outcome;
use crate::context::Transfer;
use crate::fault::{self};
use crate::handshake::{self, Offer};
use crate::requester::constraints;
use crate::requester::{short, Event};
use crate::routing::{self, Pattern, RoutingParams};
use crate::{pb, Result};

impl Planner {
    /// Delegates `job` through the five layers until it completes, is
    /// poison, or no agent is left.
    pub async fn run(&self, job: &Job) -> Result<Outcome> {
        let st = self.state();
        if let Some(diagnostics) = self.known_poison(job) {
            return Ok(Outcome::Poison { diagnostics, failovers: 0 });
        }
        let scd = st.scd().await?;
        let e_task = scd.embed_task(&job.task).await?;
        let probe = self.probe(job, e_task);
        let mut tries = Tries::default();
        let result = loop {
            if let Some(end) = self.round(job, &probe, &mut tries).await? {
                break end;
            }
        };
        if let Some(t) = &tries.transfer {
            if let Err(e) = scd.close(&t.session).await {
                tracing::debug!(error = %e, "closing the SCD session");
            }
        }
        st.delegations.lock().unwrap().remove(&job.task_id);
        Ok(result)
    }

    /// The diagnostics of a task known to be poison: such a task is not
    /// retried, even when it is submitted again; failures older than the
    /// poison window are forgotten.
    fn known_poison(&self, job: &Job) -> Option<String> {
        let st = self.state();
        let mut poison = st.poison.lock().unwrap();
        poison.prune(st.now_ms());
        poison.poison(&job.task_id).map(|p| p.to_string())
    }

    /// The signed probe's content for `job`, carrying its task embedding.
    fn probe(&self, job: &Job, e_task: pb::Embedding) -> pb::CapabilityProbe {
        // a composite's members need not meet q_min alone: with composites
        // allowed every capable peer is asked, and the router decides
        let probe_qos = if self.composites.is_empty() { job.qos } else { member_probe(job.qos) };
        pb::CapabilityProbe {
            from: Some(self.node.identity.agent_id()),
            task_type: job.task_type as i32,
            qos: Some(probe_qos),
            context_embedding: Some(e_task),
            task_id: job.task_id.clone(),
            ..Default::default()
        }
    }

    /// One probe round: offers (layer 2), routes (layer 4), and the best
    /// route that admits the task run on it. `Some` ends the task; `None`
    /// asks for another round.
    async fn round(&self, job: &Job, probe: &pb::CapabilityProbe, tries: &mut Tries) -> Result<Option<Outcome>> {
        let st = self.state();
        // layer 5: skip peers whose circuit is open
        let peers = self.open_peers(job);
        // layer 2: probe → offers (retries relax the constraints)
        let negotiation =
            handshake::negotiate_from(&self.node.identity, &self.node.verifier, &peers, probe, tries.relaxed).await;
        let negotiation = match negotiation {
            Ok(n) => n,
            Err(e) => return Ok(Some(Outcome::Lost { why: e.to_string(), failovers: tries.failovers })),
        };
        self.account_probe(job, &negotiation);
        let offers: Vec<Offer> =
            negotiation.offers.into_iter().filter(|o| !tries.tried.contains(&o.url) && self.evidence_ok(o)).collect();
        st.remember_offers(&offers);
        // layer 4: rank routes (single agents, and composites that meet
        // the constraints for less than any single agent that does)
        let cands = st.candidates(&self.node.ledger, &offers, job.task_type);
        // the task's constraints, relaxed as often as the probe's were
        let task_qos = handshake::relax(&job.qos, negotiation.rounds.saturating_sub(1));
        let c = constraints(&task_qos);
        let routes = routing::route_composites(&cands, job.task_type, &c, &RoutingParams::default(), &self.composites);
        let Some(best) = self.admit(job, &routes).await else {
            // the next probe round relaxes once more than this one did
            tries.relaxed = negotiation.rounds;
            if tries.relaxed > handshake::MAX_RETRIES {
                let why = format!(
                    "escalated: no route among {} offers meets the constraints, relaxed {} times",
                    offers.len(),
                    tries.relaxed
                );
                return Ok(Some(Outcome::Lost { why, failovers: tries.failovers }));
            }
            return Ok(None);
        };
        st.routed(&job.task_id, best, cands.len());
        if best.pattern != Pattern::Single {
            // a later stage's fresh offer answers the probe this round sent
            let probe = pb::CapabilityProbe { qos: Some(negotiation.qos), ..probe.clone() };
            let offered = Offered { offers: &offers, probe: &probe };
            return Ok(self.run_composite(job, best, &offered, task_qos, tries).await);
        }
        self.run_single(job, best, &offers, task_qos, tries).await
    }

    /// A composite route runs whole; a failed stage fails the route over
    /// like a failed agent (its stages start again, under ids of their own).
    async fn run_composite(
        &self,
        job: &Job,
        best: &routing::RouteChoice,
        offered: &Offered<'_>,
        task_qos: pb::QoSConstraints,
        tries: &mut Tries,
    ) -> Option<Outcome> {
        let st = self.state();
        if let Some(from) = tries.last_failed.take() {
            let to = short(&best.agents[0]);
            st.emit(Event::Failover { task: job.task_id.clone(), from: short(&from), to, resumed_after: 0 });
        }
        let failovers = tries.failovers;
        let prefix = if failovers == 0 { job.task_id.clone() } else { format!("{}.f{failovers}", job.task_id) };
        let started = Instant::now();
        match self.execute(job, &prefix, best, offered, task_qos, &mut tries.transfer).await {
            Ok(run) => match Outcome::of_route(run, failovers, started.elapsed()) {
                Some(done) => Some(done),
                None => Some(Outcome::Lost { why: "the composite route ran no stage".into(), failovers }),
            },
            Err(f) => {
                tries.tried.insert(f.url.clone());
                self.failed(job, &f.did, &f.url, f.failure, &mut tries.failovers, &mut tries.last_failed)
            }
        }
    }

    /// A single agent's route: one delegation, resumed from the task's last
    /// checkpoint when it fails over.
    async fn run_single(
        &self,
        job: &Job,
        best: &routing::RouteChoice,
        offers: &[Offer],
        task_qos: pb::QoSConstraints,
        tries: &mut Tries,
    ) -> Result<Option<Outcome>> {
        let st = self.state();
        let Some(offer) = offers.iter().find(|o| o.did() == best.agents[0]) else {
            let why = "route names an agent without an offer".into();
            return Ok(Some(Outcome::Lost { why, failovers: tries.failovers }));
        };
        tries.tried.insert(offer.url.clone());
        if let Some(from) = tries.last_failed.take() {
            let resumed_after =
                self.node.ledger.lock().unwrap().store().checkpoint(&job.task_id)?.map_or(0, |c| c.step_number);
            st.emit(Event::Failover {
                task: job.task_id.clone(),
                from: short(&from),
                to: short(offer.did()),
                resumed_after,
            });
        }
        Ok(match self.delegate(job, offer, agreed(task_qos, offer), &mut tries.transfer).await {
            Ok(done) => Some(done.with_failovers(tries.failovers)),
            Err(f) => self.failed(job, offer.did(), &offer.url, f, &mut tries.failovers, &mut tries.last_failed),
        })
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
}

/// What the probe rounds of one task carry from one to the next.
#[derive(Default)]
struct Tries {
    /// Peers tried, by URL: a peer that rotates its DID is still the peer
    /// that failed.
    tried: HashSet<String>,
    /// The task's SCD transfer, computed once.
    transfer: Option<Arc<Transfer>>,
    failovers: u32,
    last_failed: Option<String>,
    /// Probe rounds whose offers all miss the route constraints relax them
    /// further, as rounds without offers do (§5.3).
    relaxed: u32,
}
