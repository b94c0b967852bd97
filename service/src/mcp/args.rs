//! `compress_context`'s arguments checked before any work (REST's
//! `/v1/compress` takes the same): the budget as tokens or as LLMLingua's
//! `rate`, the thresholds in range, the context in its one shape.

use std::borrow::Cow;

use scd_engine::context::Context;
use schemars::{JsonSchema, Schema, SchemaGenerator};
use serde::Deserialize;

use super::{Args, CompressContextArgs};

/// What a `compress_context` may send: tokens, or a share of the context.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Budget {
    /// At most this many tokens of `budget_tokenizer` (at least 1).
    Tokens(u32),
    /// This share of the shareable context's tokens, in (0, 1]: the server
    /// counts them and keeps that many.
    Rate(f64),
}

/// `compress_context`'s arguments, checked before any work: a context sent
/// in a mistaken shape (a JSON string, a bare array) is named with what to
/// send, the rest is parsed strictly, exactly one of `budget` and `rate` is
/// given and in range, and so are the thresholds. Errors name the argument
/// and never quote a value.
pub(crate) fn compress_arguments(args: Args<CompressContextArgs>) -> Result<(CompressContextArgs, Budget), String> {
    if let Some(hint) = args.0.get("context").and_then(Context::mistaken_shape) {
        return Err(format!("context: {hint}"));
    }
    let a = args.parse()?;
    let budget = match (a.budget, a.rate) {
        (Some(_), Some(_)) => return Err("rate: give budget or rate, not both".into()),
        (None, None) => return Err("budget: required (tokens), or give rate".into()),
        (None, Some(rate)) => Budget::Rate(scd_engine::budget::check_rate("rate", rate).map_err(|e| e.to_string())?),
        (Some(0), None) => return Err("budget: must be at least 1".into()),
        (Some(n), None) => {
            Budget::Tokens(u32::try_from(n).map_err(|_| format!("budget: {n} is over the limit {}", u32::MAX))?)
        }
    };
    if let Some(t) = a.threshold {
        if !(t.is_finite() && (-1.0..=1.0).contains(&t)) {
            return Err(format!("threshold: must be a cosine in [-1, 1], got {t}"));
        }
    }
    if a.min_relative_score.is_some_and(|t| !t.is_finite()) {
        return Err("min_relative_score: must be finite".into());
    }
    Ok((a, budget))
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
            "description": "The sender's context: named fields. Confidential fields are used for nothing and never sent back.",
            "properties": {
                "fields": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {
                            "name": {"type": "string", "description": "Unique, non-empty name (e.g. db_schema)."},
                            "kind": {
                                "type": "string",
                                "enum": ["prose", "code", "log", "json", "chat", "table", "markdown"],
                                "default": "prose",
                                "description": "How the field is chunked."
                            },
                            "content": {"type": "string"},
                            "confidential": {"type": "boolean", "default": false}
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

#[cfg(test)]
mod tests {
    use serde_json::{json, Value};

    use super::*;

    fn checked(v: Value) -> Result<Budget, String> {
        let Value::Object(m) = v else { panic!("not an object") };
        compress_arguments(Args::from_map(m)).map(|(_, b)| b)
    }

    #[test]
    fn exactly_one_of_budget_and_rate_in_range() {
        let ctx = json!({"fields": [{"name": "a", "content": "x"}]});
        assert_eq!(checked(json!({"task": "t", "context": ctx, "budget": 7})), Ok(Budget::Tokens(7)));
        assert_eq!(checked(json!({"task": "t", "context": ctx, "rate": 0.3})), Ok(Budget::Rate(0.3)));
        assert_eq!(checked(json!({"task": "t", "context": ctx, "rate": 1})), Ok(Budget::Rate(1.0)));
        let refused = [
            (json!({"task": "t", "context": ctx, "budget": 7, "rate": 0.3}), "rate: give budget or rate, not both"),
            (json!({"task": "t", "context": ctx}), "budget: required (tokens), or give rate"),
            (json!({"task": "t", "context": ctx, "budget": 0}), "budget: must be at least 1"),
        ];
        for (args, want) in refused {
            assert_eq!(checked(args).unwrap_err(), want);
        }
        let range = format!("rate: {}", scd_engine::budget::RATE_RANGE);
        for bad in [json!(0), json!(0.0), json!(-0.5), json!(1.5), json!(1e300)] {
            assert_eq!(checked(json!({"task": "t", "context": ctx, "rate": bad})).unwrap_err(), range, "{bad}");
        }
        let e = checked(json!({"task": "t", "context": ctx, "rate": "0.3"})).unwrap_err();
        assert!(e.starts_with("rate: invalid type"), "{e}");
    }
}
