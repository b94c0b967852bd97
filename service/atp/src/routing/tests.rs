//! Routing's unit tests: the formula, Algorithm 1, the patterns, plans and
//! the repricer.

use super::*;
use crate::pb;
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
    let cands: Vec<Candidate> = (0..40).map(|i| cand(&format!("a{i:02}"), 0.5 + i as f64 / 100.0, 100, 0.01)).collect();
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
            for m in [vec![*a]].into_iter().chain(matched.iter().filter(|b| b.agent != a.agent).map(|b| vec![*a, *b])) {
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
    close(majority([q1, q2, q3]), q1 * q2 * q3 + q1 * q2 * (1.0 - q3) + q1 * (1.0 - q2) * q3 + (1.0 - q1) * q2 * q3);
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
    assert_eq!((routes[0].pattern, routes[0].agents.clone()), (Pattern::Cascade, vec!["cheap".into(), "mid".into()]));
    assert!((routes[0].cost - 0.04).abs() < 1e-12);
    // the patterns allowed are the ones chosen among: a cascade from the
    // cheap agent is cheaper still in expectation (0.01 + 0.3·0.10)
    let routes = route_composites(&cands, Analysis, &c, &params(), &[Pattern::Cascade]);
    assert_eq!((routes[0].pattern, routes[0].agents.clone()), (Pattern::Cascade, vec!["cheap".into(), "mid".into()]));
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
        let c =
            Constraints { min_quality: rng.random_range(0.5..0.99), max_cost: rng.random_range(0.05..0.5), ..loose() };
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
        [Stage::Call { agent: "a0".into(), role: Role::Draft }, Stage::Call { agent: "a1".into(), role: Role::Refine }]
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
    assert!(matches!(&plan(&r(Pattern::ParallelMerge, 2)).stages[..], [Stage::Parallel { merge: Merge::Best, .. }]));
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
        Observation { agent: "did:key:zs".into(), task_type: CodeGeneration, quality: 0.7, latency_ms: 42, cost: 0.3 }
    );
}
