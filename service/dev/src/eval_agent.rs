//! `scd-dev eval --dataset agent`: SCD on what agents actually hand over (CI
//! logs, docs folders, JSON payloads, meeting notes, source files), per
//! kind, beside the line baselines a user without SCD has (grep-like, BM25
//! over lines, first-N lines), at the same budgets in the same tokenizer.
//!
//! Per case and budget (a fraction of the context as sent, every field's
//! whole text counted in the budget tokenizer): SCD compresses the task
//! with that budget and the chunks it selected are read back by their
//! spans; each baseline pastes its lines joined by newlines, counted whole
//! ([`scd_engine::eval::line_baselines`]). Scored by gold lines: the share
//! kept and whether all were ([`scd_engine::eval::agent::gold_lines_kept`]).
//!
//! With `--sweep`, each setting is a method of its own (`scd[key=v]`) and
//! the settings are chosen by k-fold cross-validation ([`cross_validate`]):
//! the cases of each kind are dealt into `--folds` folds; for each fold the
//! setting (today's defaults among them) best on the other folds is scored
//! on it, and `scd-cv` is each case as the setting chosen without it did,
//! so a figure reported for a choice is never one it was chosen on.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context as _;
use indicatif::{ProgressBar, ProgressStyle};
use scd_engine::budget::BudgetTokenizer;
use scd_engine::cancel::Cancel;
use scd_engine::context::{ContextRequirement, Task};
use scd_engine::encoder::Encoder;
use scd_engine::eval::agent::{gold_lines_kept, load_all, AgentCase};
use scd_engine::eval::line_baselines::{bm25_order, first_n, grep_order, paste, units, Pasted};
use scd_engine::eval::sent_spans;
use scd_engine::extract::{CompressOptions, CompressRequest, Scd, ScdConfig};
use scd_engine::rerank::CrossEncoder;
use serde::Serialize;

use super::plot;
use scd_service::config::ModelArgs;

/// The methods, in table order (the sweep's settings and `scd-cv` follow).
const METHODS: [&str; 4] = ["scd", "grep", "bm25", "first-n"];

/// The method holding each case as the setting chosen on the other folds did.
const CV_METHOD: &str = "scd-cv";

/// What `scd-dev eval --dataset agent` runs, checked by `scd-dev eval`.
#[derive(Debug)]
pub struct AgentEval {
    /// JSONL files or folders of them.
    pub paths: Vec<PathBuf>,
    /// Cases per file at most.
    pub limit: usize,
    /// Budgets as fractions of each context's tokens.
    pub budgets: Vec<f32>,
    /// The budget tokenizer (`None`: the encoder's own).
    pub tokenizer: Option<BudgetTokenizer>,
    /// SCD's settings.
    pub cfg: ScdConfig,
    /// SCD only, no baselines.
    pub scd_only: bool,
    /// JSON report path.
    pub report: PathBuf,
    /// SVG plot path.
    pub plot: PathBuf,
    /// Per-case results as JSON lines.
    pub per_example: Option<PathBuf>,
    /// `--sweep`'s settings: (method name, config), run beside `cfg`.
    pub variants: Vec<(String, ScdConfig)>,
    /// Folds of the cross-validation over `variants` (at least 2).
    pub folds: usize,
    /// Only the cases of these kinds (all when empty).
    pub kinds: Vec<String>,
    /// The second stage's cross-encoder, for SCD and every variant.
    pub reranker: Option<Arc<dyn CrossEncoder>>,
    /// Follow-up probes in place of the comparison ([`super::eval_agent_more`]).
    pub follow_ups: bool,
}

/// One method's result on one case at one budget.
#[derive(Debug, Clone, Serialize)]
struct Outcome {
    /// The case's place in the loaded order.
    #[serde(skip)]
    case: usize,
    id: String,
    kind: String,
    method: String,
    budget: f32,
    budget_tokens: usize,
    context_tokens: usize,
    sent_tokens: usize,
    gold_lines_kept: f32,
    all_gold_kept: bool,
}

/// Means over the cases of one kind (or `all`) for one method and budget.
#[derive(Debug, Clone, Serialize, PartialEq)]
struct Row {
    kind: String,
    method: String,
    budget: f32,
    n: usize,
    gold_lines_kept: f32,
    all_gold_kept: f32,
    sent_tokens: f32,
    reduction_ratio: f32,
}

/// What one case runs: SCD's default and the sweep's settings (method
/// name, engine), the options, the budgets and the counting tokenizer.
struct Runner<'a> {
    scds: Vec<(String, Scd)>,
    opts: CompressOptions,
    budgets: &'a [f32],
    count: &'a dyn Fn(&str) -> scd_engine::Result<usize>,
    scd_only: bool,
}

/// Runs SCD (each setting) and the baselines on case `ci` at every budget.
fn run_case(r: &Runner<'_>, ci: usize, case: &AgentCase) -> anyhow::Result<Vec<Outcome>> {
    let (budgets, count, scd_only) = (r.budgets, r.count, r.scd_only);
    let ex = &case.example;
    let total = super::eval_agent_cases::case_tokens(case, count)?;
    let lines = if scd_only { Vec::new() } else { units(ex, count)? };
    let (grep, bm25) = (grep_order(ex, &lines), bm25_order(ex, &lines));
    let mut out = Vec::new();
    for &frac in budgets {
        let budget = scd_engine::eval::budget_at(total, frac);
        let req = CompressRequest {
            task: Task::new(ex.question.clone()),
            context: ex.context.clone(),
            requirement: ContextRequirement::with_budget(budget),
            session: None,
        };
        let mut results = Vec::new();
        for (method, scd) in &r.scds {
            let sent = scd.compress_opts(&req, &r.opts, &Cancel::new()).with_context(|| format!("case {}", ex.id))?;
            results
                .push((method.as_str(), Pasted { selected: sent_spans(ex, &sent), tokens: sent.totals.sent_tokens }));
        }
        if !scd_only {
            results.push(("grep", paste(ex, &lines, &grep, budget, count)?));
            results.push(("bm25", paste(ex, &lines, &bm25, budget, count)?));
            results.push(("first-n", first_n(ex, &lines, budget, count)?));
        }
        for (method, p) in results {
            anyhow::ensure!(
                p.tokens <= budget,
                "case {}: {method} sent {} tokens over the budget {budget}",
                ex.id,
                p.tokens
            );
            let (kept, all) = gold_lines_kept(case, &p.selected);
            out.push(Outcome {
                case: ci,
                id: ex.id.clone(),
                kind: case.kind.clone(),
                method: method.to_string(),
                budget: frac,
                budget_tokens: budget,
                context_tokens: total,
                sent_tokens: p.tokens,
                gold_lines_kept: kept,
                all_gold_kept: all,
            });
        }
    }
    Ok(out)
}

/// The rows: for every kind present (in order of first appearance) and
/// then `all`, every budget, every method of `methods` that ran.
fn rows(outcomes: &[Outcome], budgets: &[f32], methods: &[String]) -> Vec<Row> {
    let mut out = Vec::new();
    for kind in super::eval_agent_cases::kinds_then_all(outcomes.iter().map(|o| o.kind.as_str())) {
        for &budget in budgets {
            for method in methods {
                let xs: Vec<&Outcome> = outcomes
                    .iter()
                    .filter(|o| (kind == "all" || o.kind == kind) && o.budget == budget && &o.method == method)
                    .collect();
                if xs.is_empty() {
                    continue;
                }
                let n = xs.len() as f32;
                let mean = |f: &dyn Fn(&Outcome) -> f32| xs.iter().map(|o| f(o)).sum::<f32>() / n;
                out.push(Row {
                    kind: kind.to_string(),
                    method: method.to_string(),
                    budget,
                    n: xs.len(),
                    gold_lines_kept: mean(&|o| o.gold_lines_kept),
                    all_gold_kept: mean(&|o| f32::from(u8::from(o.all_gold_kept))),
                    sent_tokens: mean(&|o| o.sent_tokens as f32),
                    reduction_ratio: mean(&|o| o.context_tokens as f32 / o.sent_tokens.max(1) as f32),
                });
            }
        }
    }
    out
}

/// The table printed on stdout.
fn table(rows: &[Row]) -> String {
    let mut s = format!(
        "{:<6} {:>6} {:<8} {:>4} {:>10} {:>8} {:>8} {:>9}\n",
        "kind", "budget", "method", "n", "lines_kept", "all_kept", "tokens", "reduction"
    );
    for r in rows {
        s.push_str(&format!(
            "{:<6} {:>6.2} {:<8} {:>4} {:>10.3} {:>8.3} {:>8.0} {:>9.2}\n",
            r.kind, r.budget, r.method, r.n, r.gold_lines_kept, r.all_gold_kept, r.sent_tokens, r.reduction_ratio
        ));
    }
    s
}

/// Cases per kind, in order of first appearance (`logs 12, docs 10`).
fn kind_counts(cases: &[AgentCase]) -> Vec<(String, usize)> {
    let mut out: Vec<(String, usize)> = Vec::new();
    for c in cases {
        match out.iter_mut().find(|(k, _)| *k == c.kind) {
            Some((_, n)) => *n += 1,
            None => out.push((c.kind.clone(), 1)),
        }
    }
    out
}

/// Writes the JSON report, the plot (every method over all kinds) and the
/// per-case lines.
fn write_outputs(a: &AgentEval, report: serde_json::Value, rows: &[Row], outcomes: &[Outcome]) -> anyhow::Result<()> {
    std::fs::write(&a.report, serde_json::to_string_pretty(&report)?)
        .with_context(|| format!("--report {}", a.report.display()))?;
    let all = rows.iter().filter(|r| r.kind == "all");
    let series = plot::by_label(all.map(|r| (r.method.as_str(), (r.reduction_ratio, r.gold_lines_kept))));
    let title = "agent (all kinds): gold lines kept vs token reduction";
    plot::write_recall_vs_reduction(&a.plot, title, &series)?;
    eprintln!("wrote {} and {}", a.report.display(), a.plot.display());
    if let Some(p) = &a.per_example {
        let mut lines = String::new();
        for o in outcomes {
            lines.push_str(&serde_json::to_string(o)?);
            lines.push('\n');
        }
        std::fs::write(p, lines).with_context(|| format!("--per-example {}", p.display()))?;
    }
    Ok(())
}

/// Runs `scd-dev eval --dataset agent`.
pub fn run(model: &ModelArgs, a: AgentEval) -> anyhow::Result<()> {
    let shown: Vec<String> = a.paths.iter().map(|p| p.display().to_string()).collect();
    let mut cases = load_all(&a.paths, a.limit).with_context(|| format!("--data {}", shown.join(" ")))?;
    cases.retain(|c| a.kinds.is_empty() || a.kinds.contains(&c.kind));
    anyhow::ensure!(!cases.is_empty(), "--kinds {}: no case of these kinds", a.kinds.join(","));
    let encoder = Arc::new(model.load_encoder()?);
    let model_id = encoder.model_id().to_string();
    // a sweep's settings share their embeddings
    let shared: Arc<dyn Encoder> =
        if a.variants.is_empty() { encoder.clone() } else { Arc::new(crate::memo::Memo::new(encoder.clone())) };
    let engine = |c: &ScdConfig| Scd::new(shared.clone(), c.clone()).with_reranker(a.reranker.clone());
    let mut scds = vec![("scd".to_string(), engine(&a.cfg))];
    scds.extend(a.variants.iter().map(|(n, c)| (n.clone(), engine(c))));
    let tok_name = a.tokenizer.as_ref().map_or("e5 (the encoder's)".to_string(), |t| t.name().to_string());
    let count = |t: &str| match &a.tokenizer {
        Some(tok) => tok.count(t),
        None => encoder.count_tokens(t),
    };
    let opts = CompressOptions { budget_tokenizer: a.tokenizer.clone(), ..Default::default() };
    if a.follow_ups {
        let probes = super::eval_agent_more::run_all(&scds, &opts, &cases, &a.budgets, &count)?;
        let command = std::env::args().collect::<Vec<_>>().join(" ");
        let header = serde_json::json!({"command": command, "dataset": "agent", "model": model_id,
            "budget_tokenizer": tok_name, "files": shown, "examples": cases.len()});
        return super::eval_agent_more::report(&probes, header, (&a.report, &a.plot), a.per_example.as_deref());
    }
    let runner = Runner { scds, opts, budgets: &a.budgets, count: &count, scd_only: a.scd_only };
    let bar = ProgressBar::new(cases.len() as u64);
    bar.set_style(ProgressStyle::with_template("{bar:40} {pos}/{len} cases {per_sec} eta {eta}")?);
    let mut outcomes = Vec::new();
    for (ci, case) in cases.iter().enumerate() {
        outcomes.extend(run_case(&runner, ci, case)?);
        bar.inc(1);
    }
    bar.finish_and_clear();
    // texts the encoder embedded (store and in-memory hits not counted)
    let embedded: u64 = runner.scds.iter().map(|(_, s)| s.encoded().0).sum();
    let scd_names: Vec<String> = runner.scds.iter().map(|(n, _)| n.clone()).collect();
    let case_kinds: Vec<&str> = cases.iter().map(|c| c.kind.as_str()).collect();
    let cv = (!a.variants.is_empty()).then(|| cross_validate(&case_kinds, &outcomes, &scd_names, a.folds));
    if let Some(cv) = &cv {
        outcomes.extend(cv.outcomes.iter().cloned());
    }
    let methods = methods(&scd_names, a.scd_only, cv.is_some());
    let rows = rows(&outcomes, &a.budgets, &methods);
    let kinds = kind_counts(&cases);
    let per_kind: Vec<String> = kinds.iter().map(|(k, n)| format!("{k} {n}")).collect();
    println!(
        "{} agent cases ({}) with {model_id}; budgets and tokens in {tok_name}; gold lines kept, all kept",
        cases.len(),
        per_kind.join(", ")
    );
    print!("{}", table(&rows));
    if let Some(cv) = &cv {
        print!("{}", cv.table());
    }
    let store =
        a.cfg.prepare.embedding_store.as_ref().map_or("no store".to_string(), |p| format!("store {}", p.display()));
    println!("texts embedded: {embedded} ({store})");
    let kinds: BTreeMap<String, usize> = kinds.into_iter().collect();
    let command = std::env::args().collect::<Vec<_>>().join(" ");
    let mut report = serde_json::json!({
        "command": command, "dataset": "agent", "model": model_id, "budget_tokenizer": tok_name, "files": shown,
        "examples": cases.len(), "kinds": kinds, "methods": methods, "results": rows,
        "texts_embedded": embedded,
    });
    if let Some(cv) = &cv {
        report["cross_validation"] = serde_json::to_value(cv)?;
    }
    write_outputs(&a, report, &rows, &outcomes)
}

/// The methods in table order: SCD, the baselines that ran, the sweep's
/// settings, then `scd-cv` when the settings were cross-validated.
fn methods(scd_names: &[String], scd_only: bool, cv: bool) -> Vec<String> {
    let mut out = vec![METHODS[0].to_string()];
    if !scd_only {
        out.extend(METHODS[1..].iter().map(|m| m.to_string()));
    }
    out.extend(scd_names[1..].iter().cloned());
    if cv {
        out.push(CV_METHOD.to_string());
    }
    out
}

/// One fold of the cross-validation: the setting chosen on the other
/// folds, its score there and on this fold, and the defaults' on this fold.
#[derive(Debug, Clone, Serialize)]
struct Fold {
    fold: usize,
    cases: usize,
    chosen: String,
    train: f64,
    test: f64,
    default_test: f64,
}

/// The sweep's settings chosen by k-fold cross-validation.
#[derive(Debug, Clone, Serialize)]
struct CrossValidation {
    folds: Vec<Fold>,
    /// Mean over folds of the chosen setting's score on its held-out fold.
    cross_validated: f64,
    /// The same for SCD's defaults.
    cross_validated_defaults: f64,
    /// Per kind: the held-out score of each case's chosen setting, and the defaults'.
    by_kind: BTreeMap<String, (f64, f64)>,
    /// Each setting's score on every case (not a held-out figure).
    settings: Vec<(String, f64)>,
    /// `scd-cv`: each case as the setting chosen without its fold did.
    #[serde(skip)]
    outcomes: Vec<Outcome>,
}

impl CrossValidation {
    /// What is printed after the table.
    fn table(&self) -> String {
        let k = self.folds.len();
        let mut s = format!(
            "{k}-fold cross-validation of the settings (score: gold lines kept, mean over the budgets, mean over \
             kinds of each kind's mean; chosen on the other folds)\nfold cases  train   test  default  chosen\n"
        );
        for f in &self.folds {
            s.push_str(&format!(
                "{:>4} {:>5} {:>6.3} {:>6.3} {:>8.3}  {}\n",
                f.fold, f.cases, f.train, f.test, f.default_test, f.chosen
            ));
        }
        s.push_str(&format!(
            "cross-validated {:.3} (defaults {:.3})\n",
            self.cross_validated, self.cross_validated_defaults
        ));
        let by: Vec<String> =
            self.by_kind.iter().map(|(k, (cv, d))| format!("{k} {cv:.3} (defaults {d:.3})")).collect();
        s.push_str(&format!("held out, per kind: {}\n", by.join(", ")));
        let all: Vec<String> = self.settings.iter().map(|(n, x)| format!("{n} {x:.3}")).collect();
        s.push_str(&format!("each setting on every case (not held out): {}\n", all.join(", ")));
        s
    }
}

/// Per case and method, the mean of gold lines kept over the budgets.
fn case_scores(outcomes: &[Outcome], n_cases: usize, methods: &[String]) -> Vec<Vec<f64>> {
    let mut sums = vec![vec![(0.0, 0usize); n_cases]; methods.len()];
    for o in outcomes {
        if let Some(m) = methods.iter().position(|m| *m == o.method) {
            let e = &mut sums[m][o.case];
            e.0 += f64::from(o.gold_lines_kept);
            e.1 += 1;
        }
    }
    sums.into_iter().map(|v| v.into_iter().map(|(s, n)| s / n.max(1) as f64).collect()).collect()
}

/// The score over the cases `keep` selects: the mean over kinds of each
/// kind's mean (so a kind with more cases does not outweigh the others).
fn objective(scores: &[f64], kind_of: &[usize], keep: &dyn Fn(usize) -> bool) -> f64 {
    let n_kinds = kind_of.iter().max().map_or(0, |k| k + 1);
    let mut sums = vec![(0.0, 0usize); n_kinds];
    for (c, &x) in scores.iter().enumerate().filter(|(c, _)| keep(*c)) {
        sums[kind_of[c]].0 += x;
        sums[kind_of[c]].1 += 1;
    }
    let means: Vec<f64> = sums.iter().filter(|(_, n)| *n > 0).map(|(s, n)| s / *n as f64).collect();
    means.iter().sum::<f64>() / means.len().max(1) as f64
}

/// Chooses among `names` (SCD's defaults first, then the sweep's settings)
/// by k-fold cross-validation: a case's fold is its place among the cases
/// of its kind (`cases`: each case's kind, in load order), modulo `k`.
fn cross_validate(cases: &[&str], outcomes: &[Outcome], names: &[String], k: usize) -> CrossValidation {
    let mut kinds: Vec<&str> = Vec::new();
    let mut seen: Vec<usize> = Vec::new();
    let (mut kind_of, mut fold_of) = (Vec::new(), Vec::new());
    for &c in cases {
        let kk = kinds.iter().position(|x| *x == c).unwrap_or_else(|| {
            kinds.push(c);
            seen.push(0);
            kinds.len() - 1
        });
        kind_of.push(kk);
        fold_of.push(seen[kk] % k);
        seen[kk] += 1;
    }
    let scores = case_scores(outcomes, cases.len(), names);
    let mut folds = Vec::new();
    let mut chosen_of = vec![0; cases.len()];
    for f in 0..k {
        let train = |c: usize| fold_of[c] != f;
        let test = |c: usize| fold_of[c] == f;
        // the first best wins a tie, so the defaults are kept unless beaten
        let (v, train_score) = (0..names.len())
            .map(|v| (v, objective(&scores[v], &kind_of, &train)))
            .fold((0, f64::MIN), |a, b| if b.1 > a.1 { b } else { a });
        (0..cases.len()).filter(|&c| test(c)).for_each(|c| chosen_of[c] = v);
        folds.push(Fold {
            fold: f,
            cases: (0..cases.len()).filter(|&c| test(c)).count(),
            chosen: names[v].clone(),
            train: train_score,
            test: objective(&scores[v], &kind_of, &test),
            default_test: objective(&scores[0], &kind_of, &test),
        });
    }
    let cv_scores: Vec<f64> = (0..cases.len()).map(|c| scores[chosen_of[c]][c]).collect();
    let by_kind = kinds
        .iter()
        .enumerate()
        .map(|(kk, name)| {
            let of = |xs: &[f64]| objective(xs, &kind_of, &|c| kind_of[c] == kk);
            (name.to_string(), (of(&cv_scores), of(&scores[0])))
        })
        .collect();
    let outcomes = outcomes
        .iter()
        .filter(|o| names.get(chosen_of[o.case]) == Some(&o.method))
        .map(|o| Outcome { method: CV_METHOD.to_string(), ..o.clone() })
        .collect();
    let mean = |f: &dyn Fn(&Fold) -> f64| folds.iter().map(f).sum::<f64>() / k as f64;
    CrossValidation {
        cross_validated: mean(&|f| f.test),
        cross_validated_defaults: mean(&|f| f.default_test),
        by_kind,
        settings: names.iter().zip(&scores).map(|(n, s)| (n.clone(), objective(s, &kind_of, &|_| true))).collect(),
        folds,
        outcomes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcome(id: &str, kind: &str, method: &'static str, kept: f32, sent: usize) -> Outcome {
        Outcome {
            case: 0,
            id: id.into(),
            kind: kind.into(),
            method: method.into(),
            budget: 0.1,
            budget_tokens: 100,
            context_tokens: 1000,
            sent_tokens: sent,
            gold_lines_kept: kept,
            all_gold_kept: kept == 1.0,
        }
    }

    #[test]
    fn rows_are_means_per_kind_then_over_all_kinds() {
        let outcomes = [
            outcome("a", "logs", "scd", 1.0, 100),
            outcome("b", "logs", "scd", 0.5, 50),
            outcome("a", "logs", "grep", 0.0, 100),
            outcome("b", "logs", "grep", 0.0, 100),
            outcome("c", "json", "scd", 1.0, 100),
            outcome("c", "json", "grep", 1.0, 100),
        ];
        let rows = rows(&outcomes, &[0.1], &methods(&["scd".into()], false, false));
        let key: Vec<(&str, &str, usize)> = rows.iter().map(|r| (r.kind.as_str(), r.method.as_str(), r.n)).collect();
        assert_eq!(
            key,
            [
                ("logs", "scd", 2),
                ("logs", "grep", 2),
                ("json", "scd", 1),
                ("json", "grep", 1),
                ("all", "scd", 3),
                ("all", "grep", 3)
            ]
        );
        assert_eq!((rows[0].gold_lines_kept, rows[0].all_gold_kept), (0.75, 0.5));
        assert_eq!(rows[0].reduction_ratio, 15.0, "(1000/100 + 1000/50) / 2");
        assert!((rows[4].gold_lines_kept - 2.5 / 3.0).abs() < 1e-6);
        assert!((rows[5].all_gold_kept - 1.0 / 3.0).abs() < 1e-6);
        let t = table(&rows);
        assert!(t.starts_with("kind   budget method      n lines_kept all_kept   tokens reduction\n"), "{t}");
        assert!(t.contains("logs     0.10 scd         2      0.750    0.500       75     15.00\n"), "{t}");
    }

    /// Case `c` of `kind` kept `kept` gold lines with `method` (at budget 0.1).
    fn scored(c: usize, kind: &str, method: &'static str, kept: f32) -> Outcome {
        Outcome { case: c, ..outcome(&format!("c{c}"), kind, method, kept, 100) }
    }

    #[test]
    fn a_setting_is_chosen_on_the_other_folds_and_scored_on_its_own() {
        // 4 logs cases and 2 json cases; with 2 folds, logs 0 and 2 and
        // json 4 are fold 0 (each kind dealt in turn), the rest fold 1
        let kinds = ["logs", "logs", "logs", "logs", "json", "json"];
        let names: Vec<String> = ["scd", "scd[a=1]"].map(String::from).to_vec();
        // the setting wins on fold 1's cases and loses on fold 0's
        let setting = [0.0, 1.0, 0.0, 1.0, 0.0, 1.0];
        let mut outcomes = Vec::new();
        for (c, k) in kinds.iter().enumerate() {
            outcomes.push(scored(c, k, "scd", 0.5));
            outcomes.push(scored(c, k, "scd[a=1]", setting[c]));
            outcomes.push(scored(c, k, "grep", 0.9));
        }
        let cv = cross_validate(&kinds, &outcomes, &names, 2);
        let picked: Vec<(&str, usize)> = cv.folds.iter().map(|f| (f.chosen.as_str(), f.cases)).collect();
        // fold 0 is chosen on fold 1, where the setting scores 1; fold 1 on fold 0, where it scores 0
        assert_eq!(picked, [("scd[a=1]", 3), ("scd", 3)]);
        assert_eq!((cv.folds[0].train, cv.folds[0].test, cv.folds[0].default_test), (1.0, 0.0, 0.5));
        assert_eq!((cv.folds[1].train, cv.folds[1].test), (0.5, 0.5));
        assert_eq!((cv.cross_validated, cv.cross_validated_defaults), (0.25, 0.5));
        // scd-cv: each case as its fold's choice did (never the baselines)
        let cv_kept: Vec<(usize, f32)> = cv.outcomes.iter().map(|o| (o.case, o.gold_lines_kept)).collect();
        assert_eq!(cv_kept, [(0, 0.0), (1, 0.5), (2, 0.0), (3, 0.5), (4, 0.0), (5, 0.5)]);
        assert!(cv.outcomes.iter().all(|o| o.method == CV_METHOD));
        assert_eq!(cv.by_kind["logs"], (0.25, 0.5));
        assert_eq!(cv.settings, [("scd".to_string(), 0.5), ("scd[a=1]".to_string(), 0.5)]);
        let t = cv.table();
        assert!(t.starts_with("2-fold cross-validation of the settings"), "{t}");
        assert!(t.contains("\n   0     3  1.000  0.000    0.500  scd[a=1]\n"), "{t}");
        assert!(t.contains("cross-validated 0.250 (defaults 0.500)\n"), "{t}");
    }

    #[test]
    fn the_objective_weighs_each_kind_alike() {
        // three logs cases at 1.0 and one json case at 0.0: 0.5, not 0.75
        let kind_of = [0, 0, 0, 1];
        assert_eq!(objective(&[1.0, 1.0, 1.0, 0.0], &kind_of, &|_| true), 0.5);
        assert_eq!(objective(&[1.0, 1.0, 1.0, 0.0], &kind_of, &|c| c < 3), 1.0);
        let scores = case_scores(&[scored(0, "logs", "scd", 1.0), scored(0, "logs", "scd", 0.0)], 1, &["scd".into()]);
        assert_eq!(scores, [[0.5]], "a case's budgets are averaged");
    }
}
