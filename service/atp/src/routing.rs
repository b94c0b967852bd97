//! Layer 4: economic routing (paper §7).
//!
//! [`route`] is Algorithm 1: prune the network to the capability-matched
//! agents (the task's type, trust ≥ `min_trust`), keep every single agent and
//! every ordered two-agent (draft → refine) route that meets the constraints,
//! score each with
//!
//! ```text
//! score(R) = −Cost(R) + β1·(Quality(R) − q_min) − β2·Latency_ms(R)
//! ```
//!
//! and return them best first. Route metrics follow Definition 4: quality is
//! the product of the members' qualities, latency the sum plus the transfer
//! latency of each hop, cost the sum. Under Definition 4 a pair is never of
//! higher quality than either member, so it only wins when it is cheaper or
//! faster at a quality that still meets `q_min`; that is the paper's rule and
//! [`route`] keeps it. [`compose`] gives each composite pattern of §7.4 its own
//! model (see [`Pattern`]), and [`route_patterns`] searches with those models.
//!
//! [`plan`] turns a chosen route into executable stages; [`Repricer`] follows
//! §7.3 (EWMA of observed quality, latency and cost from interaction proofs;
//! recompute every 60 s, on agent failure, a cost change > 10 % or a quality
//! change > 5 %).
//!
//! ```
//! use scd_atp::pb::TaskType;
//! use scd_atp::routing::{route, Candidate, Constraints, Pattern, RoutingParams};
//!
//! let cand = |agent: &str, quality, latency_ms, cost| Candidate {
//!     agent: agent.into(), task_type: TaskType::Analysis, quality, latency_ms, cost, trust: 0.9,
//! };
//! let cands = [cand("cheap", 0.80, 200, 0.01), cand("good", 0.95, 400, 0.10)];
//! let c = Constraints { min_quality: 0.75, max_latency_ms: 1_000, max_cost: 1.0, min_trust: 0.5 };
//! let routes = route(&cands, TaskType::Analysis, &c, &RoutingParams::default());
//! assert_eq!(routes[0].pattern, Pattern::Single);
//! assert_eq!(routes[0].agents, ["good"]);
//! ```

use std::cmp::{Ordering, Reverse};
use std::collections::{BinaryHeap, HashMap};

use sha2::{Digest, Sha256};

use crate::pb;
use crate::{Error, Result};

/// The most routes [`route`] and [`route_patterns`] return (best first).
/// Algorithm 1 needs only the argmax; the rest are failover alternatives.
pub const ROUTE_LIMIT: usize = 64;

/// §7.3: routes are recomputed at least this often.
pub const REPRICE_INTERVAL_MS: u64 = 60_000;

/// §7.3: a relative cost change above this triggers repricing.
pub const COST_CHANGE: f64 = 0.10;

/// §7.3: a relative quality change above this triggers repricing.
pub const QUALITY_CHANGE: f64 = 0.05;

/// Draft-refine model: the share of the refiner's residual error a perfect
/// draft removes (see [`Pattern::DraftRefine`]). Our choice, not the paper's.
pub const DRAFT_LIFT: f64 = 0.5;

/// Cascade plans escalate when the answering agent's confidence is below this.
pub const CASCADE_MIN_CONFIDENCE: f64 = 0.7;

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

/// A heap entry: a route by member indices, ordered so that "greater" is
/// better (score, then fewer agents, then lower cost, then agent names).
struct Ranked<'a> {
    score: f64,
    cost: f64,
    members: [Option<&'a Candidate>; 2],
}

impl Ranked<'_> {
    fn len(&self) -> usize {
        self.members.iter().flatten().count()
    }
}

impl Ord for Ranked<'_> {
    fn cmp(&self, o: &Self) -> Ordering {
        self.score
            .total_cmp(&o.score)
            .then_with(|| o.len().cmp(&self.len()))
            .then_with(|| o.cost.total_cmp(&self.cost))
            .then_with(|| {
                let names = |r: &Self| r.members.map(|m| m.map(|c| c.agent.as_str()));
                names(o).cmp(&names(self))
            })
    }
}
impl PartialOrd for Ranked<'_> {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl PartialEq for Ranked<'_> {
    fn eq(&self, o: &Self) -> bool {
        self.cmp(o) == Ordering::Equal
    }
}
impl Eq for Ranked<'_> {}

/// Keeps the `ROUTE_LIMIT` best entries.
struct TopK<'a>(BinaryHeap<Reverse<Ranked<'a>>>);

impl<'a> TopK<'a> {
    fn worst_score(&self) -> f64 {
        if self.0.len() < ROUTE_LIMIT {
            f64::NEG_INFINITY
        } else {
            self.0.peek().map_or(f64::NEG_INFINITY, |r| r.0.score)
        }
    }
    fn push(&mut self, r: Ranked<'a>) {
        if self.0.len() < ROUTE_LIMIT {
            self.0.push(Reverse(r));
        } else if self.0.peek().is_some_and(|w| r > w.0) {
            self.0.pop();
            self.0.push(Reverse(r));
        }
    }
    fn best_first(self) -> Vec<Ranked<'a>> {
        let mut v: Vec<Ranked<'a>> = self.0.into_iter().map(|r| r.0).collect();
        v.sort_by(|a, b| b.cmp(a));
        v
    }
}

/// Algorithm 1 (§7.2) with capability pruning: every capability-matched agent
/// that meets the constraints alone, and every ordered pair (a, b), a ≠ b, of
/// matched agents whose Definition 4 metrics meet them (labelled
/// [`Pattern::DraftRefine`], as in the paper), scored and returned best first
/// (at most [`ROUTE_LIMIT`]; ties: fewer agents, then lower cost, then agent
/// names). O(k²) in the k matched agents at worst; an exact branch and bound
/// skips every agent whose best conceivable pair could not be kept, so
/// usually far fewer pairs are scored (same result as the full O(k²) scan).
pub fn route(cands: &[Candidate], task_type: pb::TaskType, c: &Constraints, p: &RoutingParams) -> Vec<RouteChoice> {
    let matched = prune(cands, task_type, c);
    let mut top = TopK(BinaryHeap::with_capacity(ROUTE_LIMIT + 1));
    let fits = |q: f64, l: u64, cost: f64| q >= c.min_quality && l <= c.max_latency_ms && cost <= c.max_cost;
    for a in &matched {
        if fits(a.quality, a.latency_ms, a.cost) {
            top.push(Ranked {
                score: score(a.quality, a.latency_ms, a.cost, c.min_quality, p),
                cost: a.cost,
                members: [Some(a), None],
            });
        }
    }
    // A pair's quality is at most each member's (qualities in [0, 1]), so only
    // agents that could meet q_min, the latency and the cost alone can pair.
    let pairable: Vec<&Candidate> = matched
        .iter()
        .copied()
        .filter(|a| a.quality >= c.min_quality && a.latency_ms <= c.max_latency_ms && a.cost <= c.max_cost)
        .collect();
    // Exact branch and bound: the best pair `a` could start uses the highest
    // quality, lowest latency and lowest cost of any partner; when even that
    // cannot enter the kept routes, no pair starting with `a` can.
    let q_max = pairable.iter().map(|b| b.quality).fold(f64::NEG_INFINITY, f64::max);
    let l_min = pairable.iter().map(|b| b.latency_ms).min().unwrap_or(0);
    let c_min = pairable.iter().map(|b| b.cost).fold(f64::INFINITY, f64::min);
    for (i, a) in pairable.iter().enumerate() {
        let bound =
            score(a.quality * q_max, a.latency_ms + l_min + p.transfer_latency_ms, a.cost + c_min, c.min_quality, p);
        if p.beta1 >= 0.0 && p.beta2 >= 0.0 && bound < top.worst_score() {
            continue;
        }
        for (j, b) in pairable.iter().enumerate() {
            if i == j || a.agent == b.agent {
                continue;
            }
            let q = a.quality * b.quality;
            let l = a.latency_ms + b.latency_ms + p.transfer_latency_ms;
            let cost = a.cost + b.cost;
            if !fits(q, l, cost) {
                continue;
            }
            let s = score(q, l, cost, c.min_quality, p);
            if s < top.worst_score() {
                continue;
            }
            top.push(Ranked { score: s, cost, members: [Some(a), Some(b)] });
        }
    }
    top.best_first()
        .into_iter()
        .map(|r| {
            let members: Vec<&Candidate> = r.members.iter().flatten().copied().collect();
            let (quality, latency_ms, cost) = definition4(&members, p);
            RouteChoice {
                pattern: if members.len() == 1 { Pattern::Single } else { Pattern::DraftRefine },
                agents: members.iter().map(|a| a.agent.clone()).collect(),
                quality,
                latency_ms,
                cost,
                score: r.score,
            }
        })
        .collect()
}

/// Algorithm 1 with [`compose`]'s pattern models instead of Definition 4 for
/// every pair: single agents, draft-refine, parallel-merge, cascade (cheaper
/// agent first) and pipeline over ordered pairs, and ensembles of the three
/// best single agents. Best first, at most [`ROUTE_LIMIT`].
pub fn route_patterns(
    cands: &[Candidate],
    task_type: pb::TaskType,
    c: &Constraints,
    p: &RoutingParams,
) -> Vec<RouteChoice> {
    best_first(pattern_routes(cands, task_type, c, p, |_| true))
}

/// The routes Algorithm 1 chooses among when composites are allowed where
/// Theorem 4's condition holds: every single agent that meets the
/// constraints, and every route of the `composites` patterns (pattern models
/// of [`compose`]) that meets them for less than C_best, the cheapest single
/// agent that does (every composite that meets them when no single agent
/// does). A composite that costs C_best or more is never kept, so choosing a
/// composite never costs more than the cheapest single route that would do;
/// without a cheaper composite the choice is among single agents alone, as
/// the theorem's equality case has it. Under Definition 4 ([`route`]) a pair
/// meets q_min only when both members do alone, at a lower cost each, so no
/// pair ever passes this test: the pattern models are what make composites
/// choosable. Scored by the objective and returned best first (at most
/// [`ROUTE_LIMIT`]).
pub fn route_composites(
    cands: &[Candidate],
    task_type: pb::TaskType,
    c: &Constraints,
    p: &RoutingParams,
    composites: &[Pattern],
) -> Vec<RouteChoice> {
    let allowed = |pattern: Pattern| pattern == Pattern::Single || composites.contains(&pattern);
    let mut all = pattern_routes(cands, task_type, c, p, allowed);
    let c_best = all.iter().filter(|r| r.pattern == Pattern::Single).map(|r| r.cost).fold(f64::INFINITY, f64::min);
    all.retain(|r| r.pattern == Pattern::Single || r.cost < c_best);
    best_first(all)
}

/// Every route of an `allowed` pattern over the capability-matched agents
/// that meets the constraints, scored, in no order.
fn pattern_routes(
    cands: &[Candidate],
    task_type: pb::TaskType,
    c: &Constraints,
    p: &RoutingParams,
    allowed: impl Fn(Pattern) -> bool,
) -> Vec<RouteChoice> {
    let matched = prune(cands, task_type, c);
    let mut all: Vec<RouteChoice> = Vec::new();
    let mut keep = |pattern: Pattern, members: &[&Candidate]| {
        if !allowed(pattern) {
            return;
        }
        let mut r = compose(pattern, members, p);
        if r.meets(c) {
            r.score = score(r.quality, r.latency_ms, r.cost, c.min_quality, p);
            all.push(r);
        }
    };
    for a in &matched {
        keep(Pattern::Single, &[a]);
    }
    for a in &matched {
        for b in &matched {
            if a.agent == b.agent {
                continue;
            }
            keep(Pattern::DraftRefine, &[a, b]);
            keep(Pattern::Pipeline, &[a, b]);
            if a.cost <= b.cost {
                keep(Pattern::Cascade, &[a, b]);
            }
            if a.agent < b.agent {
                keep(Pattern::ParallelMerge, &[a, b]);
            }
        }
    }
    let mut by_quality = matched.clone();
    by_quality.sort_by(|a, b| b.quality.total_cmp(&a.quality).then_with(|| a.agent.cmp(&b.agent)));
    if by_quality.len() >= 3 {
        keep(Pattern::Ensemble, &by_quality[..3]);
    }
    all
}

/// Routes by score, best first (ties: fewer agents, lower cost, pattern,
/// agent names), at most [`ROUTE_LIMIT`].
fn best_first(mut all: Vec<RouteChoice>) -> Vec<RouteChoice> {
    all.sort_by(|a, b| {
        b.score
            .total_cmp(&a.score)
            .then_with(|| a.agents.len().cmp(&b.agents.len()))
            .then_with(|| a.cost.total_cmp(&b.cost))
            .then_with(|| a.pattern.cmp(&b.pattern))
            .then_with(|| a.agents.cmp(&b.agents))
    });
    all.truncate(ROUTE_LIMIT);
    all
}

/// What an agent contributes in a sequential stage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Answers the task alone.
    Answer,
    /// Writes a draft for the next stage.
    Draft,
    /// Refines the previous stage's draft into the answer.
    Refine,
    /// One step of a pipeline: its output is the next stage's input.
    Step,
}

/// How the results of a parallel stage become one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Merge {
    /// Keep the best result (parallel-merge).
    Best,
    /// The majority answer wins (ensemble).
    MajorityVote,
}

/// One executable step of a [`Plan`].
#[derive(Debug, Clone, PartialEq)]
pub enum Stage {
    /// Send the task (and the previous stage's output) to one agent.
    Call {
        /// The agent.
        agent: String,
        /// What it contributes.
        role: Role,
    },
    /// Send the same input to all agents at once, then merge.
    Parallel {
        /// The agents.
        agents: Vec<String>,
        /// How results are combined.
        merge: Merge,
    },
    /// Ask `agent`; stop if its confidence reaches `min_confidence`, else go
    /// on to the next stage.
    Escalate {
        /// The agent.
        agent: String,
        /// Below this the task moves on.
        min_confidence: f64,
    },
}

/// An executable route: stages run in order.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// The route's pattern.
    pub pattern: Pattern,
    /// The stages.
    pub stages: Vec<Stage>,
}

/// The stages that execute a route: sequential calls (single, draft-refine,
/// pipeline), one parallel stage with a merge (parallel-merge) or a vote
/// (ensemble), or escalate-on-low-confidence steps ending in a call (cascade).
pub fn plan(r: &RouteChoice) -> Plan {
    let call = |agent: &String, role| Stage::Call { agent: agent.clone(), role };
    let n = r.agents.len();
    let stages = match r.pattern {
        Pattern::Single => r.agents.iter().take(1).map(|a| call(a, Role::Answer)).collect(),
        Pattern::DraftRefine => r
            .agents
            .iter()
            .enumerate()
            .map(|(i, a)| call(a, if i + 1 == n { Role::Refine } else { Role::Draft }))
            .collect(),
        Pattern::Pipeline => r.agents.iter().map(|a| call(a, Role::Step)).collect(),
        Pattern::ParallelMerge => vec![Stage::Parallel { agents: r.agents.clone(), merge: Merge::Best }],
        Pattern::Ensemble => vec![Stage::Parallel { agents: r.agents.clone(), merge: Merge::MajorityVote }],
        Pattern::Cascade => r
            .agents
            .iter()
            .enumerate()
            .map(|(i, a)| {
                if i + 1 == n {
                    call(a, Role::Answer)
                } else {
                    Stage::Escalate { agent: a.clone(), min_confidence: CASCADE_MIN_CONFIDENCE }
                }
            })
            .collect(),
    };
    Plan { pattern: r.pattern, stages }
}

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
    baseline: HashMap<Key, (f64, f64)>,
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

#[cfg(test)]
mod tests {
    use super::*;
    use pb::TaskType::{Analysis, CodeGeneration};
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    fn cand(agent: &str, quality: f64, latency_ms: u64, cost: f64) -> Candidate {
        Candidate { agent: agent.into(), task_type: Analysis, quality, latency_ms, cost, trust: 0.9 }
    }
    fn loose() -> Constraints {
        Constraints { min_quality: 0.0, max_latency_ms: u64::MAX, max_cost: f64::INFINITY, min_trust: 0.0 }
    }
    fn params() -> RoutingParams {
        RoutingParams { beta1: 1.0, beta2: 0.001, transfer_latency_ms: 10 }
    }
    fn close(a: f64, b: f64) {
        assert!((a - b).abs() < 1e-9, "{a} != {b}");
    }

    #[test]
    fn score_follows_the_formula() {
        // −0.2 + 2·(0.9 − 0.7) − 0.001·300 = −0.2 + 0.4 − 0.3 = −0.1
        let p = RoutingParams { beta1: 2.0, beta2: 0.001, transfer_latency_ms: 0 };
        close(score(0.9, 300, 0.2, 0.7, &p), -0.1);
    }

    #[test]
    fn definition4_multiplies_quality_and_adds_latency_and_cost() {
        let (a, b, c) = (cand("a", 0.9, 100, 0.1), cand("b", 0.8, 200, 0.2), cand("c", 0.5, 50, 0.05));
        let (q, l, cost) = definition4(&[&a, &b, &c], &params());
        close(q, 0.9 * 0.8 * 0.5);
        assert_eq!(l, 100 + 200 + 50 + 2 * 10);
        close(cost, 0.35);
        let pipe = compose(Pattern::Pipeline, &[&a, &b, &c], &params());
        assert_eq!((pipe.quality, pipe.latency_ms, pipe.cost), (q, l, cost));
    }

    #[test]
    fn route_pairs_use_definition4_and_the_constraints() {
        let cands = [cand("a", 0.9, 100, 0.1), cand("b", 0.8, 200, 0.2)];
        let routes = route(&cands, Analysis, &loose(), &params());
        // 2 singles + 2 ordered pairs.
        assert_eq!(routes.len(), 4);
        let ab = routes.iter().find(|r| r.agents == ["a", "b"]).unwrap();
        assert_eq!(ab.pattern, Pattern::DraftRefine);
        close(ab.quality, 0.72);
        assert_eq!(ab.latency_ms, 310);
        close(ab.cost, 0.3);
        close(ab.score, -0.3 + 0.72 - 0.31);
        // Tighten each constraint in turn: the pair (q 0.72, 310 ms, $0.30) drops out.
        for c in [
            Constraints { min_quality: 0.75, ..loose() },
            Constraints { max_latency_ms: 300, ..loose() },
            Constraints { max_cost: 0.25, ..loose() },
        ] {
            let routes = route(&cands, Analysis, &c, &params());
            assert!(routes.iter().all(|r| r.agents.len() == 1), "{c:?}: {routes:?}");
            assert!(routes.iter().all(|r| r.meets(&c)));
        }
        // A single agent past a limit is out as well.
        let c = Constraints { max_latency_ms: 150, ..loose() };
        let routes = route(&cands, Analysis, &c, &params());
        assert_eq!(routes.iter().map(|r| r.agents.clone()).collect::<Vec<_>>(), [vec!["a".to_string()]]);
    }

    #[test]
    fn pruning_drops_other_types_and_untrusted_agents() {
        let mut other = cand("other-type", 0.99, 10, 0.0);
        other.task_type = CodeGeneration;
        let mut shady = cand("untrusted", 0.99, 10, 0.0);
        shady.trust = 0.3;
        let cands = [other, shady, cand("ok", 0.6, 100, 0.1)];
        let c = Constraints { min_trust: 0.5, ..loose() };
        assert_eq!(prune(&cands, Analysis, &c).len(), 1);
        let routes = route(&cands, Analysis, &c, &params());
        assert_eq!(routes.len(), 1);
        assert_eq!(routes[0].agents, ["ok"]);
        // No candidate of the type at all: no route.
        assert!(route(&cands, pb::TaskType::DataProcessing, &c, &params()).is_empty());
    }

    #[test]
    fn argmax_matches_a_hand_computed_example() {
        // β1 = 1, β2 = 0.001, T = 10 ms, q_min = 0.5.
        // x: −0.05 + (0.70 − 0.5) − 0.10 = 0.050
        // y: −0.30 + (0.95 − 0.5) − 0.20 = −0.050
        // z: −0.01 + (0.60 − 0.5) − 0.05 = 0.040
        // x→z: q 0.42 < 0.5, out. y→x: q 0.665, −0.35 + 0.165 − 0.31 = −0.495 …
        let cands = [cand("x", 0.70, 100, 0.05), cand("y", 0.95, 200, 0.30), cand("z", 0.60, 50, 0.01)];
        let c = Constraints { min_quality: 0.5, ..loose() };
        let routes = route(&cands, Analysis, &c, &params());
        assert_eq!(routes[0].agents, ["x"]);
        close(routes[0].score, 0.05);
        assert_eq!(routes[1].agents, ["z"]);
        close(routes[1].score, 0.04);
        assert_eq!(routes[2].agents, ["y"]);
        // Scores never increase down the list; every route meets the constraints.
        assert!(routes.windows(2).all(|w| w[0].score >= w[1].score));
        assert!(routes.iter().all(|r| r.meets(&c)));
    }

    #[test]
    fn ties_are_broken_deterministically() {
        let cands = [cand("b", 0.8, 100, 0.1), cand("a", 0.8, 100, 0.1)];
        let routes = route(&cands, Analysis, &loose(), &params());
        assert_eq!(routes[0].agents, ["a"]);
        assert_eq!(routes[1].agents, ["b"]);
        let swapped = [cands[1].clone(), cands[0].clone()];
        assert_eq!(route(&swapped, Analysis, &loose(), &params()), routes);
    }

    #[test]
    fn route_returns_at_most_the_limit_and_keeps_the_best() {
        let cands: Vec<Candidate> =
            (0..40).map(|i| cand(&format!("a{i:02}"), 0.5 + i as f64 / 100.0, 100, 0.01)).collect();
        let routes = route(&cands, Analysis, &loose(), &params());
        assert_eq!(routes.len(), ROUTE_LIMIT);
        // The best is the highest-quality single agent.
        assert_eq!(routes[0].agents, ["a39"]);
        // Exhaustive check: no route outside the list beats the last one kept.
        let last = routes.last().unwrap().score;
        let mut all = Vec::new();
        for a in &cands {
            for b in &cands {
                if a.agent != b.agent {
                    let (q, l, c) = definition4(&[a, b], &params());
                    all.push(score(q, l, c, 0.0, &params()));
                }
            }
            all.push(score(a.quality, a.latency_ms, a.cost, 0.0, &params()));
        }
        all.sort_by(|a, b| b.total_cmp(a));
        close(all[ROUTE_LIMIT - 1], last);
    }

    #[test]
    fn branch_and_bound_equals_the_full_scan() {
        // Seeded; random networks, q_min low enough that many pairs qualify.
        let mut rng = StdRng::seed_from_u64(0x9e37_79b9_7f4a_7c15);
        let mut next = move || -> f64 { rng.random() };
        for round in 0..20 {
            let k = 5 + round * 7;
            let cands: Vec<Candidate> = (0..k)
                .map(|i| Candidate {
                    quality: 0.5 + 0.5 * next(),
                    latency_ms: 20 + (next() * 2_000.0) as u64,
                    cost: 0.001 + 0.3 * next(),
                    trust: next(),
                    ..cand(&format!("a{i:03}"), 0.0, 0, 0.0)
                })
                .collect();
            let c = Constraints { min_quality: 0.45, max_latency_ms: 3_000, max_cost: 0.5, min_trust: 0.2 };
            let p = RoutingParams { beta1: 0.2 + next(), beta2: 1e-4 * next(), transfer_latency_ms: 30 };
            let matched = prune(&cands, Analysis, &c);
            let mut all: Vec<RouteChoice> = Vec::new();
            for a in &matched {
                for m in
                    [vec![*a]].into_iter().chain(matched.iter().filter(|b| b.agent != a.agent).map(|b| vec![*a, *b]))
                {
                    let (q, l, cost) = definition4(&m, &p);
                    let r = RouteChoice {
                        pattern: if m.len() == 1 { Pattern::Single } else { Pattern::DraftRefine },
                        agents: m.iter().map(|x| x.agent.clone()).collect(),
                        quality: q,
                        latency_ms: l,
                        cost,
                        score: score(q, l, cost, c.min_quality, &p),
                    };
                    if r.meets(&c) {
                        all.push(r);
                    }
                }
            }
            all.sort_by(|a, b| {
                b.score
                    .total_cmp(&a.score)
                    .then_with(|| a.agents.len().cmp(&b.agents.len()))
                    .then_with(|| a.cost.total_cmp(&b.cost))
                    .then_with(|| a.agents.cmp(&b.agents))
            });
            all.truncate(ROUTE_LIMIT);
            assert_eq!(route(&cands, Analysis, &c, &p), all, "round {round}");
        }
    }

    #[test]
    fn draft_refine_lifts_the_refiner() {
        let (d, r) = (cand("d", 0.6, 100, 0.01), cand("r", 0.8, 300, 0.2));
        let dr = compose(Pattern::DraftRefine, &[&d, &r], &params());
        // 1 − (1 − 0.8)(1 − 0.5·0.6) = 1 − 0.2·0.7 = 0.86
        close(dr.quality, 0.86);
        assert!(dr.quality > r.quality);
        assert_eq!(dr.latency_ms, 100 + 10 + 300);
        close(dr.cost, 0.21);
        close(dr.score, -0.21 + 0.86 - 0.41);
    }

    #[test]
    fn parallel_merge_metrics() {
        let (a, b) = (cand("a", 0.6, 100, 0.1), cand("b", 0.7, 300, 0.2));
        let r = compose(Pattern::ParallelMerge, &[&a, &b], &params());
        close(r.quality, 1.0 - 0.4 * 0.3);
        assert_eq!(r.latency_ms, 300);
        close(r.cost, 0.3);
    }

    #[test]
    fn cascade_metrics_are_expectations_over_escalation() {
        let (cheap, big) = (cand("cheap", 0.7, 100, 0.01), cand("big", 0.9, 500, 0.5));
        let r = compose(Pattern::Cascade, &[&cheap, &big], &params());
        // Escalation with probability 0.3.
        close(r.cost, 0.01 + 0.3 * 0.5);
        assert_eq!(r.latency_ms, (100.0 + 0.3 * 510.0_f64).round() as u64);
        close(r.quality, 1.0 - 0.3 * 0.1);
    }

    #[test]
    fn ensemble_uses_the_binomial_majority() {
        let (a, b, c) = (cand("a", 0.8, 100, 0.1), cand("b", 0.8, 200, 0.1), cand("c", 0.8, 300, 0.1));
        let r = compose(Pattern::Ensemble, &[&a, &b, &c], &params());
        // 3q² − 2q³ for q = 0.8
        close(r.quality, 3.0 * 0.64 - 2.0 * 0.512);
        assert_eq!(r.latency_ms, 300);
        close(r.cost, 0.3);
        // Heterogeneous: q1q2q3 + q1q2(1−q3) + q1(1−q2)q3 + (1−q1)q2q3.
        let (q1, q2, q3) = (0.9, 0.7, 0.6);
        close(
            majority([q1, q2, q3]),
            q1 * q2 * q3 + q1 * q2 * (1.0 - q3) + q1 * (1.0 - q2) * q3 + (1.0 - q1) * q2 * q3,
        );
        // A tie is not a majority.
        close(majority([0.5, 0.5]), 0.25);
    }

    #[test]
    fn single_and_empty_compose() {
        let a = cand("a", 0.9, 100, 0.1);
        let r = compose(Pattern::Single, &[&a], &params());
        assert_eq!((r.agents.clone(), r.quality, r.latency_ms, r.cost), (vec!["a".to_string()], 0.9, 100, 0.1));
        let e = compose(Pattern::Pipeline, &[], &params());
        assert!(e.agents.is_empty());
        assert_eq!(e.quality, 0.0);
    }

    #[test]
    fn composites_are_chosen_only_below_the_cheapest_sufficient_single() {
        // q_min 0.85: only "premium" meets it alone (C_best = $0.60); cheap → mid
        // lifted meets it for $0.11 and wins; Theorem 4's condition holds
        let cands = [cand("cheap", 0.7, 100, 0.01), cand("mid", 0.8, 200, 0.10), cand("premium", 0.9, 300, 0.60)];
        let c = Constraints { min_quality: 0.85, ..loose() };
        let routes = route_composites(&cands, Analysis, &c, &params(), &[Pattern::DraftRefine]);
        assert_eq!(
            (routes[0].pattern, routes[0].agents.clone()),
            (Pattern::DraftRefine, vec!["cheap".into(), "mid".into()])
        );
        assert!(routes.iter().all(|r| r.pattern == Pattern::Single || r.cost < 0.6), "{routes:#?}");
        assert!(routes.iter().all(|r| matches!(r.pattern, Pattern::Single | Pattern::DraftRefine)));
        // a single agent that meets q_min for $0.10 leaves no draft-refine,
        // merge or ensemble cheaper than it: the choice is among single agents,
        // as in the equality case
        let enough = [cand("cheap", 0.7, 100, 0.01), cand("mid", 0.86, 200, 0.10), cand("premium", 0.9, 300, 0.60)];
        let spend_more = [Pattern::DraftRefine, Pattern::ParallelMerge, Pattern::Ensemble, Pattern::Pipeline];
        let routes = route_composites(&enough, Analysis, &c, &params(), &spend_more);
        assert!(routes.iter().all(|r| r.pattern == Pattern::Single), "{routes:#?}");
        assert_eq!(routes[0].agents, ["mid"]);
        // a cascade from the cheap agent costs less in expectation (0.01 + 0.3·0.10)
        let routes = route_composites(&enough, Analysis, &c, &params(), &Pattern::ALL);
        assert_eq!(
            (routes[0].pattern, routes[0].agents.clone()),
            (Pattern::Cascade, vec!["cheap".into(), "mid".into()])
        );
        assert!((routes[0].cost - 0.04).abs() < 1e-12);
        // the patterns allowed are the ones chosen among: a cascade from the
        // cheap agent is cheaper still in expectation (0.01 + 0.3·0.10)
        let routes = route_composites(&cands, Analysis, &c, &params(), &[Pattern::Cascade]);
        assert_eq!(
            (routes[0].pattern, routes[0].agents.clone()),
            (Pattern::Cascade, vec!["cheap".into(), "mid".into()])
        );
        // Definition 4 pairs (pipeline) never pass: a product of qualities
        // meets q_min only when each member does alone, for less
        let routes = route_composites(
            &enough,
            Analysis,
            &Constraints { min_quality: 0.5, ..loose() },
            &params(),
            &[Pattern::Pipeline],
        );
        assert!(routes.iter().all(|r| r.pattern == Pattern::Single), "{routes:#?}");
        // no single agent meets q_min 0.95: every composite that does is kept
        let c = Constraints { min_quality: 0.95, ..loose() };
        let routes = route_composites(&cands, Analysis, &c, &params(), &[Pattern::ParallelMerge]);
        assert!(!routes.is_empty() && routes.iter().all(|r| r.pattern == Pattern::ParallelMerge && r.quality >= 0.95));
    }

    #[test]
    fn no_kept_composite_costs_what_a_sufficient_single_costs() {
        // Theorem 4 over random networks: a kept composite always costs less than
        // the cheapest single agent meeting the constraints
        // (at most four agents: 41 routes at most, all within ROUTE_LIMIT)
        let mut rng = StdRng::seed_from_u64(4);
        for _ in 0..300 {
            let cands: Vec<Candidate> = (0..rng.random_range(1..5))
                .map(|i| {
                    let (q, l, cost) =
                        (rng.random_range(0.3..1.0), rng.random_range(10..900), rng.random_range(0.001..0.2));
                    cand(&format!("a{i}"), q, l, cost)
                })
                .collect();
            let c = Constraints {
                min_quality: rng.random_range(0.5..0.99),
                max_cost: rng.random_range(0.05..0.5),
                ..loose()
            };
            let routes = route_composites(&cands, Analysis, &c, &params(), &Pattern::ALL);
            let c_best =
                routes.iter().filter(|r| r.pattern == Pattern::Single).map(|r| r.cost).fold(f64::INFINITY, f64::min);
            for r in &routes {
                assert!(r.meets(&c), "{r:?}");
                assert!(r.pattern == Pattern::Single || r.cost < c_best, "{r:?} vs C_best {c_best}");
            }
            // singles are never crowded out: every sufficient agent is a route
            let singles = cands.iter().filter(|a| a.quality >= c.min_quality && a.cost <= c.max_cost).count();
            assert_eq!(routes.iter().filter(|r| r.pattern == Pattern::Single).count(), singles);
        }
    }

    #[test]
    fn route_patterns_finds_a_cheaper_draft_refine() {
        // q_min 0.85: only "premium" meets it alone; cheap → mid lifted meets it
        // for less (1 − 0.2·(1 − 0.5·0.7) = 0.87 at $0.11 vs $0.60).
        let cands = [cand("cheap", 0.7, 100, 0.01), cand("mid", 0.8, 200, 0.10), cand("premium", 0.9, 300, 0.60)];
        let c = Constraints { min_quality: 0.85, ..loose() };
        let routes = route_patterns(&cands, Analysis, &c, &params());
        assert!(routes.iter().all(|r| r.meets(&c)));
        let best = &routes[0];
        assert!(best.cost < 0.6, "{best:?}");
        assert!(routes.iter().any(|r| r.pattern == Pattern::DraftRefine && r.agents == ["cheap", "mid"]));
        // Plain Algorithm 1 only has the premium agent (every pair's product < 0.85).
        let plain = route(&cands, Analysis, &c, &params());
        assert_eq!(plain.len(), 1);
        assert_eq!(plain[0].agents, ["premium"]);
    }

    #[test]
    fn plan_stages_per_pattern() {
        let r = |pattern, n: usize| RouteChoice {
            pattern,
            agents: (0..n).map(|i| format!("a{i}")).collect(),
            quality: 0.9,
            latency_ms: 1,
            cost: 0.1,
            score: 0.0,
        };
        assert_eq!(
            plan(&r(Pattern::DraftRefine, 2)).stages,
            [
                Stage::Call { agent: "a0".into(), role: Role::Draft },
                Stage::Call { agent: "a1".into(), role: Role::Refine }
            ]
        );
        assert_eq!(
            plan(&r(Pattern::Ensemble, 3)).stages,
            [Stage::Parallel { agents: vec!["a0".into(), "a1".into(), "a2".into()], merge: Merge::MajorityVote }]
        );
        assert_eq!(
            plan(&r(Pattern::Cascade, 2)).stages,
            [
                Stage::Escalate { agent: "a0".into(), min_confidence: CASCADE_MIN_CONFIDENCE },
                Stage::Call { agent: "a1".into(), role: Role::Answer }
            ]
        );
        assert_eq!(plan(&r(Pattern::Single, 1)).stages, [Stage::Call { agent: "a0".into(), role: Role::Answer }]);
        assert!(matches!(
            &plan(&r(Pattern::ParallelMerge, 2)).stages[..],
            [Stage::Parallel { merge: Merge::Best, .. }]
        ));
        assert_eq!(plan(&r(Pattern::Pipeline, 3)).stages.len(), 3);
    }

    #[test]
    fn route_round_trips_through_pb() {
        let r = RouteChoice {
            pattern: Pattern::Cascade,
            agents: vec!["did:key:za".into(), "did:key:zb".into()],
            quality: 0.9,
            latency_ms: 120,
            cost: 0.05,
            score: 1.0,
        };
        let w = pb::Route::from(&r);
        assert_eq!(w.pattern(), pb::RoutingPattern::Cascade);
        assert_eq!(w.ttl_ms, REPRICE_INTERVAL_MS);
        assert_eq!(w.route_id.len(), 16);
        assert_eq!(RouteChoice::from_pb(&w).unwrap(), RouteChoice { score: 0.0, ..r.clone() });
        // Single ↔ UNSPECIFIED.
        assert_eq!(pb::RoutingPattern::from(Pattern::Single), pb::RoutingPattern::Unspecified);
        assert_eq!(Pattern::from(pb::RoutingPattern::Unspecified), Pattern::Single);
        for p in Pattern::ALL {
            assert_eq!(Pattern::from(pb::RoutingPattern::from(p)), p);
        }
        // The id depends on order.
        let rev = RouteChoice { agents: vec!["did:key:zb".into(), "did:key:za".into()], ..r };
        assert_ne!(rev.route_id(), w.route_id);
    }

    #[test]
    fn a_route_without_agents_or_metrics_is_refused() {
        let e = RouteChoice::from_pb(&pb::Route::default()).unwrap_err();
        assert_eq!(e.to_string(), "route.agents: empty (at least 1 agent)");
        let w = pb::Route { agents: vec![pb::AgentId { uuid: "a".into() }], ..Default::default() };
        assert_eq!(RouteChoice::from_pb(&w).unwrap_err().to_string(), "route.metrics: missing");
    }

    fn obs(agent: &str, quality: f64, cost: f64) -> Observation {
        Observation { agent: agent.into(), task_type: Analysis, quality, latency_ms: 100, cost }
    }
    fn instant() -> Repricer {
        // α = 1: the estimate is the last observation, so thresholds are exact.
        Repricer::new(RepricerParams { ewma_alpha: 1.0, ..RepricerParams::default() })
    }

    #[test]
    fn baselines_of_unobserved_agents_are_bounded() {
        let mut r = instant();
        r.observe(&obs("seen", 0.8, 1.0));
        for i in 0..MAX_BASELINES + 10 {
            r.repriced(0, &[cand(&format!("fresh-{i}"), 0.8, 100, 1.0), cand("seen", 0.9, 100, 1.0)]);
        }
        assert!(r.baseline.len() <= MAX_BASELINES, "{}", r.baseline.len());
        assert!(r.baseline.contains_key(&("seen".to_string(), Analysis as i32)), "an observed agent's stays");
    }

    #[test]
    fn cost_change_over_ten_percent_triggers() {
        let mut r = instant();
        r.repriced(0, &[cand("a", 0.8, 100, 1.0)]);
        assert_eq!(r.observe(&obs("a", 0.8, 1.09)), None);
        assert_eq!(r.observe(&obs("a", 0.8, 0.91)), None);
        assert!(matches!(r.observe(&obs("a", 0.8, 1.11)), Some(RepriceReason::CostChanged { to, .. }) if to == 1.11));
        assert!(matches!(r.observe(&obs("a", 0.8, 0.89)), Some(RepriceReason::CostChanged { .. })));
    }

    #[test]
    fn quality_change_over_five_percent_triggers() {
        let mut r = instant();
        r.repriced(0, &[cand("a", 0.8, 100, 1.0)]);
        assert_eq!(r.observe(&obs("a", 0.8 * 1.04, 1.0)), None);
        assert_eq!(r.observe(&obs("a", 0.8 * 0.96, 1.0)), None);
        let reason = r.observe(&obs("a", 0.8 * 0.94, 1.0)).unwrap();
        assert!(matches!(reason, RepriceReason::QualityChanged { from, .. } if from == 0.8));
        assert_eq!(reason.to_string(), "quality of a moved 0.800 → 0.752 (limit ±5 %)");
        assert!(r.observe(&obs("a", 0.8 * 1.06, 1.0)).is_some());
        // After repricing with the new figures, the same value is no change.
        r.repriced(1, &[cand("a", 0.8 * 1.06, 100, 1.0)]);
        assert_eq!(r.observe(&obs("a", 0.8 * 1.06, 1.0)), None);
    }

    #[test]
    fn ewma_smooths_observations() {
        let mut r = Repricer::new(RepricerParams::default());
        assert_eq!(r.observe(&obs("a", 1.0, 1.0)), None); // first observation is the baseline
                                                          // One observation of cost 1.2 moves the estimate 0.3 · 20 % = 6 %: no trigger.
        assert_eq!(r.observe(&obs("a", 1.0, 1.2)), None);
        close(r.estimate("a", Analysis).unwrap().cost, 1.06);
        // A second moves it to 1.06 + 0.3·(1.2 − 1.06) = 1.102: > 10 %.
        assert!(matches!(r.observe(&obs("a", 1.0, 1.2)), Some(RepriceReason::CostChanged { .. })));
        let mut cands = [cand("a", 0.5, 999, 9.0), cand("b", 0.5, 999, 9.0)];
        r.apply(&mut cands);
        close(cands[0].cost, 1.102);
        assert_eq!(cands[1].cost, 9.0);
    }

    #[test]
    fn failure_and_interval_trigger() {
        let mut r = Repricer::new(RepricerParams::default());
        assert_eq!(r.due(0), Some(RepriceReason::Interval));
        r.repriced(1_000, &[]);
        assert_eq!(r.due(60_999), None);
        assert_eq!(r.due(61_000), Some(RepriceReason::Interval));
        assert_eq!(r.agent_failed("did:key:zx"), RepriceReason::AgentFailed { agent: "did:key:zx".into() });
    }

    #[test]
    fn observation_from_a_proof() {
        let p = pb::InteractionProof {
            subject: Some(pb::AgentId { uuid: "did:key:zs".into() }),
            task_type: CodeGeneration as i32,
            quality_score: 0.7,
            latency_ms: 42,
            cost: 0.3,
            ..Default::default()
        };
        assert_eq!(
            Observation::from(&p),
            Observation {
                agent: "did:key:zs".into(),
                task_type: CodeGeneration,
                quality: 0.7,
                latency_ms: 42,
                cost: 0.3
            }
        );
    }
}
