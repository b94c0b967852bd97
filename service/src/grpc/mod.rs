//! The gRPC server: `scd.v1.Scd` plus `grpc.health.v1` and reflection, and
//! Prometheus metrics over HTTP.
//!
//! CPU work never runs on the async runtime: embeddings go through the
//! [`batcher`] thread (token-budget batches, fail-stop); compression runs on
//! `spawn_blocking` behind a semaphore. Every queue is bounded and a full one
//! answers RESOURCE_EXHAUSTED with a retry hint (logged at most once per 10 s
//! per kind, [`ratelog`]).
//!
//! A caller's `grpc-timeout` reaches handlers as a [`layer::Deadline`]: an
//! embed request still queued at its deadline is answered DEADLINE_EXCEEDED
//! and skipped by the batcher; Compress/RequestContext pass a
//! `Cancel::with_deadline` and a cancel-on-drop guard to the engine, which
//! stops at its next stage boundary and frees the slot. Outcomes of every RPC
//! are counted once, in [`layer`]; [`metrics`] lists the series. With
//! `--auth did-wba` every call is authenticated by [`auth`] first.
//!
//! With `--audit-db`, Compress, OpenSession, RequestContext and Handoff are
//! recorded in the audit trail before they answer, and the `Audit` RPC
//! streams it ([`audit`]).

pub mod audit;
pub mod auth;
pub mod batcher;
pub mod convert;
pub mod handoff;
pub mod http;
pub mod layer;
pub mod metrics;
pub mod queue;
pub mod ratelog;
mod readiness;
pub mod shares;
pub mod wait;

use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use scd_engine::budget::TokenizerRegistry;
use scd_engine::cancel::Cancel;
use scd_engine::extract::{CompressOptions, ContextRequest, Scd, SessionRequest};
use tokio::sync::{oneshot, Semaphore};
use tokio_stream::{Stream, StreamExt};
use tonic::{Request, Response, Status};

use self::batcher::{BatchLimits, Batcher, Job, Refused, Reply};
use self::layer::Deadline;
use self::metrics::Metrics;
use self::ratelog::RateLimitedWarn;
use self::wait::{overloaded, past_share};

pub use self::readiness::{Readiness, Ready};

/// Generated protobuf and gRPC code for `scd.v1` (from the `scd-proto` crate).
pub use scd_proto::scd::v1 as pb;

/// Encoded file descriptor set, for reflection.
pub use scd_proto::scd::v1::DESCRIPTOR;

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

/// The `scd.v1.Scd` implementation.
pub struct ScdService {
    pub(crate) scd: Arc<Scd>,
    pub(crate) batcher: Batcher,
    pub(crate) compress_slots: Arc<Semaphore>,
    /// CountTokens' own lane: cheap calls are not refused because
    /// compressions hold every compress slot.
    pub(crate) count_slots: Arc<Semaphore>,
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
    limits: Limits,
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

/// Requests of one EmbedStream queued ahead of the one being answered: a
/// bulk client keeps the encoder busy without one stream taking the queue.
const STREAM_WINDOW: usize = 4;

/// An embed request waiting in the batcher.
struct PendingEmbed {
    rx: oneshot::Receiver<Reply>,
    start: Instant,
    /// Cancels the job's encoding when the caller goes away (dropped).
    _cancel: scd_engine::cancel::CancelOnDrop,
    /// The caller's place in the embed queue's shares, until answered.
    _share: shares::ShareGuard,
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

/// The caller's deadline, from `grpc-timeout` (see [`layer`]).
fn deadline<T>(r: &Request<T>) -> Option<Instant> {
    r.extensions().get::<Deadline>().map(|d| d.0)
}

fn deadline_exceeded(while_: &str, start: Instant) -> Status {
    Status::deadline_exceeded(format!("deadline exceeded after {:.0} ms {while_}", ms(start)))
}

/// Waits for `f`, or answers DEADLINE_EXCEEDED at `deadline`.
async fn until<T>(
    deadline: Option<Instant>,
    while_: &str,
    start: Instant,
    f: impl std::future::Future<Output = T>,
) -> Result<T, Status> {
    match deadline {
        Some(d) => tokio::time::timeout_at(d.into(), f).await.map_err(|_| deadline_exceeded(while_, start)),
        None => Ok(f.await),
    }
}

fn empty_session(id: &str) -> Result<(), Status> {
    if id.is_empty() {
        return Err(Status::invalid_argument("session_id: must not be empty"));
    }
    Ok(())
}

fn ms(since: Instant) -> f64 {
    since.elapsed().as_secs_f64() * 1e3
}

impl ScdService {
    /// A service over `scd`.
    pub fn new(scd: Arc<Scd>, limits: Limits, metrics: Arc<Metrics>) -> Self {
        let batch = BatchLimits {
            queue_size: limits.queue_size,
            batch_texts: limits.batch_texts,
            max_batch_tokens: limits.max_batch_tokens,
            max_request_tokens: scd.config().max_encoder_tokens,
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

    /// Records Compress, OpenSession and RequestContext in `log` (see
    /// [`audit`]).
    pub fn with_audit(mut self, log: Option<Arc<scd_audit::AuditLog>>) -> Self {
        self.audit = log;
        self
    }

    /// Who may read the audit trail over the `Audit` RPC (the operator's
    /// token, `--audit-token-file`); by default only verified callers, each
    /// its own records.
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

    async fn embed_inner(
        &self,
        r: pb::EmbedRequest,
        deadline: Option<Instant>,
        who: &str,
    ) -> Result<pb::EmbedResponse, Status> {
        let pending = self.embed_submit(r, deadline, who)?;
        self.embed_wait(pending, deadline).await
    }

    /// Validates an embed request and queues it for the batcher.
    fn embed_submit(&self, r: pb::EmbedRequest, deadline: Option<Instant>, who: &str) -> Result<PendingEmbed, Status> {
        let start = Instant::now();
        let (texts, opts) = convert::embed_request(r, self.limits.max_texts, self.limits.max_text_bytes)?;
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
            Refused::Stopped(_) => Status::unavailable(batcher::ENCODER_STOPPED),
        })?;
        Ok(PendingEmbed { rx, start, _cancel: guard, _share: share })
    }

    /// Waits for a queued embed request's answer; dropping this future (or
    /// the deadline) drops the receiver, and the batcher skips the job.
    async fn embed_wait(&self, p: PendingEmbed, deadline: Option<Instant>) -> Result<pb::EmbedResponse, Status> {
        let PendingEmbed { rx, start, _cancel: guard, _share } = p;
        let got = until(deadline, "waiting for the encoder", start, rx).await?;
        guard.disarm();
        let (result, queue_ms) = match got {
            Ok(r) => r,
            Err(_) => return Err(self.stopped_status().await),
        };
        let enc = result?;
        self.embed_pace.record(start.elapsed());
        let total = ms(start);
        self.metrics.stage("Embed", "queue", queue_ms);
        self.metrics.stage("Embed", "inference", total - queue_ms);
        Ok(pb::EmbedResponse {
            embeddings: (0..enc.len())
                .map(|i| pb::Embedding {
                    values: enc.row(i).to_vec(),
                    tokens: enc.tokens[i] as u32,
                    windows: enc.windows[i] as u32,
                })
                .collect(),
            model: self.scd.encoder().model_id().to_string(),
            timing: Some(pb::Timing { queue_ms, inference_ms: total - queue_ms, selection_ms: 0.0, total_ms: total }),
        })
    }

    /// The status for a request whose reply channel closed: the encoder
    /// thread stopped (its cause is published just after it drops the jobs).
    async fn stopped_status(&self) -> Status {
        let mut signal = self.batcher.stopped_signal();
        let cause = tokio::time::timeout(Duration::from_secs(1), signal.wait_for(|c| c.is_some()))
            .await
            .ok()
            .and_then(|r| r.ok().and_then(|c| c.clone()));
        Status::unavailable(if cause.is_some() { batcher::ENCODER_STOPPED } else { batcher::ENCODER_STOPPED_UNKNOWN })
    }

    /// Runs CPU-bound engine work off the runtime, behind the compress slots.
    /// Past `deadline` (or when this future is dropped) the work is told to
    /// stop at its next stage boundary, which frees the slot.
    /// `who` ([`shares::key`]) draws on its share of the slots.
    /// `bytes`: the size of its work, for the retry hints ([`wait`]).
    async fn blocking<T: Send + 'static>(
        &self,
        who: &str,
        bytes: usize,
        deadline: Option<Instant>,
        f: impl FnOnce(&Scd, &Cancel) -> scd_engine::Result<T> + Send + 'static,
    ) -> Result<(T, f64), Status> {
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
    ) -> Result<(T, f64), Status> {
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
        let out = until(deadline, "in the engine", queued, task)
            .await?
            .map_err(convert::worker_failed)?
            .map_err(convert::status)?;
        guard.disarm();
        Ok((out, ms(queued)))
    }

    /// Compress; `open` opens a session even when the request names no id
    /// (OpenSession: the engine draws 128 random bits). With `CompressRequest.render`
    /// set, the selection comes back as a report too.
    async fn compress_inner(
        &self,
        r: pb::CompressRequest,
        deadline: Option<Instant>,
        caller: Option<String>,
        who: &str,
        open: bool,
    ) -> Result<pb::CompressResponse, Status> {
        let render = handoff::format("render", r.render)?.map(|format| Forward { report: None, format, answer: None });
        self.compress_run(r, deadline, caller, who, open, render).await
    }

    /// [`Self::compress_inner`], with a forwarded report's sections added to
    /// the fields and the selection rendered as `fwd` says.
    async fn compress_run(
        &self,
        mut r: pb::CompressRequest,
        deadline: Option<Instant>,
        caller: Option<String>,
        who: &str,
        open: bool,
        fwd: Option<Forward>,
    ) -> Result<pb::CompressResponse, Status> {
        let mut opts = CompressOptions {
            budget_tokenizer: self.tokenizers.resolve(&r.budget_tokenizer).map_err(convert::status)?,
            explain: r.explain,
            envelope: None,
        };
        let (max_total, reserve, rate) = (r.session_max_total_tokens, r.reserve_tokens, convert::rate(&mut r)?);
        let mut req = convert::compress_request(r, self.limits.max_fields, caller.clone())?;
        if let Some(s) = req.session.as_mut() {
            s.scope = Some(who.to_string());
        }
        if open && req.session.is_none() {
            req.session = Some(SessionRequest {
                caller,
                scope: Some(who.to_string()),
                max_total_tokens: (max_total > 0).then_some(max_total as usize),
                reserve_tokens: reserve as usize,
                ..SessionRequest::default()
            });
        } else if req.session.is_none() && (max_total > 0 || reserve > 0) {
            let field = if reserve > 0 { "reserve_tokens" } else { "session_max_total_tokens" };
            return Err(Status::invalid_argument(format!("{field}: needs a session (set session_id)")));
        }
        if let Some(report) = fwd.as_ref().and_then(|f| f.report.as_ref()) {
            handoff::add_report_fields(&mut req.context.fields, report)?;
        }
        // a report is fitted in the budget whole, its wrapping included
        let rendered = fwd.is_some();
        opts.envelope = fwd.map(|f| scd_engine::handoff::envelope(&req, f.format, f.answer));
        let bytes = req.context.fields.iter().map(|f| f.content.len()).sum();
        let ((out, report), total) = self
            .blocking(who, bytes, deadline, move |scd, cancel| {
                // a rate's budget: the share of the context in the budget tokenizer
                if let Some(rate) = rate {
                    req.requirement.max_context_tokens =
                        scd.rate_budget(&req.context, opts.budget_tokenizer.as_ref(), rate)?;
                }
                let out = scd.compress_opts(&req, &opts, cancel)?;
                let report = rendered.then(|| out.text.clone());
                Ok((out, report))
            })
            .await?;
        let t = out.timings;
        self.metrics.stage("Compress", "inference", t.prepare_ms + t.task_embed_ms);
        self.metrics.stage("Compress", "selection", t.select_ms);
        let timing = pb::Timing {
            queue_ms: (total - t.prepare_ms - t.task_embed_ms - t.select_ms).max(0.0),
            inference_ms: t.prepare_ms + t.task_embed_ms,
            selection_ms: t.select_ms,
            total_ms: total,
        };
        let mut resp = convert::compress_response(out, timing);
        resp.report = report.unwrap_or_default();
        Ok(resp)
    }

    /// The `Handoff` RPC: parse, render or forward a report.
    async fn handoff_inner(
        &self,
        r: pb::HandoffRequest,
        deadline: Option<Instant>,
        caller: Option<String>,
        who: &str,
    ) -> Result<pb::HandoffResponse, Status> {
        use pb::handoff_request::Op;
        let map = self.confidence_map;
        match r.op.ok_or_else(|| Status::invalid_argument("op: required (parse, render or forward)"))? {
            Op::Parse(p) => {
                let parsed = handoff::parse(&p.text, handoff::format("parse.format", p.format)?);
                Ok(pb::HandoffResponse { parsed: Some(handoff::parsed_pb(&parsed, &map)), ..Default::default() })
            }
            Op::Render(r) => {
                let format = handoff::format("render.format", r.format)?.ok_or_else(|| {
                    Status::invalid_argument(
                        "render.format: required (REPORT_FORMAT_FREEFORM, _SEMI_STRUCTURED or _STRUCTURED_SOFT)",
                    )
                })?;
                let report = handoff::report(
                    "render.report",
                    r.report.ok_or_else(|| Status::invalid_argument("render.report: required"))?,
                )?;
                let answer = handoff::answer("render.answer", r.answer)?;
                let text = scd_engine::handoff::render(&report, format, answer.as_deref());
                Ok(pb::HandoffResponse { text, ..Default::default() })
            }
            Op::Forward(f) => {
                let parsed = handoff::parse(&f.text, handoff::format("forward.format", f.format)?);
                let format = handoff::format("forward.render", f.render)?.unwrap_or(parsed.format);
                let compress = f.compress.ok_or_else(|| Status::invalid_argument("forward.compress: required"))?;
                if compress.render != 0 {
                    return Err(Status::invalid_argument(
                        "forward.compress.render: must be unset; forward.render names the receiver's format",
                    ));
                }
                let fwd = Forward { report: Some(parsed.report.clone()), format, answer: parsed.answer.clone() };
                let compressed = self.compress_run(compress, deadline, caller, who, false, Some(fwd)).await?;
                Ok(pb::HandoffResponse {
                    parsed: Some(handoff::parsed_pb(&parsed, &map)),
                    text: compressed.report.clone(),
                    compressed: Some(compressed),
                })
            }
        }
    }
}

/// How a compression is written back as a report.
struct Forward {
    /// The forwarded report, whose sections join the fields.
    report: Option<scd_engine::handoff::Report>,
    /// The receiver's format.
    format: scd_engine::handoff::Format,
    /// The sender's `Answer:` line, kept verbatim.
    answer: Option<String>,
}

impl ScdService {
    /// [`ScdService::compress_inner`], recorded as `method` in the audit
    /// trail (when there is one) before it answers.
    pub(crate) async fn compress_audited(
        &self,
        method: &str,
        r: pb::CompressRequest,
        deadline: Option<Instant>,
        caller: Option<String>,
        peer: Option<String>,
        open: bool,
    ) -> Result<pb::CompressResponse, Status> {
        let who = shares::key(caller.as_deref(), peer.as_deref());
        let mut rec = self.audit_record(method, caller.clone(), peer);
        if let Some(rec) = rec.as_mut() {
            if let Some(t) = &r.task {
                rec.set_task(&t.description);
            }
            rec.budget_tokens = r.requirement.as_ref().map(|q| q.max_context_tokens);
            rec.session_id = audit::recorded_id(&r.session_id);
        }
        let rate = r.rate;
        let res = self.compress_inner(r, deadline, caller, &who, open).await;
        if let (Some(rec), Ok(reply)) = (rec.as_mut(), &res) {
            audit::fill_from_compress(rec, reply);
            audit::fill_rate_budget(rec, rate, reply);
        }
        self.record_audit(rec, res).await
    }
}

impl ScdService {
    /// RequestContext, recorded as `method` in the audit trail (when there
    /// is one) before it answers; a `report` sets the question and the
    /// confidence.
    pub(crate) async fn request_context_audited(
        &self,
        method: &str,
        r: pb::ContextRequest,
        d: Option<Instant>,
        who: Option<String>,
        from: Option<String>,
    ) -> Result<pb::ContextResponse, Status> {
        let share_key = shares::key(who.as_deref(), from.as_deref());
        let mut rec = self.audit_record(method, who.clone(), from);
        if let Some(rec) = rec.as_mut() {
            rec.session_id = audit::recorded_id(&r.session_id);
            rec.set_task(&r.specific_question);
        }
        if let Err(s) = empty_session(&r.session_id) {
            return self.record_audit(rec, Err(s)).await;
        }
        let mut req = ContextRequest {
            session_id: r.session_id,
            session_token: r.session_token,
            caller: who,
            scope: Some(share_key.clone()),
            specific_question: r.specific_question,
            current_confidence: r.current_confidence,
            reasoning: r.reasoning,
            chunk_ids: r.chunk_ids,
            max_tokens: (r.max_tokens > 0).then_some(r.max_tokens as usize),
            request_id: (!r.request_id.is_empty()).then_some(r.request_id),
        };
        if !r.report.is_empty() {
            if let Err(s) = handoff::apply_report(&mut req, &r.report, &self.confidence_map) {
                return self.record_audit(rec, Err(s)).await;
            }
            // the question may have come from the report's next step
            if let Some(rec) = rec.as_mut() {
                rec.set_task(&req.specific_question);
            }
        }
        let start = Instant::now();
        let res = self.blocking(&share_key, 0, d, move |scd, cancel| scd.request_more_with(&req, cancel)).await.map(
            |(more, total)| pb::ContextResponse {
                chunks: more.chunks.iter().map(convert::chunk).collect(),
                remaining_tokens: u32::try_from(more.remaining_tokens).unwrap_or(u32::MAX),
                reason: more.reason.unwrap_or_default(),
                sent_tokens: more.sent_tokens as u32,
                budget: u32::try_from(more.budget).unwrap_or(u32::MAX),
                session_sent_tokens: more.session_sent_tokens as u32,
                text: more.text,
                timing: Some(pb::Timing { queue_ms: 0.0, inference_ms: 0.0, selection_ms: ms(start), total_ms: total }),
            },
        );
        if let (Some(rec), Ok(reply)) = (rec.as_mut(), &res) {
            audit::fill_chunks(rec, &reply.chunks);
            audit::fill_timing(rec, reply.timing.as_ref());
        }
        self.record_audit(rec, res).await
    }
}

type EmbedStream = Pin<Box<dyn Stream<Item = Result<pb::EmbedResponse, Status>> + Send>>;

/// The `scd.v1.Scd` handler: a shared [`ScdService`] (a local type, so the
/// generated trait, now in `scd-proto`, can be implemented for it).
#[derive(Clone)]
pub struct ScdHandler(pub Arc<ScdService>);

impl std::ops::Deref for ScdHandler {
    type Target = Arc<ScdService>;

    fn deref(&self) -> &Arc<ScdService> {
        &self.0
    }
}

#[tonic::async_trait]
impl pb::scd_server::Scd for ScdHandler {
    type EmbedStreamStream = EmbedStream;

    async fn embed(&self, request: Request<pb::EmbedRequest>) -> Result<Response<pb::EmbedResponse>, Status> {
        let d = deadline(&request);
        let who = shares::key(caller(&request).as_deref(), peer(&request).as_deref());
        self.embed_inner(request.into_inner(), d, &who).await.map(Response::new)
    }

    async fn embed_stream(
        &self,
        request: Request<tonic::Streaming<pb::EmbedRequest>>,
    ) -> Result<Response<EmbedStream>, Status> {
        let d = deadline(&request);
        let who = shares::key(caller(&request).as_deref(), peer(&request).as_deref());
        let mut input = request.into_inner();
        // requests are validated and queued as they arrive (up to
        // STREAM_WINDOW ahead) and answered in order
        let (queued_tx, mut queued_rx) = tokio::sync::mpsc::channel::<Result<PendingEmbed, Status>>(STREAM_WINDOW);
        let me = self.clone();
        tokio::spawn(async move {
            while let Some(item) = input.next().await {
                let pending = item.and_then(|r| me.embed_submit(r, d, &who));
                let stop = pending.is_err();
                if queued_tx.send(pending).await.is_err() || stop {
                    break;
                }
            }
        });
        let me = self.clone();
        let out = async_stream(move |tx| async move {
            while let Some(pending) = queued_rx.recv().await {
                let reply = match pending {
                    Ok(p) => me.embed_wait(p, d).await,
                    Err(s) => Err(s),
                };
                let stop = reply.is_err();
                if tx.send(reply).await.is_err() || stop {
                    break;
                }
            }
        });
        Ok(Response::new(out))
    }

    async fn compress(&self, request: Request<pb::CompressRequest>) -> Result<Response<pb::CompressResponse>, Status> {
        let (d, who, from) = (deadline(&request), caller(&request), peer(&request));
        self.compress_audited("Compress", request.into_inner(), d, who, from, false).await.map(Response::new)
    }

    async fn request_context(
        &self,
        request: Request<pb::ContextRequest>,
    ) -> Result<Response<pb::ContextResponse>, Status> {
        let (d, who, from) = (deadline(&request), caller(&request), peer(&request));
        self.request_context_audited("RequestContext", request.into_inner(), d, who, from).await.map(Response::new)
    }

    async fn open_session(
        &self,
        request: Request<pb::OpenSessionRequest>,
    ) -> Result<Response<pb::OpenSessionResponse>, Status> {
        let (d, who, from) = (deadline(&request), caller(&request), peer(&request));
        let r = request.into_inner();
        let res = async {
            let c = r.compress.ok_or_else(|| Status::invalid_argument("compress: required"))?;
            let result = self.compress_audited("OpenSession", c, d, who, from, true).await?;
            Ok(pb::OpenSessionResponse {
                session_id: result.session_id.clone(),
                session_token: result.session_token.clone(),
                result: Some(result),
            })
        }
        .await;
        res.map(Response::new)
    }

    async fn close_session(
        &self,
        request: Request<pb::CloseSessionRequest>,
    ) -> Result<Response<pb::CloseSessionResponse>, Status> {
        let who = caller(&request);
        let scope = shares::key(who.as_deref(), peer(&request).as_deref());
        let r = request.into_inner();
        empty_session(&r.session_id)?;
        let closed = self
            .scd
            .close_session(&r.session_id, &r.session_token, who.as_deref(), Some(&scope))
            .map_err(convert::status)?;
        Ok(Response::new(pb::CloseSessionResponse { closed }))
    }

    async fn count_tokens(
        &self,
        request: Request<pb::CountTokensRequest>,
    ) -> Result<Response<pb::CountTokensResponse>, Status> {
        let d = deadline(&request);
        let who = shares::key(caller(&request).as_deref(), peer(&request).as_deref());
        let r = request.into_inner();
        let texts = r.texts;
        let tokenizer = match self.tokenizers.resolve(&r.tokenizer) {
            Ok(t) => t,
            Err(e) => return Err(Status::invalid_argument(e.to_string().replacen("budget_tokenizer", "tokenizer", 1))),
        };
        let res = if let Err(s) = convert::check_texts(&texts, self.limits.max_texts, self.limits.max_text_bytes) {
            Err(s)
        } else {
            let share = self.count_shares.take(&who).map_err(|p| {
                self.metrics.rejected("count_caller_share");
                let estimate = self.count_calls.wait_ms(wait::whose(&who, p.network));
                past_share("count_tokens slots", p, estimate, &self.count_pace)
            })?;
            let call = self.count_calls.begin(&who, texts.iter().map(String::len).sum());
            // stops between texts once the caller is gone or past its deadline
            self.blocking_in(Lane::Count, d, (share, call), move |scd, cancel| {
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
            .map(|(tokens, _)| pb::CountTokensResponse { tokens })
        };
        res.map(Response::new)
    }

    async fn handoff(&self, request: Request<pb::HandoffRequest>) -> Result<Response<pb::HandoffResponse>, Status> {
        let (d, who, from) = (deadline(&request), caller(&request), peer(&request));
        let r = request.into_inner();
        let share_key = shares::key(who.as_deref(), from.as_deref());
        // one record per call; a forward's records its compression
        let mut rec = self.audit_record("Handoff", who.clone(), from);
        if let (Some(rec), Some(pb::handoff_request::Op::Forward(f))) = (rec.as_mut(), &r.op) {
            if let Some(c) = &f.compress {
                if let Some(t) = &c.task {
                    rec.set_task(&t.description);
                }
                rec.budget_tokens = c.requirement.as_ref().map(|q| q.max_context_tokens);
                rec.session_id = audit::recorded_id(&c.session_id);
            }
        }
        let rate = match &r.op {
            Some(pb::handoff_request::Op::Forward(f)) => f.compress.as_ref().and_then(|c| c.rate),
            _ => None,
        };
        let res = self.handoff_inner(r, d, who, &share_key).await;
        if let (Some(rec), Ok(reply)) = (rec.as_mut(), &res) {
            if let Some(c) = &reply.compressed {
                audit::fill_from_compress(rec, c);
                audit::fill_rate_budget(rec, rate, c);
            }
        }
        self.record_audit(rec, res).await.map(Response::new)
    }

    async fn info(&self, _request: Request<pb::InfoRequest>) -> Result<Response<pb::InfoResponse>, Status> {
        let e = self.scd.encoder();
        let cfg = self.scd.config();
        let r = pb::InfoResponse {
            model: e.model_id().to_string(),
            dim: e.dim() as u32,
            max_tokens: e.max_tokens() as u32,
            provider: e.provider().to_string(),
            version: env!("CARGO_PKG_VERSION").to_string(),
            max_texts: self.limits.max_texts as u32,
            max_fields: self.limits.max_fields as u32,
            max_request_bytes: self.limits.max_request_bytes as u64,
            max_budget_tokens: cfg.max_budget_tokens as u32,
            confidence_threshold: cfg.confidence_threshold,
            session_ttl_s: cfg.session_ttl.as_secs(),
            confidence_map: Some(pb::ConfidenceMap {
                low: self.confidence_map.low,
                medium: self.confidence_map.medium,
                high: self.confidence_map.high,
            }),
        };
        Ok(Response::new(r))
    }

    type AuditStream = audit::AuditStream;

    async fn audit(&self, request: Request<pb::AuditRequest>) -> Result<Response<audit::AuditStream>, Status> {
        let who = caller(&request);
        let token = request.metadata().get(audit::AUDIT_TOKEN_HEADER).map(|v| v.as_bytes().to_vec());
        self.audit_stream(request.into_inner(), who, token.as_deref()).map(Response::new)
    }
}

/// The caller's verified identity: the DID that signed the request under
/// `--auth did-wba` ([`auth::AuthenticatedDid`]), else the transport's (a
/// TLS client certificate); sessions opened with one are bound to it.
fn caller<T>(request: &Request<T>) -> Option<String> {
    if let Some(did) = request.extensions().get::<auth::AuthenticatedDid>() {
        return Some(did.0.clone());
    }
    crate::tls::caller_identity(request)
}

/// The caller's transport address (recorded as `peer` in the audit trail).
fn peer<T>(request: &Request<T>) -> Option<String> {
    request.remote_addr().map(|a| a.to_string())
}

/// A stream fed by a spawned task through a bounded channel.
fn async_stream<F, Fut>(f: F) -> EmbedStream
where
    F: FnOnce(tokio::sync::mpsc::Sender<Result<pb::EmbedResponse, Status>>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tokio::spawn(f(tx));
    Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))
}
