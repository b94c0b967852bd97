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

mod assemble;
mod config;
mod more;
mod pack;
mod prepare;
mod score;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Instant;

use serde::Serialize;
use tracing::{debug, instrument};

pub use self::config::ScdConfig;
use self::prepare::{PreparedContext, Split};
use crate::cache::{CacheStats, EmbeddingCache};
use crate::cancel::Cancel;
use crate::context::{Context, ContextRequirement, Redacted, Task};
use crate::encoder::{Encoder, InputKind};
use crate::score::{dot, zscores};
use crate::session::{SessionGrant, SessionLimits, SessionStats, SessionStore};
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

impl std::fmt::Debug for Scd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scd").field("model", &self.encoder.model_id()).field("cache", &self.cache).finish()
    }
}

/// Chunk ids one adaptive request may name.
pub const MAX_CHUNK_IDS: usize = 1024;

/// Texts per encoder call when embedding a context's chunks: the unit
/// between cancellation checks.
pub const EMBED_SLICE: usize = 256;

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

    /// Closes a session; `Ok(false)` when none was open under `id`. The
    /// token (and the caller, for a session bound to one) must match.
    pub fn close_session(&self, id: &str, token: &str, caller: Option<&str>) -> Result<bool> {
        self.sessions.close(id, token, caller)
    }

    /// Live sessions, their bytes, evictions and expiries.
    pub fn session_stats(&self) -> SessionStats {
        self.sessions.stats()
    }
}
