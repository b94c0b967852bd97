//! `scd-dev tune`: chooses SCD's scoring settings by cross-validation over
//! development sets and reports every fold, so a setting is kept for how it
//! does on examples it was not chosen on.
//!
//! Every variant of a grid is run on every example at every budget (one
//! engine, so chunk embeddings are computed once). Then:
//! - k folds: examples are dealt into `--folds` folds within each set; for
//!   each fold the variant best on the other folds is scored on it;
//! - leave one set out: for each set, the variant best on the other sets is
//!   scored on it (does a choice carry to data of another kind?).
//!
//! The objective is the mean over sets of each set's mean evidence recall
//! over its examples and budgets.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{bail, Context as _};
use indicatif::{ProgressBar, ProgressStyle};
use scd_engine::context::{ContextRequirement, Task};
use scd_engine::encoder::{Encoder, OrtEncoder};
use scd_engine::eval::{evidence_recall, load, sent_spans, Dataset, Example};
use scd_engine::extract::{CompressRequest, PrepareConfig, Scd, ScdConfig};
use serde::Serialize;
use serde_json::Value;

use scd_engine::rerank::CrossEncoder;
use scd_service::config::{ModelArgs, RerankArgs};

/// Variants one grid may hold.
pub const MAX_VARIANTS: usize = 512;

/// Arguments of `scd-dev tune`.
#[derive(Debug, clap::Args)]
pub struct TuneArgs {
    /// A development set as DATASET=PATH[,PATH...] (hotpotqa, squad,
    /// musique, 2wiki); repeat for several.
    #[arg(long = "set", required = true)]
    sets: Vec<String>,
    /// Examples per file at most.
    #[arg(long, default_value_t = 200)]
    limit: usize,
    /// Budgets as fractions of each context's tokens.
    #[arg(long, value_delimiter = ',', default_value = "0.25,0.33")]
    budgets: Vec<f32>,
    /// Budgets for the code set instead (its SOURCE.md suggests 10 % and
    /// 20 % of a file's tokens).
    #[arg(long, value_delimiter = ',', default_value = "0.1,0.2")]
    code_budgets: Vec<f32>,
    /// Folds of the k-fold cross-validation (at least 2).
    #[arg(long, default_value_t = 5)]
    folds: usize,
    /// JSON object: a setting's name → the list of values to try. The grid
    /// is their product, plus today's defaults. Settings: scorer (0: the
    /// hand-weighted sum, 1: learned, the default), the hand sum's weights
    /// (with scorer 0: lexical_weight, field_weight, link_weight,
    /// lead_link_bonus, owner_link_weight), link_sources, second_hop_weight,
    /// second_hop_sources, the closure limits (group_closure_tokens,
    /// group_closure_share, section_closure_tokens, function_closure_tokens), embed_neighbour
    /// (0 or 1), common_name_chunks, sibling_weight, and the second stage's
    /// rerank_weight and rerank_top (either scorer; they need --reranker);
    /// an unknown name's error lists every setting.
    #[arg(long)]
    grid: PathBuf,
    /// JSON report path.
    #[arg(long, default_value = "tune_report.json")]
    report: PathBuf,
    /// Keep embeddings in this redb file (`PrepareConfig::embedding_store`),
    /// as `scd-dev eval --embedding-store` does: a later tune or eval over
    /// the same texts with the same model reads them instead of computing
    /// them again; off when left out.
    #[arg(long, value_name = "FILE")]
    embedding_store: Option<PathBuf>,
    /// The second stage: its cross-encoder (loaded whenever one is
    /// configured, so a grid can weigh it) and the defaults' weight and reach.
    #[command(flatten)]
    rerank: RerankArgs,
}

/// One grid point: the settings it changes from the defaults.
type Settings = BTreeMap<String, f64>;

fn apply(cfg: &mut ScdConfig, settings: &Settings) -> anyhow::Result<()> {
    for (k, &v) in settings {
        apply_one(cfg, k, v).map_err(|e| anyhow::anyhow!("--grid: {e}"))?;
    }
    weights_need_the_hand_sum(cfg, settings.keys().map(String::as_str)).map_err(|e| anyhow::anyhow!("--grid: {e}"))
}

/// The weights of the hand-weighted sum: the learned scorer (the default)
/// has its own, fitted (`engine/src/extract/scorer.json`).
const HAND_WEIGHTS: [&str; 5] =
    ["lexical_weight", "field_weight", "link_weight", "lead_link_bonus", "owner_link_weight"];

/// Refuses a hand-sum weight among `keys` when `cfg` scores with the
/// learned scorer, which would ignore it (the second hop's weight applies
/// to both).
pub(crate) fn weights_need_the_hand_sum<'k>(
    cfg: &ScdConfig,
    keys: impl IntoIterator<Item = &'k str>,
) -> anyhow::Result<()> {
    if cfg.scoring.scorer != scd_engine::extract::Scorer::Learned {
        return Ok(());
    }
    for k in keys {
        if HAND_WEIGHTS.contains(&k) {
            bail!(
                "{k} weighs the hand-weighted sum, and this variant scores with the learned scorer, whose weights \
                 are fitted (engine/src/extract/scorer.json), so it would measure something else: add scorer=0"
            );
        }
    }
    Ok(())
}

/// Sets one scoring setting by name (shared with `scd-dev eval --sweep`).
pub(crate) fn apply_one(cfg: &mut ScdConfig, k: &str, v: f64) -> anyhow::Result<()> {
    let as_count = || -> anyhow::Result<usize> {
        if v < 0.0 || v.fract() != 0.0 || v > 1e6 {
            bail!("{k} takes whole numbers from 0 to 1000000, got {v}");
        }
        Ok(v as usize)
    };
    let as_weight = |max: f64| -> anyhow::Result<f32> {
        if !(0.0..=max).contains(&v) {
            bail!("{k} takes 0 to {max}, got {v}");
        }
        Ok(v as f32)
    };
    match k {
        "lexical_weight" => cfg.scoring.lexical_weight = v as f32,
        "field_weight" => cfg.scoring.field_weight = v as f32,
        "link_weight" => cfg.scoring.link_weight = v as f32,
        "lead_link_bonus" => cfg.scoring.lead_link_bonus = v as f32,
        "owner_link_weight" => cfg.scoring.owner_link_weight = v as f32,
        "second_hop_weight" => cfg.scoring.second_hop_weight = v as f32,
        "rerank_weight" => cfg.scoring.rerank_weight = v as f32,
        "rerank_top" => cfg.scoring.rerank_top = as_count()?,
        "more_min_relevance" => {
            if !(-1.0..=1.0).contains(&v) {
                bail!("{k} takes -1 to 1 (a cosine), got {v}");
            }
            cfg.sessions.more_min_relevance = Some(v as f32)
        }
        "link_sources" => cfg.scoring.link_sources = as_count()?,
        "common_name_chunks" => cfg.scoring.common_name_chunks = as_count()?,
        "sibling_weight" => cfg.scoring.sibling_weight = v as f32,
        "severity_weight" => cfg.scoring.severity_weight = v as f32,
        "exception_weight" => cfg.scoring.exception_weight = v as f32,
        "max_code_chunk_bytes" => cfg.prepare.chunk.max_code_chunk_bytes = as_count()?.max(1),
        "long_function_bytes" => cfg.prepare.chunk.long_function_bytes = as_count()?,
        "json_unit_bytes" => cfg.prepare.chunk.json_unit_bytes = as_count()?.max(1),
        "log_run_lines" => cfg.prepare.chunk.log_run_lines = as_count()?.max(1),
        "item_sentence_bytes" => cfg.prepare.chunk.item_sentence_bytes = as_count()?,
        "chat_run_bytes" => cfg.prepare.chunk.chat_run_bytes = as_count()?,
        "line_lexical_weight" => cfg.scoring.line_lexical_weight = v as f32,
        "lexical_excess_weight" => cfg.scoring.lexical_excess_weight = as_weight(10.0)?,
        "lexical_excess_from" => cfg.scoring.lexical_excess_from = as_weight(100.0)?,
        "second_hop_sources" => cfg.scoring.second_hop_sources = as_count()?,
        "group_closure_tokens" => cfg.scoring.group_closure_tokens = as_count()?,
        "group_closure_share" => cfg.scoring.group_closure_share = as_weight(1.0)?,
        "section_closure_tokens" => cfg.scoring.section_closure_tokens = as_count()?,
        "function_closure_tokens" => cfg.scoring.function_closure_tokens = as_count()?,
        "function_pieces_capped" => cfg.scoring.function_pieces_capped = as_count()? > 0,
        "function_piece_step" => cfg.scoring.function_piece_step = v as f32,
        "function_whole_share" => cfg.scoring.function_whole_share = as_weight(4.0)?,
        "json_whole_tokens" => cfg.scoring.json_whole_tokens = as_count()?,
        "code_context_lines" => {
            let max = scd_engine::extract::MAX_CODE_CONTEXT_LINES;
            cfg.scoring.code_context_lines = as_count()?;
            if cfg.scoring.code_context_lines > max {
                bail!("{k} takes whole numbers from 0 to {max}, got {v}");
            }
        }
        "log_size_weight" => cfg.scoring.log_size_weight = as_weight(10.0)?,
        "follow_weight" => cfg.scoring.follow_weight = as_weight(1.0)?,
        "near_duplicate_penalty" => cfg.scoring.near_duplicate_penalty = as_weight(10.0)?,
        "embed_neighbour" => cfg.prepare.embed_neighbour = as_count()? > 0,
        "markdown_link_text" => cfg.prepare.markdown_link_text = as_count()? > 0,
        "scorer" => {
            cfg.scoring.scorer = match as_count()? {
                0 => scd_engine::extract::Scorer::Hand,
                1 => scd_engine::extract::Scorer::Learned,
                n => bail!("scorer takes 0 (the hand sum) or 1 (learned), got {n}"),
            }
        }
        other => bail!(
            "unknown setting {other:?} (known: lexical_weight, field_weight, link_weight, \
             link_sources, lead_link_bonus, owner_link_weight, second_hop_weight, second_hop_sources, \
             group_closure_tokens, group_closure_share, section_closure_tokens, function_closure_tokens, function_pieces_capped, function_piece_step, function_whole_share, \
             code_context_lines, json_whole_tokens, log_size_weight, follow_weight, near_duplicate_penalty, embed_neighbour, markdown_link_text, \
             scorer, common_name_chunks, sibling_weight, severity_weight, exception_weight, max_code_chunk_bytes, \
             long_function_bytes, json_unit_bytes, log_run_lines, item_sentence_bytes, chat_run_bytes, line_lexical_weight, lexical_excess_weight, lexical_excess_from, rerank_weight, \
             rerank_top, more_min_relevance)"
        ),
    }
    Ok(())
}

/// The grid's variants: the defaults first, then the product of the lists.
fn variants(grid: &Value) -> anyhow::Result<Vec<Settings>> {
    let obj = grid.as_object().context("--grid: must be a JSON object of setting → list of numbers")?;
    let mut out = vec![Settings::new()];
    let mut product = vec![Settings::new()];
    for (k, vs) in obj {
        let vs = vs.as_array().with_context(|| format!("--grid: {k} must be a list of numbers"))?;
        let mut next = Vec::new();
        for p in &product {
            for v in vs {
                let x = v.as_f64().with_context(|| format!("--grid: {k} must be a list of numbers, got {v}"))?;
                let mut q = p.clone();
                q.insert(k.clone(), x);
                next.push(q);
            }
        }
        product = next;
        if product.len() > MAX_VARIANTS {
            bail!("--grid: more than {MAX_VARIANTS} variants");
        }
    }
    for p in product {
        apply(&mut ScdConfig::default(), &p)?;
        if !p.is_empty() {
            out.push(p);
        }
    }
    Ok(out)
}

#[derive(Debug, Serialize)]
struct Fold {
    fold: usize,
    chosen: Settings,
    train: f64,
    test: f64,
    default_test: f64,
    test_by_set: BTreeMap<String, f64>,
}

#[derive(Debug, Serialize)]
struct LeaveOut {
    held_out: String,
    chosen: Settings,
    test: f64,
    default_test: f64,
    best_in_set: f64,
}

#[derive(Debug, Serialize)]
struct VariantRow {
    settings: Settings,
    by_set: BTreeMap<String, f64>,
    mean: f64,
}

/// `recall[variant][set][example]`: mean recall over the budgets.
type Recalls = Vec<Vec<Vec<f64>>>;

/// The objective on the examples `keep` selects: mean over `sets` of each
/// set's mean.
fn objective(r: &[Vec<f64>], sets: &[usize], keep: &dyn Fn(usize, usize) -> bool) -> f64 {
    let means: Vec<f64> = sets
        .iter()
        .filter_map(|&s| {
            let xs: Vec<f64> = r[s].iter().enumerate().filter(|(e, _)| keep(s, *e)).map(|(_, x)| *x).collect();
            (!xs.is_empty()).then(|| xs.iter().sum::<f64>() / xs.len() as f64)
        })
        .collect();
    means.iter().sum::<f64>() / means.len().max(1) as f64
}

fn best(recalls: &Recalls, sets: &[usize], keep: &dyn Fn(usize, usize) -> bool) -> (usize, f64) {
    (0..recalls.len()).map(|v| (v, objective(&recalls[v], sets, keep))).fold((0, f64::MIN), |a, b| {
        if b.1 > a.1 {
            b
        } else {
            a
        }
    })
}

/// A development set: its name, dataset and examples.
type Set = (String, Dataset, Vec<Example>);

/// The sets of `--set`, at most `--limit` examples per file.
fn load_sets(args: &TuneArgs) -> anyhow::Result<Vec<Set>> {
    let mut sets: Vec<Set> = Vec::new();
    for s in &args.sets {
        let (name, path) = s.split_once('=').with_context(|| format!("--set {s:?}: expected DATASET=PATH"))?;
        let dataset: Dataset = name.parse().with_context(|| format!("--set {s:?}"))?;
        let mut examples = Vec::new();
        for path in path.split(',') {
            examples.extend(load(dataset, path.as_ref(), args.limit).with_context(|| format!("--set {s:?}"))?);
        }
        sets.push((name.to_string(), dataset, examples));
    }
    Ok(sets)
}

/// Every variant on every example of `sets` at every budget (the code
/// set's own budgets for code), on one engine over `encoder`.
fn measure(
    (encoder, reranker): (&Arc<OrtEncoder>, Option<Arc<dyn CrossEncoder>>),
    variants: &[Settings],
    sets: &[Set],
    args: &TuneArgs,
) -> anyhow::Result<Recalls> {
    let mut base = ScdConfig {
        prepare: PrepareConfig {
            cache_bytes: 2 << 30,
            prepared_cache_bytes: 4 << 30,
            embedding_store: args.embedding_store.clone(),
            ..Default::default()
        },
        ..ScdConfig::default()
    };
    args.rerank.apply(&mut base.scoring);
    let mut scd = Scd::new(encoder.clone(), base.clone()).with_reranker(reranker);
    let n: usize = sets.iter().map(|s| s.2.len()).sum();
    let bar = ProgressBar::new((n * variants.len()) as u64);
    bar.set_style(ProgressStyle::with_template("{bar:40} {pos}/{len} runs {per_sec} eta {eta} {msg}")?);
    let mut recalls: Recalls = Vec::new();
    for (vi, v) in variants.iter().enumerate() {
        let mut cfg = base.clone();
        apply(&mut cfg, v)?;
        scd.reconfigure(cfg);
        bar.set_message(format!("variant {}/{}", vi + 1, variants.len()));
        let mut per_set = Vec::new();
        for (_, dataset, examples) in sets {
            let budgets = if *dataset == Dataset::Code { &args.code_budgets } else { &args.budgets };
            let mut per_ex = Vec::new();
            for ex in examples {
                let total: usize = scd_total_tokens(&**encoder, ex)?;
                let mut sum = 0.0;
                for &frac in budgets {
                    let budget = scd_engine::eval::budget_at(total, frac);
                    let out = scd.compress(&CompressRequest {
                        task: Task::new(ex.question.clone()),
                        context: ex.context.clone(),
                        requirement: ContextRequirement::with_budget(budget),
                        session: None,
                    })?;
                    let sel = sent_spans(ex, &out);
                    sum += f64::from(evidence_recall(ex, &sel, *dataset).0);
                }
                per_ex.push(sum / budgets.len() as f64);
                bar.inc(1);
            }
            per_set.push(per_ex);
        }
        recalls.push(per_set);
    }
    bar.finish_and_clear();
    Ok(recalls)
}

/// The `k` folds: for each, the variant best on the other folds, scored on it.
fn k_folds(recalls: &Recalls, variants: &[Settings], sets: &[Set], k: usize) -> Vec<Fold> {
    let all_sets: Vec<usize> = (0..sets.len()).collect();
    let mut folds = Vec::new();
    for f in 0..k {
        let train = |_: usize, e: usize| e % k != f;
        let test = |_: usize, e: usize| e % k == f;
        let (v, train_score) = best(recalls, &all_sets, &train);
        folds.push(Fold {
            fold: f,
            chosen: variants[v].clone(),
            train: train_score,
            test: objective(&recalls[v], &all_sets, &test),
            default_test: objective(&recalls[0], &all_sets, &test),
            test_by_set: sets
                .iter()
                .enumerate()
                .map(|(s, (name, ..))| (name.clone(), objective(&recalls[v], &[s], &test)))
                .collect(),
        });
    }
    folds
}

/// Leave one set out (with several sets): for each, the variant best on
/// the others, scored on it.
fn leave_one_set_out(recalls: &Recalls, variants: &[Settings], sets: &[Set]) -> Vec<LeaveOut> {
    let mut leave_out = Vec::new();
    if sets.len() > 1 {
        for s in 0..sets.len() {
            let others: Vec<usize> = (0..sets.len()).filter(|&o| o != s).collect();
            let everything = |_: usize, _: usize| true;
            let (v, _) = best(recalls, &others, &everything);
            leave_out.push(LeaveOut {
                held_out: sets[s].0.clone(),
                chosen: variants[v].clone(),
                test: objective(&recalls[v], &[s], &everything),
                default_test: objective(&recalls[0], &[s], &everything),
                best_in_set: best(recalls, &[s], &everything).1,
            });
        }
    }
    leave_out
}

/// Every variant on all examples, per set and overall, best first.
fn variant_rows(recalls: &Recalls, variants: &[Settings], sets: &[Set]) -> Vec<VariantRow> {
    let all_sets: Vec<usize> = (0..sets.len()).collect();
    let mut rows: Vec<VariantRow> = variants
        .iter()
        .enumerate()
        .map(|(v, settings)| VariantRow {
            settings: settings.clone(),
            by_set: sets
                .iter()
                .enumerate()
                .map(|(s, (name, ..))| (name.clone(), objective(&recalls[v], &[s], &|_, _| true)))
                .collect(),
            mean: objective(&recalls[v], &all_sets, &|_, _| true),
        })
        .collect();
    rows.sort_by(|a, b| b.mean.total_cmp(&a.mean));
    rows
}

/// A variant's settings as one line.
fn show(s: &Settings) -> String {
    if s.is_empty() {
        "defaults".to_string()
    } else {
        s.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(" ")
    }
}

/// Prints the folds (with the cross-validated scores `cv`), the held-out
/// sets, the defaults and the top variants.
fn print_results(folds: &[Fold], cv: (f64, f64), leave_out: &[LeaveOut], rows: &[VariantRow]) {
    println!("fold  train   test  default  chosen");
    for f in folds {
        println!("{:>4} {:>6.3} {:>6.3} {:>8.3}  {}", f.fold, f.train, f.test, f.default_test, show(&f.chosen));
    }
    println!("cross-validated {:.3} (defaults {:.3})", cv.0, cv.1);
    if !leave_out.is_empty() {
        println!("held-out set  test  default  best-in-set  chosen on the others");
        for l in leave_out {
            println!(
                "{:<12} {:>5.3} {:>8.3} {:>12.3}  {}",
                l.held_out,
                l.test,
                l.default_test,
                l.best_in_set,
                show(&l.chosen)
            );
        }
    }
    if let Some(d) = rows.iter().find(|r| r.settings.is_empty()) {
        let by: Vec<String> = d.by_set.iter().map(|(s, x)| format!("{s} {x:.3}")).collect();
        println!("defaults on all examples: {:.3}  [{}]", d.mean, by.join(", "));
    }
    println!("top variants on all examples:");
    for r in rows.iter().take(10) {
        let by: Vec<String> = r.by_set.iter().map(|(s, x)| format!("{s} {x:.3}")).collect();
        println!("  {:.3}  [{}]  {}", r.mean, by.join(", "), show(&r.settings));
    }
}

/// Runs `scd-dev tune`.
pub fn run(model: &ModelArgs, args: TuneArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.folds >= 2, "--folds: at least 2, got {}", args.folds);
    for (flag, bs) in [("--budgets", &args.budgets), ("--code-budgets", &args.code_budgets)] {
        for b in bs {
            anyhow::ensure!(*b > 0.0 && *b <= 1.0, "{flag}: each must be in (0, 1], got {b}");
        }
    }
    let text = std::fs::read_to_string(&args.grid).with_context(|| format!("--grid {}", args.grid.display()))?;
    let grid: Value =
        serde_json::from_str(&text).with_context(|| format!("--grid {}: not JSON", args.grid.display()))?;
    let variants = variants(&grid)?;
    let sets = load_sets(&args)?;
    let reranker = args.rerank.load(model, true)?;
    let reranker_id = reranker.as_ref().map(|r| r.model_id().to_string());
    if reranker.is_none() {
        let weighs = variants.iter().any(|v| v.get("rerank_weight").is_some_and(|w| *w > 0.0));
        anyhow::ensure!(
            !weighs,
            "--grid: rerank_weight above 0 needs a reranker (--reranker DIR, or a rerank folder under --models-dir)"
        );
    }
    let encoder = Arc::new(model.load_encoder()?);
    let recalls = measure((&encoder, reranker), &variants, &sets, &args)?;

    let k = args.folds;
    let folds = k_folds(&recalls, &variants, &sets, k);
    let leave_out = leave_one_set_out(&recalls, &variants, &sets);
    let rows = variant_rows(&recalls, &variants, &sets);
    let n: usize = sets.iter().map(|s| s.2.len()).sum();
    println!(
        "{} variants × {} examples ({}) × budgets {:?}{}, {}-fold",
        variants.len(),
        n,
        sets.iter().map(|s| format!("{} {}", s.0, s.2.len())).collect::<Vec<_>>().join(", "),
        args.budgets,
        if sets.iter().any(|s| s.1 == Dataset::Code) {
            format!(" (code {:?})", args.code_budgets)
        } else {
            String::new()
        },
        k
    );
    let cv = folds.iter().map(|f| f.test).sum::<f64>() / k as f64;
    let cv_default = folds.iter().map(|f| f.default_test).sum::<f64>() / k as f64;
    print_results(&folds, (cv, cv_default), &leave_out, &rows);
    let report = serde_json::json!({
        "model": encoder.model_id(),
        "reranker": reranker_id,
        "sets": sets.iter().map(|s| serde_json::json!({"dataset": s.0, "examples": s.2.len()})).collect::<Vec<_>>(),
        "budgets": args.budgets,
        "code_budgets": args.code_budgets,
        "folds": folds,
        "cross_validated": cv,
        "cross_validated_defaults": cv_default,
        "leave_one_set_out": leave_out,
        "variants": rows,
    });
    std::fs::write(&args.report, serde_json::to_string_pretty(&report)?)
        .with_context(|| format!("--report {}", args.report.display()))?;
    eprintln!("wrote {}", args.report.display());
    Ok(())
}

/// An example's context tokens as `scd-dev eval` counts them: its sentences.
fn scd_total_tokens(enc: &dyn Encoder, ex: &Example) -> anyhow::Result<usize> {
    let mut total = 0;
    for (f, spans) in ex.sentences.iter().enumerate() {
        for &(a, b) in spans {
            let t = &ex.context.fields[f].content[a..b];
            if !t.trim().is_empty() {
                total += enc.count_tokens(t)?;
            }
        }
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_grid_is_the_defaults_and_the_product_and_unknown_settings_are_named() {
        let grid = serde_json::json!({"lexical_weight": [0.1, 0.2], "second_hop_weight": [0, 0.5, 1], "scorer": [0]});
        let v = variants(&grid).unwrap();
        assert_eq!(v.len(), 7);
        assert!(v[0].is_empty());
        let first = [("lexical_weight".into(), 0.1), ("scorer".into(), 0.0), ("second_hop_weight".into(), 0.0)];
        assert_eq!(v[1], Settings::from(first));
        let e = variants(&serde_json::json!({"lexical_wieght": [0.1]})).unwrap_err().to_string();
        assert!(e.starts_with("--grid: unknown setting \"lexical_wieght\""), "{e}");
        let e = variants(&serde_json::json!({"link_sources": [1.5]})).unwrap_err().to_string();
        assert_eq!(e, "--grid: link_sources takes whole numbers from 0 to 1000000, got 1.5");
        let e = variants(&serde_json::json!({"link_sources": vec![0; 30], "group_closure_tokens": vec![0; 30]}))
            .unwrap_err();
        assert_eq!(e.to_string(), "--grid: more than 512 variants");
        let e = variants(&serde_json::json!({"lexical_weight": 0.1})).unwrap_err().to_string();
        assert_eq!(e, "--grid: lexical_weight must be a list of numbers");
    }

    #[test]
    fn a_hand_weight_without_the_hand_sum_is_refused_by_name() {
        let mut cfg = ScdConfig::default();
        assert_eq!(cfg.scoring.scorer, scd_engine::extract::Scorer::Learned);
        let settings = Settings::from([("lexical_weight".into(), 0.1)]);
        let e = apply(&mut cfg, &settings).unwrap_err().to_string();
        assert!(e.starts_with("--grid: lexical_weight weighs the hand-weighted sum"), "{e}");
        assert!(e.ends_with("add scorer=0"), "{e}");
        // with scorer=0 it applies
        let mut cfg = ScdConfig::default();
        let settings = Settings::from([("lexical_weight".into(), 0.1), ("scorer".into(), 0.0)]);
        apply(&mut cfg, &settings).unwrap();
        assert_eq!(cfg.scoring.lexical_weight, 0.1);
        // the second hop's weight applies to both scorers
        let mut cfg = ScdConfig::default();
        apply(&mut cfg, &Settings::from([("second_hop_weight".into(), 1.0)])).unwrap();
        assert_eq!(cfg.scoring.second_hop_weight, 1.0);
        // and so do the second stage's
        let mut cfg = ScdConfig::default();
        apply(&mut cfg, &Settings::from([("rerank_weight".into(), 0.5), ("rerank_top".into(), 12.0)])).unwrap();
        assert_eq!((cfg.scoring.rerank_weight, cfg.scoring.rerank_top), (0.5, 12));
        assert_eq!(cfg.scoring.scorer, scd_engine::extract::Scorer::Learned);
        let e = apply(&mut cfg, &Settings::from([("rerank_top".into(), 2.5)])).unwrap_err().to_string();
        assert_eq!(e, "--grid: rerank_top takes whole numbers from 0 to 1000000, got 2.5");
        let e = apply(&mut cfg, &Settings::from([("log_size_weight".into(), 11.0)])).unwrap_err().to_string();
        assert_eq!(e, "--grid: log_size_weight takes 0 to 10, got 11");
        apply(&mut cfg, &Settings::from([("log_size_weight".into(), 2.0)])).unwrap();
        assert_eq!(cfg.scoring.log_size_weight, 2.0);
        let e = apply(&mut cfg, &Settings::from([("follow_weight".into(), 1.5)])).unwrap_err().to_string();
        assert_eq!(e, "--grid: follow_weight takes 0 to 1, got 1.5");
        apply(&mut cfg, &Settings::from([("follow_weight".into(), 0.5)])).unwrap();
        assert_eq!(cfg.scoring.follow_weight, 0.5);
        let e = apply(&mut cfg, &Settings::from([("function_whole_share".into(), 5.0)])).unwrap_err().to_string();
        assert_eq!(e, "--grid: function_whole_share takes 0 to 4, got 5");
        let e = apply(&mut cfg, &Settings::from([("group_closure_share".into(), 1.5)])).unwrap_err().to_string();
        assert_eq!(e, "--grid: group_closure_share takes 0 to 1, got 1.5");
        apply(&mut cfg, &Settings::from([("group_closure_share".into(), 0.25)])).unwrap();
        assert_eq!(cfg.scoring.group_closure_share, 0.25);
        let e = apply(&mut cfg, &Settings::from([("code_context_lines".into(), 9.0)])).unwrap_err().to_string();
        assert_eq!(e, "--grid: code_context_lines takes whole numbers from 0 to 8, got 9");
        let e = apply(&mut cfg, &Settings::from([("lexical_excess_from".into(), f64::NEG_INFINITY)])).unwrap_err();
        assert_eq!(e.to_string(), "--grid: lexical_excess_from takes 0 to 100, got -inf");
        let e = apply(&mut cfg, &Settings::from([("lexical_excess_weight".into(), 11.0)])).unwrap_err().to_string();
        assert_eq!(e, "--grid: lexical_excess_weight takes 0 to 10, got 11");
        apply(&mut cfg, &Settings::from([("lexical_excess_weight".into(), 0.6), ("lexical_excess_from".into(), 2.0)]))
            .unwrap();
        assert_eq!((cfg.scoring.lexical_excess_weight, cfg.scoring.lexical_excess_from), (0.6, 2.0));
    }

    #[test]
    fn folds_choose_on_training_examples_only() {
        // variant 1 wins on examples 0, 2 (fold 0 of 2) and loses on 1, 3
        let recalls: Recalls = vec![vec![vec![0.5, 0.5, 0.5, 0.5]], vec![vec![0.9, 0.1, 0.9, 0.1]]];
        let sets = [0];
        let (v, train) = best(&recalls, &sets, &|_, e| e % 2 != 0);
        assert_eq!((v, train), (0, 0.5), "trained on examples 1 and 3, where variant 1 scores 0.1");
        let (v, train) = best(&recalls, &sets, &|_, e| e % 2 != 1);
        assert_eq!(v, 1);
        assert!((train - 0.9).abs() < 1e-9);
        assert!((objective(&recalls[1], &sets, &|_, e| e % 2 == 1) - 0.1).abs() < 1e-9);
    }
}
