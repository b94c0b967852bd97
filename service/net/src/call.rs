//! The call layer: a reserve connection carries only a health check, and
//! each call keeps its connection busy until its response body ends.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll};

use crate::admit::{Admission, Admit, AdmitLayer, AdmitService, Response};
use crate::event::Event;
use crate::table::Conn;
use crate::table::Shared;
use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo};

// ---------------------------------------------------------------------------
// The call layer
// ---------------------------------------------------------------------------

/// See [`ConnGuard::layer`](crate::ConnGuard::layer).
pub type CallLayer = AdmitLayer<Calls>;

/// See [`ConnGuard::layer`](crate::ConnGuard::layer).
pub type CallService<S> = AdmitService<S, Calls>;

/// The calls each guarded connection may carry: on a reserve connection
/// only a health check (unless a normal slot has freed), on the others any,
/// each keeping its connection busy until its response body ends.
#[derive(Clone)]
pub struct Calls {
    pub(super) shared: Arc<Shared>,
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

impl Admission for Calls {
    type Guard = CallGuard;

    fn admit<B>(&self, req: &http::Request<B>) -> Admit<CallGuard> {
        let conn = remote_addr(req).and_then(|a| self.shared.lock().by_addr.get(&a).cloned());
        let Some(conn) = conn else {
            // not one of ours (an in-process test transport): pass through
            return Admit::Pass;
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
            return Admit::Refuse(refused.into_http());
        }
        Admit::Hold(CallGuard::enter(conn, self.shared.clone()))
    }

    fn respond(resp: Response, guard: CallGuard) -> Response {
        resp.map(|body| tonic::body::Body::new(HeldUntilEnd::new(body, guard)))
    }
}

/// One call in flight on a connection, until its response body ends.
pub struct CallGuard {
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
