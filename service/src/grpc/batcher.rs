//! Dynamic batching (after TEI's `core/src/queue.rs`): embed requests from
//! many clients wait in one bounded queue; a dedicated thread drains it into
//! encoder batches of up to `batch_texts` texts, runs them, and answers each
//! request on its own channel. A full queue is refused at once
//! (RESOURCE_EXHAUSTED); requests whose caller has gone are dropped unrun.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use scd_engine::encoder::{EncodeOptions, Encoded, Encoder};
use tokio::sync::{mpsc, oneshot};
use tracing::{debug, warn};

use super::metrics::Metrics;

/// One embed request in the queue.
pub struct Job {
    /// The texts.
    pub texts: Vec<String>,
    /// Prefix and long-input policy.
    pub opts: EncodeOptions,
    /// Where the answer goes, with the time spent queued (ms).
    pub reply: oneshot::Sender<(scd_engine::Result<Encoded>, f64)>,
    /// When it was queued.
    pub queued: Instant,
}

/// Handle to the batching thread.
#[derive(Clone)]
pub struct Batcher {
    tx: mpsc::Sender<Job>,
    depth: Arc<AtomicUsize>,
}

impl Batcher {
    /// Starts the batching thread over `encoder` with a queue of `queue_size` requests.
    pub fn start(encoder: Arc<dyn Encoder>, queue_size: usize, batch_texts: usize, metrics: Arc<Metrics>) -> Self {
        let (tx, mut rx) = mpsc::channel::<Job>(queue_size.max(1));
        let depth = Arc::new(AtomicUsize::new(0));
        let d = depth.clone();
        std::thread::Builder::new()
            .name("scd-batcher".into())
            .spawn(move || {
                let mut pending: Option<Job> = None;
                loop {
                    let first = match pending.take() {
                        Some(j) => j,
                        None => match rx.blocking_recv() {
                            Some(j) => j,
                            None => return,
                        },
                    };
                    d.fetch_sub(1, Ordering::Relaxed);
                    // gather compatible jobs already waiting, up to the batch size
                    let mut jobs = vec![first];
                    let mut n = jobs[0].texts.len();
                    while n < batch_texts {
                        match rx.try_recv() {
                            Ok(j) => {
                                d.fetch_sub(1, Ordering::Relaxed);
                                if j.opts != jobs[0].opts {
                                    pending = Some(j);
                                    break;
                                }
                                n += j.texts.len();
                                jobs.push(j);
                            }
                            Err(_) => break,
                        }
                    }
                    jobs.retain(|j| !j.reply.is_closed());
                    if jobs.is_empty() {
                        continue;
                    }
                    let started = Instant::now();
                    let texts: Vec<&str> = jobs.iter().flat_map(|j| j.texts.iter().map(String::as_str)).collect();
                    let opts = jobs[0].opts;
                    metrics.batch(texts.len());
                    // one call for the whole batch; on error (e.g. one over-long text)
                    // each job runs alone so only the faulty request fails
                    let whole = encoder.encode(&texts, &opts);
                    match whole {
                        Ok(enc) => {
                            metrics.tokens(enc.tokens.iter().sum());
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
                                let queued = (started - j.queued).as_secs_f64() * 1e3;
                                let _ = j.reply.send((Ok(part), queued));
                            }
                        }
                        Err(e) => {
                            debug!(error = %e, "batch failed; retrying its requests one by one");
                            for j in jobs {
                                let refs: Vec<&str> = j.texts.iter().map(String::as_str).collect();
                                let queued = (started - j.queued).as_secs_f64() * 1e3;
                                let _ = j.reply.send((encoder.encode(&refs, &j.opts), queued));
                            }
                        }
                    }
                }
            })
            .expect("spawn batcher thread");
        Self { tx, depth }
    }

    /// Queues a job; `Err` when the queue is full.
    pub fn submit(&self, job: Job) -> Result<(), Job> {
        match self.tx.try_send(job) {
            Ok(()) => {
                self.depth.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
            Err(mpsc::error::TrySendError::Full(j)) | Err(mpsc::error::TrySendError::Closed(j)) => {
                warn!("embed queue full");
                Err(j)
            }
        }
    }

    /// Requests waiting.
    pub fn depth(&self) -> usize {
        self.depth.load(Ordering::Relaxed)
    }
}
