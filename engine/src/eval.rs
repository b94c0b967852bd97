//! Evaluation data: loaders for HotpotQA (official and Hugging Face
//! layouts), SQuAD 2.0, MuSiQue and 2WikiMultihopQA, turned into contexts
//! with gold evidence spans, and the coverage check that scores a selection.
//! The `code` set (functions found by their doc sentence in real Rust files)
//! scores by lines: see [`lines_kept`].

use std::path::Path;

use serde_json::Value;

use crate::chunk::sentences;
use crate::context::{Context, Field, FieldKind};
use crate::{Error, Result};

/// Which dataset layout to read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dataset {
    /// HotpotQA distractor: official JSON list or Hugging Face JSONL (detected).
    HotpotQa,
    /// SQuAD 2.0 (answerable questions; gold = sentences holding an answer).
    Squad,
    /// MuSiQue (gold = `is_supporting` paragraphs).
    Musique,
    /// 2WikiMultihopQA (gold = `supporting_facts`).
    TwoWiki,
    /// Code search JSONL (`task`, `context`, `gold` = a function's text):
    /// units are blank-line-separated blocks, gold is kept by [`lines_kept`].
    Code,
}

impl std::str::FromStr for Dataset {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "hotpotqa" => Ok(Self::HotpotQa),
            "squad" => Ok(Self::Squad),
            "musique" => Ok(Self::Musique),
            "2wiki" => Ok(Self::TwoWiki),
            "code" => Ok(Self::Code),
            other => {
                Err(Error::invalid("dataset", format!("{other:?}: expected hotpotqa, squad, musique, 2wiki or code")))
            }
        }
    }
}

/// One evaluation example: a question, its context as fields (one per
/// paragraph), the sentence spans of each field, and the gold evidence.
#[derive(Debug, Clone)]
pub struct Example {
    /// Dataset id.
    pub id: String,
    /// The question (the task).
    pub question: String,
    /// One prose field per paragraph, named by its title.
    pub context: Context,
    /// Per field, the byte spans of its sentences (of its blank-line
    /// blocks for code): the baselines' units.
    pub sentences: Vec<Vec<(usize, usize)>>,
    /// Gold evidence as (field, byte span) pairs.
    pub gold: Vec<(usize, (usize, usize))>,
}

fn read(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).map_err(|e| Error::io(path, e))
}

fn bad(path: &Path, what: &str) -> Error {
    Error::invalid("path", format!("{}: {what}", path.display()))
}

/// Builds an example from titled paragraphs given as sentence lists.
fn from_paragraphs(
    id: String,
    question: String,
    paras: Vec<(String, Vec<String>)>,
    gold_sents: &[(String, usize)],
) -> Example {
    let mut fields = Vec::new();
    let mut spans = Vec::new();
    let mut seen = std::collections::HashMap::<String, usize>::new();
    for (title, sents) in &paras {
        let mut content = String::new();
        let mut sp = Vec::new();
        for s in sents {
            let s = s.trim();
            if s.is_empty() {
                sp.push((content.len(), content.len()));
                continue;
            }
            if !content.is_empty() {
                content.push(' ');
            }
            sp.push((content.len(), content.len() + s.len()));
            content.push_str(s);
        }
        // titles can repeat within a context; field names cannot
        let n = seen.entry(title.clone()).or_default();
        *n += 1;
        let name = if *n == 1 { title.clone() } else { format!("{title} ({})", n) };
        fields.push(Field { name, kind: FieldKind::Prose, content, confidential: false });
        spans.push(sp);
    }
    let mut gold = Vec::new();
    for (title, sid) in gold_sents {
        if let Some(fi) = paras.iter().position(|(t, _)| t == title) {
            if let Some(&span) = spans[fi].get(*sid) {
                if span.1 > span.0 {
                    gold.push((fi, span));
                }
            }
        }
    }
    Example { id, question, context: Context { fields }, sentences: spans, gold }
}

fn str_of(v: &Value) -> String {
    v.as_str().unwrap_or_default().to_string()
}

fn titled_sentences(ctx: &Value) -> Vec<(String, Vec<String>)> {
    ctx.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|p| {
                    let t = str_of(p.get(0)?);
                    let s = p.get(1)?.as_array()?.iter().map(str_of).collect();
                    Some((t, s))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Loads examples from `path` in `dataset`'s layout, at most `limit`.
pub fn load(dataset: Dataset, path: &Path, limit: usize) -> Result<Vec<Example>> {
    let text = read(path)?;
    let mut out = Vec::new();
    match dataset {
        Dataset::HotpotQa | Dataset::TwoWiki => {
            let records: Vec<Value> = if text.trim_start().starts_with('[') {
                serde_json::from_str(&text).map_err(|_| bad(path, "not a JSON list"))?
            } else {
                text.lines()
                    .filter(|l| !l.trim().is_empty())
                    .map(serde_json::from_str)
                    .collect::<std::result::Result<_, _>>()
                    .map_err(|_| bad(path, "not JSONL"))?
            };
            for r in records.into_iter().take(limit) {
                let id = str_of(r.get("_id").or_else(|| r.get("id")).unwrap_or(&Value::Null));
                let question = str_of(&r["question"]);
                let (paras, gold) = if r["context"].is_object() {
                    // Hugging Face layout
                    let titles: Vec<String> = r["context"]["title"]
                        .as_array()
                        .ok_or_else(|| bad(path, "context.title"))?
                        .iter()
                        .map(str_of)
                        .collect();
                    let sents = r["context"]["sentences"].as_array().ok_or_else(|| bad(path, "context.sentences"))?;
                    let paras = titles
                        .into_iter()
                        .zip(
                            sents
                                .iter()
                                .map(|s| s.as_array().map(|a| a.iter().map(str_of).collect()).unwrap_or_default()),
                        )
                        .collect();
                    let st = r["supporting_facts"]["title"].as_array().cloned().unwrap_or_default();
                    let si = r["supporting_facts"]["sent_id"].as_array().cloned().unwrap_or_default();
                    (
                        paras,
                        st.iter()
                            .zip(&si)
                            .map(|(t, i)| (str_of(t), i.as_u64().unwrap_or(0) as usize))
                            .collect::<Vec<_>>(),
                    )
                } else {
                    let gold = r["supporting_facts"]
                        .as_array()
                        .ok_or_else(|| bad(path, "supporting_facts"))?
                        .iter()
                        .map(|p| (str_of(&p[0]), p[1].as_u64().unwrap_or(0) as usize))
                        .collect();
                    (titled_sentences(&r["context"]), gold)
                };
                out.push(from_paragraphs(id, question, paras, &gold));
            }
        }
        Dataset::Musique => {
            for line in text.lines().filter(|l| !l.trim().is_empty()).take(limit) {
                let r: Value = serde_json::from_str(line).map_err(|_| bad(path, "not JSONL"))?;
                let mut paras = Vec::new();
                let mut supporting = Vec::new();
                for p in r["paragraphs"].as_array().ok_or_else(|| bad(path, "paragraphs"))? {
                    let body = str_of(&p["paragraph_text"]);
                    let sents: Vec<String> =
                        sentences(&body, 0).into_iter().map(|(a, b)| body[a..b].to_string()).collect();
                    if p["is_supporting"].as_bool() == Some(true) {
                        supporting.push(paras.len());
                    }
                    paras.push((str_of(&p["title"]), sents));
                }
                let mut ex = from_paragraphs(str_of(&r["id"]), str_of(&r["question"]), paras, &[]);
                // gold unit: the whole supporting paragraph
                ex.gold = supporting.into_iter().map(|fi| (fi, (0, ex.context.fields[fi].content.len()))).collect();
                out.push(ex);
            }
        }
        Dataset::Code => {
            for (n, line) in text.lines().filter(|l| !l.trim().is_empty()).take(limit).enumerate() {
                out.push(code_example(line).map_err(|what| bad(path, &format!("line {}: {what}", n + 1)))?);
            }
        }
        Dataset::Squad => {
            let v: Value = serde_json::from_str(&text).map_err(|_| bad(path, "not JSON"))?;
            'articles: for art in v["data"].as_array().ok_or_else(|| bad(path, "data"))? {
                let title = str_of(&art["title"]);
                let paras: Vec<&Value> = art["paragraphs"].as_array().map(|a| a.iter().collect()).unwrap_or_default();
                for (pi, p) in paras.iter().enumerate() {
                    for qa in p["qas"].as_array().cloned().unwrap_or_default() {
                        if qa["is_impossible"].as_bool() == Some(true) {
                            continue;
                        }
                        if out.len() >= limit {
                            break 'articles;
                        }
                        // the answer's paragraph plus up to 9 neighbours of the same article
                        let lo = pi.saturating_sub(5);
                        let window: Vec<usize> = (lo..(lo + 10).min(paras.len())).collect();
                        let mut fields = Vec::new();
                        let mut spans = Vec::new();
                        let mut gold = Vec::new();
                        for &j in &window {
                            let body = str_of(&paras[j]["context"]);
                            let sp = sentences(&body, 0);
                            if j == pi {
                                for a in qa["answers"].as_array().cloned().unwrap_or_default() {
                                    let start = a["answer_start"].as_u64().unwrap_or(0) as usize;
                                    if let Some(&s) = sp.iter().find(|(x, y)| *x <= start && start < *y) {
                                        let g = (fields.len(), s);
                                        if !gold.contains(&g) {
                                            gold.push(g);
                                        }
                                    }
                                }
                            }
                            fields.push(Field {
                                name: format!("{title} ¶{j}"),
                                kind: FieldKind::Prose,
                                content: body,
                                confidential: false,
                            });
                            spans.push(sp);
                        }
                        out.push(Example {
                            id: str_of(&qa["id"]),
                            question: str_of(&qa["question"]),
                            context: Context { fields },
                            sentences: spans,
                            gold,
                        });
                    }
                }
            }
        }
    }
    if out.is_empty() {
        return Err(bad(path, "no examples"));
    }
    Ok(out)
}

/// One code-search record: the gold function located verbatim in the field
/// that holds it.
fn code_example(line: &str) -> std::result::Result<Example, String> {
    let r: Value = serde_json::from_str(line).map_err(|_| "not JSON".to_string())?;
    let context = Context::from_json(&r["context"].to_string()).map_err(|e| format!("context: {e}"))?;
    let gold_text = r["gold"].as_str().filter(|g| !g.trim().is_empty()).ok_or("gold: expected a non-empty string")?;
    let gold = context
        .fields
        .iter()
        .enumerate()
        .find_map(|(f, field)| field.content.find(gold_text).map(|s| (f, (s, s + gold_text.len()))))
        .ok_or("gold: not found verbatim in any field")?;
    let sentences = context.fields.iter().map(|f| blocks(&f.content)).collect();
    Ok(Example { id: str_of(&r["id"]), question: str_of(&r["task"]), context, sentences, gold: vec![gold] })
}

/// Byte spans of the blank-line-separated blocks of `text` (trimmed).
pub fn blocks(text: &str) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut cur: Option<(usize, usize)> = None;
    let mut pos = 0;
    for line in text.split_inclusive('\n') {
        let (s, e) = (pos, pos + line.trim_end().len());
        pos += line.len();
        if line.trim().is_empty() {
            out.extend(cur.take());
        } else {
            let s = s + (line.len() - line.trim_start().len());
            cur = Some(cur.map_or((s, e), |(a, _)| (a, e)));
        }
    }
    out.extend(cur);
    out
}

/// Share of the gold span's non-empty lines (stripped) found among the
/// stripped lines of the selected spans of `field` (the code set's rule: a
/// function counts as kept when this is at least 0.9).
pub fn lines_kept(selected: &[(usize, (usize, usize))], content: &str, field: usize, span: (usize, usize)) -> f32 {
    let sent: std::collections::HashSet<&str> = selected
        .iter()
        .filter(|(f, _)| *f == field)
        .flat_map(|&(_, (a, b))| content[a..b].lines().map(str::trim))
        .filter(|l| !l.is_empty())
        .collect();
    let gold: Vec<&str> = content[span.0..span.1].lines().map(str::trim).filter(|l| !l.is_empty()).collect();
    if gold.is_empty() {
        return 1.0;
    }
    gold.iter().filter(|l| sent.contains(*l)).count() as f32 / gold.len() as f32
}

/// Whether the selected spans of `field` cover `span`: at least `min_share`
/// of its non-space bytes lie inside a selected span.
pub fn covered(
    selected: &[(usize, (usize, usize))],
    content: &str,
    field: usize,
    span: (usize, usize),
    min_share: f32,
) -> bool {
    let bytes = content.as_bytes();
    let total = (span.0..span.1).filter(|&i| !bytes[i].is_ascii_whitespace()).count();
    if total == 0 {
        return true;
    }
    let inside = (span.0..span.1)
        .filter(|&i| {
            !bytes[i].is_ascii_whitespace() && selected.iter().any(|&(f, (a, b))| f == field && a <= i && i < b)
        })
        .count();
    inside as f32 >= min_share * total as f32
}

/// Share of gold units an example's selection keeps (sentences must be
/// covered whole; a MuSiQue paragraph counts as kept when at least 90 % of
/// its non-space characters are sent; code functions by [`lines_kept`] ≥ 0.9).
pub fn evidence_recall(ex: &Example, selected: &[(usize, (usize, usize))], dataset: Dataset) -> (f32, bool) {
    if ex.gold.is_empty() {
        return (1.0, true);
    }
    if dataset == Dataset::Code {
        let kept = ex
            .gold
            .iter()
            .filter(|&&(f, span)| lines_kept(selected, &ex.context.fields[f].content, f, span) >= 0.9)
            .count();
        return (kept as f32 / ex.gold.len() as f32, kept == ex.gold.len());
    }
    let share = if dataset == Dataset::Musique { 0.9 } else { 0.999 };
    let kept =
        ex.gold.iter().filter(|&&(f, span)| covered(selected, &ex.context.fields[f].content, f, span, share)).count();
    (kept as f32 / ex.gold.len() as f32, kept == ex.gold.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paragraphs_keep_sentence_spans_and_gold() {
        let ex = from_paragraphs(
            "x".into(),
            "q".into(),
            vec![("A".into(), vec!["One.".into(), " Two.".into()]), ("B".into(), vec!["Three.".into()])],
            &[("A".into(), 1), ("B".into(), 0)],
        );
        assert_eq!(ex.context.fields[0].content, "One. Two.");
        assert_eq!(ex.gold, vec![(0, (5, 9)), (1, (0, 6))]);
        assert!(covered(&[(0, (5, 9))], "One. Two.", 0, (5, 9), 0.999));
        assert!(!covered(&[(0, (0, 4))], "One. Two.", 0, (5, 9), 0.999));
        let (r, all) = evidence_recall(&ex, &[(0, (5, 9))], Dataset::HotpotQa);
        assert_eq!((r, all), (0.5, false));
    }

    #[test]
    fn a_musique_paragraph_is_kept_from_90_percent_of_its_characters() {
        let body = "abcdefghij klmnopqrst"; // 20 non-space characters
        let mut ex = from_paragraphs("m".into(), "q".into(), vec![("P".into(), vec![body.into()])], &[]);
        ex.gold = vec![(0, (0, body.len()))];
        // 18 of 20 sent: kept; 17 of 20: not
        assert_eq!(evidence_recall(&ex, &[(0, (0, 19))], Dataset::Musique), (1.0, true));
        assert_eq!(evidence_recall(&ex, &[(0, (0, 18))], Dataset::Musique), (0.0, false));
        // half is no longer enough
        assert_eq!(evidence_recall(&ex, &[(0, (0, 11))], Dataset::Musique), (0.0, false));
    }

    /// A file with a ten-line function `f` after a header, and the line
    /// spans of the function's lines.
    fn code_file() -> (String, (usize, usize), Vec<(usize, usize)>) {
        let mut s = String::from("use std::fmt;\n\n");
        let start = s.len();
        s.push_str("fn f() {\n");
        for i in 0..8 {
            s.push_str(&format!("    let x{i} = {i};\n"));
        }
        s.push('}');
        let end = s.len();
        s.push_str("\n\nfn g() {}\n");
        let mut lines = Vec::new();
        let mut p = start;
        for l in s[start..end].split('\n') {
            lines.push((p, p + l.len()));
            p += l.len() + 1;
        }
        (s, (start, end), lines)
    }

    #[test]
    fn code_gold_is_kept_at_nine_of_ten_lines() {
        let (s, span, lines) = code_file();
        assert_eq!(lines.len(), 10);
        let all: Vec<_> = lines.iter().map(|&l| (0, l)).collect();
        assert_eq!(lines_kept(&all, &s, 0, span), 1.0);
        // one line missing of 10: 0.9, kept
        let nine: Vec<_> = all.iter().copied().filter(|&(_, l)| l != lines[4]).collect();
        assert!((lines_kept(&nine, &s, 0, span) - 0.9).abs() < 1e-6);
        let ex = Example {
            id: "x".into(),
            question: "q".into(),
            context: Context {
                fields: vec![Field {
                    name: "a.rs".into(),
                    kind: FieldKind::Code,
                    content: s.clone(),
                    confidential: false,
                }],
            },
            sentences: vec![blocks(&s)],
            gold: vec![(0, span)],
        };
        assert_eq!(evidence_recall(&ex, &nine, Dataset::Code), (1.0, true));
        // 8 of 10: not kept
        let eight: Vec<_> = nine.iter().copied().filter(|&(_, l)| l != lines[5]).collect();
        assert!((lines_kept(&eight, &s, 0, span) - 0.8).abs() < 1e-6);
        assert_eq!(evidence_recall(&ex, &eight, Dataset::Code), (0.0, false));
        // lines of another field do not count
        let other: Vec<_> = all.iter().map(|&(_, l)| (1, l)).collect();
        assert_eq!(lines_kept(&other, &s, 0, span), 0.0);
    }

    #[test]
    fn code_records_load_with_blocks_and_verbatim_gold() {
        let (s, span, _) = code_file();
        let rec = serde_json::json!({
            "id": "c-1.0/src/a.rs::f", "crate": "c-1.0", "task": "Does f.",
            "context": {"fields": [{"name": "c-1.0/src/a.rs", "kind": "code", "content": s, "confidential": false}]},
            "gold": &s[span.0..span.1],
        });
        let ex = code_example(&rec.to_string()).unwrap();
        assert_eq!(ex.gold, vec![(0, span)]);
        assert_eq!(ex.question, "Does f.");
        let b: Vec<&str> = ex.sentences[0].iter().map(|&(a, e)| &s[a..e]).collect();
        assert_eq!(b, vec!["use std::fmt;", &s[span.0..span.1], "fn g() {}"]);
        let mut bad = rec.clone();
        bad["gold"] = "fn missing() {}".into();
        assert_eq!(code_example(&bad.to_string()).unwrap_err(), "gold: not found verbatim in any field");
    }
}
