//! The data part of an A2A compress message, parsed strictly: its keys,
//! token counts that protobuf's `Struct` sends as doubles, and the budget
//! as tokens or as LLMLingua's `rate`.

use serde::Deserialize;

use crate::app::json::{Budget, CompressContextArgs, ContextArg, RenderFormat};

/// The data part of a compress message, parsed strictly.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct CompressInput {
    #[serde(default)]
    pub(super) task: Option<String>,
    pub(super) context: scd_engine::context::Context,
    /// Tokens the answer may take (or give `rate`).
    #[serde(default, deserialize_with = "whole_u32_opt")]
    pub(super) budget: Option<u32>,
    /// Instead of `budget`: the share of the context's tokens to keep, in
    /// (0, 1] (LLMLingua's `rate`).
    #[serde(default)]
    pub(super) rate: Option<f64>,
    #[serde(default)]
    pub(super) required: Vec<String>,
    #[serde(default)]
    pub(super) optional: Vec<String>,
    #[serde(default)]
    pub(super) threshold: Option<f32>,
    #[serde(default)]
    pub(super) min_relative_score: Option<f32>,
    #[serde(default)]
    pub(super) render: Option<RenderFormat>,
    /// `o200k`, `cl100k`, `e5` or a name the server registered.
    #[serde(default)]
    pub(super) budget_tokenizer: Option<String>,
    /// Tokens of `budget` held back for follow-ups (the session's total is `budget`).
    #[serde(default, deserialize_with = "whole_u32_opt")]
    pub(super) reserve: Option<u32>,
    /// List what was held back (at most 100, best first) in the data part.
    #[serde(default)]
    pub(super) list_dropped: bool,
}

fn whole_u32_opt<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<u32>, D::Error> {
    whole_u32(d).map(Some)
}

/// A token count: a JSON integer, or a float with no fractional part
/// (protobuf `Struct`, which A2A clients such as `a2a-sdk` send data parts
/// in, has only doubles: `150` arrives as `150.0`).
fn whole_u32<'de, D: serde::Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
    use serde::de::Error as _;
    let v = serde_json::Number::deserialize(d)?;
    let whole = match (v.as_u64(), v.as_f64()) {
        (Some(n), _) => Some(n),
        (None, Some(f)) if f.fract() == 0.0 && (0.0..=f64::from(u32::MAX)).contains(&f) => Some(f as u64),
        _ => None,
    };
    whole
        .and_then(|n| u32::try_from(n).ok())
        .ok_or_else(|| D::Error::custom(format!("expected a whole number of tokens from 0 to {}, got {v}", u32::MAX)))
}

impl CompressInput {
    /// Exactly one of `budget` (at least 1) and `rate` (in (0, 1]); the
    /// error starts with the key it is about.
    pub(super) fn check_budget(&self) -> Result<(), String> {
        match (self.budget, self.rate) {
            (Some(_), Some(_)) => Err("rate: give budget or rate, not both".into()),
            (None, None) => Err("budget: required (tokens), or give rate".into()),
            (Some(0), None) => Err("budget: must be at least 1".into()),
            (Some(_), None) => Ok(()),
            (None, Some(r)) => scd_engine::budget::check_rate("rate", r).map(|_| ()).map_err(|e| e.to_string()),
        }
    }

    /// The JSON API's arguments of the core (the same keys, and a task
    /// that may be empty) and the budget, after [`Self::check_budget`].
    pub(super) fn into_arguments(self) -> (CompressContextArgs, Budget) {
        let budget = match self.rate {
            Some(rate) => Budget::Rate(rate),
            None => Budget::Tokens(self.budget.unwrap_or(0)),
        };
        let args = CompressContextArgs {
            task: self.task.unwrap_or_default(),
            context: ContextArg(self.context),
            budget: self.budget.map(u64::from),
            rate: self.rate,
            required: self.required,
            optional: self.optional,
            session: None,
            threshold: self.threshold,
            min_relative_score: self.min_relative_score,
            render: self.render,
            budget_tokenizer: self.budget_tokenizer,
            explain: false,
            reserve: self.reserve,
            list_dropped: self.list_dropped,
        };
        (args, budget)
    }
}
