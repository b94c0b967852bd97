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
use scd_engine::eval::selection;
use scd_engine::extract::{CompressOptions, CompressRequest, Scd, ScdConfig};
use serde::Serialize;

use super::plot;
use scd_service::config::ModelArgs;

/// The methods, in table order.
const METHODS: [&str; 4] = ["scd", "grep", "bm25", "first-n"];

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
}

/// One method's result on one case at one budget.
#[derive(Debug, Clone, Serialize)]
struct Outcome {
    id: String,
    kind: String,
    method: &'static str,
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

/// Runs SCD and the baselines on one case at every budget.
fn run_case(
    scd: &Scd,
    opts: &CompressOptions,
    case: &AgentCase,
    budgets: &[f32],
    count: &dyn Fn(&str) -> scd_engine::Result<usize>,
    scd_only: bool,
) -> anyhow::Result<Vec<Outcome>> {
    let ex = &case.example;
    let mut total = 0;
    for f in &ex.context.fields {
        total += count(&f.content)?;
    }
    let lines = if scd_only { Vec::new() } else { units(ex, count)? };
    let (grep, bm25) = (grep_order(ex, &lines), bm25_order(ex, &lines));
    let mut out = Vec::new();
    for &frac in budgets {
        let budget = ((total as f32 * frac).floor() as usize).max(1);
        let req = CompressRequest {
            task: Task::new(ex.question.clone()),
            context: ex.context.clone(),
            requirement: ContextRequirement::with_budget(budget),
            session: None,
        };
        let sent = scd.compress_opts(&req, opts, &Cancel::new()).with_context(|| format!("case {}", ex.id))?;
        let scd_pasted = Pasted { selected: selection(ex, &sent.chunks), tokens: sent.totals.sent_tokens };
        let mut results = vec![("scd", scd_pasted)];
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
                id: ex.id.clone(),
                kind: case.kind.clone(),
                method,
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
/// then `all`, every budget, every method that ran.
fn rows(outcomes: &[Outcome], budgets: &[f32]) -> Vec<Row> {
    let mut kinds: Vec<&str> = Vec::new();
    for o in outcomes {
        if !kinds.contains(&o.kind.as_str()) {
            kinds.push(&o.kind);
        }
    }
    kinds.push("all");
    let mut out = Vec::new();
    for kind in kinds {
        for &budget in budgets {
            for method in METHODS {
                let xs: Vec<&Outcome> = outcomes
                    .iter()
                    .filter(|o| (kind == "all" || o.kind == kind) && o.budget == budget && o.method == method)
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
    let mut series: Vec<plot::Series> = Vec::new();
    for r in rows.iter().filter(|r| r.kind == "all") {
        let point = (r.reduction_ratio, r.gold_lines_kept);
        match series.iter_mut().find(|s| s.label == r.method) {
            Some(s) => s.points.push(point),
            None => series.push(plot::Series { label: r.method.clone(), points: vec![point] }),
        }
    }
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
    let cases = load_all(&a.paths, a.limit).with_context(|| format!("--data {}", shown.join(" ")))?;
    let encoder = Arc::new(model.load_encoder()?);
    let model_id = encoder.model_id().to_string();
    let scd = Scd::new(encoder.clone(), a.cfg.clone());
    let opts = CompressOptions { budget_tokenizer: a.tokenizer.clone(), ..Default::default() };
    let tok_name = a.tokenizer.as_ref().map_or("e5 (the encoder's)".to_string(), |t| t.name().to_string());
    let count = |t: &str| match &a.tokenizer {
        Some(tok) => tok.count(t),
        None => encoder.count_tokens(t),
    };
    let bar = ProgressBar::new(cases.len() as u64);
    bar.set_style(ProgressStyle::with_template("{bar:40} {pos}/{len} cases {per_sec} eta {eta}")?);
    let mut outcomes = Vec::new();
    for case in &cases {
        outcomes.extend(run_case(&scd, &opts, case, &a.budgets, &count, a.scd_only)?);
        bar.inc(1);
    }
    bar.finish_and_clear();
    let rows = rows(&outcomes, &a.budgets);
    let kinds = kind_counts(&cases);
    let per_kind: Vec<String> = kinds.iter().map(|(k, n)| format!("{k} {n}")).collect();
    println!(
        "{} agent cases ({}) with {model_id}; budgets and tokens in {tok_name}; gold lines kept, all kept",
        cases.len(),
        per_kind.join(", ")
    );
    print!("{}", table(&rows));
    let methods = if a.scd_only { &METHODS[..1] } else { &METHODS[..] };
    let kinds: BTreeMap<String, usize> = kinds.into_iter().collect();
    let command = std::env::args().collect::<Vec<_>>().join(" ");
    let report = serde_json::json!({
        "command": command, "dataset": "agent", "model": model_id, "budget_tokenizer": tok_name, "files": shown,
        "examples": cases.len(), "kinds": kinds, "methods": methods, "results": rows,
    });
    write_outputs(&a, report, &rows, &outcomes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcome(id: &str, kind: &str, method: &'static str, kept: f32, sent: usize) -> Outcome {
        Outcome {
            id: id.into(),
            kind: kind.into(),
            method,
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
        let rows = rows(&outcomes, &[0.1]);
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
}
