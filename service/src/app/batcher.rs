//! Dynamic batching (after TEI's `core/src/queue.rs`): embed requests from
//! many clients wait in one bounded queue, fair across callers
//! ([`super::queue`]: one job of each caller in turn); a dedicated thread drains it into
//! encoder batches bounded by a token budget (`--max-batch-tokens`, the
//! tokens of every text plus 2 specials each; the first request always runs,
//! alone if it is over) and a row cap (`--batch-texts`), runs them, and
//! answers each request on its own channel.
//!
//! - A full queue is refused at once (RESOURCE_EXHAUSTED).
//! - Requests whose caller has gone or whose deadline passed are dropped
//!   before encoding and counted in `scd_jobs_dropped_total{reason}`.
//! - The thread is fail-stop: if the encoder panics (or the thread ends for
//!   any other reason) the batch in flight is answered INTERNAL, queued
//!   requests UNAVAILABLE, the cause is logged at ERROR and published on
//!   [`Batcher::stopped_signal`] (the server turns health NOT_SERVING), and
//!   every later request is refused UNAVAILABLE naming the cause.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use scd_engine::cancel::Cancel;
use scd_engine::encoder::{EncodeOptions, Encoded, Encoder};
use tokio::sync::watch;
use tracing::{debug, error};

use super::error::AppError;
use super::metrics::Metrics;
use super::queue::{Full, Queue};
pub use super::queue::{Job, Reply};
use super::ratelog::RateLimitedWarn;

/// Queue and batch bounds.
#[derive(Debug, Clone, Copy)]
pub struct BatchLimits {
    /// Requests that may wait.
    pub queue_size: usize,
    /// Texts (rows) per encoder call.
    pub batch_texts: usize,
    /// Tokens per encoder call, 2 specials per text included.
    pub max_batch_tokens: usize,
    /// Tokens one request's texts may hold (2 specials each); a larger one
    /// is INVALID_ARGUMENT, unrun.
    pub max_request_tokens: usize,
}

/// Handle to the batching thread.
#[derive(Clone)]
pub struct Batcher {
    queue: Arc<Queue>,
    /// Closes the queue when the last handle goes (the thread then ends).
    _open: Arc<Open>,
    depth: Arc<AtomicUsize>,
    stopped: watch::Receiver<Option<String>>,
}

/// Closes the queue on drop.
struct Open(Arc<Queue>);

impl Drop for Open {
    fn drop(&mut self) {
        self.0.close();
    }
}

/// What a client is told when the encoder panicked on its batch: the
/// panic's text may quote a request's content, so it goes to the log only.
pub const ENCODER_FAILED: &str = "the encoder failed; the server's log has the cause";
/// What a client is told once the encoder thread has stopped (the cause is
/// logged, and kept for the operator by [`Batcher::stopped_signal`]).
pub const ENCODER_STOPPED: &str = "encoder thread stopped; the server's log has the cause";
/// [`ENCODER_STOPPED`] when the cause was not published in time.
pub const ENCODER_STOPPED_UNKNOWN: &str = "encoder thread stopped; the cause was not published";

static QUEUE_FULL: RateLimitedWarn = RateLimitedWarn::new("embed_queue_full");

/// Why a submission was refused.
pub enum Refused {
    /// The queue is full: retry later.
    Full,
    /// The encoder thread has stopped, with its cause.
    Stopped(String),
}

impl Batcher {
    /// Starts the batching thread over `encoder`.
    pub fn start(encoder: Arc<dyn Encoder>, limits: BatchLimits, metrics: Arc<Metrics>) -> Self {
        let depth = Arc::new(AtomicUsize::new(0));
        let queue = Arc::new(Queue::new(limits.queue_size, depth.clone()));
        let (stop_tx, stopped) = watch::channel(None);
        let mut worker = Worker { queue: queue.clone(), encoder, limits, metrics, pending: None };
        std::thread::Builder::new()
            .name("scd-batcher".into())
            .spawn(move || {
                let cause = match catch_unwind(AssertUnwindSafe(|| worker.run())) {
                    Ok(Ok(())) => return, // every sender gone: the server is shutting down
                    Ok(Err(cause)) => cause,
                    Err(panic) => format!("panicked: {}", panic_message(&*panic)),
                };
                error!(cause = %cause, "encoder thread stopped; embed requests now fail UNAVAILABLE");
                let _ = stop_tx.send(Some(cause.clone()));
                let unavailable = || AppError::unavailable(ENCODER_STOPPED);
                if let Some((j, _)) = worker.pending.take() {
                    let _ = j.reply.send((Err(unavailable()), 0.0));
                }
                for j in worker.queue.drain() {
                    let _ = j.reply.send((Err(unavailable()), 0.0));
                }
            })
            .expect("spawn batcher thread");
        Self { _open: Arc::new(Open(queue.clone())), queue, depth, stopped }
    }

    /// Queues a job.
    pub fn submit(&self, job: Job) -> Result<(), Refused> {
        if let Some(cause) = self.stopped() {
            return Err(Refused::Stopped(cause));
        }
        match self.queue.push(job) {
            Ok(()) => Ok(()),
            Err(Full::Full) => {
                QUEUE_FULL.hit("embed queue full");
                Err(Refused::Full)
            }
            Err(Full::Closed) => Err(Refused::Stopped(self.stopped().unwrap_or_else(|| "queue closed".into()))),
        }
    }

    /// Milliseconds until a place frees: one of `caller`'s jobs ends, or
    /// (`None`) the queue takes one more ([`Queue::wait_ms`]); `None`
    /// before the encoder's rate was measured.
    pub fn wait_ms(&self, caller: Option<&str>) -> Option<f64> {
        self.queue.wait_ms(caller)
    }

    /// Requests waiting.
    pub fn depth(&self) -> usize {
        self.depth.load(Ordering::Relaxed)
    }

    /// Why the encoder thread stopped, once it has.
    pub fn stopped(&self) -> Option<String> {
        self.stopped.borrow().clone()
    }

    /// Changes to `Some(cause)` when the encoder thread stops.
    pub fn stopped_signal(&self) -> watch::Receiver<Option<String>> {
        self.stopped.clone()
    }
}

/// The state of the batching thread.
struct Worker {
    queue: Arc<Queue>,
    encoder: Arc<dyn Encoder>,
    limits: BatchLimits,
    metrics: Arc<Metrics>,
    /// A live job taken from the queue that did not fit the last batch, with its tokens.
    pending: Option<(Job, usize)>,
}

fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic payload".into())
}

impl Worker {
    /// Drops a job whose deadline passed or whose caller left; `None` if dropped.
    fn alive(&self, j: Job) -> Option<Job> {
        if j.deadline.is_some_and(|d| Instant::now() >= d) {
            self.metrics.job_dropped("deadline");
            let _ = j.reply.send((Err(AppError::deadline("deadline passed while queued for the encoder")), 0.0));
            return None;
        }
        if j.reply.is_closed() {
            self.metrics.job_dropped("cancelled");
            return None;
        }
        Some(j)
    }

    /// The job's tokens with 2 specials per window; counted here, off the runtime.
    fn tokens(&self, j: &Job) -> usize {
        let spend = scd_engine::encoder::encoder_spend(self.encoder.max_tokens());
        j.texts.iter().map(|t| spend(self.encoder.count_tokens(t).unwrap_or(0))).sum()
    }

    /// The next live job from the queue, waiting when `block`.
    fn next(&mut self, block: bool) -> Option<(Job, usize)> {
        loop {
            let j = self.queue.pop(block)?;
            if let Some(j) = self.alive(j) {
                let n = self.tokens(&j);
                if n > self.limits.max_request_tokens {
                    self.metrics.job_dropped("over_request_tokens");
                    let limit = self.limits.max_request_tokens;
                    let msg = format!(
                        "texts: {n} encoder tokens, over the limit of {limit} per request (--max-request-encoder-tokens); send fewer or shorter texts"
                    );
                    let _ = j.reply.send((Err(AppError::invalid(msg)), 0.0));
                    continue;
                }
                return Some((j, n));
            }
        }
    }

    /// Encodes under `catch_unwind`, stopping between the encoder's batches
    /// once `cancel` says so; `Err` holds the panic's message.
    fn encode(
        &self,
        texts: &[&str],
        opts: &EncodeOptions,
        cancel: &Cancel,
    ) -> Result<scd_engine::Result<Encoded>, String> {
        self.metrics.encoded(texts.len(), 0);
        let r = catch_unwind(AssertUnwindSafe(|| self.encoder.encode_cancellable(texts, opts, cancel)))
            .map_err(|p| format!("encoder panicked: {}", panic_message(&*p)))?;
        if let Ok(enc) = &r {
            self.metrics.encoded(0, enc.tokens.iter().sum());
        }
        Ok(r)
    }

    /// Batches until every sender is gone (`Ok`) or the encoder panics (`Err(cause)`).
    fn run(&mut self) -> Result<(), String> {
        loop {
            let first = match self.pending.take() {
                Some(p) => {
                    self.queue.hold_next(None);
                    p
                }
                None => match self.next(true) {
                    Some(p) => p,
                    None => return Ok(()),
                },
            };
            let (mut rows, mut tokens) = (first.0.texts.len(), first.1);
            let opts = first.0.opts;
            let mut jobs = vec![first.0];
            while let Some((j, n)) = self.next(false) {
                if j.opts != opts
                    || rows + j.texts.len() > self.limits.batch_texts
                    || tokens + n > self.limits.max_batch_tokens
                {
                    self.queue.hold_next(Some(&j));
                    self.pending = Some((j, n));
                    break;
                }
                rows += j.texts.len();
                tokens += n;
                jobs.push(j);
            }
            // the last check before the encoder: nobody waits for these any more
            let before = jobs.len();
            let jobs: Vec<Job> = jobs.into_iter().filter_map(|j| self.alive(j)).collect();
            if jobs.is_empty() {
                continue;
            }
            if jobs.len() != before {
                tokens = jobs.iter().map(|j| self.tokens(j)).sum();
            }
            self.queue.begin(&jobs);
            let done = self.batch(jobs, tokens, &opts);
            self.queue.end(matches!(done, Ok(true)));
            done?;
        }
    }

    /// Runs one batch and answers its jobs; `Ok(true)` when it ran whole.
    fn batch(&self, jobs: Vec<Job>, tokens: usize, opts: &EncodeOptions) -> Result<bool, String> {
        let started = Instant::now();
        let texts: Vec<&str> = jobs.iter().flat_map(|j| j.texts.iter().map(String::as_str)).collect();
        self.metrics.batch(texts.len(), tokens);
        for j in &jobs {
            self.metrics.queue_wait((started - j.queued).as_secs_f64());
        }
        let queued = |j: &Job| (started - j.queued).as_secs_f64() * 1e3;
        // one call for the whole batch; on error (e.g. one over-long text)
        // each job runs alone so only the faulty request fails. A job alone
        // can be cancelled mid-way; a batch of several is within the token
        // budget and runs to its end
        let whole_cancel = match jobs.as_slice() {
            [only] => only.cancel.clone(),
            _ => Cancel::new(),
        };
        let whole = match self.encode(&texts, opts, &whole_cancel) {
            Ok(r) => r,
            Err(cause) => {
                for j in jobs {
                    let q = queued(&j);
                    let _ = j.reply.send((Err(AppError::internal(ENCODER_FAILED)), q));
                }
                return Err(cause);
            }
        };
        let ran = match whole {
            Ok(enc) => {
                let mut at = 0;
                for j in jobs {
                    let k = j.texts.len();
                    let part = Encoded {
                        dim: enc.dim,
                        data: enc.data[at * enc.dim..(at + k) * enc.dim].to_vec(),
                        tokens: enc.tokens[at..at + k].to_vec(),
                        windows: enc.windows[at..at + k].to_vec(),
                    };
                    at += k;
                    let q = queued(&j);
                    let _ = j.reply.send((Ok(part), q));
                }
                true
            }
            Err(e) if whole_cancel.check("embed").is_err() => {
                // the caller of the only job went away: nothing to retry
                self.metrics.job_dropped("cancelled");
                let status = AppError::from(e);
                for j in jobs {
                    let q = queued(&j);
                    let _ = j.reply.send((Err(status.clone()), q));
                }
                false
            }
            Err(e) => {
                debug!(error = %e, "batch failed; retrying its requests one by one");
                let mut jobs = jobs.into_iter();
                while let Some(j) = jobs.next() {
                    let refs: Vec<&str> = j.texts.iter().map(String::as_str).collect();
                    let q = queued(&j);
                    match self.encode(&refs, &j.opts, &j.cancel) {
                        Ok(r) => {
                            let _ = j.reply.send((r.map_err(AppError::from), q));
                        }
                        Err(cause) => {
                            for j in std::iter::once(j).chain(jobs) {
                                let q = queued(&j);
                                let _ = j.reply.send((Err(AppError::internal(ENCODER_FAILED)), q));
                            }
                            return Err(cause);
                        }
                    }
                }
                false
            }
        };
        Ok(ran)
    }
}
