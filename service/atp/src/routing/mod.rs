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

mod constants;
mod model;
mod reprice;
mod search;
mod stages;
#[cfg(test)]
mod tests;

pub use constants::{
    CASCADE_MIN_CONFIDENCE, COST_CHANGE, DRAFT_LIFT, QUALITY_CHANGE, REPRICE_INTERVAL_MS, ROUTE_LIMIT,
};
pub use model::{
    compose, definition4, majority, prune, score, Candidate, Constraints, Pattern, RouteChoice, RoutingParams,
};
pub use reprice::{Estimate, Observation, RepriceReason, Repricer, RepricerParams, MAX_BASELINES};
pub use search::{route, route_composites, route_patterns};
pub use stages::{plan, Merge, Plan, Role, Stage};
