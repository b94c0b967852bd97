//! Pack: greedy by score under the budget, skipping near-duplicates of
//! what is sent and bringing each chunk's group lead.

use std::collections::{HashMap, HashSet};

use super::prepare::PreparedContext;
use super::Scd;

impl Scd {
    /// Greedy packing by score with redundancy suppression and group closure.
    pub(super) fn pack(
        &self,
        ctx: &PreparedContext,
        order: &[usize],
        budget: usize,
        selected: &mut Vec<usize>,
        used: &mut usize,
    ) {
        let chunks = &ctx.chunks;
        let mut chosen: HashSet<usize> = selected.iter().copied().collect();
        // the distinct embeddings already sent: a chunk identical or near to one is redundant
        let mut sent: HashSet<u32> = selected.iter().map(|&i| ctx.distinct[i]).collect();
        let leads: HashMap<(usize, usize), usize> =
            chunks.iter().enumerate().filter(|(_, c)| c.lead).map(|(i, c)| (c.group, i)).collect();
        for &i in order {
            if chosen.contains(&i) || *used + chunks[i].tokens > budget {
                continue;
            }
            let d = ctx.distinct[i];
            let redundant = sent.contains(&d) || ctx.near_duplicates[d as usize].iter().any(|j| sent.contains(j));
            if redundant {
                continue;
            }
            sent.insert(d);
            chosen.insert(i);
            selected.push(i);
            *used += chunks[i].tokens;
            // closure: a chunk brings its group's lead (a paragraph's first
            // sentence, a chat answer's question) when that fits
            if let Some(&l) = leads.get(&chunks[i].group) {
                if !chosen.contains(&l) && *used + chunks[l].tokens <= budget {
                    sent.insert(ctx.distinct[l]);
                    chosen.insert(l);
                    selected.push(l);
                    *used += chunks[l].tokens;
                }
            }
        }
    }
}
