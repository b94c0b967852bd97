//! ATP economic routing (Algorithm 1, `scd_atp::routing::route`): time per
//! routing decision vs k capability-matched agents, k ∈ {10, 100, 500, 1000}
//! (paper §7.2: < 1 ms for k < 1,000), and n = 10,000 agents of which 10 %
//! match the task type (capability pruning first).
//!
//! Agents are drawn from a fixed seed: quality U[0.5, 1), latency
//! U[20, 2020) ms, cost U[$0.001, $0.301), trust U[0.4, 1) (so all k pass the trust cut); constraints
//! q_min 0.6, l_max 3 s, c_max $0.5, min_trust 0.4, so most pairs whose
//! product quality reaches 0.6 are feasible.
//!
//! Baseline in the same run (`atp_route_full_scan`): the plain O(k²) scan of
//! Algorithm 1 without `route`'s branch and bound (every feasible single and
//! ordered pair scored, the best 64 selected), to show what the bound saves.
//!
//! Run: `cargo bench -p scd-benches --bench atp_routing`

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use scd_atp::pb::TaskType;
use scd_atp::routing::{prune, route, score, Candidate, Constraints, RoutingParams, ROUTE_LIMIT};

const TYPES: [TaskType; 4] =
    [TaskType::CodeGeneration, TaskType::Analysis, TaskType::CreativeWriting, TaskType::DataProcessing];

/// `n` agents; `matched` of them of type Analysis, the rest of other types.
fn network(n: usize, matched: usize, seed: u64) -> Vec<Candidate> {
    let mut state = seed | 1;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state >> 11) as f64 / (1u64 << 53) as f64
    };
    (0..n)
        .map(|i| Candidate {
            agent: format!("did:key:z{i:06}"),
            task_type: if i < matched { TaskType::Analysis } else { TYPES[[0, 2, 3][i % 3]] },
            quality: 0.5 + 0.5 * next(),
            latency_ms: 20 + (next() * 2_000.0) as u64,
            cost: 0.001 + 0.3 * next(),
            trust: 0.4 + 0.6 * next(),
        })
        .collect()
}

/// Algorithm 1 as written: score every feasible single and ordered pair, keep
/// the best `ROUTE_LIMIT` scores.
fn full_scan(cands: &[Candidate], c: &Constraints, p: &RoutingParams) -> Vec<f64> {
    let m = prune(cands, TaskType::Analysis, c);
    let fits = |q: f64, l: u64, cost: f64| q >= c.min_quality && l <= c.max_latency_ms && cost <= c.max_cost;
    let mut scores = Vec::new();
    for (i, a) in m.iter().enumerate() {
        if fits(a.quality, a.latency_ms, a.cost) {
            scores.push(score(a.quality, a.latency_ms, a.cost, c.min_quality, p));
        }
        for (j, b) in m.iter().enumerate() {
            let (q, l, cost) =
                (a.quality * b.quality, a.latency_ms + b.latency_ms + p.transfer_latency_ms, a.cost + b.cost);
            if i != j && fits(q, l, cost) {
                scores.push(score(q, l, cost, c.min_quality, p));
            }
        }
    }
    let k = ROUTE_LIMIT.min(scores.len());
    if k > 0 && k < scores.len() {
        scores.select_nth_unstable_by(k - 1, |a, b| b.total_cmp(a));
    }
    scores.truncate(k);
    scores.sort_by(|a, b| b.total_cmp(a));
    scores
}

fn bench_routing(c: &mut Criterion) {
    let qos = Constraints { min_quality: 0.6, max_latency_ms: 3_000, max_cost: 0.5, min_trust: 0.4 };
    let params = RoutingParams::default();
    let mut g = c.benchmark_group("atp_route");
    for (n, k) in [(10, 10), (100, 100), (500, 500), (1_000, 1_000), (10_000, 1_000)] {
        let cands = network(n, k, 0x5eed + n as u64);
        g.throughput(Throughput::Elements(1));
        g.bench_with_input(BenchmarkId::new(format!("n{n}"), k), &cands, |b, cands| {
            b.iter(|| {
                let routes = route(std::hint::black_box(cands), TaskType::Analysis, &qos, &params);
                assert!(!routes.is_empty() && routes[0].meets(&qos));
                routes
            })
        });
    }
    g.finish();
    let mut g = c.benchmark_group("atp_route_full_scan");
    for (n, k) in [(10, 10), (100, 100), (500, 500), (1_000, 1_000)] {
        let cands = network(n, k, 0x5eed + n as u64);
        // Same answer as `route` (checked once, outside the timing).
        let best: Vec<f64> = route(&cands, TaskType::Analysis, &qos, &params).iter().map(|r| r.score).collect();
        assert_eq!(full_scan(&cands, &qos, &params), best);
        g.bench_with_input(BenchmarkId::new(format!("n{n}"), k), &cands, |b, cands| {
            b.iter(|| {
                let s = full_scan(std::hint::black_box(cands), &qos, &params);
                assert!(!s.is_empty());
                s
            })
        });
    }
    g.finish();
}

criterion_group!(benches, bench_routing);
criterion_main!(benches);
