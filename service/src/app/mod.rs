//! The application core: what every surface (gRPC, REST, MCP, A2A) shares.
//!
//! [`Core`] owns the engine, the limits, each caller's shares of the compress
//! slots, count slots and embed queue ([`shares`]), the true retry hints
//! ([`wait`]), the embedding [`batcher`] and its fair [`queue`], the
//! [`metrics`], the [`audit`] trail and cancellation. Its methods take
//! domain inputs and a [`Call`] (who calls, from where, until when) and
//! answer domain outputs or one [`AppError`], which each transport turns
//! into its own error with one `From`.
//!
//! CPU work never runs on the async runtime: embeddings go through the
//! [`batcher`] thread (token-budget batches, fail-stop); compression runs on
//! `spawn_blocking` behind a semaphore. Every queue is bounded and a full one
//! is refused with a retry hint (logged at most once per 10 s per kind,
//! [`ratelog`]). Past a call's deadline the engine is told to stop at its
//! next stage boundary, which frees the slot.
//!
//! ```no_run
//! # async fn f(core: &scd_service::app::Core) -> Result<(), scd_service::app::AppError> {
//! use scd_service::app::Call;
//! let call = Call::new("REST", "CountTokens").from(None, Some("127.0.0.1:4000".into()));
//! let tokens = core.count_tokens(&call, vec!["fn main() {}".into()], None).await?;
//! # Ok(()) }
//! ```

pub mod audit;
pub mod batcher;
mod code;
pub mod compress;
mod error;
pub mod json;
pub mod metrics;
pub mod more;
pub mod queue;
pub mod ratelog;
mod readiness;
pub mod shares;
pub mod wait;

use std::sync::Arc;
use std::time::{Duration, Instant};

use scd_engine::budget::{BudgetTokenizer, TokenizerRegistry};
use scd_engine::cancel::Cancel;
use scd_engine::encoder::{EncodeOptions, Encoded};
use scd_engine::extract::Scd;
use tokio::sync::{oneshot, Semaphore};

use self::batcher::{BatchLimits, Batcher, Job, Refused, Reply};
use self::metrics::Metrics;
use self::ratelog::RateLimitedWarn;
use self::wait::{overloaded, past_share};

pub use self::code::Code;
pub use self::error::{AppError, Result};
pub use self::readiness::{Readiness, Ready};

/// Per-request limits.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Texts per Embed request.
    pub max_texts: usize,
    /// Bytes of one Embed / CountTokens text.
    pub max_text_bytes: usize,
    /// Fields per Compress request.
    pub max_fields: usize,
    /// Largest request message.
    pub max_request_bytes: usize,
    /// Queued embed requests.
    pub queue_size: usize,
    /// Texts (rows) merged into one encoder call at most.
    pub batch_texts: usize,
    /// Tokens (2 specials per text included) merged into one encoder call at
    /// most; a single request over it runs alone.
    pub max_batch_tokens: usize,
    /// Compress/RequestContext calls running or waiting at once.
    pub max_concurrent_compress: usize,
}

/// One call to the core: the surface and method it came through (the audit
/// trail's name for it), the caller's verified identity (a DID or a TLS
/// client certificate's), its transport address and its deadline.
#[derive(Debug, Clone, Default)]
pub struct Call {
    /// The surface and the core's method, as the audit trail names the
    /// call: `gRPC Compress`, `REST OpenSession`, `MCP RequestContext`,
    /// `A2A OpenSession` (see [`Call::new`]).
    pub method: String,
    /// The verified identity; sessions opened with one are bound to it.
    pub caller: Option<String>,
    /// The transport address (`ip:port`; the audit trail's `peer`).
    pub peer: Option<String>,
    /// When the caller stops waiting.
    pub deadline: Option<Instant>,
}

impl Call {
    /// A call of the core's `method` (`Compress`, `OpenSession`,
    /// `RequestContext`, `CloseSession`, `Handoff`, `CountTokens`, `Embed`)
    /// through `surface` (`gRPC`, `REST`, `MCP`, `A2A`): the audit trail's
    /// one scheme names it `{surface} {method}`, whatever the surface's own
    /// name for the call (an MCP tool, an A2A `SendMessage`, a REST route).
    pub fn new(surface: &str, method: &str) -> Call {
        Call { method: format!("{surface} {method}"), ..Call::default() }
    }

    /// The call from `caller` at `peer`.
    pub fn from(mut self, caller: Option<String>, peer: Option<String>) -> Call {
        self.caller = caller;
        self.peer = peer;
        self
    }

    /// The call, answered by `deadline` at the latest.
    pub fn until(mut self, deadline: Option<Instant>) -> Call {
        self.deadline = deadline;
        self
    }

    /// The caller's share key ([`shares::key`]): its DID, else its IP.
    pub fn who(&self) -> String {
        shares::key(self.caller.as_deref(), self.peer.as_deref())
    }
}

/// The application core that every surface calls.
pub struct Core {
    pub(crate) scd: Arc<Scd>,
    pub(crate) batcher: Batcher,
    pub(crate) compress_slots: Arc<Semaphore>,
    /// CountTokens' own lane: cheap calls are not refused because
    /// compressions hold every compress slot.
    count_slots: Arc<Semaphore>,
    /// Each caller's share of the compress slots (a quarter).
    compress_shares: Arc<shares::Shares>,
    /// Each caller's share of the embed queue (an eighth).
    embed_shares: Arc<shares::Shares>,
    /// Each caller's share of the count slots (a quarter).
    count_shares: Arc<shares::Shares>,
    /// How long a compress slot, a count slot and an embed-queue place are
    /// held, for the retry hints.
    compress_pace: Arc<shares::Pace>,
    count_pace: Arc<shares::Pace>,
    embed_pace: Arc<shares::Pace>,
    /// The compress and count calls in flight, for true retry hints.
    compress_calls: Arc<wait::InFlight>,
    count_calls: Arc<wait::InFlight>,
    pub(crate) limits: Limits,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) audit: Option<Arc<scd_audit::AuditLog>>,
    /// Who may read the audit trail ([`audit::AuditAccess`]).
    pub(crate) audit_access: audit::AuditAccess,
    /// The `current_confidence` a hand-off report's confidence level stands
    /// for (`--confidence-map`).
    pub(crate) confidence_map: scd_engine::handoff::ConfidenceMap,
    /// Audit streams scanning at once ([`audit::MAX_AUDIT_STREAMS`]).
    pub(crate) audit_readers: Arc<Semaphore>,
    /// The budget tokenizers requests may name.
    pub(crate) tokenizers: Arc<TokenizerRegistry>,
    /// Whether it takes work (`GET /ready`), set by the server.
    pub(crate) readiness: Arc<Readiness>,
}

/// An embed request waiting in the batcher ([`Core::embed_submit`]).
pub struct PendingEmbed {
    rx: oneshot::Receiver<Reply>,
    start: Instant,
    /// Cancels the job's encoding when the caller goes away (dropped).
    _cancel: scd_engine::cancel::CancelOnDrop,
    /// The caller's place in the embed queue's shares, until answered.
    _share: shares::ShareGuard,
}

/// Embeddings as the core answers them.
#[derive(Debug)]
pub struct Embedded {
    /// One row per text, with its tokens and windows.
    pub encoded: Encoded,
    /// The model's id.
    pub model: String,
    /// Time queued for the encoder, ms.
    pub queue_ms: f64,
    /// Time from submission to the answer, ms.
    pub total_ms: f64,
}

static COMPRESS_FULL: RateLimitedWarn = RateLimitedWarn::new("compress_slots_full");
static COUNT_FULL: RateLimitedWarn = RateLimitedWarn::new("count_slots_full");

/// CountTokens calls in flight at once (tokenizing only: a few ms each).
pub const COUNT_SLOTS: usize = 4;

/// Which slots a blocking call waits behind.
#[derive(Debug, Clone, Copy)]
enum Lane {
    /// Compress, RequestContext, Handoff: the engine's heavy work.
    Compress,
    /// CountTokens.
    Count,
}

fn deadline_exceeded(while_: &str, start: Instant) -> AppError {
    AppError::deadline(format!("deadline exceeded after {:.0} ms {while_}", ms(start)))
}

/// Waits for `f`, or answers a deadline error at `deadline`.
async fn until<T>(
    deadline: Option<Instant>,
    while_: &str,
    start: Instant,
    f: impl std::future::Future<Output = T>,
) -> Result<T> {
    match deadline {
        Some(d) => tokio::time::timeout_at(d.into(), f).await.map_err(|_| deadline_exceeded(while_, start)),
        None => Ok(f.await),
    }
}

/// Milliseconds since `since`.
pub(crate) fn ms(since: Instant) -> f64 {
    since.elapsed().as_secs_f64() * 1e3
}

/// Count, size and NUL checks of the texts of an embed or count call: the
/// work and memory of one call stay bounded.
pub fn check_texts(texts: &[String], max_texts: usize, max_text_bytes: usize) -> Result<()> {
    if texts.len() > max_texts {
        return Err(AppError::invalid(format!("texts: {} texts, over the limit {max_texts}", texts.len())));
    }
    for (i, t) in texts.iter().enumerate() {
        if t.len() > max_text_bytes {
            return Err(AppError::invalid(format!(
                "texts[{i}]: {} bytes, over the limit {max_text_bytes} (--max-text-bytes)",
                t.len()
            )));
        }
        scd_engine::context::check_no_nul(|| format!("texts[{i}]"), t)
            .map_err(|e| AppError::from(scd_engine::Error::from(e)))?;
    }
    Ok(())
}

/// The checks of an embed call's texts: at least one, within
/// [`check_texts`]' bounds, none empty.
pub fn check_embed_texts(texts: &[String], max_texts: usize, max_text_bytes: usize) -> Result<()> {
    if texts.is_empty() {
        return Err(AppError::invalid("texts: must hold at least one text"));
    }
    check_texts(texts, max_texts, max_text_bytes)?;
    if let Some(i) = texts.iter().position(|t| t.trim().is_empty()) {
        return Err(AppError::invalid(format!("texts[{i}]: must not be empty")));
    }
    Ok(())
}

/// The refusal of an empty session id.
pub(crate) fn empty_session(id: &str) -> Result<()> {
    if id.is_empty() {
        return Err(AppError::invalid_param(scd_engine::Param::SessionId, "must not be empty"));
    }
    Ok(())
}

impl Core {
    /// A core over `scd`.
    pub fn new(scd: Arc<Scd>, limits: Limits, metrics: Arc<Metrics>) -> Self {
        let batch = BatchLimits {
            queue_size: limits.queue_size,
            batch_texts: limits.batch_texts,
            max_batch_tokens: limits.max_batch_tokens,
            max_request_tokens: scd.config().limits.max_encoder_tokens,
        };
        let batcher = Batcher::start(scd.encoder().clone(), batch, metrics.clone());
        Self {
            compress_slots: Arc::new(Semaphore::new(limits.max_concurrent_compress.max(1))),
            count_slots: Arc::new(Semaphore::new(COUNT_SLOTS)),
            compress_shares: shares::Shares::new(limits.max_concurrent_compress.max(1), 4),
            embed_shares: shares::Shares::new(limits.queue_size.max(1), 8),
            count_shares: shares::Shares::new(COUNT_SLOTS, 4),
            compress_pace: Arc::default(),
            count_pace: Arc::default(),
            embed_pace: Arc::default(),
            compress_calls: Arc::default(),
            count_calls: Arc::default(),
            scd,
            batcher,
            limits,
            metrics,
            audit: None,
            audit_access: audit::AuditAccess::default(),
            confidence_map: scd_engine::handoff::ConfidenceMap::default(),
            audit_readers: Arc::new(Semaphore::new(audit::MAX_AUDIT_STREAMS)),
            tokenizers: Arc::new(TokenizerRegistry::new()),
            readiness: Arc::default(),
        }
    }

    /// The budget tokenizers requests may name: the built-ins and those
    /// `scd serve --budget-tokenizer NAME=PATH` registered.
    pub fn with_tokenizers(mut self, tokenizers: TokenizerRegistry) -> Self {
        self.tokenizers = Arc::new(tokenizers);
        self
    }

    /// Records the audited calls in `log` (see [`audit`]).
    pub fn with_audit(mut self, log: Option<Arc<scd_audit::AuditLog>>) -> Self {
        self.audit = log;
        self
    }

    /// Who may read the audit trail (the operator's token,
    /// `--audit-token-file`); by default only verified callers, each its
    /// own records.
    pub fn with_audit_access(mut self, access: audit::AuditAccess) -> Self {
        self.audit_access = access;
        self
    }

    /// Reads hand-off reports' confidence levels through `map`.
    pub fn with_confidence_map(mut self, map: scd_engine::handoff::ConfidenceMap) -> Self {
        self.confidence_map = map;
        self
    }

    /// The limits it enforces.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// The handle to the batching thread.
    pub fn batcher(&self) -> &Batcher {
        &self.batcher
    }

    /// The engine.
    pub fn scd(&self) -> &Arc<Scd> {
        &self.scd
    }

    /// The metrics recorder.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// Embeds `texts` (already checked against the limits) for `call`.
    pub async fn embed(&self, call: &Call, texts: Vec<String>, opts: EncodeOptions) -> Result<Embedded> {
        let pending = self.embed_submit(call.deadline, &call.who(), texts, opts)?;
        self.embed_wait(pending, call.deadline).await
    }

    /// Queues checked texts for the batcher on `who`'s share of the queue.
    pub fn embed_submit(
        &self,
        deadline: Option<Instant>,
        who: &str,
        texts: Vec<String>,
        opts: EncodeOptions,
    ) -> Result<PendingEmbed> {
        let start = Instant::now();
        let caller = shares::unit(who);
        let share = self.embed_shares.take(who).map_err(|p| {
            self.metrics.rejected("embed_caller_share");
            past_share("embed queue", p, self.batcher.wait_ms(Some(&caller)), &self.embed_pace)
        })?;
        let (tx, rx) = oneshot::channel();
        let cancel = deadline.map(Cancel::with_deadline).unwrap_or_default();
        let guard = cancel.guard();
        let job = Job { texts, opts, reply: tx, queued: Instant::now(), deadline, cancel, caller };
        self.batcher.submit(job).map_err(|e| match e {
            Refused::Full => {
                self.metrics.rejected("embed_queue_full");
                overloaded("embed", self.limits.queue_size, self.batcher.wait_ms(None), &self.embed_pace)
            }
            Refused::Stopped(_) => AppError::unavailable(batcher::ENCODER_STOPPED),
        })?;
        Ok(PendingEmbed { rx, start, _cancel: guard, _share: share })
    }

    /// Waits for a queued embed request's answer; dropping this future (or
    /// the deadline) drops the receiver, and the batcher skips the job.
    pub async fn embed_wait(&self, p: PendingEmbed, deadline: Option<Instant>) -> Result<Embedded> {
        let PendingEmbed { rx, start, _cancel: guard, _share } = p;
        let got = until(deadline, "waiting for the encoder", start, rx).await?;
        guard.disarm();
        let (result, queue_ms) = match got {
            Ok(r) => r,
            Err(_) => return Err(self.stopped_error().await),
        };
        let encoded = result?;
        self.embed_pace.record(start.elapsed());
        let total_ms = ms(start);
        self.metrics.stage("Embed", "queue", queue_ms);
        self.metrics.stage("Embed", "inference", total_ms - queue_ms);
        Ok(Embedded { encoded, model: self.scd.encoder().model_id().to_string(), queue_ms, total_ms })
    }

    /// The error for a request whose reply channel closed: the encoder
    /// thread stopped (its cause is published just after it drops the jobs).
    async fn stopped_error(&self) -> AppError {
        let mut signal = self.batcher.stopped_signal();
        let cause = tokio::time::timeout(Duration::from_secs(1), signal.wait_for(|c| c.is_some()))
            .await
            .ok()
            .and_then(|r| r.ok().and_then(|c| c.clone()));
        AppError::unavailable(if cause.is_some() { batcher::ENCODER_STOPPED } else { batcher::ENCODER_STOPPED_UNKNOWN })
    }

    /// Counts `texts` (checked against the limits) in `tokenizer`, or the
    /// encoder's when `None`, on the count lane.
    pub async fn count_tokens(
        &self,
        call: &Call,
        texts: Vec<String>,
        tokenizer: Option<BudgetTokenizer>,
    ) -> Result<Vec<u32>> {
        let who = call.who();
        let share = self.count_shares.take(&who).map_err(|p| {
            self.metrics.rejected("count_caller_share");
            let estimate = self.count_calls.wait_ms(wait::whose(&who, p.network));
            past_share("count_tokens slots", p, estimate, &self.count_pace)
        })?;
        let call_ = self.count_calls.begin(&who, texts.iter().map(String::len).sum());
        // stops between texts once the caller is gone or past its deadline
        self.blocking_in(Lane::Count, call.deadline, (share, call_), move |scd, cancel| {
            texts
                .iter()
                .map(|t| {
                    cancel.check("count_tokens")?;
                    match &tokenizer {
                        Some(b) => b.count(t).map(|n| n as u32),
                        None => scd.encoder().count_tokens(t).map(|n| n as u32),
                    }
                })
                .collect()
        })
        .await
        .map(|(tokens, _)| tokens)
    }

    /// Closes a session of `call`'s caller; whether one was open.
    pub fn close_session(&self, call: &Call, session_id: &str, token: &str) -> Result<bool> {
        empty_session(session_id)?;
        let scope = call.who();
        Ok(self.scd.close_session(session_id, token, call.caller.as_deref(), Some(&scope))?)
    }

    /// Runs CPU-bound engine work off the runtime, behind the compress slots.
    /// Past `deadline` (or when this future is dropped) the work is told to
    /// stop at its next stage boundary, which frees the slot.
    /// `who` ([`shares::key`]) draws on its share of the slots.
    /// `bytes`: the size of its work, for the retry hints ([`wait`]).
    pub(crate) async fn blocking<T: Send + 'static>(
        &self,
        who: &str,
        bytes: usize,
        deadline: Option<Instant>,
        f: impl FnOnce(&Scd, &Cancel) -> scd_engine::Result<T> + Send + 'static,
    ) -> Result<(T, f64)> {
        let share = self.compress_shares.take(who).map_err(|p| {
            self.metrics.rejected("compress_caller_share");
            let estimate = self.compress_calls.wait_ms(wait::whose(who, p.network));
            past_share("compress slots", p, estimate, &self.compress_pace)
        })?;
        let call = self.compress_calls.begin(who, bytes);
        self.blocking_in(Lane::Compress, deadline, (share, call), f).await
    }

    /// [`Self::blocking`] behind `lane`'s slots; `hold` (the caller's share)
    /// is kept until the work stops, past a deadline or a caller gone too.
    async fn blocking_in<T: Send + 'static, H: wait::Held>(
        &self,
        lane: Lane,
        deadline: Option<Instant>,
        hold: H,
        f: impl FnOnce(&Scd, &Cancel) -> scd_engine::Result<T> + Send + 'static,
    ) -> Result<(T, f64)> {
        let queued = Instant::now();
        let (slots, pace, calls) = match lane {
            Lane::Compress => (&self.compress_slots, &self.compress_pace, &self.compress_calls),
            Lane::Count => (&self.count_slots, &self.count_pace, &self.count_calls),
        };
        let places = match lane {
            Lane::Compress => self.limits.max_concurrent_compress.max(1),
            Lane::Count => COUNT_SLOTS,
        };
        let permit = slots.clone().try_acquire_owned().map_err(|_| match lane {
            Lane::Compress => {
                self.metrics.rejected("compress_slots_full");
                COMPRESS_FULL.hit("compress slots full");
                overloaded("compress", places, calls.wait_ms(|_| true), pace)
            }
            Lane::Count => {
                self.metrics.rejected("count_slots_full");
                COUNT_FULL.hit("count_tokens slots full");
                overloaded("count_tokens", places, calls.wait_ms(|_| true), pace)
            }
        })?;
        let pace = pace.clone();
        let cancel = deadline.map(Cancel::with_deadline).unwrap_or_default();
        let guard = cancel.guard();
        let scd = self.scd.clone();
        let task = tokio::task::spawn_blocking(move || {
            let (_permit, hold) = (permit, hold);
            let began = Instant::now();
            let out = f(&scd, &cancel);
            pace.record(began.elapsed());
            if out.is_ok() {
                hold.done();
            }
            out
        });
        let out = until(deadline, "in the engine", queued, task).await?.map_err(AppError::worker_failed)??;
        guard.disarm();
        Ok((out, ms(queued)))
    }
}
