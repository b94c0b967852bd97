//! Line baselines: what a user or an agent without SCD pastes from logs,
//! docs, JSON and notes, over the same budget and in the same tokenizer.
//!
//! The units are an example's non-blank lines (its `sentences`, as the
//! agent loader sets them). Each baseline pastes its lines in file order
//! joined by `\n` and counts that text in the budget tokenizer; it never
//! goes over the budget:
//!
//! - [`grep_order`]: the lines holding a content word of the task
//!   (`grep -i`: lower-cased, stop words out, words of 3 or more letters,
//!   plural and verb endings stripped, matched as substrings), in file order;
//! - [`bm25_order`]: every line by its BM25 score for the task, best first
//!   (ties and unmatched lines in file order);
//! - [`first_n`]: the first lines of every field (`head -n N` on each file,
//!   N as large as fits).
//!
//! ```
//! use scd_engine::eval::line_baselines::{grep_order, paste, units};
//! use scd_engine::eval::agent::parse_case;
//!
//! let line = r#"{"id": "c", "kind": "logs", "task": "Why did the tests fail?",
//!   "context": {"fields": [{"name": "ci.log", "kind": "log", "content": "setup\nTEST a ok\nTest b FAILED\n"}]},
//!   "gold": [{"field": "ci.log", "ranges": [[3, 3]]}]}"#.replace('\n', " ");
//! let ex = parse_case(&line).unwrap().example;
//! let words = |t: &str| -> scd_engine::Result<usize> { Ok(t.split_whitespace().count()) };
//! let units = units(&ex, &words).unwrap();
//! let order = grep_order(&ex, &units);
//! assert_eq!(order, [1, 2], "both test lines, in file order");
//! let pasted = paste(&ex, &units, &order, 4, &words).unwrap();
//! assert_eq!(pasted.tokens, 3, "one line fits in 4 words, with its newline estimate");
//! ```

use super::Example;
use crate::score::Bm25;
use crate::Result;

/// Counts tokens in the budget tokenizer.
pub type Counter<'a> = &'a dyn Fn(&str) -> Result<usize>;

/// A line a baseline may paste.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LineUnit {
    /// Field index.
    pub field: usize,
    /// Byte span in the field's content.
    pub span: (usize, usize),
    /// Tokens the line adds to a paste: the line after a newline, counted.
    pub tokens: usize,
}

/// What a baseline pastes: the (field, byte span) pairs it selected, in
/// file order, and the tokens of the pasted text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pasted {
    /// Selected (field, byte span) pairs, in file order.
    pub selected: Vec<(usize, (usize, usize))>,
    /// Tokens of [`pasted_text`] in the budget tokenizer.
    pub tokens: usize,
}

/// Stop words the grep baseline leaves out (NLTK's English list, the words
/// of 3 letters or more).
const STOP: &[&str] = &[
    "about", "above", "after", "again", "against", "all", "and", "any", "are", "because", "been", "before", "being",
    "below", "between", "both", "but", "can", "could", "did", "does", "doing", "down", "during", "each", "few", "for",
    "from", "further", "had", "has", "have", "having", "her", "here", "hers", "herself", "him", "himself", "his",
    "how", "into", "its", "itself", "just", "more", "most", "myself", "nor", "not", "now", "off", "once", "only",
    "other", "our", "ours", "out", "over", "own", "same", "she", "should", "some", "such", "than", "that", "the",
    "their", "theirs", "them", "then", "there", "these", "they", "this", "those", "through", "too", "under", "until",
    "very", "was", "were", "what", "when", "where", "which", "while", "who", "whom", "why", "will", "with", "would",
    "you", "your", "yours",
];

/// The lines of `ex` as units, each counted after a newline.
pub fn units(ex: &Example, count: Counter) -> Result<Vec<LineUnit>> {
    let mut out = Vec::new();
    for (field, spans) in ex.sentences.iter().enumerate() {
        let content = &ex.context.fields[field].content;
        for &span in spans {
            let tokens = count(&format!("\n{}", &content[span.0..span.1]))?;
            out.push(LineUnit { field, span, tokens });
        }
    }
    Ok(out)
}

fn stem(w: &str) -> &str {
    for suffix in ["ies", "ing", "ed", "es", "s"] {
        if let Some(base) = w.strip_suffix(suffix) {
            if base.chars().count() >= 3 {
                return base;
            }
        }
    }
    w
}

/// The task's content words as `grep -i` patterns: lower-cased, stop
/// words and words under 3 letters out, endings stripped, each once.
pub fn task_words(task: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for w in task.split(|c: char| !c.is_alphanumeric()).map(str::to_lowercase) {
        if w.chars().count() < 3 || STOP.contains(&w.as_str()) {
            continue;
        }
        let s = stem(&w).to_string();
        if !out.contains(&s) {
            out.push(s);
        }
    }
    out
}

/// The grep-like baseline's order: the units holding any of the task's
/// words (a substring, case-insensitive), in file order.
pub fn grep_order(ex: &Example, units: &[LineUnit]) -> Vec<usize> {
    let words = task_words(&ex.question);
    (0..units.len())
        .filter(|&i| {
            let u = units[i];
            let line = ex.context.fields[u.field].content[u.span.0..u.span.1].to_lowercase();
            words.iter().any(|w| line.contains(w.as_str()))
        })
        .collect()
}

/// The BM25 baseline's order: every unit by its BM25 score for the task,
/// best first (ties in file order).
pub fn bm25_order(ex: &Example, units: &[LineUnit]) -> Vec<usize> {
    let texts: Vec<&str> = units.iter().map(|u| &ex.context.fields[u.field].content[u.span.0..u.span.1]).collect();
    let scores = Bm25::new(&texts).scores(&ex.question);
    let mut order: Vec<usize> = (0..units.len()).collect();
    order.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]));
    order
}

/// The text a baseline pastes: the chosen units' lines in file order,
/// joined by `\n`.
pub fn pasted_text(ex: &Example, units: &[LineUnit], chosen: &[usize]) -> String {
    let mut sorted = chosen.to_vec();
    sorted.sort_by_key(|&i| (units[i].field, units[i].span.0));
    let lines: Vec<&str> =
        sorted.iter().map(|&i| &ex.context.fields[units[i].field].content[units[i].span.0..units[i].span.1]).collect();
    lines.join("\n")
}

/// Drops the last-taken units until the pasted text counts at most
/// `budget`, then says what was pasted.
fn settle(ex: &Example, units: &[LineUnit], mut chosen: Vec<usize>, budget: usize, count: Counter) -> Result<Pasted> {
    loop {
        let tokens = if chosen.is_empty() { 0 } else { count(&pasted_text(ex, units, &chosen))? };
        if tokens <= budget {
            chosen.sort_by_key(|&i| (units[i].field, units[i].span.0));
            let selected = chosen.iter().map(|&i| (units[i].field, units[i].span)).collect();
            return Ok(Pasted { selected, tokens });
        }
        chosen.pop();
    }
}

/// Takes units in `order` while their estimated tokens fit `budget` (a
/// unit that would overflow is skipped, later ones may still fit), then
/// checks the pasted text's own count (see the module docs).
pub fn paste(ex: &Example, units: &[LineUnit], order: &[usize], budget: usize, count: Counter) -> Result<Pasted> {
    let mut used = 0;
    let mut chosen = Vec::new();
    for &i in order {
        if used + units[i].tokens <= budget {
            used += units[i].tokens;
            chosen.push(i);
        }
    }
    settle(ex, units, chosen, budget, count)
}

/// The first-N baseline: each field's first lines, one line of every field
/// in turn, a field ending at its first line that does not fit (so each
/// field's part is a prefix, as `head -n` gives).
pub fn first_n(ex: &Example, units: &[LineUnit], budget: usize, count: Counter) -> Result<Pasted> {
    let mut order: Vec<usize> = (0..units.len()).collect();
    // each unit's place among its field's lines
    let mut seen = vec![0usize; ex.context.fields.len()];
    let ranks: Vec<usize> = units
        .iter()
        .map(|u| {
            seen[u.field] += 1;
            seen[u.field] - 1
        })
        .collect();
    order.sort_by_key(|&i| (ranks[i], units[i].field));
    let mut ended = vec![false; ex.context.fields.len()];
    let (mut used, mut chosen) = (0, Vec::new());
    for i in order {
        let f = units[i].field;
        if ended[f] {
            continue;
        }
        if used + units[i].tokens <= budget {
            used += units[i].tokens;
            chosen.push(i);
        } else {
            ended[f] = true;
        }
    }
    settle(ex, units, chosen, budget, count)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::eval::agent::parse_case;

    /// Two fields; the task names "timeout" and "retry".
    fn example() -> Example {
        let log = "boot\nconnecting\nretrying after TIMEOUT\nok\nrequest timed out\nRetries exhausted\n";
        let notes = "# Notes\nthe retry policy\nis per host\n";
        let v = serde_json::json!({
            "id": "x", "kind": "logs", "task": "Why did the request hit a timeout after the retries?",
            "context": {"fields": [
                {"name": "a.log", "kind": "log", "content": log},
                {"name": "notes.md", "kind": "markdown", "content": notes},
            ]},
            "gold": [{"field": "a.log", "ranges": [[3, 3]]}],
        });
        parse_case(&v.to_string()).unwrap().example
    }

    /// One token a whitespace-separated word (the newline is free).
    fn words(t: &str) -> Result<usize> {
        Ok(t.split_whitespace().count())
    }

    fn lines(ex: &Example, p: &Pasted) -> Vec<String> {
        p.selected.iter().map(|&(f, (a, b))| ex.context.fields[f].content[a..b].to_string()).collect()
    }

    #[test]
    fn task_words_drop_stop_words_and_short_ones_and_endings() {
        assert_eq!(
            task_words("Why did the request hit a timeout after the retries? Request IDs"),
            ["request", "hit", "timeout", "retr", "ids"]
        );
        assert_eq!(task_words("Which step failed, and what was the error?"), ["step", "fail", "error"]);
    }

    #[test]
    fn grep_takes_matching_lines_in_file_order_within_the_budget() {
        let ex = example();
        let u = units(&ex, &words).unwrap();
        let order = grep_order(&ex, &u);
        let all: Vec<String> =
            order.iter().map(|&i| ex.context.fields[u[i].field].content[u[i].span.0..u[i].span.1].into()).collect();
        assert_eq!(all, ["retrying after TIMEOUT", "request timed out", "Retries exhausted", "the retry policy"]);
        // a budget of 5 words: the first line (3) fits, the second (3) does not, the third (2) does
        let p = paste(&ex, &u, &order, 5, &words).unwrap();
        assert_eq!(lines(&ex, &p), ["retrying after TIMEOUT", "Retries exhausted"]);
        assert_eq!(p.tokens, 5);
        assert_eq!(words(&pasted_text(&ex, &u, &order)).unwrap(), 11);
        for budget in 0..12 {
            let p = paste(&ex, &u, &order, budget, &words).unwrap();
            assert!(p.tokens <= budget, "{budget}: {p:?}");
            assert!(p.selected.windows(2).all(|w| w[0] < w[1]), "file order");
        }
    }

    #[test]
    fn the_pasted_text_is_counted_whole_and_trimmed_to_fit() {
        let ex = example();
        let u = units(&ex, &words).unwrap();
        // a tokenizer where a newline between two lines costs a token, one before a line does not: the
        // estimates (boot 1, connecting 1, retrying.. 3, ok 1) fill 6, the pasted text counts 9
        let joins_cost = |t: &str| -> Result<usize> {
            Ok(t.split_whitespace().count() + t.trim_matches('\n').matches('\n').count())
        };
        let order: Vec<usize> = (0..u.len()).collect();
        assert_eq!(joins_cost(&pasted_text(&ex, &u, &[0, 1, 2, 3])).unwrap(), 9);
        let p = paste(&ex, &u, &order, 6, &joins_cost).unwrap();
        // the last-taken lines go until the text fits: "ok" (7 left), then "retrying after TIMEOUT" (3)
        assert_eq!(lines(&ex, &p), ["boot", "connecting"]);
        assert_eq!(p.tokens, 3);
    }

    #[test]
    fn bm25_ranks_the_lines_naming_more_task_words_first() {
        let ex = example();
        let u = units(&ex, &words).unwrap();
        let order = bm25_order(&ex, &u);
        assert_eq!(order.len(), u.len(), "every line is ranked");
        let text = |i: usize| &ex.context.fields[u[i].field].content[u[i].span.0..u[i].span.1];
        assert_eq!(text(order[0]), "retrying after TIMEOUT");
        assert_eq!(text(*order.last().unwrap()), "is per host", "unmatched lines last, in file order");
    }

    #[test]
    fn first_n_keeps_a_prefix_of_every_field_within_the_budget() {
        let ex = example();
        let u = units(&ex, &words).unwrap();
        // boot(1) + "# Notes"(2) + connecting(1) + "the retry policy"(3) = 7; then "retrying after TIMEOUT" (3)
        // would overflow 8: the log ends there, and "is per host" (3) would too
        let p = first_n(&ex, &u, 8, &words).unwrap();
        assert_eq!(lines(&ex, &p), ["boot", "connecting", "# Notes", "the retry policy"]);
        assert_eq!(p.tokens, 7);
        for budget in 0..25 {
            let p = first_n(&ex, &u, budget, &words).unwrap();
            assert!(p.tokens <= budget);
            for f in 0..2 {
                let got: Vec<(usize, usize)> = p.selected.iter().filter(|s| s.0 == f).map(|s| s.1).collect();
                assert_eq!(got, ex.sentences[f][..got.len()], "field {f} at {budget}: a prefix");
            }
        }
        assert_eq!(first_n(&ex, &u, 100, &words).unwrap().selected.len(), u.len());
    }
}
