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

mod adjacent;
mod around;
mod assemble;
mod compress;
mod config;
mod features;
mod layout;
mod more;
mod pack;
mod parts;
mod prepare;
mod render;
mod rerank;
mod score;
mod sessions;

use std::collections::HashSet;
use std::sync::Arc;

use serde::Serialize;
use tracing::instrument;

pub use self::config::{
    PrepareConfig, RequestLimits, ScdConfig, Scorer, ScoringConfig, SessionConfig, MAX_CODE_CONTEXT_LINES,
};
pub use self::features::{Features, LearnedScorer, FEATURES};
use self::parts::Scores;
use self::prepare::{PreparedContext, Split};
use crate::budget::{BudgetTokenizer, CHUNK_SEPARATOR};
use crate::cache::{CacheStats, DiskTier, EmbeddingCache};
use crate::cancel::Cancel;
use crate::context::{Context, ContextRequirement, Redacted, Task};
use crate::encoder::{Encoder, InputKind};
use crate::rerank::CrossEncoder;
use crate::session::{SessionGrant, SessionLimits, SessionStore};
use crate::{Error, Result};

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

/// What the receiver pastes, built from the selected chunks in reading
/// order: a hand-off report, say. The engine counts what it returns within
/// the budget, so the wrapping is paid for by dropping the weakest chunks.
#[derive(Clone)]
pub struct Envelope(pub Arc<Wrap>);

/// What an [`Envelope`] runs: the selection in reading order to the text.
pub type Wrap = dyn Fn(&[SelectedChunk]) -> String + Send + Sync;

impl std::fmt::Debug for Envelope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Envelope(..)")
    }
}

/// How one compression counts and what it reports, beyond the request.
#[derive(Debug, Clone, Default)]
pub struct CompressOptions {
    /// The receiving LLM's tokenizer: the budget, the totals, the chunk
    /// counts and the dropped manifest are counted in it, and what is sent
    /// ([`Compressed::sent_text`]: the chunks joined by
    /// [`CHUNK_SEPARATOR`]) never counts more than the budget in it. `None`:
    /// the encoder's own tokenizer, chunk counts summed (separators not
    /// counted), as before. A session remembers it for adaptive requests.
    pub budget_tokenizer: Option<BudgetTokenizer>,
    /// Say why each chunk was sent or dropped ([`Compressed::explanation`]).
    pub explain: bool,
    /// Wrap the selection (a report format): [`Compressed::text`] is what
    /// it returns, counted within the budget (in the budget tokenizer, or
    /// the encoder's), wrapping included. `None`: the chunks joined by
    /// [`CHUNK_SEPARATOR`].
    pub envelope: Option<Envelope>,
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
    /// The namespace of a client-chosen `id`: the caller's identity, else
    /// its address (the service sets it); `None`: the one shared namespace.
    /// Generated ids are global.
    pub scope: Option<String>,
    /// When opening: the session's total over every reply (this answer and
    /// all follow-ups). `None`: no total; each reply is bounded by its own
    /// budget only.
    pub max_total_tokens: Option<usize>,
    /// When opening: tokens of this answer's budget held back for
    /// follow-ups. The answer sends at most `budget - reserve_tokens`, and
    /// the session's total defaults to the budget.
    pub reserve_tokens: usize,
}

impl std::fmt::Debug for SessionRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionRequest")
            .field("id", &self.id)
            .field("token", &self.token.as_ref().map(|_| "<secret>"))
            .field("caller", &self.caller)
            .field("scope", &self.scope)
            .field("max_total_tokens", &self.max_total_tokens)
            .field("reserve_tokens", &self.reserve_tokens)
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
    /// Tokens in the budget tokenizer.
    pub tokens: usize,
    /// Which chunker cut it (`tree-sitter:rust`, `heuristic:code`, `prose`, ...).
    pub chunker: &'static str,
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
    /// Tokens it would cost, in the budget tokenizer.
    pub tokens: usize,
}

/// Token totals and reduction ratios, counted in `tokenizer`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Totals {
    /// Tokens of the whole (non-confidential) context, C: with a budget
    /// tokenizer, its fields' contents counted whole; otherwise the sum of
    /// the chunks' counts.
    pub context_tokens: usize,
    /// Tokens sent: with a budget tokenizer, the count of
    /// [`Compressed::sent_text`]; otherwise the sum of the chunks' counts.
    pub sent_tokens: usize,
    /// C / sent: the ratio achieved.
    pub reduction_ratio: f32,
    /// Theorem 1: C / (k·c + d), d the embedding dimension.
    pub r_theorem1: f32,
    /// Which tokenizer counted (`e5` for the encoder's own, `o200k`, ...).
    pub tokenizer: String,
    /// C / budget: the ratio asked for.
    pub requested_ratio: f32,
}

/// Why the selection is what it is ([`CompressOptions::explain`]).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Explanation {
    /// The weight of `lexical_z` in the score.
    pub lexical_weight: f32,
    /// Per sent chunk, in reading order (as [`Compressed::chunks`]).
    pub selected: Vec<ChunkWhy>,
    /// Per dropped chunk, best score first (confidential fields are never listed).
    pub dropped: Vec<DropWhy>,
}

/// Why a chunk was sent: `score = dense_z + lexical_weight·lexical_z +
/// group_lift + link_lift + hop_lift + rerank_lift`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ChunkWhy {
    /// Chunk id.
    pub id: String,
    /// When packing took it, 1-based (required chunks first).
    pub order: usize,
    /// The fused score.
    pub score: f32,
    /// z-score of the dense (cosine) similarity to the task.
    pub dense_z: f32,
    /// z-score of BM25 (before the lexical weight).
    pub lexical_z: f32,
    /// Lift from the best chunk of its group, plus what the chunk's kind and
    /// text add (a log line's severity, a lexical score that stands out).
    pub group_lift: f32,
    /// Lift from links (a document the task or a top chunk names, a name it
    /// defines, a code sibling whose differing word the task names).
    pub link_lift: f32,
    /// Lift from the second hop (the task re-embedded with its best chunks).
    pub hop_lift: f32,
    /// Lift from the second stage (the cross-encoder's z-score among the
    /// first stage's best, times `rerank_weight`; 0 when off).
    pub rerank_lift: f32,
    /// It leads its group (a paragraph's first sentence, a table header).
    pub lead: bool,
    /// A chunk of its group brought it (closure: the group's lead and a
    /// container's closing line, or the rest of a small group).
    pub by_closure: bool,
    /// Its field is required (sent whole, first).
    pub required: bool,
    /// Tokens in the budget tokenizer.
    pub tokens: usize,
    /// The chunker that made it (`prose`, `log`, `json`, `chat`, `table`,
    /// `heuristic:code`, `tree-sitter:<language>`); `None` only when read
    /// back from a reply that did not carry it.
    pub chunker: Option<String>,
}

/// Why a chunk was not sent.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DropWhy {
    /// Chunk id.
    pub id: String,
    /// The fused score.
    pub score: f32,
    /// Tokens it would cost, in the budget tokenizer.
    pub tokens: usize,
    /// Why.
    #[serde(flatten)]
    pub reason: DropReason,
}

/// The reason a chunk was dropped.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "reason", rename_all = "snake_case")]
pub enum DropReason {
    /// Under a relevance threshold: `threshold` names it
    /// (`relevance_threshold`: cosine; `min_relative_score`: z of the score).
    BelowThreshold {
        /// `relevance_threshold` or `min_relative_score`.
        threshold: &'static str,
        /// The chunk's value that was compared (cosine or z).
        value: f32,
    },
    /// It did not fit what was left of the budget.
    OutOfBudget,
    /// A near-duplicate (or copy) of the chunk `of`, which was sent.
    NearDuplicate {
        /// The sent chunk's id.
        of: String,
    },
    /// Its field is not listed in `optional_fields`.
    NotEligible,
    /// A container's header or closing line (`impl Foo for Bar {`, `}`):
    /// it is sent only with a member of its group, and none was.
    StructureOnly,
}

/// Where time went, in milliseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Timings {
    /// Chunking, token counting and embedding the chunks (cache misses only).
    pub prepare_ms: f64,
    /// Embedding the task (and, with the second hop, embedding it again
    /// with its bridge chunks).
    pub task_embed_ms: f64,
    /// Of `task_embed_ms`, the second hop's embedding (0 when it is off or
    /// found nothing to hop from).
    pub hop_embed_ms: f64,
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
    /// Why each chunk was sent or dropped, when asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub explanation: Option<Explanation>,
    /// What `text` holds beyond `chunks`: the lines around each code piece
    /// ([`ScoringConfig::code_context_lines`]), in reading order.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub margins: Vec<Margin>,
    /// Exactly what the receiver pastes: the envelope's text, or the chunks
    /// in reading order, each piece under its header line and each code
    /// piece with the lines around it (`margins`). With a budget tokenizer
    /// or an envelope it is counted whole and never exceeds the budget
    /// (`totals.sent_tokens` is its count).
    pub text: String,
}

impl Compressed {
    /// What the receiver gets ([`Compressed::text`]).
    pub fn sent_text(&self) -> String {
        self.text.clone()
    }
}

/// Lines of a field that the text holds beside the selected chunks (the
/// lines around a code piece, as a diff hunk shows them).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Margin {
    /// The field they come from.
    pub field: String,
    /// Their byte span in the field's content.
    pub span: (usize, usize),
}

/// The chunk texts joined as the receiver reads them.
pub fn joined_text(chunks: &[SelectedChunk]) -> String {
    chunks.iter().map(|c| c.text.as_str()).collect::<Vec<_>>().join(CHUNK_SEPARATOR)
}

/// Answer to an adaptive context request.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MoreContext {
    /// New chunks, never sent before in this session, in reading order.
    pub chunks: Vec<SelectedChunk>,
    /// Exactly what the receiver pastes: the new chunks in pieces under
    /// their header lines (code pieces with the lines around them that the
    /// receiver does not hold), within this reply's budget.
    pub text: String,
    /// Tokens of `text` in the session's budget tokenizer.
    pub sent_tokens: usize,
    /// The reply's budget: the request's own, or the session's default
    /// (the opening answer's budget), cut to what the session's total left.
    pub budget: usize,
    /// Tokens sent in this session so far, this reply included.
    pub session_sent_tokens: usize,
    /// The most the next follow-up can get without naming a budget: the
    /// session's default reply budget, cut to what its total leaves.
    pub remaining_tokens: usize,
    /// Why nothing (or less than the budget) was sent.
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
    /// The namespace of a client-chosen session id (as
    /// [`SessionRequest::scope`]).
    pub scope: Option<String>,
    /// What the receiver needs.
    pub specific_question: String,
    /// Its confidence, in [0, 1].
    pub current_confidence: f32,
    /// Why it needs more.
    pub reasoning: String,
    /// Ids from the dropped manifest it wants.
    pub chunk_ids: Vec<String>,
    /// This reply's own budget (tokens, in the session's budget tokenizer).
    /// `None`: the session's default, the budget of the answer that opened
    /// it. Cut to what the session's total leaves, when it has one.
    pub max_tokens: Option<usize>,
    /// The caller's id for this request (1 to 64 printable ASCII
    /// characters): a retry of a request whose answer was lost (the
    /// connection broke, a replica died) names the same id and gets the
    /// same reply again, instead of new chunks with the first ones lost.
    /// Only the session's last request is remembered.
    pub request_id: Option<String>,
}

impl std::fmt::Debug for ContextRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ContextRequest")
            .field("session_id", &self.session_id)
            .field("session_token", &"<secret>")
            .field("caller", &self.caller)
            .field("scope", &self.scope)
            .field("specific_question", &Redacted(self.specific_question.len()))
            .field("current_confidence", &self.current_confidence)
            .field("reasoning", &Redacted(self.reasoning.len()))
            .field("chunk_ids", &self.chunk_ids)
            .field("max_tokens", &self.max_tokens)
            .field("request_id", &self.request_id)
            .finish()
    }
}

pub use crate::shared::LastReply;

/// One chunk and its features ([`Scd::chunk_features`]).
#[derive(Debug, Clone, PartialEq)]
pub struct ChunkFeatures {
    /// Its field, among the context's public fields.
    pub field: usize,
    /// Its byte span in that field.
    pub span: (usize, usize),
    /// Its tokens in the encoder's tokenizer.
    pub tokens: usize,
    /// Its group (field, group within the field): what packing's closure
    /// brings together.
    pub group: (usize, usize),
    /// Whether it leads its group (closure brings it with any member).
    pub lead: bool,
    /// Whether its field is prose (a small prose group comes whole).
    pub prose: bool,
    /// The hand-weighted sum's score of it.
    pub hand: f32,
    /// What the header line of a piece it opens costs, in the encoder's
    /// tokens (the budget pays it once per piece; no lines around code).
    pub header: usize,
    /// [`FEATURES`], in order.
    pub features: Features,
}

/// A session's ledger: what the receiver holds and what it may still get.
struct Ledger {
    context: Arc<PreparedContext>,
    sent: HashSet<usize>,
    /// Tokens sent over every reply.
    total_sent: usize,
    /// The session's total over every reply, if it has one.
    cap: Option<usize>,
    /// A follow-up's budget when it names none.
    reply_budget: usize,
    /// The budget tokenizer the session counts in, and each chunk's count in it.
    counting: Counting,
    /// The last adaptive reply, when its request named an id.
    last: Option<LastReply>,
}

impl Ledger {
    /// What the session's total leaves (unbounded without one).
    fn total_left(&self) -> usize {
        self.cap.map_or(usize::MAX, |c| c.saturating_sub(self.total_sent))
    }

    /// The most a follow-up naming no budget gets.
    fn remaining(&self) -> usize {
        self.reply_budget.min(self.total_left())
    }
}

/// Chunk counts in a request's budget tokenizer, and the separator's cost.
#[derive(Clone)]
pub(super) struct Counting {
    pub(super) tokenizer: Option<BudgetTokenizer>,
    pub(super) tokens: Arc<[usize]>,
    /// Tokens of [`CHUNK_SEPARATOR`] (0 without a budget tokenizer).
    pub(super) separator: usize,
}

impl Counting {
    /// The budget tokenizer's name.
    pub(super) fn name(&self) -> String {
        self.tokenizer.as_ref().map_or(crate::budget::E5, |t| t.name()).to_string()
    }
}

/// The SCD engine: an encoder, an embedding cache and session ledgers.
pub struct Scd {
    encoder: Arc<dyn Encoder>,
    /// Texts and tokens this engine has had the encoder embed (cache misses).
    encoded: [std::sync::atomic::AtomicU64; 2],
    cache: EmbeddingCache,
    sessions: sessions::Sessions,
    prepared: moka::sync::Cache<[u8; 32], Arc<PreparedContext>>,
    cfg: ScdConfig,
    /// The second stage's cross-encoder, when one is configured.
    reranker: Option<Arc<dyn CrossEncoder>>,
}

impl std::fmt::Debug for Scd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scd")
            .field("model", &self.encoder.model_id())
            .field("reranker", &self.reranker.as_ref().map(|r| r.model_id()))
            .field("cache", &self.cache)
            .finish()
    }
}

/// Chunk ids one adaptive request may name.
pub const MAX_CHUNK_IDS: usize = 1024;

/// A cut function's pieces rank no higher than its signature, which is
/// embedded with the whole function and so scores the function as a
/// whole: the function comes at its own rank (whole, by closure, when it
/// fits), and is trimmed to its best pieces only when it does not. The
/// pieces keep their own order below the signature, the k-th best at most
/// `step` × k below it.
fn cap_function_pieces(prepared: &PreparedContext, parts: &mut Scores, step: f32) {
    for (g, mut members) in prepared.cut_function_chunks() {
        // the body pieces: not the signature, not the closing line
        members.retain(|&j| !prepared.chunks[j].lead && !prepared.chunks[j].rides);
        let top = parts.fused[prepared.cut_functions[&g]];
        members.sort_by(|&a, &b| parts.fused[b].total_cmp(&parts.fused[a]));
        for (k, j) in members.into_iter().enumerate() {
            let capped = top - step * (k + 1) as f32;
            if parts.fused[j] > capped {
                parts.group_lift[j] += capped - parts.fused[j];
                parts.fused[j] = capped;
            }
        }
    }
}

/// Texts per encoder call when embedding a context's chunks: the unit
/// between cancellation checks.
pub const EMBED_SLICE: usize = 256;

/// Bytes of text per encoder call when embedding a context's chunks (about
/// 16k tokens: a few seconds of CPU), so a cancelled call stops soon.
pub const EMBED_SLICE_BYTES: usize = 64 << 10;

impl Scd {
    /// An engine over `encoder`.
    pub fn new(encoder: Arc<dyn Encoder>, cfg: ScdConfig) -> Self {
        let sessions = sessions::Sessions::Local(SessionStore::new(SessionLimits {
            ttl: cfg.sessions.session_ttl,
            max_sessions: cfg.sessions.max_sessions,
            max_bytes: cfg.sessions.session_bytes,
        }));
        let prepared = moka::sync::Cache::builder()
            .max_capacity(cfg.prepare.prepared_cache_bytes as u64)
            .weigher(|_, p: &Arc<PreparedContext>| u32::try_from(p.bytes).unwrap_or(u32::MAX))
            .build();
        let disk = cfg.prepare.embedding_store.as_ref().map(|p| DiskTier::new(p, cfg.prepare.embedding_store_bytes));
        let cache = EmbeddingCache::new(cfg.prepare.cache_bytes).with_disk(disk);
        Self { cache, encoder, encoded: Default::default(), sessions, prepared, cfg, reranker: None }
    }

    /// This engine with a second stage: `reranker` rescores the best
    /// chunks when `scoring.rerank_weight` is above 0 ([`ScoringConfig::rerank_weight`]).
    pub fn with_reranker(mut self, reranker: Option<Arc<dyn CrossEncoder>>) -> Self {
        self.reranker = reranker;
        self
    }

    /// The second stage's cross-encoder, when one is configured.
    pub fn reranker(&self) -> Option<&Arc<dyn CrossEncoder>> {
        self.reranker.as_ref()
    }

    /// The encoder.
    pub fn encoder(&self) -> &Arc<dyn Encoder> {
        &self.encoder
    }

    /// Cache counters.
    pub fn cache_stats(&self) -> CacheStats {
        self.cache.stats()
    }

    /// Texts and tokens (specials included) the encoder embedded for this
    /// engine so far: the work compressions and follow-ups cost it, cache
    /// hits not counted.
    pub fn encoded(&self) -> (u64, u64) {
        use std::sync::atomic::Ordering::Relaxed;
        (self.encoded[0].load(Relaxed), self.encoded[1].load(Relaxed))
    }

    /// The configuration.
    pub fn config(&self) -> &ScdConfig {
        &self.cfg
    }

    /// Replaces the configuration (a tuning sweep tries many on one engine
    /// and its caches). Prepared contexts are dropped when anything that
    /// shapes them (chunking, the HNSW index, near-duplicates) changed.
    pub fn reconfigure(&mut self, cfg: ScdConfig) {
        let (a, b) = (&self.cfg, &cfg);
        if a.prepare.chunk != b.prepare.chunk
            || a.prepare.hnsw != b.prepare.hnsw
            || a.prepare.hnsw_min_chunks != b.prepare.hnsw_min_chunks
            || a.scoring.redundancy_cosine != b.scoring.redundancy_cosine
            || a.prepare.near_duplicate_neighbours != b.prepare.near_duplicate_neighbours
            || a.sessions.stub_words != b.sessions.stub_words
            || a.prepare.embed_neighbour != b.prepare.embed_neighbour
        {
            self.prepared.invalidate_all();
        }
        self.cfg = cfg;
    }

    /// Compresses a context for a task under the receiver's requirement.
    pub fn compress(&self, req: &CompressRequest) -> Result<Compressed> {
        self.compress_with(req, &Cancel::new())
    }

    /// [`Scd::compress`] that stops with [`Error::Cancelled`] or
    /// [`Error::DeadlineExceeded`] between stages once `cancel` says so.
    pub fn compress_with(&self, req: &CompressRequest, cancel: &Cancel) -> Result<Compressed> {
        self.compress_opts(req, &CompressOptions::default(), cancel)
    }

    /// The budget LLMLingua's `rate` keeps of `context` (see
    /// [`crate::budget::rate_budget`]; check it with
    /// [`crate::budget::check_rate`] first): its non-confidential fields
    /// counted in `tokenizer` (the encoder's own when `None`), times `rate`,
    /// rounded down; at least 1 and at most `max_budget_tokens`.
    pub fn rate_budget(&self, context: &Context, tokenizer: Option<&BudgetTokenizer>, rate: f64) -> Result<usize> {
        let mut tokens = 0;
        for f in context.fields.iter().filter(|f| !f.confidential) {
            tokens += match tokenizer {
                Some(t) => t.count(&f.content)?,
                None => self.encoder.count_tokens(&f.content)?,
            };
        }
        Ok(crate::budget::rate_budget(tokens, rate).min(self.cfg.limits.max_budget_tokens))
    }

    /// [`Scd::compress_with`] counting in a budget tokenizer and explaining
    /// the selection, as `opts` asks.
    #[instrument(skip_all, fields(fields = req.context.fields.len(), budget = req.requirement.max_context_tokens))]
    pub fn compress_opts(&self, req: &CompressRequest, opts: &CompressOptions, cancel: &Cancel) -> Result<Compressed> {
        retry_contended(|| self.compress_once(req, opts, cancel))
    }

    /// With [`Scorer::Learned`], replaces the hand sum in `parts` with the
    /// learned score and its parts; then tells code siblings apart by
    /// `query` (a link lift), adds what a chunk's kind and text add (a log
    /// or chat line's BM25 share, a BM25 z-score that stands out, a log
    /// line's severity: [`Scores::lift_group`]) and caps a cut function's
    /// pieces.
    fn rescore(&self, prepared: &PreparedContext, query: &str, parts: &mut Scores) {
        if self.cfg.scoring.scorer == Scorer::Learned && !prepared.chunks.is_empty() {
            features::learned(prepared, parts, LearnedScorer::shipped());
        }
        for (i, lift) in self.sibling_lift(prepared, query).into_iter().enumerate().filter(|(_, l)| *l != 0.0) {
            parts.fused[i] += lift;
            parts.link_lift[i] += lift;
        }
        if self.cfg.scoring.line_lexical_weight != 0.0 {
            let lines = prepared.chunks.iter().enumerate().filter(|(_, c)| matches!(c.chunker, "log" | "chat"));
            for (i, _) in lines {
                parts.lift_group(i, self.cfg.scoring.line_lexical_weight * parts.lexical_z[i]);
            }
        }
        let (w, from) = (self.cfg.scoring.lexical_excess_weight, self.cfg.scoring.lexical_excess_from);
        if w != 0.0 {
            for i in 0..parts.lexical_z.len() {
                let z = parts.lexical_z[i];
                if z > from {
                    parts.lift_group(i, w * (z - from));
                }
            }
        }
        if self.cfg.scoring.severity_weight != 0.0 {
            for (i, c) in prepared.chunks.iter().enumerate().filter(|(_, c)| c.severity > 0) {
                let sc = &self.cfg.scoring;
                let lift = match c.severity {
                    3.. => sc.severity_weight + sc.exception_weight,
                    2 => sc.severity_weight,
                    _ => 0.4 * sc.severity_weight,
                };
                parts.lift_group(i, lift);
            }
        }
        if self.cfg.scoring.function_pieces_capped {
            cap_function_pieces(prepared, parts, self.cfg.scoring.function_piece_step);
        }
    }

    /// The weight of the lexical z-score in the fused score (the learned
    /// scorer's when it scores).
    fn lexical_weight(&self) -> f32 {
        match self.cfg.scoring.scorer {
            Scorer::Hand => self.cfg.scoring.lexical_weight,
            Scorer::Learned => LearnedScorer::shipped().weight("lexical_z"),
        }
    }

    /// Every chunk of `req`'s context (its public fields, as compression
    /// sees them) with its features for the task: field index (among the
    /// public fields), byte span, tokens, and [`FEATURES`] values. What a
    /// learned scorer is fitted on (`scd-dev eval --dump-features`).
    pub fn chunk_features(&self, req: &CompressRequest, cancel: &Cancel) -> Result<Vec<ChunkFeatures>> {
        req.context.validate_within(&self.cfg.limits.context_limits)?;
        let split = Split::new(&req.context);
        let task_text = req.task.text();
        let prepared = self.prepare(&split.public, cancel)?;
        let task_vec = self.embed_cached_with(&[task_text.as_str()], InputKind::Query, cancel)?.remove(0);
        let mut parts = self.score(&prepared, &task_vec, &task_text);
        self.second_hop(&prepared, &task_text, &mut parts, cancel)?;
        let rows = features::features(&prepared, &parts);
        let header = self.header_costs(&prepared, &self.counting(&prepared, None)?, 0)?;
        Ok(prepared
            .chunks
            .iter()
            .zip(rows)
            .zip(&parts.fused)
            .zip(header)
            .map(|(((c, x), &hand), header)| ChunkFeatures {
                field: c.field,
                span: c.span,
                tokens: c.tokens,
                group: c.group,
                lead: c.lead,
                prose: prepared.is_prose(c.field),
                hand,
                header,
                features: x,
            })
            .collect())
    }

    /// Tokens of `text` as the receiver counts it: in the budget tokenizer,
    /// else the encoder's.
    pub(super) fn count_text(&self, counting: &Counting, text: &str) -> Result<usize> {
        match &counting.tokenizer {
            Some(t) => t.count(text),
            None => self.encoder.count_tokens(text),
        }
    }
}

/// Redoes `attempt` while another replica keeps committing to its session
/// first (a shared store only), a few times with a short jittered pause.
pub(super) fn retry_contended<T>(mut attempt: impl FnMut() -> Result<T>) -> Result<T> {
    let mut tries = 0;
    loop {
        match attempt() {
            Err(Error::SessionContended { .. }) if tries < 4 => {
                tries += 1;
                let ms = rand::Rng::random_range(&mut rand::rng(), 1..=5u64 << tries);
                std::thread::sleep(std::time::Duration::from_millis(ms));
            }
            r => return r,
        }
    }
}

#[cfg(test)]
mod chat_tests;
#[cfg(test)]
mod code_tests;
#[cfg(test)]
mod log_tests;
#[cfg(test)]
mod more_tests;
#[cfg(test)]
mod tests;
