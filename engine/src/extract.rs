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
//!     context, requirement: ContextRequirement::with_budget(8), session: None,
//! }).unwrap();
//! assert_eq!(out.chunks[0].text, "The payment service timed out.");
//! assert!(out.totals.sent_tokens <= 8);
//! ```

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use tracing::{debug, instrument};

use crate::cache::{CacheStats, EmbeddingCache};
use crate::cancel::Cancel;
use crate::chunk::{chunk_field, ChunkConfig};
use crate::context::{check_no_nul, Context, ContextLimits, ContextRequirement, Field, Redacted, Task};
use crate::encoder::{EncodeOptions, Encoder, InputKind};
use crate::index::{HnswIndex, HnswParams};
use crate::score::{dedup, dot, zscores, Bm25};
use crate::session::{SessionGrant, SessionLimits, SessionStats, SessionStore};
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
    /// The `current_confidence` a hand-off report's confidence level stands
    /// for (low 0.3, medium 0.6, high 0.9 by default).
    pub confidence_map: crate::handoff::ConfidenceMap,
    /// Session lifetime since last use.
    pub session_ttl: Duration,
    /// Sessions held at once (least recently used evicted, never silently).
    pub max_sessions: usize,
    /// Bytes all sessions may hold together (each counts its whole context).
    pub session_bytes: usize,
    /// Bytes of prepared contexts (chunks, embeddings, BM25, HNSW) kept for reuse.
    pub prepared_cache_bytes: usize,
    /// Limits on a context's size, checked before any work.
    pub context_limits: ContextLimits,
    /// Tokens of a context's non-confidential content, checked after
    /// counting and before embedding.
    pub max_context_tokens: usize,
    /// Bytes of a task (description, constraints and schema together).
    pub max_task_bytes: usize,
    /// Tokens of a task's embedded text.
    pub max_task_tokens: usize,
    /// Constraints on a task.
    pub max_constraints: usize,
    /// Contexts with at least this many chunks get an HNSW index; dense
    /// scores are then computed exactly for its candidates only. Building
    /// the index is not cancellable and costs far more than it saves inside
    /// one request (measured: 90–140 s at 44k–61k chunks on 2 cores, warm
    /// selection no faster), so the default keeps it for very large
    /// contexts that the caller means to query many times.
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
            confidence_map: crate::handoff::ConfidenceMap::default(),
            session_ttl: Duration::from_secs(1800),
            max_sessions: 10_000,
            session_bytes: 1 << 30,
            prepared_cache_bytes: 512 << 20,
            context_limits: ContextLimits::default(),
            max_context_tokens: 1 << 20,
            max_task_bytes: 64 << 10,
            max_task_tokens: 4096,
            max_constraints: 256,
            hnsw_min_chunks: 200_000,
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
    /// Open (or continue) a session for adaptive requests.
    pub session: Option<SessionRequest>,
}

/// Open a session with a compression, or continue one.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct SessionRequest {
    /// The id: `None` opens a new session with 128 random bits; an id that
    /// is not live opens a session under it; a live id continues it (the
    /// token and the context must match).
    pub id: Option<String>,
    /// The secret returned when the session was opened (to continue one).
    pub token: Option<String>,
    /// Who calls, when the transport knows (TLS client certificate, DID);
    /// a session opened with one can only be used by the same caller.
    pub caller: Option<String>,
}

impl std::fmt::Debug for SessionRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionRequest")
            .field("id", &self.id)
            .field("token", &self.token.as_ref().map(|_| "<secret>"))
            .field("caller", &self.caller)
            .finish()
    }
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
    /// Names of the confidential fields withheld (names only, never content).
    pub withheld: Vec<String>,
    /// The session opened or continued, when one was asked for.
    pub session: Option<SessionGrant>,
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

/// An adaptive request (paper §6.3 ContextRequest). `Debug` prints sizes
/// of the question and reasoning, never their text.
#[derive(Clone, Default)]
pub struct ContextRequest {
    /// The session (task id) from a compress call.
    pub session_id: String,
    /// The secret returned with the session.
    pub session_token: String,
    /// Who calls, when the transport knows.
    pub caller: Option<String>,
    /// What the receiver needs.
    pub specific_question: String,
    /// Its confidence, in [0, 1].
    pub current_confidence: f32,
    /// Why it needs more.
    pub reasoning: String,
    /// Ids from the dropped manifest it wants.
    pub chunk_ids: Vec<String>,
}

impl std::fmt::Debug for ContextRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ContextRequest")
            .field("session_id", &self.session_id)
            .field("session_token", &"<secret>")
            .field("caller", &self.caller)
            .field("specific_question", &Redacted(self.specific_question.len()))
            .field("current_confidence", &self.current_confidence)
            .field("reasoning", &Redacted(self.reasoning.len()))
            .field("chunk_ids", &self.chunk_ids)
            .finish()
    }
}

#[derive(Clone)]
struct Prepared {
    field: usize,
    id: String,
    span: (usize, usize),
    text: String,
    group: (usize, usize),
    lead: bool,
    tokens: usize,
    embedding: Arc<[f32]>,
    embed_text: String,
    /// Names this chunk defines (functions, tables, JSON keys): link targets.
    defines: Vec<String>,
    /// Lower-cased text, for mention matching.
    lower: String,
    /// Dropped-manifest stub.
    stub: String,
}

/// The non-confidential part of a context chunked, counted, embedded and
/// indexed once, reused by every task asked of it. Confidential fields never
/// reach it: they are split off before, so nothing here (the encoder, the
/// caches, BM25, links, sessions) ever sees their text.
struct PreparedContext {
    chunks: Vec<Prepared>,
    field_names: Vec<String>,
    /// Per field: its title's mention key when it is a titled document.
    field_keys: Vec<Option<String>>,
    bm25: Bm25,
    index: Option<HnswIndex>,
    /// Per chunk, its distinct embedding (bit-identical chunks, such as a
    /// repeated log line, share one): an index into `near_duplicates`.
    distinct: Vec<u32>,
    /// Per distinct embedding, the other distinct ones at least
    /// `redundancy_cosine` similar to it. Identical chunks are one entry, so
    /// a thousand copies of a line cost one, not a million pairs.
    near_duplicates: Vec<Vec<u32>>,
    /// Fingerprint of the fields it was built from (model + public fields).
    key: [u8; 32],
    /// About how much memory it holds.
    bytes: usize,
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

/// A session's ledger: what the receiver holds and the budget it has left.
struct Ledger {
    context: Arc<PreparedContext>,
    sent: HashSet<usize>,
    remaining: usize,
}

/// The SCD engine: an encoder, an embedding cache and session ledgers.
pub struct Scd {
    encoder: Arc<dyn Encoder>,
    cache: EmbeddingCache,
    sessions: SessionStore<Ledger>,
    prepared: moka::sync::Cache<[u8; 32], Arc<PreparedContext>>,
    cfg: ScdConfig,
}

/// A context with its confidential fields split off: `public` is all any
/// later stage sees; `withheld` are the confidential fields' names.
struct Split<'a> {
    public: Vec<&'a Field>,
    withheld: Vec<String>,
}

impl<'a> Split<'a> {
    fn new(ctx: &'a Context) -> Self {
        let (public, secret): (Vec<&Field>, Vec<&Field>) = ctx.fields.iter().partition(|f| !f.confidential);
        Self { public, withheld: secret.into_iter().map(|f| f.name.clone()).collect() }
    }

    /// Position of public field `name`; confidential or unknown names are
    /// errors naming `what` (the requirement list).
    fn index(&self, names: &HashMap<&str, usize>, name: &str, what: &str) -> Result<usize> {
        match names.get(name) {
            Some(&i) => Ok(i),
            None if self.withheld.iter().any(|w| w == name) => {
                Err(Error::invalid(what, format!("field {name:?} is confidential and is never sent")))
            }
            None => Err(Error::invalid(what, format!("unknown field {name:?}"))),
        }
    }
}

impl std::fmt::Debug for Scd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scd").field("model", &self.encoder.model_id()).field("cache", &self.cache).finish()
    }
}

/// For each vector, the index of its distinct value (bit-identical vectors
/// share one), and the first vector of each distinct value.
fn distinct_vectors(vectors: &[&[f32]]) -> (Vec<u32>, Vec<usize>) {
    use sha2::{Digest, Sha256};
    let mut first: HashMap<[u8; 32], u32> = HashMap::new();
    let mut unique = Vec::new();
    let distinct = vectors
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let mut h = Sha256::new();
            v.iter().for_each(|x| h.update(x.to_le_bytes()));
            *first.entry(h.finalize().into()).or_insert_with(|| {
                unique.push(i);
                (unique.len() - 1) as u32
            })
        })
        .collect();
    (distinct, unique)
}

/// Chunk ids one adaptive request may name.
pub const MAX_CHUNK_IDS: usize = 1024;

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
        let sessions = SessionStore::new(SessionLimits {
            ttl: cfg.session_ttl,
            max_sessions: cfg.max_sessions,
            max_bytes: cfg.session_bytes,
        });
        let prepared = moka::sync::Cache::builder()
            .max_capacity(cfg.prepared_cache_bytes as u64)
            .weigher(|_, p: &Arc<PreparedContext>| u32::try_from(p.bytes).unwrap_or(u32::MAX))
            .build();
        Self { cache: EmbeddingCache::new(cfg.cache_bytes), encoder, sessions, prepared, cfg }
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

    /// The prepared form of the public fields, from the context cache when
    /// the same fields (names, kinds, contents) were seen before.
    fn prepare(&self, fields: &[&Field], cancel: &Cancel) -> Result<Arc<PreparedContext>> {
        use sha2::{Digest, Sha256};
        let mut h = Sha256::new();
        h.update(self.encoder.model_id().as_bytes());
        for f in fields {
            h.update((f.name.len() as u64).to_le_bytes());
            h.update(f.name.as_bytes());
            h.update([f.kind as u8]);
            h.update((f.content.len() as u64).to_le_bytes());
            h.update(f.content.as_bytes());
        }
        let key: [u8; 32] = h.finalize().into();
        if let Some(p) = self.prepared.get(&key) {
            self.cache.record_hits(p.chunks.len());
            return Ok(p);
        }
        cancel.check("chunk")?;
        let chunks = self.prepare_chunks(fields, cancel)?;
        cancel.check("index")?;
        let bm25 = Bm25::new(&chunks.iter().map(|c| c.embed_text.as_str()).collect::<Vec<_>>());
        let vectors: Vec<&[f32]> = chunks.iter().map(|c| &*c.embedding).collect();
        let index = (chunks.len() >= self.cfg.hnsw_min_chunks).then(|| HnswIndex::build(&vectors, self.cfg.hnsw));
        let (distinct, unique) = distinct_vectors(&vectors);
        let near_duplicates = self.near_duplicates(&vectors, &distinct, &unique, index.as_ref());
        let dim = self.encoder.dim();
        let bytes = 256
            + chunks
                .iter()
                .map(|c| 160 + c.text.len() * 3 + c.embed_text.len() + c.stub.len() + c.id.len() + dim * 4)
                .sum::<usize>()
            + near_duplicates.iter().map(|l| 24 + l.len() * 4).sum::<usize>()
            + distinct.len() * 4
            + index.as_ref().map_or(0, |i| i.len() * (dim * 4 + 24 * 8 * 2));
        let prepared = Arc::new(PreparedContext {
            distinct,
            near_duplicates,
            chunks,
            field_names: fields.iter().map(|f| f.name.clone()).collect(),
            field_keys: fields
                .iter()
                .map(|f| (f.kind == crate::context::FieldKind::Prose).then(|| mention_key(&f.name)))
                .collect(),
            bm25,
            index,
            key,
            bytes,
        });
        if self.cfg.prepared_cache_bytes > 0 {
            self.prepared.insert(key, prepared.clone());
        }
        Ok(prepared)
    }

    /// Near-duplicate pairs among the distinct embeddings (`unique`: the
    /// first chunk of each), found once per context: among each one's 16
    /// nearest neighbours when there is an HNSW index, otherwise by
    /// [`dedup::near_duplicates`] (exact for small contexts, LSH above).
    fn near_duplicates(
        &self,
        vectors: &[&[f32]],
        distinct: &[u32],
        unique: &[usize],
        index: Option<&HnswIndex>,
    ) -> Vec<Vec<u32>> {
        use rayon::prelude::*;
        let t = self.cfg.redundancy_cosine;
        match index {
            Some(idx) => (0..unique.len())
                .into_par_iter()
                .map(|u| {
                    let v = vectors[unique[u]];
                    let mut near: Vec<u32> = idx
                        .search(v, 16)
                        .into_iter()
                        .map(|j| distinct[j])
                        .filter(|&d| d as usize != u && dot(v, vectors[unique[d as usize]]) >= t)
                        .collect();
                    near.sort_unstable();
                    near.dedup();
                    near
                })
                .collect(),
            None => dedup::near_duplicates(&unique.iter().map(|&i| vectors[i]).collect::<Vec<_>>(), t),
        }
    }

    fn prepare_chunks(&self, fields: &[&Field], cancel: &Cancel) -> Result<Vec<Prepared>> {
        let mut out = Vec::new();
        for (fi, f) in fields.iter().enumerate() {
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
                    embedding: Arc::from(Vec::new()),
                    defines: c.defines.iter().map(|d| mention_key(d)).collect(),
                    lower: f.content[c.start..c.end].to_lowercase(),
                    stub: stub(&f.content[c.start..c.end]),
                });
            }
        }
        let total: usize = out.iter().map(|p| p.tokens).sum();
        if total > self.cfg.max_context_tokens {
            return Err(Error::invalid(
                "context",
                format!("{total} tokens of non-confidential content, over the limit {}", self.cfg.max_context_tokens),
            ));
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
        ctx.validate_within(&self.cfg.context_limits)?;
        let rq = &req.requirement;
        rq.validate(self.cfg.max_budget_tokens)?;
        req.task.validate(self.cfg.max_task_bytes, self.cfg.max_constraints)?;
        let split = Split::new(ctx);
        let names: HashMap<&str, usize> = split.public.iter().enumerate().map(|(i, f)| (f.name.as_str(), i)).collect();
        let required: HashSet<usize> =
            rq.required_fields.iter().map(|n| split.index(&names, n, "required_fields")).collect::<Result<_>>()?;
        let listed: HashSet<usize> =
            rq.optional_fields.iter().map(|n| split.index(&names, n, "optional_fields")).collect::<Result<_>>()?;
        let optional = if rq.required_fields.is_empty() && rq.optional_fields.is_empty() {
            (0..split.public.len()).collect()
        } else {
            listed
        };
        let task_text = req.task.text();
        let task_tokens = self.encoder.count_tokens(&task_text)?;
        if task_tokens > self.cfg.max_task_tokens {
            return Err(Error::invalid(
                "task",
                format!("{task_tokens} tokens, over the limit {}", self.cfg.max_task_tokens),
            ));
        }
        let continued = match &req.session {
            Some(SessionRequest { id: Some(id), token, caller }) if self.sessions.contains(id) => {
                Some(self.sessions.get(id, token.as_deref().unwrap_or(""), caller.as_deref())?)
            }
            _ => None,
        };

        let t0 = Instant::now();
        let prepared = self.prepare(&split.public, cancel)?;
        let chunks = &prepared.chunks;
        let chunk_embed_ms = t0.elapsed().as_secs_f64() * 1e3;
        let t1 = Instant::now();
        let task_vec = self.embed_cached_with(&[task_text.as_str()], InputKind::Query, cancel)?.remove(0);
        let embed_ms = t1.elapsed().as_secs_f64() * 1e3;
        let t2 = Instant::now();
        cancel.check("score")?;
        let scores = self.score(&prepared, &task_vec, &task_text);
        let budget = rq.max_context_tokens;
        let mut warnings = Vec::new();

        let needed: usize = chunks.iter().filter(|c| required.contains(&c.field)).map(|c| c.tokens).sum();
        if needed > budget {
            return Err(Error::BudgetTooSmall { needed, budget });
        }
        let mut selected: Vec<usize> = (0..chunks.len()).filter(|&i| required.contains(&chunks[i].field)).collect();
        let mut used = needed;
        let eligible = |i: usize| {
            let c = &chunks[i];
            optional.contains(&c.field)
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

        let mut out =
            self.assemble(&prepared, &selected, &scores, &task_vec, warnings, (chunk_embed_ms, embed_ms, select_ms));
        out.withheld = split.withheld;
        let remaining = budget.saturating_sub(out.totals.sent_tokens);
        out.session = match (&req.session, continued) {
            (None, _) => None,
            (Some(sr), Some(entry)) => {
                if entry.context_key() != &prepared.key {
                    let id = sr.id.clone().unwrap_or_default();
                    return Err(Error::SessionContextMismatch { session_id: id });
                }
                let mut ledger = entry.lock();
                ledger.sent.extend(selected.iter().copied());
                ledger.remaining = remaining;
                Some(SessionGrant {
                    id: sr.id.clone().unwrap_or_default(),
                    token: sr.token.clone().unwrap_or_default(),
                })
            }
            (Some(sr), None) => Some(self.sessions.open(
                sr.id.clone(),
                sr.caller.clone(),
                prepared.key,
                prepared.bytes + 8 * chunks.len(),
                Ledger { context: prepared.clone(), sent: selected.iter().copied().collect(), remaining },
            )?),
        };
        debug!(sent = out.totals.sent_tokens, ratio = out.totals.reduction_ratio, "compressed");
        Ok(out)
    }

    /// Greedy packing by score with redundancy suppression and group closure.
    fn pack(&self, ctx: &PreparedContext, order: &[usize], budget: usize, selected: &mut Vec<usize>, used: &mut usize) {
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

    /// Closes a session; `Ok(false)` when none was open under `id`. The
    /// token (and the caller, for a session bound to one) must match.
    pub fn close_session(&self, id: &str, token: &str, caller: Option<&str>) -> Result<bool> {
        self.sessions.close(id, token, caller)
    }

    /// Live sessions, their bytes, evictions and expiries.
    pub fn session_stats(&self) -> SessionStats {
        self.sessions.stats()
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
        check_no_nul(|| "specific_question".into(), &req.specific_question)?;
        check_no_nul(|| "reasoning".into(), &req.reasoning)?;
        let query = format!("{} {}", req.specific_question, req.reasoning);
        if query.len() > self.cfg.max_task_bytes {
            return Err(Error::invalid(
                "specific_question",
                format!("{} bytes with the reasoning, over the limit {}", query.len(), self.cfg.max_task_bytes),
            ));
        }
        let entry = self.sessions.get(&req.session_id, &req.session_token, req.caller.as_deref())?;
        // this session's own lock, held through scoring: concurrent requests
        // on one session take turns, so none can pick a chunk another sends
        let mut session = entry.lock();
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
        let chunks = &context.chunks;
        let qvec = self.embed_cached_with(&[query.trim()], InputKind::Query, cancel)?.remove(0);
        cancel.check("score")?;
        let scores = self.score(&context, &qvec, &query);
        let mut picked = Vec::new();
        let mut reason = None;
        // explicit ids first, then by relevance
        let mut order: Vec<usize> = Vec::new();
        if req.chunk_ids.len() > MAX_CHUNK_IDS {
            return Err(Error::invalid(
                "chunk_ids",
                format!("{} ids, over the limit {MAX_CHUNK_IDS}", req.chunk_ids.len()),
            ));
        }
        let by_id: HashMap<&str, usize> = chunks.iter().enumerate().map(|(i, c)| (c.id.as_str(), i)).collect();
        for id in &req.chunk_ids {
            match by_id.get(id.as_str()).copied() {
                Some(i) => order.push(i),
                None => return Err(Error::invalid("chunk_ids", format!("unknown chunk id {id:?}"))),
            }
        }
        if req.specific_question.trim().is_empty() && order.is_empty() {
            return Err(Error::invalid("specific_question", "must not be empty (or name chunk_ids)"));
        }
        let mut ranked: Vec<usize> = (0..chunks.len()).collect();
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
