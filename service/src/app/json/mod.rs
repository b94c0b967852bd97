//! The JSON API of the core: the one parser that REST's bodies and MCP's
//! tools (`compress_context`, `request_more_context`) share, straight into
//! the core's [`CompressInput`] and the engine's [`ContextRequest`], with
//! one set of argument names (`budget`, `required`, `question`, `session`,
//! `context.fields`, …) in its errors.
//!
//! ```
//! use scd_service::app::json::{compress_arguments, Args, Budget, CompressContextArgs};
//! let body = serde_json::json!({"task": "t", "context": {"fields": []}, "rate": 0.5});
//! let args: Args<CompressContextArgs> = serde_json::from_value(body).unwrap();
//! let (_, budget) = compress_arguments(args).unwrap();
//! assert_eq!(budget, Budget::Rate(0.5));
//! ```

mod args;
mod check;

pub use args::{Args, CompressContextArgs, ContextArg, RenderFormat, RequestMoreArgs};
pub use check::{compress_arguments, Budget};

use scd_engine::context::{ContextRequirement, Task};
use scd_engine::extract::{CompressRequest, ContextRequest, SessionRequest};
use scd_engine::handoff::Format;

use super::compress::{AuditSeed, CompressInput};
use super::{AppError, Core};

/// The core's error in the JSON API's terms: an invalid argument that
/// names an engine parameter ([`AppError::InvalidArgument`]'s `param`) names
/// it as the JSON API does ([`Param::json_name`]: `budget`, `question`,
/// `session`, …); every other error is as the core said it.
pub fn named(e: AppError) -> AppError {
    match e {
        AppError::InvalidArgument { message, param: Some(param) } => {
            // the message starts with the wire name (`AppError::invalid_param`,
            // `From<scd_engine::Error>`)
            let message = match message.strip_prefix(param.wire_name()) {
                Some(rest) => format!("{}{rest}", param.json_name()),
                None => message,
            };
            AppError::InvalidArgument { message, param: Some(param) }
        }
        e => e,
    }
}

impl From<RenderFormat> for Format {
    fn from(f: RenderFormat) -> Format {
        match f {
            RenderFormat::Freeform => Format::Freeform,
            RenderFormat::SemiStructured => Format::SemiStructured,
            RenderFormat::StructuredSoft => Format::StructuredSoft,
        }
    }
}

/// What the audit trail records of checked `compress_context` arguments
/// before they are converted (a refused conversion is recorded with it).
pub fn audit_seed(a: &CompressContextArgs, budget: Budget, session_id: &str) -> AuditSeed {
    AuditSeed {
        task: Some(a.task.clone()),
        budget_tokens: Some(match budget {
            Budget::Tokens(n) => n,
            Budget::Rate(_) => 0,
        }),
        session_id: session_id.to_string(),
    }
}

/// The core's input of checked `compress_context` arguments (see
/// [`compress_arguments`]); an empty `session_token` opens a session (under
/// `session_id`, or a random one when that is empty too), holding back
/// `reserve` for follow-ups.
pub fn compress_input(
    core: &Core,
    a: CompressContextArgs,
    budget: Budget,
    session_id: String,
    session_token: String,
) -> Result<CompressInput, AppError> {
    let budget_tokenizer = core.tokenizers.resolve(a.budget_tokenizer.as_deref().unwrap_or_default())?;
    let fields = a.context.0.fields;
    let max_fields = core.limits.max_fields;
    if fields.len() > max_fields {
        return Err(AppError::invalid(format!("context.fields: {} fields, over the limit {max_fields}", fields.len())));
    }
    let open = session_token.is_empty();
    let (max_context_tokens, rate) = match budget {
        Budget::Tokens(n) => (n as usize, None),
        Budget::Rate(r) => (0, Some(r)),
    };
    let reserve_tokens = if open { a.reserve.unwrap_or(0) as usize } else { 0 };
    let session = match (session_id.is_empty(), open) {
        (false, _) => Some(SessionRequest {
            id: Some(session_id),
            token: (!session_token.is_empty()).then_some(session_token),
            reserve_tokens,
            ..SessionRequest::default()
        }),
        (true, true) => Some(SessionRequest { reserve_tokens, ..SessionRequest::default() }),
        (true, false) => None,
    };
    let request = CompressRequest {
        task: Task { description: a.task, constraints: Vec::new(), output_schema: None },
        context: scd_engine::context::Context { fields },
        requirement: ContextRequirement {
            required_fields: a.required,
            optional_fields: a.optional,
            max_context_tokens,
            relevance_threshold: a.threshold,
            min_relative_score: a.min_relative_score,
        },
        session,
    };
    Ok(CompressInput {
        request,
        rate,
        budget_tokenizer,
        explain: a.explain,
        render: a.render.map(Format::from),
        answer: None,
    })
}

/// `request_more_context`'s arguments checked and made the engine's
/// request (the session token and the caller are the surface's to fill):
/// the session named, a reply budget of at least 1, and exactly one of a
/// confidence in [0, 1] or a report, whose confidence, next step and
/// summary it takes ([`super::more::apply_report`]).
pub fn more_input(core: &Core, a: RequestMoreArgs, session_token: String) -> Result<ContextRequest, AppError> {
    let confidence = more_confidence(&a)?;
    let mut req = ContextRequest {
        session_id: a.session,
        session_token,
        caller: None,
        scope: None,
        specific_question: a.question,
        current_confidence: confidence,
        reasoning: a.reasoning,
        chunk_ids: a.chunk_ids,
        max_tokens: a.max_tokens.map(|n| n as usize),
        request_id: None,
    };
    if let Some(report) = a.report.filter(|r| !r.is_empty()) {
        super::more::apply_report(&mut req, &report, &core.confidence_map)?;
    }
    Ok(req)
}

/// The checks of [`more_input`] that need no core; the confidence asked.
pub fn more_confidence(a: &RequestMoreArgs) -> Result<f32, AppError> {
    if a.session.is_empty() {
        return Err(AppError::invalid("session: must not be empty"));
    }
    if a.max_tokens == Some(0) {
        return Err(AppError::invalid("max_tokens: must be at least 1 (leave it out for the session's default)"));
    }
    match (a.current_confidence, &a.report) {
        (Some(_), Some(_)) => Err(AppError::invalid(
            "current_confidence: given with a report; the report's confidence sets it (give one or the other)",
        )),
        (None, None) => Err(AppError::invalid("current_confidence: required without a report (a number in [0, 1])")),
        (Some(c), None) if !(c.is_finite() && (0.0..=1.0).contains(&c)) => {
            Err(AppError::invalid(format!("current_confidence: must be in [0, 1], got {c}")))
        }
        (c, _) => Ok(c.unwrap_or(0.0)),
    }
}

#[cfg(test)]
mod tests {
    use scd_engine::Param;

    use super::*;

    #[test]
    fn an_engine_parameter_is_named_by_its_type_and_others_pass_as_they_are() {
        let e = AppError::from(scd_engine::Error::invalid(Param::SpecificQuestion, "must not be empty"));
        assert_eq!(e.message(), "specific_question: must not be empty", "gRPC keeps the engine's name");
        assert_eq!(named(e).message(), "question: must not be empty");
        let e = AppError::invalid_param(Param::SessionId, "must not be empty");
        assert_eq!(
            (e.message(), named(e.clone()).message()),
            ("session_id: must not be empty", "session: must not be empty")
        );
        // a path both name alike, and a message that merely starts like a parameter
        let e = AppError::from(scd_engine::Error::invalid("chunk_ids[2]", "not a chunk"));
        assert_eq!(named(e).message(), "chunk_ids[2]: not a chunk");
        assert_eq!(named(AppError::invalid("session_id: said in a string")).message(), "session_id: said in a string");
    }
}
