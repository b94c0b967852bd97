//! The gRPC surface: `scd.v1.Scd` plus `grpc.health.v1` and reflection.
//!
//! A thin adapter over the [`crate::app::Core`]: each handler of
//! [`ScdHandler`] converts the protobuf request once ([`convert`] and the
//! handler's own methods; the core has no protobuf), calls the core with a
//! [`crate::app::Call`] (the caller, its address, and the `grpc-timeout`
//! that [`layer`] turns into a deadline), and converts the answer or the
//! core's [`AppError`] (`From<AppError> for Status`) once. Outcomes of every
//! RPC are counted once, in [`layer`]; with `--auth did-wba` every call is
//! authenticated by [`crate::auth`] first.
//!
//! With `--audit-db`, Compress, OpenSession, RequestContext and Handoff are
//! recorded in the audit trail before they answer, and the `Audit` RPC
//! streams it ([`audit`]).

pub mod audit;
pub mod convert;
pub mod handoff;
pub mod layer;

use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;

use scd_engine::extract::{ContextRequest, SessionRequest};
use tokio_stream::{Stream, StreamExt};
use tonic::{Request, Response, Status};

use self::layer::Deadline;
use crate::app::compress::{AuditSeed, CompressInput, CompressOutput, Timing};
use crate::app::more::MoreSeed;
use crate::app::{empty_session, Call, Core, Embedded, PendingEmbed};

/// Generated protobuf and gRPC code for `scd.v1` (from the `scd-proto` crate).
pub use scd_proto::scd::v1 as pb;

/// Encoded file descriptor set, for reflection.
pub use scd_proto::scd::v1::DESCRIPTOR;

/// Requests of one EmbedStream queued ahead of the one being answered: a
/// bulk client keeps the encoder busy without one stream taking the queue.
const STREAM_WINDOW: usize = 4;

/// The caller's deadline, from `grpc-timeout` (see [`layer`]).
fn deadline<T>(r: &Request<T>) -> Option<Instant> {
    r.extensions().get::<Deadline>().map(|d| d.0)
}

/// The core's [`Call`] of `method` for a gRPC request (`gRPC Compress` in
/// the audit trail).
fn call_of<T>(method: &str, r: &Request<T>) -> Call {
    Call::new("gRPC", method).from(caller(r), peer(r)).until(deadline(r))
}

/// The `scd.v1.Scd` handler: the shared core in a local type (so the
/// generated trait, in `scd-proto`, can be implemented for it), which holds
/// the surface's protobuf conversions; the core itself has none.
#[derive(Clone)]
pub struct ScdHandler(pub Arc<Core>);

impl std::ops::Deref for ScdHandler {
    type Target = Arc<Core>;

    fn deref(&self) -> &Arc<Core> {
        &self.0
    }
}

/// Embeddings on the wire.
fn embed_response(e: Embedded) -> pb::EmbedResponse {
    let enc = e.encoded;
    pb::EmbedResponse {
        embeddings: (0..enc.len())
            .map(|i| pb::Embedding {
                values: enc.row(i).to_vec(),
                tokens: enc.tokens[i] as u32,
                windows: enc.windows[i] as u32,
            })
            .collect(),
        model: e.model,
        timing: Some(pb::Timing {
            queue_ms: e.queue_ms,
            inference_ms: e.total_ms - e.queue_ms,
            selection_ms: 0.0,
            total_ms: e.total_ms,
        }),
    }
}

impl ScdHandler {
    /// Validates an embed request and queues it for the batcher.
    fn embed_submit_pb(
        &self,
        r: pb::EmbedRequest,
        deadline: Option<Instant>,
        who: &str,
    ) -> Result<PendingEmbed, Status> {
        let (texts, opts) = convert::embed_request(r, self.limits.max_texts, self.limits.max_text_bytes)?;
        Ok(self.embed_submit(deadline, who, texts, opts)?)
    }

    /// The one conversion of a wire request into the core's input, checked
    /// in the order of its fields: the budget tokenizer, the rate, the
    /// fields, the session; `open` opens a session even when the request
    /// names no id (OpenSession: the engine draws 128 random bits); `fwd`
    /// adds a forwarded report's sections to the fields and renders the
    /// selection as it says.
    fn compress_input(
        &self,
        mut r: pb::CompressRequest,
        open: bool,
        fwd: Option<Forward>,
    ) -> Result<CompressInput, Status> {
        let budget_tokenizer = self.tokenizers.resolve(&r.budget_tokenizer).map_err(convert::status)?;
        let explain = r.explain;
        let (max_total, reserve, rate) = (r.session_max_total_tokens, r.reserve_tokens, convert::rate(&mut r)?);
        let mut request = convert::compress_request(r, self.limits.max_fields, None)?;
        if open && request.session.is_none() {
            request.session = Some(SessionRequest {
                max_total_tokens: (max_total > 0).then_some(max_total as usize),
                reserve_tokens: reserve as usize,
                ..SessionRequest::default()
            });
        } else if request.session.is_none() && (max_total > 0 || reserve > 0) {
            let field = if reserve > 0 { "reserve_tokens" } else { "session_max_total_tokens" };
            return Err(Status::invalid_argument(format!("{field}: needs a session (set session_id)")));
        }
        if let Some(report) = fwd.as_ref().and_then(|f| f.report.as_ref()) {
            handoff::add_report_fields(&mut request.context.fields, report)?;
        }
        let (render, answer) = fwd.map_or((None, None), |f| (Some(f.format), f.answer));
        Ok(CompressInput { request, rate, budget_tokenizer, explain, render, answer })
    }

    /// The `Handoff` RPC: parse, render or forward a report.
    async fn handoff_inner(&self, call: &Call, r: pb::HandoffRequest) -> Result<pb::HandoffResponse, Status> {
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
                let input = self.compress_input(compress, false, Some(fwd))?;
                let compressed = compress_pb(self.compress_unaudited(call, input).await?);
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

/// The core's timing on the wire.
fn timing_pb(t: Timing) -> pb::Timing {
    pb::Timing {
        queue_ms: t.queue_ms,
        inference_ms: t.inference_ms,
        selection_ms: t.selection_ms,
        total_ms: t.total_ms,
    }
}

/// The one conversion of the core's compression back to the wire.
fn compress_pb(out: CompressOutput) -> pb::CompressResponse {
    let mut resp = convert::compress_response(out.compressed, timing_pb(out.timing));
    resp.report = out.report.unwrap_or_default();
    resp
}

impl ScdHandler {
    /// Compress from the wire: converted once into the core's input (a
    /// refusal recorded as the request was sent), run and recorded as
    /// `call`'s method, converted once back.
    async fn compress_pb(
        &self,
        call: &Call,
        r: pb::CompressRequest,
        open: bool,
    ) -> Result<pb::CompressResponse, Status> {
        let seed = AuditSeed {
            task: r.task.as_ref().map(|t| t.description.clone()),
            budget_tokens: r.requirement.as_ref().map(|q| q.max_context_tokens),
            session_id: r.session_id.clone(),
        };
        let render =
            handoff::format("render", r.render).map(|f| f.map(|format| Forward { report: None, format, answer: None }));
        let input = render.and_then(|render| self.compress_input(r, open, render));
        self.compress_seeded(call, seed, input).await.map(compress_pb)
    }

    /// The one conversion of a wire RequestContext into the engine's
    /// request; a `report` sets the question and the confidence.
    fn more_input(&self, r: pb::ContextRequest) -> Result<ContextRequest, Status> {
        empty_session(&r.session_id)?;
        let mut req = ContextRequest {
            session_id: r.session_id,
            session_token: r.session_token,
            caller: None,
            scope: None,
            specific_question: r.specific_question,
            current_confidence: r.current_confidence,
            reasoning: r.reasoning,
            chunk_ids: r.chunk_ids,
            max_tokens: (r.max_tokens > 0).then_some(r.max_tokens as usize),
            request_id: (!r.request_id.is_empty()).then_some(r.request_id),
        };
        if !r.report.is_empty() {
            handoff::apply_report(&mut req, &r.report, &self.confidence_map)?;
        }
        Ok(req)
    }

    /// RequestContext from the wire through the core, recorded as `call`'s
    /// method.
    async fn request_context_pb(&self, call: &Call, r: pb::ContextRequest) -> Result<pb::ContextResponse, Status> {
        let seed = MoreSeed { question: r.specific_question.clone(), session_id: r.session_id.clone() };
        let out = self.request_more(call, seed, self.more_input(r)).await?;
        let more = out.more;
        Ok(pb::ContextResponse {
            chunks: more.chunks.iter().map(convert::chunk).collect(),
            remaining_tokens: u32::try_from(more.remaining_tokens).unwrap_or(u32::MAX),
            reason: more.reason.unwrap_or_default(),
            sent_tokens: more.sent_tokens as u32,
            budget: u32::try_from(more.budget).unwrap_or(u32::MAX),
            session_sent_tokens: more.session_sent_tokens as u32,
            text: more.text,
            timing: Some(timing_pb(out.timing)),
        })
    }
}

type EmbedStream = Pin<Box<dyn Stream<Item = Result<pb::EmbedResponse, Status>> + Send>>;

#[tonic::async_trait]
impl pb::scd_server::Scd for ScdHandler {
    type EmbedStreamStream = EmbedStream;

    async fn embed(&self, request: Request<pb::EmbedRequest>) -> Result<Response<pb::EmbedResponse>, Status> {
        let d = deadline(&request);
        let who = crate::app::shares::key(caller(&request).as_deref(), peer(&request).as_deref());
        let pending = self.embed_submit_pb(request.into_inner(), d, &who)?;
        Ok(Response::new(embed_response(self.embed_wait(pending, d).await?)))
    }

    async fn embed_stream(
        &self,
        request: Request<tonic::Streaming<pb::EmbedRequest>>,
    ) -> Result<Response<EmbedStream>, Status> {
        let d = deadline(&request);
        let who = crate::app::shares::key(caller(&request).as_deref(), peer(&request).as_deref());
        let mut input = request.into_inner();
        // requests are validated and queued as they arrive (up to
        // STREAM_WINDOW ahead) and answered in order
        let (queued_tx, mut queued_rx) = tokio::sync::mpsc::channel::<Result<PendingEmbed, Status>>(STREAM_WINDOW);
        let me = self.clone();
        tokio::spawn(async move {
            while let Some(item) = input.next().await {
                let pending = item.and_then(|r| me.embed_submit_pb(r, d, &who));
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
                    Ok(p) => me.embed_wait(p, d).await.map(embed_response).map_err(Status::from),
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
        let call = call_of("Compress", &request);
        self.compress_pb(&call, request.into_inner(), false).await.map(Response::new)
    }

    async fn request_context(
        &self,
        request: Request<pb::ContextRequest>,
    ) -> Result<Response<pb::ContextResponse>, Status> {
        let call = call_of("RequestContext", &request);
        self.request_context_pb(&call, request.into_inner()).await.map(Response::new)
    }

    async fn open_session(
        &self,
        request: Request<pb::OpenSessionRequest>,
    ) -> Result<Response<pb::OpenSessionResponse>, Status> {
        let call = call_of("OpenSession", &request);
        let r = request.into_inner();
        let res = async {
            let c = r.compress.ok_or_else(|| Status::invalid_argument("compress: required"))?;
            let result = self.compress_pb(&call, c, true).await?;
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
        let call = call_of("CloseSession", &request);
        let r = request.into_inner();
        let closed = self.0.close_session(&call, &r.session_id, &r.session_token)?;
        Ok(Response::new(pb::CloseSessionResponse { closed }))
    }

    async fn count_tokens(
        &self,
        request: Request<pb::CountTokensRequest>,
    ) -> Result<Response<pb::CountTokensResponse>, Status> {
        let call = call_of("CountTokens", &request);
        let r = request.into_inner();
        let tokenizer = match self.tokenizers.resolve(&r.tokenizer) {
            Ok(t) => t,
            Err(e) => return Err(Status::invalid_argument(e.to_string().replacen("budget_tokenizer", "tokenizer", 1))),
        };
        convert::check_texts(&r.texts, self.limits.max_texts, self.limits.max_text_bytes)?;
        let tokens = self.0.count_tokens(&call, r.texts, tokenizer).await?;
        Ok(Response::new(pb::CountTokensResponse { tokens }))
    }

    async fn handoff(&self, request: Request<pb::HandoffRequest>) -> Result<Response<pb::HandoffResponse>, Status> {
        let call = call_of("Handoff", &request);
        let r = request.into_inner();
        // one record per call; a forward's records its compression
        let mut rec = self.audit_record(&call.method, call.caller.clone(), call.peer.clone());
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
        let res = self.handoff_inner(&call, r).await;
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
            max_budget_tokens: cfg.limits.max_budget_tokens as u32,
            confidence_threshold: cfg.sessions.confidence_threshold,
            session_ttl_s: cfg.sessions.session_ttl.as_secs(),
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
/// `--auth did-wba` ([`crate::auth::AuthenticatedDid`]), else the transport's (a
/// TLS client certificate); sessions opened with one are bound to it.
fn caller<T>(request: &Request<T>) -> Option<String> {
    if let Some(did) = request.extensions().get::<crate::auth::AuthenticatedDid>() {
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
