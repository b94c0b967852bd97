//! pb ↔ engine conversions and the one mapping from engine errors to gRPC
//! status codes.

use scd_engine::context::{Context, ContextRequirement, Field, FieldKind, Task};
use scd_engine::encoder::{EncodeOptions, InputKind};
use scd_engine::extract::{Compressed, SelectedChunk, SessionRequest};
use tonic::{Code, Status};

use super::pb;
use super::pb::PARAM_KEY;
use crate::app::AppError;

/// An engine error as a status: [`AppError`]'s mapping (validation →
/// INVALID_ARGUMENT, unknown session → NOT_FOUND, cancelled → CANCELLED,
/// deadline → DEADLINE_EXCEEDED, model problems → UNAVAILABLE, everything
/// else → INTERNAL), the message unchanged.
pub fn status(err: scd_engine::Error) -> Status {
    AppError::from(err).into()
}

/// The core's error on the wire: one code per kind, the message unchanged,
/// a refusal for load's retry hint as `retry-after-ms`, and the engine
/// parameter an invalid argument is about as [`PARAM_KEY`] (its wire name).
impl From<AppError> for Status {
    fn from(e: AppError) -> Status {
        let mut s = Status::new(Code::from(e.code()), e.to_string());
        if let Some(ms) = e.retry_after_ms() {
            s.metadata_mut().insert("retry-after-ms", ms.into());
        }
        if let Some(Ok(name)) = e.param().map(|p| p.wire_name().parse()) {
            s.metadata_mut().insert(PARAM_KEY, name);
        }
        s
    }
}

/// A gRPC status code as the core names it: the same canonical code.
impl From<Code> for crate::app::Code {
    fn from(c: Code) -> crate::app::Code {
        // both number the canonical codes 0 to 16 alike (tested below)
        crate::app::Code::ALL[c as usize]
    }
}

/// The core's code on the wire: the same canonical code.
impl From<crate::app::Code> for Code {
    fn from(c: crate::app::Code) -> Code {
        Code::from(c as i32)
    }
}

fn kind(i: usize, k: i32) -> Result<FieldKind, Status> {
    let wire = pb::FieldKind::try_from(k)
        .map_err(|_| Status::invalid_argument(format!("fields[{i}].kind: unknown value {k}")))?;
    FieldKind::try_from(wire).map_err(|_| {
        Status::invalid_argument(format!(
            "fields[{i}].kind: required (FIELD_KIND_PROSE, _CODE, _LOG, _JSON, _CHAT or _TABLE)"
        ))
    })
}

/// The request's `rate` (LLMLingua's: the share of the context's tokens to
/// keep), checked: in (0, 1] and not beside a token budget
/// (`requirement.max_context_tokens` is 0). With a rate, a missing
/// `requirement` is an empty one: the rate is the budget.
pub fn rate(r: &mut pb::CompressRequest) -> Result<Option<f64>, Status> {
    let Some(rate) = r.rate else { return Ok(None) };
    scd_engine::budget::check_rate("rate", rate).map_err(status)?;
    if r.requirement.get_or_insert_with(Default::default).max_context_tokens > 0 {
        return Err(Status::invalid_argument("rate: give requirement.max_context_tokens or rate, not both"));
    }
    Ok(Some(rate))
}

/// A checked engine request from the wire; `caller` is the transport's
/// verified identity of the client (its TLS certificate), if any.
pub fn compress_request(
    r: pb::CompressRequest,
    max_fields: usize,
    caller: Option<String>,
) -> Result<scd_engine::extract::CompressRequest, Status> {
    if r.fields.len() > max_fields {
        return Err(Status::invalid_argument(format!(
            "fields: {} fields, over the limit {max_fields}",
            r.fields.len()
        )));
    }
    let task = r.task.ok_or_else(|| Status::invalid_argument("task: required"))?;
    let rq = r.requirement.ok_or_else(|| Status::invalid_argument("requirement: required"))?;
    let fields = r
        .fields
        .into_iter()
        .enumerate()
        .map(|(i, f)| {
            Ok(Field { name: f.name, kind: kind(i, f.kind)?, content: f.content, confidential: f.confidential })
        })
        .collect::<Result<Vec<_>, Status>>()?;
    Ok(scd_engine::extract::CompressRequest {
        task: Task {
            description: task.description,
            constraints: task.constraints,
            output_schema: (!task.output_schema.is_empty()).then_some(task.output_schema),
        },
        context: Context { fields },
        requirement: ContextRequirement {
            required_fields: rq.required_fields,
            optional_fields: rq.optional_fields,
            max_context_tokens: rq.max_context_tokens as usize,
            relevance_threshold: rq.relevance_threshold,
            min_relative_score: rq.min_relative_score,
        },
        session: (!r.session_id.is_empty()).then(|| SessionRequest {
            id: Some(r.session_id),
            token: (!r.session_token.is_empty()).then_some(r.session_token),
            caller,
            scope: None,
            max_total_tokens: (r.session_max_total_tokens > 0).then_some(r.session_max_total_tokens as usize),
            reserve_tokens: r.reserve_tokens as usize,
        }),
    })
}

/// Count, size and NUL checks of the texts of an Embed or CountTokens
/// request (the core's [`crate::app::check_texts`]).
pub fn check_texts(texts: &[String], max_texts: usize, max_text_bytes: usize) -> Result<(), Status> {
    Ok(crate::app::check_texts(texts, max_texts, max_text_bytes)?)
}

/// The checked texts and options of an embed request from the wire.
pub fn embed_request(
    r: pb::EmbedRequest,
    max_texts: usize,
    max_text_bytes: usize,
) -> Result<(Vec<String>, EncodeOptions), Status> {
    crate::app::check_embed_texts(&r.texts, max_texts, max_text_bytes)?;
    let kind = match pb::InputKind::try_from(r.kind) {
        Ok(pb::InputKind::Query) => InputKind::Query,
        Ok(pb::InputKind::Passage) => InputKind::Passage,
        Ok(pb::InputKind::Unspecified) => {
            return Err(Status::invalid_argument("kind: required (INPUT_KIND_QUERY or INPUT_KIND_PASSAGE)"))
        }
        Err(_) => return Err(Status::invalid_argument(format!("kind: unknown value {}", r.kind))),
    };
    let mut opts = EncodeOptions::new(kind);
    if r.windows {
        opts = opts.with_windows();
    }
    Ok((r.texts, opts))
}

/// A selected chunk on the wire.
pub fn chunk(c: &SelectedChunk) -> pb::Chunk {
    pb::Chunk {
        field: c.field.clone(),
        id: c.id.clone(),
        start: c.span.0 as u32,
        end: c.span.1 as u32,
        text: c.text.clone(),
        score: c.score,
        tokens: c.tokens as u32,
    }
}

/// A compression result on the wire.
pub fn compress_response(out: Compressed, timing: pb::Timing) -> pb::CompressResponse {
    pb::CompressResponse {
        chunks: out.chunks.iter().map(chunk).collect(),
        totals: Some(pb::Totals {
            context_tokens: out.totals.context_tokens as u32,
            sent_tokens: out.totals.sent_tokens as u32,
            reduction_ratio: out.totals.reduction_ratio,
            r_theorem1: out.totals.r_theorem1,
            tokenizer: out.totals.tokenizer.clone(),
            requested_ratio: out.totals.requested_ratio,
        }),
        dropped: out
            .dropped
            .into_iter()
            .map(|d| pb::DroppedChunk { field: d.field, id: d.id, stub: d.stub, tokens: d.tokens as u32 })
            .collect(),
        task_embedding: out.task_embedding,
        warnings: out.warnings,
        timing: Some(timing),
        session_id: out.session.as_ref().map(|g| g.id.clone()).unwrap_or_default(),
        session_token: out.session.map(|g| g.token).unwrap_or_default(),
        withheld_fields: out.withheld,
        report: String::new(),
        explanation: out.explanation.map(explanation),
        text: out.text,
    }
}

/// An explanation on the wire.
pub fn explanation(ex: scd_engine::extract::Explanation) -> pb::Explanation {
    use scd_engine::extract::DropReason as R;
    pb::Explanation {
        lexical_weight: ex.lexical_weight,
        selected: ex
            .selected
            .into_iter()
            .map(|c| pb::ChunkWhy {
                id: c.id,
                order: c.order as u32,
                score: c.score,
                dense_z: c.dense_z,
                lexical_z: c.lexical_z,
                group_lift: c.group_lift,
                link_lift: c.link_lift,
                hop_lift: c.hop_lift,
                rerank_lift: c.rerank_lift,
                lead: c.lead,
                by_closure: c.by_closure,
                required: c.required,
                tokens: c.tokens as u32,
                chunker: c.chunker.unwrap_or_default(),
            })
            .collect(),
        dropped: ex
            .dropped
            .into_iter()
            .map(|d| {
                let mut w = pb::DropWhy { id: d.id, score: d.score, tokens: d.tokens as u32, ..Default::default() };
                w.reason = match d.reason {
                    R::BelowThreshold { threshold, value } => {
                        w.threshold = threshold.to_string();
                        w.value = value;
                        pb::DropReason::BelowThreshold
                    }
                    R::OutOfBudget => pb::DropReason::OutOfBudget,
                    R::NearDuplicate { of } => {
                        w.duplicate_of = of;
                        pb::DropReason::NearDuplicate
                    }
                    R::NotEligible => pb::DropReason::NotEligible,
                    R::StructureOnly => pb::DropReason::StructureOnly,
                } as i32;
                w
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_codes_and_the_cores_agree_by_number_and_name() {
        for n in 0..=16 {
            let grpc = Code::from(n);
            let core = crate::app::Code::from(grpc);
            assert_eq!(core as i32, n);
            // the `code` label of scd_requests_total stays gRPC's name
            assert_eq!(core.name(), format!("{grpc:?}"));
            assert_eq!(Code::from(core), grpc);
        }
    }

    #[test]
    fn an_app_error_keeps_its_kind_message_and_retry_hint_on_the_wire() {
        let busy = Status::from(AppError::exhausted("compress queue is full; retry after 40 ms", 40));
        assert_eq!(busy.code(), Code::ResourceExhausted);
        assert_eq!(busy.message(), "compress queue is full; retry after 40 ms");
        assert_eq!(busy.metadata().get("retry-after-ms").unwrap(), "40");
        let failed = Status::from(AppError::internal("audit: disk full"));
        assert_eq!((failed.code(), failed.message()), (Code::Internal, "audit: disk full"));
        assert!(busy.metadata().get(PARAM_KEY).is_none() && failed.metadata().get(PARAM_KEY).is_none());
    }

    #[test]
    fn an_invalid_argument_names_its_parameter_in_metadata() {
        let e = AppError::invalid_param(scd_engine::Param::MaxContextTokens, "must be at least 1");
        let s = Status::from(e);
        assert_eq!((s.code(), s.message()), (Code::InvalidArgument, "max_context_tokens: must be at least 1"));
        assert_eq!(s.metadata().get(PARAM_KEY).unwrap(), "max_context_tokens");
        let s = status(scd_engine::Error::invalid("chunk_ids[2]", "not a chunk"));
        assert_eq!(s.metadata().get(PARAM_KEY).unwrap(), "chunk_ids[2]");
        let s = Status::from(AppError::invalid("rate: give budget or rate, not both"));
        assert!(s.metadata().get(PARAM_KEY).is_none(), "no parameter known, none named");
    }
}
