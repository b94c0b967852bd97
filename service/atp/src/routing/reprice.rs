//! The §7.3 repricer: EWMA estimates from interaction proofs and the
//! triggers that recompute routes.

use std::collections::HashMap;

use super::constants::{COST_CHANGE, QUALITY_CHANGE, REPRICE_INTERVAL_MS};
use super::model::Candidate;
use crate::pb;

/// What one interaction showed of an agent (from an interaction proof).
#[derive(Debug, Clone, PartialEq)]
pub struct Observation {
    /// The agent observed (the proof's subject).
    pub agent: String,
    /// The task type.
    pub task_type: pb::TaskType,
    /// The quality the evaluator scored.
    pub quality: f64,
    /// The latency seen.
    pub latency_ms: u64,
    /// The cost paid.
    pub cost: f64,
}

impl From<&pb::InteractionProof> for Observation {
    fn from(p: &pb::InteractionProof) -> Observation {
        Observation {
            agent: p.subject.as_ref().map(|s| s.uuid.clone()).unwrap_or_default(),
            task_type: p.task_type(),
            quality: p.quality_score,
            latency_ms: p.latency_ms,
            cost: p.cost,
        }
    }
}

/// Why routes must be recomputed (§7.3).
#[derive(Debug, Clone, PartialEq)]
pub enum RepriceReason {
    /// The periodic recomputation is due.
    Interval,
    /// An agent failed.
    AgentFailed {
        /// Its DID.
        agent: String,
    },
    /// An agent's cost moved more than 10 % from what routes used.
    CostChanged {
        /// Its DID.
        agent: String,
        /// What routes were computed with.
        from: f64,
        /// The current estimate.
        to: f64,
    },
    /// An agent's quality moved more than 5 % from what routes used.
    QualityChanged {
        /// Its DID.
        agent: String,
        /// What routes were computed with.
        from: f64,
        /// The current estimate.
        to: f64,
    },
}

impl std::fmt::Display for RepriceReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RepriceReason::Interval => write!(f, "periodic repricing ({} s)", REPRICE_INTERVAL_MS / 1000),
            RepriceReason::AgentFailed { agent } => write!(f, "agent {agent} failed"),
            RepriceReason::CostChanged { agent, from, to } => {
                write!(f, "cost of {agent} moved {from:.4} → {to:.4} (limit ±{:.0} %)", COST_CHANGE * 100.0)
            }
            RepriceReason::QualityChanged { agent, from, to } => {
                write!(f, "quality of {agent} moved {from:.3} → {to:.3} (limit ±{:.0} %)", QUALITY_CHANGE * 100.0)
            }
        }
    }
}

/// An agent's running estimate for one task type.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Estimate {
    /// EWMA of observed quality.
    pub quality: f64,
    /// EWMA of observed latency.
    pub latency_ms: f64,
    /// EWMA of observed cost.
    pub cost: f64,
    /// Observations so far.
    pub samples: u64,
}

/// Repricer parameters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RepricerParams {
    /// EWMA weight of a new observation.
    pub ewma_alpha: f64,
    /// Relative cost change that triggers repricing.
    pub cost_change: f64,
    /// Relative quality change that triggers repricing.
    pub quality_change: f64,
    /// Periodic recomputation.
    pub interval_ms: u64,
}

impl Default for RepricerParams {
    /// α = 0.3 (ours); 10 %, 5 % and 60 s from §7.3.
    fn default() -> RepricerParams {
        RepricerParams {
            ewma_alpha: 0.3,
            cost_change: COST_CHANGE,
            quality_change: QUALITY_CHANGE,
            interval_ms: REPRICE_INTERVAL_MS,
        }
    }
}

type Key = (String, i32);

/// Baselines kept for agents (× task type) not yet observed.
pub const MAX_BASELINES: usize = 16_384;

/// Dynamic repricing (§7.3): keeps EWMA estimates per agent × task type from
/// interaction proofs and says when the routing table is stale. Changes are
/// relative to the values the current routes were computed with (recorded by
/// [`Repricer::repriced`]; an agent without one takes its first observation).
#[derive(Debug, Clone, Default)]
pub struct Repricer {
    params: RepricerParams,
    estimates: HashMap<Key, Estimate>,
    pub(super) baseline: HashMap<Key, (f64, f64)>,
    last_ms: Option<u64>,
}

impl Repricer {
    /// A repricer with no observations; the first [`Repricer::due`] is true.
    pub fn new(params: RepricerParams) -> Repricer {
        Repricer { params, ..Repricer::default() }
    }

    /// Folds in one observation; a reason when the estimate has moved past a
    /// threshold from what routes were computed with.
    pub fn observe(&mut self, o: &Observation) -> Option<RepriceReason> {
        let key = (o.agent.clone(), o.task_type as i32);
        let a = self.params.ewma_alpha;
        let e = self
            .estimates
            .entry(key.clone())
            .and_modify(|e| {
                e.quality = a * o.quality + (1.0 - a) * e.quality;
                e.latency_ms = a * o.latency_ms as f64 + (1.0 - a) * e.latency_ms;
                e.cost = a * o.cost + (1.0 - a) * e.cost;
                e.samples += 1;
            })
            .or_insert(Estimate { quality: o.quality, latency_ms: o.latency_ms as f64, cost: o.cost, samples: 1 });
        let e = *e;
        let (q0, c0) = *self.baseline.entry(key).or_insert((e.quality, e.cost));
        let moved = |now: f64, was: f64, limit: f64| {
            if was == 0.0 {
                now != 0.0
            } else {
                ((now - was) / was).abs() > limit
            }
        };
        let reason = if moved(e.cost, c0, self.params.cost_change) {
            Some(RepriceReason::CostChanged { agent: o.agent.clone(), from: c0, to: e.cost })
        } else if moved(e.quality, q0, self.params.quality_change) {
            Some(RepriceReason::QualityChanged { agent: o.agent.clone(), from: q0, to: e.quality })
        } else {
            None
        };
        if let Some(r) = &reason {
            tracing::debug!(reason = %r, "routes need repricing");
        }
        reason
    }

    /// An agent failed: routes through it must be recomputed.
    pub fn agent_failed(&mut self, agent: &str) -> RepriceReason {
        tracing::debug!(agent, "agent failed: routes need repricing");
        RepriceReason::AgentFailed { agent: agent.to_string() }
    }

    /// `Interval` when the last recomputation is 60 s old (or there was none).
    pub fn due(&self, now_ms: u64) -> Option<RepriceReason> {
        match self.last_ms {
            Some(t) if now_ms.saturating_sub(t) < self.params.interval_ms => None,
            _ => Some(RepriceReason::Interval),
        }
    }

    /// Routes were recomputed at `now_ms` with these candidates: they become
    /// the baseline for the change thresholds.
    pub fn repriced(&mut self, now_ms: u64, used: &[Candidate]) {
        self.last_ms = Some(now_ms);
        for c in used {
            let key = (c.agent.clone(), c.task_type as i32);
            // bounded: a peer rotating DIDs adds a candidate per offer;
            // the baselines of agents never observed give way first
            if self.baseline.len() >= MAX_BASELINES && !self.baseline.contains_key(&key) {
                self.baseline.retain(|k, _| self.estimates.contains_key(k));
                if self.baseline.len() >= MAX_BASELINES {
                    continue;
                }
            }
            self.baseline.insert(key, (c.quality, c.cost));
        }
    }

    /// The current estimate of an agent for a task type.
    pub fn estimate(&self, agent: &str, task_type: pb::TaskType) -> Option<Estimate> {
        self.estimates.get(&(agent.to_string(), task_type as i32)).copied()
    }

    /// Replaces advertised figures with observed estimates where there are any.
    pub fn apply(&self, cands: &mut [Candidate]) {
        for c in cands {
            if let Some(e) = self.estimate(&c.agent, c.task_type) {
                c.quality = e.quality;
                c.latency_ms = e.latency_ms.round() as u64;
                c.cost = e.cost;
            }
        }
    }
}
