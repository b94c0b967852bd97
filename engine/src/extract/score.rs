//! Score: dense and lexical z-scores fused, lifted by a chunk's group and
//! by links (documents and definitions the task or the top chunks name).

use std::collections::{HashMap, HashSet};

use super::prepare::PreparedContext;
use super::Scd;
use crate::score::{dot, zscores};

fn mentions(haystack_lower: &str, key: &str) -> bool {
    if key.chars().count() < 3 {
        return false;
    }
    let mut from = 0;
    while let Some(i) = haystack_lower[from..].find(key) {
        let s = from + i;
        let e = s + key.len();
        let before = haystack_lower[..s].chars().next_back().is_none_or(|c| !c.is_alphanumeric());
        let after = haystack_lower[e..].chars().next().is_none_or(|c| !c.is_alphanumeric());
        if before && after {
            return true;
        }
        from = e;
    }
    false
}

impl Scd {
    /// Fused, calibrated scores of every chunk for `query`, with links.
    pub(super) fn score(&self, ctx: &PreparedContext, query_vec: &[f32], query: &str) -> Vec<f32> {
        let chunks = &ctx.chunks;
        if chunks.is_empty() {
            return Vec::new();
        }
        let dense: Vec<f32> = match &ctx.index {
            None => chunks.iter().map(|c| dot(query_vec, &c.embedding)).collect(),
            Some(index) => {
                // exact scores for the HNSW candidates; the rest sit just below them
                let cand = index.search(query_vec, self.cfg.hnsw_candidates);
                let mut d = vec![f32::NAN; chunks.len()];
                for i in cand {
                    d[i] = dot(query_vec, &chunks[i].embedding);
                }
                let floor = d.iter().copied().filter(|x| !x.is_nan()).fold(f32::INFINITY, f32::min)
                    - self.cfg.hnsw_floor_margin;
                d.iter_mut().filter(|x| x.is_nan()).for_each(|x| *x = floor);
                d
            }
        };
        let bm25 = ctx.bm25.scores(query);
        let (zd, zl) = (zscores(&dense), zscores(&bm25));
        let mut s: Vec<f32> = zd.iter().zip(&zl).map(|(d, l)| d + self.cfg.lexical_weight * l).collect();
        // a group's best chunk lifts the rest of its group (a paragraph's
        // pronoun sentences, a question's answer, a table's columns)
        let mut best: HashMap<(usize, usize), f32> = HashMap::new();
        for (c, &v) in chunks.iter().zip(&s) {
            let e = best.entry(c.group).or_insert(f32::MIN);
            *e = e.max(v);
        }
        for (c, v) in chunks.iter().zip(s.iter_mut()) {
            *v += self.cfg.field_weight * best[&c.group];
        }
        // links: documents (prose fields) named by the query or by the top
        // chunks (bridge facts), and chunks defining a name they mention (a
        // function in a log line, a table in a question)
        let mut order: Vec<usize> = (0..chunks.len()).collect();
        order.sort_by(|&a, &b| s[b].total_cmp(&s[a]));
        let top: Vec<usize> = order.iter().take(self.cfg.link_sources).copied().collect();
        let query_lower = query.to_lowercase();
        let top_text: Vec<(usize, &str)> = top.iter().map(|&i| (chunks[i].field, chunks[i].lower.as_str())).collect();
        let named_by = |key: &str, own_field: usize| {
            mentions(&query_lower, key) || top_text.iter().any(|(f, t)| *f != own_field && mentions(t, key))
        };
        let linked_fields: HashSet<usize> = ctx
            .field_keys
            .iter()
            .enumerate()
            .filter(|(fi, key)| key.as_deref().is_some_and(|k| named_by(k, *fi)))
            .map(|(fi, _)| fi)
            .collect();
        // and the other way: chunks of other fields that mention a name a
        // top chunk defines (the log line naming the function, the question
        // naming the table)
        let top_defines: Vec<(usize, &str)> =
            top.iter().flat_map(|&i| chunks[i].defines.iter().map(move |d| (chunks[i].field, d.as_str()))).collect();
        for (c, v) in chunks.iter().zip(s.iter_mut()) {
            if linked_fields.contains(&c.field) {
                *v += self.cfg.link_weight * if c.lead { self.cfg.lead_link_bonus } else { 1.0 };
            } else if c.defines.iter().any(|d| named_by(d, c.field)) {
                *v += self.cfg.link_weight * self.cfg.lead_link_bonus;
            } else if top_defines.iter().any(|&(f, d)| f != c.field && mentions(&c.lower, d)) {
                *v += self.cfg.link_weight;
            }
        }
        s
    }
}
