//! `scd-dev eval --dataset agent --adaptive`: what follow-ups send over
//! agent material. Per case, budget and SCD setting: the first answer opens
//! a session at the budget; the case's own task asked again as a follow-up
//! (at the same budget) should bring gold the first answer missed; in a
//! second session, the next case's task of another kind (another context's
//! question) asked as a follow-up should bring nothing; and where another
//! case of the kind has the same context (a second question about the same
//! material), its task asked as a follow-up should bring its gold. Reported
//! per kind: gold lines kept by the first answer and with the follow-up,
//! the off-topic follow-ups that got nothing and their share of the
//! budget, and the second questions' gold kept before and with theirs.

use anyhow::Context as _;
use indicatif::{ProgressBar, ProgressStyle};
use scd_engine::cancel::Cancel;
use scd_engine::context::{ContextRequirement, Task};
use scd_engine::eval::agent::{gold_lines_kept, AgentCase};
use scd_engine::eval::{selection, sent_spans};
use scd_engine::extract::{CompressOptions, CompressRequest, ContextRequest, MoreContext, Scd, SessionRequest};
use serde::Serialize;

use super::plot;

/// One case's follow-ups under one setting at one budget.
#[derive(Debug, Clone, Serialize)]
pub(super) struct Probe {
    id: String,
    kind: String,
    method: String,
    budget: f32,
    budget_tokens: usize,
    /// Gold lines the first answer kept.
    first_kept: f32,
    /// With the on-topic follow-up's chunks too.
    with_follow_up_kept: f32,
    /// The on-topic follow-up's tokens.
    follow_up_tokens: usize,
    /// The on-topic follow-up's reason.
    follow_up_reason: Option<String>,
    /// The on-topic follow-up's chunks.
    follow_up_chunks: Vec<String>,
    /// The off-topic follow-up's tokens.
    off_topic_tokens: usize,
    /// The off-topic follow-up's reason.
    off_topic_reason: Option<String>,
    /// The off-topic follow-up's chunks.
    off_topic_chunks: Vec<String>,
    /// A second question about the same context, when a case has one.
    #[serde(flatten)]
    second: Option<Second>,
}

/// A second question about a case's context: another case's task with the
/// same context, asked as a follow-up after the first answer.
#[derive(Debug, Clone, Serialize)]
struct Second {
    /// The case whose task it is.
    second_id: String,
    /// Its gold lines the first answer already kept.
    second_first_kept: f32,
    /// With its follow-up's chunks too.
    second_kept: f32,
    /// Its follow-up's tokens.
    second_tokens: usize,
    /// Its follow-up's reason.
    second_reason: Option<String>,
    /// Its follow-up's chunks.
    second_chunks: Vec<String>,
}

/// Means over one kind's (or `all`) probes for one setting and budget.
#[derive(Debug, Clone, Serialize)]
struct ProbeRow {
    kind: String,
    method: String,
    budget: f32,
    n: usize,
    first_kept: f32,
    with_follow_up_kept: f32,
    follow_up_share: f32,
    off_topic_empty: f32,
    off_topic_share: f32,
    /// Probes with a second question; the means over them (none when none).
    second_n: usize,
    second_first_kept: Option<f32>,
    second_kept: Option<f32>,
    second_empty: Option<f32>,
}

/// The first answer to `case`'s task at `budget` with a session, and a
/// follow-up asking `question` in it.
fn ask(
    scd: &Scd,
    opts: &CompressOptions,
    case: &AgentCase,
    budget: usize,
    question: &str,
) -> anyhow::Result<(scd_engine::extract::Compressed, MoreContext)> {
    let ex = &case.example;
    let req = CompressRequest {
        task: Task::new(ex.question.clone()),
        context: ex.context.clone(),
        requirement: ContextRequirement::with_budget(budget),
        session: Some(SessionRequest::default()),
    };
    let first = scd.compress_opts(&req, opts, &Cancel::new())?;
    let grant = first.session.clone().context("the first answer opened no session")?;
    let more = scd.request_more(&ContextRequest {
        session_id: grant.id.clone(),
        session_token: grant.token.clone(),
        specific_question: question.to_string(),
        current_confidence: 0.3,
        max_tokens: Some(budget),
        ..Default::default()
    })?;
    scd.close_session(&grant.id, &grant.token, None, None)?;
    Ok((first, more))
}

/// `question` asked as a follow-up after `case`'s first answer at `budget`,
/// scored by `gold`'s gold lines (`case`'s own, or a case with the same
/// context): those the first answer kept, those kept with the follow-up,
/// and the follow-up.
fn scored_follow_up(
    (scd, opts): (&Scd, &CompressOptions),
    case: &AgentCase,
    budget: usize,
    question: &str,
    gold: &AgentCase,
) -> anyhow::Result<(f32, f32, MoreContext)> {
    let ex = &case.example;
    let (first, more) = ask(scd, opts, case, budget, question)?;
    let mut spans = sent_spans(ex, &first);
    let first_kept = gold_lines_kept(gold, &spans).0;
    spans.extend(selection(ex, &more.chunks));
    Ok((first_kept, gold_lines_kept(gold, &spans).0, more))
}

/// The ids of the chunks a follow-up sent.
fn ids(more: &MoreContext) -> Vec<String> {
    more.chunks.iter().map(|c| c.id.clone()).collect()
}

/// Case `case` under setting `method` at budget fraction `frac` of its
/// `total` tokens, `other` being another case's task and `second` a case
/// with the same context, if any.
pub(super) fn probe(
    (method, scd): (&str, &Scd),
    opts: &CompressOptions,
    case: &AgentCase,
    (frac, total): (f32, usize),
    (other, second): (&str, Option<&AgentCase>),
) -> anyhow::Result<Probe> {
    let ex = &case.example;
    let budget = scd_engine::eval::budget_at(total, frac);
    let (first_kept, with_follow_up_kept, on) = scored_follow_up((scd, opts), case, budget, &ex.question, case)?;
    let (_, off) = ask(scd, opts, case, budget, other)?;
    let second = second.map(|s| -> anyhow::Result<Second> {
        let (second_first_kept, second_kept, more) =
            scored_follow_up((scd, opts), case, budget, &s.example.question, s)?;
        Ok(Second {
            second_id: s.example.id.clone(),
            second_first_kept,
            second_kept,
            second_tokens: more.sent_tokens,
            second_chunks: ids(&more),
            second_reason: more.reason,
        })
    });
    let second = second.transpose()?;
    Ok(Probe {
        id: ex.id.clone(),
        kind: case.kind.clone(),
        method: method.to_string(),
        budget: frac,
        budget_tokens: budget,
        first_kept,
        with_follow_up_kept,
        follow_up_tokens: on.sent_tokens,
        follow_up_chunks: ids(&on),
        follow_up_reason: on.reason,
        off_topic_tokens: off.sent_tokens,
        off_topic_chunks: ids(&off),
        off_topic_reason: off.reason,
        second,
    })
}

/// Every case's probes: per case, the task of the next case of another
/// kind (in the loaded order, wrapping; the next case when all are of one
/// kind) is its off-topic question: cases of one kind may share a context.
/// The next case (wrapping) of the same kind with the same context and
/// another task, if any, asks the second question.
pub(super) fn run_all(
    scds: &[(String, Scd)],
    opts: &CompressOptions,
    cases: &[AgentCase],
    budgets: &[f32],
    count: &dyn Fn(&str) -> scd_engine::Result<usize>,
) -> anyhow::Result<Vec<Probe>> {
    let bar = ProgressBar::new(cases.len() as u64);
    bar.set_style(ProgressStyle::with_template("{bar:40} {pos}/{len} cases {per_sec} eta {eta}")?);
    let mut out = Vec::new();
    for (i, case) in cases.iter().enumerate() {
        let total = super::eval_agent_cases::case_tokens(case, count)?;
        let n = cases.len();
        // the other cases, from the next one on, wrapping
        let after = || (1..n).map(|k| &cases[(i + k) % n]);
        let other = &after().find(|c| c.kind != case.kind).unwrap_or(&cases[(i + 1) % n]).example.question;
        let second = after().find(|c| {
            c.kind == case.kind
                && c.example.context == case.example.context
                && c.example.question != case.example.question
        });
        for &frac in budgets {
            for (method, scd) in scds {
                let p = probe((method, scd), opts, case, (frac, total), (other, second));
                out.push(p.with_context(|| format!("case {}", case.example.id))?);
            }
        }
        bar.inc(1);
    }
    bar.finish_and_clear();
    Ok(out)
}

/// Per kind (in order of first appearance, then `all`), budget and setting.
fn rows(probes: &[Probe]) -> Vec<ProbeRow> {
    let mut keys: Vec<(&str, f32)> = Vec::new();
    for p in probes {
        if !keys.contains(&(p.method.as_str(), p.budget)) {
            keys.push((&p.method, p.budget));
        }
    }
    let mut out = Vec::new();
    for kind in super::eval_agent_cases::kinds_then_all(probes.iter().map(|p| p.kind.as_str())) {
        for &(method, budget) in &keys {
            let xs: Vec<&Probe> = probes
                .iter()
                .filter(|p| (kind == "all" || p.kind == kind) && p.method == method && p.budget == budget)
                .collect();
            let n = xs.len().max(1) as f32;
            let mean = |f: &dyn Fn(&Probe) -> f32| xs.iter().map(|p| f(p)).sum::<f32>() / n;
            let seconds: Vec<&Second> = xs.iter().filter_map(|p| p.second.as_ref()).collect();
            let n2 = seconds.len() as f32;
            let mean2 = |f: &dyn Fn(&Second) -> f32| {
                (!seconds.is_empty()).then(|| seconds.iter().map(|s| f(s)).sum::<f32>() / n2)
            };
            out.push(ProbeRow {
                kind: kind.to_string(),
                method: method.to_string(),
                budget,
                n: xs.len(),
                first_kept: mean(&|p| p.first_kept),
                with_follow_up_kept: mean(&|p| p.with_follow_up_kept),
                follow_up_share: mean(&|p| p.follow_up_tokens as f32 / p.budget_tokens as f32),
                off_topic_empty: mean(&|p| f32::from(u8::from(p.off_topic_tokens == 0))),
                off_topic_share: mean(&|p| p.off_topic_tokens as f32 / p.budget_tokens as f32),
                second_n: seconds.len(),
                second_first_kept: mean2(&|s| s.second_first_kept),
                second_kept: mean2(&|s| s.second_kept),
                second_empty: mean2(&|s| f32::from(u8::from(s.second_tokens == 0))),
            });
        }
    }
    out
}

/// A mean to three places, `-` when there was nothing to average.
fn shown(x: Option<f32>) -> String {
    x.map_or("-".into(), |x| format!("{x:.3}"))
}

/// Prints the table and writes the report, the plot (gold lines kept with
/// the follow-up against the first answer's reduction, per setting, over
/// all kinds) and `per_example`'s lines.
pub(super) fn report(
    probes: &[Probe],
    header: serde_json::Value,
    (report, plot_path): (&std::path::Path, &std::path::Path),
    per_example: Option<&std::path::Path>,
) -> anyhow::Result<()> {
    let rows = rows(probes);
    println!(
        "{:<6} {:<32} {:>6} {:>4} {:>7} {:>9} {:>9} {:>9} {:>9} {:>5} {:>9} {:>9} {:>9}",
        "kind",
        "method",
        "budget",
        "n",
        "first",
        "+follow",
        "fu_share",
        "off_empty",
        "off_share",
        "n2",
        "2nd_first",
        "2nd_kept",
        "2nd_empty"
    );
    for r in &rows {
        println!(
            "{:<6} {:<32} {:>6.2} {:>4} {:>7.3} {:>9.3} {:>9.3} {:>9.3} {:>9.3} {:>5} {:>9} {:>9} {:>9}",
            r.kind,
            r.method,
            r.budget,
            r.n,
            r.first_kept,
            r.with_follow_up_kept,
            r.follow_up_share,
            r.off_topic_empty,
            r.off_topic_share,
            r.second_n,
            shown(r.second_first_kept),
            shown(r.second_kept),
            shown(r.second_empty)
        );
    }
    let mut out = header;
    out["mode"] = "follow-ups".into();
    out["results"] = serde_json::to_value(&rows)?;
    std::fs::write(report, serde_json::to_string_pretty(&out)?)
        .with_context(|| format!("--report {}", report.display()))?;
    if let Some(p) = per_example {
        let lines: Vec<String> = probes.iter().map(serde_json::to_string).collect::<Result<_, _>>()?;
        std::fs::write(p, lines.join("\n") + "\n").with_context(|| format!("--per-example {}", p.display()))?;
    }
    let all = rows.iter().filter(|r| r.kind == "all");
    let series = plot::by_label(all.map(|r| (r.method.as_str(), (1.0 / r.budget, r.with_follow_up_kept))));
    let title = "agent follow-ups: gold lines kept with the follow-up vs the first answer's reduction";
    plot::write_recall_vs_reduction(plot_path, title, &series)?;
    eprintln!("wrote {} and {}", report.display(), plot_path.display());
    Ok(())
}
