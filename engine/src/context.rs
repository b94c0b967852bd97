//! The problem SCD solves (paper §6.2): an agent's context, the task handed
//! over, and what the receiver can take.

use serde::{Deserialize, Serialize};

use crate::{Error, Result};

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
}

/// One named piece of an agent's context (`db_schema`, `error_logs`, ...).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
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

/// An agent's whole context: `{"fields": [...]}`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Context {
    /// The fields, in reading order.
    pub fields: Vec<Field>,
}

impl Context {
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
                    format!("duplicate field name {:?}", f.name),
                ));
            }
        }
        Ok(())
    }
}

/// The task handed to the receiver (paper step 1).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
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

impl Task {
    /// A task with only a description.
    pub fn new(description: impl Into<String>) -> Self {
        Self { description: description.into(), ..Self::default() }
    }

    /// The text embedded as `e_task`: description, constraints, schema.
    pub fn text(&self) -> String {
        let mut s = self.description.trim().to_string();
        for c in &self.constraints {
            s.push_str("\nConstraint: ");
            s.push_str(c.trim());
        }
        if let Some(schema) = &self.output_schema {
            s.push_str("\nOutput: ");
            s.push_str(schema.trim());
        }
        s
    }
}

/// What the receiver asks for (paper step 2).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
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

    /// Checks the numbers and that every named field exists in `ctx`.
    pub fn validate(&self, ctx: &Context, max_budget: usize) -> Result<()> {
        if self.max_context_tokens == 0 {
            return Err(Error::invalid("max_context_tokens", "must be at least 1"));
        }
        if self.max_context_tokens > max_budget {
            return Err(Error::invalid(
                "max_context_tokens",
                format!("{} is over the limit {max_budget}", self.max_context_tokens),
            ));
        }
        if let Some(t) = self.relevance_threshold {
            if !t.is_finite() || !(-1.0..=1.0).contains(&t) {
                return Err(Error::invalid("relevance_threshold", format!("must be a cosine in [-1, 1], got {t}")));
            }
        }
        if let Some(t) = self.min_relative_score {
            if !t.is_finite() {
                return Err(Error::invalid("min_relative_score", "must be finite"));
            }
        }
        for (list, what) in [(&self.required_fields, "required_fields"), (&self.optional_fields, "optional_fields")] {
            for name in list.iter() {
                if !ctx.fields.iter().any(|f| &f.name == name) {
                    return Err(Error::invalid(what, format!("unknown field {name:?}")));
                }
            }
        }
        Ok(())
    }
}
