//! Assemble: the selection in reading order, the dropped manifest, the
//! totals and, when asked, the explanation.

use std::collections::HashSet;

use super::pack::PackTrace;
use super::parts::Scores;
use super::prepare::PreparedContext;
use super::{ChunkWhy, Compressed, Counting, DropReason, DropWhy, DroppedChunk, Explanation, Scd, Timings, Totals};

/// The totals a request counted: the context, what was sent (`None`: the
/// sum of the chunk counts), the budget, and what the session sent before
/// (neither sent again nor listed as dropped).
pub(super) struct Sums<'a> {
    pub(super) context_tokens: usize,
    pub(super) sent_tokens: Option<usize>,
    pub(super) budget: usize,
    pub(super) already: &'a HashSet<usize>,
}

/// Where a chunk stood before packing.
pub(super) enum Gate {
    /// Its field is required.
    Required,
    /// Its field is not listed as optional.
    NotEligible,
    /// Under the named threshold, with its value.
    Below(&'static str, f32),
    /// Packing considered it.
    Candidate,
}

fn ratio(a: usize, b: usize) -> f32 {
    if b == 0 {
        0.0
    } else {
        a as f32 / b as f32
    }
}

impl Scd {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn assemble(
        &self,
        prepared: &PreparedContext,
        selected: &[usize],
        scores: &Scores,
        counting: &Counting,
        sums: Sums<'_>,
        task_vec: &[f32],
        warnings: Vec<String>,
        ms: (f64, f64, f64),
    ) -> Compressed {
        let chunks = &prepared.chunks;
        let tokens = &counting.tokens;
        let mut sel: Vec<usize> = selected.to_vec();
        sel.sort_unstable();
        let chosen: HashSet<usize> = sel.iter().copied().collect();
        let context_tokens = sums.context_tokens;
        let sent_tokens = sums.sent_tokens.unwrap_or_else(|| sel.iter().map(|&i| tokens[i]).sum());
        let dropped = (0..chunks.len())
            .filter(|i| !chosen.contains(i) && !sums.already.contains(i))
            .map(|i| DroppedChunk {
                field: prepared.field_names[chunks[i].field].clone(),
                id: chunks[i].id.clone(),
                stub: chunks[i].stub.clone(),
                tokens: tokens[i],
            })
            .collect();
        Compressed {
            chunks: sel.iter().map(|&i| prepared.selected(i, scores.fused[i], tokens[i])).collect(),
            totals: Totals {
                context_tokens,
                sent_tokens,
                reduction_ratio: ratio(context_tokens, sent_tokens),
                r_theorem1: context_tokens as f32 / (sent_tokens + self.encoder.dim()) as f32,
                tokenizer: counting.name(),
                requested_ratio: ratio(context_tokens, sums.budget),
            },
            dropped,
            task_embedding: task_vec.to_vec(),
            warnings,
            withheld: Vec::new(),
            session: None,
            timings: Timings { prepare_ms: ms.0, task_embed_ms: ms.1, select_ms: ms.2, hop_embed_ms: 0.0 },
            explanation: None,
            margins: Vec::new(),
            text: String::new(),
        }
    }

    /// Why each chunk was sent (`selected` in packing order) or dropped.
    pub(super) fn explain(
        &self,
        prepared: &PreparedContext,
        selected: &[usize],
        scores: &Scores,
        counting: &Counting,
        trace: &PackTrace,
        gate: impl Fn(usize) -> Gate,
    ) -> Explanation {
        let chunks = &prepared.chunks;
        let mut reading: Vec<(usize, usize)> = selected.iter().enumerate().map(|(k, &i)| (i, k + 1)).collect();
        reading.sort_unstable();
        let chosen: HashSet<usize> = selected.iter().copied().collect();
        let selected = reading
            .into_iter()
            .map(|(i, order)| ChunkWhy {
                id: chunks[i].id.clone(),
                order,
                score: scores.fused[i],
                dense_z: scores.dense_z[i],
                lexical_z: scores.lexical_z[i],
                group_lift: scores.group_lift[i],
                link_lift: scores.link_lift[i],
                hop_lift: scores.hop_lift.get(i).copied().unwrap_or(0.0),
                rerank_lift: scores.rerank_lift.get(i).copied().unwrap_or(0.0),
                lead: chunks[i].lead,
                by_closure: trace.by_closure.contains(&i),
                required: matches!(gate(i), Gate::Required),
                tokens: counting.tokens[i],
                chunker: Some(chunks[i].chunker.to_string()),
            })
            .collect();
        let mut dropped: Vec<DropWhy> = (0..chunks.len())
            .filter(|i| !chosen.contains(i))
            .map(|i| DropWhy {
                id: chunks[i].id.clone(),
                score: scores.fused[i],
                tokens: counting.tokens[i],
                reason: match gate(i) {
                    Gate::NotEligible => DropReason::NotEligible,
                    Gate::Below(threshold, value) => DropReason::BelowThreshold { threshold, value },
                    // required chunks are all sent; a candidate packing left out
                    Gate::Required | Gate::Candidate => match trace.duplicate_of.get(&i) {
                        Some(&of) if chosen.contains(&of) => DropReason::NearDuplicate { of: chunks[of].id.clone() },
                        _ if chunks[i].rides => DropReason::StructureOnly,
                        _ => DropReason::OutOfBudget,
                    },
                },
            })
            .collect();
        dropped.sort_by(|a, b| b.score.total_cmp(&a.score));
        Explanation { lexical_weight: self.lexical_weight(), selected, dropped }
    }
}
