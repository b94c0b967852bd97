//! The shared agent development set (`../shared/evaldata/agent`): it loads
//! strictly, its gold lines are where SOURCE.md says, and the line
//! baselines stay within cl100k budgets on it, counted on the text they
//! paste.

use scd_engine::budget::builtin;
use scd_engine::eval::agent::{gold_lines_kept, load_all, AgentCase};
use scd_engine::eval::line_baselines::{bm25_order, first_n, grep_order, paste, pasted_text, units, Pasted};

use super::evaldata;

fn cases() -> Option<Vec<AgentCase>> {
    let path = evaldata("agent/agent_dev.jsonl")?;
    Some(load_all(&[path], 1000).expect("agent_dev.jsonl loads"))
}

#[test]
fn the_shared_agent_dev_set_loads_with_its_kinds_and_gold_lines() {
    let Some(cases) = cases() else { return };
    assert_eq!(cases.len(), 42);
    let n = |k: &str| cases.iter().filter(|c| c.kind == k).count();
    assert_eq!((n("logs"), n("docs"), n("json"), n("chat")), (12, 10, 10, 10));
    for c in &cases {
        let fields = &c.example.context.fields;
        assert!(!c.gold_lines.is_empty(), "{}", c.example.id);
        for &(f, (a, b)) in &c.gold_lines {
            let line = &fields[f].content[a..b];
            assert!(!line.trim().is_empty() && !line.contains('\n'), "{}: {line:?}", c.example.id);
        }
        let whole: Vec<_> = (0..fields.len()).map(|f| (f, (0, fields[f].content.len()))).collect();
        assert_eq!(gold_lines_kept(c, &whole), (1.0, true), "{}", c.example.id);
        assert_eq!(gold_lines_kept(c, &[]), (0.0, false), "{}", c.example.id);
    }
    // lines counted at newlines only: the Elixir log's gold (268-269) is the compile error, not a
    // progress bar that a split at `\r` would put there
    let elixir = cases.iter().find(|c| c.example.id == "logs-elixir-doctest-compile").unwrap();
    let (f, (a, b)) = elixir.gold_lines[1];
    assert!(elixir.example.context.fields[f].content[a..b].contains("(CompileError)"));
}

fn check(case: &AgentCase, p: &Pasted, budget: usize, count: &dyn Fn(&str) -> scd_engine::Result<usize>) {
    let id = &case.example.id;
    assert!(p.tokens <= budget, "{id}: {} over {budget}", p.tokens);
    assert!(p.selected.windows(2).all(|w| w[0] < w[1]), "{id}: file order");
    let text: Vec<&str> = p.selected.iter().map(|&(f, (a, b))| &case.example.context.fields[f].content[a..b]).collect();
    assert_eq!(count(&text.join("\n")).unwrap(), p.tokens, "{id}: the pasted text is what was counted");
}

#[test]
fn line_baselines_stay_within_cl100k_budgets_on_the_shared_set() {
    let Some(cases) = cases() else { return };
    let tok = builtin("cl100k").expect("built in");
    let count = |t: &str| tok.count(t);
    for case in cases.iter().step_by(4) {
        let ex = &case.example;
        let total: usize = ex.context.fields.iter().map(|f| tok.count(&f.content).unwrap()).sum();
        let lines = units(ex, &count).unwrap();
        let grep = grep_order(ex, &lines);
        assert!(!grep.is_empty() && grep.windows(2).all(|w| w[0] < w[1]), "{}", ex.id);
        let bm25 = bm25_order(ex, &lines);
        for frac in [0.1f32, 0.2] {
            let budget = (total as f32 * frac) as usize;
            let got = [
                paste(ex, &lines, &grep, budget, &count).unwrap(),
                paste(ex, &lines, &bm25, budget, &count).unwrap(),
                first_n(ex, &lines, budget, &count).unwrap(),
            ];
            for p in &got {
                check(case, p, budget, &count);
            }
            // BM25 ranks every line, so it fills most of its budget (lines are short beside 10 % of a context)
            assert!(got[1].tokens * 10 >= budget * 7, "{}: {} of {budget}", ex.id, got[1].tokens);
        }
        assert!(pasted_text(ex, &lines, &[]).is_empty());
    }
}
