//! Token buckets per key (a DID), bounded in number: the per-DID rate
//! limits of `scd serve --auth did-wba` and of `scd atp agent` (paper
//! §11.2), checked only after a caller proved its identity, so that
//! unauthenticated traffic cannot drain someone else's bucket.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// One DID's token bucket.
#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

/// Token buckets per DID, at most [`DidRateLimiter::MAX_DIDS`] of them:
/// past that, buckets that are full again (idle) are dropped, then the
/// least recently used one.
#[derive(Debug)]
pub struct DidRateLimiter {
    rate_per_s: f64,
    burst: f64,
    buckets: Mutex<HashMap<String, Bucket>>,
}

impl DidRateLimiter {
    /// The most buckets kept. Only authenticated (allowlisted) DIDs get one.
    pub const MAX_DIDS: usize = 10_000;

    /// The smallest `--auth-rate` accepted, requests per second (one
    /// request every ~17 minutes).
    pub const MIN_RATE_PER_S: f64 = 0.001;

    /// `rate_per_s` (> 0) requests per second, `burst` (≥ 1) at once.
    pub fn new(rate_per_s: f64, burst: u32) -> DidRateLimiter {
        DidRateLimiter { rate_per_s, burst: f64::from(burst.max(1)), buckets: Mutex::new(HashMap::new()) }
    }

    /// Whether `did`'s bucket holds a request at `now` (taking none), or
    /// how long until it does: a caller checks this first, then takes the
    /// request with [`DidRateLimiter::check_at`] once the message proved
    /// fresh, so that replayed copies of another's message drain nothing.
    pub fn peek_at(&self, did: &str, now: Instant) -> Result<(), Duration> {
        let buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        let Some(b) = buckets.get(did) else { return Ok(()) };
        let tokens = self.refilled(b, now);
        if tokens >= 1.0 {
            Ok(())
        } else {
            Err(self.wait(tokens))
        }
    }

    /// The tokens `b` holds at `now`: refilled at the rate, capped at the burst.
    fn refilled(&self, b: &Bucket, now: Instant) -> f64 {
        (b.tokens + now.saturating_duration_since(b.at).as_secs_f64() * self.rate_per_s).min(self.burst)
    }

    /// How long until a bucket holding `tokens` (< 1) holds a request.
    fn wait(&self, tokens: f64) -> Duration {
        secs_saturating((1.0 - tokens) / self.rate_per_s)
    }

    /// Takes one request from `did`'s bucket at `now`, or says how long
    /// until one is there.
    pub fn check_at(&self, did: &str, now: Instant) -> Result<(), Duration> {
        let mut buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        if !buckets.contains_key(did) && buckets.len() >= Self::MAX_DIDS {
            let full_after = secs_saturating(self.burst / self.rate_per_s);
            buckets.retain(|_, b| now.saturating_duration_since(b.at) < full_after);
            if buckets.len() >= Self::MAX_DIDS {
                let oldest = buckets.iter().min_by_key(|(_, b)| b.at).map(|(k, _)| k.clone());
                if let Some(k) = oldest {
                    buckets.remove(&k);
                }
            }
        }
        let b = buckets.entry(did.to_string()).or_insert(Bucket { tokens: self.burst, at: now });
        b.tokens = self.refilled(b, now);
        b.at = b.at.max(now);
        if b.tokens >= 1.0 {
            b.tokens -= 1.0;
            Ok(())
        } else {
            Err(self.wait(b.tokens))
        }
    }

    /// Buckets kept now.
    pub fn len(&self) -> usize {
        self.buckets.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Whether no bucket is kept.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// `s` seconds as a [`Duration`], [`Duration::MAX`] when it does not fit
/// (a tiny rate makes waits overflow; `from_secs_f64` would panic).
fn secs_saturating(s: f64) -> Duration {
    Duration::try_from_secs_f64(s).unwrap_or(Duration::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_refill_at_the_rate_and_cap_at_the_burst() {
        let limiter = DidRateLimiter::new(10.0, 3);
        let t0 = Instant::now();
        for _ in 0..3 {
            limiter.check_at("a", t0).unwrap();
        }
        let wait = limiter.check_at("a", t0).unwrap_err();
        assert_eq!(wait.as_millis(), 100);
        // another DID has its own bucket
        limiter.check_at("b", t0).unwrap();
        // 100 ms later one more; an hour later still only the burst
        limiter.check_at("a", t0 + Duration::from_millis(100)).unwrap();
        assert!(limiter.check_at("a", t0 + Duration::from_millis(100)).is_err());
        let later = t0 + Duration::from_secs(3600);
        for _ in 0..3 {
            limiter.check_at("a", later).unwrap();
        }
        assert!(limiter.check_at("a", later).is_err());
    }

    #[test]
    fn a_peek_takes_nothing() {
        let limiter = DidRateLimiter::new(10.0, 2);
        let t0 = Instant::now();
        for _ in 0..5 {
            limiter.peek_at("a", t0).unwrap();
        }
        limiter.check_at("a", t0).unwrap();
        limiter.check_at("a", t0).unwrap();
        assert_eq!(limiter.peek_at("a", t0).unwrap_err().as_millis(), 100);
        limiter.peek_at("a", t0 + Duration::from_millis(100)).unwrap();
    }

    #[test]
    fn a_tiny_rate_saturates_instead_of_panicking() {
        let limiter = DidRateLimiter::new(1e-20, 1);
        let t0 = Instant::now();
        limiter.check_at("a", t0).unwrap();
        assert_eq!(limiter.check_at("a", t0).unwrap_err(), Duration::MAX);
        // the idle sweep at the bucket cap computes burst / rate too
        for i in 0..DidRateLimiter::MAX_DIDS {
            let _ = limiter.check_at(&format!("did:{i}"), t0);
        }
        limiter.check_at("did:new", t0).unwrap();
        assert_eq!(secs_saturating(f64::INFINITY), Duration::MAX);
        assert_eq!(secs_saturating(1.5), Duration::from_millis(1500));
    }

    #[test]
    fn the_bucket_map_stays_bounded() {
        let limiter = DidRateLimiter::new(1.0, 1);
        let t0 = Instant::now();
        for i in 0..DidRateLimiter::MAX_DIDS + 5 {
            limiter.check_at(&format!("did:{i}"), t0).unwrap();
        }
        assert_eq!(limiter.len(), DidRateLimiter::MAX_DIDS);
        // idle (refilled) buckets go first when a new DID arrives
        limiter.check_at("did:new", t0 + Duration::from_secs(3600)).unwrap();
        assert_eq!(limiter.len(), 1);
    }
}
