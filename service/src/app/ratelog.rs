//! Rate-limited WARN lines for rejections: under overload a server refuses
//! thousands of requests a second, and one log line each buries everything
//! else. Each kind logs at most one line per [`INTERVAL`], saying how many
//! were refused since the last line; `scd_rejected_total` keeps the exact
//! count.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use tracing::warn;

/// Shortest time between two lines of one kind.
pub const INTERVAL: Duration = Duration::from_secs(10);

/// One kind of rejection.
pub struct RateLimitedWarn {
    kind: &'static str,
    /// (last line written, refused since then).
    state: Mutex<(Option<Instant>, u64)>,
}

impl RateLimitedWarn {
    /// A logger for `kind` (e.g. `embed_queue_full`).
    pub const fn new(kind: &'static str) -> Self {
        Self { kind, state: Mutex::new((None, 0)) }
    }

    /// Counts one rejection, logging when the last line is older than [`INTERVAL`].
    pub fn hit(&self, detail: &str) {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        s.1 += 1;
        let now = Instant::now();
        if s.0.is_none_or(|last| now.duration_since(last) >= INTERVAL) {
            warn!(kind = self.kind, rejected = s.1, "{detail}: {} rejected since the last report", s.1);
            *s = (Some(now), 0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_between_lines() {
        let w = RateLimitedWarn::new("t");
        for _ in 0..1000 {
            w.hit("x");
        }
        let s = w.state.lock().unwrap();
        assert!(s.0.is_some());
        assert_eq!(s.1, 999, "the first hit logged, the rest wait for the next line");
    }
}
