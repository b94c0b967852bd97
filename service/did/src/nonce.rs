//! Replay protection: which (sender, nonce) pairs were already seen.
//!
//! ```
//! use scd_did::nonce::{MemoryNonceLog, NonceLog};
//!
//! let log = MemoryNonceLog::default();
//! assert!(log.first_seen("did:key:z6Mk…", 7, 1_800_000_000).unwrap());
//! assert!(!log.first_seen("did:key:z6Mk…", 7, 1_800_000_000).unwrap());
//! ```

use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;

use crate::error::Result;
use crate::time::MAX_CLOCK_SKEW_S;

/// A random non-zero u64.
pub fn fresh_nonce() -> u64 {
    loop {
        let n: u64 = rand::random();
        if n != 0 {
            return n;
        }
    }
}

/// Remembers which (sender, nonce) pairs were seen.
pub trait NonceLog: Send + Sync {
    /// Records (did, nonce) sent at `ts_s`; `true` if it was not seen before.
    /// Entries older than 2 × [`MAX_CLOCK_SKEW_S`] before a recorded
    /// timestamp may be forgotten: a replay that old is refused as stale.
    fn first_seen(&self, did: &str, nonce: u64, ts_s: i64) -> Result<bool>;
}

/// An in-memory [`NonceLog`] of bounded size.
///
/// Entries older than 2 × skew before the newest recorded timestamp are
/// pruned. If more than `capacity` entries are younger than that (a flood),
/// the oldest is evicted and everything at or before its timestamp is
/// refused from then on: the log stays bounded and never lets a replay
/// through; the price is that a flood can refuse honest messages from the
/// same second.
#[derive(Debug)]
pub struct MemoryNonceLog {
    capacity: usize,
    inner: Mutex<MemoryNonces>,
}

#[derive(Debug, Default)]
struct MemoryNonces {
    seen: HashMap<(String, u64), i64>,
    by_time: BTreeSet<(i64, String, u64)>,
    /// Messages with a timestamp below this are refused.
    floor: i64,
}

impl Default for MemoryNonceLog {
    fn default() -> MemoryNonceLog {
        MemoryNonceLog::new(MemoryNonceLog::DEFAULT_CAPACITY)
    }
}

impl MemoryNonceLog {
    /// The default bound on remembered nonces.
    pub const DEFAULT_CAPACITY: usize = 100_000;

    /// A log remembering at most `capacity` (≥ 1) nonces.
    pub fn new(capacity: usize) -> MemoryNonceLog {
        MemoryNonceLog {
            capacity: capacity.max(1),
            inner: Mutex::new(MemoryNonces { floor: i64::MIN, ..Default::default() }),
        }
    }

    /// How many nonces are remembered now.
    pub fn len(&self) -> usize {
        self.inner.lock().unwrap_or_else(|e| e.into_inner()).seen.len()
    }

    /// Whether none is remembered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl NonceLog for MemoryNonceLog {
    fn first_seen(&self, did: &str, nonce: u64, ts_s: i64) -> Result<bool> {
        let mut log = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let cutoff = ts_s.saturating_sub(2 * MAX_CLOCK_SKEW_S);
        if cutoff > log.floor {
            log.floor = cutoff;
            while let Some(first) = log.by_time.first().cloned() {
                if first.0 >= cutoff {
                    break;
                }
                log.by_time.pop_first();
                log.seen.remove(&(first.1, first.2));
            }
        }
        if ts_s < log.floor {
            return Ok(false);
        }
        let key = (did.to_string(), nonce);
        if log.seen.contains_key(&key) {
            return Ok(false);
        }
        log.seen.insert(key, ts_s);
        log.by_time.insert((ts_s, did.to_string(), nonce));
        while log.seen.len() > self.capacity {
            let Some(oldest) = log.by_time.pop_first() else { break };
            log.seen.remove(&(oldest.1, oldest.2));
            log.floor = log.floor.max(oldest.0.saturating_add(1));
            tracing::warn!(capacity = self.capacity, floor = log.floor, "nonce log full: refusing older timestamps");
        }
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_nonce_log_prunes_and_stays_bounded() {
        let log = MemoryNonceLog::new(3);
        assert!(log.first_seen("a", 1, 1000).unwrap());
        assert!(!log.first_seen("a", 1, 1000).unwrap());
        assert!(log.first_seen("a", 2, 1001).unwrap());
        // 121 s later the first two are pruned (a replay that old is stale anyway)...
        assert!(log.first_seen("a", 3, 1122).unwrap());
        assert_eq!(log.len(), 1);
        // ...and anything older than 2×skew is refused outright.
        assert!(!log.first_seen("a", 1, 1000).unwrap());
        // A flood past capacity evicts the oldest and refuses its timestamp.
        assert!(log.first_seen("b", 1, 1123).unwrap());
        assert!(log.first_seen("b", 2, 1124).unwrap());
        assert!(log.first_seen("b", 3, 1125).unwrap());
        assert_eq!(log.len(), 3);
        assert!(!log.first_seen("a", 3, 1122).unwrap(), "evicted nonce must not be accepted again");
        assert!(!log.first_seen("c", 9, 1122).unwrap());
        assert!(log.first_seen("c", 9, 1126).unwrap());
    }
}
