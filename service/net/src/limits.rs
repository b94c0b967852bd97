//! The guard's bounds ([`ConnLimits`]), checked before a listener starts.

use std::time::Duration;

use crate::error::{Error, Result};

/// A connection must have been idle this long before a new one may take
/// its place (a real client sends its first call within milliseconds).
pub const EVICT_MIN_IDLE: Duration = Duration::from_millis(200);

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
