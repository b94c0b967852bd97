//! Evaluation data: loaders for HotpotQA (official and Hugging Face
//! layouts), SQuAD 2.0, MuSiQue and 2WikiMultihopQA, turned into contexts
//! with gold evidence spans, and the coverage check that scores a selection.
//! The `code` set (functions found by their doc sentence in real Rust files)
//! scores by lines: see [`lines_kept`]. Agent material (logs, docs, JSON,
//! chat, code; gold given as line ranges) loads with [`agent`] and is scored
//! by its gold lines, beside the line baselines of [`line_baselines`]; both
//! use this module's helpers, this module uses neither.

use std::path::Path;

use serde::Deserialize;
use serde_json::Value;

use crate::chunk::sentences;
use crate::context::{Context, Field, FieldKind};
use crate::{Error, Result};

pub mod agent;
pub mod line_baselines;

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
    /// MuSiQue: the questions of the hops after the first, from
    /// `question_decomposition`, each `#n` filled with hop n's answer (a
    /// receiver's follow-ups, in order). Empty for the other datasets.
    pub follow_ups: Vec<String>,
}

fn read(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).map_err(|e| Error::io(path, e))
}

fn bad(path: &Path, what: &str) -> Error {
    Error::invalid("path", format!("{}: {what}", path.display()))
}

/// How a dataset's sentence lists become a field's text.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Join {
    /// Each sentence trimmed, joined with one space (what a careful user
    /// sends).
    #[default]
    Natural,
    /// The sentences concatenated as the dataset gives them (`"".join`):
    /// HotpotQA's sentences carry their leading space, 2Wiki's do not, so
    /// its sentences arrive glued (`...in 1987.He was...`).
    AsGiven,
}

/// Builds an example from titled paragraphs given as sentence lists, each
/// `(title, text)` sent once (a repeated title with other text is a field
/// of its own, `title (2)`: field names are unique).
fn from_paragraphs(
    id: String,
    question: String,
    paras: Vec<(String, Vec<String>)>,
    gold_sents: &[(String, usize)],
    join: Join,
) -> Example {
    let mut fields: Vec<Field> = Vec::new();
    let mut spans = Vec::new();
    let mut seen = std::collections::HashMap::<String, usize>::new();
    // the field each title's first paragraph became
    let mut by_title = std::collections::HashMap::<&str, usize>::new();
    for (title, sents) in &paras {
        let mut content = String::new();
        let mut sp = Vec::new();
        for s in sents {
            match join {
                Join::Natural => {
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
                Join::AsGiven => {
                    let lead = s.len() - s.trim_start().len();
                    let start = content.len() + lead;
                    sp.push((start, start.max(content.len() + s.trim_end().len())));
                    content.push_str(s);
                }
            }
        }
        let same = by_title.get(title.as_str()).is_some_and(|&f| fields[f].content == content);
        if same {
            continue;
        }
        let n = seen.entry(title.clone()).or_default();
        *n += 1;
        let name = if *n == 1 { title.clone() } else { format!("{title} ({})", n) };
        by_title.entry(title.as_str()).or_insert(fields.len());
        fields.push(Field { name, kind: FieldKind::Prose, content, confidential: false });
        spans.push(sp);
    }
    let mut gold = Vec::new();
    for (title, sid) in gold_sents {
        if let Some(&fi) = by_title.get(title.as_str()) {
            if let Some(&span) = spans[fi].get(*sid) {
                if span.1 > span.0 {
                    gold.push((fi, span));
                }
            }
        }
    }
    Example { id, question, context: Context { fields }, sentences: spans, gold, follow_ups: Vec::new() }
}

// ---------------------------------------------------------------------------
// The datasets' own layouts, typed: a missing or mistyped key is an error
// naming the record and the key, never a silent empty string or 0. Keys a
// loader does not use (answers, types, decompositions) are ignored.

/// A HotpotQA or 2WikiMultihopQA record, official or Hugging Face layout.
#[derive(Deserialize)]
struct MultiHopRecord {
    /// HotpotQA's official layout and 2Wiki name it `_id`; Hugging Face's
    /// `id`. With both, `_id` wins.
    #[serde(rename = "_id")]
    underscore_id: Option<String>,
    id: Option<String>,
    question: String,
    context: MultiHopContext,
    supporting_facts: SupportingFacts,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum MultiHopContext {
    /// `[[title, [sentence, ...]], ...]`
    Official(Vec<(String, Vec<String>)>),
    /// `{"title": [...], "sentences": [[...], ...]}`
    HuggingFace { title: Vec<String>, sentences: Vec<Vec<String>> },
}

#[derive(Deserialize)]
#[serde(untagged)]
enum SupportingFacts {
    /// `[[title, sent_id], ...]`
    Official(Vec<(String, usize)>),
    /// `{"title": [...], "sent_id": [...]}`
    HuggingFace { title: Vec<String>, sent_id: Vec<usize> },
}

impl MultiHopRecord {
    fn into_example(self, join: Join) -> std::result::Result<Example, String> {
        let paras = match self.context {
            MultiHopContext::Official(p) => p,
            MultiHopContext::HuggingFace { title, sentences } => {
                if title.len() != sentences.len() {
                    return Err(format!("context: {} titles but {} sentence lists", title.len(), sentences.len()));
                }
                title.into_iter().zip(sentences).collect()
            }
        };
        let gold = match self.supporting_facts {
            SupportingFacts::Official(g) => g,
            SupportingFacts::HuggingFace { title, sent_id } => {
                if title.len() != sent_id.len() {
                    return Err(format!("supporting_facts: {} titles but {} sent_ids", title.len(), sent_id.len()));
                }
                title.into_iter().zip(sent_id).collect()
            }
        };
        let id = self.underscore_id.or(self.id).ok_or("missing field `_id` (or `id`)")?;
        Ok(from_paragraphs(id, self.question, paras, &gold, join))
    }
}

/// A MuSiQue record (gold = the `is_supporting` paragraphs; a paragraph
/// without the key is not supporting, as in MuSiQue's unlabelled splits).
#[derive(Deserialize)]
struct MusiqueRecord {
    id: String,
    question: String,
    paragraphs: Vec<MusiqueParagraph>,
    #[serde(default)]
    question_decomposition: Vec<MusiqueHop>,
}

/// One hop of a MuSiQue question: its question (`#n` names hop n's
/// answer) and answer.
#[derive(Deserialize)]
struct MusiqueHop {
    question: String,
    answer: String,
}

/// The questions of hops 2.. with each `#n` replaced by hop n's answer
/// (highest n first, so `#1` does not eat the start of `#12`).
pub fn follow_up_questions(hops: &[(String, String)]) -> Vec<String> {
    hops.iter()
        .skip(1)
        .map(|(q, _)| {
            let mut q = q.clone();
            for (n, (_, answer)) in hops.iter().enumerate().rev() {
                q = q.replace(&format!("#{}", n + 1), answer);
            }
            q
        })
        .collect()
}

#[derive(Deserialize)]
struct MusiqueParagraph {
    title: String,
    paragraph_text: String,
    #[serde(default)]
    is_supporting: bool,
}

/// SQuAD 2.0's file: articles of paragraphs of questions (`is_impossible`
/// and `answers` may be absent, as in SQuAD 1.1).
#[derive(Deserialize)]
struct SquadFile {
    data: Vec<SquadArticle>,
}

#[derive(Deserialize)]
struct SquadArticle {
    title: String,
    paragraphs: Vec<SquadParagraph>,
}

#[derive(Deserialize)]
struct SquadParagraph {
    context: String,
    qas: Vec<SquadQuestion>,
}

#[derive(Deserialize)]
struct SquadQuestion {
    id: String,
    question: String,
    #[serde(default)]
    answers: Vec<SquadAnswer>,
    #[serde(default)]
    is_impossible: bool,
}

#[derive(Deserialize)]
struct SquadAnswer {
    answer_start: usize,
}

/// A code-search record (the context is parsed by [`Context::from_json`]
/// for its path-named errors).
#[derive(Deserialize)]
struct CodeRecord {
    id: String,
    task: String,
    context: Value,
    gold: String,
}

/// Parses `json` as `T`; the error names the key path.
fn typed<T: serde::de::DeserializeOwned>(json: &str) -> std::result::Result<T, String> {
    let de = &mut serde_json::Deserializer::from_str(json);
    serde_path_to_error::deserialize(de).map_err(|e| {
        let at = e.path().to_string();
        let inner = e.into_inner();
        if at == "." {
            format!("{inner}")
        } else {
            format!("{at}: {inner}")
        }
    })
}

/// The first `limit` records of a JSON list, or of JSONL (every line is
/// checked to be JSON, the first `limit` non-blank ones are parsed); errors
/// name the record, counted from 1 over the list or the non-blank lines.
fn records<T: serde::de::DeserializeOwned>(path: &Path, text: &str, limit: usize) -> Result<Vec<T>> {
    let raw: Vec<std::borrow::Cow<str>> = if text.trim_start().starts_with('[') {
        let all: Vec<Value> = serde_json::from_str(text).map_err(|_| bad(path, "not a JSON list"))?;
        all.into_iter().map(|v| v.to_string().into()).collect()
    } else {
        let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
        if lines.iter().any(|l| serde_json::from_str::<serde::de::IgnoredAny>(l).is_err()) {
            return Err(bad(path, "not JSONL"));
        }
        lines.into_iter().map(Into::into).collect()
    };
    raw.iter()
        .take(limit)
        .enumerate()
        .map(|(n, r)| typed(r).map_err(|e| bad(path, &format!("record {}: {e}", n + 1))))
        .collect()
}

/// Loads examples from `path` in `dataset`'s layout, at most `limit`,
/// sentences joined the [`Join::Natural`] way.
pub fn load(dataset: Dataset, path: &Path, limit: usize) -> Result<Vec<Example>> {
    load_with(dataset, path, limit, Join::Natural)
}

/// [`load`], HotpotQA's and 2Wiki's sentences joined as `join` says.
pub fn load_with(dataset: Dataset, path: &Path, limit: usize, join: Join) -> Result<Vec<Example>> {
    let text = read(path)?;
    let mut out = Vec::new();
    match dataset {
        Dataset::HotpotQa | Dataset::TwoWiki => {
            for (n, r) in records::<MultiHopRecord>(path, &text, limit)?.into_iter().enumerate() {
                out.push(r.into_example(join).map_err(|e| bad(path, &format!("record {}: {e}", n + 1)))?);
            }
        }
        Dataset::Musique => {
            for r in records::<MusiqueRecord>(path, &text, limit)? {
                let mut paras = Vec::new();
                let mut supporting = Vec::new();
                for p in r.paragraphs {
                    let sents: Vec<String> = sentences(&p.paragraph_text, 0)
                        .into_iter()
                        .map(|(a, b)| p.paragraph_text[a..b].to_string())
                        .collect();
                    if p.is_supporting {
                        supporting.push(paras.len());
                    }
                    paras.push((p.title, sents));
                }
                let mut ex = from_paragraphs(r.id, r.question, paras, &[], Join::Natural);
                let hops: Vec<(String, String)> =
                    r.question_decomposition.into_iter().map(|h| (h.question, h.answer)).collect();
                ex.follow_ups = follow_up_questions(&hops);
                // gold unit: the whole supporting paragraph
                ex.gold = supporting.into_iter().map(|fi| (fi, (0, ex.context.fields[fi].content.len()))).collect();
                out.push(ex);
            }
        }
        Dataset::Code => {
            for (n, r) in records::<CodeRecord>(path, &text, limit)?.into_iter().enumerate() {
                out.push(code_example(r).map_err(|what| bad(path, &format!("record {}: {what}", n + 1)))?);
            }
        }
        Dataset::Squad => {
            let file: SquadFile = typed(&text).map_err(|e| {
                if serde_json::from_str::<serde::de::IgnoredAny>(&text).is_err() {
                    bad(path, "not JSON")
                } else {
                    bad(path, &e)
                }
            })?;
            'articles: for art in &file.data {
                let paras = &art.paragraphs;
                for (pi, p) in paras.iter().enumerate() {
                    for qa in p.qas.iter().filter(|qa| !qa.is_impossible) {
                        if out.len() >= limit {
                            break 'articles;
                        }
                        // the answer's paragraph plus up to 9 neighbours of the same article
                        let lo = pi.saturating_sub(5);
                        let mut fields = Vec::new();
                        let mut spans = Vec::new();
                        let mut gold = Vec::new();
                        for (j, para) in paras.iter().enumerate().skip(lo).take(10) {
                            let body = &para.context;
                            let sp = sentences(body, 0);
                            if j == pi {
                                for a in &qa.answers {
                                    if let Some(&s) =
                                        sp.iter().find(|(x, y)| *x <= a.answer_start && a.answer_start < *y)
                                    {
                                        let g = (fields.len(), s);
                                        if !gold.contains(&g) {
                                            gold.push(g);
                                        }
                                    }
                                }
                            }
                            fields.push(Field {
                                name: format!("{} ¶{j}", art.title),
                                kind: FieldKind::Prose,
                                content: body.clone(),
                                confidential: false,
                            });
                            spans.push(sp);
                        }
                        out.push(Example {
                            id: qa.id.clone(),
                            question: qa.question.clone(),
                            context: Context { fields },
                            sentences: spans,
                            gold,
                            follow_ups: Vec::new(),
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
fn code_example(r: CodeRecord) -> std::result::Result<Example, String> {
    let context = Context::from_json(&r.context.to_string()).map_err(|e| format!("context: {e}"))?;
    let gold_text = r.gold.as_str();
    if gold_text.trim().is_empty() {
        return Err("gold: expected a non-empty string".into());
    }
    let gold = context
        .fields
        .iter()
        .enumerate()
        .find_map(|(f, field)| field.content.find(gold_text).map(|s| (f, (s, s + gold_text.len()))))
        .ok_or("gold: not found verbatim in any field")?;
    let sentences = context.fields.iter().map(|f| blocks(&f.content)).collect();
    Ok(Example { id: r.id, question: r.task, context, sentences, gold: vec![gold], follow_ups: Vec::new() })
}

/// A field of the long-context set: the field, its sentence spans, and its
/// index in its own example (`None`: another example's paragraph).
type Placed = (Field, Vec<(usize, usize)>, Option<usize>);

/// The long-context set: each example's paragraphs among paragraphs of
/// the other examples, `total` fields in all (fewer when the others hold
/// too few), in a seeded random order. Each `(title, text)` appears once;
/// another paragraph under a title already present is named `title (n)`.
/// Gold moves with its field; the added paragraphs hold none.
pub fn among_others(examples: &[Example], total: usize, seed: u64) -> Vec<Example> {
    use rand::seq::SliceRandom;
    use rand::SeedableRng;
    let pool: Vec<(usize, usize)> =
        examples.iter().enumerate().flat_map(|(e, ex)| (0..ex.context.fields.len()).map(move |f| (e, f))).collect();
    examples
        .iter()
        .enumerate()
        .map(|(i, ex)| {
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
            let mut fields: Vec<Placed> = ex
                .context
                .fields
                .iter()
                .cloned()
                .zip(ex.sentences.iter().cloned())
                .enumerate()
                .map(|(f, (field, spans))| (field, spans, Some(f)))
                .collect();
            let mut names: std::collections::HashMap<String, usize> =
                fields.iter().map(|(f, _, _)| (f.name.clone(), 1)).collect();
            let mut texts: std::collections::HashSet<(String, String)> =
                fields.iter().map(|(f, _, _)| (f.name.clone(), f.content.clone())).collect();
            let mut others: Vec<&(usize, usize)> = pool.iter().filter(|(e, _)| *e != i).collect();
            others.shuffle(&mut rng);
            for &&(e, f) in &others {
                if fields.len() >= total {
                    break;
                }
                let field = examples[e].context.fields[f].clone();
                if !texts.insert((field.name.clone(), field.content.clone())) {
                    continue;
                }
                let n = names.entry(field.name.clone()).or_default();
                *n += 1;
                let name = if *n == 1 { field.name.clone() } else { format!("{} ({n})", field.name) };
                fields.push((Field { name, ..field }, examples[e].sentences[f].clone(), None));
            }
            fields.shuffle(&mut rng);
            let at: std::collections::HashMap<usize, usize> =
                fields.iter().enumerate().filter_map(|(new, (_, _, old))| old.map(|o| (o, new))).collect();
            let gold = ex.gold.iter().map(|&(f, span)| (at[&f], span)).collect();
            let (fields, sentences): (Vec<Field>, Vec<Vec<(usize, usize)>>) =
                fields.into_iter().map(|(f, s, _)| (f, s)).unzip();
            Example {
                id: ex.id.clone(),
                question: ex.question.clone(),
                context: Context { fields },
                sentences,
                gold,
                follow_ups: ex.follow_ups.clone(),
            }
        })
        .collect()
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

/// The budget at `frac` of a context of `total` tokens, as every evaluation
/// asks it: the fraction's whole tokens, at least one.
pub fn budget_at(total: usize, frac: f32) -> usize {
    ((total as f32 * frac).floor() as usize).max(1)
}

/// The (field index, byte span) pairs a compression of `ex` sent, for
/// [`evidence_recall`].
pub fn selection(ex: &Example, chunks: &[crate::extract::SelectedChunk]) -> Vec<(usize, (usize, usize))> {
    chunks.iter().map(|c| (field_index(ex, &c.field), c.span)).collect()
}

/// The index of `ex`'s field named `name` (0 when none is).
fn field_index(ex: &Example, name: &str) -> usize {
    ex.context.fields.iter().position(|f| f.name == name).unwrap_or(0)
}

/// The (field index, byte span) pairs the text of a compression of `ex`
/// holds: its chunks ([`selection`]) and its margins, the lines around
/// code pieces ([`crate::extract::Compressed::margins`]).
pub fn sent_spans(ex: &Example, out: &crate::extract::Compressed) -> Vec<(usize, (usize, usize))> {
    let mut spans = selection(ex, &out.chunks);
    spans.extend(out.margins.iter().map(|m| (field_index(ex, &m.field), m.span)));
    spans
}

/// Per gold unit of `ex`, in order, whether the selection keeps it
/// (sentences must be covered whole; a MuSiQue paragraph counts as kept
/// when at least 90 % of its non-space characters are sent; code functions
/// by [`lines_kept`] ≥ 0.9).
pub fn gold_kept(ex: &Example, selected: &[(usize, (usize, usize))], dataset: Dataset) -> Vec<bool> {
    let share = if dataset == Dataset::Musique { 0.9 } else { 0.999 };
    ex.gold
        .iter()
        .map(|&(f, span)| {
            let content = &ex.context.fields[f].content;
            if dataset == Dataset::Code {
                lines_kept(selected, content, f, span) >= 0.9
            } else {
                covered(selected, content, f, span, share)
            }
        })
        .collect()
}

/// Share of gold units an example's selection keeps ([`gold_kept`]), and
/// whether it keeps them all.
pub fn evidence_recall(ex: &Example, selected: &[(usize, (usize, usize))], dataset: Dataset) -> (f32, bool) {
    if ex.gold.is_empty() {
        return (1.0, true);
    }
    let kept = gold_kept(ex, selected, dataset).into_iter().filter(|&k| k).count();
    (kept as f32 / ex.gold.len() as f32, kept == ex.gold.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load_text(dataset: Dataset, name: &str, text: &str) -> Result<Vec<Example>> {
        load_at_most(dataset, name, text, 10)
    }

    fn load_at_most(dataset: Dataset, name: &str, text: &str, limit: usize) -> Result<Vec<Example>> {
        let dir = std::env::temp_dir().join(format!("scd_eval_{}_{name}", std::process::id()));
        std::fs::write(&dir, text).unwrap();
        let out = load(dataset, &dir, limit);
        std::fs::remove_file(&dir).unwrap();
        out
    }

    #[test]
    fn loaders_refuse_missing_and_mistyped_keys_by_record_and_key() {
        let ok = r#"{"id": "a", "question": "q?", "context": {"title": ["T"], "sentences": [["One.", "Two."]]},
                     "supporting_facts": {"title": ["T"], "sent_id": [1]}, "answer": "x"}"#
            .replace('\n', " ");
        let ex = load_text(Dataset::HotpotQa, "ok.jsonl", &ok).unwrap();
        assert_eq!((ex[0].id.as_str(), ex[0].gold.len()), ("a", 1), "unused keys are ignored");
        let both = ok.replacen(r#""id": "a""#, r#""id": "a", "_id": "b""#, 1);
        assert_eq!(load_text(Dataset::HotpotQa, "both.jsonl", &both).unwrap()[0].id, "b", "_id wins");
        let no_id = ok.replacen(r#""id": "a", "#, "", 1);
        let err = load_text(Dataset::HotpotQa, "noid.jsonl", &no_id).unwrap_err().to_string();
        assert!(err.contains("record 1: missing field `_id` (or `id`)"), "{err}");
        let late_garbage = format!("{ok}\n{ok}\nnot json\n");
        assert!(load_text(Dataset::Musique, "m0.jsonl", "").unwrap_err().to_string().contains("no examples"));
        let err = load_at_most(Dataset::HotpotQa, "late.jsonl", &late_garbage, 1).unwrap_err().to_string();
        assert!(err.ends_with("not JSONL"), "a bad line past the limit still fails: {err}");
        let cases = [
            (ok.replace(r#""question": "q?", "#, ""), "record 1: missing field `question`"),
            (ok.replace(r#""sent_id": [1]"#, r#""sent_id": ["1"]"#), "record 1: supporting_facts"),
            (
                ok.replace(r#""sent_id": [1]"#, r#""sent_id": [1, 2]"#),
                "record 1: supporting_facts: 1 titles but 2 sent_ids",
            ),
            (
                ok.replace(r#""sentences": [["One.", "Two."]]"#, r#""sentences": []"#),
                "record 1: context: 1 titles but 0",
            ),
        ];
        for (text, want) in cases {
            let err = load_text(Dataset::HotpotQa, "bad.jsonl", &text).unwrap_err().to_string();
            assert!(err.contains(want), "{want:?} not in {err}");
        }
        let squad = r#"{"data": [{"title": "A", "paragraphs": [{"context": "Yes. No.", "qas": [{"id": "1", "question": "q", "answers": [{"answer_start": "5"}]}]}]}]}"#;
        let err = load_text(Dataset::Squad, "squad.json", squad).unwrap_err().to_string();
        assert!(err.contains("data[0].paragraphs[0].qas[0].answers[0].answer_start"), "{err}");
        let musique = r#"{"id": "m", "question": "q", "paragraphs": [{"title": "T", "paragraph_text": "P."}]}"#;
        let ex = load_text(Dataset::Musique, "m.jsonl", musique).unwrap();
        assert!(ex[0].gold.is_empty(), "a paragraph without is_supporting is not gold");
        let err = load_text(Dataset::Musique, "m.jsonl", &musique.replace(r#""title": "T", "#, "")).unwrap_err();
        assert!(err.to_string().contains("record 1: paragraphs[0]: missing field `title`"), "{err}");
    }

    #[test]
    fn paragraphs_keep_sentence_spans_and_gold() {
        let ex = from_paragraphs(
            "x".into(),
            "q".into(),
            vec![("A".into(), vec!["One.".into(), " Two.".into()]), ("B".into(), vec!["Three.".into()])],
            &[("A".into(), 1), ("B".into(), 0)],
            Join::Natural,
        );
        assert_eq!(ex.context.fields[0].content, "One. Two.");
        assert_eq!(ex.gold, vec![(0, (5, 9)), (1, (0, 6))]);
        assert!(covered(&[(0, (5, 9))], "One. Two.", 0, (5, 9), 0.999));
        assert!(!covered(&[(0, (0, 4))], "One. Two.", 0, (5, 9), 0.999));
        let (r, all) = evidence_recall(&ex, &[(0, (5, 9))], Dataset::HotpotQa);
        assert_eq!((r, all), (0.5, false));
    }

    #[test]
    fn sentences_join_as_given_and_a_repeated_paragraph_is_sent_once() {
        let paras = vec![
            ("A".into(), vec!["One.".into(), "Two.".into(), "  ".into()]),
            ("B".into(), vec!["Three.".into(), " Four.".into()]),
            ("A".into(), vec!["One.".into(), "Two.".into(), "  ".into()]),
            ("B".into(), vec!["Other.".into()]),
        ];
        let gold = [("A".into(), 1), ("B".into(), 1), ("A".into(), 2)];
        let ex = from_paragraphs("x".into(), "q".into(), paras.clone(), &gold, Join::AsGiven);
        let names: Vec<&str> = ex.context.fields.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names, ["A", "B", "B (2)"], "the identical A once, the other B under its own name");
        assert_eq!(ex.context.fields[0].content, "One.Two.  ");
        assert_eq!(ex.context.fields[1].content, "Three. Four.");
        // spans are the sentences without their surrounding whitespace; a blank one is no gold
        assert_eq!(ex.gold, vec![(0, (4, 8)), (1, (7, 12))]);
        let natural = from_paragraphs("x".into(), "q".into(), paras, &gold, Join::Natural);
        assert_eq!(natural.context.fields[0].content, "One. Two.");
        assert_eq!(natural.gold, vec![(0, (5, 9)), (1, (7, 12))]);
    }

    #[test]
    fn the_long_context_set_puts_each_example_among_the_others_paragraphs() {
        let ex = |id: &str, paras: &[(&str, &str)], gold: &[(&str, usize)]| {
            let paras = paras.iter().map(|(t, s)| (t.to_string(), vec![s.to_string()])).collect();
            let gold: Vec<(String, usize)> = gold.iter().map(|(t, n)| (t.to_string(), *n)).collect();
            from_paragraphs(id.into(), format!("q{id}"), paras, &gold, Join::Natural)
        };
        let set = vec![
            ex("1", &[("A", "Gold one."), ("B", "Other one.")], &[("A", 0)]),
            ex("2", &[("C", "Gold two."), ("A", "Another A.")], &[("C", 0)]),
            ex("3", &[("B", "Other one."), ("D", "Dee.")], &[("D", 0)]),
        ];
        let long = among_others(&set, 5, 7);
        assert_eq!(long.len(), 3);
        for (l, orig) in long.iter().zip(&set) {
            // its own paragraphs all there, gold still on the same text
            for f in &orig.context.fields {
                assert!(l.context.fields.iter().any(|g| g.content == f.content), "{} lost {}", l.id, f.name);
            }
            let (gf, span) = l.gold[0];
            let (of, ospan) = orig.gold[0];
            assert_eq!(
                &l.context.fields[gf].content[span.0..span.1],
                &orig.context.fields[of].content[ospan.0..ospan.1]
            );
            // names unique, each (title, text) once
            let names: std::collections::HashSet<&str> = l.context.fields.iter().map(|f| f.name.as_str()).collect();
            assert_eq!(names.len(), l.context.fields.len());
            assert_eq!(l.sentences.len(), l.context.fields.len());
        }
        // example 1 has B "Other one." itself: example 3's copy is not added again; its A gets a name of its own
        assert_eq!(long[0].context.fields.len(), 5);
        assert!(long[0].context.fields.iter().any(|f| f.name == "A (2)" && f.content == "Another A."));
        assert_eq!(long[0].context.fields.iter().filter(|f| f.content == "Other one.").count(), 1);
        // seeded: the same set again, another seed another order
        let again = among_others(&set, 5, 7);
        let order = |s: &[Example]| s[0].context.fields.iter().map(|f| f.name.clone()).collect::<Vec<_>>();
        assert_eq!(order(&long), order(&again));
        assert!((0..20).any(|seed| order(&among_others(&set, 5, seed)) != order(&long)));
    }

    #[test]
    fn follow_ups_are_the_later_hops_with_earlier_answers_filled_in() {
        let hops = |v: &[(&str, &str)]| v.iter().map(|(q, a)| (q.to_string(), a.to_string())).collect::<Vec<_>>();
        let two = hops(&[("Who wrote Dune?", "Frank Herbert"), ("Where was #1 born?", "Tacoma")]);
        assert_eq!(follow_up_questions(&two), ["Where was Frank Herbert born?"]);
        let mut many: Vec<(String, String)> = (1..=12).map(|n| (format!("q{n}"), format!("a{n}"))).collect();
        many.push(("#12 and #1".into(), "x".into()));
        assert_eq!(follow_up_questions(&many).last().unwrap(), "a12 and a1");
        assert!(follow_up_questions(&two[..1]).is_empty());
        let record = r#"{"id": "m", "question": "Where was the author of Dune born?", "paragraphs": [{"title": "T", "paragraph_text": "P."}], "question_decomposition": [{"id": 1, "question": "Who wrote Dune?", "answer": "Frank Herbert", "paragraph_support_idx": 0}, {"id": 2, "question": "Where was #1 born?", "answer": "Tacoma", "paragraph_support_idx": null}]}"#;
        let ex = load_text(Dataset::Musique, "m.jsonl", record).unwrap();
        assert_eq!(ex[0].follow_ups, ["Where was Frank Herbert born?"]);
    }

    #[test]
    fn a_musique_paragraph_is_kept_from_90_percent_of_its_characters() {
        let body = "abcdefghij klmnopqrst"; // 20 non-space characters
        let mut ex = from_paragraphs("m".into(), "q".into(), vec![("P".into(), vec![body.into()])], &[], Join::Natural);
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
            follow_ups: Vec::new(),
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
        let ex = code_example(typed(&rec.to_string()).unwrap()).unwrap();
        assert_eq!(ex.gold, vec![(0, span)]);
        assert_eq!(ex.question, "Does f.");
        let b: Vec<&str> = ex.sentences[0].iter().map(|&(a, e)| &s[a..e]).collect();
        assert_eq!(b, vec!["use std::fmt;", &s[span.0..span.1], "fn g() {}"]);
        let mut bad = rec.clone();
        bad["gold"] = "fn missing() {}".into();
        assert_eq!(
            code_example(typed(&bad.to_string()).unwrap()).unwrap_err(),
            "gold: not found verbatim in any field"
        );
    }
}
