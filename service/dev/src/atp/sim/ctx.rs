//! One strategy's run over the world: calls, routes, failures, recovery.

use std::collections::BTreeMap;

use rand::rngs::StdRng;
use rand::Rng;

use super::config::SimConfig;
use super::config::ATP_ATTEMPTS;
use super::config::BASELINE_RETRIES;
use super::config::EPOCH_S;
use super::config::HANDSHAKE_MS;
use super::config::PIPELINES;
use super::config::PLANNER;
use super::config::SCD_MS;
use super::strategy::Kind;
use super::strategy::Layers;
use super::world::normal;
use super::world::TaskSpec;
use super::world::Tier;
use super::world::World;
use scd_atp::fault::{CircuitBreakers, HealthMonitor, MISSED_HEARTBEATS};
use scd_atp::pb::{self, AgentStatus, TaskType};
use scd_atp::routing::{self, Candidate, Constraints, Observation, Repricer, RoutingParams};
use scd_atp::trust::TrustBook;
use scd_atp::Result;

#[derive(Default)]
pub(super) struct Tally {
    pub(super) completed: usize,
    pub(super) lost: usize,
    pub(super) cost: f64,
    pub(super) token_cost: f64,
    pub(super) latencies_ms: Vec<f64>,
    pub(super) quality_sum: f64,
    pub(super) failures: usize,
    pub(super) recoveries_ms: Vec<f64>,
    pub(super) sent: u64,
    pub(super) full: u64,
    pub(super) calls: usize,
    pub(super) over_calls: usize,
}

pub(super) struct AtpState {
    pub(super) monitor: HealthMonitor,
    pub(super) breakers: CircuitBreakers,
    pub(super) repricer: Repricer,
    pub(super) book: TrustBook,
    /// Proofs since the routing table was last recomputed.
    pub(super) pending: Vec<pb::InteractionProof>,
    /// Trust per (agent, task type) as of the last recomputation.
    pub(super) trust: BTreeMap<(usize, i32), f64>,
    /// A repricing trigger fired since the last recomputation.
    pub(super) stale: bool,
    pub(super) nonce: u64,
    pub(super) reprices: usize,
}

impl AtpState {
    /// Recomputes the routing inputs (§7.3): folds the pending proofs into the
    /// trust book and rescores every agent × task type.
    fn recompute(&mut self, world: &World, now: u64) {
        for p in self.pending.drain(..) {
            // Cannot fail: the simulation builds valid proofs with fresh nonces.
            let _ = self.book.add_simulated(&p);
        }
        let now_s = EPOCH_S + (now / 1_000) as i64;
        for (&t, agents) in &world.capable {
            let tt = TaskType::try_from(t).unwrap_or(TaskType::Unspecified);
            for &a in agents {
                let score = self.book.trust(&world.agents[a].did, Some(tt), now_s).score;
                self.trust.insert((a, t), score);
            }
        }
        self.stale = false;
        self.reprices += 1;
    }
}

pub(super) struct Ctx<'a> {
    pub(super) cfg: &'a SimConfig,
    pub(super) world: &'a World,
    pub(super) ratios: Vec<f64>,
    pub(super) rng: StdRng,
    /// The random choices of the ablation's random-agent row.
    pub(super) pick_rng: StdRng,
    pub(super) tally: Tally,
    pub(super) rr: BTreeMap<i32, usize>,
    pub(super) atp: AtpState,
}

enum CallOutcome {
    Done { latency_ms: u64, quality: f64 },
    Failed { at_ms: u64, detected_ms: u64, progress_ms: u64, work_ms: u64 },
}

impl Ctx<'_> {
    /// Network hop, prefill of `tokens`, and for ATP the SCD compression and
    /// the handshake.
    fn overhead_ms(&self, tokens: u64, kind: Kind) -> u64 {
        self.cfg.hop_ms
            + (tokens as f64 / 1_000.0 * self.cfg.prefill_ms_per_1k) as u64
            + match kind.atp() {
                Some(Layers::NoScd) => HANDSHAKE_MS,
                Some(_) => SCD_MS + HANDSHAKE_MS,
                None => 0,
            }
    }

    /// One call of `agent` at `t0`, receiving `tokens`, with the share
    /// `resume` of the stage already done (a checkpoint). Charges the tokens
    /// and the agent's price (pro rata for work lost to a failure).
    fn call(&mut self, agent: usize, t: TaskType, t0: u64, tokens: u64, kind: Kind, resume: f64) -> CallOutcome {
        let a = &self.world.agents[agent];
        self.tally.calls += 1;
        if a.tier == Tier::OverAdvertiser {
            self.tally.over_calls += 1;
        }
        let token_cost = tokens as f64 / 1_000.0 * self.cfg.dollars_per_1k_tokens;
        self.tally.token_cost += token_cost;
        self.tally.cost += token_cost;
        let jitter = self.rng.random_range(0.8..1.2);
        let work = (a.latency_ms as f64 * jitter * (1.0 - resume)).max(1.0) as u64;
        let overhead = self.overhead_ms(tokens, kind);
        let end = t0 + overhead + work;
        let (hb, timeout) = (self.cfg.heartbeat_ms, self.cfg.timeout_ms);
        // ATP notices by heartbeat: T_fail after the last beat before the
        // death; the baselines when the request times out.
        let detect = |died: u64| {
            if kind.fault_tolerant() {
                (a.last_beat(died, hb) + MISSED_HEARTBEATS * hb).max(died + 1)
            } else {
                died + timeout
            }
        };
        let died = if a.down_at(t0).is_some() { Some(t0) } else { a.dies_in(t0, end) };
        if let Some(died) = died {
            let progress = died.saturating_sub(t0 + overhead).min(work);
            self.tally.cost += a.cost * (1.0 - resume) * progress as f64 / work as f64;
            self.tally.failures += 1;
            return CallOutcome::Failed {
                at_ms: died,
                detected_ms: detect(died),
                progress_ms: progress,
                work_ms: work,
            };
        }
        self.tally.cost += a.cost * (1.0 - resume);
        let q = a.skills[&(t as i32)].true_quality + 0.02 * normal(&mut self.rng);
        CallOutcome::Done { latency_ms: end - t0, quality: q.clamp(0.0, 1.0) }
    }

    fn ratio(&mut self) -> f64 {
        self.ratios[self.rng.random_range(0..self.ratios.len())]
    }

    /// Baseline agent choice for a stage (None: sequential has no other).
    fn pick(&mut self, kind: Kind, t: TaskType, tried: &[usize]) -> Option<usize> {
        let cap = &self.world.capable[&(t as i32)];
        if cap.is_empty() {
            return None;
        }
        match kind {
            Kind::Sequential => {
                if tried.is_empty() {
                    cap.first().copied()
                } else {
                    None
                }
            }
            Kind::RoundRobin => {
                let i = self.rr.entry(t as i32).or_insert(0);
                let a = cap[*i % cap.len()];
                *i += 1;
                Some(a)
            }
            Kind::Broadcast => {
                let free: Vec<usize> = cap.iter().copied().filter(|a| !tried.contains(a)).collect();
                let from = if free.is_empty() { cap.clone() } else { free };
                Some(from[self.rng.random_range(0..from.len())])
            }
            // ATP routes instead (`atp_route`).
            Kind::Atp(_) => None,
        }
    }

    /// The planner's trust in agent `i` for `t` as of the last
    /// recomputation (the cold-start prior without a trust book).
    fn trust_of(&self, layers: Layers, i: usize, t: TaskType) -> f64 {
        let prior = self.atp.book.params().cold_start;
        match layers {
            Layers::PriorTrust => prior,
            _ => self.atp.trust.get(&(i, t as i32)).copied().unwrap_or(prior),
        }
    }

    /// ATP's route for one stage at `now`: the best agent (or a draft-refine
    /// pair) among those alive by heartbeat and allowed by their breakers
    /// (for an ablation, what is left without the layer taken away).
    fn atp_route(&mut self, layers: Layers, t: TaskType, now: u64, exclude: &[usize]) -> Option<Vec<usize>> {
        let hb = self.cfg.heartbeat_ms;
        let mut cands = Vec::new();
        let mut index = BTreeMap::new();
        for &i in &self.world.capable[&(t as i32)] {
            let a = &self.world.agents[i];
            let beat = a.last_beat(now, hb);
            self.atp.monitor.beat(&a.did, AgentStatus::Healthy, hb, 0.3, 0, beat);
            let unavailable = layers != Layers::NoFault
                && (self.atp.monitor.status(&a.did, now).is_none() || !self.atp.breakers.would_allow(&a.did, now));
            if exclude.contains(&i) || unavailable {
                continue;
            }
            let trust = self.trust_of(layers, i, t);
            let skill = &a.skills[&(t as i32)];
            cands.push(Candidate {
                agent: a.did.clone(),
                task_type: t,
                quality: skill.advertised,
                latency_ms: a.latency_ms,
                cost: a.cost,
                trust,
            });
            index.insert(a.did.clone(), i);
        }
        if layers == Layers::NoTrust {
            // random among the capable (and available): no trust, and with
            // it nothing to rank by
            // (its own stream: the shared one stays in step with full ATP's)
            return (!cands.is_empty()).then(|| vec![index[&cands[self.pick_rng.random_range(0..cands.len())].agent]]);
        }
        if self.atp.stale || self.atp.repricer.due(now).is_some() {
            self.atp.recompute(self.world, now);
            for c in &mut cands {
                c.trust = self.trust_of(layers, index[&c.agent], t);
            }
            // the repricer's baseline is what it has seen, whether or not
            // routing uses it (else every observation would trigger again)
            let mut seen = cands.clone();
            self.atp.repricer.apply(&mut seen);
            self.atp.repricer.repriced(now, &seen);
            if layers != Layers::NoRepricer {
                cands = seen;
            }
        } else if layers != Layers::NoRepricer {
            self.atp.repricer.apply(&mut cands);
        }
        let q = &self.cfg.qos;
        if layers == Layers::NoRouting {
            // always the highest quality the planner knows, whatever it costs
            let trusted: Vec<&Candidate> = cands.iter().filter(|c| c.trust >= q.min_trust).collect();
            let pool = if trusted.is_empty() { cands.iter().collect() } else { trusted };
            return pool
                .into_iter()
                .max_by(|a, b| a.quality.total_cmp(&b.quality).then_with(|| b.agent.cmp(&a.agent)))
                .map(|a| vec![index[&a.agent]]);
        }
        let mut c = Constraints {
            min_quality: q.min_quality,
            max_latency_ms: q.max_latency_ms,
            max_cost: q.max_cost,
            min_trust: q.min_trust,
        };
        let p = RoutingParams { beta1: q.beta1, beta2: q.beta2, transfer_latency_ms: self.cfg.hop_ms };
        // The handshake's relaxation: 3 retries, 10 % looser each.
        for _ in 0..4 {
            if let Some(r) = routing::route(&cands, t, &c, &p).first() {
                return Some(r.agents.iter().map(|d| index[d]).collect());
            }
            c.min_quality *= 0.9;
            c.min_trust *= 0.9;
            c.max_latency_ms = (c.max_latency_ms as f64 * 1.1) as u64;
            c.max_cost *= 1.1;
        }
        // Escalation: the most trusted agent available.
        cands
            .iter()
            .max_by(|a, b| a.trust.total_cmp(&b.trust).then_with(|| b.agent.cmp(&a.agent)))
            .map(|a| vec![index[&a.agent]])
    }

    fn atp_observe(&mut self, agent: usize, t: TaskType, quality: f64, latency_ms: u64, now: u64) {
        let a = &self.world.agents[agent];
        self.atp.nonce += 1;
        let proof = pb::InteractionProof {
            evaluator: Some(pb::AgentId { uuid: PLANNER.into() }),
            subject: Some(pb::AgentId { uuid: a.did.clone() }),
            task_id: format!("sim-{}", self.atp.nonce),
            task_type: t as i32,
            quality_score: quality,
            latency_ms,
            cost: a.cost,
            timestamp: Some(pb::Timestamp { seconds: EPOCH_S + (now / 1_000) as i64, nanos: 0 }),
            nonce: self.atp.nonce,
            ..Default::default()
        };
        if self.atp.repricer.observe(&Observation::from(&proof)).is_some() {
            self.atp.stale = true;
        }
        self.atp.pending.push(proof);
        self.atp.breakers.record_success(&a.did, now);
    }

    /// Runs one task; returns (latency, quality) or None if lost.
    pub(super) fn task(&mut self, kind: Kind, spec: &TaskSpec) -> Option<(u64, f64)> {
        let stages = PIPELINES[spec.pipeline].1;
        let mut now = spec.arrival_ms;
        let mut quality = 1.0;
        for (i, (_, t)) in stages.iter().enumerate() {
            quality *= self.stage(kind, spec, i, *t, &mut now)?;
        }
        Some((now - spec.arrival_ms, quality))
    }

    /// Runs stage `i` of `spec` (of type `t`) from `*now` until a route
    /// completes it, failing over as `kind` does; returns the stage's
    /// quality, or None if the task is lost.
    fn stage(&mut self, kind: Kind, spec: &TaskSpec, i: usize, t: TaskType, now: &mut u64) -> Option<f64> {
        // The full context at this hop: the task's plus every earlier output.
        let full = spec.context_tokens + spec.outputs[..i].iter().sum::<u64>();
        let mut tried: Vec<usize> = Vec::new();
        // Share of the stage saved in checkpoints (ATP, single-agent routes).
        let mut done = 0.0;
        let (mut attempts, mut waits) = (0, 0);
        loop {
            let agents = if let Some(layers) = kind.atp() {
                match self.atp_route(layers, t, *now, &tried) {
                    Some(r) => r,
                    None => {
                        // Nobody available: back-pressure, wait for the
                        // first capable agent to beat again.
                        waits += 1;
                        if waits > 100_000 {
                            return None;
                        }
                        let hb = self.cfg.heartbeat_ms;
                        let back = self.world.capable[&(t as i32)]
                            .iter()
                            .map(|&a| self.world.agents[a].back_at(*now) + hb)
                            .min()?;
                        *now = back.max(*now + hb);
                        tried.clear();
                        continue;
                    }
                }
            } else {
                vec![self.pick(kind, t, &tried)?]
            };
            attempts += 1;
            if attempts > if kind.atp().is_some() { ATP_ATTEMPTS } else { BASELINE_RETRIES + 1 } {
                return None;
            }
            let sent = self.sent_tokens(kind, spec, i, full);
            self.tally.sent += sent;
            self.tally.full += full;
            if kind.fault_tolerant() {
                // The breaker of the chosen agent(s) lets the call go (a
                // half-open one as its probe).
                for &a in &agents {
                    let did = self.world.agents[a].did.clone();
                    self.atp.breakers.allow(&did, *now);
                }
            }
            let resume = if agents.len() == 1 { done } else { 0.0 };
            let failure = match self.members(&agents, t, *now, sent, kind, resume) {
                Ok((t_call, q_members)) => {
                    *now = t_call;
                    return Some(match q_members[..] {
                        [d, r] => 1.0 - (1.0 - r) * (1.0 - routing::DRAFT_LIFT * d),
                        _ => q_members[0],
                    });
                }
                Err(failure) => failure,
            };
            if kind == Kind::Sequential || kind == Kind::Atp(Layers::NoFault) {
                return None;
            }
            tried.push(failure.agent);
            self.recover(kind, &failure, agents.len(), sent, &mut done);
            *now = failure.detected_ms;
        }
    }

    /// The tokens a call at stage `i` sends, of the `full` context at that hop.
    fn sent_tokens(&mut self, kind: Kind, spec: &TaskSpec, i: usize, full: u64) -> u64 {
        match kind {
            Kind::Sequential | Kind::RoundRobin => full,
            // Group chat: besides the conversation so far, this
            // stage's output also reaches the i earlier speakers (the
            // later ones are counted in their own `full`); the last
            // output goes back to the originator only.
            Kind::Broadcast => full + if i < 3 { i as u64 * spec.outputs[i] } else { 0 },
            // the ratio is drawn either way, so the random stream
            // stays in step with full ATP's
            Kind::Atp(Layers::NoScd) => {
                let _ = self.ratio();
                full
            }
            Kind::Atp(_) => (full as f64 * self.ratio()).round() as u64,
        }
    }

    /// Calls a route's members in turn (a draft-refine pair runs its
    /// members one after the other); returns when the last finished and each
    /// member's quality, or the first member that failed.
    fn members(
        &mut self,
        agents: &[usize],
        t: TaskType,
        now: u64,
        sent: u64,
        kind: Kind,
        resume: f64,
    ) -> Result<(u64, Vec<f64>), StageFailure> {
        let mut q_members = Vec::new();
        let mut t_call = now;
        for &a in agents {
            match self.call(a, t, t_call, sent, kind, resume) {
                CallOutcome::Done { latency_ms, quality } => {
                    if kind.atp().is_some() {
                        self.atp_observe(a, t, quality, latency_ms, t_call);
                    }
                    t_call += latency_ms;
                    q_members.push(quality);
                }
                CallOutcome::Failed { at_ms, detected_ms, progress_ms, work_ms } => {
                    return Err(StageFailure { agent: a, at_ms, detected_ms, progress_ms, work_ms });
                }
            }
        }
        Ok((t_call, q_members))
    }

    /// After a failed call: the work kept in checkpoints (`done`), the
    /// breaker and repricer told, and the recovery time tallied.
    fn recover(&mut self, kind: Kind, f: &StageFailure, route_len: usize, sent: u64, done: &mut f64) {
        // Work redone on the replacement: everything for the
        // baselines, only what followed the last checkpoint for ATP.
        let redo = if kind.fault_tolerant() && route_len == 1 {
            let kept = f.progress_ms / self.cfg.checkpoint_ms * self.cfg.checkpoint_ms;
            // `work` covers the (1 − done) of the stage this call had left.
            *done += (1.0 - *done) * kept as f64 / f.work_ms.max(1) as f64;
            f.progress_ms - kept
        } else {
            f.progress_ms
        };
        if kind.fault_tolerant() {
            let did = self.world.agents[f.agent].did.clone();
            self.atp.breakers.record_failure(&did, f.detected_ms);
            self.atp.repricer.agent_failed(&did);
            self.atp.stale = true;
        }
        let resend = self.overhead_ms(sent, kind);
        self.tally.recoveries_ms.push((f.detected_ms - f.at_ms + resend + redo) as f64);
    }
}

/// A call of a route that failed: the agent, when it went down, when the
/// failure was detected, and the progress and work of the call.
struct StageFailure {
    agent: usize,
    at_ms: u64,
    detected_ms: u64,
    progress_ms: u64,
    work_ms: u64,
}
