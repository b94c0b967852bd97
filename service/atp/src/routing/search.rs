//! Algorithm 1 and its pattern search: prune, score, keep the best routes
//! (an exact branch-and-bound over pairs).

use std::cmp::{Ordering, Reverse};
use std::collections::BinaryHeap;

use super::constants::ROUTE_LIMIT;
use super::model::{compose, definition4, prune, score, Candidate, Constraints, Pattern, RouteChoice, RoutingParams};
use crate::pb;

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
