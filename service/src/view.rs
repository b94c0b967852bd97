//! The one output view of a compression and of a follow-up, shared by
//! every surface: MCP's structured results, A2A's data parts, `scd compress
//! --format json` and `scd client`. Keys are snake_case everywhere.
//!
//! The view is the machine's: `text` holds exactly what the receiver
//! pastes (within the budget), the chunks are listed by id and span (their
//! text is in `text`, not repeated), and what was held back is a count and
//! its tokens unless a list is asked for ([`MAX_LISTED_DROPPED`] at most).
//! [`compress_header`] and [`more_header`] are the one-line headers a
//! surface may put before `text` in the receiver's window.
//!
//! It is built from the engine's results ([`compressed_view`],
//! [`more_context_view`]); the gRPC clients (`scd client`, `scd mcp
//! --server`) build it from a server's reply in [`crate::client::view`].

use std::collections::HashMap;

use schemars::JsonSchema;
use serde::Serialize;

use scd_engine::extract::{Compressed, Explanation, MoreContext, SelectedChunk};

/// A selected chunk (its text is in `text`, in reading order).
#[derive(Debug, Serialize, JsonSchema)]
pub struct ChunkOut {
    /// The field it comes from.
    pub field: String,
    /// Stable chunk id.
    pub id: String,
    /// Relevance score.
    pub score: f32,
    /// Tokens it costs.
    pub tokens: u32,
    /// Byte span `[start, end)` in the field's content.
    pub span: [u32; 2],
}

/// A chunk the engine selected (a compression's or a follow-up's), as the
/// view lists it.
impl From<SelectedChunk> for ChunkOut {
    fn from(k: SelectedChunk) -> Self {
        ChunkOut {
            field: k.field,
            id: k.id,
            score: k.score,
            tokens: k.tokens as u32,
            span: [k.span.0 as u32, k.span.1 as u32],
        }
    }
}

/// Sizes of a compression.
#[derive(Debug, Serialize, JsonSchema)]
pub struct TotalsOut {
    /// Tokens of the whole non-confidential context.
    pub context_tokens: u32,
    /// Tokens sent.
    pub sent_tokens: u32,
    /// context_tokens / sent_tokens.
    pub reduction_ratio: f32,
    /// The tokenizer that counted (`e5`, `o200k`, `cl100k` or a registered name).
    pub tokenizer: String,
    /// context_tokens / budget: the ratio asked for.
    pub requested_ratio: f32,
}

/// A chunk left out, for `request_more_context.chunk_ids`.
#[derive(Debug, Serialize, JsonSchema)]
pub struct DroppedOut {
    /// The field it comes from.
    pub field: String,
    /// Chunk id.
    pub id: String,
    /// A short stub of its text.
    pub stub: String,
    /// Tokens it would cost.
    pub tokens: u32,
}

/// What was held back: counts by default, the list with `list_dropped`.
#[derive(Debug, Serialize, JsonSchema)]
pub struct DroppedSummary {
    /// Chunks held back (confidential fields never counted).
    pub count: u32,
    /// Their tokens.
    pub tokens: u64,
    /// With `list_dropped`: at most 100 of them, best first.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub listed: Vec<DroppedOut>,
}

/// Result of `compress_context`. The text block is `text` after a one-line
/// header; this structured result is the machine view.
#[derive(Debug, Serialize, JsonSchema)]
pub struct CompressOutput {
    /// Exactly what to hand the receiver (the report with `render`), within
    /// the budget in `totals.tokenizer`.
    pub text: String,
    /// The chunks sent, in reading order.
    pub chunks: Vec<ChunkOut>,
    /// Sizes.
    pub totals: TotalsOut,
    /// What was held back.
    pub dropped: DroppedSummary,
    /// Names of the confidential fields withheld.
    pub withheld_fields: Vec<String>,
    /// Notes on the selection.
    pub warnings: Vec<String>,
    /// The session to name in `request_more_context`.
    pub session_id: String,
    /// Why each chunk was sent or dropped (with `explain`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub explanation: Option<ExplanationOut>,
}

/// Why the selection is what it is (`compress_context` with `explain`).
#[derive(Debug, Serialize, JsonSchema)]
pub struct ExplanationOut {
    /// The weight of `lexical_z` in the score.
    pub lexical_weight: f32,
    /// Per sent chunk, in reading order (as `chunks`).
    pub selected: Vec<ChunkWhyOut>,
    /// Per dropped chunk, best score first, at most 50 (confidential fields
    /// never listed).
    pub dropped: Vec<DropWhyOut>,
}

/// Why a chunk was sent: `score = dense_z + lexical_weight * lexical_z +
/// group_lift + link_lift + hop_lift + rerank_lift`.
#[derive(Debug, Serialize, JsonSchema)]
pub struct ChunkWhyOut {
    /// Chunk id.
    pub id: String,
    /// When packing took it, 1-based (required chunks first).
    pub order: u32,
    /// The fused score.
    pub score: f32,
    /// z-score of the dense (cosine) similarity to the task.
    pub dense_z: f32,
    /// z-score of BM25, before `lexical_weight`.
    pub lexical_z: f32,
    /// Lift from the best chunk of its group.
    pub group_lift: f32,
    /// Lift from links (a document the task or a top chunk names).
    pub link_lift: f32,
    /// Lift from the second hop.
    pub hop_lift: f32,
    /// Lift from the second stage (the cross-encoder; 0 when off).
    pub rerank_lift: f32,
    /// It leads its group (a paragraph's first sentence, a table header).
    pub lead: bool,
    /// A chunk of its group brought it.
    pub by_closure: bool,
    /// Its field is required.
    pub required: bool,
    /// Tokens in the budget tokenizer.
    pub tokens: u32,
    /// The chunker that made it, when recorded.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub chunker: Option<String>,
}

/// Why a chunk was not sent.
#[derive(Debug, Serialize, JsonSchema)]
pub struct DropWhyOut {
    /// Chunk id.
    pub id: String,
    /// The fused score.
    pub score: f32,
    /// Tokens it would cost, in the budget tokenizer.
    pub tokens: u32,
    /// `below_threshold`, `out_of_budget`, `near_duplicate`, `not_eligible` or
    /// `structure_only`.
    pub reason: String,
    /// `below_threshold`: `relevance_threshold` (cosine) or `min_relative_score` (z).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub threshold: Option<String>,
    /// `below_threshold`: the chunk's value that was compared.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub value: Option<f32>,
    /// `near_duplicate`: the id of the sent chunk it duplicates.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub of: Option<String>,
}

/// An engine explanation as the view shows it: the dropped part keeps the
/// [`MAX_EXPLAINED_DROPPED`] best.
impl From<Explanation> for ExplanationOut {
    fn from(ex: Explanation) -> Self {
        use scd_engine::extract::DropReason as R;
        ExplanationOut {
            lexical_weight: ex.lexical_weight,
            selected: ex
                .selected
                .into_iter()
                .map(|c| ChunkWhyOut {
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
                    chunker: c.chunker.filter(|c| !c.is_empty()),
                })
                .collect(),
            dropped: ex
                .dropped
                .into_iter()
                .take(MAX_EXPLAINED_DROPPED)
                .map(|d| {
                    let (reason, threshold, value, of) = match d.reason {
                        R::BelowThreshold { threshold, value } => {
                            ("below_threshold", Some(threshold.to_string()), Some(value), None)
                        }
                        R::NearDuplicate { of } => ("near_duplicate", None, None, Some(of)),
                        R::NotEligible => ("not_eligible", None, None, None),
                        R::StructureOnly => ("structure_only", None, None, None),
                        R::OutOfBudget => ("out_of_budget", None, None, None),
                    };
                    DropWhyOut {
                        reason: reason.into(),
                        threshold,
                        value,
                        of,
                        id: d.id,
                        score: d.score,
                        tokens: d.tokens as u32,
                    }
                })
                .collect(),
        }
    }
}

/// Result of `request_more_context`. The text block is `text` after a
/// one-line header.
#[derive(Debug, Serialize, JsonSchema)]
pub struct MoreOutput {
    /// Exactly what to hand the receiver: the new chunks, within `budget`.
    pub text: String,
    /// The new chunks, never sent before in the session, in reading order.
    pub chunks: Vec<ChunkOut>,
    /// Tokens of `text`.
    pub sent_tokens: u32,
    /// This reply's budget.
    pub budget: u32,
    /// Tokens sent in the session so far, this reply included.
    pub session_sent_tokens: u32,
    /// The most the next call gets without `max_tokens`.
    pub remaining_tokens: u32,
    /// Why nothing (or less than the budget) was sent, if so.
    pub reason: String,
}

/// Chunks held back that `list_dropped` lists at most.
pub const MAX_LISTED_DROPPED: usize = 100;
/// Dropped chunks an explanation lists at most (the best).
pub const MAX_EXPLAINED_DROPPED: usize = 50;

/// The view of a compression (the core's or the engine's result): what
/// was held back is listed (best first, bounded) only with `list_dropped`;
/// an explanation's dropped part keeps the [`MAX_EXPLAINED_DROPPED`] best.
pub fn compressed_view(c: Compressed, list_dropped: bool) -> CompressOutput {
    let dropped: Vec<DroppedOut> = c
        .dropped
        .into_iter()
        .map(|d| DroppedOut { field: d.field, id: d.id, stub: d.stub, tokens: d.tokens as u32 })
        .collect();
    CompressOutput {
        text: c.text,
        chunks: c.chunks.into_iter().map(ChunkOut::from).collect(),
        totals: TotalsOut {
            context_tokens: c.totals.context_tokens as u32,
            sent_tokens: c.totals.sent_tokens as u32,
            reduction_ratio: c.totals.reduction_ratio,
            tokenizer: c.totals.tokenizer,
            requested_ratio: c.totals.requested_ratio,
        },
        dropped: held_back(dropped, c.explanation.as_ref(), list_dropped),
        withheld_fields: c.withheld,
        warnings: c.warnings,
        session_id: c.session.map(|g| g.id).unwrap_or_default(),
        explanation: c.explanation.map(ExplanationOut::from),
    }
}

/// What was held back: its count and tokens, and with `list_dropped` the
/// list, best first by the scores of `explanation` when there is one (the
/// manifest is in reading order), at most [`MAX_LISTED_DROPPED`].
pub fn held_back(mut d: Vec<DroppedOut>, explanation: Option<&Explanation>, list_dropped: bool) -> DroppedSummary {
    let tokens: u64 = d.iter().map(|d| u64::from(d.tokens)).sum();
    let count = d.len() as u32;
    if !list_dropped {
        return DroppedSummary { count, tokens, listed: Vec::new() };
    }
    if let Some(ex) = explanation {
        let score: HashMap<&str, f32> = ex.dropped.iter().map(|w| (w.id.as_str(), w.score)).collect();
        let s = |c: &DroppedOut| score.get(c.id.as_str()).copied().unwrap_or(f32::MIN);
        d.sort_by(|x, y| s(y).total_cmp(&s(x)));
    }
    d.truncate(MAX_LISTED_DROPPED);
    DroppedSummary { count, tokens, listed: d }
}

/// The view of a follow-up (the core's or the engine's result).
pub fn more_context_view(m: MoreContext) -> MoreOutput {
    MoreOutput {
        chunks: m.chunks.into_iter().map(ChunkOut::from).collect(),
        sent_tokens: m.sent_tokens as u32,
        budget: u32::try_from(m.budget).unwrap_or(u32::MAX),
        session_sent_tokens: m.session_sent_tokens as u32,
        remaining_tokens: u32::try_from(m.remaining_tokens).unwrap_or(u32::MAX),
        reason: m.reason.unwrap_or_default(),
        text: m.text,
    }
}

/// One line before a compression's text: its size, and how to get more
/// (`more`: the surface's own words for a follow-up).
pub fn compress_header(v: &CompressOutput, more: &str) -> String {
    let t = &v.totals;
    let held = if v.dropped.count == 0 {
        "nothing held back".to_string()
    } else {
        format!("{} chunks held back: {more}", v.dropped.count)
    };
    format!(
        "[SCD: {} of {} {} tokens ({:.1}x smaller); {held}]",
        t.sent_tokens, t.context_tokens, t.tokenizer, t.reduction_ratio
    )
}

/// One line before a follow-up's text.
pub fn more_header(v: &MoreOutput) -> String {
    format!(
        "[SCD: {} more tokens of {} asked, {} new chunks; {} sent in this session{}]",
        v.sent_tokens,
        v.budget,
        v.chunks.len(),
        v.session_sent_tokens,
        if v.reason.is_empty() { String::new() } else { format!("; {}", v.reason) }
    )
}
