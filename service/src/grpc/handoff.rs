//! Hand-off reports on the wire: `pb` ↔ [`scd_engine::handoff`] and the
//! checks of the `Handoff` RPC and of `ContextRequest.report`.
//!
//! Strict like the rest of the surface: unknown enum values, a payload that
//! is not a JSON object, a multi-line answer and a request field named like
//! a report section are INVALID_ARGUMENT naming the field. A report that
//! does not parse is never an error: it is read as freeform and `why_not`
//! says why.

use scd_engine::context::Field;
use scd_engine::extract::ContextRequest;
use scd_engine::handoff::{self, confidence_value, Confidence, ConfidenceMap, Format, Parsed, Report, Status};
use serde_json::{Map, Value};

use super::pb;

fn invalid(field: &str, why: impl std::fmt::Display) -> tonic::Status {
    tonic::Status::invalid_argument(format!("{field}: {why}"))
}

/// A wire format; `None` for UNSPECIFIED.
pub fn format(field: &str, v: i32) -> Result<Option<Format>, tonic::Status> {
    match pb::ReportFormat::try_from(v).map_err(|_| invalid(field, format!("unknown value {v}")))? {
        pb::ReportFormat::Unspecified => Ok(None),
        pb::ReportFormat::Freeform => Ok(Some(Format::Freeform)),
        pb::ReportFormat::SemiStructured => Ok(Some(Format::SemiStructured)),
        pb::ReportFormat::StructuredSoft => Ok(Some(Format::StructuredSoft)),
    }
}

/// The wire value of a format.
pub fn format_pb(f: Format) -> pb::ReportFormat {
    match f {
        Format::Freeform => pb::ReportFormat::Freeform,
        Format::SemiStructured => pb::ReportFormat::SemiStructured,
        Format::StructuredSoft => pb::ReportFormat::StructuredSoft,
    }
}

fn status(field: &str, v: i32) -> Result<Option<Status>, tonic::Status> {
    Ok(match pb::ReportStatus::try_from(v).map_err(|_| invalid(field, format!("unknown value {v}")))? {
        pb::ReportStatus::Unspecified => None,
        pb::ReportStatus::NotStarted => Some(Status::NotStarted),
        pb::ReportStatus::InProgress => Some(Status::InProgress),
        pb::ReportStatus::Completed => Some(Status::Completed),
        pb::ReportStatus::Blocked => Some(Status::Blocked),
    })
}

fn confidence(field: &str, v: i32) -> Result<Option<Confidence>, tonic::Status> {
    Ok(match pb::ReportConfidence::try_from(v).map_err(|_| invalid(field, format!("unknown value {v}")))? {
        pb::ReportConfidence::Unspecified => None,
        pb::ReportConfidence::Low => Some(Confidence::Low),
        pb::ReportConfidence::Medium => Some(Confidence::Medium),
        pb::ReportConfidence::High => Some(Confidence::High),
    })
}

/// A report from the wire; `field` names it in errors.
pub fn report(field: &str, r: pb::HandoffReport) -> Result<Report, tonic::Status> {
    let payload: Map<String, Value> = if r.payload_json.trim().is_empty() {
        Map::new()
    } else {
        match serde_json::from_str::<Value>(&r.payload_json) {
            Ok(Value::Object(m)) => m,
            Ok(other) => {
                let found = match other {
                    Value::Null => "null",
                    Value::Bool(_) => "a boolean",
                    Value::Number(_) => "a number",
                    Value::String(_) => "a string",
                    Value::Array(_) => "an array",
                    Value::Object(_) => unreachable!("matched above"),
                };
                return Err(invalid(&format!("{field}.payload_json"), format!("must be a JSON object, found {found}")));
            }
            Err(e) => return Err(invalid(&format!("{field}.payload_json"), format!("not JSON: {e}"))),
        }
    };
    Ok(Report {
        status: status(&format!("{field}.status"), r.status)?,
        summary: r.summary,
        evidence: r.evidence,
        confidence: confidence(&format!("{field}.confidence"), r.confidence)?,
        next: r.next,
        answer_candidate: r.answer_candidate,
        payload,
    })
}

/// A report on the wire.
pub fn report_pb(r: &Report) -> pb::HandoffReport {
    pb::HandoffReport {
        status: match r.status {
            None => pb::ReportStatus::Unspecified,
            Some(Status::NotStarted) => pb::ReportStatus::NotStarted,
            Some(Status::InProgress) => pb::ReportStatus::InProgress,
            Some(Status::Completed) => pb::ReportStatus::Completed,
            Some(Status::Blocked) => pb::ReportStatus::Blocked,
        } as i32,
        summary: r.summary.clone(),
        evidence: r.evidence.clone(),
        confidence: match r.confidence {
            None => pb::ReportConfidence::Unspecified,
            Some(Confidence::Low) => pb::ReportConfidence::Low,
            Some(Confidence::Medium) => pb::ReportConfidence::Medium,
            Some(Confidence::High) => pb::ReportConfidence::High,
        } as i32,
        next: r.next.clone(),
        answer_candidate: r.answer_candidate.clone(),
        payload_json: if r.payload.is_empty() { String::new() } else { Value::Object(r.payload.clone()).to_string() },
    }
}

/// What parsing found, on the wire.
pub fn parsed_pb(p: &Parsed, map: &ConfidenceMap) -> pb::ParsedReport {
    pb::ParsedReport {
        format: format_pb(p.format) as i32,
        parsed: p.parsed,
        why_not: p.why_not.as_ref().map(ToString::to_string).unwrap_or_default(),
        report: Some(report_pb(&p.report)),
        answer: p.answer.clone(),
        current_confidence: p.report.confidence.map(|c| confidence_value(c, map)),
    }
}

/// Parses `text` as `format` (`None`: detect).
pub fn parse(text: &str, format: Option<Format>) -> Parsed {
    match format {
        Some(f) => handoff::parse(text, f),
        None => handoff::parse_auto(text),
    }
}

/// The answer line to render: one line (the scorer reads the line after
/// `Answer:`).
pub fn answer(field: &str, a: Option<String>) -> Result<Option<String>, tonic::Status> {
    if a.as_deref().is_some_and(|a| a.contains('\n')) {
        return Err(invalid(field, "must be one line (the scorer reads the line after Answer:)"));
    }
    Ok(a)
}

/// Adds a parsed report's sections to a request's fields (`compress.fields`
/// in errors); a field already named like a section is INVALID_ARGUMENT.
pub fn add_report_fields(fields: &mut Vec<Field>, report: &Report) -> Result<(), tonic::Status> {
    if let Some((i, f)) = fields.iter().enumerate().find(|(_, f)| f.name.starts_with(handoff::FIELD_PREFIX)) {
        return Err(invalid(
            &format!("compress.fields[{i}].name"),
            format!(
                "{} is reserved for the forwarded report's sections ({}*)",
                scd_engine::context::shown_name(&f.name),
                handoff::FIELD_PREFIX
            ),
        ));
    }
    fields.extend(handoff::to_fields(report));
    Ok(())
}

/// Fills an adaptive request from the receiver's own report (the core's
/// [`crate::app::more::apply_report`]).
pub fn apply_report(req: &mut ContextRequest, text: &str, map: &ConfidenceMap) -> Result<(), tonic::Status> {
    Ok(crate::app::more::apply_report(req, text, map)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn semi(confidence: &str, next: &str) -> String {
        format!(
            "[STATUS]\nin_progress\n[SUMMARY]\nfound the founding year\n[EVIDENCE_OR_TESTS]\n1844\n\
             [CONFIDENCE]\n{confidence}\n[NEXT]\n{next}\n[ANSWER_CANDIDATE]\nArthur's Magazine\n"
        )
    }

    fn request() -> ContextRequest {
        ContextRequest {
            session_id: "s".into(),
            session_token: "t".into(),
            caller: None,
            scope: None,
            specific_question: String::new(),
            current_confidence: 0.0,
            reasoning: String::new(),
            chunk_ids: vec![],
            max_tokens: None,
            request_id: None,
        }
    }

    #[test]
    fn a_report_sets_confidence_question_and_reasoning_through_the_map() {
        let map = ConfidenceMap { low: 0.1, medium: 0.45, high: 0.95 };
        let mut r = request();
        apply_report(&mut r, &semi("medium", "when was First for Women founded?"), &map).unwrap();
        assert_eq!(r.current_confidence, 0.45);
        assert_eq!(r.specific_question, "when was First for Women founded?");
        assert_eq!(r.reasoning, "found the founding year");
        // an explicit question wins over the report's next step
        let mut r = request();
        r.specific_question = "mine".into();
        apply_report(&mut r, &semi("low", "theirs"), &map).unwrap();
        assert_eq!((r.current_confidence, r.specific_question.as_str()), (0.1, "mine"));
    }

    #[test]
    fn a_report_without_confidence_or_with_a_confidence_number_is_refused() {
        let map = ConfidenceMap::default();
        let e = apply_report(&mut request(), "just some notes\nAnswer: x", &map).unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
        assert!(e.message().starts_with("report: states no confidence (read as freeform"), "{}", e.message());
        // a broken structured report says why it did not parse
        let e = apply_report(&mut request(), "JSON_REPORT:\n{\"status\": 1}\n", &map).unwrap_err();
        assert!(e.message().contains("missing END_JSON_REPORT"), "{}", e.message());
        let mut r = request();
        r.current_confidence = 0.2;
        let e = apply_report(&mut r, &semi("high", "x"), &map).unwrap_err();
        assert!(e.message().starts_with("current_confidence: 0.2 given with a report"), "{}", e.message());
    }

    #[test]
    fn wire_reports_round_trip_and_bad_ones_name_the_field() {
        let p = handoff::parse(&semi("high", "answer"), Format::SemiStructured);
        assert!(p.parsed);
        let back = report("render.report", report_pb(&p.report)).unwrap();
        assert_eq!(back, p.report);
        let bad = pb::HandoffReport { payload_json: "[1]".into(), ..Default::default() };
        let e = report("render.report", bad).unwrap_err();
        assert_eq!(e.message(), "render.report.payload_json: must be a JSON object, found an array");
        let bad = pb::HandoffReport { payload_json: "{".into(), ..Default::default() };
        assert!(report("r", bad).unwrap_err().message().starts_with("r.payload_json: not JSON"));
        let bad = pb::HandoffReport { status: 9, ..Default::default() };
        assert_eq!(report("r", bad).unwrap_err().message(), "r.status: unknown value 9");
        let bad = pb::HandoffReport { confidence: -1, ..Default::default() };
        assert_eq!(report("r", bad).unwrap_err().message(), "r.confidence: unknown value -1");
        assert_eq!(format("f", 7).unwrap_err().message(), "f: unknown value 7");
        assert!(answer("a", Some("two\nlines".into())).is_err());
    }

    #[test]
    fn request_fields_may_not_take_a_section_name() {
        let mut fields = vec![Field {
            name: "report.summary".into(),
            kind: scd_engine::context::FieldKind::Prose,
            content: "spoof".into(),
            confidential: false,
        }];
        let e = add_report_fields(&mut fields, &Report::default()).unwrap_err();
        assert!(e.message().starts_with("compress.fields[0].name: \"report.summary\" is reserved"), "{}", e.message());
    }
}
