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

mod fields;
mod lines;
mod rate;
mod read;
mod report;
mod write;

pub use self::fields::{envelope, from_fields, render_selection, to_fields, FIELD_PREFIX};
pub use self::rate::ParseRate;
pub use self::read::{parse, parse_auto};
pub use self::report::{confidence_value, Confidence, ConfidenceMap, Format, NotParsed, Parsed, Report, Status};
pub use self::write::render;

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

#[cfg(test)]
mod tests;
