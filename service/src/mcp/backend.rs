//! Where the tools' work runs: the engine in this process, or a running
//! `scd serve`. Both speak `scd.v1` messages, so the two answer alike.

use scd_engine::handoff::ConfidenceMap;
use std::net::SocketAddr;
use std::sync::Arc;

use scd_engine::extract::Scd;
use tonic::{Code, Request, Status};

use crate::app::metrics::Metrics;
use crate::app::{Core, Limits};
use crate::client::Conn;
use crate::grpc::pb::scd_server::Scd as _;
use crate::grpc::{pb, ScdHandler};

/// Where a tool call comes from: the HTTP client's address, `None` over
/// stdio. In process it is the call's peer, so that each client draws on its
/// own share of the compress slots and the embed queue and its chosen
/// session ids are its own, as over gRPC; a remote server sees the MCP
/// server's address instead.
pub type Peer = Option<SocketAddr>;

/// `msg` as a call from `peer`.
fn from<T>(msg: T, peer: Peer) -> Request<T> {
    crate::http::Caller { did: None, addr: peer }.grpc_request(msg)
}

/// The engine behind the tools.
#[derive(Clone)]
pub enum Backend {
    /// The `scd.v1.Scd` handler of `scd serve`, called without a network:
    /// the same validation and limits, compression on `spawn_blocking`
    /// behind its semaphore (full: "resource exhausted, retry"), embeddings
    /// through its batcher thread.
    InProcess(ScdHandler),
    /// A running `scd serve` (`scd mcp --server URL`), with the retries of
    /// `scd client`.
    Remote(Box<Conn>),
}

impl Backend {
    /// The engine in this process under `limits` (see [`Core::new`]).
    pub fn in_process(scd: Arc<Scd>, limits: Limits) -> Self {
        Self::in_process_with(scd, limits, ConfidenceMap::default())
    }

    /// [`Backend::in_process`] reading hand-off confidence levels through `map`.
    pub fn in_process_with(scd: Arc<Scd>, limits: Limits, map: ConfidenceMap) -> Self {
        let metrics = Arc::new(Metrics::new(limits.max_batch_tokens));
        Backend::InProcess(ScdHandler(Arc::new(Core::new(scd, limits, metrics).with_confidence_map(map))))
    }

    /// `Compress`; `open_session` is OpenSession (the server draws the id
    /// unless the request names one).
    pub async fn compress(
        &self,
        r: pb::CompressRequest,
        open_session: bool,
        peer: Peer,
    ) -> Result<pb::CompressResponse, Status> {
        match (self, open_session) {
            (Backend::InProcess(h), false) => h.compress(from(r, peer)).await.map(|r| r.into_inner()),
            (Backend::InProcess(h), true) => {
                let r = h.open_session(from(pb::OpenSessionRequest { compress: Some(r) }, peer)).await?;
                r.into_inner().result.ok_or_else(|| Status::internal("OpenSession answered no result"))
            }
            (Backend::Remote(c), false) => {
                // continuing a session (a token) or none at all: safe to retry
                let idempotent = r.session_id.is_empty() || !r.session_token.is_empty();
                remote(c, "Compress", idempotent, move |mut cl| {
                    let r = r.clone();
                    async move { cl.compress(r).await }
                })
                .await
            }
            (Backend::Remote(c), true) => {
                // a retry after the server opened it would find the id taken
                let out = remote(c, "OpenSession", false, move |mut cl| {
                    let compress = Some(r.clone());
                    async move { cl.open_session(pb::OpenSessionRequest { compress }).await }
                })
                .await?;
                out.result.ok_or_else(|| Status::internal("OpenSession answered no result"))
            }
        }
    }

    /// `RequestContext` (advances the session: not retried on a broken connection).
    pub async fn request_context(&self, r: pb::ContextRequest, peer: Peer) -> Result<pb::ContextResponse, Status> {
        match self {
            Backend::InProcess(h) => h.request_context(from(r, peer)).await.map(|r| r.into_inner()),
            Backend::Remote(c) => {
                remote(c, "RequestContext", false, move |mut cl| {
                    let r = r.clone();
                    async move { cl.request_context(r).await }
                })
                .await
            }
        }
    }

    /// `CountTokens`.
    pub async fn count_tokens(&self, r: pb::CountTokensRequest, peer: Peer) -> Result<pb::CountTokensResponse, Status> {
        match self {
            Backend::InProcess(h) => h.count_tokens(from(r, peer)).await.map(|r| r.into_inner()),
            Backend::Remote(c) => {
                remote(c, "CountTokens", true, move |mut cl| {
                    let r = r.clone();
                    async move { cl.count_tokens(r).await }
                })
                .await
            }
        }
    }

    /// `Embed`.
    pub async fn embed(&self, r: pb::EmbedRequest, peer: Peer) -> Result<pb::EmbedResponse, Status> {
        match self {
            Backend::InProcess(h) => h.embed(from(r, peer)).await.map(|r| r.into_inner()),
            Backend::Remote(c) => {
                remote(c, "Embed", true, move |mut cl| {
                    let r = r.clone();
                    async move { cl.embed(r).await }
                })
                .await
            }
        }
    }
}

/// One call on a clone of `conn` (clones share the channel), with its retries.
async fn remote<T, F, Fut>(conn: &Conn, what: &str, idempotent: bool, call: F) -> Result<T, Status>
where
    F: FnMut(crate::client::Client) -> Fut,
    Fut: std::future::Future<Output = Result<tonic::Response<T>, Status>>,
{
    let mut c = conn.clone();
    c.try_call(what, idempotent, call).await.map_err(|(s, retries)| {
        if retries > 0 {
            Status::new(s.code(), format!("{} (after {retries} retries)", s.message()))
        } else if s.code() == Code::Unavailable && s.message().is_empty() {
            Status::unavailable("the scd server (--server) is not reachable")
        } else {
            s
        }
    })
}
