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
        // each group's chunks and tokens, when closing whole groups is on
        let mut members: HashMap<(usize, usize), (Vec<usize>, usize)> = HashMap::new();
        if self.cfg.group_closure_tokens > 0 {
            for (j, c) in chunks.iter().enumerate() {
                let e = members.entry(c.group).or_default();
                e.0.push(j);
                e.1 += c.tokens;
            }
        }
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
            let rest_tokens: usize = rest.iter().map(|&j| chunks[j].tokens).sum();
            let closure = if !rest.is_empty() && *used + rest_tokens <= budget {
                rest
            } else {
                leads
                    .get(&g)
                    .copied()
                    .filter(|l| !chosen.contains(l) && *used + chunks[*l].tokens <= budget)
                    .into_iter()
                    .collect()
            };
            for j in closure {
                sent.insert(ctx.distinct[j]);
                chosen.insert(j);
                selected.push(j);
                *used += chunks[j].tokens;
            }
        }
    }
}
