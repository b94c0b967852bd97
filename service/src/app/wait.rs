//! How long a refused caller waits, and the RESOURCE_EXHAUSTED it is told.
//!
//! A place of the compress or count slots frees when a call in flight ends;
//! [`InFlight`] keeps each call's caller, start and size (bytes of its
//! request) and the measured rate of the lane ([`Rate`]), so the hint is
//! the expected end of the first call whose end frees the place the caller
//! needs (one of its own, past its share; anyone's, when every slot is
//! taken), never the mean of calls unlike it. The embed queue's hint comes
//! from the queue itself ([`super::queue::Queue::wait_ms`]). Before a lane
//! has measured anything the hint is [`super::shares::Pace`]'s.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use super::error::AppError;
use super::queue::{hint_ms, remaining_ms, Rate};
use super::shares::{self, Pace, PastShare};

/// The calls in flight in one lane and its rate.
#[derive(Debug, Default)]
pub struct InFlight {
    calls: Mutex<HashMap<u64, (String, Instant, usize)>>,
    next: AtomicU64,
    rate: Rate,
}

/// One call in flight; it leaves [`InFlight`] on drop.
#[derive(Debug)]
pub struct Call {
    of: Arc<InFlight>,
    id: u64,
}

impl InFlight {
    /// Counts a call of `caller` (a share key) over `bytes` as begun.
    pub fn begin(self: &Arc<Self>, caller: &str, bytes: usize) -> Call {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let unit = shares::unit(caller);
        self.calls.lock().unwrap_or_else(|e| e.into_inner()).insert(id, (unit, Instant::now(), bytes));
        Call { of: self.clone(), id }
    }

    /// Milliseconds until the first call of a share unit `whose` accepts
    /// ends; `None` before the rate was measured or with no such call.
    pub fn wait_ms(&self, whose: impl Fn(&str) -> bool) -> Option<f64> {
        let calls = self.calls.lock().unwrap_or_else(|e| e.into_inner());
        calls
            .values()
            .filter(|(u, _, _)| whose(u))
            .filter_map(|(_, began, b)| Some(remaining_ms(self.rate.ms(*b)?, began.elapsed())))
            .min_by(f64::total_cmp)
    }
}

impl Call {
    /// The call ended whole: its time is a sample of the rate.
    pub fn done(self) {
        let calls = self.of.calls.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, began, b)) = calls.get(&self.id) {
            self.of.rate.record(*b, began.elapsed());
        }
    }
}

impl Drop for Call {
    fn drop(&mut self) {
        self.of.calls.lock().unwrap_or_else(|e| e.into_inner()).remove(&self.id);
    }
}

/// What a blocking call holds while it runs: its share and its place in
/// [`InFlight`], told when the call ended whole.
pub trait Held: Send + 'static {
    /// The call ended whole.
    fn done(self);
}

impl Held for (shares::ShareGuard, Call) {
    fn done(self) {
        self.1.done();
    }
}

/// The hint: the estimate when there is one, else `pace`'s over `busy`.
fn hint(estimate: Option<f64>, pace: &Pace, busy: usize) -> u64 {
    estimate.map_or_else(|| pace.retry_ms(busy), hint_ms)
}

/// RESOURCE_EXHAUSTED for a caller past its share of `what`, told to retry
/// when one of its places (its network's, past the network's share) likely
/// frees: `estimate` ms, or `pace`'s guess before anything was measured.
pub fn past_share(what: &str, p: PastShare, estimate: Option<f64>, pace: &Pace) -> AppError {
    let ms = hint(estimate, pace, p.held);
    let holder = if p.network { "this caller's network (its /24)" } else { "this caller" };
    AppError::exhausted(
        format!(
            "{what}: {holder} holds {} of {}, past its share of {}, and the rest are kept for other callers; retry after {ms} ms",
            p.held, p.capacity, p.share
        ),
        ms,
    )
}

/// RESOURCE_EXHAUSTED for a full `what` of `places`, told to retry when one
/// likely frees (as [`past_share`]).
pub fn overloaded(what: &str, places: usize, estimate: Option<f64>, pace: &Pace) -> AppError {
    let ms = hint(estimate, pace, places);
    AppError::exhausted(format!("{what} queue is full; retry after {ms} ms"), ms)
}

/// Whether share unit `u` is `caller`'s place to wait for: its own, or past
/// its network's share, any of its network's.
pub fn whose(caller: &str, network: bool) -> impl Fn(&str) -> bool {
    let unit = shares::unit(caller);
    let net = network.then(|| shares::network(&unit)).flatten();
    move |u| u == unit || net.is_some() && shares::network(u) == net
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn the_hint_is_the_end_of_the_callers_first_call_at_the_measured_rate() {
        let f = Arc::new(InFlight::default());
        let warm = f.begin("ip:10.0.0.9", 1000);
        std::thread::sleep(Duration::from_millis(20));
        warm.done();
        assert!(f.wait_ms(|_| true).is_none(), "nothing in flight");
        // a call 50 times larger is expected to run about 50 times longer
        let _big = f.begin("ip:10.0.0.1", 50_000);
        let _small = f.begin("ip:10.0.0.2", 1000);
        let mine = f.wait_ms(whose("ip:10.0.0.1", false)).unwrap();
        assert!(mine >= 900.0, "{mine}");
        let any = f.wait_ms(|_| true).unwrap();
        assert!(any < mine, "the small call ends first: {any} vs {mine}");
        let net = f.wait_ms(whose("ip:10.0.0.7", true)).unwrap();
        assert_eq!(net.round(), any.round(), "past the network's share: any of the /24's calls");
        assert!(f.wait_ms(whose("ip:10.0.0.7", false)).is_none());
    }
}
