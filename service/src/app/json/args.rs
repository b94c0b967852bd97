//! The JSON API's arguments of a compression and of a follow-up ([`Args`]:
//! as sent, then parsed strictly), which REST's bodies and MCP's tools
//! both are. Each doc comment's first paragraph is what a model reads in
//! MCP's `tools/list`; the rest is for rustdoc and the REST API's OpenAPI
//! document.

use std::borrow::Cow;
use std::marker::PhantomData;

use scd_engine::context::Context;
use schemars::{JsonSchema, Schema, SchemaGenerator};
use serde::{Deserialize, Deserializer};
use serde_json::{Map, Value};

/// Tool arguments as sent, described by `T`'s JSON schema and parsed into a
/// `T` by [`Args::parse`], so that a bad argument is a tool error naming it
/// rather than a protocol error.
pub struct Args<T>(pub(crate) Map<String, Value>, pub(crate) PhantomData<fn() -> T>);

impl<'de, T> Deserialize<'de> for Args<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Map::deserialize(d).map(|m| Args(m, PhantomData))
    }
}

impl<T: JsonSchema> JsonSchema for Args<T> {
    fn schema_name() -> Cow<'static, str> {
        T::schema_name()
    }

    fn json_schema(generator: &mut SchemaGenerator) -> Schema {
        T::json_schema(generator)
    }
}

impl<T> Args<T> {
    /// Arguments from a JSON object (a REST body).
    pub fn from_map(map: Map<String, Value>) -> Self {
        Args(map, PhantomData)
    }
}

impl<T: serde::de::DeserializeOwned> Args<T> {
    /// The arguments, parsed strictly; the error names the argument's path.
    pub fn parse(self) -> Result<T, String> {
        serde_path_to_error::deserialize(Value::Object(self.0)).map_err(|e| {
            let path = crate::input::shown_path(e.path());
            // never echo a value: it may be a confidential field's content
            let message = crate::input::redact_json_error(&e.into_inner().to_string());
            if path == "." || path == "?" {
                format!("arguments: {message}")
            } else {
                format!("{path}: {message}")
            }
        })
    }
}

/// A context argument: `{"fields": [...]}` exactly as `scd compress
/// --context` reads it (the engine's [`Context`], strict).
#[derive(Debug, Deserialize)]
#[serde(transparent)]
pub struct ContextArg(pub Context);

impl JsonSchema for ContextArg {
    fn schema_name() -> Cow<'static, str> {
        "Context".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        schemars::json_schema!({
            "type": "object",
            "description": "Named fields.\n\nConfidential fields are used for nothing and never sent back.",
            "properties": {
                "fields": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {
                            "name": {"type": "string", "description": "Unique, non-empty."},
                            "kind": {
                                "type": "string",
                                "enum": ["prose", "code", "log", "json", "chat", "table", "markdown"],
                                "default": "prose",
                                "description": "How it is chunked."
                            },
                            "content": {"type": "string"},
                            "confidential": {"type": "boolean", "default": false, "description": "Never sent, never quoted."}
                        },
                        "required": ["name", "content"],
                        "additionalProperties": false
                    }
                }
            },
            "required": ["fields"],
            "additionalProperties": false
        })
    }
}

/// The hand-off report format of `compress_context.render`.
#[derive(Debug, Clone, Copy, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum RenderFormat {
    /// Prose with an `Answer:` line.
    Freeform,
    /// `[STATUS]`, `[SUMMARY]`, ... sections.
    SemiStructured,
    /// A `JSON_REPORT:` block.
    StructuredSoft,
}

/// Arguments of `compress_context`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CompressContextArgs {
    /// What the receiver must do.
    pub task: String,
    /// Named fields.
    ///
    /// `{"fields": [{"name", "kind", "content", "confidential"}]}`.
    pub context: ContextArg,
    /// Most tokens sent, in budget_tokenizer (or give rate).
    ///
    /// A hard limit, at least 1: the text handed over counts within it.
    #[schemars(range(min = 1))]
    pub budget: Option<u64>,
    /// Instead of budget: the share of the context to keep.
    ///
    /// In (0, 1], LLMLingua's `rate`: the budget is the shareable context's
    /// tokens in `budget_tokenizer` times `rate`, rounded down, at least 1.
    #[schemars(extend("exclusiveMinimum" = 0, "maximum" = 1))]
    pub rate: Option<f64>,
    /// Fields sent whole, first.
    #[serde(default)]
    pub required: Vec<String>,
    /// Fields that fill the rest by relevance.
    ///
    /// None named and none required: all fields.
    #[serde(default)]
    pub optional: Vec<String>,
    /// Continue this session, or open one under this id.
    ///
    /// A session opened by this server continues; unset opens one under a
    /// random id. `request_more_context` names it.
    pub session: Option<String>,
    /// Cosine threshold in [-1, 1].
    pub threshold: Option<f32>,
    /// Threshold in standard deviations of the context's scores.
    ///
    /// Calibrated per context: chunks scoring less are dropped.
    pub min_relative_score: Option<f32>,
    /// Render as a hand-off report in this format.
    ///
    /// The report is `text`, within the budget.
    pub render: Option<RenderFormat>,
    /// o200k, cl100k, e5 (default) or a registered name.
    ///
    /// The receiver's tokenizer: what is sent never counts more than the
    /// budget in it.
    pub budget_tokenizer: Option<String>,
    /// Say why each chunk was sent or dropped.
    ///
    /// Score parts, packing order and group lead of each chunk sent, the
    /// reason of the 50 best dropped (`explanation`, in the structured
    /// result only).
    #[serde(default)]
    pub explain: bool,
    /// Tokens of budget held back for request_more_context.
    ///
    /// When this call opens the session, this answer sends at most `budget -
    /// reserve`; the session's total is `budget`.
    pub reserve: Option<u32>,
    /// List the chunks held back.
    ///
    /// Id, field, stub and tokens of at most 100, best first, in the
    /// structured result; by default only their count and tokens.
    #[serde(default)]
    pub list_dropped: bool,
}

/// Arguments of `request_more_context`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RequestMoreArgs {
    /// compress_context's session_id.
    pub session: String,
    /// What the receiver still needs to know.
    ///
    /// With `report` and no question: the report's next step.
    #[serde(default)]
    pub question: String,
    /// Confidence in [0, 1] (or give report).
    pub current_confidence: Option<f32>,
    /// Chunks asked for by id.
    ///
    /// Ids from the `dropped` list of compress_context.
    #[serde(default)]
    pub chunk_ids: Vec<String>,
    /// Why more is needed.
    #[serde(default)]
    pub reasoning: String,
    /// A hand-off report, any format.
    ///
    /// Its confidence sets `current_confidence`, its next step the question
    /// when none is given.
    pub report: Option<String>,
    /// This reply's budget in tokens.
    ///
    /// Default: the budget of the compress_context that opened the session.
    #[schemars(range(min = 1))]
    pub max_tokens: Option<u32>,
}
