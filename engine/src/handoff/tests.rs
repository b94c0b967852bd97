//! The report formats: parsing, rendering, round trips and parse rates.

use rand::{Rng, SeedableRng};
use serde_json::{json, Map};

use super::read::{freeform, split_answer};
use super::*;
use crate::context::FieldKind;

const FREEFORM: &str = include_str!("../../../fixtures/handoff/freeform.txt");
const SEMI: &str = include_str!("../../../fixtures/handoff/semi_structured.txt");
const STRUCTURED: &str = include_str!("../../../fixtures/handoff/structured_soft.txt");
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
    assert_eq!(why.to_string(), "bad status value \"done\" (expected not_started, in_progress, completed or blocked)");
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
    let text = json_report(&format!("{{{GOOD}, \"payload\": {{\"note\": \"see END_JSON_REPORT\"}}, \"extra\": 1}}"));
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
    for answer in
        ["  two\tspaces \u{a0}", "日本語 \u{1f600}", "", "Answer: nested", "[STATUS]", "x\u{200b}", "ends in CR\r\r"]
    {
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
