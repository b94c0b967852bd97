//! The simulator's unit tests.

use super::*;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::strategy::ABLATION;
use scd_atp::Error;

/// Synthetic samples: contexts of 2k–12k tokens, SCD keeping 10–40 %.
fn samples(n: usize, seed: u64) -> Vec<ContextSample> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..n)
        .map(|_| {
            let full = rng.random_range(2_000..12_000u64);
            let sent = (full as f64 * rng.random_range(0.1..0.4)) as u64;
            ContextSample { full_tokens: full, sent_tokens: sent }
        })
        .collect()
}

fn small(seed: u64) -> SimConfig {
    SimConfig { tasks: 2_000, seed, ..SimConfig::default() }
}

fn by<'a>(r: &'a Report, name: &str) -> &'a StrategyReport {
    r.strategies.iter().find(|s| s.strategy == name).unwrap()
}

#[test]
fn same_seed_same_report_other_seed_other_report() {
    let s = samples(50, 1);
    let a = run(&small(3), &s).unwrap();
    let b = run(&small(3), &s).unwrap();
    assert_eq!(a, b);
    assert_eq!(serde_json::to_string(&a).unwrap(), serde_json::to_string(&b).unwrap());
    let c = run(&small(4), &s).unwrap();
    assert_ne!(a.strategies, c.strategies);
}

#[test]
fn atp_loses_no_task_under_failures_while_sequential_does() {
    // Frequent outages: every agent down about once every 2 minutes.
    let cfg = SimConfig { mtbf_s: 120.0, ..small(5) };
    let r = run(&cfg, &samples(50, 2)).unwrap();
    let (seq, atp) = (by(&r, "sequential"), by(&r, "atp"));
    assert!(seq.lost > 0, "{seq:?}");
    assert_eq!(seq.recovery_s, None);
    assert!(atp.failures > 0, "failures were injected on ATP's calls too: {atp:?}");
    assert_eq!(atp.lost, 0, "{atp:?}");
    assert_eq!(atp.completed, cfg.tasks);
    assert!(atp.recovery_s.is_some());
}

#[test]
fn atp_context_efficiency_is_the_samples_mean_ratio() {
    let s = samples(200, 9);
    let r = run(&small(6), &s).unwrap();
    let mean = s.iter().map(|x| x.sent_tokens as f64 / x.full_tokens as f64).sum::<f64>() / s.len() as f64;
    assert!((r.sample_mean_ratio - mean).abs() < 1e-12);
    let atp = by(&r, "atp");
    // ~8,000 hops drawing ratios in [0.1, 0.4) (sd ≈ 0.087): the weighted
    // mean's standard error is ≈ 0.001; allow 0.01.
    assert!((atp.context_efficiency - mean).abs() < 0.01, "{} vs {mean}", atp.context_efficiency);
    // The baselines forward the full context (broadcast more).
    assert_eq!(by(&r, "sequential").context_efficiency, 1.0);
    assert_eq!(by(&r, "round-robin").context_efficiency, 1.0);
    assert!(by(&r, "broadcast").context_efficiency > 1.0);
    // A different sample set moves ATP's figure with it.
    let half: Vec<ContextSample> = s.iter().map(|x| ContextSample { sent_tokens: x.sent_tokens / 2, ..*x }).collect();
    let r2 = run(&small(6), &half).unwrap();
    assert!((by(&r2, "atp").context_efficiency - r2.sample_mean_ratio).abs() < 0.01);
    assert!(by(&r2, "atp").context_efficiency < atp.context_efficiency * 0.6);
}

#[test]
fn empty_or_impossible_samples_are_refused() {
    let e = run(&small(1), &[]).unwrap_err();
    assert!(matches!(&e, Error::Invalid { field, .. } if field == "context samples"), "{e}");
    assert_eq!(
        e.to_string(),
        "context samples: none given (the simulation draws context efficiency from measured SCD transfers; at least 1 is needed)"
    );
    let bad = [ContextSample { full_tokens: 100, sent_tokens: 50 }, ContextSample { full_tokens: 10, sent_tokens: 11 }];
    assert_eq!(
        run(&small(1), &bad).unwrap_err().to_string(),
        "samples[1]: full_tokens 10 / sent_tokens 11: need full_tokens ≥ 1 and sent_tokens ≤ full_tokens"
    );
    let zero = [ContextSample { full_tokens: 0, sent_tokens: 0 }];
    assert!(run(&small(1), &zero).is_err());
    let e = run(&SimConfig { agents: 3, ..small(1) }, &samples(5, 1)).unwrap_err();
    assert_eq!(e.to_string(), "agents: 3 (at least 4: one per task type)");
}

/// What keeps ATP away from over-advertisers is the repricer (observed
/// quality replaces the advertised one), not the trust book: with the
/// trust cut at the cold-start prior and over-advertisers' true quality
/// above it, trust alone never turns them away. BENCHMARKS.md says so;
/// if trust starts to steer, this test and that sentence change together.
#[test]
fn the_repricer_not_trust_steers_atp_away_from_over_advertisers() {
    let r = run(&small(8), &samples(50, 3)).unwrap();
    assert!(r.over_advertisers > 0);
    let (rr, atp) = (by(&r, "round-robin"), by(&r, "atp"));
    assert!(rr.over_advertiser_share > 0.05, "{rr:?}");
    assert!(atp.over_advertiser_share < rr.over_advertiser_share / 3.0, "{atp:?} vs {rr:?}");
    assert!(atp.quality > rr.quality);
    let repricer_only = row(&r, "ATP − trust book (repricer only)");
    assert!(repricer_only.over_advertiser_share < rr.over_advertiser_share / 3.0, "{repricer_only:?}");
    let trust_only = row(&r, "ATP − repricer (trust only)");
    assert!(trust_only.over_advertiser_share > 0.05, "{trust_only:?}");
    assert!(trust_only.quality < atp.quality);
}

fn row<'a>(r: &'a Report, name: &str) -> &'a StrategyReport {
    &r.ablation.iter().find(|a| a.report.strategy == name).unwrap().report
}

#[test]
fn the_ablation_takes_each_layer_away() {
    // frequent outages, so that fault tolerance has work to do
    let cfg = SimConfig { mtbf_s: 120.0, ..small(5) };
    let r = run(&cfg, &samples(50, 2)).unwrap();
    let names: Vec<&str> = r.ablation.iter().map(|a| a.report.strategy.as_str()).collect();
    assert_eq!(names, ABLATION.map(|a| a.1));
    let full = row(&r, "ATP (full)");
    assert_eq!(full, &StrategyReport { strategy: "ATP (full)".into(), ..by(&r, "atp").clone() });
    assert_eq!(r.ablation[0].paper_cost, Some(0.038));
    // without SCD the whole context goes, and its tokens cost more
    let no_scd = row(&r, "ATP − SCD");
    assert_eq!(no_scd.context_efficiency, 1.0);
    assert!(no_scd.token_cost_per_task > 2.0 * full.token_cost_per_task, "{no_scd:?} vs {full:?}");
    // without economic routing, the best quality whatever it costs
    let no_routing = row(&r, "ATP − economic routing");
    assert!(no_routing.cost_per_task > full.cost_per_task, "{no_routing:?} vs {full:?}");
    // without trust, a random capable agent: over-advertisers get calls
    let no_trust = row(&r, "ATP − trust scoring (random capable agent)");
    assert!(no_trust.over_advertiser_share > 0.05, "{no_trust:?}");
    assert!(no_trust.quality_lost_as_zero < full.quality_lost_as_zero);
    // without fault tolerance, a failed call loses its task
    let no_fault = row(&r, "ATP − fault tolerance");
    assert!(no_fault.failures > 0 && no_fault.lost > 0, "{no_fault:?}");
    assert_eq!(no_fault.recovery_s, None);
    assert_eq!(full.lost, 0);
    assert!(no_fault.quality_lost_as_zero < full.quality_lost_as_zero);
}

#[test]
fn table_and_svg_show_every_strategy() {
    let r = run(&SimConfig { tasks: 200, ..small(2) }, &samples(10, 4)).unwrap();
    let t = r.table();
    assert!(t.starts_with("| metric | sequential | round-robin | broadcast | atp |"), "{t}");
    assert!(t.contains("| context efficiency |"));
    let a = r.ablation_table();
    assert_eq!(a.lines().count(), 2 + ABLATION.len(), "{a}");
    assert!(a.contains("| ATP − fault tolerance |") && a.contains("| 0.038 / 0.871 |"), "{a}");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sim.svg");
    write_svg(&r, &path).unwrap();
    let svg = std::fs::read_to_string(&path).unwrap();
    assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
    for s in ["sequential", "round-robin", "broadcast", "atp"] {
        // plotters puts each text on its own line inside <text>
        assert!(svg.contains(&format!(">\n{s}\n</text>")), "{s}");
    }
    let missing = dir.path().join("no/such/dir/sim.svg");
    let err = format!("{:#}", write_svg(&r, &missing).unwrap_err());
    assert!(err.starts_with(&format!("--plot {}", missing.display())), "{err}");
}

/// Prints the default-size table (10,000 tasks) with synthetic samples:
/// `cargo test -p scd-atp --release sim::tests::print_table -- --ignored --nocapture`.
#[test]
#[ignore]
fn print_table() {
    let r = run(&SimConfig::default(), &samples(200, 11)).unwrap();
    println!("{}", r.table());
    println!("{}", r.ablation_table());
    println!("{}", serde_json::to_string_pretty(&r).unwrap());
}
