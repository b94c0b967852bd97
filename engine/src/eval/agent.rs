//! Agent material: what agents actually hand over (CI logs, docs folders,
//! JSON payloads, meeting notes, source files), one case a JSONL line:
//!
//! ```json
//! {"id": "...", "kind": "logs", "task": "...",
//!  "context": {"fields": [{"name": "travis-job.log", "kind": "log", "content": "...", "confidential": false}]},
//!  "gold": [{"field": "travis-job.log", "ranges": [[268, 269], [272, 273]]}]}
//! ```
//!
//! Gold ranges are 1-based inclusive line numbers within their field's
//! content (lines as [`str::lines`] splits them: at `\n`, a `\r` inside a
//! line stays in it). The loader is strict: a gold field that does not
//! exist, a range outside its field's lines, an unknown kind or a duplicate
//! id is an error naming the file, the case and the key. Other keys
//! (`source`, `note`, `context_tokens`) are ignored.
//!
//! A case is scored by its gold lines (the non-blank lines of its ranges):
//! a line is kept when the selected spans cover every non-space byte of it
//! ([`super::covered`]); [`gold_lines_kept`] gives the share kept and
//! whether all were. The baselines' units are the field's non-blank lines
//! (see [`super::line_baselines`]).
//!
//! ```
//! use scd_engine::eval::agent::{gold_lines_kept, parse_case};
//!
//! let line = r#"{"id": "c", "kind": "logs", "task": "Why did it fail?",
//!   "context": {"fields": [{"name": "ci.log", "kind": "log", "content": "ok\n\nERROR x\nat y\n"}]},
//!   "gold": [{"field": "ci.log", "ranges": [[2, 4]]}]}"#.replace('\n', " ");
//! let case = parse_case(&line).unwrap();
//! assert_eq!(case.gold_lines.len(), 2, "the blank line 2 is no gold line");
//! // "ERROR x" (bytes 4..11) sent, "at y" not
//! assert_eq!(gold_lines_kept(&case, &[(0, (4, 11))]), (0.5, false));
//! ```

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::Value;

use super::{bad, covered, read, records, typed, Example};
use crate::context::Context;
use crate::Result;

/// The kinds a case may have.
pub const KINDS: [&str; 5] = ["logs", "docs", "json", "chat", "code"];

/// One agent case: the example (question = the task; `sentences` = each
/// field's non-blank line spans; `gold` = each gold range's byte span), its
/// kind, and the byte spans of its gold lines.
#[derive(Debug, Clone)]
pub struct AgentCase {
    /// The task, context and gold ranges, as the other datasets' examples.
    pub example: Example,
    /// One of [`KINDS`].
    pub kind: String,
    /// (field, byte span) of every non-blank line of the gold ranges, in
    /// field and line order, each once.
    pub gold_lines: Vec<(usize, (usize, usize))>,
}

#[derive(Deserialize)]
struct AgentRecord {
    id: String,
    kind: String,
    task: String,
    context: Value,
    gold: Vec<GoldRecord>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct GoldRecord {
    field: String,
    ranges: Vec<(usize, usize)>,
}

/// Byte spans of the lines of `text` as [`str::lines`] splits them (the
/// `\n`, and a `\r` just before it, left out).
pub fn line_spans(text: &str) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut pos = 0;
    for line in text.split_inclusive('\n') {
        let body = line.strip_suffix('\n').map_or(line, |l| l.strip_suffix('\r').unwrap_or(l));
        out.push((pos, pos + body.len()));
        pos += line.len();
    }
    out
}

/// Parses one case (a JSONL line); errors name the case id and the key.
pub fn parse_case(line: &str) -> std::result::Result<AgentCase, String> {
    let v: Value = serde_json::from_str(line).map_err(|e| format!("not JSON: {e}"))?;
    case_of_value(&v)
}

/// A case from its JSON: a mistyped or missing key is named with the case
/// id when the id itself reads.
fn case_of_value(v: &Value) -> std::result::Result<AgentCase, String> {
    let r: AgentRecord = typed(&v.to_string()).map_err(|e| match v.get("id").and_then(Value::as_str) {
        Some(id) => format!("case {id:?}: {e}"),
        None => e,
    })?;
    case_of(r)
}

fn case_of(r: AgentRecord) -> std::result::Result<AgentCase, String> {
    let id = r.id;
    let at = |what: String| format!("case {id:?}: {what}");
    if !KINDS.contains(&r.kind.as_str()) {
        return Err(at(format!("kind {:?}: expected one of {}", r.kind, KINDS.join(", "))));
    }
    if r.task.trim().is_empty() {
        return Err(at("task: empty".into()));
    }
    let context = Context::from_json(&r.context.to_string()).map_err(|e| at(e.to_string()))?;
    context.validate().map_err(|e| at(e.to_string()))?;
    if r.gold.is_empty() {
        return Err(at("gold: empty".into()));
    }
    let lines: Vec<Vec<(usize, usize)>> = context.fields.iter().map(|f| line_spans(&f.content)).collect();
    let mut gold = Vec::new();
    let mut gold_lines = BTreeSet::new();
    for (gi, g) in r.gold.iter().enumerate() {
        let fi = context
            .fields
            .iter()
            .position(|f| f.name == g.field)
            .ok_or_else(|| at(format!("gold[{gi}].field {:?}: no such field in the context", g.field)))?;
        let (content, spans) = (&context.fields[fi].content, &lines[fi]);
        if g.ranges.is_empty() {
            return Err(at(format!("gold[{gi}] (field {:?}): no ranges", g.field)));
        }
        let before = gold_lines.len();
        for (ri, &(start, end)) in g.ranges.iter().enumerate() {
            if start == 0 || start > end || end > spans.len() {
                return Err(at(format!(
                    "gold[{gi}].ranges[{ri}] [{start}, {end}] (field {:?}): outside its lines 1..={}{}",
                    g.field,
                    spans.len(),
                    if start > end { " or start after end" } else { "" }
                )));
            }
            gold.push((fi, (spans[start - 1].0, spans[end - 1].1)));
            let non_blank = spans[start - 1..end].iter().filter(|&&(a, b)| !content[a..b].trim().is_empty());
            gold_lines.extend(non_blank.map(|&s| (fi, s)));
        }
        if gold_lines.len() == before {
            return Err(at(format!("gold[{gi}] (field {:?}): only blank lines", g.field)));
        }
    }
    let sentences = context
        .fields
        .iter()
        .zip(&lines)
        .map(|(f, spans)| spans.iter().copied().filter(|&(a, b)| !f.content[a..b].trim().is_empty()).collect())
        .collect();
    let example = Example { id, question: r.task, context, sentences, gold, follow_ups: Vec::new() };
    Ok(AgentCase { example, kind: r.kind, gold_lines: gold_lines.into_iter().collect() })
}

/// The cases of one JSONL file, at most `limit`; errors name the file and
/// the record (counted from 1 over the non-blank lines) or the case.
pub fn load(path: &Path, limit: usize) -> Result<Vec<AgentCase>> {
    let text = read(path)?;
    let mut out = Vec::new();
    for (n, v) in records::<Value>(path, &text, limit)?.iter().enumerate() {
        out.push(case_of_value(v).map_err(|e| bad(path, &format!("record {}: {e}", n + 1)))?);
    }
    if out.is_empty() {
        return Err(bad(path, "no cases"));
    }
    Ok(out)
}

/// The JSONL files `paths` name: a file as given, a folder's `*.jsonl`
/// files (not its subfolders) in name order.
pub fn files(paths: &[PathBuf]) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for p in paths {
        if !p.is_dir() {
            out.push(p.clone());
            continue;
        }
        let mut found: Vec<PathBuf> = std::fs::read_dir(p)
            .map_err(|e| crate::Error::io(p, e))?
            .map(|e| e.map(|e| e.path()).map_err(|err| crate::Error::io(p, err)))
            .collect::<Result<Vec<_>>>()?
            .into_iter()
            .filter(|f| f.is_file() && f.extension().is_some_and(|e| e == "jsonl"))
            .collect();
        if found.is_empty() {
            return Err(bad(p, "a folder without *.jsonl files"));
        }
        found.sort();
        out.extend(found);
    }
    Ok(out)
}

/// The cases of every file `paths` name ([`files`]), at most `limit` a
/// file; an id seen in two places is an error naming both.
pub fn load_all(paths: &[PathBuf], limit: usize) -> Result<Vec<AgentCase>> {
    let mut out: Vec<AgentCase> = Vec::new();
    let mut seen: HashMap<String, PathBuf> = HashMap::new();
    for f in files(paths)? {
        for case in load(&f, limit)? {
            if let Some(first) = seen.insert(case.example.id.clone(), f.clone()) {
                let what = format!("case {:?} again (first in {})", case.example.id, first.display());
                return Err(bad(&f, &what));
            }
            out.push(case);
        }
    }
    Ok(out)
}

/// Share of `case`'s gold lines the `selected` (field, byte span) pairs
/// keep, and whether they keep all: a line is kept when every non-space
/// byte of it lies in a selected span of its field.
pub fn gold_lines_kept(case: &AgentCase, selected: &[(usize, (usize, usize))]) -> (f32, bool) {
    let fields = &case.example.context.fields;
    let kept = case.gold_lines.iter().filter(|&&(f, span)| covered(selected, &fields[f].content, f, span, 1.0)).count();
    let n = case.gold_lines.len().max(1);
    (kept as f32 / n as f32, kept == case.gold_lines.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A valid case: a log of 6 lines (line 3 blank) and a markdown field.
    fn record() -> Value {
        serde_json::json!({
            "id": "logs-x", "kind": "logs", "task": "Which test failed?", "note": "ignored",
            "source": {"repo": "a/b"}, "context_tokens": 12,
            "context": {"fields": [
                {"name": "job.log", "kind": "log", "content": "start\r\nbuild ok\n\nFAIL t1\n  at x.rs:3\r\ndone\n", "confidential": false},
                {"name": "README.md", "kind": "markdown", "content": "# T\n\nrun it", "confidential": false}
            ]},
            "gold": [{"field": "job.log", "ranges": [[3, 5]]}, {"field": "README.md", "ranges": [[1, 1], [3, 3]]}],
        })
    }

    fn parse(v: &Value) -> std::result::Result<AgentCase, String> {
        parse_case(&v.to_string())
    }

    #[test]
    fn lines_split_at_newlines_and_keep_inner_carriage_returns() {
        let text = "a\r\nb\rc\n\nd";
        let spans = line_spans(text);
        let got: Vec<&str> = spans.iter().map(|&(a, b)| &text[a..b]).collect();
        assert_eq!(got, text.lines().collect::<Vec<_>>());
        assert_eq!(got, ["a", "b\rc", "", "d"]);
        assert_eq!(line_spans("x\n").len(), 1, "a final newline opens no line");
    }

    #[test]
    fn a_good_case_carries_kind_task_units_and_gold_lines() {
        let case = parse(&record()).unwrap();
        let ex = &case.example;
        let log = &ex.context.fields[0].content;
        assert_eq!(
            (case.kind.as_str(), ex.id.as_str(), ex.question.as_str()),
            ("logs", "logs-x", "Which test failed?")
        );
        // gold range 3..=5 spans the blank line 3 to the end of line 5 (its \r left out)
        assert_eq!(&log[ex.gold[0].1 .0..ex.gold[0].1 .1], "\nFAIL t1\n  at x.rs:3");
        let lines: Vec<&str> = case.gold_lines.iter().map(|&(f, (a, b))| &ex.context.fields[f].content[a..b]).collect();
        assert_eq!(lines, ["FAIL t1", "  at x.rs:3", "# T", "run it"]);
        let units: Vec<&str> = ex.sentences[0].iter().map(|&(a, b)| &log[a..b]).collect();
        assert_eq!(units, ["start", "build ok", "FAIL t1", "  at x.rs:3", "done"], "non-blank lines");
    }

    #[test]
    fn each_bad_case_is_refused_naming_the_case_and_key() {
        let with = |edit: &dyn Fn(&mut Value)| {
            let mut v = record();
            edit(&mut v);
            parse(&v).unwrap_err()
        };
        let cases: Vec<(String, &str)> = vec![
            (
                with(&|v| v["gold"][1]["field"] = "readme.md".into()),
                r#"case "logs-x": gold[1].field "readme.md": no such field in the context"#,
            ),
            (
                with(&|v| v["gold"][0]["ranges"][0] = serde_json::json!([5, 7])),
                r#"case "logs-x": gold[0].ranges[0] [5, 7] (field "job.log"): outside its lines 1..=6"#,
            ),
            (
                with(&|v| v["gold"][0]["ranges"][0] = serde_json::json!([0, 1])),
                r#"case "logs-x": gold[0].ranges[0] [0, 1] (field "job.log"): outside its lines 1..=6"#,
            ),
            (
                with(&|v| v["gold"][1]["ranges"][1] = serde_json::json!([3, 2])),
                r#"gold[1].ranges[1] [3, 2] (field "README.md"): outside its lines 1..=3 or start after end"#,
            ),
            (
                with(&|v| v["gold"][1]["ranges"] = serde_json::json!([[2, 2]])),
                r#"case "logs-x": gold[1] (field "README.md"): only blank lines"#,
            ),
            (with(&|v| v["gold"][0]["ranges"] = serde_json::json!([])), r#"gold[0] (field "job.log"): no ranges"#),
            (with(&|v| v["gold"] = serde_json::json!([])), r#"case "logs-x": gold: empty"#),
            (with(&|v| v["kind"] = "log".into()), r#"kind "log": expected one of logs, docs, json, chat, code"#),
            (with(&|v| v["task"] = " ".into()), r#"case "logs-x": task: empty"#),
            (with(&|v| v["gold"][0]["ranges"][0] = serde_json::json!([1, -2])), "gold[0].ranges[0]"),
            (with(&|v| v["gold"][0]["line"] = 3.into()), "unknown field `line`"),
            (with(&|v| v["context"]["fields"][1]["name"] = "job.log".into()), r#"duplicate field name "job.log""#),
            (
                with(&|v| {
                    v.as_object_mut().unwrap().remove("task");
                }),
                r#"case "logs-x": missing field `task`"#,
            ),
        ];
        for (err, want) in &cases {
            assert!(err.contains(want), "{want:?} not in {err:?}");
        }
        let err = with(&|v| v["gold"][0]["line"] = 3.into());
        assert!(err.starts_with(r#"case "logs-x": gold[0]"#), "{err}");
    }

    fn temp(name: &str, text: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("scd_agent_{}_{name}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("cases.jsonl");
        std::fs::write(&p, text).unwrap();
        dir
    }

    #[test]
    fn files_load_from_paths_and_folders_and_ids_stay_unique() {
        let one = record().to_string();
        let mut other = record();
        other["id"] = "logs-y".into();
        let dir = temp("ok", &format!("{one}\n\n{other}\n"));
        let cases = load_all(std::slice::from_ref(&dir), 10).unwrap();
        assert_eq!(cases.iter().map(|c| c.example.id.as_str()).collect::<Vec<_>>(), ["logs-x", "logs-y"]);
        assert_eq!(load(&dir.join("cases.jsonl"), 1).unwrap().len(), 1, "the limit holds");
        let err = load_all(&[dir.join("cases.jsonl"), dir.clone()], 10).unwrap_err().to_string();
        assert!(err.contains(r#"case "logs-x" again (first in "#), "{err}");
        let mut wrong = record();
        wrong["gold"][0]["field"] = "x".into();
        let bad = temp("bad", &format!("{one}\n{wrong}\n"));
        let err = load_all(std::slice::from_ref(&bad), 10).unwrap_err().to_string();
        assert!(err.contains("cases.jsonl: record 2: case \"logs-x\": gold[0].field \"x\""), "{err}");
        let empty = temp("empty", "");
        std::fs::remove_file(empty.join("cases.jsonl")).unwrap();
        let err = load_all(std::slice::from_ref(&empty), 10).unwrap_err().to_string();
        assert!(err.ends_with("a folder without *.jsonl files"), "{err}");
        for d in [dir, bad, empty] {
            std::fs::remove_dir_all(d).unwrap();
        }
    }

    #[test]
    fn a_gold_line_is_kept_only_when_every_non_space_byte_is_sent() {
        let case = parse(&record()).unwrap();
        let g = &case.gold_lines;
        let all: Vec<_> = g.clone();
        assert_eq!(gold_lines_kept(&case, &all), (1.0, true));
        // the indented line without its leading spaces still counts as kept
        let (f, (a, b)) = g[1];
        let mut trimmed = all.clone();
        trimmed[1] = (f, (a + 2, b));
        assert_eq!(gold_lines_kept(&case, &trimmed), (1.0, true));
        // one byte short: that line is lost
        trimmed[1] = (f, (a + 2, b - 1));
        assert_eq!(gold_lines_kept(&case, &trimmed), (0.75, false));
        // the same span in another field keeps nothing there
        let elsewhere: Vec<_> = all.iter().map(|&(f, s)| (1 - f, s)).collect();
        assert_eq!(gold_lines_kept(&case, &elsewhere), (0.0, false));
        // one span over the whole log keeps its two gold lines
        let log_len = case.example.context.fields[0].content.len();
        assert_eq!(gold_lines_kept(&case, &[(0, (0, log_len))]), (0.5, false));
    }
}
