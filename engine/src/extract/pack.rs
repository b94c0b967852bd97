//! Pack: greedy by score under the budget, skipping near-duplicates of
//! what is sent and bringing each chunk's group lead.

use std::collections::{HashMap, HashSet};

use super::prepare::PreparedContext;
use super::Scd;

/// What packing decided beyond the selection, for explanations.
#[derive(Debug, Default)]
pub(super) struct PackTrace {
    /// Leads taken because a chunk of their group was (closure).
    pub(super) by_closure: HashSet<usize>,
    /// Chunks skipped as near-duplicates (or copies) of a sent chunk: that chunk.
    pub(super) duplicate_of: HashMap<usize, usize>,
}

impl Scd {
    /// Greedy packing by score with redundancy suppression and group
    /// closure; chunk `i` costs `cost[i]`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn pack(
        &self,
        ctx: &PreparedContext,
        order: &[usize],
        cost: &[usize],
        budget: usize,
        selected: &mut Vec<usize>,
        used: &mut usize,
        trace: &mut PackTrace,
    ) {
        let chunks = &ctx.chunks;
        let mut chosen: HashSet<usize> = selected.iter().copied().collect();
        // the distinct embeddings already sent (with the chunk that sent
        // each): a chunk identical or near to one is redundant
        let mut sent: HashMap<u32, usize> = selected.iter().map(|&i| (ctx.distinct[i], i)).collect();
        let leads: HashMap<(usize, usize), usize> =
            chunks.iter().enumerate().filter(|(_, c)| c.lead).map(|(i, c)| (c.group, i)).collect();
        for &i in order {
            if chosen.contains(&i) || *used + cost[i] > budget {
                continue;
            }
            let d = ctx.distinct[i];
            let twin = sent.get(&d).or_else(|| ctx.near_duplicates[d as usize].iter().find_map(|j| sent.get(j)));
            if let Some(&of) = twin {
                trace.duplicate_of.insert(i, of);
                continue;
            }
            sent.insert(d, i);
            chosen.insert(i);
            selected.push(i);
            *used += cost[i];
            // closure: a chunk brings its group's lead (a paragraph's first
            // sentence, a chat answer's question) when that fits
            if let Some(&l) = leads.get(&chunks[i].group) {
                if !chosen.contains(&l) && *used + cost[l] <= budget {
                    sent.entry(ctx.distinct[l]).or_insert(l);
                    chosen.insert(l);
                    selected.push(l);
                    *used += cost[l];
                    trace.by_closure.insert(l);
                }
            }
        }
    }
}
