//! The guard of one listener ([`ConnGuard`]) and the connections it
//! admits ([`GuardedStream`]), which close themselves when idle.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use crate::admit::AdmitLayer;
use crate::call::{CallLayer, Calls};
use crate::event::ConnStats;
use crate::event::Event;
use crate::event::OnEvent;
use crate::limits::ConnLimits;
use crate::table::Conn;
use crate::table::Shared;
use crate::table::Table;
use futures_util::Stream;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Sleep;
use tonic::transport::server::{Connected, TcpConnectInfo};
use tracing::{debug, warn};

/// The guard of one listener (cheap to clone; see the module docs).
#[derive(Clone)]
pub struct ConnGuard {
    pub(super) shared: Arc<Shared>,
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
        AdmitLayer::new(Calls { shared: self.shared.clone() })
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
