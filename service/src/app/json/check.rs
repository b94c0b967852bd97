//! `compress_context`'s arguments checked before any work (REST's
//! `/v1/compress` takes the same): the budget as tokens or as LLMLingua's
//! `rate`, the thresholds in range, the context in its one shape.

use scd_engine::context::Context;

use super::args::{Args, CompressContextArgs};

/// What a `compress_context` may send: tokens, or a share of the context.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Budget {
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
pub fn compress_arguments(args: Args<CompressContextArgs>) -> Result<(CompressContextArgs, Budget), String> {
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
