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
//! [`TcpConnectInfo`](tonic::transport::server::TcpConnectInfo)), so `remote_addr()`, `peer_certs()` and everything
//! else that reads the connect info keep working unchanged.

pub mod rate;

mod admit;
mod call;
mod error;
mod event;
mod guard;
mod limits;
mod table;
#[cfg(test)]
mod tests;

pub use admit::{Admission, Admit, AdmitLayer, AdmitService};
pub use call::{CallGuard, CallLayer, CallService, Calls, HeldUntilEnd};
pub use error::{Error, Result};
pub use event::{ConnStats, Event, OnEvent};
pub use guard::{ConnGuard, GuardedStream};
pub use limits::{ConnLimits, EVICT_MIN_IDLE};
