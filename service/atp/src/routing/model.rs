//! The route model: candidates, constraints and parameters, the composite
//! patterns, a chosen route and its metrics (Definition 4 and [`compose`]).

use sha2::{Digest, Sha256};

use super::constants::{DRAFT_LIFT, REPRICE_INTERVAL_MS};
use crate::pb;
use crate::{Error, Result};

/// An agent able to serve a task type, with what the router knows of it.
#[derive(Debug, Clone, PartialEq)]
pub struct Candidate {
    /// The agent's DID.
    pub agent: String,
    /// The task type these figures are for.
    pub task_type: pb::TaskType,
    /// Expected quality in [0, 1].
    pub quality: f64,
    /// Expected latency.
    pub latency_ms: u64,
    /// Expected cost per task (dollars).
    pub cost: f64,
    /// Trust score in [0, 1] (layer 1).
    pub trust: f64,
}

impl Candidate {
    /// A candidate from an advertised capability and the agent's trust.
    pub fn from_capability(agent: impl Into<String>, cap: &pb::Capability, trust: f64) -> Candidate {
        Candidate {
            agent: agent.into(),
            task_type: cap.task_type(),
            quality: cap.estimated_quality,
            latency_ms: cap.estimated_latency_ms,
            cost: cap.cost_per_task,
            trust,
        }
    }
}

/// A task's QoS constraints (q_min, l_max, c_max and the minimum trust).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Constraints {
    /// q_min.
    pub min_quality: f64,
    /// l_max.
    pub max_latency_ms: u64,
    /// c_max (dollars).
    pub max_cost: f64,
    /// Agents below this trust are pruned before routing.
    pub min_trust: f64,
}

impl From<&pb::QoSConstraints> for Constraints {
    fn from(q: &pb::QoSConstraints) -> Constraints {
        Constraints {
            min_quality: q.min_quality,
            max_latency_ms: q.max_latency_ms,
            max_cost: q.max_cost,
            min_trust: q.min_trust,
        }
    }
}

/// The weights of the routing objective and the inter-agent transfer latency.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RoutingParams {
    /// β1: dollars per unit of quality above q_min.
    pub beta1: f64,
    /// β2: dollars per millisecond of latency.
    pub beta2: f64,
    /// T(a_i, a_{i+1}): latency of one agent-to-agent transfer.
    pub transfer_latency_ms: u64,
}

impl Default for RoutingParams {
    /// β1 = 1 $ per unit of quality, β2 = 1 cent per second, 50 ms per hop
    /// (the paper gives no values; these are ours).
    fn default() -> RoutingParams {
        RoutingParams { beta1: 1.0, beta2: 1e-5, transfer_latency_ms: 50 }
    }
}

/// How the agents of a route work together (§7.4, plus a single agent).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Pattern {
    /// One agent does the task.
    Single,
    /// A cheap agent drafts, a better one refines. Model (ours): the refiner
    /// starts from the draft, and a draft of quality q_d removes the share
    /// `DRAFT_LIFT · q_d` of the refiner's residual error:
    /// quality = 1 − (1 − q_r)(1 − DRAFT_LIFT·q_d), so never below the
    /// refiner's; latency = L_d + T + L_r; cost = C_d + C_r.
    DraftRefine,
    /// All agents work independently and a merge keeps the good result:
    /// quality = 1 − Π(1 − q_i), latency = max L_i, cost = Σ C_i.
    ParallelMerge,
    /// Try the agents in order, cheapest first, escalating on low confidence.
    /// Agent i is reached with probability Π_{j<i}(1 − q_j) (confidence
    /// assumed calibrated: escalation exactly when the answer is not good):
    /// expected cost Σ reach_i·C_i, expected latency Σ reach_i·(L_i + T for
    /// i > 0), quality 1 − Π(1 − q_i).
    Cascade,
    /// All agents answer and the majority wins: quality = P(more than half
    /// are right) by the (Poisson-)binomial formula, e.g. for three agents
    /// q1q2q3 + q1q2(1−q3) + q1(1−q2)q3 + (1−q1)q2q3; latency = max L_i,
    /// cost = Σ C_i.
    Ensemble,
    /// A sequential chain, Definition 4: quality = Π q_i, latency = Σ L_i +
    /// (m − 1)·T, cost = Σ C_i.
    Pipeline,
}

impl Pattern {
    /// Every pattern, in declaration order.
    pub const ALL: [Pattern; 6] = [
        Pattern::Single,
        Pattern::DraftRefine,
        Pattern::ParallelMerge,
        Pattern::Cascade,
        Pattern::Ensemble,
        Pattern::Pipeline,
    ];

    /// A short name: `single`, `draft-refine`, `parallel-merge`, `cascade`,
    /// `ensemble`, `pipeline`.
    pub fn name(self) -> &'static str {
        match self {
            Pattern::Single => "single",
            Pattern::DraftRefine => "draft-refine",
            Pattern::ParallelMerge => "parallel-merge",
            Pattern::Cascade => "cascade",
            Pattern::Ensemble => "ensemble",
            Pattern::Pipeline => "pipeline",
        }
    }
}

impl From<Pattern> for pb::RoutingPattern {
    /// `Single` has no value of its own on the wire: it is a route with one
    /// agent and `ROUTING_PATTERN_UNSPECIFIED`.
    fn from(p: Pattern) -> pb::RoutingPattern {
        match p {
            Pattern::Single => pb::RoutingPattern::Unspecified,
            Pattern::DraftRefine => pb::RoutingPattern::DraftRefine,
            Pattern::ParallelMerge => pb::RoutingPattern::ParallelMerge,
            Pattern::Cascade => pb::RoutingPattern::Cascade,
            Pattern::Ensemble => pb::RoutingPattern::Ensemble,
            Pattern::Pipeline => pb::RoutingPattern::Pipeline,
        }
    }
}

impl From<pb::RoutingPattern> for Pattern {
    fn from(p: pb::RoutingPattern) -> Pattern {
        match p {
            pb::RoutingPattern::Unspecified => Pattern::Single,
            pb::RoutingPattern::DraftRefine => Pattern::DraftRefine,
            pb::RoutingPattern::ParallelMerge => Pattern::ParallelMerge,
            pb::RoutingPattern::Cascade => Pattern::Cascade,
            pb::RoutingPattern::Ensemble => Pattern::Ensemble,
            pb::RoutingPattern::Pipeline => Pattern::Pipeline,
        }
    }
}

/// A scored route.
#[derive(Debug, Clone, PartialEq)]
pub struct RouteChoice {
    /// How the agents work together.
    pub pattern: Pattern,
    /// The agents in order (DIDs).
    pub agents: Vec<String>,
    /// Composite quality.
    pub quality: f64,
    /// Composite latency.
    pub latency_ms: u64,
    /// Composite cost (dollars).
    pub cost: f64,
    /// The objective (higher is better).
    pub score: f64,
}

impl RouteChoice {
    /// Whether the route meets the quality, latency and cost constraints.
    pub fn meets(&self, c: &Constraints) -> bool {
        self.quality >= c.min_quality && self.latency_ms <= c.max_latency_ms && self.cost <= c.max_cost
    }

    /// A stable id: the first 16 hex digits of SHA-256(pattern ‖ agents).
    pub fn route_id(&self) -> String {
        let mut h = Sha256::new();
        h.update(self.pattern.name());
        for a in &self.agents {
            h.update([0u8]);
            h.update(a);
        }
        h.finalize()[..8].iter().map(|b| format!("{b:02x}")).collect()
    }

    /// The wire form: `route_id` from [`RouteChoice::route_id`], `ttl_ms` the
    /// repricing interval; `computed_at` is left to the caller.
    pub fn to_pb(&self) -> pb::Route {
        pb::Route {
            route_id: self.route_id(),
            pattern: pb::RoutingPattern::from(self.pattern) as i32,
            agents: self.agents.iter().map(|a| pb::AgentId { uuid: a.clone() }).collect(),
            metrics: Some(pb::RouteMetrics { quality: self.quality, latency_ms: self.latency_ms, cost: self.cost }),
            computed_at: None,
            ttl_ms: REPRICE_INTERVAL_MS,
        }
    }

    /// A route from the wire (score 0: the receiver rescores it). Refuses a
    /// route without agents or metrics.
    pub fn from_pb(r: &pb::Route) -> Result<RouteChoice> {
        if r.agents.is_empty() {
            return Err(Error::Invalid { field: "route.agents".into(), reason: "empty (at least 1 agent)".into() });
        }
        let m = r
            .metrics
            .as_ref()
            .ok_or_else(|| Error::Invalid { field: "route.metrics".into(), reason: "missing".into() })?;
        Ok(RouteChoice {
            pattern: Pattern::from(r.pattern()),
            agents: r.agents.iter().map(|a| a.uuid.clone()).collect(),
            quality: m.quality,
            latency_ms: m.latency_ms,
            cost: m.cost,
            score: 0.0,
        })
    }
}

impl From<&RouteChoice> for pb::Route {
    fn from(r: &RouteChoice) -> pb::Route {
        r.to_pb()
    }
}

/// score = −cost + β1·(quality − q_min) − β2·latency_ms.
pub fn score(quality: f64, latency_ms: u64, cost: f64, min_quality: f64, p: &RoutingParams) -> f64 {
    -cost + p.beta1 * (quality - min_quality) - p.beta2 * latency_ms as f64
}

/// Capability pruning: the candidates of `task_type` whose trust reaches
/// `min_trust`, in input order.
pub fn prune<'a>(cands: &'a [Candidate], task_type: pb::TaskType, c: &Constraints) -> Vec<&'a Candidate> {
    cands.iter().filter(|a| a.task_type == task_type && a.trust >= c.min_trust).collect()
}

/// Definition 4 metrics of a sequential route: (Π q, Σ L + (m−1)·T, Σ C).
pub fn definition4(members: &[&Candidate], p: &RoutingParams) -> (f64, u64, f64) {
    let quality = members.iter().map(|a| a.quality).product();
    let hops = members.len().saturating_sub(1) as u64;
    let latency = members.iter().map(|a| a.latency_ms).sum::<u64>() + hops * p.transfer_latency_ms;
    let cost = members.iter().map(|a| a.cost).sum();
    (quality, latency, cost)
}

/// The metrics of `members` working together in `pattern` (see [`Pattern`]
/// for each model). The score is computed against q_min = 0: [`route`]
/// rescores against the constraints, which shifts every score by the same
/// β1·q_min and so keeps the order. `Single` uses the first member only and
/// `DraftRefine` the first two (draft, refiner); no members give an empty
/// choice of quality 0.
pub fn compose(pattern: Pattern, members: &[&Candidate], p: &RoutingParams) -> RouteChoice {
    let members = match pattern {
        Pattern::Single => &members[..members.len().min(1)],
        Pattern::DraftRefine => &members[..members.len().min(2)],
        _ => members,
    };
    let t = p.transfer_latency_ms;
    let max_latency = members.iter().map(|a| a.latency_ms).max().unwrap_or(0);
    let cost_sum: f64 = members.iter().map(|a| a.cost).sum();
    let miss_all: f64 = members.iter().map(|a| 1.0 - a.quality).product();
    let (quality, latency_ms, cost) = if members.is_empty() {
        (0.0, 0, 0.0)
    } else {
        match pattern {
            Pattern::Single | Pattern::Pipeline => definition4(members, p),
            Pattern::DraftRefine => match members {
                [d, r] => (
                    1.0 - (1.0 - r.quality) * (1.0 - DRAFT_LIFT * d.quality),
                    d.latency_ms + t + r.latency_ms,
                    cost_sum,
                ),
                _ => definition4(members, p),
            },
            Pattern::ParallelMerge => (1.0 - miss_all, max_latency, cost_sum),
            Pattern::Cascade => {
                let (mut reach, mut cost, mut latency) = (1.0, 0.0, 0.0);
                for (i, a) in members.iter().enumerate() {
                    cost += reach * a.cost;
                    latency += reach * (a.latency_ms + if i > 0 { t } else { 0 }) as f64;
                    reach *= 1.0 - a.quality;
                }
                (1.0 - miss_all, latency.round() as u64, cost)
            }
            Pattern::Ensemble => (majority(members.iter().map(|a| a.quality)), max_latency, cost_sum),
        }
    };
    RouteChoice {
        pattern,
        agents: members.iter().map(|a| a.agent.clone()).collect(),
        quality,
        latency_ms,
        cost,
        score: score(quality, latency_ms, cost, 0.0, p),
    }
}

/// P(more than half of independent voters are right), voter i right with
/// probability q_i (the Poisson-binomial distribution, by dynamic programming).
pub fn majority(qualities: impl IntoIterator<Item = f64>) -> f64 {
    // dist[k] = P(exactly k right so far).
    let mut dist = vec![1.0];
    for q in qualities {
        let mut next = vec![0.0; dist.len() + 1];
        for (k, p) in dist.iter().enumerate() {
            next[k] += p * (1.0 - q);
            next[k + 1] += p * q;
        }
        dist = next;
    }
    let n = dist.len() - 1;
    dist.iter().enumerate().filter(|(k, _)| 2 * k > n).map(|(_, p)| p).sum()
}
