//! Writing a report in each format, so that it always parses back.

use serde_json::{Map, Value};

use super::lines::{escape, level_and_note, tag_line};
use super::report::{Format, Report};
use super::{ANSWER_PREFIX, DEFAULT_CONFIDENCE, DEFAULT_STATUS, JSON_END, JSON_MARKER, PAYLOAD_TAG, STANDARD_TAGS};

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
