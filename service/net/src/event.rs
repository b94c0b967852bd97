//! What the guard reports: each refusal or closing ([`Event`]) and its
//! running totals ([`ConnStats`]).

use std::sync::Arc;

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
