//! # scd-context
//!
//! The problem SCD solves (paper §6.2), as one set of types that the engine,
//! the service and the ATP stack all use: an agent's [`Context`] of named
//! [`Field`]s, the [`Task`] handed over (with the one [`Task::text`] that
//! is embedded as e_task), and the receiver's [`ContextRequirement`].
//!
//! Dependency-free on purpose (serde, serde_json and thiserror only): the ATP stack
//! uses these types without depending on the engine. Parsing is strict and
//! every limit is checked before any work is done; `Debug` prints the size
//! of content, never the content.
//!
//! ```
//! use scd_context::{Context, ContextLimits, Task};
//!
//! let ctx = Context::from_json(r#"{"fields": [{"name": "logs", "kind": "log", "content": "E1 timeout"}]}"#).unwrap();
//! ctx.validate_within(&ContextLimits::default()).unwrap();
//! assert_eq!(format!("{:?}", ctx.fields[0]).contains("timeout"), false);
//! let err = Context::from_json(r#"{"fields": [{"name": "x", "content": "", "confidental": true}]}"#).unwrap_err();
//! assert!(err.to_string().starts_with("context.fields[0].confidental: unknown field"), "{err}");
//! let mut task = Task::new("Fix the login test");
//! task.constraints.push("no new dependencies".into());
//! assert_eq!(task.text(), "Fix the login test\nConstraint: no new dependencies");
//! ```
#![warn(missing_docs)]

mod json;

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

pub use json::{check_unique_keys, shown_key, shown_name, MAX_ECHOED_KEY_BYTES, MAX_ECHOED_NAME_BYTES};

/// Why a context, task or requirement is refused. Messages name the field
/// and the limit, never the content.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A field is missing, malformed or over a limit.
    #[error("{field}: {message}")]
    InvalidArgument {
        /// The field, e.g. `context.fields[2].content`.
        field: Param,
        /// What is wrong, with the limit.
        message: String,
    },
    /// A context file could not be read.
    #[error("cannot read context file {}: {source}", .path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

impl Error {
    /// An [`Error::InvalidArgument`].
    pub fn invalid(field: impl Into<Param>, message: impl Into<String>) -> Self {
        Self::InvalidArgument { field: field.into(), message: message.into() }
    }
}

/// The request parameter an invalid-argument error names (here and in
/// `scd-engine`). Its `Display` is the wire name, the one gRPC and the
/// engine's messages use; [`Param::json_name`] is the JSON API's (REST,
/// MCP, A2A) name for the same parameter. A parameter both name alike is
/// [`Param::Other`], with its path (`chunk_ids[3]`, `context.fields[2].name`).
///
/// ```
/// use scd_context::Param;
/// assert_eq!(Param::MaxContextTokens.to_string(), "max_context_tokens");
/// assert_eq!(Param::MaxContextTokens.json_name(), "budget");
/// assert_eq!(Param::from("chunk_ids[3]").json_name(), "chunk_ids[3]");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Param {
    /// `max_context_tokens` (JSON: `budget`).
    MaxContextTokens,
    /// `required_fields` (JSON: `required`).
    RequiredFields,
    /// `optional_fields` (JSON: `optional`).
    OptionalFields,
    /// `relevance_threshold` (JSON: `threshold`).
    RelevanceThreshold,
    /// `task.description` (JSON: `task`).
    TaskDescription,
    /// `specific_question` (JSON: `question`).
    SpecificQuestion,
    /// `session_id` (JSON: `session`).
    SessionId,
    /// `reserve_tokens` (JSON: `reserve`).
    ReserveTokens,
    /// A parameter named alike on every surface, by its path.
    Other(String),
}

impl Param {
    /// Every parameter the surfaces name differently (all but [`Param::Other`]).
    pub const NAMED: [Param; 8] = [
        Param::MaxContextTokens,
        Param::RequiredFields,
        Param::OptionalFields,
        Param::RelevanceThreshold,
        Param::TaskDescription,
        Param::SpecificQuestion,
        Param::SessionId,
        Param::ReserveTokens,
    ];

    /// The parameter a wire name names (a gRPC status's metadata, for
    /// `scd mcp --server`): one of [`Param::NAMED`], else [`Param::Other`].
    pub fn from_wire(name: &str) -> Param {
        Param::NAMED.into_iter().find(|p| p.wire_name() == name).unwrap_or_else(|| Param::from(name))
    }

    /// The wire name (gRPC's and the engine's).
    pub fn wire_name(&self) -> &str {
        match self {
            Param::MaxContextTokens => "max_context_tokens",
            Param::RequiredFields => "required_fields",
            Param::OptionalFields => "optional_fields",
            Param::RelevanceThreshold => "relevance_threshold",
            Param::TaskDescription => "task.description",
            Param::SpecificQuestion => "specific_question",
            Param::SessionId => "session_id",
            Param::ReserveTokens => "reserve_tokens",
            Param::Other(path) => path,
        }
    }

    /// The JSON API's name (REST bodies, MCP tool arguments, A2A data parts).
    pub fn json_name(&self) -> &str {
        match self {
            Param::MaxContextTokens => "budget",
            Param::RequiredFields => "required",
            Param::OptionalFields => "optional",
            Param::RelevanceThreshold => "threshold",
            Param::TaskDescription => "task",
            Param::SpecificQuestion => "question",
            Param::SessionId => "session",
            Param::ReserveTokens => "reserve",
            Param::Other(path) => path,
        }
    }
}

impl std::fmt::Display for Param {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.wire_name())
    }
}

/// A parameter named alike on every surface ([`Param::Other`]).
impl From<&str> for Param {
    fn from(path: &str) -> Param {
        Param::Other(path.to_string())
    }
}

/// A parameter named alike on every surface ([`Param::Other`]).
impl From<String> for Param {
    fn from(path: String) -> Param {
        Param::Other(path)
    }
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What kind of text a field holds; it decides how the field is chunked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FieldKind {
    /// Sentences and paragraphs (with optional `#` headings).
    #[default]
    Prose,
    /// Source code: chunked by top-level blocks/functions.
    Code,
    /// Log lines: grouped around errors with their stack frames.
    Log,
    /// A JSON document: chunked by key paths.
    Json,
    /// A conversation, one `speaker: text` turn per line; a question keeps its answer.
    Chat,
    /// Schemas and tables: chunked by table.
    Table,
    /// Markdown: headings lead their sections; fenced code, list items and
    /// tables stay whole.
    Markdown,
}

impl FieldKind {
    /// Every kind, in wire order.
    pub const ALL: [FieldKind; 7] = [
        FieldKind::Prose,
        FieldKind::Code,
        FieldKind::Log,
        FieldKind::Json,
        FieldKind::Chat,
        FieldKind::Table,
        FieldKind::Markdown,
    ];

    /// The lowercase word of context files (`"prose"`, `"code"`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            FieldKind::Prose => "prose",
            FieldKind::Code => "code",
            FieldKind::Log => "log",
            FieldKind::Json => "json",
            FieldKind::Chat => "chat",
            FieldKind::Table => "table",
            FieldKind::Markdown => "markdown",
        }
    }
}

/// One named piece of an agent's context (`db_schema`, `error_logs`, ...).
///
/// Parsed strictly: an unknown key (`"confidental"`) or a `confidential`
/// that is not a boolean is an error, never a silent default. `Debug`
/// prints the content's size, never the content.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Field {
    /// Unique name within the context.
    pub name: String,
    /// How to chunk it.
    #[serde(default)]
    pub kind: FieldKind,
    /// The text.
    pub content: String,
    /// Confidential fields never leave: not in chunks, stubs, logs or errors.
    #[serde(default)]
    pub confidential: bool,
}

impl std::fmt::Debug for Field {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Field")
            .field("name", &self.name)
            .field("kind", &self.kind)
            .field("confidential", &self.confidential)
            .field("content", &Redacted(self.content.len()))
            .finish()
    }
}

/// Stands in for text in `Debug` output: `<N bytes>`.
pub struct Redacted(pub usize);

impl std::fmt::Debug for Redacted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "<{} bytes>", self.0)
    }
}

/// An agent's whole context: `{"fields": [...]}`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Context {
    /// The fields, in reading order.
    pub fields: Vec<Field>,
}

/// The context's JSON shape, as errors name it.
pub const CONTEXT_SHAPE: &str = r#"{"fields": [{"name", "kind", "content", "confidential"}]}"#;

/// Size limits on one context, checked before any work is done.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ContextLimits {
    /// Fields per context.
    pub max_fields: usize,
    /// Bytes of one field's content.
    pub max_field_bytes: usize,
    /// Bytes of all contents together.
    pub max_context_bytes: usize,
}

/// Longest field name in bytes (a name labels every chunk of its field).
pub const MAX_FIELD_NAME_BYTES: usize = 256;

impl Default for ContextLimits {
    fn default() -> Self {
        Self { max_fields: 100_000, max_field_bytes: 4 << 20, max_context_bytes: 16 << 20 }
    }
}

/// `Err` naming `field` and the offset when `text` holds a NUL byte: NUL in
/// text is binary data sent by mistake, and is refused rather than guessed at.
pub fn check_no_nul<P: Into<Param>>(field: impl Fn() -> P, text: &str) -> Result<()> {
    match text.bytes().position(|b| b == 0) {
        Some(at) => Err(Error::invalid(field(), format!("contains a NUL byte at offset {at}"))),
        None => Ok(()),
    }
}

impl Context {
    /// Parses `{"fields": [...]}` strictly: unknown keys and wrongly typed
    /// values are errors naming their path (`fields[2].confidential`).
    pub fn from_json(json: &str) -> Result<Self> {
        let mut de = serde_json::Deserializer::from_str(json);
        let ctx: Self = serde_path_to_error::deserialize(&mut de).map_err(|e| {
            if let Some(hint) = Self::common_mistake(json) {
                return Error::invalid("context", hint);
            }
            let path = e.path().to_string();
            let field = if path == "." || path == "?" { "context".to_string() } else { format!("context.{path}") };
            Error::invalid(field, e.into_inner().to_string())
        })?;
        // one JSON document, nothing after it
        de.end().map_err(|e| Error::invalid("context", e.to_string()))?;
        Ok(ctx)
    }

    /// What is wrong with a context that did not parse, when it is one of
    /// the common mistakes: a bare array of fields, a JSON string holding
    /// the context, or a text that is not JSON at all (a raw file). The
    /// message says what to send instead and never quotes the input.
    pub fn common_mistake(json: &str) -> Option<String> {
        match serde_json::from_str::<serde_json::Value>(json) {
            Ok(v) => Self::mistaken_shape(&v),
            Err(_) if !json.trim_start().starts_with(['{', '[', '"']) => Some(format!(
                "not JSON (a raw text file?); build a context from files with `scd context FILE...` or \
                 `scd compress --files FILE...`, or send {CONTEXT_SHAPE}"
            )),
            Err(_) => None,
        }
    }

    /// [`Context::common_mistake`] for a context already parsed as JSON (a
    /// tool's or a message's argument): a bare array of fields or a string.
    pub fn mistaken_shape(v: &serde_json::Value) -> Option<String> {
        match v {
            serde_json::Value::Array(items) if items.iter().all(serde_json::Value::is_object) => Some(format!(
                "a bare array of {} fields; wrap it as {{\"fields\": [...]}}, the shape {CONTEXT_SHAPE}",
                items.len()
            )),
            serde_json::Value::String(_) => {
                Some(format!("a JSON string; send the context object itself, {CONTEXT_SHAPE}, not a string holding it"))
            }
            _ => None,
        }
    }

    /// Reads and parses a context file; errors name the path.
    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|source| Error::Read { path: path.to_path_buf(), source })?;
        Self::from_json(&text).map_err(|e| match e {
            Error::InvalidArgument { field, message } => {
                Error::invalid(format!("context file {}: {field}", path.display()), message)
            }
            other => other,
        })
    }

    /// Checks names are non-empty and unique, and that no text holds a NUL
    /// byte or goes over `limits`.
    pub fn validate_within(&self, limits: &ContextLimits) -> Result<()> {
        if self.fields.len() > limits.max_fields {
            return Err(Error::invalid(
                "context.fields",
                format!("{} fields, over the limit {}", self.fields.len(), limits.max_fields),
            ));
        }
        let mut total = 0usize;
        for (i, f) in self.fields.iter().enumerate() {
            if f.content.len() > limits.max_field_bytes {
                return Err(Error::invalid(
                    format!("context.fields[{i}].content"),
                    format!("{} bytes, over the limit {}", f.content.len(), limits.max_field_bytes),
                ));
            }
            if f.name.len() > MAX_FIELD_NAME_BYTES {
                return Err(Error::invalid(
                    format!("context.fields[{i}].name"),
                    format!("{} bytes, over the limit {MAX_FIELD_NAME_BYTES}", f.name.len()),
                ));
            }
            total += f.content.len();
            check_no_nul(|| format!("context.fields[{i}].name"), &f.name)?;
            check_no_nul(|| format!("context.fields[{i}].content"), &f.content)?;
        }
        if total > limits.max_context_bytes {
            return Err(Error::invalid(
                "context",
                format!("{total} bytes of content, over the limit {}", limits.max_context_bytes),
            ));
        }
        self.validate()
    }

    /// Checks names are non-empty and unique.
    pub fn validate(&self) -> Result<()> {
        let mut seen = std::collections::HashSet::new();
        for (i, f) in self.fields.iter().enumerate() {
            if f.name.trim().is_empty() {
                return Err(Error::invalid(format!("context.fields[{i}].name"), "must not be empty"));
            }
            if !seen.insert(f.name.as_str()) {
                return Err(Error::invalid(
                    format!("context.fields[{i}].name"),
                    format!("duplicate field name {}", json::shown_name(&f.name)),
                ));
            }
        }
        Ok(())
    }
}

/// The task handed to the receiver (paper step 1). `Debug` prints sizes,
/// never the text.
#[derive(Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Task {
    /// What to do.
    pub description: String,
    /// Constraints on the work.
    #[serde(default)]
    pub constraints: Vec<String>,
    /// Expected output schema, if any.
    #[serde(default)]
    pub output_schema: Option<String>,
}

impl std::fmt::Debug for Task {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Task")
            .field("description", &Redacted(self.description.len()))
            .field("constraints", &self.constraints.len())
            .field("output_schema", &self.output_schema.as_ref().map(|s| Redacted(s.len())))
            .finish()
    }
}

impl Task {
    /// A task with only a description.
    pub fn new(description: impl Into<String>) -> Self {
        Self { description: description.into(), ..Self::default() }
    }

    /// Checks the task is non-empty, within `max_bytes` (all its text) and
    /// `max_constraints`, and free of NUL bytes.
    pub fn validate(&self, max_bytes: usize, max_constraints: usize) -> Result<()> {
        if self.description.trim().is_empty() {
            return Err(Error::invalid(Param::TaskDescription, "must not be empty"));
        }
        if self.constraints.len() > max_constraints {
            return Err(Error::invalid(
                "task.constraints",
                format!("{} constraints, over the limit {max_constraints}", self.constraints.len()),
            ));
        }
        let bytes = self.description.len()
            + self.constraints.iter().map(String::len).sum::<usize>()
            + self.output_schema.as_ref().map_or(0, String::len);
        if bytes > max_bytes {
            return Err(Error::invalid("task", format!("{bytes} bytes, over the limit {max_bytes}")));
        }
        check_no_nul(|| Param::TaskDescription, &self.description)?;
        for (i, c) in self.constraints.iter().enumerate() {
            check_no_nul(|| format!("task.constraints[{i}]"), c)?;
        }
        if let Some(schema) = &self.output_schema {
            check_no_nul(|| "task.output_schema", schema)?;
        }
        Ok(())
    }

    /// The text embedded as e_task (paper: Encode(task_description,
    /// constraints, expected_output_schema)): the trimmed description, then
    /// one `"\nConstraint: …"` per constraint and `"\nOutput: …"` for a
    /// non-empty schema. The engine, the service and ATP all build it here.
    pub fn text(&self) -> String {
        let mut s = self.description.trim().to_string();
        for c in &self.constraints {
            s.push_str("\nConstraint: ");
            s.push_str(c.trim());
        }
        if let Some(schema) = self.schema() {
            s.push_str("\nOutput: ");
            s.push_str(schema.trim());
        }
        s
    }

    /// The schema as the wire carries it: an empty one is no schema.
    pub fn schema(&self) -> Option<&str> {
        self.output_schema.as_deref().filter(|s| !s.is_empty())
    }
}

/// What the receiver asks for (paper step 2).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ContextRequirement {
    /// Fields sent whole, first; if they do not fit the budget the request fails.
    #[serde(default)]
    pub required_fields: Vec<String>,
    /// Fields that fill what is left, by relevance. Empty with no required
    /// fields means every field is optional.
    #[serde(default)]
    pub optional_fields: Vec<String>,
    /// The receiver's budget in its tokenizer's tokens: a hard limit.
    pub max_context_tokens: usize,
    /// Paper's absolute cosine threshold: chunks below it are never sent.
    #[serde(default)]
    pub relevance_threshold: Option<f32>,
    /// Calibrated threshold: chunks whose fused score is below this many
    /// standard deviations from the context's mean are not sent.
    #[serde(default)]
    pub min_relative_score: Option<f32>,
}

impl ContextRequirement {
    /// Every field optional, `budget` tokens.
    pub fn with_budget(budget: usize) -> Self {
        Self {
            required_fields: Vec::new(),
            optional_fields: Vec::new(),
            max_context_tokens: budget,
            relevance_threshold: None,
            min_relative_score: None,
        }
    }

    /// Checks the numbers (the named fields are checked against the context
    /// when it is split into public and confidential fields).
    pub fn validate(&self, max_budget: usize) -> Result<()> {
        if self.max_context_tokens == 0 {
            return Err(Error::invalid(Param::MaxContextTokens, "must be at least 1"));
        }
        if self.max_context_tokens > max_budget {
            return Err(Error::invalid(
                Param::MaxContextTokens,
                format!("{} is over the limit {max_budget}", self.max_context_tokens),
            ));
        }
        if let Some(t) = self.relevance_threshold {
            if !t.is_finite() || !(-1.0..=1.0).contains(&t) {
                return Err(Error::invalid(Param::RelevanceThreshold, format!("must be a cosine in [-1, 1], got {t}")));
            }
        }
        if let Some(t) = self.min_relative_score {
            if !t.is_finite() {
                return Err(Error::invalid("min_relative_score", "must be finite"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_parameter_reads_back_from_its_wire_name() {
        let named = [
            Param::MaxContextTokens,
            Param::RequiredFields,
            Param::OptionalFields,
            Param::RelevanceThreshold,
            Param::TaskDescription,
            Param::SpecificQuestion,
            Param::SessionId,
            Param::ReserveTokens,
            Param::from("chunk_ids[3]"),
        ];
        for p in named {
            assert_eq!(Param::from_wire(p.wire_name()), p);
        }
        assert_eq!(Param::from_wire("session_idx"), Param::from("session_idx"));
        assert_eq!(Param::from_wire("max_context_tokens").json_name(), "budget");
    }

    #[test]
    fn task_text_is_one_rule_and_an_empty_schema_is_no_schema() {
        let t = Task {
            description: "  Fix the bug ".into(),
            constraints: vec![" no new deps".into()],
            output_schema: Some(" {\"patch\": string} ".into()),
        };
        assert_eq!(t.text(), "Fix the bug\nConstraint: no new deps\nOutput: {\"patch\": string}");
        // the wire has no "empty but present" schema, so neither has the text
        let empty = Task { output_schema: Some(String::new()), ..Task::new("x") };
        assert_eq!((empty.text().as_str(), empty.schema()), ("x", None));
        assert!(!format!("{:?}", Task::new("secret plan")).contains("secret"));
    }

    #[test]
    fn the_common_mistakes_get_an_error_saying_what_to_send_and_never_the_input() {
        let bare = r#"[{"name": "a", "content": "SECRET-1"}, {"name": "b", "content": "x"}]"#;
        let e = Context::from_json(bare).unwrap_err().to_string();
        assert!(e.starts_with("context: a bare array of 2 fields; wrap it as {\"fields\": [...]}"), "{e}");
        let string = serde_json::to_string(r#"{"fields": [{"name": "a", "content": "SECRET-2"}]}"#).unwrap();
        let e = Context::from_json(&string).unwrap_err().to_string();
        assert!(e.starts_with("context: a JSON string; send the context object itself"), "{e}");
        let e = Context::from_json("SECRET-3 is the password\nand more text").unwrap_err().to_string();
        assert!(e.starts_with("context: not JSON (a raw text file?)") && e.contains("scd context FILE"), "{e}");
        for e in [bare, &string] {
            assert!(!Context::from_json(e).unwrap_err().to_string().contains("SECRET"));
        }
        // other errors still name the path
        let e = Context::from_json(r#"{"fields": [{"name": "a", "content": 3}]}"#).unwrap_err().to_string();
        assert!(e.starts_with("context.fields[0].content: invalid type"), "{e}");
    }

    #[test]
    fn a_context_file_is_read_strictly_and_errors_name_the_file() {
        let dir = std::env::temp_dir().join(format!("scd_context_{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let good = dir.join("good.json");
        std::fs::write(&good, r#"{"fields": [{"name": "a", "kind": "code", "content": "fn f() {}"}]}"#).unwrap();
        assert_eq!(Context::load(&good).unwrap().fields[0].kind, FieldKind::Code);
        let trailing = dir.join("trailing.json");
        std::fs::write(&trailing, r#"{"fields": []} {"fields": []}"#).unwrap();
        let err = Context::load(&trailing).unwrap_err().to_string();
        assert!(err.starts_with(&format!("context file {}: context:", trailing.display())), "{err}");
        let missing = dir.join("missing.json");
        let err = Context::load(&missing).unwrap_err().to_string();
        assert!(err.starts_with(&format!("cannot read context file {}", missing.display())), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
