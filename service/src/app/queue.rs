//! The embed queue: bounded, fair across callers, and able to say when a
//! refused caller's place will free.
//!
//! - **Fair.** Each caller (its share unit, [`super::shares::unit`]) has a
//!   lane; the batcher takes one job from each lane in turn (round robin),
//!   so a small request waits behind at most one job of each other caller,
//!   never behind another caller's whole queue.
//! - **A true retry hint.** The batcher tells the queue what it runs (bytes
//!   and callers) and how long each batch took; [`Queue::wait_ms`] is the
//!   expected end of the batch in flight, plus the bytes the batcher takes
//!   before the caller's first job, at the measured rate ([`Rate`]).

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use scd_engine::cancel::Cancel;
use scd_engine::encoder::{EncodeOptions, Encoded};
use tokio::sync::oneshot;

/// The answer to a job: embeddings or an error, and the time it spent queued (ms).
pub type Reply = (Result<Encoded, super::error::AppError>, f64);

/// One embed request in the queue.
pub struct Job {
    /// The texts.
    pub texts: Vec<String>,
    /// Prefix and long-input policy.
    pub opts: EncodeOptions,
    /// Where the answer goes.
    pub reply: oneshot::Sender<Reply>,
    /// When it was queued.
    pub queued: Instant,
    /// Past this the job is dropped unrun.
    pub deadline: Option<Instant>,
    /// Set when the caller goes away: a job that runs alone (one over the
    /// batch token budget, e.g. a long windowed text) stops between the
    /// encoder's own batches instead of holding the thread to the end.
    pub cancel: Cancel,
    /// Whose turn it waits for: the caller's share unit
    /// ([`super::shares::unit`]).
    pub caller: String,
}

/// The rate of work of one bound, in bytes a millisecond: a moving sum of
/// bytes over a moving sum of time (each new sample weighs an eighth), so
/// large calls weigh what they cost.
#[derive(Debug, Default)]
pub struct Rate {
    sums: Mutex<(f64, f64)>,
}

impl Rate {
    /// Counts `bytes` of work done in `d`.
    pub fn record(&self, bytes: usize, d: Duration) {
        let mut s = self.sums.lock().unwrap_or_else(|e| e.into_inner());
        let keep = if s.1 == 0.0 { 0.0 } else { 7.0 / 8.0 };
        s.0 = s.0 * keep + bytes.max(1) as f64;
        s.1 = s.1 * keep + (d.as_secs_f64() * 1e3).max(1e-3);
    }

    /// Milliseconds `bytes` of work take; `None` before the first sample.
    pub fn ms(&self, bytes: usize) -> Option<f64> {
        let s = *self.sums.lock().unwrap_or_else(|e| e.into_inner());
        (s.1 > 0.0).then(|| bytes.max(1) as f64 * s.1 / s.0)
    }
}

/// What is left of work expected to take `expected_ms` that began `elapsed`
/// ago: at least an eighth of what it has run (one past its estimate is
/// not about to end).
pub fn remaining_ms(expected_ms: f64, elapsed: Duration) -> f64 {
    let ran = elapsed.as_secs_f64() * 1e3;
    (expected_ms - ran).max(ran / 8.0)
}

/// The most a retry hint says (a caller told this much is told again).
pub const MAX_HINT_MS: u64 = 30_000;

/// A hint in whole milliseconds, rounded up, within 1..=[`MAX_HINT_MS`].
pub fn hint_ms(ms: f64) -> u64 {
    (ms.ceil() as u64).clamp(1, MAX_HINT_MS)
}

/// Why a job was not queued.
pub enum Full {
    /// Every place is taken.
    Full,
    /// The queue is closed (the batcher stopped).
    Closed,
}

#[derive(Default)]
struct Inner {
    /// Callers with queued jobs, in turn order.
    order: VecDeque<String>,
    /// Each caller's jobs, oldest first.
    lanes: HashMap<String, VecDeque<Job>>,
    closed: bool,
    /// The batch being encoded: when it began, its bytes and callers.
    running: Option<(Instant, usize, Vec<String>)>,
    /// A job the batcher took that runs next: its bytes and caller.
    next: Option<(usize, String)>,
}

/// The embed queue.
pub struct Queue {
    inner: Mutex<Inner>,
    ready: Condvar,
    capacity: usize,
    depth: Arc<AtomicUsize>,
    rate: Rate,
}

/// The bytes of a job's texts: the measure of its work.
pub fn bytes(j: &Job) -> usize {
    j.texts.iter().map(String::len).sum::<usize>().max(1)
}

impl Queue {
    /// An empty queue of `capacity` jobs; `depth` counts what waits.
    pub fn new(capacity: usize, depth: Arc<AtomicUsize>) -> Self {
        Self { inner: Mutex::default(), ready: Condvar::new(), capacity: capacity.max(1), depth, rate: Rate::default() }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues `job` in its caller's lane.
    pub fn push(&self, job: Job) -> Result<(), Full> {
        let mut q = self.lock();
        if q.closed {
            return Err(Full::Closed);
        }
        if self.depth.load(Ordering::Relaxed) >= self.capacity {
            return Err(Full::Full);
        }
        self.depth.fetch_add(1, Ordering::Relaxed);
        let caller = job.caller.clone();
        let lane = q.lanes.entry(caller.clone()).or_default();
        lane.push_back(job);
        if lane.len() == 1 {
            q.order.push_back(caller);
        }
        drop(q);
        self.ready.notify_one();
        Ok(())
    }

    /// The next job in turn, waiting for one when `block`; `None` when none
    /// is queued (not blocking) or the queue is closed and empty.
    pub fn pop(&self, block: bool) -> Option<Job> {
        let mut q = self.lock();
        loop {
            if let Some(caller) = q.order.pop_front() {
                // a caller in turn always has a lane with a job; were it not
                // so, skip it rather than read the queue as closed
                let Some(lane) = q.lanes.get_mut(&caller) else { continue };
                let Some(job) = lane.pop_front() else {
                    q.lanes.remove(&caller);
                    continue;
                };
                if lane.is_empty() {
                    q.lanes.remove(&caller);
                } else {
                    q.order.push_back(caller);
                }
                self.depth.fetch_sub(1, Ordering::Relaxed);
                return Some(job);
            }
            if !block || q.closed {
                return None;
            }
            q = self.ready.wait(q).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Refuses new jobs; a blocked [`Queue::pop`] returns once it is empty.
    pub fn close(&self) {
        self.lock().closed = true;
        self.ready.notify_all();
    }

    /// Closes the queue and takes every job left.
    pub fn drain(&self) -> Vec<Job> {
        self.close();
        std::iter::from_fn(|| self.pop(false)).collect()
    }

    /// The batcher holds `job` (taken, not yet run) to run next.
    pub fn hold_next(&self, job: Option<&Job>) {
        self.lock().next = job.map(|j| (bytes(j), j.caller.clone()));
    }

    /// The batcher begins encoding `jobs`.
    pub fn begin(&self, jobs: &[Job]) {
        let callers = jobs.iter().map(|j| j.caller.clone()).collect();
        self.lock().running = Some((Instant::now(), jobs.iter().map(bytes).sum(), callers));
    }

    /// The batch in flight ended; when `done`, its time is a sample of the rate.
    pub fn end(&self, done: bool) {
        if let Some((began, b, _)) = self.lock().running.take() {
            if done {
                self.rate.record(b, began.elapsed());
            }
        }
    }

    /// Milliseconds until a place frees: with `caller`, one of its jobs
    /// ends (its share frees); else the batcher takes the next job (the
    /// queue frees a place). `None` before the rate was measured.
    pub fn wait_ms(&self, caller: Option<&str>) -> Option<f64> {
        let q = self.lock();
        let ms = |b: usize| self.rate.ms(b);
        let mut wait = match &q.running {
            Some((began, b, _)) => remaining_ms(ms(*b)?, began.elapsed()),
            None => 0.0,
        };
        let Some(caller) = caller else { return Some(wait) };
        if q.running.as_ref().is_some_and(|(_, _, c)| c.iter().any(|c| c == caller)) {
            return Some(wait);
        }
        if let Some((b, c)) = &q.next {
            wait += ms(*b)?;
            if c == caller {
                return Some(wait);
            }
        }
        // one job of each lane ahead in turn, then the caller's first
        for c in &q.order {
            let first = q.lanes.get(c).and_then(|l| l.front()).map_or(1, bytes);
            wait += ms(first)?;
            if c == caller {
                return Some(wait);
            }
        }
        Some(wait)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rate_weighs_large_calls_by_their_size_and_what_is_left_never_reaches_zero() {
        let r = Rate::default();
        assert_eq!(r.ms(100), None);
        r.record(1000, Duration::from_millis(100));
        assert_eq!(r.ms(5000).map(f64::round), Some(500.0));
        assert_eq!(remaining_ms(500.0, Duration::from_millis(100)), 400.0);
        assert_eq!(remaining_ms(500.0, Duration::from_millis(800)), 100.0, "past its estimate: an eighth of its run");
        assert_eq!((hint_ms(0.2), hint_ms(1500.2), hint_ms(1e9)), (1, 1501, MAX_HINT_MS));
    }
}
