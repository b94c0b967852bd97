//! Hand-off report formats: the report one agent passes to the next stage,
//! as free text, tagged sections or JSON (`fixtures/handoff/README.md` names
//! the page they are specified on).
//!
//! * [`Format::Freeform`]: any text. It always parses; the report is its
//!   summary.
//! * [`Format::SemiStructured`]: tagged sections `[STATUS]`, `[SUMMARY]`,
//!   `[EVIDENCE_OR_TESTS]`, `[CONFIDENCE]`, `[NEXT]`, `[ANSWER_CANDIDATE]`
//!   (all six required, each once), plus optional per-dataset tags kept in
//!   the payload under their lower-cased name.
//! * [`Format::StructuredSoft`]: `JSON_REPORT:` … `END_JSON_REPORT` around a
//!   JSON object with the five keys `status`, `summary`, `confidence`,
//!   `next`, `payload`, the payload itself an object.
//!
//! In both structured formats the status is one of `not_started`,
//! `in_progress`, `completed`, `blocked` and the confidence one of `low`,
//! `medium`, `high`. In every format the scorer-facing final line after the
//! report, `Answer: …`, is kept verbatim (see [`Parsed::answer`]).
//!
//! A malformed report is never rejected: [`parse`] degrades it to freeform
//! and says why in [`Parsed::why_not`]. [`render`] writes a report in any
//! format, and what it writes always parses back ([`ParseRate`] counts both).
//! [`to_fields`] turns a report into context fields so compression picks at
//! section level, and [`confidence_value`] maps its confidence to the
//! `current_confidence` of an adaptive request.
//!
//! ```
//! use scd_engine::handoff::{confidence_value, parse, render, ConfidenceMap, Format, Status};
//!
//! let text = "[STATUS]\ncompleted\n[SUMMARY]\nArthur's Magazine (1844) is older.\n\
//!             [EVIDENCE_OR_TESTS]\nfounded 1844 vs 1989\n[CONFIDENCE]\nhigh, both years confirmed\n\
//!             [NEXT]\nanswer\n[ANSWER_CANDIDATE]\nArthur's Magazine\n\nAnswer: Arthur's Magazine\n";
//! let p = parse(text, Format::SemiStructured);
//! assert!(p.parsed);
//! assert_eq!(p.report.status, Some(Status::Completed));
//! assert_eq!(p.answer.as_deref(), Some("Arthur's Magazine"));
//! assert_eq!(confidence_value(p.report.confidence.unwrap(), &ConfidenceMap::default()), 0.9);
//!
//! // a JSON report without END_JSON_REPORT degrades to freeform, with the reason
//! let bad = parse("JSON_REPORT:\n{\"status\": \"completed\"}\nAnswer: x", Format::StructuredSoft);
//! assert!(!bad.parsed && bad.format == Format::Freeform);
//! assert_eq!(bad.why_not.unwrap().to_string(), "missing END_JSON_REPORT");
//!
//! // whatever is rendered parses back, in every format
//! let json = render(&p.report, Format::StructuredSoft, p.answer.as_deref());
//! let back = parse(&json, Format::StructuredSoft);
//! assert!(back.parsed);
//! assert_eq!(back.report, p.report);
//! assert_eq!(back.answer, p.answer);
//! ```

use std::borrow::Cow;
use std::collections::HashSet;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::context::{Field, FieldKind, MAX_FIELD_NAME_BYTES};
use crate::extract::{CompressRequest, Compressed, Envelope, SelectedChunk};
use crate::{Error, Result};

/// The prefix of the scorer-facing final line.
pub const ANSWER_PREFIX: &str = "Answer:";
/// Opens a structured report.
pub const JSON_MARKER: &str = "JSON_REPORT:";
/// Closes a structured report.
pub const JSON_END: &str = "END_JSON_REPORT";
/// The six tags every semi-structured report holds, in the order rendered.
pub const STANDARD_TAGS: [&str; 6] =
    ["STATUS", "SUMMARY", "EVIDENCE_OR_TESTS", "CONFIDENCE", "NEXT", "ANSWER_CANDIDATE"];
/// The tag that carries payload entries with no tag of their own, as a JSON object.
pub const PAYLOAD_TAG: &str = "PAYLOAD";
/// The five keys of a structured report.
pub const JSON_KEYS: [&str; 5] = ["status", "summary", "confidence", "next", "payload"];
/// The status written when a report has none (it only says work is not done).
pub const DEFAULT_STATUS: Status = Status::InProgress;
/// The confidence written when a report has none: the cautious level, so a
/// receiver still asks for more context.
pub const DEFAULT_CONFIDENCE: Confidence = Confidence::Low;
/// Longest tag name in bytes; a longer `[...]` is text.
const MAX_TAG_BYTES: usize = 64;
/// Longest value echoed back in a reason.
const MAX_ECHO_CHARS: usize = 40;

/// A report format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Format {
    /// Free text.
    Freeform,
    /// Tagged sections.
    SemiStructured,
    /// `JSON_REPORT:` … `END_JSON_REPORT`.
    StructuredSoft,
}

impl Format {
    /// Every format.
    pub const ALL: [Format; 3] = [Format::Freeform, Format::SemiStructured, Format::StructuredSoft];

    /// The format's name: `freeform`, `semi_structured`, `structured_soft`.
    pub fn name(self) -> &'static str {
        match self {
            Format::Freeform => "freeform",
            Format::SemiStructured => "semi_structured",
            Format::StructuredSoft => "structured_soft",
        }
    }

    /// The format `text` is written in: structured when a line starts with
    /// `JSON_REPORT:`, semi-structured when a line starts with one of the
    /// six standard tags, freeform otherwise.
    pub fn detect(text: &str) -> Format {
        if find_line_start(text, JSON_MARKER).is_some() {
            Format::StructuredSoft
        } else if text.split('\n').any(|l| tag_line(l).is_some_and(|(t, _)| STANDARD_TAGS.contains(&t))) {
            Format::SemiStructured
        } else {
            Format::Freeform
        }
    }
}

impl std::fmt::Display for Format {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Format {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        Format::ALL.into_iter().find(|f| f.name() == s).ok_or_else(|| {
            Error::invalid("format", format!("{s:?} is not one of freeform, semi_structured, structured_soft"))
        })
    }
}

/// Where the work stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// Not begun.
    NotStarted,
    /// Under way.
    InProgress,
    /// Done.
    Completed,
    /// Cannot go on.
    Blocked,
}

impl Status {
    /// Every status.
    pub const ALL: [Status; 4] = [Status::NotStarted, Status::InProgress, Status::Completed, Status::Blocked];

    /// The status as written in reports.
    pub fn name(self) -> &'static str {
        match self {
            Status::NotStarted => "not_started",
            Status::InProgress => "in_progress",
            Status::Completed => "completed",
            Status::Blocked => "blocked",
        }
    }

    fn from_name(s: &str) -> Option<Self> {
        Status::ALL.into_iter().find(|v| v.name() == s)
    }
}

/// How sure the agent is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Confidence {
    /// Unsure.
    Low,
    /// Fairly sure.
    Medium,
    /// Sure.
    High,
}

impl Confidence {
    /// Every level.
    pub const ALL: [Confidence; 3] = [Confidence::Low, Confidence::Medium, Confidence::High];

    /// The level as written in reports.
    pub fn name(self) -> &'static str {
        match self {
            Confidence::Low => "low",
            Confidence::Medium => "medium",
            Confidence::High => "high",
        }
    }

    fn from_name(s: &str) -> Option<Self> {
        Confidence::ALL.into_iter().find(|v| v.name() == s)
    }
}

/// The `current_confidence` (in [0, 1]) each reported level stands for in
/// an adaptive context request. Defaults: low 0.3, medium 0.6, high 0.9.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfidenceMap {
    /// For `low`.
    pub low: f32,
    /// For `medium`.
    pub medium: f32,
    /// For `high`.
    pub high: f32,
}

impl Default for ConfidenceMap {
    fn default() -> Self {
        Self { low: 0.3, medium: 0.6, high: 0.9 }
    }
}

impl ConfidenceMap {
    /// Checks every value is in [0, 1]; the error names the level.
    pub fn validate(&self) -> Result<()> {
        for (name, v) in [("low", self.low), ("medium", self.medium), ("high", self.high)] {
            if !(0.0..=1.0).contains(&v) {
                return Err(Error::invalid(format!("confidence_map.{name}"), format!("must be in [0, 1], got {v}")));
            }
        }
        Ok(())
    }
}

/// The `current_confidence` that `level` stands for under `map`.
pub fn confidence_value(level: Confidence, map: &ConfidenceMap) -> f32 {
    match level {
        Confidence::Low => map.low,
        Confidence::Medium => map.medium,
        Confidence::High => map.high,
    }
}

/// One agent's report, whatever format it came in. Empty text is `None`.
///
/// In the JSON form (`scd handoff`), unknown keys are errors.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Report {
    /// Where the work stands.
    #[serde(default)]
    pub status: Option<Status>,
    /// What was found (for freeform: the whole report).
    #[serde(default)]
    pub summary: Option<String>,
    /// Evidence or tests (`[EVIDENCE_OR_TESTS]`; payload key `evidence` in JSON).
    #[serde(default)]
    pub evidence: Option<String>,
    /// How sure the agent is.
    #[serde(default)]
    pub confidence: Option<Confidence>,
    /// What the next stage should do.
    #[serde(default)]
    pub next: Option<String>,
    /// The proposed answer (`[ANSWER_CANDIDATE]`; payload key `answer_candidate` in JSON).
    #[serde(default)]
    pub answer_candidate: Option<String>,
    /// Everything else: per-dataset tags (lower-cased), the text after the
    /// status and confidence levels (`status_note`, `confidence_note`), the
    /// JSON payload.
    #[serde(default)]
    pub payload: Map<String, Value>,
}

/// Why a report did not parse in the format asked for.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NotParsed {
    /// No line starts with `JSON_REPORT:`.
    #[error("missing JSON_REPORT:")]
    MissingMarker,
    /// `JSON_REPORT:` is never closed.
    #[error("missing END_JSON_REPORT")]
    MissingEnd,
    /// The text after `JSON_REPORT:` is not JSON.
    #[error("JSON_REPORT is not valid JSON: {message}")]
    InvalidJson {
        /// What the JSON parser said.
        message: String,
    },
    /// The JSON is not an object.
    #[error("JSON_REPORT is not an object (found {found})")]
    NotAnObject {
        /// The JSON type found.
        found: &'static str,
    },
    /// Text between the JSON and `END_JSON_REPORT`.
    #[error("text between the JSON object and END_JSON_REPORT")]
    TextBeforeEnd,
    /// One of the five keys is missing.
    #[error("missing key {key:?}")]
    MissingKey {
        /// The key.
        key: &'static str,
    },
    /// `payload` is not an object.
    #[error("payload is not an object (found {found})")]
    PayloadNotObject {
        /// The JSON type found.
        found: &'static str,
    },
    /// The status is not one of the four.
    #[error("bad status value {value:?} (expected not_started, in_progress, completed or blocked)")]
    BadStatus {
        /// The value, cut to 40 characters.
        value: String,
    },
    /// The confidence is not one of the three.
    #[error("bad confidence value {value:?} (expected low, medium or high)")]
    BadConfidence {
        /// The value, cut to 40 characters.
        value: String,
    },
    /// A required tag is missing.
    #[error("missing tag [{tag}]")]
    MissingTag {
        /// The tag.
        tag: &'static str,
    },
    /// A tag appears twice.
    #[error("duplicate tag [{tag}]")]
    DuplicateTag {
        /// The tag.
        tag: String,
    },
}

impl NotParsed {
    /// A short name of the reason, for counting: `missing_end`, `bad_status`, ...
    pub fn kind(&self) -> &'static str {
        match self {
            NotParsed::MissingMarker => "missing_marker",
            NotParsed::MissingEnd => "missing_end",
            NotParsed::InvalidJson { .. } => "invalid_json",
            NotParsed::NotAnObject { .. } => "not_an_object",
            NotParsed::TextBeforeEnd => "text_before_end",
            NotParsed::MissingKey { .. } => "missing_key",
            NotParsed::PayloadNotObject { .. } => "payload_not_object",
            NotParsed::BadStatus { .. } => "bad_status",
            NotParsed::BadConfidence { .. } => "bad_confidence",
            NotParsed::MissingTag { .. } => "missing_tag",
            NotParsed::DuplicateTag { .. } => "duplicate_tag",
        }
    }
}

/// The outcome of [`parse`].
#[derive(Debug, Clone, PartialEq)]
pub struct Parsed {
    /// The format the report was read as: the one asked for, or freeform
    /// when it did not parse.
    pub format: Format,
    /// Whether it parsed as written in the format asked for.
    pub parsed: bool,
    /// Why not.
    pub why_not: Option<NotParsed>,
    /// The report.
    pub report: Report,
    /// The text after `Answer:` on the last line starting with it, verbatim
    /// except for one space after the colon and a `\r` line ending.
    pub answer: Option<String>,
}

/// Parses `text` as `format`. Never fails: a report that does not parse
/// degrades to freeform and says why. Linear in the text's length.
pub fn parse(text: &str, format: Format) -> Parsed {
    let (body, answer) = split_answer(text);
    let answer = answer.map(str::to_string);
    let result = match format {
        Format::Freeform => Ok(freeform(body)),
        Format::SemiStructured => parse_semi(body),
        Format::StructuredSoft => parse_structured(body),
    };
    match result {
        Ok(report) => Parsed { format, parsed: true, why_not: None, report, answer },
        Err(why) => {
            Parsed { format: Format::Freeform, parsed: false, why_not: Some(why), report: freeform(body), answer }
        }
    }
}

/// Parses `text` in the format [`Format::detect`] finds.
pub fn parse_auto(text: &str) -> Parsed {
    parse(text, Format::detect(text))
}

/// Writes `report` in `format`, then `Answer: {answer}` on a line of its
/// own. What it writes parses back in `format`, with the same answer when
/// the answer is one line. Missing status and confidence are written as
/// [`DEFAULT_STATUS`] and [`DEFAULT_CONFIDENCE`].
pub fn render(report: &Report, format: Format, answer: Option<&str>) -> String {
    let mut out = match format {
        Format::Freeform => render_freeform(report),
        Format::SemiStructured => render_semi(report),
        Format::StructuredSoft => render_structured(report),
    };
    if let Some(a) = answer {
        if !out.is_empty() {
            out.push('\n');
        }
        out.push_str(ANSWER_PREFIX);
        out.push(' ');
        out.push_str(a);
        // parse takes a last `\r` for the line ending: give it one to take
        if a.ends_with('\r') {
            out.push('\r');
        }
        out.push('\n');
    }
    out
}

/// Field name prefix of a report's sections.
pub const FIELD_PREFIX: &str = "report.";

/// The report as context fields, one per non-empty section, so compression
/// picks at section level: `report.status` (status and confidence),
/// `report.summary`, `report.evidence`, `report.next`,
/// `report.answer_candidate` (prose) and `report.payload.<key>` (prose for
/// text, JSON otherwise). A key too long for a field name is cut and
/// numbered.
pub fn to_fields(report: &Report) -> Vec<Field> {
    let mut fields = Vec::new();
    let mut push = |name: String, kind: FieldKind, content: String| {
        if !content.trim().is_empty() {
            fields.push(Field { name, kind, content, confidential: false });
        }
    };
    let mut levels = Vec::new();
    if let Some(s) = report.status {
        levels.push(format!("status: {}", s.name()));
    }
    if let Some(c) = report.confidence {
        levels.push(format!("confidence: {}", c.name()));
    }
    push(format!("{FIELD_PREFIX}status"), FieldKind::Prose, levels.join("\n"));
    for (name, text) in [
        ("summary", &report.summary),
        ("evidence", &report.evidence),
        ("next", &report.next),
        ("answer_candidate", &report.answer_candidate),
    ] {
        push(format!("{FIELD_PREFIX}{name}"), FieldKind::Prose, text.clone().unwrap_or_default());
    }
    let prefix = format!("{FIELD_PREFIX}payload.");
    for (i, (key, value)) in report.payload.iter().enumerate() {
        let mut name = format!("{prefix}{key}");
        if name.len() > MAX_FIELD_NAME_BYTES {
            let tag = format!("~{i}");
            let mut cut = MAX_FIELD_NAME_BYTES - tag.len();
            while !name.is_char_boundary(cut) {
                cut -= 1;
            }
            name.truncate(cut);
            name.push_str(&tag);
        }
        match value {
            Value::String(s) => push(name, FieldKind::Prose, s.clone()),
            v => push(name, FieldKind::Json, serde_json::to_string_pretty(v).unwrap_or_default()),
        }
    }
    fields
}

/// A report from selected context, the reverse of [`to_fields`]: `parts` are
/// (field name, text) pairs; texts of one field are joined by a newline.
/// `report.*` fields go back to their sections (payload entries as text);
/// any other field becomes a payload entry under its name.
pub fn from_fields<'a>(parts: impl IntoIterator<Item = (&'a str, &'a str)>) -> Report {
    let mut joined: Vec<(&str, String)> = Vec::new();
    for (name, text) in parts {
        match joined.iter_mut().find(|(n, _)| *n == name) {
            Some((_, t)) => {
                t.push('\n');
                t.push_str(text);
            }
            None => joined.push((name, text.to_string())),
        }
    }
    let mut report = Report::default();
    for (name, text) in joined {
        let text = non_empty(text);
        match name.strip_prefix(FIELD_PREFIX) {
            Some("status") => {
                for line in text.iter().flat_map(|t| t.lines()) {
                    if let Some(v) = line.strip_prefix("status: ") {
                        report.status = Status::from_name(v.trim());
                    } else if let Some(v) = line.strip_prefix("confidence: ") {
                        report.confidence = Confidence::from_name(v.trim());
                    }
                }
            }
            Some("summary") => report.summary = text,
            Some("evidence") => report.evidence = text,
            Some("next") => report.next = text,
            Some("answer_candidate") => report.answer_candidate = text,
            Some(rest) if rest.starts_with("payload.") => {
                report.payload.insert(rest["payload.".len()..].to_string(), Value::String(text.unwrap_or_default()));
            }
            _ => {
                report.payload.insert(name.to_string(), Value::String(text.unwrap_or_default()));
            }
        }
    }
    report
}

/// The chunks `out` selected from `req`'s context as a report in `format`,
/// then `Answer: {answer}` when given. Chunks of one field are joined with
/// the field's own text between them when only whitespace was skipped (so a
/// field sent whole reads as it was), with a newline otherwise; `report.*`
/// fields go back to their sections ([`from_fields`]). A report with no
/// summary of its own gets one naming the task.
pub fn render_selection(out: &Compressed, req: &CompressRequest, format: Format, answer: Option<&str>) -> String {
    render_chunks(&out.chunks, req, format, answer)
}

/// The envelope ([`crate::extract::CompressOptions::envelope`]) that renders a selection as
/// [`render_selection`] does: with it the report, wrapping included, is
/// what the engine fits in the budget and returns as `text`.
pub fn envelope(req: &CompressRequest, format: Format, answer: Option<String>) -> Envelope {
    let fields: Vec<Field> = req.context.fields.iter().filter(|f| !f.confidential).cloned().collect();
    let task = req.task.description.clone();
    Envelope(std::sync::Arc::new(move |chunks: &[SelectedChunk]| {
        render_parts(
            chunks,
            |name| fields.iter().find(|f| f.name == name).map(|f| f.content.as_str()),
            &task,
            format,
            answer.as_deref(),
        )
    }))
}

fn render_chunks(chunks: &[SelectedChunk], req: &CompressRequest, format: Format, answer: Option<&str>) -> String {
    let content = |name: &str| req.context.fields.iter().find(|f| f.name == name).map(|f| f.content.as_str());
    render_parts(chunks, content, &req.task.description, format, answer)
}

fn render_parts<'a>(
    chunks: &[SelectedChunk],
    content_of: impl Fn(&str) -> Option<&'a str>,
    task: &str,
    format: Format,
    answer: Option<&str>,
) -> String {
    let mut fields: Vec<(&str, Vec<&SelectedChunk>)> = Vec::new();
    for c in chunks {
        match fields.iter_mut().find(|(n, _)| *n == c.field) {
            Some((_, cs)) => cs.push(c),
            None => fields.push((&c.field, vec![c])),
        }
    }
    let mut parts: Vec<(&str, String)> = Vec::new();
    for (name, mut chunks) in fields {
        chunks.sort_by_key(|c| c.span);
        let content = content_of(name).unwrap_or("");
        let mut text = String::new();
        let mut prev_end: Option<usize> = None;
        for c in chunks {
            if let Some(end) = prev_end {
                match content.get(end..c.span.0) {
                    Some(gap) if gap.trim().is_empty() && end <= c.span.0 => text.push_str(gap),
                    _ => text.push('\n'),
                }
            }
            text.push_str(&c.text);
            prev_end = Some(c.span.1);
        }
        parts.push((name, text));
    }
    let mut report = from_fields(parts.iter().map(|(n, t)| (*n, t.as_str())));
    if report.summary.is_none() {
        report.summary = Some(format!("Context selected for the task: {}", task.trim()));
    }
    render(&report, format, answer)
}

/// Counts of reports that parse as written, and of their re-rendered forms
/// (which must always parse, with the same answer).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct ParseRate {
    /// Reports seen.
    pub reports: usize,
    /// Of them, parsed as written.
    pub parsed: usize,
    /// Re-rendered reports.
    pub rendered: usize,
    /// Of them, parsed back with the same answer.
    pub render_parsed: usize,
}

impl ParseRate {
    /// Parses `text` in `format` (detected when `None`), counts it, renders
    /// the report in that same format, parses that and counts it too.
    /// Returns the first parse.
    pub fn add(&mut self, text: &str, format: Option<Format>) -> Parsed {
        let format = format.unwrap_or_else(|| Format::detect(text));
        let p = parse(text, format);
        self.reports += 1;
        self.parsed += usize::from(p.parsed);
        let answer = p.answer.as_deref().filter(|a| !a.contains('\n'));
        let back = parse(&render(&p.report, format, answer), format);
        self.rendered += 1;
        self.render_parsed += usize::from(back.parsed && back.answer.as_deref() == answer);
        p
    }

    /// Reports that parse as written / all reports (1 when none).
    pub fn parse_rate(&self) -> f64 {
        ratio(self.parsed, self.reports)
    }

    /// Re-rendered reports that parse / all re-rendered (1 when none).
    pub fn render_parse_rate(&self) -> f64 {
        ratio(self.render_parsed, self.rendered)
    }
}

fn ratio(n: usize, d: usize) -> f64 {
    if d == 0 {
        1.0
    } else {
        n as f64 / d as f64
    }
}

// ---- reading ----

fn non_empty(s: String) -> Option<String> {
    if s.is_empty() {
        None
    } else {
        Some(s)
    }
}

/// Byte offset of the first line that starts with `prefix`.
fn find_line_start(text: &str, prefix: &str) -> Option<usize> {
    if text.starts_with(prefix) {
        return Some(0);
    }
    text.find(&format!("\n{prefix}")).map(|i| i + 1)
}

/// The text before the last line starting with `Answer:`, and that line's
/// text after the colon (one space and a `\r` ending dropped).
fn split_answer(text: &str) -> (&str, Option<&str>) {
    let start = match text.rfind(&format!("\n{ANSWER_PREFIX}")) {
        Some(i) => i + 1,
        None if text.starts_with(ANSWER_PREFIX) => 0,
        None => return (text, None),
    };
    let end = text[start..].find('\n').map_or(text.len(), |e| start + e);
    let line = &text[start + ANSWER_PREFIX.len()..end];
    let line = line.strip_suffix('\r').unwrap_or(line);
    (&text[..start], Some(line.strip_prefix(' ').unwrap_or(line)))
}

fn freeform(body: &str) -> Report {
    Report { summary: non_empty(body.trim().to_string()), ..Report::default() }
}

/// `[TAG]` at the start of `line`: the tag and the rest of the line.
fn tag_line(line: &str) -> Option<(&str, &str)> {
    let rest = line.strip_prefix('[')?;
    let close = rest.bytes().take(MAX_TAG_BYTES + 1).position(|b| b == b']')?;
    let tag = &rest[..close];
    let mut bytes = tag.bytes();
    let first = bytes.next()?;
    if !first.is_ascii_uppercase() || !bytes.all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_') {
        return None;
    }
    Some((tag, &rest[close + 1..]))
}

/// A line a reader could take for a tag, the answer or a JSON marker.
fn looks_special(line: &str) -> bool {
    line.starts_with('[') || line.starts_with(ANSWER_PREFIX) || line.starts_with(JSON_MARKER)
}

/// One more leading space on a line that (after its leading spaces) looks
/// special, so it stays text; [`unescape`] takes it off again.
fn escape(line: &str) -> Cow<'_, str> {
    if looks_special(line.trim_start_matches(' ')) {
        Cow::Owned(format!(" {line}"))
    } else {
        Cow::Borrowed(line)
    }
}

fn unescape(line: &str) -> &str {
    match line.strip_prefix(' ') {
        Some(rest) if looks_special(rest.trim_start_matches(' ')) => rest,
        _ => line,
    }
}

/// A section's text: its lines without blank ones at either end, unescaped,
/// trailing whitespace dropped.
fn section_text(lines: &[&str]) -> String {
    let blank = |l: &&str| l.trim().is_empty();
    let start = lines.iter().position(|l| !blank(l)).unwrap_or(lines.len());
    let end = lines.iter().rposition(|l| !blank(l)).map_or(start, |e| e + 1);
    let mut out = String::new();
    for (i, l) in lines[start..end].iter().enumerate() {
        if i > 0 {
            out.push('\n');
        }
        out.push_str(unescape(l));
    }
    out.truncate(out.trim_end().len());
    out
}

/// `completed, because ...` → the lower-cased level word and the note.
fn level_and_note(text: &str) -> (String, Option<String>) {
    let text = text.trim();
    let end = text.find(|c: char| !(c.is_ascii_alphabetic() || c == '_')).unwrap_or(text.len());
    let note = text[end..].trim_start_matches(|c: char| c.is_whitespace() || ",;:.-\u{2014}".contains(c)).trim_end();
    (text[..end].to_ascii_lowercase(), non_empty(note.to_string()))
}

fn echo(s: &str) -> String {
    s.chars().take(MAX_ECHO_CHARS).collect()
}

fn parse_semi(body: &str) -> Result<Report, NotParsed> {
    // (tag, lines); text before the first tag is not part of the report
    let mut sections: Vec<(&str, Vec<&str>)> = Vec::new();
    let mut seen = HashSet::new();
    for line in body.split('\n') {
        if let Some((tag, rest)) = tag_line(line) {
            let known = STANDARD_TAGS.contains(&tag) || tag == PAYLOAD_TAG;
            let rest = rest.trim();
            // an unknown tag must stand alone on its line; `[WARN] disk full` is text
            if known || rest.is_empty() {
                if !seen.insert(tag) {
                    return Err(NotParsed::DuplicateTag { tag: echo(tag) });
                }
                sections.push((tag, if rest.is_empty() { Vec::new() } else { vec![rest] }));
                continue;
            }
        }
        if let Some((_, lines)) = sections.last_mut() {
            lines.push(line);
        }
    }
    if let Some(tag) = STANDARD_TAGS.iter().find(|t| !seen.contains(*t)) {
        return Err(NotParsed::MissingTag { tag });
    }
    let mut report = Report::default();
    let mut payload_json = None;
    for (tag, lines) in sections {
        let text = section_text(&lines);
        match tag {
            "STATUS" => {
                let (word, note) = level_and_note(&text);
                report.status = Some(Status::from_name(&word).ok_or(NotParsed::BadStatus { value: echo(&text) })?);
                if let Some(n) = note {
                    report.payload.insert("status_note".into(), Value::String(n));
                }
            }
            "CONFIDENCE" => {
                let (word, note) = level_and_note(&text);
                report.confidence =
                    Some(Confidence::from_name(&word).ok_or(NotParsed::BadConfidence { value: echo(&text) })?);
                if let Some(n) = note {
                    report.payload.insert("confidence_note".into(), Value::String(n));
                }
            }
            "SUMMARY" => report.summary = non_empty(text),
            "EVIDENCE_OR_TESTS" => report.evidence = non_empty(text),
            "NEXT" => report.next = non_empty(text),
            "ANSWER_CANDIDATE" => report.answer_candidate = non_empty(text),
            PAYLOAD_TAG => payload_json = Some(text),
            other => {
                report.payload.insert(other.to_ascii_lowercase(), Value::String(text));
            }
        }
    }
    if let Some(text) = payload_json {
        match serde_json::from_str::<Value>(&text) {
            Ok(Value::Object(map)) => report.payload.extend(map),
            _ => {
                report.payload.insert("payload".into(), Value::String(text));
            }
        }
    }
    Ok(report)
}

fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// A text value: strings as they are, null as none, anything else as JSON.
fn json_text(v: Value) -> Option<String> {
    match v {
        Value::Null => None,
        Value::String(s) => non_empty(s),
        v => Some(v.to_string()),
    }
}

fn parse_structured(body: &str) -> Result<Report, NotParsed> {
    let start = find_line_start(body, JSON_MARKER).ok_or(NotParsed::MissingMarker)?;
    let after = &body[start + JSON_MARKER.len()..];
    if !after.contains(JSON_END) {
        return Err(NotParsed::MissingEnd);
    }
    let mut stream = serde_json::Deserializer::from_str(after).into_iter::<Value>();
    let value = match stream.next() {
        Some(Ok(v)) => v,
        Some(Err(e)) => return Err(NotParsed::InvalidJson { message: e.to_string() }),
        None => return Err(NotParsed::InvalidJson { message: "no JSON before END_JSON_REPORT".into() }),
    };
    let rest = after[stream.byte_offset()..].trim_start();
    if !rest.starts_with(JSON_END) {
        return Err(if rest.contains(JSON_END) { NotParsed::TextBeforeEnd } else { NotParsed::MissingEnd });
    }
    let Value::Object(mut obj) = value else {
        return Err(NotParsed::NotAnObject { found: json_type(&value) });
    };
    if let Some(key) = JSON_KEYS.iter().find(|k| !obj.contains_key(**k)) {
        return Err(NotParsed::MissingKey { key });
    }
    let mut payload = match obj.remove("payload") {
        Some(Value::Object(map)) => map,
        other => return Err(NotParsed::PayloadNotObject { found: json_type(&other.unwrap_or(Value::Null)) }),
    };
    let level = |v: Option<Value>| match v {
        Some(Value::String(s)) => (s.clone(), s),
        Some(v) => (String::new(), echo(&v.to_string())),
        None => (String::new(), String::new()),
    };
    let (status, shown) = level(obj.remove("status"));
    let status = Status::from_name(&status).ok_or(NotParsed::BadStatus { value: echo(&shown) })?;
    let (confidence, shown) = level(obj.remove("confidence"));
    let confidence = Confidence::from_name(&confidence).ok_or(NotParsed::BadConfidence { value: echo(&shown) })?;
    let take_text = |payload: &mut Map<String, Value>, key: &str| match payload.get(key) {
        Some(Value::String(_)) => payload.remove(key).and_then(json_text),
        _ => None,
    };
    let evidence = take_text(&mut payload, "evidence");
    let answer_candidate = take_text(&mut payload, "answer_candidate");
    let summary = obj.remove("summary").and_then(json_text);
    let next = obj.remove("next").and_then(json_text);
    // keys beyond the five are kept, in the payload
    for (k, v) in obj {
        payload.entry(k).or_insert(v);
    }
    Ok(Report {
        status: Some(status),
        summary,
        evidence,
        confidence: Some(confidence),
        next,
        answer_candidate,
        payload,
    })
}

// ---- writing ----

fn push_escaped(out: &mut String, text: &str) {
    for (i, line) in text.split('\n').enumerate() {
        if i > 0 {
            out.push('\n');
        }
        out.push_str(&escape(line));
    }
}

fn push_section(out: &mut String, tag: &str, text: &str) {
    out.push('[');
    out.push_str(tag);
    out.push_str("]\n");
    let text = text.trim();
    if !text.is_empty() {
        push_escaped(out, text);
        out.push('\n');
    }
}

/// Whether `note` after a level word reads back as itself.
fn note_round_trips(note: &str) -> bool {
    level_and_note(&format!("x, {note}")).1.as_deref() == Some(note)
}

/// Whether `text` as a section reads back as itself.
fn section_round_trips(text: &str) -> bool {
    text.trim() == text
}

fn render_semi(report: &Report) -> String {
    let mut out = String::new();
    let mut payload = report.payload.clone();
    let mut level = |word: &str, note_key: &str| match payload.get(note_key) {
        Some(Value::String(n)) if note_round_trips(n) => {
            let s = format!("{word}, {n}");
            payload.remove(note_key);
            s
        }
        _ => word.to_string(),
    };
    let status = level(report.status.unwrap_or(DEFAULT_STATUS).name(), "status_note");
    let confidence = level(report.confidence.unwrap_or(DEFAULT_CONFIDENCE).name(), "confidence_note");
    let text = |t: &Option<String>| t.clone().unwrap_or_default();
    push_section(&mut out, "STATUS", &status);
    push_section(&mut out, "SUMMARY", &text(&report.summary));
    push_section(&mut out, "EVIDENCE_OR_TESTS", &text(&report.evidence));
    push_section(&mut out, "CONFIDENCE", &confidence);
    push_section(&mut out, "NEXT", &text(&report.next));
    push_section(&mut out, "ANSWER_CANDIDATE", &text(&report.answer_candidate));
    // a text entry whose key is a lower-cased tag gets a section of its own;
    // the rest travel as one JSON object under [PAYLOAD]
    let mut rest = Map::new();
    for (key, value) in payload {
        let tag = key.to_ascii_uppercase();
        let own_section = matches!(&value, Value::String(s) if section_round_trips(s))
            && tag.to_ascii_lowercase() == key
            && tag_line(&format!("[{tag}]")).is_some_and(|(t, _)| t == tag)
            && !STANDARD_TAGS.contains(&tag.as_str())
            && tag != PAYLOAD_TAG
            && key != "status_note"
            && key != "confidence_note";
        match value {
            Value::String(s) if own_section => push_section(&mut out, &tag, &s),
            v => {
                rest.insert(key, v);
            }
        }
    }
    if !rest.is_empty() {
        // compact JSON is one line: strings escape their newlines
        push_section(&mut out, PAYLOAD_TAG, &Value::Object(rest).to_string());
    }
    out
}

fn render_structured(report: &Report) -> String {
    let mut payload = report.payload.clone();
    if let Some(e) = &report.evidence {
        payload.insert("evidence".into(), Value::String(e.clone()));
    }
    if let Some(a) = &report.answer_candidate {
        payload.insert("answer_candidate".into(), Value::String(a.clone()));
    }
    let s = |v: &Option<String>| Value::String(v.clone().unwrap_or_default()).to_string();
    let payload = serde_json::to_string_pretty(&Value::Object(payload)).unwrap_or_else(|_| "{}".into());
    format!(
        "{JSON_MARKER}\n{{\n  \"status\": \"{}\",\n  \"summary\": {},\n  \"confidence\": \"{}\",\n  \"next\": {},\n  \"payload\": {}\n}}\n{JSON_END}\n",
        report.status.unwrap_or(DEFAULT_STATUS).name(),
        s(&report.summary),
        report.confidence.unwrap_or(DEFAULT_CONFIDENCE).name(),
        s(&report.next),
        payload.replace('\n', "\n  "),
    )
}

fn render_freeform(report: &Report) -> String {
    let mut paragraphs: Vec<String> = Vec::new();
    let mut add = |label: &str, text: &str| {
        let text = text.trim();
        if !text.is_empty() {
            paragraphs.push(format!("{label}{text}"));
        }
    };
    add("", report.summary.as_deref().unwrap_or_default());
    add("Evidence: ", report.evidence.as_deref().unwrap_or_default());
    let mut levels = Vec::new();
    if let Some(s) = report.status {
        levels.push(format!("Status: {}.", s.name()));
    }
    if let Some(c) = report.confidence {
        levels.push(format!("Confidence: {}.", c.name()));
    }
    add("", &levels.join(" "));
    add("Next: ", report.next.as_deref().unwrap_or_default());
    add("Answer candidate: ", report.answer_candidate.as_deref().unwrap_or_default());
    for (key, value) in &report.payload {
        match value {
            Value::String(s) => add(&format!("{key}: "), s),
            v => add(&format!("{key}: "), &v.to_string()),
        }
    }
    let mut out = String::new();
    push_escaped(&mut out, &paragraphs.join("\n\n"));
    if !out.is_empty() {
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use rand::{Rng, SeedableRng};
    use serde_json::json;

    use super::*;

    const FREEFORM: &str = include_str!("../../fixtures/handoff/freeform.txt");
    const SEMI: &str = include_str!("../../fixtures/handoff/semi_structured.txt");
    const STRUCTURED: &str = include_str!("../../fixtures/handoff/structured_soft.txt");
    const ANSWER: &str = "Arthur's Magazine";

    fn not_parsed(text: &str, format: Format) -> NotParsed {
        let p = parse(text, format);
        assert!(!p.parsed, "{text:?} parsed");
        assert_eq!(p.format, Format::Freeform, "a report that does not parse degrades to freeform");
        assert_eq!(p.report, freeform(split_answer(text).0), "the degraded report is the freeform reading");
        p.why_not.expect("a reason")
    }

    #[test]
    fn golden_freeform_seed_example() {
        let p = parse(FREEFORM, Format::Freeform);
        assert!(p.parsed && p.why_not.is_none());
        assert_eq!(p.format, Format::Freeform);
        assert_eq!(
            p.report,
            Report {
                summary: Some(
                    "Arthur's Magazine was founded in 1844; First for Women in 1989, so Arthur's\nMagazine came first."
                        .into()
                ),
                ..Report::default()
            }
        );
        assert_eq!(p.answer.as_deref(), Some(ANSWER));
        assert_eq!(Format::detect(FREEFORM), Format::Freeform);
    }

    #[test]
    fn golden_semi_structured_seed_example() {
        let p = parse(SEMI, Format::SemiStructured);
        assert!(p.parsed, "{:?}", p.why_not);
        assert_eq!(p.format, Format::SemiStructured);
        let want = Report {
            status: Some(Status::Completed),
            summary: Some("Arthur's Magazine (1844) predates First for Women (1989).".into()),
            evidence: Some("Arthur's Magazine founded 1844; First for Women founded 1989.".into()),
            confidence: Some(Confidence::High),
            next: Some("Use Arthur's Magazine as the final answer.".into()),
            answer_candidate: Some(ANSWER.into()),
            payload: json!({"confidence_note": "both founding years confirmed from Wikipedia."})
                .as_object()
                .unwrap()
                .clone(),
        };
        assert_eq!(p.report, want);
        assert_eq!(p.answer.as_deref(), Some(ANSWER));
        assert_eq!(Format::detect(SEMI), Format::SemiStructured);
    }

    #[test]
    fn golden_structured_soft_seed_example() {
        let p = parse(STRUCTURED, Format::StructuredSoft);
        assert!(p.parsed, "{:?}", p.why_not);
        let want = Report {
            status: Some(Status::Completed),
            summary: Some("Arthur's Magazine (1844) predates First for Women (1989).".into()),
            evidence: None,
            confidence: Some(Confidence::High),
            next: Some("Use Arthur's Magazine as the final answer.".into()),
            answer_candidate: Some(ANSWER.into()),
            payload: json!({"entities": ["Arthur's Magazine", "First for Women"]}).as_object().unwrap().clone(),
        };
        assert_eq!(p.report, want);
        assert_eq!(p.answer.as_deref(), Some(ANSWER));
        assert_eq!(Format::detect(STRUCTURED), Format::StructuredSoft);
    }

    #[test]
    fn seed_examples_render_back_to_the_same_report_in_their_format() {
        for (text, format) in
            [(FREEFORM, Format::Freeform), (SEMI, Format::SemiStructured), (STRUCTURED, Format::StructuredSoft)]
        {
            let p = parse(text, format);
            let back = parse(&render(&p.report, format, p.answer.as_deref()), format);
            assert!(back.parsed, "{format}: {:?}", back.why_not);
            assert_eq!(back.report, p.report, "{format}");
            assert_eq!(back.answer, p.answer, "{format}");
        }
    }

    #[test]
    fn a_report_in_another_format_does_not_parse_and_says_why() {
        assert_eq!(not_parsed(FREEFORM, Format::SemiStructured), NotParsed::MissingTag { tag: "STATUS" });
        assert_eq!(not_parsed(FREEFORM, Format::StructuredSoft), NotParsed::MissingMarker);
        assert_eq!(not_parsed(STRUCTURED, Format::SemiStructured), NotParsed::MissingTag { tag: "STATUS" });
        assert_eq!(not_parsed(SEMI, Format::StructuredSoft), NotParsed::MissingMarker);
        // freeform reads anything
        assert!(parse(SEMI, Format::Freeform).parsed);
    }

    fn json_report(body: &str) -> String {
        format!("JSON_REPORT:\n{body}\nEND_JSON_REPORT\n\nAnswer: x\n")
    }

    const GOOD: &str = r#""status": "completed", "summary": "s", "confidence": "low", "next": "n""#;

    #[test]
    fn malformed_structured_reports_degrade_with_a_named_reason() {
        let cut = STRUCTURED.replace("END_JSON_REPORT", "");
        assert_eq!(not_parsed(&cut, Format::StructuredSoft), NotParsed::MissingEnd);
        assert_eq!(
            not_parsed(&json_report(r#"["status", "completed"]"#), Format::StructuredSoft),
            NotParsed::NotAnObject { found: "an array" }
        );
        assert_eq!(
            not_parsed(&json_report(r#""completed""#), Format::StructuredSoft),
            NotParsed::NotAnObject { found: "a string" }
        );
        assert_eq!(
            not_parsed(
                &json_report(r#"{"status": "completed", "summary": "s", "confidence": "low", "payload": {}}"#),
                Format::StructuredSoft
            ),
            NotParsed::MissingKey { key: "next" }
        );
        assert_eq!(
            not_parsed(&json_report(&format!("{{{GOOD}, \"payload\": [1]}}")), Format::StructuredSoft),
            NotParsed::PayloadNotObject { found: "an array" }
        );
        assert_eq!(
            not_parsed(&json_report(&format!("{{{GOOD}, \"payload\": null}}")), Format::StructuredSoft),
            NotParsed::PayloadNotObject { found: "null" }
        );
        let bad_status = GOOD.replace("\"completed\"", "\"done\"");
        let why = not_parsed(&json_report(&format!("{{{bad_status}, \"payload\": {{}}}}")), Format::StructuredSoft);
        assert_eq!(why, NotParsed::BadStatus { value: "done".into() });
        assert_eq!(
            why.to_string(),
            "bad status value \"done\" (expected not_started, in_progress, completed or blocked)"
        );
        let upper = GOOD.replace("\"completed\"", "\"Completed\"");
        assert_eq!(
            not_parsed(&json_report(&format!("{{{upper}, \"payload\": {{}}}}")), Format::StructuredSoft),
            NotParsed::BadStatus { value: "Completed".into() },
            "JSON values are exact"
        );
        let bad_conf = GOOD.replace("\"low\"", "0.9");
        let why = not_parsed(&json_report(&format!("{{{bad_conf}, \"payload\": {{}}}}")), Format::StructuredSoft);
        assert_eq!(why, NotParsed::BadConfidence { value: "0.9".into() });
        assert_eq!(why.to_string(), "bad confidence value \"0.9\" (expected low, medium or high)");
        let why = not_parsed(&json_report("{\"status\": "), Format::StructuredSoft);
        assert!(matches!(&why, NotParsed::InvalidJson { .. }), "{why:?}");
        assert!(why.to_string().starts_with("JSON_REPORT is not valid JSON: "), "{why}");
        assert_eq!(
            not_parsed(&json_report(&format!("{{{GOOD}, \"payload\": {{}}}} trailing")), Format::StructuredSoft),
            NotParsed::TextBeforeEnd
        );
        // a long bad value is echoed cut short
        let long = GOOD.replace("\"completed\"", &format!("\"{}\"", "z".repeat(10_000)));
        let why = not_parsed(&json_report(&format!("{{{long}, \"payload\": {{}}}}")), Format::StructuredSoft);
        assert_eq!(why, NotParsed::BadStatus { value: "z".repeat(40) });
    }

    #[test]
    fn structured_reports_keep_extra_keys_and_find_the_end_after_the_json() {
        // END_JSON_REPORT inside a string does not end the report
        let text =
            json_report(&format!("{{{GOOD}, \"payload\": {{\"note\": \"see END_JSON_REPORT\"}}, \"extra\": 1}}"));
        let p = parse(&text, Format::StructuredSoft);
        assert!(p.parsed, "{:?}", p.why_not);
        assert_eq!(p.report.payload, json!({"note": "see END_JSON_REPORT", "extra": 1}).as_object().unwrap().clone());
        // text before the marker is not part of the report; the first marker counts
        let p = parse(&format!("Here it is:\n{text}JSON_REPORT:\n{{}}\n"), Format::StructuredSoft);
        assert!(p.parsed, "{:?}", p.why_not);
        // a marker not at the start of a line is text
        assert_eq!(not_parsed("see JSON_REPORT: {}", Format::StructuredSoft), NotParsed::MissingMarker);
    }

    fn semi(status: &str, confidence: &str, extra: &str) -> String {
        format!(
            "[STATUS]\n{status}\n[SUMMARY]\ns\n[EVIDENCE_OR_TESTS]\ne\n[CONFIDENCE]\n{confidence}\n[NEXT]\nn\n\
             [ANSWER_CANDIDATE]\na\n{extra}\nAnswer: a\n"
        )
    }

    #[test]
    fn malformed_semi_structured_reports_degrade_with_a_named_reason() {
        assert!(parse(&semi("completed", "low", ""), Format::SemiStructured).parsed);
        assert_eq!(
            not_parsed(&semi("finished", "low", ""), Format::SemiStructured),
            NotParsed::BadStatus { value: "finished".into() }
        );
        assert_eq!(not_parsed(&semi("", "low", ""), Format::SemiStructured), NotParsed::BadStatus { value: "".into() });
        assert_eq!(
            not_parsed(&semi("completed", "very high", ""), Format::SemiStructured),
            NotParsed::BadConfidence { value: "very high".into() }
        );
        assert_eq!(
            not_parsed(&semi("completed", "0.8", ""), Format::SemiStructured),
            NotParsed::BadConfidence { value: "0.8".into() }
        );
        let no_next = semi("completed", "low", "").replace("[NEXT]\n", "");
        assert_eq!(not_parsed(&no_next, Format::SemiStructured), NotParsed::MissingTag { tag: "NEXT" });
        assert_eq!(
            not_parsed(&semi("completed", "low", "[SUMMARY]\nagain"), Format::SemiStructured),
            NotParsed::DuplicateTag { tag: "SUMMARY".into() }
        );
        assert_eq!(
            not_parsed(&semi("completed", "low", "[TESTS]\n1\n[TESTS]\n2"), Format::SemiStructured),
            NotParsed::DuplicateTag { tag: "TESTS".into() }
        );
        // lower-case tags are text, so the section is missing
        let lower = semi("completed", "low", "").replace("[STATUS]", "[status]");
        assert_eq!(not_parsed(&lower, Format::SemiStructured), NotParsed::MissingTag { tag: "STATUS" });
    }

    #[test]
    fn semi_structured_levels_take_case_and_notes_and_keep_the_note() {
        let p = parse(&semi("Completed.", "MEDIUM - one source only", ""), Format::SemiStructured);
        assert!(p.parsed, "{:?}", p.why_not);
        assert_eq!(p.report.status, Some(Status::Completed));
        assert_eq!(p.report.confidence, Some(Confidence::Medium));
        assert_eq!(p.report.payload.get("confidence_note"), Some(&json!("one source only")));
        assert_eq!(p.report.payload.get("status_note"), None);
        // a tag with its value on the same line
        let inline = semi("completed", "low", "").replace("[STATUS]\ncompleted", "[STATUS] blocked");
        assert_eq!(parse(&inline, Format::SemiStructured).report.status, Some(Status::Blocked));
    }

    /// The seed leaves tags beyond the six to each dataset ("each dataset
    /// suggests its own optional tags"): they parse, and are kept in the
    /// payload under their lower-cased name. An unknown tag must stand alone
    /// on its line; `[WARN] disk full` is text of the section it is in.
    #[test]
    fn unknown_tags_are_optional_dataset_tags_kept_in_the_payload() {
        let text = semi("completed", "high", "[TESTS_RUN]\n3 passed\n\n[FILES]\nsrc/a.rs\n[WARN] disk full\n");
        let p = parse(&text, Format::SemiStructured);
        assert!(p.parsed, "{:?}", p.why_not);
        assert_eq!(
            p.report.payload,
            json!({"tests_run": "3 passed", "files": "src/a.rs\n[WARN] disk full"}).as_object().unwrap().clone()
        );
        assert_eq!(p.report.answer_candidate.as_deref(), Some("a"));
        // text before the first tag is not part of the report
        let p = parse(&format!("Here is my report.\n{text}"), Format::SemiStructured);
        assert!(p.parsed);
        assert_eq!(p.report.summary.as_deref(), Some("s"));
    }

    #[test]
    fn the_answer_line_is_kept_byte_for_byte() {
        // "ends in CR\r": found by the `handoff` fuzz target in seconds
        for answer in [
            "  two\tspaces \u{a0}",
            "日本語 \u{1f600}",
            "",
            "Answer: nested",
            "[STATUS]",
            "x\u{200b}",
            "ends in CR\r\r",
        ] {
            let text = format!("body\nAnswer: {answer}\r\n");
            assert_eq!(parse(&text, Format::Freeform).answer.as_deref(), Some(answer), "{answer:?}");
            for format in Format::ALL {
                let r = parse(&semi("completed", "low", ""), Format::SemiStructured).report;
                let back = parse(&render(&r, format, Some(answer)), format);
                assert!(back.parsed, "{format} {answer:?}: {:?}", back.why_not);
                assert_eq!(back.answer.as_deref(), Some(answer), "{format}");
            }
        }
        // the last Answer: line at the start of a line is the artifact
        let p = parse("Answer: draft\nmore\nAnswer:final \nnot it: Answer: x", Format::Freeform);
        assert_eq!(p.answer.as_deref(), Some("final "));
        assert_eq!(p.report.summary.as_deref(), Some("Answer: draft\nmore"));
        assert_eq!(parse("no answer here", Format::Freeform).answer, None);
    }

    #[test]
    fn confidence_maps_to_current_confidence_and_the_map_is_checked() {
        let m = ConfidenceMap::default();
        assert_eq!(Confidence::ALL.map(|c| confidence_value(c, &m)), [0.3, 0.6, 0.9]);
        let custom = ConfidenceMap { low: 0.1, medium: 0.5, high: 1.0 };
        assert!(custom.validate().is_ok());
        assert_eq!(confidence_value(Confidence::High, &custom), 1.0);
        let err = ConfidenceMap { medium: 1.5, ..m }.validate().unwrap_err().to_string();
        assert!(err.contains("confidence_map.medium") && err.contains("1.5"), "{err}");
        assert!(ConfidenceMap { low: f32::NAN, ..m }.validate().is_err());
    }

    #[test]
    fn fields_pick_sections_and_come_back() {
        let p = parse(STRUCTURED, Format::StructuredSoft);
        let fields = to_fields(&p.report);
        let names: Vec<&str> = fields.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(
            names,
            ["report.status", "report.summary", "report.next", "report.answer_candidate", "report.payload.entities"]
        );
        assert_eq!(fields[0].content, "status: completed\nconfidence: high");
        assert_eq!(fields[4].kind, FieldKind::Json);
        assert!(crate::context::Context { fields: fields.clone() }.validate().is_ok());
        let back = from_fields(fields.iter().map(|f| (f.name.as_str(), f.content.as_str())));
        assert_eq!(back.status, p.report.status);
        assert_eq!(back.confidence, p.report.confidence);
        assert_eq!(back.summary, p.report.summary);
        assert_eq!(back.next, p.report.next);
        assert_eq!(back.answer_candidate, p.report.answer_candidate);
        assert!(back.payload["entities"].as_str().unwrap().contains("First for Women"));
        // other fields become payload entries; chunks of one field are joined
        let r = from_fields([("db_schema", "CREATE TABLE a"), ("logs", "x"), ("db_schema", "CREATE TABLE b")]);
        assert_eq!(
            r.payload,
            json!({"db_schema": "CREATE TABLE a\nCREATE TABLE b", "logs": "x"}).as_object().unwrap().clone()
        );
        // long keys make valid, distinct field names
        let mut long = Report::default();
        for i in 0..3 {
            long.payload.insert(format!("{}{i}", "é".repeat(200)), json!("v"));
        }
        let fields = to_fields(&long);
        assert_eq!(fields.len(), 3);
        assert!(crate::context::Context { fields }.validate_within(&Default::default()).is_ok());
    }

    const WORDS: &[&str] = &[
        "word",
        "Answer:",
        "Answer: x",
        "[STATUS]",
        "[NEXT]",
        "[X]",
        "[PAYLOAD]",
        "JSON_REPORT:",
        "END_JSON_REPORT",
        "{",
        "}",
        "\"",
        "\\",
        "\n",
        "\n\n",
        "\r\n",
        " ",
        "  ",
        "\t",
        "high,",
        "low",
        "completed",
        "é",
        "日本",
        "\u{1f600}",
        "\u{a0}",
        ",",
        "-",
        ".",
        "[",
        "]",
        "null",
    ];

    fn text(rng: &mut (impl Rng + ?Sized), max: usize) -> String {
        (0..rng.random_range(0..max)).map(|_| WORDS[rng.random_range(0..WORDS.len())]).collect()
    }

    fn random_report(rng: &mut impl Rng) -> Report {
        let opt = |rng: &mut dyn rand::RngCore| {
            let t = text(rng, 12).trim().to_string();
            (!t.is_empty() && rng.random_bool(0.8)).then_some(t)
        };
        let mut payload = Map::new();
        for i in 0..rng.random_range(0..4) {
            let key = ["tests", "files", "note", "Odd Key", "status_note", "confidence_note", "summary", "payload", ""]
                [rng.random_range(0..9)];
            let value = match rng.random_range(0..4) {
                0 => json!(i),
                1 => json!([text(rng, 3), {"k": null}]),
                _ => json!(text(rng, 8)),
            };
            payload.insert(key.to_string(), value);
        }
        Report {
            status: rng.random_bool(0.9).then(|| Status::ALL[rng.random_range(0..4)]),
            summary: opt(rng),
            evidence: opt(rng),
            confidence: rng.random_bool(0.9).then(|| Confidence::ALL[rng.random_range(0..3)]),
            next: opt(rng),
            answer_candidate: opt(rng),
            payload,
        }
    }

    /// What a structured format gives back: missing levels filled in,
    /// evidence and answer candidate out of the payload.
    fn expected_back(r: &Report) -> Report {
        Report {
            status: Some(r.status.unwrap_or(DEFAULT_STATUS)),
            confidence: Some(r.confidence.unwrap_or(DEFAULT_CONFIDENCE)),
            ..r.clone()
        }
    }

    #[test]
    fn rendered_reports_always_parse_back_render_parse_rate_is_one() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(5);
        let mut rate = ParseRate::default();
        for _ in 0..3000 {
            let r = random_report(&mut rng);
            let answer = text(&mut rng, 5).replace(['\n', '\r'], " ");
            let answer = rng.random_bool(0.9).then_some(answer.as_str());
            for format in Format::ALL {
                let rendered = render(&r, format, answer);
                let back = parse(&rendered, format);
                assert!(back.parsed, "{format}: {:?}\n{rendered}", back.why_not);
                assert_eq!(back.answer.as_deref(), answer, "{format}:\n{rendered}");
                assert_eq!(Format::detect(&rendered), format, "{rendered}");
                if format != Format::Freeform {
                    assert_eq!(back.report, expected_back(&r), "{format}:\n{rendered}");
                }
                rate.add(&rendered, Some(format));
            }
        }
        assert_eq!(rate.render_parse_rate(), 1.0);
        assert_eq!(rate.parse_rate(), 1.0, "SCD's own reports parse as written");
    }

    #[test]
    fn parse_rate_counts_reports_as_written() {
        let mut rate = ParseRate::default();
        for (text, format) in [
            (FREEFORM, Some(Format::Freeform)),
            (SEMI, None),
            (STRUCTURED, None),
            (&STRUCTURED.replace("END_JSON_REPORT", "") as &str, Some(Format::StructuredSoft)),
        ] {
            rate.add(text, format);
        }
        assert_eq!((rate.reports, rate.parsed, rate.rendered, rate.render_parsed), (4, 3, 4, 4));
        assert_eq!(rate.parse_rate(), 0.75);
        assert_eq!(rate.render_parse_rate(), 1.0);
    }
}
