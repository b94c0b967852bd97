//! The gRPC server: `scd.v1.Scd` plus `grpc.health.v1` and reflection, and
//! Prometheus metrics over HTTP.
//!
//! CPU work never runs on the async runtime: embeddings go through the
//! [`batcher`] thread; compression runs on `spawn_blocking` behind a
//! semaphore. Every queue is bounded and a full one answers
//! RESOURCE_EXHAUSTED with a retry hint.

pub mod batcher;
pub mod convert;
pub mod http;
pub mod metrics;
mod server;

pub use server::{serve, ServeConfig};

use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;

use scd_engine::extract::{ContextRequest, Scd};
use tokio::sync::{oneshot, Semaphore};
use tokio_stream::{Stream, StreamExt};
use tonic::{Request, Response, Status};

use self::batcher::{Batcher, Job};
use self::metrics::Metrics;

/// Generated protobuf and gRPC code for `scd.v1`.
#[allow(missing_docs, clippy::all)]
pub mod pb {
    tonic::include_proto!("scd.v1");
}

/// Encoded file descriptor set, for reflection.
pub const DESCRIPTOR: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/scd_descriptor.bin"));

/// Per-request limits.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Texts per Embed request.
    pub max_texts: usize,
    /// Fields per Compress request.
    pub max_fields: usize,
    /// Largest request message.
    pub max_request_bytes: usize,
    /// Queued embed requests.
    pub queue_size: usize,
    /// Texts merged into one encoder call.
    pub batch_texts: usize,
    /// Compress/RequestContext calls running or waiting at once.
    pub max_concurrent_compress: usize,
}

/// The `scd.v1.Scd` implementation.
pub struct ScdService {
    pub(crate) scd: Arc<Scd>,
    pub(crate) batcher: Batcher,
    compress_slots: Arc<Semaphore>,
    limits: Limits,
    metrics: Arc<Metrics>,
}

/// Requests of one EmbedStream queued ahead of the one being answered: a
/// bulk client keeps the encoder busy without one stream taking the queue.
const STREAM_WINDOW: usize = 4;

/// An embed request waiting in the batcher.
struct PendingEmbed {
    rx: oneshot::Receiver<(scd_engine::Result<scd_engine::encoder::Encoded>, f64)>,
    start: Instant,
}

fn overloaded(what: &str) -> Status {
    let mut s = Status::resource_exhausted(format!("{what} queue is full; retry after 100 ms"));
    s.metadata_mut().insert("retry-after-ms", "100".parse().expect("ascii"));
    s
}

fn ms(since: Instant) -> f64 {
    since.elapsed().as_secs_f64() * 1e3
}

impl ScdService {
    /// A service over `scd`.
    pub fn new(scd: Arc<Scd>, limits: Limits, metrics: Arc<Metrics>) -> Self {
        let batcher = Batcher::start(scd.encoder().clone(), limits.queue_size, limits.batch_texts, metrics.clone());
        Self {
            compress_slots: Arc::new(Semaphore::new(limits.max_concurrent_compress.max(1))),
            scd,
            batcher,
            limits,
            metrics,
        }
    }

    fn finish<T>(&self, method: &str, r: Result<T, Status>) -> Result<T, Status> {
        self.metrics.request(method, r.as_ref().map(|_| tonic::Code::Ok).unwrap_or_else(|s| s.code()));
        r
    }

    async fn embed_inner(&self, r: pb::EmbedRequest) -> Result<pb::EmbedResponse, Status> {
        let pending = self.embed_submit(r)?;
        self.embed_wait(pending).await
    }

    /// Validates an embed request and queues it for the batcher.
    fn embed_submit(&self, r: pb::EmbedRequest) -> Result<PendingEmbed, Status> {
        let start = Instant::now();
        let (texts, opts) = convert::embed_request(r, self.limits.max_texts)?;
        let (tx, rx) = oneshot::channel();
        self.batcher.submit(Job { texts, opts, reply: tx, queued: Instant::now() }).map_err(|_| overloaded("embed"))?;
        Ok(PendingEmbed { rx, start })
    }

    /// Waits for a queued embed request's answer.
    async fn embed_wait(&self, p: PendingEmbed) -> Result<pb::EmbedResponse, Status> {
        let (result, queue_ms) = p.rx.await.map_err(|_| Status::internal("encoder thread stopped"))?;
        let enc = result.map_err(convert::status)?;
        let total = ms(p.start);
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

    /// Runs CPU-bound engine work off the runtime, behind the compress slots.
    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Scd) -> scd_engine::Result<T> + Send + 'static,
    ) -> Result<(T, f64), Status> {
        let queued = Instant::now();
        let permit = self.compress_slots.clone().try_acquire_owned().map_err(|_| overloaded("compress"))?;
        let scd = self.scd.clone();
        let out = tokio::task::spawn_blocking(move || {
            let _permit = permit;
            f(&scd)
        })
        .await
        .map_err(|e| Status::internal(format!("worker failed: {e}")))?
        .map_err(convert::status)?;
        Ok((out, ms(queued)))
    }

    async fn compress_inner(&self, r: pb::CompressRequest) -> Result<pb::CompressResponse, Status> {
        let req = convert::compress_request(r, self.limits.max_fields)?;
        let (out, total) = self.blocking(move |scd| scd.compress(&req)).await?;
        let t = out.timings;
        self.metrics.stage("Compress", "inference", t.prepare_ms + t.task_embed_ms);
        self.metrics.stage("Compress", "selection", t.select_ms);
        let timing = pb::Timing {
            queue_ms: (total - t.prepare_ms - t.task_embed_ms - t.select_ms).max(0.0),
            inference_ms: t.prepare_ms + t.task_embed_ms,
            selection_ms: t.select_ms,
            total_ms: total,
        };
        Ok(convert::compress_response(out, timing))
    }
}

type EmbedStream = Pin<Box<dyn Stream<Item = Result<pb::EmbedResponse, Status>> + Send>>;

#[tonic::async_trait]
impl pb::scd_server::Scd for Arc<ScdService> {
    type EmbedStreamStream = EmbedStream;

    async fn embed(&self, request: Request<pb::EmbedRequest>) -> Result<Response<pb::EmbedResponse>, Status> {
        let r = self.embed_inner(request.into_inner()).await;
        self.finish("Embed", r).map(Response::new)
    }

    async fn embed_stream(
        &self,
        request: Request<tonic::Streaming<pb::EmbedRequest>>,
    ) -> Result<Response<EmbedStream>, Status> {
        let mut input = request.into_inner();
        // requests are validated and queued as they arrive (up to
        // STREAM_WINDOW ahead) and answered in order
        let (queued_tx, mut queued_rx) = tokio::sync::mpsc::channel::<Result<PendingEmbed, Status>>(STREAM_WINDOW);
        let me = self.clone();
        tokio::spawn(async move {
            while let Some(item) = input.next().await {
                let pending = item.and_then(|r| me.embed_submit(r));
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
                    Ok(p) => me.embed_wait(p).await,
                    Err(s) => Err(s),
                };
                let stop = reply.is_err();
                let reply = me.finish("EmbedStream", reply);
                if tx.send(reply).await.is_err() || stop {
                    break;
                }
            }
        });
        Ok(Response::new(out))
    }

    async fn compress(&self, request: Request<pb::CompressRequest>) -> Result<Response<pb::CompressResponse>, Status> {
        let r = self.compress_inner(request.into_inner()).await;
        self.finish("Compress", r).map(Response::new)
    }

    async fn request_context(
        &self,
        request: Request<pb::ContextRequest>,
    ) -> Result<Response<pb::ContextResponse>, Status> {
        let r = request.into_inner();
        let req = ContextRequest {
            session_id: r.session_id,
            specific_question: r.specific_question,
            current_confidence: r.current_confidence,
            reasoning: r.reasoning,
            chunk_ids: r.chunk_ids,
        };
        let start = Instant::now();
        let res = self.blocking(move |scd| scd.request_more(&req)).await.map(|(more, total)| pb::ContextResponse {
            chunks: more.chunks.iter().map(convert::chunk).collect(),
            remaining_tokens: more.remaining_tokens as u32,
            reason: more.reason.unwrap_or_default(),
            timing: Some(pb::Timing { queue_ms: 0.0, inference_ms: 0.0, selection_ms: ms(start), total_ms: total }),
        });
        self.finish("RequestContext", res).map(Response::new)
    }

    async fn open_session(
        &self,
        request: Request<pb::OpenSessionRequest>,
    ) -> Result<Response<pb::OpenSessionResponse>, Status> {
        let r = request.into_inner();
        let res = async {
            let mut c = r.compress.ok_or_else(|| Status::invalid_argument("compress: required"))?;
            if c.session_id.is_empty() {
                c.session_id = format!("s-{:016x}", rand_id());
            }
            let id = c.session_id.clone();
            let result = self.compress_inner(c).await?;
            Ok(pb::OpenSessionResponse { session_id: id, result: Some(result) })
        }
        .await;
        self.finish("OpenSession", res).map(Response::new)
    }

    async fn close_session(
        &self,
        request: Request<pb::CloseSessionRequest>,
    ) -> Result<Response<pb::CloseSessionResponse>, Status> {
        let closed = self.scd.close_session(&request.into_inner().session_id);
        self.finish("CloseSession", Ok(pb::CloseSessionResponse { closed })).map(Response::new)
    }

    async fn count_tokens(
        &self,
        request: Request<pb::CountTokensRequest>,
    ) -> Result<Response<pb::CountTokensResponse>, Status> {
        let texts = request.into_inner().texts;
        let res = if texts.len() > self.limits.max_texts {
            Err(Status::invalid_argument(format!(
                "texts: {} texts, over the limit {}",
                texts.len(),
                self.limits.max_texts
            )))
        } else {
            self.blocking(move |scd| texts.iter().map(|t| scd.encoder().count_tokens(t).map(|n| n as u32)).collect())
                .await
                .map(|(tokens, _)| pb::CountTokensResponse { tokens })
        };
        self.finish("CountTokens", res).map(Response::new)
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
        };
        self.finish("Info", Ok(r)).map(Response::new)
    }
}

fn rand_id() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0));
    h.finish()
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
