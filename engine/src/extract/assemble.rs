//! Assemble: the selection in reading order, the dropped manifest and the
//! totals.

use std::collections::HashSet;

use super::prepare::PreparedContext;
use super::{Compressed, DroppedChunk, Scd, Timings, Totals};

impl Scd {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn assemble(
        &self,
        prepared: &PreparedContext,
        selected: &[usize],
        scores: &[f32],
        task_vec: &[f32],
        warnings: Vec<String>,
        ms: (f64, f64, f64),
    ) -> Compressed {
        let chunks = &prepared.chunks;
        let mut sel: Vec<usize> = selected.to_vec();
        sel.sort_unstable();
        let chosen: HashSet<usize> = sel.iter().copied().collect();
        let context_tokens: usize = chunks.iter().map(|c| c.tokens).sum();
        let sent_tokens: usize = sel.iter().map(|&i| chunks[i].tokens).sum();
        let dropped = (0..chunks.len())
            .filter(|i| !chosen.contains(i))
            .map(|i| DroppedChunk {
                field: prepared.field_names[chunks[i].field].clone(),
                id: chunks[i].id.clone(),
                stub: chunks[i].stub.clone(),
                tokens: chunks[i].tokens,
            })
            .collect();
        Compressed {
            chunks: sel.iter().map(|&i| prepared.selected(i, scores[i])).collect(),
            totals: Totals {
                context_tokens,
                sent_tokens,
                reduction_ratio: if sent_tokens == 0 { 0.0 } else { context_tokens as f32 / sent_tokens as f32 },
                r_theorem1: context_tokens as f32 / (sent_tokens + self.encoder.dim()) as f32,
            },
            dropped,
            task_embedding: task_vec.to_vec(),
            warnings,
            withheld: Vec::new(),
            session: None,
            timings: Timings { prepare_ms: ms.0, task_embed_ms: ms.1, select_ms: ms.2 },
        }
    }
}
