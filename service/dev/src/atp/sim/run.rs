//! [`run`]: every strategy on the same seeded world.

use std::collections::BTreeMap;

use rand::rngs::StdRng;
use rand::SeedableRng;

use super::config::ContextSample;
use super::config::SimConfig;
use super::config::PLANNER;
use super::ctx::AtpState;
use super::ctx::Ctx;
use super::ctx::Tally;
use super::report::AblationRow;
use super::report::Report;
use super::report::StrategyReport;
use super::strategy::Kind;
use super::strategy::Layers;
use super::strategy::ABLATION;
use super::world::build_world;
use super::world::Tier;
use super::world::World;
use scd_atp::fault::{BreakerParams, CircuitBreakers, HealthMonitor};
use scd_atp::routing::{Repricer, RepricerParams};
use scd_atp::trust::{TrustBook, TrustParams};
use scd_atp::{Error, Result};

/// Runs every strategy on the same seeded world. Fails if `samples` is empty
/// or a sample is impossible (no full tokens, or more sent than full).
pub fn run(cfg: &SimConfig, samples: &[ContextSample]) -> Result<Report> {
    if samples.is_empty() {
        return Err(Error::Invalid {
            field: "context samples".into(),
            reason:
                "none given (the simulation draws context efficiency from measured SCD transfers; at least 1 is needed)"
                    .into(),
        });
    }
    for (i, s) in samples.iter().enumerate() {
        if s.full_tokens == 0 || s.sent_tokens > s.full_tokens {
            return Err(Error::Invalid {
                field: format!("samples[{i}]"),
                reason: format!(
                    "full_tokens {} / sent_tokens {}: need full_tokens ≥ 1 and sent_tokens ≤ full_tokens",
                    s.full_tokens, s.sent_tokens
                ),
            });
        }
    }
    if cfg.agents < 4 {
        return Err(Error::Invalid {
            field: "agents".into(),
            reason: format!("{} (at least 4: one per task type)", cfg.agents),
        });
    }
    let ratios: Vec<f64> = samples.iter().map(|s| s.sent_tokens as f64 / s.full_tokens as f64).collect();
    let mut rng = StdRng::seed_from_u64(cfg.seed);
    let world = build_world(cfg, samples, &mut rng);
    let strategies: Vec<StrategyReport> =
        [Kind::Sequential, Kind::RoundRobin, Kind::Broadcast, Kind::Atp(Layers::Full)]
            .into_iter()
            .enumerate()
            .map(|(k, kind)| simulate(cfg, &world, &ratios, kind, k))
            .collect();
    // every ATP variant draws from full ATP's seed, so a row differs from
    // the full one by its layer rather than by its luck (the draws stay in
    // step while the rows make the same calls, and part once they differ)
    let ablation = ABLATION
        .iter()
        .map(|&(layers, label, paper)| {
            let report = match layers {
                Layers::Full => StrategyReport { strategy: label.into(), ..strategies[3].clone() },
                _ => simulate(cfg, &world, &ratios, Kind::Atp(layers), 3),
            };
            AblationRow { paper_cost: paper.map(|p| p.0), paper_quality: paper.map(|p| p.1), report }
        })
        .collect();
    Ok(Report {
        config: cfg.clone(),
        samples: samples.len(),
        sample_mean_ratio: ratios.iter().sum::<f64>() / ratios.len() as f64,
        trust: "trust::TrustBook (Definition 3 per task type over the planner's interaction proofs, prior 0.5 below 3), recomputed with the routing table".into(),
        over_advertisers: world.agents.iter().filter(|a| a.tier == Tier::OverAdvertiser).count(),
        strategies,
        ablation,
    })
}

/// One strategy on `world`, its random draws seeded by `k` (a strategy's
/// place in the table).
fn simulate(cfg: &SimConfig, world: &World, ratios: &[f64], kind: Kind, k: usize) -> StrategyReport {
    let mut ctx = Ctx {
        cfg,
        world,
        ratios: ratios.to_vec(),
        rng: StdRng::seed_from_u64(cfg.seed ^ (0x9e37_79b9_7f4a_7c15u64.wrapping_mul(k as u64 + 1))),
        pick_rng: StdRng::seed_from_u64(cfg.seed ^ 0x5eed_f00d),
        tally: Tally::default(),
        rr: BTreeMap::new(),
        atp: AtpState {
            monitor: HealthMonitor::new(),
            breakers: CircuitBreakers::new(BreakerParams { failures_to_open: 3, cool_down_ms: 30_000 }),
            repricer: Repricer::new(RepricerParams::default()),
            book: TrustBook::new(TrustParams::default(), PLANNER),
            pending: Vec::new(),
            trust: BTreeMap::new(),
            stale: true,
            nonce: 0,
            reprices: 0,
        },
    };
    let mut qualities = Vec::with_capacity(world.tasks.len());
    for spec in &world.tasks {
        match ctx.task(kind, spec) {
            Some((latency, q)) => {
                ctx.tally.completed += 1;
                ctx.tally.latencies_ms.push(latency as f64);
                ctx.tally.quality_sum += q;
                qualities.push(q);
            }
            None => {
                ctx.tally.lost += 1;
                qualities.push(0.0);
            }
        }
    }
    let t = &mut ctx.tally;
    let n = world.tasks.len().max(1) as f64;
    t.latencies_ms.sort_by(f64::total_cmp);
    let mean = |v: &[f64]| if v.is_empty() { 0.0 } else { v.iter().sum::<f64>() / v.len() as f64 };
    let report = StrategyReport {
        strategy: kind.name().into(),
        tasks: world.tasks.len(),
        completed: t.completed,
        lost: t.lost,
        cost_per_task: t.cost / n,
        token_cost_per_task: t.token_cost / n,
        latency_s: mean(&t.latencies_ms) / 1_000.0,
        latency_p95_s: t
            .latencies_ms
            .get(((t.latencies_ms.len().max(1) - 1) as f64 * 0.95).round() as usize)
            .map_or(0.0, |v| v / 1_000.0),
        quality: if t.completed == 0 { 0.0 } else { t.quality_sum / t.completed as f64 },
        quality_lost_as_zero: mean(&qualities),
        failures: t.failures,
        recovery_s: if t.recoveries_ms.is_empty() { None } else { Some(mean(&t.recoveries_ms) / 1_000.0) },
        context_efficiency: if t.full == 0 { 0.0 } else { t.sent as f64 / t.full as f64 },
        tokens_sent: t.sent,
        tokens_full: t.full,
        over_advertiser_share: if t.calls == 0 { 0.0 } else { t.over_calls as f64 / t.calls as f64 },
        reprices: ctx.atp.reprices,
    };
    tracing::debug!(strategy = kind.name(), "simulated");
    report
}
