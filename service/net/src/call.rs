//! The call layer: a reserve connection carries only a health check, and
//! each call keeps its connection busy until its response body ends.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll};

use crate::event::Event;
use crate::table::Conn;
use crate::table::Shared;
use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo};

// ---------------------------------------------------------------------------
// The call layer
// ---------------------------------------------------------------------------

/// See [`ConnGuard::layer`].
#[derive(Clone)]
pub struct CallLayer {
    pub(super) shared: Arc<Shared>,
}

impl<S> tower_layer::Layer<S> for CallLayer {
    type Service = CallService<S>;

    fn layer(&self, inner: S) -> CallService<S> {
        CallService { inner, shared: self.shared.clone() }
    }
}

/// See [`ConnGuard::layer`].
#[derive(Clone)]
pub struct CallService<S> {
    inner: S,
    shared: Arc<Shared>,
}

/// The remote address tonic recorded for the request's connection.
fn remote_addr<B>(req: &http::Request<B>) -> Option<SocketAddr> {
    let ext = req.extensions();
    ext.get::<TcpConnectInfo>()
        .and_then(TcpConnectInfo::remote_addr)
        .or_else(|| ext.get::<TlsConnectInfo<TcpConnectInfo>>().and_then(|t| t.get_ref().remote_addr()))
}

/// Calls a reserve connection may carry: a health `Check`. A `Watch`
/// stream would hold its reserve slot for as long as the client likes.
pub(super) fn is_health(path: &str) -> bool {
    path == "/grpc.health.v1.Health/Check"
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, B> tonic::codegen::Service<http::Request<B>> for CallService<S>
where
    S: tonic::codegen::Service<http::Request<B>, Response = http::Response<tonic::body::Body>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = S::Error;
    type Future = BoxFuture<std::result::Result<Self::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<std::result::Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let conn = remote_addr(&req).and_then(|a| self.shared.lock().by_addr.get(&a).cloned());
        let Some(conn) = conn else {
            // not one of ours (an in-process test transport): pass through
            return Box::pin(self.inner.call(req));
        };
        if conn.reserve.load(Ordering::SeqCst) && !is_health(req.uri().path()) && !self.shared.promote(&conn) {
            self.shared.event(Event::ReserveCall);
            let wait = self.shared.retry_hint();
            let ms = wait.as_millis().max(1);
            let mut refused = tonic::Status::resource_exhausted(format!(
                "the server holds its connection limit ({} connections); this connection is kept for health checks; retry after {ms} ms",
                self.shared.limits.max_connections
            ));
            if let Ok(v) = ms.to_string().parse() {
                refused.metadata_mut().insert("retry-after-ms", v);
            }
            return Box::pin(std::future::ready(Ok(refused.into_http())));
        }
        let guard = CallGuard::enter(conn, self.shared.clone());
        let fut = self.inner.call(req);
        Box::pin(async move {
            let resp = fut.await?;
            Ok(resp.map(|body| tonic::body::Body::new(HeldUntilEnd::new(body, guard))))
        })
    }
}

/// One call in flight on a connection, until its response body ends.
struct CallGuard {
    conn: Arc<Conn>,
    shared: Arc<Shared>,
}

impl CallGuard {
    fn enter(conn: Arc<Conn>, shared: Arc<Shared>) -> Self {
        conn.spoke.store(true, Ordering::SeqCst);
        conn.active.fetch_add(1, Ordering::SeqCst);
        conn.last_change_ms.store(shared.now_ms(), Ordering::SeqCst);
        Self { conn, shared }
    }
}

impl Drop for CallGuard {
    fn drop(&mut self) {
        self.conn.last_change_ms.store(self.shared.now_ms(), Ordering::SeqCst);
        self.conn.active.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A response body that holds `guard` until the body ends (a streamed
/// reply's call is in flight until its last frame), for any layer that
/// counts calls: this guard's [`CallGuard`], the server's drain.
pub struct HeldUntilEnd<G> {
    body: tonic::body::Body,
    _guard: G,
}

impl<G> HeldUntilEnd<G> {
    /// `body`, holding `guard`.
    pub fn new(body: tonic::body::Body, guard: G) -> Self {
        Self { body, _guard: guard }
    }
}

impl<G: Unpin> http_body::Body for HeldUntilEnd<G> {
    type Data = tonic::codegen::Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<std::result::Result<http_body::Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}
