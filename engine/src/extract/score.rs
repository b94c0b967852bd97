//! Score: dense and lexical z-scores fused, lifted by a chunk's group and
//! by links (documents and definitions the task or the top chunks name).

use std::collections::{HashMap, HashSet};

use super::parts::{Link, Scores};
use super::prepare::{Prepared, PreparedContext};
use super::Scd;
use crate::cancel::Cancel;
use crate::encoder::InputKind;
use crate::score::{dot, zscores};
use crate::Result;

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
    /// Fused, calibrated scores of every chunk for `query`, with links, and
    /// their parts.
    pub(super) fn score(&self, ctx: &PreparedContext, query_vec: &[f32], query: &str) -> Scores {
        let chunks = &ctx.chunks;
        if chunks.is_empty() {
            return Scores::default();
        }
        let dense = self.dense(ctx, query_vec);
        let bm25 = ctx.bm25.scores(query);
        let (zd, zl) = (zscores(&dense), zscores(&bm25));
        let mut s: Vec<f32> = zd.iter().zip(&zl).map(|(d, l)| d + self.cfg.scoring.lexical_weight * l).collect();
        // a group's best chunk lifts the rest of its group (a paragraph's
        // pronoun sentences, a question's answer, a table's columns)
        let mut best: HashMap<(usize, usize), f32> = HashMap::new();
        for (c, &v) in chunks.iter().zip(&s) {
            let e = best.entry(c.group).or_insert(f32::MIN);
            *e = e.max(v);
        }
        // a cut function's best is its signature's, which is embedded with
        // the whole function: its group lifts it as the function uncut would
        // be lifted, whatever its pieces score
        for (g, &signature) in &ctx.cut_functions {
            best.insert(*g, s[signature]);
        }
        let group_best: Vec<f32> = chunks.iter().map(|c| best[&c.group]).collect();
        let group_lift: Vec<f32> = group_best.iter().map(|b| self.cfg.scoring.field_weight * b).collect();
        for (v, g) in s.iter_mut().zip(&group_lift) {
            *v += g;
        }
        let (link_lift, link) = self.links(ctx, &s, query);
        for ((v, l), k) in s.iter_mut().zip(&link_lift).zip(&link) {
            if *k != Link::None {
                *v += *l;
            }
        }
        Scores {
            fused: s,
            dense_z: zd,
            lexical_z: zl,
            group_lift,
            link_lift,
            hop_lift: Vec::new(),
            dense,
            group_best,
            link,
            hop_z: Vec::new(),
            rerank_lift: Vec::new(),
        }
    }

    /// Every chunk's cosine similarity to the query: exact, or with an
    /// HNSW index exact for its candidates and just below them for the rest.
    fn dense(&self, ctx: &PreparedContext, query_vec: &[f32]) -> Vec<f32> {
        let chunks = &ctx.chunks;
        match &ctx.index {
            None => chunks.iter().map(|c| dot(query_vec, &c.embedding)).collect(),
            Some(index) => {
                // exact scores for the HNSW candidates; the rest sit just below them
                let cand = index.search(query_vec, self.cfg.prepare.hnsw_candidates);
                let mut d = vec![f32::NAN; chunks.len()];
                for i in cand {
                    d[i] = dot(query_vec, &chunks[i].embedding);
                }
                let floor = d.iter().copied().filter(|x| !x.is_nan()).fold(f32::INFINITY, f32::min)
                    - self.cfg.prepare.hnsw_floor_margin;
                d.iter_mut().filter(|x| x.is_nan()).for_each(|x| *x = floor);
                d
            }
        }
    }

    /// What links lift each chunk, and which link it is, given the scores
    /// `s` so far (they pick the top chunks whose words link).
    fn links(&self, ctx: &PreparedContext, s: &[f32], query: &str) -> (Vec<f32>, Vec<Link>) {
        let chunks = &ctx.chunks;
        // links: documents (prose fields) named by the query or by the top
        // chunks (bridge facts), and chunks defining a name they mention (a
        // function in a log line, a table in a question)
        let mut order: Vec<usize> = (0..chunks.len()).collect();
        order.sort_by(|&a, &b| s[b].total_cmp(&s[a]));
        let top: Vec<usize> = order.iter().take(self.cfg.scoring.link_sources).copied().collect();
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
        // and by structure, in code: the methods of a type a top chunk
        // defines (the struct whose doc the task paraphrases), through the
        // header of the container they sit in
        let top_names: HashSet<&str> = top_defines.iter().map(|&(_, d)| d).collect();
        let owners: HashMap<(usize, usize), &[String]> =
            chunks.iter().filter(|c| c.lead && c.rides).map(|c| (c.group, c.defines.as_slice())).collect();
        let owned_by_top = |c: &Prepared| {
            !c.rides && owners.get(&c.group).is_some_and(|ds| ds.iter().any(|d| top_names.contains(d.as_str())))
        };
        // a defined name that is a plain word many chunks of its field use
        // (`left`, `both`, `name`) is no evidence that the task means it
        let mut common: HashMap<(usize, String), bool> = HashMap::new();
        let limit = self.cfg.scoring.common_name_chunks;
        let mut distinctive = |field: usize, key: &str| {
            limit == 0
                || !key.chars().all(char::is_alphabetic)
                || !*common.entry((field, key.to_string())).or_insert_with(|| {
                    chunks.iter().filter(|c| c.field == field && mentions(&c.lower, key)).take(limit + 1).count()
                        > limit
                })
        };
        let mut link_lift = vec![0.0; chunks.len()];
        let mut link = vec![Link::None; chunks.len()];
        for ((c, l), k) in chunks.iter().zip(link_lift.iter_mut()).zip(link.iter_mut()) {
            if linked_fields.contains(&c.field) {
                *l = self.cfg.scoring.link_weight * if c.lead { self.cfg.scoring.lead_link_bonus } else { 1.0 };
                *k = Link::Title;
            } else if c.defines.iter().any(|d| named_by(d, c.field) && distinctive(c.field, d)) {
                *l = self.cfg.scoring.link_weight * self.cfg.scoring.lead_link_bonus;
                *k = Link::Defined;
            } else if top_defines.iter().any(|&(f, d)| f != c.field && mentions(&c.lower, d) && distinctive(f, d)) {
                *l = self.cfg.scoring.link_weight;
                *k = Link::Mention;
            } else if self.cfg.scoring.owner_link_weight > 0.0 && owned_by_top(c) {
                *l = self.cfg.scoring.owner_link_weight;
                *k = Link::Owner;
            }
        }
        (link_lift, link)
    }

    /// Siblings told apart: of two code definitions whose names differ in
    /// one word (`timestamp_millis`, `timestamp_seconds`), the one whose
    /// differing word the query names (a query word starting with it, or
    /// it with a query word of 4 letters or more: `millis`,
    /// "milliseconds") gains
    /// `sibling_weight` when the other's word is not named. Their docs
    /// are often near copies, so the dense score alone picks at random.
    pub(super) fn sibling_lift(&self, ctx: &PreparedContext, query: &str) -> Vec<f32> {
        let w = self.cfg.scoring.sibling_weight;
        let mut lift = vec![0.0; ctx.chunks.len()];
        if w == 0.0 {
            return lift;
        }
        let words = |s: &str| -> Vec<String> {
            s.split(|c: char| !c.is_alphanumeric()).filter(|t| !t.is_empty()).map(str::to_lowercase).collect()
        };
        let asked = words(query);
        // a task word starting with the name's word (`millis`:
        // "milliseconds"), or a longer one the name's word starts with
        // (`seconds`: "secs"); short words ("the", "for") name nothing
        let named = |word: &str| {
            word.chars().count() >= 3
                && asked.iter().any(|q| {
                    (q.chars().count() >= 3 && q.starts_with(word))
                        || (q.chars().count() >= 4 && word.starts_with(q.as_str()))
                })
        };
        // (field, the name with one word blanked) -> (chunk, its word there)
        type Bucket<'a> = (usize, Vec<&'a str>);
        let mut buckets: HashMap<Bucket, Vec<(usize, String)>> = HashMap::new();
        let names: Vec<Vec<String>> =
            ctx.chunks.iter().map(|c| c.defines.first().map(|d| words(d)).unwrap_or_default()).collect();
        for (i, c) in ctx.chunks.iter().enumerate() {
            let ws = &names[i];
            if ctx.is_prose(c.field) || c.rides || ws.len() < 2 {
                continue;
            }
            for p in 0..ws.len() {
                let mut key: Vec<&str> = ws.iter().map(String::as_str).collect();
                key[p] = "";
                buckets.entry((c.field, key)).or_default().push((i, ws[p].clone()));
            }
        }
        for members in buckets.values().filter(|m| m.len() >= 2) {
            let hits: Vec<bool> = members.iter().map(|(_, word)| named(word)).collect();
            if hits.iter().any(|h| *h) && hits.iter().any(|h| !*h) {
                for ((i, _), _) in members.iter().zip(&hits).filter(|(_, h)| **h) {
                    lift[*i] = w;
                }
            }
        }
        lift
    }

    /// `query` (the task, a space, then the bridge chunks' text) within
    /// `second_hop_max_tokens`: whole when it fits, else cut at the last word
    /// boundary that fits (found by bisection over the boundaries after the
    /// task); None when not one word of chunk text fits.
    fn capped_hop_query<'q>(&self, task: &str, query: &'q str) -> Result<Option<&'q str>> {
        let cap = self.cfg.scoring.second_hop_max_tokens;
        if self.encoder.count_tokens(query)? <= cap {
            return Ok(Some(query));
        }
        let ends: Vec<usize> = query[task.len()..]
            .char_indices()
            .filter(|(_, c)| c.is_whitespace())
            .map(|(i, _)| task.len() + i)
            .filter(|&e| e > task.len())
            .collect();
        let (mut lo, mut hi, mut best) = (0, ends.len(), None);
        while lo < hi {
            let mid = (lo + hi) / 2;
            if self.encoder.count_tokens(&query[..ends[mid]])? <= cap {
                best = Some(&query[..ends[mid]]);
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        Ok(best)
    }

    /// The second hop of a multi-hop question: the task embedded again with
    /// the texts of its best chunks from different groups, so a fact that
    /// only the bridge entity connects to the task (the second paragraph of
    /// "where was the director of X born") rises. Adds
    /// `second_hop_weight` × the dense z-scores against that query, taken
    /// among the chunks outside the sources' groups (which gain nothing).
    pub(super) fn second_hop(
        &self,
        ctx: &PreparedContext,
        task: &str,
        parts: &mut Scores,
        cancel: &Cancel,
    ) -> Result<()> {
        let (w, sources) = (self.cfg.scoring.second_hop_weight, self.cfg.scoring.second_hop_sources);
        let chunks = &ctx.chunks;
        // documents only: a bridge entity links paragraphs, not functions
        let prose = |i: &usize| ctx.is_prose(chunks[*i].field);
        if w == 0.0 || sources == 0 || (0..chunks.len()).filter(prose).count() < 2 {
            return Ok(());
        }
        let scores = &mut parts.fused;
        let mut order: Vec<usize> = (0..chunks.len()).filter(prose).collect();
        order.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]));
        let mut groups = HashSet::new();
        let mut query = task.to_string();
        for &i in &order {
            if groups.len() >= sources {
                break;
            }
            if groups.insert(chunks[i].group) {
                query.push(' ');
                query.push_str(&chunks[i].text);
            }
        }
        let Some(query) = self.capped_hop_query(task, &query)? else { return Ok(()) };
        let v = self.embed_cached_with(&[query], InputKind::Query, cancel)?.remove(0);
        // z-scores among the other chunks: the sources match their own
        // text best and would otherwise flatten everyone else's
        let rest: Vec<usize> = (0..chunks.len()).filter(|i| prose(i) && !groups.contains(&chunks[*i].group)).collect();
        let dense: Vec<f32> = rest.iter().map(|&i| dot(&v, &chunks[i].embedding)).collect();
        parts.hop_lift = vec![0.0; chunks.len()];
        parts.hop_z = vec![0.0; chunks.len()];
        for (&i, z) in rest.iter().zip(zscores(&dense)) {
            scores[i] += w * z;
            parts.hop_lift[i] = w * z;
            parts.hop_z[i] = z;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use crate::cancel::Cancel;
    use crate::context::{Field, FieldKind};
    use crate::encoder::HashEncoder;
    use crate::extract::parts::Link;
    use crate::extract::prepare::PreparedContext;
    use crate::extract::{Scd, ScdConfig, ScoringConfig};

    #[test]
    fn the_parts_add_up_to_the_fused_score() {
        let scd = Scd::new(Arc::new(HashEncoder::new(64, 512)), ScdConfig::default());
        let fields = [
            Field {
                name: "Paris".into(),
                kind: FieldKind::Prose,
                confidential: false,
                content: "Paris is the capital of France. It lies on the Seine. The Louvre is there.".into(),
            },
            Field {
                name: "notes".into(),
                kind: FieldKind::Prose,
                confidential: false,
                content: "Lunch is at noon. We visited Paris in May. The train was late.".into(),
            },
        ];
        let refs: Vec<&Field> = fields.iter().collect();
        let ctx = scd.prepare(&refs, &Cancel::new()).unwrap();
        let query = "what river runs through paris";
        let qv = scd.embed_cached(&[query], crate::encoder::InputKind::Query).unwrap().remove(0);
        let s = scd.score(&ctx, &qv, query);
        assert_eq!(s.fused.len(), ctx.chunks.len());
        let w = scd.config().scoring.lexical_weight;
        for i in 0..s.fused.len() {
            let sum = s.dense_z[i] + w * s.lexical_z[i] + s.group_lift[i] + s.link_lift[i];
            assert_eq!(sum, s.fused[i], "chunk {i}");
        }
        // the query names the document "Paris": its chunks get a link lift
        assert!(s.link_lift.iter().any(|&l| l > 0.0));
        assert!(s.group_lift.iter().any(|&g| g != 0.0));
    }

    #[test]
    fn the_methods_of_a_type_a_top_chunk_defines_get_the_owner_link() {
        let cfg =
            ScdConfig { scoring: ScoringConfig { link_sources: 1, ..Default::default() }, ..ScdConfig::default() };
        let scd = Scd::new(Arc::new(HashEncoder::new(64, 512)), cfg);
        let strukt = "/// A ring buffer of bytes.\nstruct Ring {\n    bytes: Vec<u8>,\n}";
        let code = format!(
            "{strukt}\n\nimpl Ring {{\n    fn push_byte(&mut self, b: u8) {{\n        self.bytes.push(b);\n    }}\n\n    \
             fn drain_all(&mut self) {{\n        self.bytes.clear();\n    }}\n}}\n\nimpl Other {{\n    fn spin(&self) {{}}\n}}\n"
        );
        let fields = [Field { name: "ring.rs".into(), kind: FieldKind::Code, confidential: false, content: code }];
        let refs: Vec<&Field> = fields.iter().collect();
        let ctx = scd.prepare(&refs, &Cancel::new()).unwrap();
        let qv = scd.embed_cached(&[strukt], crate::encoder::InputKind::Query).unwrap().remove(0);
        let at = |prefix: &str| ctx.chunks.iter().position(|c| c.text.starts_with(prefix)).unwrap();
        let owner = scd.config().scoring.owner_link_weight;
        assert!(owner > 0.0);
        let s = scd.score(&ctx, &qv, strukt);
        // the struct is the top chunk; its impl's methods gain the owner link, the other impl's do not
        let top = (0..s.fused.len()).max_by(|&a, &b| s.fused[a].total_cmp(&s.fused[b])).unwrap();
        assert_eq!(top, at("/// A ring buffer"));
        assert_eq!(s.link_lift[at("fn push_byte")], owner);
        assert_eq!(s.link_lift[at("fn drain_all")], owner);
        assert_eq!(s.link_lift[at("fn spin")], 0.0);
        // off: nothing
        let scd = Scd::new(
            Arc::new(HashEncoder::new(64, 512)),
            ScdConfig {
                scoring: ScoringConfig { link_sources: 1, owner_link_weight: 0.0, ..Default::default() },
                ..ScdConfig::default()
            },
        );
        let ctx = scd.prepare(&refs, &Cancel::new()).unwrap();
        let s = scd.score(&ctx, &qv, strukt);
        assert_eq!(s.link_lift[at("fn push_byte")], 0.0);
    }

    fn code_context(scd: &Scd, code: &str) -> Arc<PreparedContext> {
        let fields =
            [Field { name: "lib.rs".into(), kind: FieldKind::Code, confidential: false, content: code.into() }];
        let refs: Vec<&Field> = fields.iter().collect();
        scd.prepare(&refs, &Cancel::new()).unwrap()
    }

    #[test]
    fn a_plain_word_many_chunks_use_gets_no_definition_link() {
        // `left` is defined once and used by four other functions; `rotate_left` once
        let code = "fn left(n: usize) -> usize {\n    n * 2\n}\n\n\
                    fn walk(n: usize) -> usize {\n    left(n)\n}\n\n\
                    fn hop(n: usize) -> usize {\n    left(n) + 1\n}\n\n\
                    fn skip(n: usize) -> usize {\n    left(left(n))\n}\n\n\
                    fn spin(n: usize) -> usize {\n    left(n) - 1\n}\n\n\
                    fn rotate_left(n: usize) -> usize {\n    n.rotate_left(1)\n}\n";
        let query = "the index of the left child, and rotate_left";
        let at =
            |ctx: &PreparedContext, prefix: &str| ctx.chunks.iter().position(|c| c.text.starts_with(prefix)).unwrap();
        let scd = Scd::new(Arc::new(HashEncoder::new(64, 512)), ScdConfig::default());
        assert_eq!(scd.config().scoring.common_name_chunks, 3);
        let ctx = code_context(&scd, code);
        let qv = scd.embed_cached(&[query], crate::encoder::InputKind::Query).unwrap().remove(0);
        let s = scd.score(&ctx, &qv, query);
        assert_eq!(s.link[at(&ctx, "fn left")], Link::None, "five chunks of the file say `left`");
        assert_eq!(s.link[at(&ctx, "fn rotate_left")], Link::Defined, "not a plain word: it links");
        // off: the plain word links too
        let scd = Scd::new(
            Arc::new(HashEncoder::new(64, 512)),
            ScdConfig {
                scoring: ScoringConfig { common_name_chunks: 0, ..Default::default() },
                ..ScdConfig::default()
            },
        );
        let ctx = code_context(&scd, code);
        let s = scd.score(&ctx, &qv, query);
        assert_eq!(s.link[at(&ctx, "fn left")], Link::Defined);
    }

    #[test]
    fn of_two_siblings_the_one_whose_word_the_task_names_is_lifted() {
        let code = "/// The time since the epoch.\nfn timestamp_millis() -> u64 {\n    0\n}\n\n\
                    /// The time since the epoch.\nfn timestamp_seconds() -> u64 {\n    0\n}\n\n\
                    fn other_thing() -> u64 {\n    1\n}\n";
        let scd = Scd::new(Arc::new(HashEncoder::new(64, 512)), ScdConfig::default());
        let ctx = code_context(&scd, code);
        let at = |prefix: &str| ctx.chunks.iter().position(|c| c.text.contains(prefix)).unwrap();
        let (millis, seconds, other) = (at("fn timestamp_millis"), at("fn timestamp_seconds"), at("fn other_thing"));
        let w = scd.config().scoring.sibling_weight;
        assert!(w > 0.0);
        let lifted = |query: &str| scd.sibling_lift(&ctx, query);
        // "milliseconds" starts with `millis`; nothing says `seconds` alone
        let v = lifted("the time since the epoch in milliseconds");
        assert_eq!((v[millis], v[seconds], v[other]), (w, 0.0, 0.0));
        let v = lifted("whole seconds since the epoch");
        assert_eq!((v[millis], v[seconds]), (0.0, w));
        // both named, or neither: no lift
        assert!(lifted("millis or seconds since the epoch").iter().all(|x| *x == 0.0));
        assert!(lifted("the time since the epoch").iter().all(|x| *x == 0.0));
        // off
        let scd = Scd::new(
            Arc::new(HashEncoder::new(64, 512)),
            ScdConfig { scoring: ScoringConfig { sibling_weight: 0.0, ..Default::default() }, ..ScdConfig::default() },
        );
        assert!(scd.sibling_lift(&ctx, "in milliseconds").iter().all(|x| *x == 0.0));
    }
}
