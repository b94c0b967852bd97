//! Minimal sufficient context extraction (paper §6.2 step 3) and adaptive
//! context requests (§6.3).
//!
//! ```
//! use std::sync::Arc;
//! use scd_engine::context::{Context, ContextRequirement, Field, FieldKind, Task};
//! use scd_engine::encoder::HashEncoder;
//! use scd_engine::extract::{CompressRequest, Scd, ScdConfig};
//!
//! let scd = Scd::new(Arc::new(HashEncoder::new(256, 512)), ScdConfig::default());
//! let context = Context { fields: vec![Field {
//!     name: "notes".into(), kind: FieldKind::Prose, confidential: false,
//!     content: "The payment service timed out. The office plants need water. Lunch is at noon.".into(),
//! }]};
//! let out = scd.compress(&CompressRequest {
//!     task: Task::new("why did the payment service time out"),
//!     context, requirement: ContextRequirement::with_budget(8), session_id: None,
//! }).unwrap();
//! assert_eq!(out.chunks[0].text, "The payment service timed out.");
//! assert!(out.totals.sent_tokens <= 8);
//! ```

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;
use tracing::{debug, instrument};

use crate::cache::{CacheStats, EmbeddingCache};
use crate::cancel::Cancel;
use crate::chunk::{chunk_field, ChunkConfig};
use crate::context::{Context, ContextRequirement, Task};
use crate::encoder::{EncodeOptions, Encoder, InputKind};
use crate::index::{HnswIndex, HnswParams};
use crate::score::{dot, zscores, Bm25};
use crate::{Error, Result};

/// Tuning and limits of the extractor.
#[derive(Debug, Clone)]
pub struct ScdConfig {
    /// How fields are chunked.
    pub chunk: ChunkConfig,
    /// Embedding cache bound in bytes.
    pub cache_bytes: usize,
    /// Largest budget a request may ask for.
    pub max_budget_tokens: usize,
    /// Weight of the lexical (BM25) z-score beside the dense one.
    pub lexical_weight: f32,
    /// Weight of a field's best chunk score added to each of its chunks.
    pub field_weight: f32,
    /// Bonus for chunks of a field that the task or a top chunk names.
    pub link_weight: f32,
    /// Top chunks whose mentions create links.
    pub link_sources: usize,
    /// Chunks this similar (cosine) to a selected one are skipped as redundant.
    pub redundancy_cosine: f32,
    /// Receiver confidence at or above which adaptive requests get nothing (θ_conf).
    pub confidence_threshold: f32,
    /// Session lifetime since last use.
    pub session_ttl: Duration,
    /// Sessions held at once (oldest evicted).
    pub max_sessions: usize,
    /// Prepared contexts (chunks, embeddings, BM25, HNSW) kept for reuse.
    pub max_prepared_contexts: usize,
    /// Contexts with at least this many chunks get an HNSW index; dense
    /// scores are then computed exactly for its candidates only.
    pub hnsw_min_chunks: usize,
    /// Candidates taken from HNSW per query.
    pub hnsw_candidates: usize,
    /// HNSW parameters.
    pub hnsw: HnswParams,
}

impl Default for ScdConfig {
    fn default() -> Self {
        Self {
            chunk: ChunkConfig::default(),
            cache_bytes: 256 << 20,
            max_budget_tokens: 1 << 20,
            lexical_weight: 0.3,
            field_weight: 0.5,
            link_weight: 2.0,
            link_sources: 3,
            redundancy_cosine: 0.985,
            confidence_threshold: 0.7,
            session_ttl: Duration::from_secs(1800),
            max_sessions: 10_000,
            max_prepared_contexts: 32,
            hnsw_min_chunks: 20_000,
            hnsw_candidates: 1024,
            hnsw: HnswParams::default(),
        }
    }
}

/// One compression request.
#[derive(Debug, Clone)]
pub struct CompressRequest {
    /// The task.
    pub task: Task,
    /// The sender's whole context.
    pub context: Context,
    /// What the receiver can take.
    pub requirement: ContextRequirement,
    /// Keep a ledger under this id for adaptive requests.
    pub session_id: Option<String>,
}

/// A chunk sent to the receiver.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SelectedChunk {
    /// Field name.
    pub field: String,
    /// Stable id, `field#n`.
    pub id: String,
    /// Byte span in the field's content.
    pub span: (usize, usize),
    /// The text.
    pub text: String,
    /// Relevance score (fused, calibrated).
    pub score: f32,
    /// Tokens in the receiver's tokenizer.
    pub tokens: usize,
}

/// A chunk left out, listed so the receiver can ask for it by id.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DroppedChunk {
    /// Field name.
    pub field: String,
    /// Chunk id.
    pub id: String,
    /// The first words.
    pub stub: String,
    /// Tokens it would cost.
    pub tokens: usize,
}

/// Token totals and reduction ratios.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Totals {
    /// Tokens of the whole (non-confidential) context, C.
    pub context_tokens: usize,
    /// Tokens sent.
    pub sent_tokens: usize,
    /// C / sent.
    pub reduction_ratio: f32,
    /// Theorem 1: C / (k·c + d), d the embedding dimension.
    pub r_theorem1: f32,
}

/// Where time went, in milliseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Timings {
    /// Chunking, token counting and embedding the chunks (cache misses only).
    pub prepare_ms: f64,
    /// Embedding the task.
    pub task_embed_ms: f64,
    /// Scoring and packing.
    pub select_ms: f64,
}

/// The minimal sufficient context.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Compressed {
    /// Selected chunks in reading order.
    pub chunks: Vec<SelectedChunk>,
    /// Totals.
    pub totals: Totals,
    /// Chunks not sent (confidential ones are never listed).
    pub dropped: Vec<DroppedChunk>,
    /// e_task.
    pub task_embedding: Vec<f32>,
    /// Things the receiver should know (threshold dropped everything, ...).
    pub warnings: Vec<String>,
    /// Timings.
    pub timings: Timings,
}

/// Answer to an adaptive context request.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MoreContext {
    /// New chunks, never sent before in this session, in reading order.
    pub chunks: Vec<SelectedChunk>,
    /// Budget left after these.
    pub remaining_tokens: usize,
    /// Why nothing (or less than asked) was sent.
    pub reason: Option<String>,
}

/// An adaptive request (paper §6.3 ContextRequest).
#[derive(Debug, Clone, Default)]
pub struct ContextRequest {
    /// The session (task id) from a compress call.
    pub session_id: String,
    /// What the receiver needs.
    pub specific_question: String,
    /// Its confidence, in [0, 1].
    pub current_confidence: f32,
    /// Why it needs more.
    pub reasoning: String,
    /// Ids from the dropped manifest it wants.
    pub chunk_ids: Vec<String>,
}

#[derive(Debug, Clone)]
struct Prepared {
    field: usize,
    id: String,
    span: (usize, usize),
    text: String,
    group: (usize, usize),
    lead: bool,
    tokens: usize,
    confidential: bool,
    embedding: Arc<[f32]>,
    embed_text: String,
    /// Names this chunk defines (functions, tables, JSON keys): link targets.
    defines: Vec<String>,
    /// Lower-cased text, for mention matching.
    lower: String,
    /// Dropped-manifest stub.
    stub: String,
}

/// A context chunked, counted, embedded and indexed once, reused by every
/// task asked of it.
struct PreparedContext {
    chunks: Vec<Prepared>,
    field_names: Vec<String>,
    /// Per field: its title's mention key when it is a titled document.
    field_keys: Vec<Option<String>>,
    bm25: Bm25,
    index: Option<HnswIndex>,
    /// Per chunk, the chunks at least `redundancy_cosine` similar to it.
    near_duplicates: Vec<Vec<u32>>,
    last_used: Mutex<Instant>,
}

impl PreparedContext {
    /// Chunk `i` as sent to the receiver, with its score.
    fn selected(&self, i: usize, score: f32) -> SelectedChunk {
        let c = &self.chunks[i];
        SelectedChunk {
            field: self.field_names[c.field].clone(),
            id: c.id.clone(),
            span: c.span,
            text: c.text.clone(),
            score,
            tokens: c.tokens,
        }
    }
}

struct Session {
    context: Arc<PreparedContext>,
    sent: HashSet<usize>,
    remaining: usize,
    last_used: Instant,
}

/// The SCD engine: an encoder, an embedding cache and session ledgers.
pub struct Scd {
    encoder: Arc<dyn Encoder>,
    cache: EmbeddingCache,
    sessions: Mutex<HashMap<String, Session>>,
    prepared: Mutex<HashMap<[u8; 32], Arc<PreparedContext>>>,
    cfg: ScdConfig,
}

impl std::fmt::Debug for Scd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scd").field("model", &self.encoder.model_id()).field("cache", &self.cache).finish()
    }
}

/// Texts per encoder call when embedding a context's chunks: the unit
/// between cancellation checks.
pub const EMBED_SLICE: usize = 256;

fn stub(text: &str) -> String {
    let words: Vec<&str> = text.split_whitespace().take(8).collect();
    let mut s = words.join(" ");
    if text.split_whitespace().count() > 8 {
        s.push('…');
    }
    s
}

/// Lower-cased `name` without a trailing parenthetical, for mention matching.
fn mention_key(name: &str) -> String {
    let base = name.split(" (").next().unwrap_or(name);
    base.trim().to_lowercase()
}

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
    /// An engine over `encoder`.
    pub fn new(encoder: Arc<dyn Encoder>, cfg: ScdConfig) -> Self {
        Self {
            cache: EmbeddingCache::new(cfg.cache_bytes),
            encoder,
            sessions: Mutex::new(HashMap::new()),
            prepared: Mutex::new(HashMap::new()),
            cfg,
        }
    }

    /// The encoder.
    pub fn encoder(&self) -> &Arc<dyn Encoder> {
        &self.encoder
    }

    /// Cache counters.
    pub fn cache_stats(&self) -> CacheStats {
        self.cache.stats()
    }

    /// The configuration.
    pub fn config(&self) -> &ScdConfig {
        &self.cfg
    }

    /// Embeds texts through the cache; only misses reach the encoder.
    pub fn embed_cached(&self, texts: &[&str], kind: InputKind) -> Result<Vec<Arc<[f32]>>> {
        self.embed_cached_with(texts, kind, &Cancel::new())
    }

    /// [`Scd::embed_cached`], checking `cancel` before each encoder call of
    /// at most [`EMBED_SLICE`] texts.
    pub fn embed_cached_with(&self, texts: &[&str], kind: InputKind, cancel: &Cancel) -> Result<Vec<Arc<[f32]>>> {
        let kind_byte = u8::from(kind == InputKind::Query);
        let keys: Vec<_> = texts.iter().map(|t| EmbeddingCache::key(self.encoder.model_id(), kind_byte, t)).collect();
        let mut out: Vec<Option<Arc<[f32]>>> = keys.iter().map(|k| self.cache.get(k)).collect();
        let missing: Vec<usize> = (0..texts.len()).filter(|&i| out[i].is_none()).collect();
        for slice in missing.chunks(EMBED_SLICE) {
            cancel.check("embed")?;
            let refs: Vec<&str> = slice.iter().map(|&i| texts[i]).collect();
            let enc = self.encoder.encode(&refs, &EncodeOptions::new(kind).with_windows())?;
            for (j, &i) in slice.iter().enumerate() {
                let v: Arc<[f32]> = Arc::from(enc.row(j));
                self.cache.put(keys[i], v.clone());
                out[i] = Some(v);
            }
        }
        Ok(out.into_iter().map(|v| v.expect("filled")).collect())
    }

    /// The prepared form of `ctx`, from the context cache when the same
    /// context (names, kinds, contents, flags) was seen before.
    fn prepare(&self, ctx: &Context, cancel: &Cancel) -> Result<Arc<PreparedContext>> {
        use sha2::{Digest, Sha256};
        let mut h = Sha256::new();
        h.update(self.encoder.model_id().as_bytes());
        for f in &ctx.fields {
            h.update((f.name.len() as u64).to_le_bytes());
            h.update(f.name.as_bytes());
            h.update([f.kind as u8, u8::from(f.confidential)]);
            h.update((f.content.len() as u64).to_le_bytes());
            h.update(f.content.as_bytes());
        }
        let key: [u8; 32] = h.finalize().into();
        if let Some(p) = self.prepared.lock().unwrap_or_else(|p| p.into_inner()).get(&key) {
            *p.last_used.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
            self.cache.record_hits(p.chunks.len());
            return Ok(p.clone());
        }
        cancel.check("chunk")?;
        let chunks = self.prepare_chunks(ctx, cancel)?;
        cancel.check("index")?;
        let bm25 = Bm25::new(&chunks.iter().map(|c| c.embed_text.as_str()).collect::<Vec<_>>());
        let index = (chunks.len() >= self.cfg.hnsw_min_chunks)
            .then(|| HnswIndex::build(&chunks.iter().map(|c| &*c.embedding).collect::<Vec<_>>(), self.cfg.hnsw));
        let near_duplicates = self.near_duplicates(&chunks, index.as_ref());
        let prepared = Arc::new(PreparedContext {
            near_duplicates,
            chunks,
            field_names: ctx.fields.iter().map(|f| f.name.clone()).collect(),
            field_keys: ctx
                .fields
                .iter()
                .map(|f| (f.kind == crate::context::FieldKind::Prose).then(|| mention_key(&f.name)))
                .collect(),
            bm25,
            index,
            last_used: Mutex::new(Instant::now()),
        });
        let mut cache = self.prepared.lock().unwrap_or_else(|p| p.into_inner());
        if cache.len() >= self.cfg.max_prepared_contexts {
            let oldest = cache
                .iter()
                .min_by_key(|(_, p)| *p.last_used.lock().unwrap_or_else(|p| p.into_inner()))
                .map(|(k, _)| *k);
            if let Some(k) = oldest {
                cache.remove(&k);
            }
        }
        if self.cfg.max_prepared_contexts > 0 {
            cache.insert(key, prepared.clone());
        }
        Ok(prepared)
    }

    /// Pairs of near-duplicate chunks, found once per context: exactly below
    /// the HNSW threshold, among each chunk's 16 nearest neighbours above it.
    fn near_duplicates(&self, chunks: &[Prepared], index: Option<&HnswIndex>) -> Vec<Vec<u32>> {
        use rayon::prelude::*;
        let t = self.cfg.redundancy_cosine;
        (0..chunks.len())
            .into_par_iter()
            .map(|i| {
                let e = &chunks[i].embedding;
                let close = |&j: &usize| j != i && dot(e, &chunks[j].embedding) >= t;
                match index {
                    Some(idx) => idx.search(e, 16).into_iter().filter(close).map(|j| j as u32).collect(),
                    None => (0..chunks.len()).filter(close).map(|j| j as u32).collect(),
                }
            })
            .collect()
    }

    fn prepare_chunks(&self, ctx: &Context, cancel: &Cancel) -> Result<Vec<Prepared>> {
        let mut out = Vec::new();
        for (fi, f) in ctx.fields.iter().enumerate() {
            for (n, c) in chunk_field(f, self.cfg.chunk).into_iter().enumerate() {
                let text = f.content[c.start..c.end].to_string();
                let label = match &c.heading {
                    Some(h) if h != &f.name => format!("{} — {h}", f.name),
                    _ => f.name.clone(),
                };
                out.push(Prepared {
                    field: fi,
                    id: format!("{}#{n}", f.name),
                    span: (c.start, c.end),
                    tokens: self.encoder.count_tokens(&text)?,
                    embed_text: format!("{label}: {text}"),
                    text,
                    group: (fi, c.group),
                    lead: c.lead,
                    confidential: f.confidential,
                    embedding: Arc::from(Vec::new()),
                    defines: c.defines.iter().map(|d| mention_key(d)).collect(),
                    lower: f.content[c.start..c.end].to_lowercase(),
                    stub: stub(&f.content[c.start..c.end]),
                });
            }
        }
        let texts: Vec<&str> = out.iter().map(|p| p.embed_text.as_str()).collect();
        let vecs = self.embed_cached_with(&texts, InputKind::Passage, cancel)?;
        for (p, v) in out.iter_mut().zip(vecs) {
            p.embedding = v;
        }
        Ok(out)
    }

    /// Fused, calibrated scores of every chunk for `query`, with links.
    fn score(&self, ctx: &PreparedContext, query_vec: &[f32], query: &str) -> Vec<f32> {
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
                let floor = d.iter().copied().filter(|x| !x.is_nan()).fold(f32::INFINITY, f32::min) - 0.05;
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
        for (c, v) in chunks.iter().zip(s.iter_mut()) {
            if linked_fields.contains(&c.field) {
                *v += self.cfg.link_weight * if c.lead { 1.5 } else { 1.0 };
            } else if c.defines.iter().any(|d| named_by(d, c.field)) {
                *v += self.cfg.link_weight * 1.5;
            }
        }
        s
    }

    /// Compresses a context for a task under the receiver's requirement.
    pub fn compress(&self, req: &CompressRequest) -> Result<Compressed> {
        self.compress_with(req, &Cancel::new())
    }

    /// [`Scd::compress`] that stops with [`Error::Cancelled`] or
    /// [`Error::DeadlineExceeded`] between stages once `cancel` says so.
    #[instrument(skip_all, fields(fields = req.context.fields.len(), budget = req.requirement.max_context_tokens))]
    pub fn compress_with(&self, req: &CompressRequest, cancel: &Cancel) -> Result<Compressed> {
        let ctx = &req.context;
        ctx.validate()?;
        let rq = &req.requirement;
        rq.validate(ctx, self.cfg.max_budget_tokens)?;
        if req.task.description.trim().is_empty() {
            return Err(Error::invalid("task.description", "must not be empty"));
        }
        for name in &rq.required_fields {
            if ctx.fields.iter().any(|f| &f.name == name && f.confidential) {
                return Err(Error::invalid(
                    "required_fields",
                    format!("field {name:?} is confidential and is never sent"),
                ));
            }
        }
        let t0 = Instant::now();
        let prepared = self.prepare(ctx, cancel)?;
        let chunks = &prepared.chunks;
        let chunk_embed_ms = t0.elapsed().as_secs_f64() * 1e3;
        let t1 = Instant::now();
        let task_text = req.task.text();
        let task_vec = self.embed_cached_with(&[task_text.as_str()], InputKind::Query, cancel)?.remove(0);
        let embed_ms = t1.elapsed().as_secs_f64() * 1e3;
        let t2 = Instant::now();
        cancel.check("score")?;
        let scores = self.score(&prepared, &task_vec, &task_text);
        let budget = rq.max_context_tokens;
        let mut warnings = Vec::new();

        let required: HashSet<usize> =
            rq.required_fields.iter().filter_map(|n| ctx.fields.iter().position(|f| &f.name == n)).collect();
        let optional: HashSet<usize> = if rq.required_fields.is_empty() && rq.optional_fields.is_empty() {
            (0..ctx.fields.len()).collect()
        } else {
            rq.optional_fields.iter().filter_map(|n| ctx.fields.iter().position(|f| &f.name == n)).collect()
        };
        let needed: usize = chunks.iter().filter(|c| required.contains(&c.field)).map(|c| c.tokens).sum();
        if needed > budget {
            return Err(Error::BudgetTooSmall { needed, budget });
        }
        let mut selected: Vec<usize> = (0..chunks.len()).filter(|&i| required.contains(&chunks[i].field)).collect();
        let mut used = needed;
        let eligible = |i: usize| {
            let c = &chunks[i];
            !c.confidential
                && optional.contains(&c.field)
                && !required.contains(&c.field)
                && rq.relevance_threshold.is_none_or(|t| dot(&task_vec, &c.embedding) >= t)
        };
        let z = zscores(&scores);
        let mut order: Vec<usize> = (0..chunks.len()).filter(|&i| eligible(i)).collect();
        let candidates = order.len();
        order.retain(|&i| rq.min_relative_score.is_none_or(|t| z[i] >= t));
        if candidates > 0 && order.is_empty() {
            warnings.push("no chunk passed the relevance threshold".to_string());
        }
        order.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]));
        cancel.check("pack")?;
        self.pack(&prepared, &order, budget, &mut selected, &mut used);
        let select_ms = t2.elapsed().as_secs_f64() * 1e3;

        let out =
            self.assemble(&prepared, &selected, &scores, &task_vec, warnings, (chunk_embed_ms, embed_ms, select_ms));
        if let Some(id) = &req.session_id {
            self.store_session(id, prepared.clone(), &selected, budget.saturating_sub(out.totals.sent_tokens))?;
        }
        debug!(sent = out.totals.sent_tokens, ratio = out.totals.reduction_ratio, "compressed");
        Ok(out)
    }

    /// Greedy packing by score with redundancy suppression and group closure.
    fn pack(&self, ctx: &PreparedContext, order: &[usize], budget: usize, selected: &mut Vec<usize>, used: &mut usize) {
        let chunks = &ctx.chunks;
        let mut chosen: HashSet<usize> = selected.iter().copied().collect();
        let leads: HashMap<(usize, usize), usize> =
            chunks.iter().enumerate().filter(|(_, c)| c.lead).map(|(i, c)| (c.group, i)).collect();
        for &i in order {
            if chosen.contains(&i) || *used + chunks[i].tokens > budget {
                continue;
            }
            let redundant = ctx.near_duplicates[i].iter().any(|&j| chosen.contains(&(j as usize)));
            if redundant {
                continue;
            }
            chosen.insert(i);
            selected.push(i);
            *used += chunks[i].tokens;
            // closure: a chunk brings its group's lead (a paragraph's first
            // sentence, a chat answer's question) when that fits
            if let Some(&l) = leads.get(&chunks[i].group) {
                if !chosen.contains(&l) && !chunks[l].confidential && *used + chunks[l].tokens <= budget {
                    chosen.insert(l);
                    selected.push(l);
                    *used += chunks[l].tokens;
                }
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn assemble(
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
        let context_tokens: usize = chunks.iter().filter(|c| !c.confidential).map(|c| c.tokens).sum();
        let sent_tokens: usize = sel.iter().map(|&i| chunks[i].tokens).sum();
        let dropped = (0..chunks.len())
            .filter(|i| !chosen.contains(i) && !chunks[*i].confidential)
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
            timings: Timings { prepare_ms: ms.0, task_embed_ms: ms.1, select_ms: ms.2 },
        }
    }

    fn store_session(
        &self,
        id: &str,
        context: Arc<PreparedContext>,
        selected: &[usize],
        remaining: usize,
    ) -> Result<()> {
        if id.is_empty() || id.len() > 256 {
            return Err(Error::invalid("session_id", "must be 1 to 256 bytes"));
        }
        let mut sessions = self.sessions.lock().unwrap_or_else(|p| p.into_inner());
        let ttl = self.cfg.session_ttl;
        sessions.retain(|_, s| s.last_used.elapsed() < ttl);
        if sessions.len() >= self.cfg.max_sessions && !sessions.contains_key(id) {
            if let Some(oldest) = sessions.iter().min_by_key(|(_, s)| s.last_used).map(|(k, _)| k.clone()) {
                sessions.remove(&oldest);
            }
        }
        sessions.insert(
            id.to_string(),
            Session { context, sent: selected.iter().copied().collect(), remaining, last_used: Instant::now() },
        );
        Ok(())
    }

    /// Closes a session; false when none was open under `id`.
    pub fn close_session(&self, id: &str) -> bool {
        self.sessions.lock().unwrap_or_else(|p| p.into_inner()).remove(id).is_some()
    }

    /// Number of live sessions.
    pub fn session_count(&self) -> usize {
        let mut sessions = self.sessions.lock().unwrap_or_else(|p| p.into_inner());
        let ttl = self.cfg.session_ttl;
        sessions.retain(|_, s| s.last_used.elapsed() < ttl);
        sessions.len()
    }

    /// Adaptive context request (paper §6.3): the next most relevant chunks
    /// for the question that the receiver has not seen, under the budget it
    /// has left. Never resends a chunk.
    pub fn request_more(&self, req: &ContextRequest) -> Result<MoreContext> {
        self.request_more_with(req, &Cancel::new())
    }

    /// [`Scd::request_more`] that stops between stages once `cancel` says so.
    #[instrument(skip_all)]
    pub fn request_more_with(&self, req: &ContextRequest, cancel: &Cancel) -> Result<MoreContext> {
        if !(0.0..=1.0).contains(&req.current_confidence) {
            return Err(Error::invalid(
                "current_confidence",
                format!("must be in [0, 1], got {}", req.current_confidence),
            ));
        }
        let mut sessions = self.sessions.lock().unwrap_or_else(|p| p.into_inner());
        let ttl = self.cfg.session_ttl;
        let Some(session) = sessions.get_mut(&req.session_id).filter(|s| s.last_used.elapsed() < ttl) else {
            sessions.remove(&req.session_id);
            return Err(Error::UnknownSession { session_id: req.session_id.clone() });
        };
        session.last_used = Instant::now();
        if req.current_confidence >= self.cfg.confidence_threshold {
            return Ok(MoreContext {
                chunks: vec![],
                remaining_tokens: session.remaining,
                reason: Some(format!(
                    "confidence {} is at or above the threshold {}; no context sent",
                    req.current_confidence, self.cfg.confidence_threshold
                )),
            });
        }
        let context = session.context.clone();
        drop(sessions);
        let chunks = &context.chunks;
        let query = format!("{} {}", req.specific_question, req.reasoning);
        let qvec = self.embed_cached_with(&[query.trim()], InputKind::Query, cancel)?.remove(0);
        cancel.check("score")?;
        let scores = self.score(&context, &qvec, &query);

        let mut sessions = self.sessions.lock().unwrap_or_else(|p| p.into_inner());
        let session = sessions
            .get_mut(&req.session_id)
            .ok_or_else(|| Error::UnknownSession { session_id: req.session_id.clone() })?;
        let mut picked = Vec::new();
        let mut reason = None;
        // explicit ids first, then by relevance
        let mut order: Vec<usize> = Vec::new();
        for id in &req.chunk_ids {
            match chunks.iter().position(|c| &c.id == id && !c.confidential) {
                Some(i) => order.push(i),
                None => return Err(Error::invalid("chunk_ids", format!("unknown chunk id {id:?}"))),
            }
        }
        if req.specific_question.trim().is_empty() && order.is_empty() {
            return Err(Error::invalid("specific_question", "must not be empty (or name chunk_ids)"));
        }
        let mut ranked: Vec<usize> = (0..chunks.len()).filter(|i| !chunks[*i].confidential).collect();
        ranked.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]));
        let explicit = order.len();
        order.extend(ranked);
        let mut used = 0;
        for (n, &i) in order.iter().enumerate() {
            if session.sent.contains(&i) || picked.contains(&i) {
                continue;
            }
            if used + chunks[i].tokens > session.remaining {
                if n < explicit {
                    reason = Some(format!(
                        "chunk {} needs {} tokens, {} left",
                        chunks[i].id,
                        chunks[i].tokens,
                        session.remaining - used
                    ));
                }
                continue;
            }
            // beyond explicit ids, stop at chunks scoring below the context's average
            if n >= explicit && scores[i] < 0.0 && !picked.is_empty() {
                break;
            }
            picked.push(i);
            used += chunks[i].tokens;
            if n >= explicit && picked.len() >= explicit + 8 {
                break;
            }
        }
        session.sent.extend(picked.iter().copied());
        session.remaining -= used;
        if picked.is_empty() && reason.is_none() {
            reason = Some("no unseen chunk fits the remaining budget".into());
        }
        picked.sort_unstable();
        Ok(MoreContext {
            chunks: picked.iter().map(|&i| context.selected(i, scores[i])).collect(),
            remaining_tokens: session.remaining,
            reason,
        })
    }
}
