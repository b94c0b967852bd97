//! The report and its parts: formats, status and confidence levels, why a
//! report did not parse, and the outcome of a parse.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::lines::{find_line_start, tag_line};
use super::{JSON_MARKER, STANDARD_TAGS};
use crate::{Error, Result};

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

    pub(super) fn from_name(s: &str) -> Option<Self> {
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

    pub(super) fn from_name(s: &str) -> Option<Self> {
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

/// The outcome of [`parse`](super::parse).
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
