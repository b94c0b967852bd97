//! What is sent never counts more than the budget in o200k, on every dev
//! dataset, at budgets of 10 % to 50 % of the context's o200k tokens. The
//! guarantee is packing's, whatever the scores: a hash encoder keeps it fast.

use std::sync::Arc;

use scd_engine::budget::builtin;
use scd_engine::cancel::Cancel;
use scd_engine::context::{Context, ContextRequirement, Task};
use scd_engine::encoder::HashEncoder;
use scd_engine::eval::{load, Dataset};
use scd_engine::extract::{CompressOptions, CompressRequest, Compressed, Scd, ScdConfig};
use scd_engine::handoff::{envelope, render_selection, Format};
use scd_engine::Error;

const EXAMPLES: usize = 30;

fn check(name: &str, cases: Vec<(String, Context)>) {
    assert!(cases.len() >= 20, "{name}: only {} examples", cases.len());
    let scd = Scd::new(Arc::new(HashEncoder::new(128, 512)), ScdConfig::default());
    let o200k = builtin("o200k").unwrap();
    let opts = CompressOptions { budget_tokenizer: Some(o200k.clone()), ..Default::default() };
    let (mut checked, mut rendered, mut too_small) = (0, 0, 0);
    for (task, context) in cases {
        let total: usize = context.fields.iter().map(|f| o200k.count(&f.content).unwrap()).sum();
        for frac in [0.1, 0.2, 0.3, 0.4, 0.5] {
            let budget = ((total as f64 * frac) as usize).max(1);
            let req = CompressRequest {
                task: Task::new(task.clone()),
                context: context.clone(),
                requirement: ContextRequirement::with_budget(budget),
                session: None,
            };
            let out = scd.compress_opts(&req, &opts, &Cancel::new()).unwrap();
            let sent = o200k.count(&out.sent_text()).unwrap();
            assert!(sent <= budget, "{name} {task:?} at {frac}: {sent} o200k tokens over the budget {budget}");
            assert_eq!(out.totals.sent_tokens, sent);
            assert_eq!(out.totals.context_tokens, total);
            checked += 1;
            // a rendered report counts whole, its sections and summary included
            for format in [Format::Freeform, Format::SemiStructured, Format::StructuredSoft] {
                let opts = CompressOptions { envelope: Some(envelope(&req, format, None)), ..opts.clone() };
                match scd.compress_opts(&req, &opts, &Cancel::new()) {
                    Ok(out) => {
                        let n = o200k.count(&out.text).unwrap();
                        assert!(n <= budget, "{name} {format:?} at {frac}: {n} o200k tokens over {budget}");
                        assert_eq!(out.totals.sent_tokens, n);
                        assert_eq!(out.text, render_selection(&out, &req, format, None));
                        rendered += 1;
                    }
                    // only when the report's own text, with no chunk, is over the budget
                    Err(Error::BudgetTooSmall { needed, .. }) => {
                        let empty = Compressed { chunks: vec![], ..out.clone() };
                        let bare = o200k.count(&render_selection(&empty, &req, format, None)).unwrap();
                        assert!(bare > budget && needed == bare, "{name} {format:?}: {needed} vs {bare} > {budget}");
                        too_small += 1;
                    }
                    Err(e) => panic!("{name} {format:?}: {e}"),
                }
            }
        }
    }
    eprintln!(
        "{name}: {checked} compressions and {rendered} reports within the o200k budget ({too_small} budgets \
         under a bare report)"
    );
    assert!(rendered > 3 * checked / 2, "{name}: only {rendered} of {} reports fit", 3 * checked);
}

fn dataset(dataset: Dataset, rel: &str) {
    let Some(path) = evaldata(rel) else { return };
    let cases = load(dataset, &path, EXAMPLES).unwrap().into_iter().map(|e| (e.question, e.context)).collect();
    check(rel, cases);
}

use super::evaldata;

#[test]
fn hotpotqa_within_o200k_budget() {
    dataset(Dataset::HotpotQa, "hotpotqa/hotpot_hf_schema.jsonl");
}

#[test]
fn squad_within_o200k_budget() {
    dataset(Dataset::Squad, "squad_v2/squad_v2_dev_subset.json");
}

#[test]
fn musique_within_o200k_budget() {
    dataset(Dataset::Musique, "musique/musique_ans_sample.jsonl");
}

#[test]
fn twowiki_within_o200k_budget() {
    dataset(Dataset::TwoWiki, "2wikimultihopqa/2wiki_sample.json");
}

/// The code set's lines are `{task, context, ...}` (read here until its
/// loader is in `eval`).
#[test]
fn code_within_o200k_budget() {
    let Some(path) = evaldata("code/code_search_dev.jsonl") else { return };
    let cases = std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .take(EXAMPLES)
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            (v["task"].as_str().unwrap().to_string(), serde_json::from_value(v["context"].clone()).unwrap())
        })
        .collect();
    check("code", cases);
}
