//! `scd-dev eval --adaptive`: the adaptive loop of paper §6.3 on MuSiQue,
//! beside one-shot at the same total tokens, in the same run.
//!
//! Per example and first-answer budget `b` (a fraction of the context's
//! tokens): round 1 compresses the multi-hop question at `b` and opens a
//! session; then each later hop's question from `question_decomposition`
//! (`#n` filled with hop n's answer) is a `RequestContext` at confidence 0.3
//! with its own budget (`--hop-budget` of the context). One-shot compresses
//! the question once, at the tokens the adaptive loop sent in all. Both are
//! scored by the same evidence recall (a supporting paragraph is kept when
//! 90 % of it was sent); the report gives every fold's difference.

use anyhow::Context as _;
use indicatif::{ProgressBar, ProgressStyle};
use scd_engine::cancel::Cancel;
use scd_engine::context::{ContextRequirement, Task};
use scd_engine::eval::{evidence_recall, gold_kept, selection, Dataset, Example};
use scd_engine::extract::{CompressOptions, CompressRequest, ContextRequest, Scd, SessionRequest};
use serde::Serialize;

use super::plot;

/// What one example gave at one budget.
struct Outcome {
    adaptive: (f32, bool),
    one_shot: (f32, bool),
    context_tokens: usize,
    first_tokens: usize,
    total_tokens: usize,
    follow_ups: usize,
    answered: usize,
    /// The off-topic probe's tokens, as a share of a follow-up's budget.
    off_topic: f32,
    /// The example's line for `--per-example`.
    record: serde_json::Value,
}

/// Means over a set of outcomes.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    examples: usize,
    adaptive_all_kept: f32,
    one_shot_all_kept: f32,
    all_kept_gain: f32,
    adaptive_recall: f32,
    one_shot_recall: f32,
    first_answer_reduction: f32,
    total_reduction: f32,
    mean_total_tokens: f32,
    follow_ups: usize,
    follow_ups_with_chunks: usize,
    /// Off-topic probes (another example's question, after the loop) that
    /// got nothing.
    off_topic_empty: f32,
    /// The off-topic probes' tokens, as a share of a follow-up's budget.
    off_topic_share: f32,
}

fn summarize(xs: &[&Outcome]) -> Summary {
    let n = xs.len().max(1) as f32;
    let mean = |f: &dyn Fn(&Outcome) -> f32| xs.iter().map(|o| f(o)).sum::<f32>() / n;
    let kept = |b: bool| f32::from(u8::from(b));
    let a_all = mean(&|o| kept(o.adaptive.1));
    let o_all = mean(&|o| kept(o.one_shot.1));
    Summary {
        examples: xs.len(),
        adaptive_all_kept: a_all,
        one_shot_all_kept: o_all,
        all_kept_gain: a_all - o_all,
        adaptive_recall: mean(&|o| o.adaptive.0),
        one_shot_recall: mean(&|o| o.one_shot.0),
        first_answer_reduction: mean(&|o| o.context_tokens as f32 / o.first_tokens.max(1) as f32),
        total_reduction: mean(&|o| o.context_tokens as f32 / o.total_tokens.max(1) as f32),
        mean_total_tokens: mean(&|o| o.total_tokens as f32),
        follow_ups: xs.iter().map(|o| o.follow_ups).sum(),
        follow_ups_with_chunks: xs.iter().map(|o| o.answered).sum(),
        off_topic_empty: mean(&|o| kept(o.off_topic == 0.0)),
        off_topic_share: mean(&|o| o.off_topic),
    }
}

/// One example at first budget `frac` and follow-ups of `hop`; after the
/// loop, `off_topic` (another example's question) probes whether a
/// follow-up the context cannot answer gets filler.
fn one_example(
    scd: &Scd,
    opts: &CompressOptions,
    (ex, off_topic): (&Example, &str),
    frac: f32,
    hop: f32,
) -> anyhow::Result<Outcome> {
    let request = |budget: usize, session: Option<SessionRequest>| CompressRequest {
        task: Task::new(ex.question.clone()),
        context: ex.context.clone(),
        requirement: ContextRequirement::with_budget(budget),
        session,
    };
    // the context's size in the budget tokenizer, from a 1-token probe
    let probe = scd.compress_opts(&request(1, None), opts, &Cancel::new());
    let context_tokens = match probe {
        Ok(out) => out.totals.context_tokens,
        Err(_) => ex.context.fields.iter().map(|f| f.content.len() / 4).sum(),
    };
    let first_budget = ((context_tokens as f32 * frac) as usize).max(1);
    let hop_budget = ((context_tokens as f32 * hop) as usize).max(1);
    let first = scd.compress_opts(&request(first_budget, Some(SessionRequest::default())), opts, &Cancel::new())?;
    let grant = first.session.clone().context("the first answer opened no session")?;
    let mut chunks = first.chunks.clone();
    let mut total = first.totals.sent_tokens;
    let mut answered = 0;
    let mut steps =
        vec![serde_json::json!({"sent_tokens": first.totals.sent_tokens, "chunks": sent_chunks(&first.chunks)})];
    let ask = |q: &str| {
        scd.request_more(&ContextRequest {
            session_id: grant.id.clone(),
            session_token: grant.token.clone(),
            specific_question: q.to_string(),
            current_confidence: 0.3,
            max_tokens: Some(hop_budget),
            request_id: None,
            ..Default::default()
        })
    };
    for q in &ex.follow_ups {
        let more = ask(q)?;
        answered += usize::from(!more.chunks.is_empty());
        total += more.sent_tokens;
        steps.push(
            serde_json::json!({"question": q, "sent_tokens": more.sent_tokens, "chunks": sent_chunks(&more.chunks),
            "reason": more.reason}),
        );
        chunks.extend(more.chunks);
    }
    // not counted in the loop's tokens or recall
    let probe = ask(off_topic)?;
    let probe_step = serde_json::json!({"question": off_topic, "sent_tokens": probe.sent_tokens,
        "chunks": sent_chunks(&probe.chunks), "reason": probe.reason});
    scd.close_session(&grant.id, &grant.token, None, None)?;
    let adaptive_spans = selection(ex, &chunks);
    let adaptive = evidence_recall(ex, &adaptive_spans, Dataset::Musique);
    let one = scd.compress_opts(&request(total.max(1), None), opts, &Cancel::new())?;
    let one_shot_spans = selection(ex, &one.chunks);
    let one_shot = evidence_recall(ex, &one_shot_spans, Dataset::Musique);
    let record = serde_json::json!({"id": ex.id, "first_budget": as_written(frac), "first_tokens": first_budget,
        "hop_tokens": hop_budget, "context_tokens": context_tokens, "steps": steps, "off_topic": probe_step,
        "gold": kept_by_each(ex, [&selection(ex, &first.chunks), &adaptive_spans, &one_shot_spans]),
        "adaptive_all_kept": adaptive.1, "one_shot_all_kept": one_shot.1});
    Ok(Outcome {
        adaptive,
        one_shot,
        context_tokens,
        first_tokens: first.totals.sent_tokens,
        total_tokens: total,
        follow_ups: ex.follow_ups.len(),
        answered,
        off_topic: probe.sent_tokens as f32 / hop_budget as f32,
        record,
    })
}

/// A budget fraction as the flag wrote it (0.1, not the f32's 0.10000000149).
fn as_written(frac: f32) -> f64 {
    (f64::from(frac) * 1e6).round() / 1e6
}

/// A step's chunks for `--per-example`: id, tokens and score of each.
fn sent_chunks(chunks: &[scd_engine::extract::SelectedChunk]) -> Vec<serde_json::Value> {
    chunks.iter().map(|c| serde_json::json!([c.id, c.tokens, (f64::from(c.score) * 1e3).round() / 1e3])).collect()
}

/// Per supporting paragraph: its field and whether each selection (the
/// first answer's, the adaptive loop's, one-shot's) kept it.
fn kept_by_each(ex: &Example, spans: [&[(usize, (usize, usize))]; 3]) -> Vec<serde_json::Value> {
    let [first, adaptive, one_shot] = spans.map(|s| gold_kept(ex, s, Dataset::Musique));
    ex.gold
        .iter()
        .enumerate()
        .map(|(g, &(f, _))| {
            serde_json::json!({"field": ex.context.fields[f].name, "first": first[g], "adaptive": adaptive[g],
                "one_shot": one_shot[g]})
        })
        .collect()
}

/// One adaptive run, as its flags set it.
pub(super) struct AdaptiveRun<'a> {
    /// The first answers' budgets, as fractions of each context.
    pub(super) budgets: &'a [f32],
    /// Each follow-up's budget, as a fraction of the context.
    pub(super) hop_budget: f32,
    /// The folds the report splits the examples into.
    pub(super) folds: usize,
    /// The encoder's id.
    pub(super) model_id: &'a str,
    /// The configuration: `defaults`, or the swept setting in their place.
    pub(super) settings: &'a str,
    /// Where the JSON report goes.
    pub(super) report: &'a std::path::Path,
    /// Where the plot goes.
    pub(super) plot: &'a std::path::Path,
    /// Where each (example, first budget)'s JSON line goes, if asked.
    pub(super) per_example: Option<&'a std::path::Path>,
}

/// Runs the adaptive evaluation: a table, the JSON report and the plot.
pub(super) fn run(scd: &Scd, opts: &CompressOptions, examples: &[Example], run: &AdaptiveRun) -> anyhow::Result<()> {
    let &AdaptiveRun { budgets, hop_budget, folds, model_id, settings, report, plot: plot_path, per_example } = run;
    anyhow::ensure!(hop_budget > 0.0 && hop_budget <= 1.0, "--hop-budget: must be in (0, 1], got {hop_budget}");
    anyhow::ensure!(folds >= 2, "--folds: at least 2, got {folds}");
    let examples: Vec<&Example> = examples.iter().filter(|e| !e.follow_ups.is_empty()).collect();
    anyhow::ensure!(!examples.is_empty(), "--adaptive: no example has a question_decomposition of two hops or more");
    let bar = ProgressBar::new((examples.len() * budgets.len()) as u64);
    bar.set_style(ProgressStyle::with_template("{bar:40} {pos}/{len} (example, budget) {per_sec} eta {eta}")?);
    let mut rows = Vec::new();
    let mut lines = String::new();
    let mut series = vec![
        plot::Series { label: "adaptive".into(), points: vec![] },
        plot::Series { label: "one-shot".into(), points: vec![] },
    ];
    for &frac in budgets {
        let mut outcomes = Vec::new();
        for (i, ex) in examples.iter().enumerate() {
            // the next example's question: about another context
            let off_topic = &examples[(i + 1) % examples.len()].question;
            let outcome = one_example(scd, opts, (ex, off_topic), frac, hop_budget);
            outcomes.push(outcome.with_context(|| format!("example {}", ex.id))?);
            bar.inc(1);
        }
        lines.extend(outcomes.iter().map(|o| format!("{}\n", o.record)));
        let all: Vec<&Outcome> = outcomes.iter().collect();
        let overall = summarize(&all);
        // folds by position: example i is in fold i mod k
        let by_fold: Vec<Summary> = (0..folds)
            .map(|k| {
                summarize(
                    &outcomes.iter().enumerate().filter(|(i, _)| i % folds == k).map(|(_, o)| o).collect::<Vec<_>>(),
                )
            })
            .collect();
        series[0].points.push((overall.total_reduction, overall.adaptive_all_kept));
        series[1].points.push((overall.total_reduction, overall.one_shot_all_kept));
        rows.push((frac, overall, by_fold));
    }
    bar.finish_and_clear();
    println!("{} MuSiQue examples with {model_id}; follow-ups at {hop_budget} of the context each", examples.len());
    println!(
        "{:>6} {:>9} {:>9} {:>7} {:>8} {:>8} {:>7} {:>7} {:>9} {:>9} {:>9}  gain by fold",
        "first",
        "adaptive",
        "one-shot",
        "gain",
        "rec_ad",
        "rec_one",
        "1st_x",
        "total_x",
        "answered",
        "off_empty",
        "off_share"
    );
    for (frac, o, by_fold) in &rows {
        let folds: Vec<String> = by_fold.iter().map(|f| format!("{:+.3}", f.all_kept_gain)).collect();
        println!(
            "{:>6.2} {:>9.3} {:>9.3} {:>+7.3} {:>8.3} {:>8.3} {:>7.2} {:>7.2} {:>4}/{:<4} {:>9.3} {:>9.3}  {}",
            frac,
            o.adaptive_all_kept,
            o.one_shot_all_kept,
            o.all_kept_gain,
            o.adaptive_recall,
            o.one_shot_recall,
            o.first_answer_reduction,
            o.total_reduction,
            o.follow_ups_with_chunks,
            o.follow_ups,
            o.off_topic_empty,
            o.off_topic_share,
            folds.join(" ")
        );
    }
    let rows: Vec<serde_json::Value> = rows
        .iter()
        .map(|(frac, o, f)| {
            serde_json::json!({"first_budget": as_written(*frac), "hop_budget": as_written(hop_budget),
                "overall": o, "folds": f})
        })
        .collect();
    let out = serde_json::json!({"dataset": "musique", "mode": "adaptive", "model": model_id,
        "settings": settings, "examples": examples.len(), "folds": folds, "results": rows});
    std::fs::write(report, serde_json::to_string_pretty(&out)?)
        .with_context(|| format!("--report {}", report.display()))?;
    plot::write_recall_vs_reduction(
        plot_path,
        "MuSiQue: all supporting paragraphs kept vs total token reduction",
        &series,
    )?;
    if let Some(p) = per_example {
        std::fs::write(p, lines).with_context(|| format!("--per-example {}", p.display()))?;
    }
    eprintln!("wrote {} and {}", report.display(), plot_path.display());
    Ok(())
}
