//! `scd eval`: evidence recall vs token reduction on real QA data, for SCD
//! and baselines (random, lead, BM25, plain dense sentence ranking) in the
//! same run. Writes a table, a JSON report and an SVG plot.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context as _;
use indicatif::{ProgressBar, ProgressStyle};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::SeedableRng;
use scd_engine::context::{ContextRequirement, Task};
use scd_engine::encoder::{EncodeOptions, Encoder, InputKind, OrtEncoder};
use scd_engine::eval::{evidence_recall, load, Dataset, Example};
use scd_engine::extract::{CompressRequest, Scd, ScdConfig};
use scd_engine::score::{dot, Bm25};
use serde::Serialize;

use super::plot;
use crate::config::ModelArgs;

/// Arguments of `scd eval`.
#[derive(Debug, clap::Args)]
pub struct EvalArgs {
    /// hotpotqa, squad, musique or 2wiki.
    #[arg(long)]
    dataset: String,
    /// Dataset files (read by path; several are concatenated).
    #[arg(long, num_args = 1.., required = true)]
    path: Vec<PathBuf>,
    /// Budgets as fractions of each context's tokens.
    #[arg(long, value_delimiter = ',', default_value = "0.2,0.25,0.33,0.5")]
    budgets: Vec<f32>,
    /// Examples per file at most.
    #[arg(long, default_value_t = 200)]
    limit: usize,
    /// JSON report path.
    #[arg(long, default_value = "eval_report.json")]
    report: PathBuf,
    /// SVG plot path (recall vs reduction per method).
    #[arg(long, default_value = "eval_plot.svg")]
    plot: PathBuf,
    /// Only SCD, no baselines (faster while developing).
    #[arg(long)]
    scd_only: bool,
    /// Override ScdConfig::lexical_weight.
    #[arg(long)]
    lexical_weight: Option<f32>,
    /// Override ScdConfig::field_weight.
    #[arg(long)]
    field_weight: Option<f32>,
    /// Override ScdConfig::link_weight.
    #[arg(long)]
    link_weight: Option<f32>,
    /// Override ScdConfig::link_sources.
    #[arg(long)]
    link_sources: Option<usize>,
}

#[derive(Debug, Clone, Serialize)]
struct Row {
    method: String,
    budget: f32,
    evidence_recall: f32,
    all_evidence_kept: f32,
    reduction_ratio: f32,
    r_theorem1: f32,
    p50_ms: f64,
    p95_ms: f64,
    cache_hit_rate: Option<f64>,
}

#[derive(Default)]
struct Acc {
    recall: Vec<f32>,
    all: Vec<f32>,
    ratio: Vec<f32>,
    r1: Vec<f32>,
    ms: Vec<f64>,
}

fn mean(xs: &[f32]) -> f32 {
    if xs.is_empty() {
        0.0
    } else {
        xs.iter().sum::<f32>() / xs.len() as f32
    }
}

/// Selected (field, byte span) pairs.
type Selection = Vec<(usize, (usize, usize))>;

/// Greedy fill in `order` under `budget`; returns selected sentence spans.
fn fill(order: &[usize], units: &[(usize, (usize, usize), usize)], budget: usize) -> (Selection, usize) {
    let mut used = 0;
    let mut sel = Vec::new();
    for &i in order {
        let (f, span, t) = units[i];
        if used + t <= budget {
            used += t;
            sel.push((f, span));
        }
    }
    (sel, used)
}

struct Baselines {
    units: Vec<(usize, (usize, usize), usize)>,
    dense: Vec<f32>,
    bm25: Vec<f32>,
    total: usize,
}

fn baselines(enc: &OrtEncoder, ex: &Example) -> anyhow::Result<Baselines> {
    let mut base = sentence_units(enc, ex)?;
    let texts: Vec<&str> = base.units.iter().map(|&(f, (a, b), _)| &ex.context.fields[f].content[a..b]).collect();
    let q = enc.encode(&[ex.question.as_str()], &EncodeOptions::new(InputKind::Query))?;
    let e = enc.encode(&texts, &EncodeOptions::new(InputKind::Passage).with_windows())?;
    base.dense = (0..texts.len()).map(|i| dot(q.row(0), e.row(i))).collect();
    base.bm25 = Bm25::new(&texts).scores(&ex.question);
    Ok(base)
}

/// Sentence units and token totals (scores zero until [`baselines`] fills them).
fn sentence_units(enc: &OrtEncoder, ex: &Example) -> anyhow::Result<Baselines> {
    let mut units = Vec::new();
    for (f, spans) in ex.sentences.iter().enumerate() {
        for &(a, b) in spans {
            let t = &ex.context.fields[f].content[a..b];
            if !t.trim().is_empty() {
                units.push((f, (a, b), enc.count_tokens(t)?));
            }
        }
    }
    let n = units.len();
    let total = units.iter().map(|u| u.2).sum();
    Ok(Baselines { units, dense: vec![0.0; n], bm25: vec![0.0; n], total })
}

fn ranked(scores: &[f32]) -> Vec<usize> {
    let mut o: Vec<usize> = (0..scores.len()).collect();
    o.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]));
    o
}

/// Runs `scd eval`.
pub fn run(model: &ModelArgs, args: EvalArgs) -> anyhow::Result<()> {
    let dataset: Dataset = args.dataset.parse()?;
    for b in &args.budgets {
        anyhow::ensure!(*b > 0.0 && *b <= 1.0, "--budgets: each must be in (0, 1], got {b}");
    }
    let mut examples = Vec::new();
    for p in &args.path {
        examples.extend(load(dataset, p, args.limit).with_context(|| format!("--path {}", p.display()))?);
    }
    let encoder = Arc::new(model.load_encoder()?);
    let model_id = encoder.model_id().to_string();
    let mut cfg = ScdConfig::default();
    cfg.lexical_weight = args.lexical_weight.unwrap_or(cfg.lexical_weight);
    cfg.field_weight = args.field_weight.unwrap_or(cfg.field_weight);
    cfg.link_weight = args.link_weight.unwrap_or(cfg.link_weight);
    cfg.link_sources = args.link_sources.unwrap_or(cfg.link_sources);
    let scd = Scd::new(encoder.clone(), cfg);
    let methods: &[&str] = if args.scd_only { &["scd"] } else { &["scd", "dense", "bm25", "lead", "random"] };
    let mut acc: Vec<Vec<Acc>> =
        methods.iter().map(|_| args.budgets.iter().map(|_| Acc::default()).collect()).collect();
    let bar = ProgressBar::new(examples.len() as u64);
    bar.set_style(ProgressStyle::with_template("{bar:40} {pos}/{len} examples {per_sec} eta {eta} {msg}")?);
    // Seeded: the random baseline is the same on every run.
    let mut rng = StdRng::seed_from_u64(0x9E37_79B9_7F4A_7C15);
    let mut hits_before = scd.cache_stats();
    let mut scd_hits = vec![(0u64, 0u64); args.budgets.len()];
    for ex in &examples {
        let t = Instant::now();
        let base = if args.scd_only { sentence_units(&encoder, ex)? } else { baselines(&encoder, ex)? };
        let base_ms = t.elapsed().as_secs_f64() * 1e3;
        let dense_order = ranked(&base.dense);
        let bm25_order = ranked(&base.bm25);
        // lead: first sentences of every paragraph, then second ones, ...
        let mut lead_order: Vec<usize> = (0..base.units.len()).collect();
        let pos_in_field = |i: usize| base.units[..i].iter().filter(|u| u.0 == base.units[i].0).count();
        lead_order.sort_by_key(|&i| (pos_in_field(i), i));
        let mut random_order: Vec<usize> = (0..base.units.len()).collect();
        random_order.shuffle(&mut rng);
        for (bi, &frac) in args.budgets.iter().enumerate() {
            let budget = ((base.total as f32 * frac).floor() as usize).max(1);
            let t = Instant::now();
            let out = scd.compress(&CompressRequest {
                task: Task::new(ex.question.clone()),
                context: ex.context.clone(),
                requirement: ContextRequirement::with_budget(budget),
                session: None,
            })?;
            let ms = t.elapsed().as_secs_f64() * 1e3;
            let stats = scd.cache_stats();
            scd_hits[bi].0 += stats.hits - hits_before.hits;
            scd_hits[bi].1 += stats.misses - hits_before.misses;
            hits_before = stats;
            let sel: Selection = out
                .chunks
                .iter()
                .map(|c| (ex.context.fields.iter().position(|f| f.name == c.field).unwrap_or(0), c.span))
                .collect();
            let (r, all) = evidence_recall(ex, &sel, dataset);
            let a = &mut acc[0][bi];
            a.recall.push(r);
            a.all.push(f32::from(u8::from(all)));
            a.ratio.push(out.totals.reduction_ratio);
            a.r1.push(out.totals.r_theorem1);
            a.ms.push(ms);
            for (mi, order) in [(1, &dense_order), (2, &bm25_order), (3, &lead_order), (4, &random_order)] {
                if args.scd_only {
                    break;
                }
                let (sel, used) = fill(order, &base.units, budget);
                let (r, all) = evidence_recall(ex, &sel, dataset);
                let a = &mut acc[mi][bi];
                a.recall.push(r);
                a.all.push(f32::from(u8::from(all)));
                a.ratio.push(if used == 0 { 0.0 } else { base.total as f32 / used as f32 });
                a.r1.push(base.total as f32 / (used + encoder.dim()) as f32);
                a.ms.push(if mi == 1 { base_ms } else { 0.0 });
            }
        }
        bar.inc(1);
    }
    bar.finish_and_clear();
    let mut rows = Vec::new();
    for (mi, m) in methods.iter().enumerate() {
        for (bi, &b) in args.budgets.iter().enumerate() {
            let a = &mut acc[mi][bi];
            let (h, mi_) = scd_hits[bi];
            rows.push(Row {
                method: m.to_string(),
                budget: b,
                evidence_recall: mean(&a.recall),
                all_evidence_kept: mean(&a.all),
                reduction_ratio: mean(&a.ratio),
                r_theorem1: mean(&a.r1),
                p50_ms: super::percentile(&mut a.ms, 0.5),
                p95_ms: super::percentile(&mut a.ms, 0.95),
                cache_hit_rate: (*m == "scd").then(|| h as f64 / (h + mi_).max(1) as f64),
            });
        }
    }
    println!("{} examples of {} with {model_id}", examples.len(), args.dataset);
    println!(
        "{:<8} {:>6} {:>8} {:>8} {:>9} {:>7} {:>8} {:>8} {:>6}",
        "method", "budget", "recall", "all_kept", "reduction", "R", "p50_ms", "p95_ms", "cache"
    );
    for r in &rows {
        println!(
            "{:<8} {:>6.2} {:>8.3} {:>8.3} {:>9.2} {:>7.2} {:>8.1} {:>8.1} {:>6}",
            r.method,
            r.budget,
            r.evidence_recall,
            r.all_evidence_kept,
            r.reduction_ratio,
            r.r_theorem1,
            r.p50_ms,
            r.p95_ms,
            r.cache_hit_rate.map(|h| format!("{h:.2}")).unwrap_or_default()
        );
    }
    let report =
        serde_json::json!({"dataset": args.dataset, "model": model_id, "examples": examples.len(), "results": rows});
    std::fs::write(&args.report, serde_json::to_string_pretty(&report)?)
        .with_context(|| format!("--report {}", args.report.display()))?;
    let mut series: Vec<plot::Series> = Vec::new();
    for r in &rows {
        match series.iter_mut().find(|s| s.label == r.method) {
            Some(s) => s.points.push((r.reduction_ratio, r.evidence_recall)),
            None => series
                .push(plot::Series { label: r.method.clone(), points: vec![(r.reduction_ratio, r.evidence_recall)] }),
        }
    }
    let title = format!("{}: evidence recall vs token reduction", args.dataset);
    plot::write_recall_vs_reduction(&args.plot, &title, &series)?;
    eprintln!("wrote {} and {}", args.report.display(), args.plot.display());
    Ok(())
}
