//! The retrying gRPC client that the CLI (`scd client`, `scd mcp --server`)
//! and other callers use.
//!
//! Every call is retried with exponential backoff and jitter on
//! UNAVAILABLE and RESOURCE_EXHAUSTED (waiting at least the server's
//! `retry-after-ms`), an idempotent one also when it broke off (its
//! connection broke, or a load balancer cut its reply short), never on
//! INVALID_ARGUMENT and the like;
//! with a [`Signer`] each try carries a freshly signed `DIDWba` header.
//! [`view`] reads the replies as the one output view.
//!
//! ```
//! use std::time::Duration;
//! use scd_service::client::backoff;
//!
//! // never below the server's hint, and growing with the attempt
//! assert!(backoff(0, Duration::from_millis(500)) >= Duration::from_millis(500));
//! ```

pub mod view;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;

use scd_did::Identity;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, ClientTlsConfig, Endpoint};
use tonic::{Code, Status};
use tracing::warn;

use crate::grpc::pb;
use crate::tls;

/// A plaintext call that a server broke off at the transport level (an
/// HTTP/2 protocol error, a reset or closed connection, an unexpected EOF —
/// anything but a refused connection or an unknown host): what a TLS-only
/// server does to a plaintext client, whichever way the race goes.
fn looks_like_tls_server(err: &Status) -> bool {
    let mut text = err.message().to_string();
    let mut source = std::error::Error::source(err);
    let transport = source.is_some() || text.contains("h2 protocol error");
    while let Some(e) = source {
        text.push_str(&format!(": {e}"));
        source = e.source();
    }
    let text = text.to_lowercase();
    transport && !["refused", "dns", "failed to lookup"].iter().any(|m| text.contains(m))
}

/// Whether a failed call may be retried, and how long to wait at least.
///
/// UNAVAILABLE (server down, draining, not reachable) and RESOURCE_EXHAUSTED
/// (queue full; wait its `retry-after-ms`) always; a call that broke off
/// only for `idempotent` calls: a connection that broke under it (a
/// transport error, reported as UNKNOWN, INTERNAL or CANCELLED with a
/// source), or a reply cut off after it began (UNKNOWN "missing
/// grpc-status trailer": a load balancer whose replica died mid-reply). A
/// status the server answered (INVALID_ARGUMENT, NOT_FOUND, ...) never.
pub fn retryable(s: &Status, idempotent: bool) -> Option<Duration> {
    match s.code() {
        Code::Unavailable => Some(Duration::ZERO),
        Code::ResourceExhausted => Some(Duration::from_millis(
            s.metadata().get("retry-after-ms").and_then(|v| v.to_str().ok()?.parse().ok()).unwrap_or(0),
        )),
        Code::Unknown | Code::Internal | Code::Cancelled if idempotent && std::error::Error::source(s).is_some() => {
            Some(Duration::ZERO)
        }
        Code::Unknown if idempotent && cut_off(s) => Some(Duration::ZERO),
        _ => None,
    }
}

/// A reply that ended without its gRPC status: the server began answering
/// (so it may have done the work) and its stream was ended cleanly before
/// the trailers came. A load balancer does this when the replica it was
/// relaying dies mid-reply (HAProxy ends the client's stream, tonic answers
/// UNKNOWN "missing grpc-status trailer", with no source); it is a broken
/// call, not the server's answer.
fn cut_off(s: &Status) -> bool {
    s.code() == Code::Unknown
        && std::error::Error::source(s).is_none()
        && s.message().contains("missing grpc-status trailer")
}

/// Backoff before retry `attempt` (0-based): 100 ms doubling, capped at 2 s,
/// with jitter in its upper half; never below `floor`.
pub fn backoff(attempt: u32, floor: Duration) -> Duration {
    let base = 100u64.saturating_mul(1 << attempt.min(5)).min(2_000);
    let jittered = Duration::from_millis(rand::random_range(base / 2..=base));
    jittered.max(floor)
}

/// Adds a freshly signed `Authorization: DIDWba …` header to every request
/// when it has an identity; passes requests through otherwise.
#[derive(Clone)]
pub struct Signer {
    identity: Option<Arc<Identity>>,
    aud: String,
}

impl Signer {
    /// Signs as `identity` for the service named `aud`.
    pub fn new(identity: Option<Identity>, aud: &str) -> Signer {
        Signer { identity: identity.map(Arc::new), aud: aud.to_string() }
    }
}

impl tonic::service::Interceptor for Signer {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, Status> {
        if let Some(id) = &self.identity {
            let header = scd_did::wba::sign_header(id, &self.aud, scd_did::time::now_s());
            let value = header.parse().map_err(|_| Status::internal("signed header is not ASCII"))?;
            req.metadata_mut().insert("authorization", value);
        }
        Ok(req)
    }
}

/// The generated `scd.v1` client, signing every call through a [`Signer`].
pub type Client = pb::scd_client::ScdClient<InterceptedService<Channel, Signer>>;

/// A reconnecting client: the channel is built lazily, and rebuilt after a
/// broken connection. Clones share the channel (one per concurrent caller,
/// as `scd mcp --server` does).
#[derive(Clone)]
pub struct Conn {
    endpoint: Endpoint,
    client: Client,
    signer: Signer,
    retries: u32,
}

impl Conn {
    /// A lazy connection to `addr` (TLS when `tls` is given), retrying each
    /// call up to `retries` times.
    pub fn new(addr: &str, tls: Option<ClientTlsConfig>, retries: u32, signer: Signer) -> anyhow::Result<Self> {
        let mut endpoint = Endpoint::from_shared(addr.to_string())
            .with_context(|| format!("--addr {addr}: not a URI"))?
            .connect_timeout(Duration::from_secs(5));
        if let Some(tls) = tls {
            endpoint =
                endpoint.tls_config(tls).map_err(|e| anyhow::anyhow!("--addr {addr}: {}", tls::error_chain(&e)))?;
        }
        let client = Self::client(&endpoint, &signer);
        Ok(Self { endpoint, client, signer, retries })
    }

    fn client(endpoint: &Endpoint, signer: &Signer) -> Client {
        pb::scd_client::ScdClient::with_interceptor(endpoint.connect_lazy(), signer.clone())
            .max_decoding_message_size(64 << 20)
    }

    /// Runs `call` with retries (see [`retryable`]).
    pub async fn call<T, F, Fut>(&mut self, what: &str, idempotent: bool, call: F) -> anyhow::Result<T>
    where
        F: FnMut(Client) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, Status>>,
    {
        self.try_call(what, idempotent, call).await.map_err(|(err, attempt)| {
            let plaintext = self.endpoint.uri().scheme_str() == Some("http");
            let e = status_error(what, &err, attempt, !plaintext);
            if plaintext && looks_like_tls_server(&err) {
                e.context("the server may speak TLS: use an https:// --addr with --ca-cert")
            } else {
                e
            }
        })
    }

    /// Runs `call` with retries (see [`retryable`]); the last status and the
    /// retries made when it fails.
    pub async fn try_call<T, F, Fut>(&mut self, what: &str, idempotent: bool, mut call: F) -> Result<T, (Status, u32)>
    where
        F: FnMut(Client) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, Status>>,
    {
        let mut attempt = 0;
        loop {
            let err = match call(self.client.clone()).await {
                Ok(r) => return Ok(r.into_inner()),
                Err(s) => s,
            };
            let Some(floor) = retryable(&err, idempotent).filter(|_| attempt < self.retries) else {
                return Err((err, attempt));
            };
            let wait = backoff(attempt, floor);
            warn!(call = what, code = ?err.code(), attempt = attempt + 1, of = self.retries, wait_ms = wait.as_millis() as u64, "retrying: {}", err.message());
            if err.code() != Code::ResourceExhausted {
                // the connection may be gone: start a fresh one
                self.client = Self::client(&self.endpoint, &self.signer);
            }
            tokio::time::sleep(wait).await;
            attempt += 1;
        }
    }
}

/// The error of a failed call, its cause said once; over TLS (`tls`), what
/// to change when the cause is one a user can fix ([`tls::tls_hint`]).
fn status_error(what: &str, s: &Status, retries: u32, tls: bool) -> anyhow::Error {
    let chain = std::error::Error::source(s).map(tls::error_chain).unwrap_or_default();
    // the source often repeats the message word for word: said once
    let detail = if chain.is_empty() || s.message().contains(&chain) {
        String::new()
    } else if chain.contains(s.message()) {
        chain.clone()
    } else {
        format!("{} ({chain})", s.message())
    };
    let detail = if detail.is_empty() { s.message().to_string() } else { detail };
    let tries = if retries > 0 { format!(" after {retries} retries") } else { String::new() };
    match tls::tls_hint(&detail).filter(|_| tls) {
        Some(hint) => anyhow::anyhow!("{what}: TLS: {hint} [{detail}]{tries}"),
        None => anyhow::anyhow!("{what}: {:?}: {detail}{tries}", s.code()),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};

    use super::*;

    #[test]
    fn the_tls_hint_is_for_broken_off_calls_only() {
        assert!(looks_like_tls_server(&Status::unavailable("h2 protocol error: http2 error")));
        let io = std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "connection closed before message completed");
        let mut closed = Status::unavailable("transport error");
        closed.set_source(std::sync::Arc::new(io));
        assert!(looks_like_tls_server(&closed));
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "Connection refused (os error 111)");
        let mut refused = Status::unavailable("tcp connect error");
        refused.set_source(std::sync::Arc::new(io));
        assert!(!looks_like_tls_server(&refused));
        assert!(!looks_like_tls_server(&Status::invalid_argument("texts: must hold at least one text")));
    }

    #[test]
    fn only_transient_failures_are_retried() {
        assert_eq!(retryable(&Status::unavailable("down"), false), Some(Duration::ZERO));
        let mut busy = Status::resource_exhausted("queue full");
        busy.metadata_mut().insert("retry-after-ms", "250".parse().unwrap());
        assert_eq!(retryable(&busy, false), Some(Duration::from_millis(250)));
        for code in [Code::InvalidArgument, Code::NotFound, Code::PermissionDenied, Code::Unauthenticated] {
            assert_eq!(retryable(&Status::new(code, "no"), true), None, "{code:?}");
        }
        // an UNKNOWN the server answered (no transport source) is not retried
        assert_eq!(retryable(&Status::unknown("handler said so"), true), None);
        let broken = Status::from_error(Box::new(std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset")));
        assert_eq!(broken.code(), Code::Unknown);
        assert_eq!(retryable(&broken, true), Some(Duration::ZERO));
        assert_eq!(retryable(&broken, false), None);
    }

    /// A server that answers its first call with a 200 and no gRPC status
    /// (as HAProxy ends a reply whose replica died after its headers) and
    /// every later one with NOT_FOUND; it counts the calls.
    #[derive(Clone, Default)]
    struct CutsOffTheFirstReply(Arc<AtomicUsize>);

    impl tonic::server::NamedService for CutsOffTheFirstReply {
        const NAME: &'static str = "scd.v1.Scd";
    }

    impl tower::Service<http::Request<tonic::body::Body>> for CutsOffTheFirstReply {
        type Response = http::Response<tonic::body::Body>;
        type Error = std::convert::Infallible;
        type Future = std::future::Ready<Result<Self::Response, Self::Error>>;

        fn poll_ready(&mut self, _: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), Self::Error>> {
            std::task::Poll::Ready(Ok(()))
        }

        fn call(&mut self, _: http::Request<tonic::body::Body>) -> Self::Future {
            let mut r = http::Response::builder().header("content-type", "application/grpc");
            if self.0.fetch_add(1, SeqCst) > 0 {
                r = r.header("grpc-status", "5").header("grpc-message", "gone");
            }
            std::future::ready(Ok(r.body(tonic::body::Body::empty()).unwrap()))
        }
    }

    #[tokio::test]
    async fn a_reply_cut_off_mid_way_is_retried_only_when_the_call_is_idempotent() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = format!("http://{}", listener.local_addr().unwrap());
        let server = CutsOffTheFirstReply::default();
        let calls = server.0.clone();
        let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
        tokio::spawn(tonic::transport::Server::builder().add_service(server).serve_with_incoming(incoming));
        let info = |mut cl: Client| async move { cl.info(pb::InfoRequest {}).await };
        let mut c = Conn::new(&addr, None, 3, Signer::new(None, "scd")).unwrap();

        // not idempotent: the server may have done the work; not retried
        let (err, retries) = c.try_call("Info", false, info).await.unwrap_err();
        assert_eq!((err.code(), retries, calls.load(SeqCst)), (Code::Unknown, 0, 1), "{err:?}");
        assert!(cut_off(&err), "tonic words a cut-off reply differently now: {err:?}");
        // idempotent: retried, and the retry gets the server's own answer
        calls.store(0, SeqCst);
        let (err, retries) = c.try_call("Info", true, info).await.unwrap_err();
        assert_eq!((err.code(), retries, calls.load(SeqCst)), (Code::NotFound, 1, 2), "{err:?}");
        assert_eq!(err.message(), "gone");
    }

    #[test]
    fn backoff_doubles_with_jitter_and_caps_at_two_seconds() {
        for _ in 0..100 {
            let b0 = backoff(0, Duration::ZERO).as_millis();
            assert!((50..=100).contains(&b0), "{b0}");
            let b3 = backoff(3, Duration::ZERO).as_millis();
            assert!((400..=800).contains(&b3), "{b3}");
            let b9 = backoff(9, Duration::ZERO).as_millis();
            assert!((1000..=2000).contains(&b9), "{b9}");
        }
        assert_eq!(backoff(0, Duration::from_millis(700)), Duration::from_millis(700));
    }
}
