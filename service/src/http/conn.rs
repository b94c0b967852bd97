//! The HTTP listener's connections (REST, A2A, `/metrics`, `/health`,
//! `/ready`; `scd mcp --http-addr`): the defences gRPC's listener has in
//! `scd_net`, for hyper's HTTP/1.1 driver.
//!
//! - **Caps.** At most [`HttpLimits::max_connections`] connections, and
//!   [`HttpLimits::max_per_peer`] from one IPv4 address or IPv6 /64; past a
//!   cap the socket is closed at once and counted in
//!   `scd_rejected_total{kind="http_connections"|"http_per_peer"}`.
//! - **A reserve for probes.** Past `max_connections`, up to
//!   [`HttpLimits::reserve`] more connections are admitted that may carry
//!   only `GET /health`, `GET /ready` and `GET /metrics`: a load balancer
//!   still reads the replica's state, and Prometheus its metrics, while
//!   clients hold every normal slot. Any other request
//!   on a reserve connection moves it to a normal slot if one is free, else
//!   is answered 503 with `Retry-After` (`http_reserve_call`).
//! - **Time limits on the client's side of a call.** A request head must
//!   arrive within [`HttpLimits::header_timeout`] (an idle keep-alive
//!   connection included); its body within [`HttpLimits::body_timeout`] of
//!   the head plus 1 s for each 64 KiB received (a body that keeps coming at
//!   64 KiB/s never runs out), else 408 and the connection is closed
//!   (`http_body_timeout`); a reply the client reads slower than that for
//!   `body_timeout` closes the connection (`http_write_stall`). Slow sockets
//!   and trickles cannot hold slots. One client holds at most a quarter of
//!   the probe reserve, and a probe answered on a reserve connection closes it.
//! - **No cap on the server's side short of [`HttpLimits::request_timeout`].**
//!   A call that works (a compress of a large repository on a busy CPU) runs
//!   to its end; past the limit it is cancelled and answered 504 saying so
//!   (`http_request_timeout`). There is no connection age: a keep-alive
//!   connection lives while its client keeps using it.
//!
//! The retry hint of a refusal is the soonest time a normal slot is due to
//! free: each connection carries the deadline of its current phase (head,
//! body, call), and the hint is the earliest of them.

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future as _;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Sleep;
use tracing::debug;

use crate::app::ratelog::RateLimitedWarn;

/// HTTP listener settings (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HttpLimits {
    /// Connections open at once, all peers together (the reserve aside).
    pub max_connections: usize,
    /// Connections from one IPv4 address or IPv6 /64 (reserve ones included).
    pub max_per_peer: usize,
    /// Connections past `max_connections` admitted for `/health`, `/ready` and `/metrics` only.
    pub reserve: usize,
    /// Time a connection has to send a complete request head (and, over
    /// TLS, to finish its handshake first); idle keep-alive ones included.
    pub header_timeout: Duration,
    /// Time a request's body has to arrive after its head; also the longest
    /// a reply may wait on a client that reads nothing.
    pub body_timeout: Duration,
    /// Longest a call may run before it is cancelled and answered 504.
    pub request_timeout: Duration,
}

impl Default for HttpLimits {
    /// `scd serve`'s defaults: 256 connections, 64 per peer, 8 for probes;
    /// 5 s for a head, 30 s for a body, 600 s for a call.
    fn default() -> Self {
        Self {
            max_connections: 256,
            max_per_peer: 64,
            reserve: 8,
            header_timeout: Duration::from_secs(5),
            body_timeout: Duration::from_secs(30),
            request_timeout: Duration::from_secs(600),
        }
    }
}

static CONN_LIMIT: RateLimitedWarn = RateLimitedWarn::new("http_connections");
static ACCEPT: RateLimitedWarn = RateLimitedWarn::new("http_accept");

/// Whom the per-peer cap counts a connection against: its IPv4 address
/// (an IPv4-mapped IPv6 one included), or the /64 of its IPv6 one.
pub(crate) fn peer_group(peer: IpAddr) -> IpAddr {
    match peer.to_canonical() {
        IpAddr::V6(v6) => IpAddr::V6(std::net::Ipv6Addr::from(u128::from(v6) & !((1u128 << 64) - 1))),
        v4 => v4,
    }
}

/// One admitted connection's state, shared with its requests.
struct Conn {
    id: u64,
    group: IpAddr,
    /// Admitted into the probe reserve (until moved to a normal slot).
    reserve: AtomicBool,
    /// Milliseconds after the guard's epoch by which the connection is due
    /// to have freed its slot, if its client does nothing more.
    due_ms: AtomicU64,
}

#[derive(Default)]
struct Slots {
    normal: usize,
    reserve: usize,
    per_group: HashMap<IpAddr, usize>,
    /// Reserve connections per peer group: one client may not hold the
    /// whole probe reserve.
    reserve_per_group: HashMap<IpAddr, usize>,
    conns: HashMap<u64, Arc<Conn>>,
}

impl Slots {
    fn leave_reserve(&mut self, group: IpAddr) {
        if let Some(n) = self.reserve_per_group.get_mut(&group) {
            *n -= 1;
            if *n == 0 {
                self.reserve_per_group.remove(&group);
            }
        }
    }
}

/// The listener's admission state.
struct Guard {
    limits: HttpLimits,
    slots: Mutex<Slots>,
    next_id: AtomicU64,
    epoch: Instant,
}

/// Why a connection was closed on accept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Refused {
    Listener,
    Peer,
}

impl Guard {
    fn new(limits: HttpLimits) -> Arc<Self> {
        Arc::new(Self { limits, slots: Mutex::default(), next_id: AtomicU64::new(0), epoch: Instant::now() })
    }

    fn slots(&self) -> std::sync::MutexGuard<'_, Slots> {
        self.slots.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn admit(self: &Arc<Self>, peer: IpAddr) -> Result<Admitted, Refused> {
        let group = peer_group(peer);
        let mut s = self.slots();
        if s.per_group.get(&group).copied().unwrap_or(0) >= self.limits.max_per_peer.max(1) {
            return Err(Refused::Peer);
        }
        let reserve = if s.normal < self.limits.max_connections.max(1) {
            false
        } else if s.reserve < self.limits.reserve {
            if s.reserve_per_group.get(&group).copied().unwrap_or(0) >= (self.limits.reserve / 4).max(1) {
                return Err(Refused::Peer);
            }
            true
        } else {
            return Err(Refused::Listener);
        };
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let due = self.now_ms().saturating_add(ms(self.limits.header_timeout));
        let conn = Arc::new(Conn { id, group, reserve: AtomicBool::new(reserve), due_ms: AtomicU64::new(due) });
        if reserve {
            s.reserve += 1;
            *s.reserve_per_group.entry(group).or_default() += 1;
        } else {
            s.normal += 1;
        }
        *s.per_group.entry(group).or_default() += 1;
        s.conns.insert(id, conn.clone());
        Ok(Admitted { conn, guard: self.clone() })
    }

    /// Moves a reserve connection to a normal slot if one is free.
    fn promote(&self, conn: &Conn) -> bool {
        let mut s = self.slots();
        if !conn.reserve.load(Ordering::SeqCst) {
            return true;
        }
        if s.normal >= self.limits.max_connections.max(1) {
            return false;
        }
        conn.reserve.store(false, Ordering::SeqCst);
        s.reserve -= 1;
        s.normal += 1;
        s.leave_reserve(conn.group);
        true
    }

    fn release(&self, conn: &Conn) {
        let mut s = self.slots();
        if s.conns.remove(&conn.id).is_none() {
            return;
        }
        if conn.reserve.load(Ordering::SeqCst) {
            s.reserve = s.reserve.saturating_sub(1);
            s.leave_reserve(conn.group);
        } else {
            s.normal = s.normal.saturating_sub(1);
        }
        if let Some(n) = s.per_group.get_mut(&conn.group) {
            *n -= 1;
            if *n == 0 {
                s.per_group.remove(&conn.group);
            }
        }
    }

    /// How long until the first normal slot is due to free: the earliest
    /// deadline still ahead of the connections holding one (a deadline
    /// passed while the connection still works, e.g. a streamed reply, says
    /// nothing); the header timeout when none is ahead.
    fn retry_hint(&self) -> Duration {
        let now = self.now_ms();
        let s = self.slots();
        let soonest = s
            .conns
            .values()
            .filter(|c| !c.reserve.load(Ordering::SeqCst))
            .map(|c| c.due_ms.load(Ordering::SeqCst))
            .filter(|&due| due > now)
            .min();
        soonest.map_or(self.limits.header_timeout, |due| Duration::from_millis(due - now)).max(Duration::from_millis(1))
    }
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// A connection's slot, freed when dropped.
struct Admitted {
    conn: Arc<Conn>,
    guard: Arc<Guard>,
}

impl Admitted {
    /// The connection is due to free its slot within `d` from now.
    fn due_in(&self, d: Duration) {
        self.conn.due_ms.store(self.guard.now_ms().saturating_add(ms(d)), Ordering::SeqCst);
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        self.guard.release(&self.conn);
    }
}

/// Serves `router` on `listener` with `limits`, over TLS with `tls`, until
/// the task is dropped; `on_event` runs with the `scd_rejected_total` kind
/// of each refusal (see the module docs). Each request carries its client's
/// address as an `Extension<ConnectInfo<SocketAddr>>`.
pub async fn serve(
    listener: tokio::net::TcpListener,
    router: axum::Router,
    limits: HttpLimits,
    tls: Option<tokio_rustls::TlsAcceptor>,
    on_event: impl Fn(&'static str) + Send + Sync + 'static,
) {
    let guard = Guard::new(limits);
    let on_event: OnEvent = Arc::new(on_event);
    loop {
        let (sock, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                // e.g. out of file descriptors: back off instead of spinning
                ACCEPT.hit(&format!("HTTP listener accept failed: {e}"));
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let admitted = match guard.admit(peer.ip()) {
            Ok(a) => a,
            Err(why) => {
                let kind = match why {
                    Refused::Listener => "http_connections",
                    Refused::Peer => "http_per_peer",
                };
                on_event(kind);
                CONN_LIMIT.hit(&format!("HTTP listener at its cap ({kind}); connection closed"));
                drop(sock);
                continue;
            }
        };
        if let Err(e) = sock.set_nodelay(true) {
            debug!(error = %e, "TCP_NODELAY not set");
        }
        let conn =
            Connection { peer, admitted: Arc::new(admitted), router: router.clone(), on_event: on_event.clone() };
        tokio::spawn(conn.run(sock, tls.clone()));
    }
}

type OnEvent = Arc<dyn Fn(&'static str) + Send + Sync>;

/// One admitted connection and what its requests need.
#[derive(Clone)]
struct Connection {
    peer: SocketAddr,
    admitted: Arc<Admitted>,
    router: axum::Router,
    on_event: OnEvent,
}

impl Connection {
    async fn run(self, sock: tokio::net::TcpStream, tls: Option<tokio_rustls::TlsAcceptor>) {
        let limits = self.admitted.guard.limits;
        let on_event = self.on_event.clone();
        let http = hyper::server::conn::http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(limits.header_timeout)
            .to_owned();
        let me = self;
        let svc = hyper::service::service_fn(move |req| me.clone().call(req));
        let served = match tls {
            None => http.serve_connection(TokioIo::new(Stalled::new(sock, limits.body_timeout)), svc).await,
            Some(acceptor) => {
                let stream = match tokio::time::timeout(limits.header_timeout, acceptor.accept(sock)).await {
                    Ok(Ok(s)) => s,
                    Ok(Err(e)) => return debug!(error = %e, "TLS handshake failed"),
                    Err(_) => return debug!("TLS handshake timed out"),
                };
                http.serve_connection(TokioIo::new(Stalled::new(stream, limits.body_timeout)), svc).await
            }
        };
        if let Err(e) = served {
            if std::error::Error::source(&e)
                .and_then(|s| s.downcast_ref::<std::io::Error>())
                .is_some_and(|io| io.kind() == STALL)
            {
                on_event("http_write_stall");
            }
            debug!(error = %e, "HTTP connection ended");
        }
    }

    async fn call(self, req: axum::http::Request<Incoming>) -> Result<Response, Infallible> {
        let (limits, guard) = (self.admitted.guard.limits, &self.admitted.guard);
        let probe =
            req.method() == axum::http::Method::GET && matches!(req.uri().path(), "/health" | "/ready" | "/metrics");
        let normal = guard.promote(&self.admitted.conn);
        if !probe && !normal {
            (self.on_event)("http_reserve_call");
            return Ok(reserve_refusal(guard.retry_hint(), limits.max_connections));
        }
        let bodiless = hyper::body::Body::is_end_stream(req.body());
        self.admitted.due_in(if bodiless { limits.request_timeout } else { limits.body_timeout });
        let late = Arc::new(AtomicBool::new(false));
        let timed = |b| TimedBody {
            inner: b,
            deadline: Box::pin(tokio::time::sleep(limits.body_timeout)),
            late: late.clone(),
            conn: Some(self.admitted.clone()),
        };
        let mut req = req.map(|b| axum::body::Body::new(timed(b)));
        req.extensions_mut().insert(axum::extract::ConnectInfo(self.peer));
        let deadline = CallDeadline::of(limits.request_timeout);
        req.extensions_mut().insert(deadline);
        let mut router = self.router.clone();
        let out = tokio::time::timeout(limits.request_timeout, tower::Service::call(&mut router, req)).await;
        self.admitted.due_in(limits.header_timeout);
        Ok(match out {
            Err(_) => {
                (self.on_event)("http_request_timeout");
                request_timeout(limits.request_timeout)
            }
            Ok(_) if late.load(Ordering::SeqCst) => {
                (self.on_event)("http_body_timeout");
                body_timeout(limits.body_timeout)
            }
            // the core stopped the call at its deadline: answered as the
            // listener answers a call past its limit (the flag to raise)
            Ok(Ok(r)) if r.status() == StatusCode::GATEWAY_TIMEOUT && Instant::now() >= deadline.0 => {
                (self.on_event)("http_request_timeout");
                request_timeout(limits.request_timeout)
            }
            // a probe on a reserve connection: the slot frees with the reply
            Ok(Ok(mut r)) if !normal => {
                r.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
                r
            }
            Ok(Ok(r)) => r,
            Ok(Err(never)) => match never {},
        })
    }
}

/// When the core is to give up on a call the listener cuts at `limit`
/// (`--http-request-timeout-ms`), in the request's extensions; the HTTP
/// surfaces make it their [`crate::app::Call`]'s deadline
/// ([`super::Caller`]). It falls a tenth of the limit (at most 1 s) before
/// the listener's own timeout: a call the listener cut would be dropped
/// where it stood, leaving no audit record, whereas the core stopped at its
/// deadline answers DEADLINE_EXCEEDED through the surface and records the
/// call first; the margin is its time to do so. The listener's timeout
/// stays as the backstop for work that is not the core's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallDeadline(pub Instant);

impl CallDeadline {
    /// The deadline of a call starting now under `limit`.
    pub fn of(limit: Duration) -> CallDeadline {
        CallDeadline(Instant::now() + limit - (limit / 10).min(Duration::from_secs(1)))
    }
}

/// The `io::ErrorKind` a stalled write ends its connection with.
const STALL: std::io::ErrorKind = std::io::ErrorKind::TimedOut;

/// An error in the REST shape (`{"error": {"message", "type", "param",
/// "code"}}`), which A2A and MCP clients read as an HTTP error too.
fn refusal(status: StatusCode, kind: &str, code: &str, message: String) -> Response {
    let body = serde_json::json!({"error": {"message": message, "type": kind, "param": null, "code": code}});
    (status, [(header::CONTENT_TYPE, "application/json")], body.to_string()).into_response()
}

fn reserve_refusal(hint: Duration, max: usize) -> Response {
    let ms = ms(hint).max(1);
    let message = format!(
        "the server holds its HTTP connection limit ({max} connections, --http-max-connections); this connection is kept for /health, /ready and /metrics; retry after {ms} ms"
    );
    let mut r = refusal(StatusCode::SERVICE_UNAVAILABLE, "service_unavailable", "UNAVAILABLE", message);
    let h = r.headers_mut();
    h.insert(header::RETRY_AFTER, HeaderValue::from(ms.div_ceil(1000)));
    h.insert("retry-after-ms", HeaderValue::from(ms));
    r
}

fn body_timeout(limit: Duration) -> Response {
    let message = format!(
        "body: not received within {} ms of the request head (--http-body-timeout-ms); send it faster, or in smaller requests",
        ms(limit)
    );
    let mut r = refusal(StatusCode::REQUEST_TIMEOUT, "timeout_error", "DEADLINE_EXCEEDED", message);
    r.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
    r
}

fn request_timeout(limit: Duration) -> Response {
    let message = format!(
        "the call ran past the server's limit of {} ms (--http-request-timeout-ms) and was cancelled; send a smaller context, or ask the operator for a longer limit",
        ms(limit)
    );
    refusal(StatusCode::GATEWAY_TIMEOUT, "timeout_error", "DEADLINE_EXCEEDED", message)
}

/// A request body that fails once its deadline has passed (and sets `late`,
/// so the call is answered 408 whatever the handler made of the failed
/// read); once it has all arrived, its connection is due to free its slot
/// by the end of the call's time limit.
struct TimedBody {
    inner: Incoming,
    deadline: Pin<Box<Sleep>>,
    late: Arc<AtomicBool>,
    conn: Option<Arc<Admitted>>,
}

/// Bytes a second a body or a reply may be slower than and still not run
/// out of time: each byte that arrives (or is read) buys `1 / MIN_RATE` s
/// on top of [`HttpLimits::body_timeout`].
const MIN_RATE: usize = 64 << 10;

/// The error a late body ends with.
#[derive(Debug, thiserror::Error)]
#[error("request body not received in time")]
struct BodyTimedOut;

impl hyper::body::Body for TimedBody {
    type Data = bytes::Bytes;
    type Error = axum::BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        if let Poll::Ready(frame) = Pin::new(&mut self.inner).poll_frame(cx) {
            if let Some(Ok(data)) = frame.as_ref().map(|f| f.as_ref().map(|f| f.data_ref().map_or(0, |d| d.len()))) {
                // a body that keeps coming at MIN_RATE or faster never runs out of time
                let at = self.deadline.deadline() + Duration::from_secs_f64(data as f64 / MIN_RATE as f64);
                self.deadline.as_mut().reset(at);
            }
            if frame.is_none() || self.inner.is_end_stream() {
                if let Some(conn) = self.conn.take() {
                    conn.due_in(conn.guard.limits.request_timeout);
                }
            }
            return Poll::Ready(frame.map(|f| f.map_err(Into::into)));
        }
        if self.deadline.as_mut().poll(cx).is_ready() {
            self.late.store(true, Ordering::SeqCst);
            return Poll::Ready(Some(Err(BodyTimedOut.into())));
        }
        Poll::Pending
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}

/// A socket whose writes fail once a reply has waited on its client for
/// `limit`, plus `1 / MIN_RATE` s for each byte the client did read: a
/// client that reads nothing, or a trickle, cannot hold its slot for the
/// length of a large reply. The clock starts when a write first has to
/// wait, and stops when the reply is flushed.
struct Stalled<T> {
    io: T,
    limit: Duration,
    stalled: Option<Pin<Box<Sleep>>>,
}

impl<T> Stalled<T> {
    fn new(io: T, limit: Duration) -> Self {
        Self { io, limit, stalled: None }
    }

    /// `Pending` from a write: starts or checks the stall clock.
    fn pending<R>(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<R>> {
        let limit = self.limit;
        let clock = self.stalled.get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
        if clock.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Err(std::io::Error::new(STALL, "the client read none of the reply in time")));
        }
        Poll::Pending
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Stalled<T> {
    /// The client speaks again (its next request): the reply before it is
    /// done, and its clock stops.
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        let me = self.get_mut();
        let before = buf.filled().len();
        let r = Pin::new(&mut me.io).poll_read(cx, buf);
        if matches!(r, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            me.stalled = None;
        }
        r
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Stalled<T> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        let me = self.get_mut();
        match Pin::new(&mut me.io).poll_write(cx, buf) {
            Poll::Pending => me.pending(cx),
            Poll::Ready(Ok(n)) => {
                if let Some(clock) = me.stalled.as_mut() {
                    let at = clock.deadline() + Duration::from_secs_f64(n as f64 / MIN_RATE as f64);
                    clock.as_mut().reset(at);
                }
                Poll::Ready(Ok(n))
            }
            failed => failed,
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let me = self.get_mut();
        match Pin::new(&mut me.io).poll_flush(cx) {
            Poll::Pending => me.pending(cx),
            done => done,
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(max: usize, per_peer: usize, reserve: usize) -> HttpLimits {
        HttpLimits { max_connections: max, max_per_peer: per_peer, reserve, ..HttpLimits::default() }
    }

    #[test]
    fn one_peer_is_capped_and_others_still_get_in() {
        let g = Guard::new(limits(8, 2, 0));
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let held: Vec<_> = (0..2).map(|_| g.admit(a).unwrap()).collect();
        assert_eq!(g.admit(a).err(), Some(Refused::Peer));
        assert!(g.admit("10.0.0.2".parse().unwrap()).is_ok());
        drop(held);
        assert!(g.admit(a).is_ok(), "slots freed on drop");
    }

    #[test]
    fn an_ipv6_slash_64_is_one_peer_and_mapped_ipv4_is_its_ipv4() {
        let g = Guard::new(limits(8, 1, 0));
        let _a = g.admit("2001:db8::1".parse().unwrap()).unwrap();
        assert_eq!(g.admit("2001:db8::ffff:2".parse().unwrap()).err(), Some(Refused::Peer));
        assert!(g.admit("2001:db8:0:1::1".parse().unwrap()).is_ok(), "another /64");
        let _b = g.admit("10.1.1.1".parse().unwrap()).unwrap();
        assert_eq!(g.admit("::ffff:10.1.1.1".parse().unwrap()).err(), Some(Refused::Peer));
    }

    #[test]
    fn past_the_cap_the_reserve_admits_and_promotes_when_a_slot_frees() {
        let g = Guard::new(limits(2, 8, 1));
        let p = |i: u8| IpAddr::from([10, 0, 0, i]);
        let first = g.admit(p(1)).unwrap();
        let _second = g.admit(p(2)).unwrap();
        let probe = g.admit(p(3)).unwrap();
        assert!(probe.conn.reserve.load(Ordering::SeqCst));
        assert_eq!(g.admit(p(4)).err(), Some(Refused::Listener), "reserve full too");
        assert!(!g.promote(&probe.conn), "no normal slot free");
        drop(first);
        assert!(g.promote(&probe.conn));
        assert!(!probe.conn.reserve.load(Ordering::SeqCst));
        assert!(g.admit(p(5)).is_ok(), "the reserve slot is free again");
    }

    #[tokio::test]
    async fn a_client_reading_fast_is_never_cut_however_long_the_reply() {
        use tokio::io::AsyncWriteExt;
        let (near, mut far) = tokio::io::duplex(64 << 10);
        let mut io = Stalled::new(near, Duration::from_millis(100));
        // 64 KiB every 10 ms (6.4 MB/s), for 400 ms in all: four times the limit
        let reader = tokio::spawn(async move {
            let mut buf = vec![0u8; 64 << 10];
            for _ in 0..40 {
                tokio::time::sleep(Duration::from_millis(10)).await;
                tokio::io::AsyncReadExt::read_exact(&mut far, &mut buf).await.unwrap();
            }
        });
        for _ in 0..40 {
            io.write_all(&[7u8; 64 << 10]).await.expect("a client reading at 6 MB/s is not stalled");
        }
        reader.await.unwrap();
    }

    #[tokio::test]
    async fn a_reply_the_client_does_not_read_ends_the_connection() {
        use tokio::io::AsyncWriteExt;
        let (near, _far) = tokio::io::duplex(64);
        let mut io = Stalled::new(near, Duration::from_millis(100));
        let started = std::time::Instant::now();
        let err = io.write_all(&[7u8; 256]).await.expect_err("stalled");
        assert_eq!(err.kind(), STALL);
        let took = started.elapsed();
        assert!(took >= Duration::from_millis(100) && took < Duration::from_secs(2), "{took:?}");
    }

    #[tokio::test]
    async fn a_client_that_reads_a_trickle_is_cut_too() {
        use tokio::io::AsyncWriteExt;
        let (near, mut far) = tokio::io::duplex(1024);
        let mut io = Stalled::new(near, Duration::from_millis(200));
        // 64 bytes every 10 ms: 6.4 KB/s, a tenth of MIN_RATE
        tokio::spawn(async move {
            let mut buf = [0u8; 64];
            loop {
                tokio::time::sleep(Duration::from_millis(10)).await;
                if tokio::io::AsyncReadExt::read(&mut far, &mut buf).await.unwrap_or(0) == 0 {
                    break;
                }
            }
        });
        let started = std::time::Instant::now();
        let err = io.write_all(&vec![7u8; 1 << 20]).await.expect_err("a trickle does not hold the slot");
        assert_eq!(err.kind(), STALL);
        assert!(started.elapsed() < Duration::from_secs(2), "{:?}", started.elapsed());
    }

    #[test]
    fn one_client_cannot_hold_the_whole_probe_reserve() {
        let g = Guard::new(limits(1, 64, 8));
        let _normal = g.admit(IpAddr::from([10, 0, 0, 1])).unwrap();
        let a = IpAddr::from([10, 0, 0, 2]);
        let _probes: Vec<_> = (0..2).map(|_| g.admit(a).unwrap()).collect();
        assert_eq!(g.admit(a).err(), Some(Refused::Peer), "a quarter of the reserve each");
        assert!(g.admit(IpAddr::from([10, 0, 0, 3])).is_ok(), "the load balancer still gets in");
    }

    #[test]
    fn the_retry_hint_is_the_soonest_due_slot() {
        let mut l = limits(2, 8, 0);
        l.header_timeout = Duration::from_secs(50);
        let g = Guard::new(l);
        let a = g.admit(IpAddr::from([10, 0, 0, 1])).unwrap();
        let b = g.admit(IpAddr::from([10, 0, 0, 2])).unwrap();
        let hint = g.retry_hint();
        assert!(hint > Duration::from_secs(45) && hint <= Duration::from_secs(50), "{hint:?}");
        a.due_in(Duration::from_secs(3));
        let hint = g.retry_hint();
        assert!(hint > Duration::from_secs(1) && hint <= Duration::from_secs(3), "{hint:?}");
        // a deadline already past (a streamed reply still going) says nothing
        a.due_in(Duration::ZERO);
        b.due_in(Duration::ZERO);
        std::thread::sleep(Duration::from_millis(5));
        assert_eq!(g.retry_hint(), Duration::from_secs(50), "the header timeout when none is ahead");
    }
}
