//! Listener guards for the gRPC servers (`scd serve`, `scd atp agent`).
//!
//! A gRPC listener without them keeps every accepted socket for as long as
//! its peer likes: a client that opens sockets and never speaks, or opens
//! HTTP/2 connections and makes no call, holds file descriptors until the
//! process runs out and nobody else is served. The guard bounds that:
//!
//! - **Caps.** At most [`ConnLimits::max_connections`] connections on the
//!   listener and [`ConnLimits::max_per_peer`] from one IPv4 address or
//!   IPv6 /64. Past a
//!   cap the socket is accepted and closed at once (so its descriptor is
//!   freed and the kernel backlog does not fill), and counted.
//! - **Idle connections give way.** When the listener and its reserve are
//!   full, a new connection takes the place of an idle one: the oldest that
//!   never made a call, else the one idle longest, a normal one before a
//!   reserve one (at least
//!   [`EVICT_MIN_IDLE`] idle, with no call in flight). Sockets that only sit
//!   there churn among themselves while a real client is served at once; a
//!   connection with a call in flight is never taken.
//! - **A reserve for health checks.** Past `max_connections`, up to
//!   [`ConnLimits::reserve`] more connections are admitted that may carry
//!   only `grpc.health.v1.Health/Check` (not `Watch`, a stream that would
//!   hold the slot): a load balancer's probe still reads the
//!   server's status when clients hold every normal slot. Any other call on
//!   a reserve connection is RESOURCE_EXHAUSTED with a retry hint, until a
//!   normal slot frees: the connection's next call moves it there.
//! - **Idle and never-speaking connections closed.** A connection with no
//!   call in flight for [`ConnLimits::idle_timeout`] is closed; one that has
//!   made no call yet gets [`ConnLimits::first_call_timeout`]. Bytes alone
//!   (HTTP/2 pings, a TLS handshake that never ends) do not keep it open; a
//!   call in flight (a long compress, a health `Watch` stream) does.
//!
//! ```no_run
//! # async fn run(listener: tokio::net::TcpListener) {
//! use scd_net::{ConnGuard, ConnLimits};
//! let guard = ConnGuard::new(ConnLimits::default());
//! let incoming = guard.incoming(listener);
//! // tonic::transport::Server::builder()
//! //     .layer(guard.layer())
//! //     .add_service(...)
//! //     .serve_with_incoming(incoming)
//! # let _ = incoming;
//! # }
//! ```
//!
//! The per-connection state is found from a call by the connection's remote
//! address (tonic puts it in the request's extensions as
//! [`TcpConnectInfo`]), so `remote_addr()`, `peer_certs()` and everything
//! else that reads the connect info keep working unchanged.

pub mod rate;

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use futures_util::Stream;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Sleep;
use tonic::transport::server::{Connected, TcpConnectInfo, TlsConnectInfo};
use tracing::{debug, warn};

/// A connection must have been idle this long before a new one may take
/// its place (a real client sends its first call within milliseconds).
pub const EVICT_MIN_IDLE: Duration = Duration::from_millis(200);

/// Errors of the guard's settings.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A setting out of its range.
    #[error("{field}: {reason}")]
    Invalid {
        /// The flag or field.
        field: &'static str,
        /// What is wrong and what is allowed.
        reason: String,
    },
}

/// `Result` with this crate's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

/// The guard's bounds (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnLimits {
    /// Connections on the listener, all peers together (the reserve aside).
    pub max_connections: usize,
    /// Connections from one IP address (reserve ones included).
    pub max_per_peer: usize,
    /// Connections past `max_connections` admitted for health checks only.
    pub reserve: usize,
    /// A connection with no call in flight for this long is closed.
    pub idle_timeout: Duration,
    /// A connection that has made no call yet is closed after this long.
    pub first_call_timeout: Duration,
    /// How long a connection must have been idle before a newcomer may take
    /// its place ([`EVICT_MIN_IDLE`]).
    pub evict_min_idle: Duration,
}

impl Default for ConnLimits {
    /// 512 connections, 64 per peer, 8 for health checks, closed after 120 s
    /// idle or 10 s without a first call.
    fn default() -> Self {
        Self {
            max_connections: 512,
            max_per_peer: 64,
            reserve: 8,
            idle_timeout: Duration::from_secs(120),
            first_call_timeout: Duration::from_secs(10),
            evict_min_idle: EVICT_MIN_IDLE,
        }
    }
}

impl ConnLimits {
    /// Checks the bounds; an error names the field.
    pub fn check(&self) -> Result<()> {
        if self.max_connections == 0 || self.max_connections > 1 << 20 {
            return Err(Error::Invalid {
                field: "max_connections",
                reason: format!("{}: must be 1 to {}", self.max_connections, 1 << 20),
            });
        }
        if self.max_per_peer == 0 || self.max_per_peer > self.max_connections + self.reserve {
            return Err(Error::Invalid {
                field: "max_per_peer",
                reason: format!(
                    "{}: must be 1 to max_connections + reserve ({})",
                    self.max_per_peer,
                    self.max_connections + self.reserve
                ),
            });
        }
        if self.reserve > 1024 {
            return Err(Error::Invalid { field: "reserve", reason: format!("{}: must be at most 1024", self.reserve) });
        }
        for (field, d) in [("idle_timeout", self.idle_timeout), ("first_call_timeout", self.first_call_timeout)] {
            if d.is_zero() || d > Duration::from_secs(86_400) {
                return Err(Error::Invalid { field, reason: format!("{} ms: must be 1 ms to 24 h", d.as_millis()) });
            }
        }
        Ok(())
    }

    /// Descriptors the listener may hold at most.
    pub fn max_descriptors(&self) -> usize {
        self.max_connections + self.reserve
    }
}

/// Why the guard closed or refused something (the `kind` of a rejection
/// metric).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Event {
    /// A connection past the listener's cap and its reserve.
    ListenerFull,
    /// A connection past the per-peer cap.
    PeerFull,
    /// A connection closed after `idle_timeout` without a call.
    Idle,
    /// A connection closed after `first_call_timeout` without its first call.
    NeverSpoke,
    /// A call other than a health check on a reserve connection.
    ReserveCall,
    /// An idle connection closed to make room for a new one.
    Evicted,
}

impl Event {
    /// Its name in metrics (`grpc_connections`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ListenerFull => "grpc_connections",
            Self::PeerFull => "grpc_connections_per_peer",
            Self::Idle => "grpc_idle_closed",
            Self::NeverSpoke => "grpc_silent_closed",
            Self::ReserveCall => "grpc_reserve_call",
            Self::Evicted => "grpc_idle_evicted",
        }
    }
}

/// What the guard has seen since it started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ConnStats {
    /// Connections open now.
    pub open: usize,
    /// Of which admitted into the reserve.
    pub reserve_open: usize,
    /// Connections admitted in all.
    pub accepted: u64,
    /// Closed at once: the listener was full.
    pub refused_listener: u64,
    /// Closed at once: their peer was at its cap.
    pub refused_peer: u64,
    /// Closed after `idle_timeout`.
    pub closed_idle: u64,
    /// Closed after `first_call_timeout` without a call.
    pub closed_silent: u64,
    /// Calls refused on reserve connections.
    pub reserve_calls_refused: u64,
    /// Idle connections closed to make room for new ones.
    pub evicted: u64,
}

/// A callback for each [`Event`] (the server counts them in its metrics).
pub type OnEvent = Arc<dyn Fn(Event) + Send + Sync>;

/// One admitted connection.
#[derive(Debug)]
struct Conn {
    /// Calls in flight (response bodies not yet ended).
    active: AtomicUsize,
    /// Milliseconds since the guard's epoch of the last call's start or end.
    last_change_ms: AtomicU64,
    /// A call was ever made.
    spoke: AtomicBool,
    /// In the health-check reserve (admitted there; moved to a normal slot
    /// when one is free at its next call).
    reserve: AtomicBool,
    /// Chosen to make room: its stream closes at its next poll.
    evicted: AtomicBool,
    /// Admission order (ties of idleness go to the older).
    seq: u64,
    /// Wakes the stream's reader (to see `evicted`).
    waker: Mutex<Option<std::task::Waker>>,
}

impl Conn {
    fn evict(&self) {
        self.evicted.store(true, Ordering::SeqCst);
        if let Some(w) = self.waker.lock().unwrap_or_else(|p| p.into_inner()).take() {
            w.wake();
        }
    }
}

#[derive(Default)]
struct Table {
    normal: usize,
    reserve: usize,
    per_peer: HashMap<IpAddr, usize>,
    by_addr: HashMap<SocketAddr, Arc<Conn>>,
}

struct Shared {
    limits: ConnLimits,
    epoch: Instant,
    table: Mutex<Table>,
    on_event: Option<OnEvent>,
    accepted: AtomicU64,
    refused_listener: AtomicU64,
    refused_peer: AtomicU64,
    closed_idle: AtomicU64,
    closed_silent: AtomicU64,
    reserve_calls_refused: AtomicU64,
    evicted: AtomicU64,
}

impl Shared {
    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn event(&self, e: Event) {
        let counter = match e {
            Event::ListenerFull => &self.refused_listener,
            Event::PeerFull => &self.refused_peer,
            Event::Idle => &self.closed_idle,
            Event::NeverSpoke => &self.closed_silent,
            Event::ReserveCall => &self.reserve_calls_refused,
            Event::Evicted => &self.evicted,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        if let Some(f) = &self.on_event {
            f(e);
        }
    }

    /// Admits a connection from `peer`, or says why not.
    fn admit(&self, peer: SocketAddr) -> std::result::Result<Arc<Conn>, Event> {
        let mut t = self.lock();
        let from_peer = t.per_peer.get(&peer_group(peer)).copied().unwrap_or(0);
        if from_peer >= self.limits.max_per_peer {
            return Err(Event::PeerFull);
        }
        let reserve = if t.normal < self.limits.max_connections {
            false
        } else if t.reserve < self.limits.reserve {
            true
        } else {
            // full: an idle connection gives way (its slot is counted free
            // now; its socket closes at its next poll)
            let victim = self.victim(&t).ok_or(Event::ListenerFull)?;
            let taken = t.by_addr.get(&victim).cloned().expect("victim is in the table");
            taken.evict();
            if taken.reserve.load(Ordering::SeqCst) {
                t.reserve -= 1;
            } else {
                t.normal -= 1;
            }
            drop(t);
            self.event(Event::Evicted);
            t = self.lock();
            taken.reserve.load(Ordering::SeqCst)
        };
        let conn = Arc::new(Conn {
            active: AtomicUsize::new(0),
            last_change_ms: AtomicU64::new(self.now_ms()),
            spoke: AtomicBool::new(false),
            reserve: AtomicBool::new(reserve),
            evicted: AtomicBool::new(false),
            seq: self.accepted.load(Ordering::Relaxed),
            waker: Mutex::new(None),
        });
        if reserve {
            t.reserve += 1;
        } else {
            t.normal += 1;
        }
        *t.per_peer.entry(peer_group(peer)).or_insert(0) += 1;
        t.by_addr.insert(peer, conn.clone());
        self.accepted.fetch_add(1, Ordering::Relaxed);
        Ok(conn)
    }

    /// The connection that gives way when the listener is full: no call in
    /// flight, idle at least `evict_min_idle`, never spoke before spoke,
    /// a normal one before a reserve one (the newcomer takes its kind of
    /// slot, so that it may make any call), then idle longest; not one
    /// already evicted.
    fn victim(&self, t: &Table) -> Option<SocketAddr> {
        let now = self.now_ms();
        let min = self.limits.evict_min_idle.as_millis() as u64;
        t.by_addr
            .iter()
            .filter(|(_, c)| !c.evicted.load(Ordering::SeqCst) && c.active.load(Ordering::SeqCst) == 0)
            .map(|(a, c)| {
                let idle = now.saturating_sub(c.last_change_ms.load(Ordering::SeqCst));
                let key =
                    (c.spoke.load(Ordering::SeqCst), c.reserve.load(Ordering::SeqCst), std::cmp::Reverse(idle), c.seq);
                (a, key, idle)
            })
            .filter(|&(_, _, idle)| idle >= min)
            .min_by_key(|&(_, key, _)| key)
            .map(|(a, _, _)| *a)
    }

    /// Moves a reserve connection to a normal slot if one is free; true
    /// when it now may make any call.
    fn promote(&self, conn: &Conn) -> bool {
        let mut t = self.lock();
        if !conn.reserve.load(Ordering::SeqCst) {
            return true;
        }
        if t.normal >= self.limits.max_connections {
            return false;
        }
        conn.reserve.store(false, Ordering::SeqCst);
        t.reserve -= 1;
        t.normal += 1;
        true
    }

    fn release(&self, peer: SocketAddr, conn: &Conn) {
        let mut t = self.lock();
        if conn.evicted.load(Ordering::SeqCst) {
            // its slot went to the connection that took its place
            Self::forget(&mut t, peer, conn);
            return;
        }
        if conn.reserve.load(Ordering::SeqCst) {
            t.reserve = t.reserve.saturating_sub(1);
        } else {
            t.normal = t.normal.saturating_sub(1);
        }
        Self::forget(&mut t, peer, conn);
    }

    /// Drops `conn` from the per-peer count and the address table.
    fn forget(t: &mut Table, peer: SocketAddr, conn: &Conn) {
        let group = peer_group(peer);
        if let Some(n) = t.per_peer.get_mut(&group) {
            *n -= 1;
            if *n == 0 {
                t.per_peer.remove(&group);
            }
        }
        // a new connection may reuse the address only after this one is gone
        if t.by_addr.get(&peer).is_some_and(|c| std::ptr::eq(Arc::as_ptr(c), conn)) {
            t.by_addr.remove(&peer);
        }
    }

    /// When `conn` is to be closed for idleness (`None`: a call is in
    /// flight), and which event that is.
    fn idle_deadline(&self, conn: &Conn) -> Option<(Instant, Event)> {
        if conn.active.load(Ordering::SeqCst) > 0 {
            return None;
        }
        let (after, why) = if conn.spoke.load(Ordering::SeqCst) {
            (self.limits.idle_timeout, Event::Idle)
        } else {
            (self.limits.first_call_timeout, Event::NeverSpoke)
        };
        let since = Duration::from_millis(conn.last_change_ms.load(Ordering::SeqCst));
        Some((self.epoch + since + after, why))
    }

    /// The soonest a normal slot frees for sure: the earliest idle deadline
    /// of a normal connection with no call in flight (or one idle timeout
    /// when every one is busy).
    fn retry_hint(&self) -> Duration {
        let t = self.lock();
        let now = Instant::now();
        t.by_addr
            .values()
            .filter(|c| !c.reserve.load(Ordering::SeqCst))
            .filter_map(|c| self.idle_deadline(c))
            .map(|(at, _)| at.saturating_duration_since(now))
            .min()
            .unwrap_or(self.limits.idle_timeout)
            .max(Duration::from_millis(1))
    }
}

/// The guard of one listener (cheap to clone; see the module docs).
#[derive(Clone)]
pub struct ConnGuard {
    shared: Arc<Shared>,
}

impl ConnGuard {
    /// A guard with `limits` (check them first with [`ConnLimits::check`]).
    pub fn new(limits: ConnLimits) -> Self {
        Self::with_events(limits, None)
    }

    /// A guard that also calls `on_event` for each rejection and closing.
    pub fn with_events(limits: ConnLimits, on_event: Option<OnEvent>) -> Self {
        Self {
            shared: Arc::new(Shared {
                limits,
                epoch: Instant::now(),
                table: Mutex::new(Table::default()),
                on_event,
                accepted: AtomicU64::new(0),
                refused_listener: AtomicU64::new(0),
                refused_peer: AtomicU64::new(0),
                closed_idle: AtomicU64::new(0),
                closed_silent: AtomicU64::new(0),
                reserve_calls_refused: AtomicU64::new(0),
                evicted: AtomicU64::new(0),
            }),
        }
    }

    /// The bounds.
    pub fn limits(&self) -> ConnLimits {
        self.shared.limits
    }

    /// Counts so far.
    pub fn stats(&self) -> ConnStats {
        let s = &self.shared;
        let t = s.lock();
        ConnStats {
            open: t.normal + t.reserve,
            reserve_open: t.reserve,
            accepted: s.accepted.load(Ordering::Relaxed),
            refused_listener: s.refused_listener.load(Ordering::Relaxed),
            refused_peer: s.refused_peer.load(Ordering::Relaxed),
            closed_idle: s.closed_idle.load(Ordering::Relaxed),
            closed_silent: s.closed_silent.load(Ordering::Relaxed),
            reserve_calls_refused: s.reserve_calls_refused.load(Ordering::Relaxed),
            evicted: s.evicted.load(Ordering::Relaxed),
        }
    }

    /// The listener's connections, admitted by the guard, for
    /// `serve_with_incoming`. Accept errors (out of descriptors) back off
    /// 50 ms instead of spinning; TCP_NODELAY is set (tonic sets it only on
    /// listeners it binds itself, and a reply of more than one segment would
    /// wait for the client's delayed ACK).
    pub fn incoming(&self, listener: TcpListener) -> impl Stream<Item = io::Result<GuardedStream>> + Send + 'static {
        let shared = self.shared.clone();
        futures_util::stream::unfold((listener, shared), |(listener, shared)| async move {
            loop {
                let (sock, peer) = match listener.accept().await {
                    Ok(accepted) => accepted,
                    Err(e) => {
                        warn!(error = %e, "gRPC listener accept failed; backing off 50 ms");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let conn = match shared.admit(peer) {
                    Ok(c) => c,
                    Err(why) => {
                        debug!(%peer, kind = why.as_str(), "connection refused at its cap");
                        shared.event(why);
                        drop(sock);
                        continue;
                    }
                };
                if let Err(e) = sock.set_nodelay(true) {
                    debug!(error = %e, "TCP_NODELAY not set");
                }
                let timer = Box::pin(tokio::time::sleep(shared.limits.first_call_timeout));
                let stream = GuardedStream { io: sock, peer, conn, shared: shared.clone(), timer };
                return Some((Ok(stream), (listener, shared)));
            }
        })
    }

    /// The tower layer that tracks calls per connection and holds reserve
    /// connections to health checks; put it outermost.
    pub fn layer(&self) -> CallLayer {
        CallLayer { shared: self.shared.clone() }
    }
}

/// An admitted connection: a `TcpStream` that closes itself when idle (see
/// the module docs) and frees its slot when dropped.
pub struct GuardedStream {
    io: TcpStream,
    peer: SocketAddr,
    conn: Arc<Conn>,
    shared: Arc<Shared>,
    timer: Pin<Box<Sleep>>,
}

impl Drop for GuardedStream {
    fn drop(&mut self) {
        self.shared.release(self.peer, &self.conn);
    }
}

impl GuardedStream {
    /// `Ready(Err)` once the connection has been idle past its deadline;
    /// otherwise arms the timer for the next check.
    fn poll_idle(&mut self, cx: &mut Context<'_>) -> Poll<io::Error> {
        loop {
            if self.timer.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            let now = Instant::now();
            match self.shared.idle_deadline(&self.conn) {
                None => {
                    let next = now + self.shared.limits.idle_timeout;
                    self.timer.as_mut().reset(next.into());
                }
                Some((at, _)) if at > now => self.timer.as_mut().reset(at.into()),
                Some((_, why)) => {
                    debug!(peer = %self.peer, kind = why.as_str(), "closing an idle gRPC connection");
                    self.shared.event(why);
                    return Poll::Ready(io::Error::new(io::ErrorKind::TimedOut, why.as_str()));
                }
            }
        }
    }
}

impl AsyncRead for GuardedStream {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let me = self.get_mut();
        if me.conn.evicted.load(Ordering::SeqCst) {
            return Poll::Ready(Err(io::Error::new(io::ErrorKind::ConnectionAborted, Event::Evicted.as_str())));
        }
        if let Poll::Ready(r) = Pin::new(&mut me.io).poll_read(cx, buf) {
            return Poll::Ready(r);
        }
        {
            let mut w = me.conn.waker.lock().unwrap_or_else(|p| p.into_inner());
            if !w.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                *w = Some(cx.waker().clone());
            }
        }
        if me.conn.evicted.load(Ordering::SeqCst) {
            return Poll::Ready(Err(io::Error::new(io::ErrorKind::ConnectionAborted, Event::Evicted.as_str())));
        }
        me.poll_idle(cx).map(Err)
    }
}

impl AsyncWrite for GuardedStream {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

impl Connected for GuardedStream {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> TcpConnectInfo {
        self.io.connect_info()
    }
}

// ---------------------------------------------------------------------------
// The call layer
// ---------------------------------------------------------------------------

/// See [`ConnGuard::layer`].
#[derive(Clone)]
pub struct CallLayer {
    shared: Arc<Shared>,
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
fn is_health(path: &str) -> bool {
    path == "/grpc.health.v1.Health/Check"
}

/// Whom the per-peer cap counts a connection against: its IPv4 address, or
/// the /64 of its IPv6 one (one host or site holds a whole /64, so counting
/// each address would give it billions of caps).
fn peer_group(peer: SocketAddr) -> IpAddr {
    match peer.ip().to_canonical() {
        IpAddr::V6(v6) => IpAddr::V6(std::net::Ipv6Addr::from(u128::from(v6) & !((1u128 << 64) - 1))),
        v4 => v4,
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    fn limits(max: usize, per_peer: usize, reserve: usize) -> ConnLimits {
        ConnLimits {
            max_connections: max,
            max_per_peer: per_peer,
            reserve,
            idle_timeout: Duration::from_millis(400),
            first_call_timeout: Duration::from_millis(200),
            evict_min_idle: EVICT_MIN_IDLE,
        }
    }

    /// Serves `guard.incoming(listener)` by reading each stream to its end
    /// (or error), as a connection driver would.
    async fn drive(guard: &ConnGuard) -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mut incoming = Box::pin(guard.incoming(listener));
        tokio::spawn(async move {
            while let Some(Ok(mut s)) = futures_util::StreamExt::next(&mut incoming).await {
                tokio::spawn(async move {
                    let mut buf = [0u8; 64];
                    while let Ok(n) = s.read(&mut buf).await {
                        if n == 0 {
                            break;
                        }
                    }
                });
            }
        });
        addr
    }

    /// The peer's view: `true` once the server has closed the socket.
    async fn closed_within(s: &mut TcpStream, wait: Duration) -> bool {
        let mut buf = [0u8; 8];
        matches!(tokio::time::timeout(wait, s.read(&mut buf)).await, Ok(Ok(0) | Err(_)))
    }

    #[tokio::test]
    async fn caps_close_connections_past_them_and_idle_ones_give_way() {
        let long = Duration::from_secs(30);
        let guard = ConnGuard::new(ConnLimits { idle_timeout: long, first_call_timeout: long, ..limits(3, 2, 1) });
        let addr = drive(&guard).await;
        let from = |ip: &str| {
            let s = tokio::net::TcpSocket::new_v4().unwrap();
            s.bind(format!("{ip}:0").parse().unwrap()).unwrap();
            s.connect(addr)
        };
        let mut a = TcpStream::connect(addr).await.unwrap();
        let b = TcpStream::connect(addr).await.unwrap();
        // a third from the same address is past the per-peer cap
        let mut c = TcpStream::connect(addr).await.unwrap();
        assert!(closed_within(&mut c, Duration::from_secs(2)).await, "the third from one peer must be closed");
        // other loopback addresses fill the listener: 3 normal + 1 reserve
        let mut d = from("127.0.0.2").await.unwrap();
        let mut e = from("127.0.0.3").await.unwrap();
        tokio::time::sleep(EVICT_MIN_IDLE + Duration::from_millis(50)).await;
        let s = guard.stats();
        assert_eq!((s.open, s.reserve_open, s.refused_peer, s.evicted), (4, 1, 1, 0));
        // full: the newcomer takes the place of the oldest silent one (a)
        let mut f = from("127.0.0.4").await.unwrap();
        assert!(closed_within(&mut a, Duration::from_secs(2)).await, "the oldest idle connection gives way");
        assert!(!closed_within(&mut f, Duration::from_millis(100)).await, "the newcomer is kept");
        for s in [&mut d, &mut e] {
            assert!(!closed_within(s, Duration::from_millis(20)).await);
        }
        let s = guard.stats();
        assert_eq!((s.open, s.evicted, s.refused_listener), (4, 1, 0));
        // a closed connection frees its slot for its peer
        drop(b);
        tokio::time::sleep(Duration::from_millis(100)).await;
        let mut g = TcpStream::connect(addr).await.unwrap();
        assert!(!closed_within(&mut g, Duration::from_millis(100)).await);
        let s = guard.stats();
        assert_eq!((s.open, s.refused_peer, s.evicted), (4, 1, 1));
    }

    use tokio::io::AsyncWriteExt;

    #[tokio::test]
    async fn silent_connections_are_closed_and_bytes_alone_do_not_keep_them() {
        let guard = ConnGuard::new(limits(8, 8, 0));
        let addr = drive(&guard).await;
        let mut silent = TcpStream::connect(addr).await.unwrap();
        let mut chatty = TcpStream::connect(addr).await.unwrap();
        let start = Instant::now();
        // bytes every 50 ms, but never a call
        let writer = tokio::spawn(async move {
            for _ in 0..20 {
                if chatty.write_all(b"x").await.is_err() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            chatty
        });
        assert!(closed_within(&mut silent, Duration::from_secs(2)).await);
        assert!(start.elapsed() >= Duration::from_millis(190), "closed before first_call_timeout");
        let mut chatty = writer.await.unwrap();
        assert!(closed_within(&mut chatty, Duration::from_millis(100)).await, "bytes without a call keep nothing open");
        tokio::time::sleep(Duration::from_millis(50)).await;
        let s = guard.stats();
        assert_eq!((s.closed_silent, s.open), (2, 0));
    }

    #[test]
    fn the_per_peer_cap_counts_an_ipv6_64_as_one_peer() {
        let guard = ConnGuard::new(limits(16, 2, 0));
        let at = |a: &str| a.parse::<SocketAddr>().unwrap();
        let _a = guard.shared.admit(at("[2001:db8::1]:1000")).unwrap();
        let _b = guard.shared.admit(at("[2001:db8::ffff:2]:1000")).unwrap();
        assert_eq!(guard.shared.admit(at("[2001:db8::3:4:5:6]:7")).unwrap_err(), Event::PeerFull, "same /64");
        let _c = guard.shared.admit(at("[2001:db8:0:1::1]:1000")).expect("another /64 is another peer");
        // an IPv4-mapped address is its IPv4 address
        let _d = guard.shared.admit(at("10.0.0.1:1")).unwrap();
        let _e = guard.shared.admit(at("[::ffff:10.0.0.1]:2")).unwrap();
        assert_eq!(guard.shared.admit(at("10.0.0.1:3")).unwrap_err(), Event::PeerFull);
        assert_eq!(peer_group(at("[2001:db8::1]:1")), "2001:db8::".parse::<IpAddr>().unwrap());
    }

    #[tokio::test]
    async fn a_normal_idle_connection_gives_way_before_a_reserve_one() {
        let guard = ConnGuard::new(limits(1, 8, 1));
        let at = |a: &str| a.parse::<SocketAddr>().unwrap();
        let normal = guard.shared.admit(at("10.0.0.1:1")).unwrap();
        let reserve = guard.shared.admit(at("10.0.0.2:1")).unwrap();
        assert!(!normal.reserve.load(Ordering::SeqCst) && reserve.reserve.load(Ordering::SeqCst));
        tokio::time::sleep(EVICT_MIN_IDLE + Duration::from_millis(50)).await;
        // the reserve one has been idle longer, yet the normal one gives way
        normal.last_change_ms.store(guard.shared.now_ms() - EVICT_MIN_IDLE.as_millis() as u64, Ordering::SeqCst);
        reserve.last_change_ms.store(0, Ordering::SeqCst);
        let newcomer = guard.shared.admit(at("10.0.0.3:1")).unwrap();
        assert!(normal.evicted.load(Ordering::SeqCst) && !reserve.evicted.load(Ordering::SeqCst));
        assert!(!newcomer.reserve.load(Ordering::SeqCst), "the newcomer may make any call");
    }

    #[test]
    fn a_reserve_connection_may_check_health_but_not_watch_it() {
        assert!(is_health("/grpc.health.v1.Health/Check"));
        assert!(!is_health("/grpc.health.v1.Health/Watch"));
        assert!(!is_health("/scd.v1.Scd/Compress"));
    }

    #[test]
    fn settings_out_of_range_are_refused_naming_the_field() {
        let ok = ConnLimits::default();
        ok.check().unwrap();
        let e = ConnLimits { max_per_peer: 0, ..ok }.check().unwrap_err();
        assert!(e.to_string().starts_with("max_per_peer: 0: must be 1 to"), "{e}");
        let e = ConnLimits { idle_timeout: Duration::ZERO, ..ok }.check().unwrap_err();
        assert!(e.to_string().starts_with("idle_timeout: 0 ms"), "{e}");
        let e = ConnLimits { max_connections: 0, ..ok }.check().unwrap_err();
        assert!(e.to_string().starts_with("max_connections: 0"), "{e}");
    }
}
