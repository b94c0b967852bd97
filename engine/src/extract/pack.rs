//! Pack: greedy by score under the budget, skipping near-duplicates of
//! what is sent and bringing each chunk's group lead (a container's header
//! comes only that way).

use std::collections::{HashMap, HashSet};

use super::prepare::PreparedContext;
use super::Scd;

/// What packing decided beyond the selection, for explanations.
#[derive(Debug, Default)]
pub(super) struct PackTrace {
    /// Chunks taken because a chunk of their group was (closure: its lead
    /// and a container's closing line, or the rest of a small group).
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
        // a container's closing line (`}`), which comes with its header
        let closings: HashMap<(usize, usize), usize> =
            chunks.iter().enumerate().filter(|(_, c)| c.rides && !c.lead).map(|(i, c)| (c.group, i)).collect();
        // each prose group's chunks and tokens (a paragraph), when closing
        // whole groups is on
        let mut members: HashMap<(usize, usize), (Vec<usize>, usize)> = HashMap::new();
        if self.cfg.group_closure_tokens > 0 {
            for (j, c) in chunks.iter().enumerate().filter(|(_, c)| ctx.is_prose(c.field)) {
                let e = members.entry(c.group).or_default();
                e.0.push(j);
                e.1 += cost[j];
            }
        }
        for &i in order {
            // a container's header or closing line comes only with a member
            if chosen.contains(&i) || chunks[i].rides || *used + cost[i] > budget {
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
            // closure: a chunk brings the rest of a small group (a short
            // paragraph) when all of it fits, else its group's lead (a
            // paragraph's first sentence, a chat answer's question)
            let g = chunks[i].group;
            let rest: Vec<usize> = match members.get(&g) {
                Some((m, t)) if *t <= self.cfg.group_closure_tokens => {
                    m.iter().copied().filter(|j| !chosen.contains(j)).collect()
                }
                _ => Vec::new(),
            };
            let rest_cost: usize = rest.iter().map(|&j| cost[j]).sum();
            let closure = if !rest.is_empty() && *used + rest_cost <= budget {
                rest
            } else {
                // the lead, then a container's closing line once its header is in
                let mut c = Vec::new();
                let lead = leads.get(&g).copied();
                if let Some(l) = lead.filter(|l| !chosen.contains(l) && *used + cost[*l] <= budget) {
                    c.push(l);
                }
                let extra: usize = c.iter().map(|&j| cost[j]).sum();
                let header_in = lead.is_some_and(|l| chosen.contains(&l) || c.contains(&l));
                let closing = closings.get(&g).copied();
                if let Some(e) =
                    closing.filter(|e| header_in && !chosen.contains(e) && *used + extra + cost[*e] <= budget)
                {
                    c.push(e);
                }
                c
            };
            for j in closure {
                sent.entry(ctx.distinct[j]).or_insert(j);
                chosen.insert(j);
                selected.push(j);
                *used += cost[j];
                trace.by_closure.insert(j);
            }
        }
    }
}
