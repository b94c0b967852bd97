//! A report as context fields and back, and a compressed selection
//! rendered as a report.

use serde_json::Value;

use super::lines::non_empty;
use super::report::{Confidence, Format, Report, Status};
use super::write::render;
use crate::context::{Field, FieldKind, MAX_FIELD_NAME_BYTES};
use crate::extract::{CompressRequest, Compressed, Envelope, SelectedChunk};

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
