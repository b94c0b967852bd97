//! Reading a report in each format; a report that does not parse degrades
//! to freeform with the reason.

use std::collections::HashSet;

use serde_json::{Map, Value};

use super::lines::{echo, find_line_start, level_and_note, non_empty, tag_line, unescape};
use super::report::{Confidence, Format, NotParsed, Parsed, Report, Status};
use super::{ANSWER_PREFIX, JSON_END, JSON_KEYS, JSON_MARKER, PAYLOAD_TAG, STANDARD_TAGS};

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

/// The text before the last line starting with `Answer:`, and that line's
/// text after the colon (one space and a `\r` ending dropped).
pub(super) fn split_answer(text: &str) -> (&str, Option<&str>) {
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

pub(super) fn freeform(body: &str) -> Report {
    Report { summary: non_empty(body.trim().to_string()), ..Report::default() }
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
