//! The one output view ([`crate::view`]) of a server's replies, for the two
//! gRPC clients that show them: `scd client` and `scd mcp --server` (MCP's
//! remote backend). The wire's types come from `scd-proto`, the contract;
//! the explanation goes through the engine's type, so a reply read here
//! explains, lists and sorts what was held back as the server's own view
//! would.

use scd_engine::extract::{ChunkWhy, DropReason, DropWhy, Explanation};
use scd_proto::scd::v1 as pb;
use tonic::Status;

use crate::view::{held_back, ChunkOut, CompressOutput, DroppedOut, ExplanationOut, MoreOutput, TotalsOut};

/// The threshold names a `below_threshold` drop may carry (the engine's).
const THRESHOLDS: [&str; 2] = ["relevance_threshold", "min_relative_score"];

/// A selected chunk on the wire, as the view lists it.
fn chunk(c: pb::Chunk) -> ChunkOut {
    ChunkOut { field: c.field, id: c.id, score: c.score, tokens: c.tokens, span: [c.start, c.end] }
}

/// The view of a Compress (or OpenSession) reply, as
/// [`crate::view::compressed_view`]; an explanation naming a threshold the
/// engine does not have is an INTERNAL error.
pub fn compress_view(r: pb::CompressResponse, list_dropped: bool) -> Result<CompressOutput, Status> {
    let t = r.totals.unwrap_or_default();
    let dropped: Vec<DroppedOut> = r
        .dropped
        .into_iter()
        .map(|d| DroppedOut { field: d.field, id: d.id, stub: d.stub, tokens: d.tokens })
        .collect();
    let explanation = r.explanation.map(explanation).transpose()?;
    Ok(CompressOutput {
        text: r.text,
        chunks: r.chunks.into_iter().map(chunk).collect(),
        totals: TotalsOut {
            context_tokens: t.context_tokens,
            sent_tokens: t.sent_tokens,
            reduction_ratio: t.reduction_ratio,
            tokenizer: t.tokenizer,
            requested_ratio: t.requested_ratio,
        },
        dropped: held_back(dropped, explanation.as_ref(), list_dropped),
        withheld_fields: r.withheld_fields,
        warnings: r.warnings,
        session_id: r.session_id,
        explanation: explanation.map(ExplanationOut::from),
    })
}

/// The view of a RequestContext reply, as [`crate::view::more_context_view`].
pub fn more_view(r: pb::ContextResponse) -> MoreOutput {
    MoreOutput {
        chunks: r.chunks.into_iter().map(chunk).collect(),
        sent_tokens: r.sent_tokens,
        budget: r.budget,
        session_sent_tokens: r.session_sent_tokens,
        remaining_tokens: r.remaining_tokens,
        reason: r.reason,
        text: r.text,
    }
}

/// An explanation from the wire (`scd client` prints it as a table too); a
/// threshold name other than the engine's two is an INTERNAL error naming
/// the entry, never read as another threshold.
pub fn explanation(ex: pb::Explanation) -> Result<Explanation, Status> {
    let selected = ex
        .selected
        .into_iter()
        .map(|c| ChunkWhy {
            id: c.id,
            order: c.order as usize,
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
            tokens: c.tokens as usize,
            chunker: (!c.chunker.is_empty()).then_some(c.chunker),
        })
        .collect();
    let dropped = ex
        .dropped
        .into_iter()
        .enumerate()
        .map(|(i, d)| {
            let reason = match pb::DropReason::try_from(d.reason).unwrap_or_default() {
                pb::DropReason::BelowThreshold => {
                    DropReason::BelowThreshold { threshold: threshold(i, &d.threshold)?, value: d.value }
                }
                pb::DropReason::NearDuplicate => DropReason::NearDuplicate { of: d.duplicate_of },
                pb::DropReason::NotEligible => DropReason::NotEligible,
                pb::DropReason::StructureOnly => DropReason::StructureOnly,
                pb::DropReason::OutOfBudget | pb::DropReason::Unspecified => DropReason::OutOfBudget,
            };
            Ok(DropWhy { reason, id: d.id, score: d.score, tokens: d.tokens as usize })
        })
        .collect::<Result<_, Status>>()?;
    Ok(Explanation { lexical_weight: ex.lexical_weight, selected, dropped })
}

/// The engine's name of the threshold `name` of dropped entry `i`.
fn threshold(i: usize, name: &str) -> Result<&'static str, Status> {
    THRESHOLDS.into_iter().find(|t| *t == name).ok_or_else(|| {
        Status::internal(format!(
            "explanation.dropped[{i}].threshold: unknown name {name:?} (relevance_threshold or min_relative_score)"
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn below(id: &str, threshold: &str, score: f32) -> pb::DropWhy {
        pb::DropWhy {
            id: id.into(),
            score,
            tokens: 4,
            reason: pb::DropReason::BelowThreshold as i32,
            threshold: threshold.into(),
            value: 0.25,
            ..Default::default()
        }
    }

    #[test]
    fn both_threshold_names_come_back_as_sent() {
        let wire = pb::Explanation {
            dropped: vec![below("a#0", "relevance_threshold", 1.0), below("b#0", "min_relative_score", 0.5)],
            ..Default::default()
        };
        let ex = explanation(wire).unwrap();
        let names: Vec<_> = ex
            .dropped
            .iter()
            .map(|d| match d.reason {
                DropReason::BelowThreshold { threshold, value } => (threshold, value),
                ref other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(names, [("relevance_threshold", 0.25), ("min_relative_score", 0.25)]);
    }

    #[test]
    fn an_unknown_threshold_name_is_an_error_naming_the_entry() {
        let wire = pb::Explanation {
            dropped: vec![below("a#0", "relevance_threshold", 1.0), below("b#0", "max_distance", 0.5)],
            ..Default::default()
        };
        let err = explanation(wire.clone()).unwrap_err();
        assert_eq!(err.code(), tonic::Code::Internal);
        assert_eq!(
            err.message(),
            "explanation.dropped[1].threshold: unknown name \"max_distance\" (relevance_threshold or min_relative_score)"
        );
        let reply = pb::CompressResponse { explanation: Some(wire), ..Default::default() };
        assert_eq!(compress_view(reply, true).unwrap_err().message(), err.message(), "the view refuses it too");
        let empty = pb::Explanation { dropped: vec![below("a#0", "", 1.0)], ..Default::default() };
        assert!(explanation(empty).is_err(), "an empty name is not read as min_relative_score");
    }

    #[test]
    fn the_listed_dropped_chunks_are_sorted_by_the_explanations_scores() {
        let dropped = |id: &str| pb::DroppedChunk { field: "f".into(), id: id.into(), stub: "…".into(), tokens: 3 };
        let reply = pb::CompressResponse {
            dropped: vec![dropped("f#1"), dropped("f#2"), dropped("f#3")],
            explanation: Some(pb::Explanation {
                dropped: vec![below("f#2", "min_relative_score", 0.9), below("f#3", "min_relative_score", 0.1)],
                ..Default::default()
            }),
            ..Default::default()
        };
        let listed = compress_view(reply.clone(), true).unwrap().dropped;
        let ids: Vec<_> = listed.listed.iter().map(|d| d.id.as_str()).collect();
        assert_eq!((listed.count, listed.tokens, ids), (3, 9, vec!["f#2", "f#3", "f#1"]));
        let counted = compress_view(reply, false).unwrap().dropped;
        assert_eq!((counted.count, counted.tokens, counted.listed.len()), (3, 9, 0));
    }
}
