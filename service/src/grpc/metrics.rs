//! Prometheus metrics, served as text on `--http-addr` at `/metrics`.
//!
//! Each server owns a `metrics-exporter-prometheus` recorder (not the
//! process-global one, so several servers in one process, as in the tests,
//! keep separate counts) and renders its handle on each scrape.
//!
//! | metric | kind | labels |
//! | --- | --- | --- |
//! | `scd_requests_total` | counter | `method`, `code`: every finished RPC, including ones rejected before a handler ran |
//! | `scd_request_duration_seconds` | histogram | `method` |
//! | `scd_stage_seconds` | histogram | `method`, `stage` (`queue`, `inference`, `selection`) |
//! | `scd_queue_wait_seconds` | histogram | time an embed request waited for the encoder |
//! | `scd_batch_texts`, `scd_batch_tokens` | histogram | texts and tokens (+2 specials per text) per encoder batch |
//! | `scd_encoder_texts_total`, `scd_encoder_tokens_total` | counter | texts fed to the encoder, tokens it reported |
//! | `scd_jobs_dropped_total` | counter | `reason` (`deadline`, `cancelled`, `over_request_tokens`): embed requests dropped unrun |
//! | `scd_rejected_total` | counter | `kind` (`embed_queue_full`, `compress_slots_full`, `count_slots_full`, `embed_caller_share`, `compress_caller_share`, `http_connections`, and the listener guard's `grpc_connections`, `grpc_connections_per_peer`, `grpc_idle_closed`, `grpc_silent_closed`, `grpc_reserve_call`, `grpc_idle_evicted`) |
//! | `scd_queue_depth`, `scd_sessions`, `scd_cache_*` | gauge | |

use metrics::{counter, gauge, histogram, Counter, Histogram};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle, PrometheusRecorder};

/// Latency buckets in seconds.
const SECONDS: &[f64] =
    &[0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 60.0];

/// The server's recorder and the handles it updates on hot paths.
pub struct Metrics {
    recorder: PrometheusRecorder,
    handle: PrometheusHandle,
    queue_wait: Histogram,
    batch_texts: Histogram,
    batch_tokens: Histogram,
    encoder_texts: Counter,
    encoder_tokens: Counter,
}

impl Metrics {
    /// A recorder whose `scd_batch_tokens` buckets include `max_batch_tokens`
    /// exactly, so a scrape shows whether any batch went over the budget.
    pub fn new(max_batch_tokens: usize) -> Self {
        let mut tokens: Vec<f64> = (4..=16).map(|p| f64::from(1u32 << p)).collect();
        tokens.push(max_batch_tokens as f64);
        tokens.sort_by(f64::total_cmp);
        tokens.dedup();
        let texts: Vec<f64> = (0..=10).map(|p| f64::from(1u32 << p)).collect();
        let recorder = PrometheusBuilder::new()
            .set_buckets(SECONDS)
            .and_then(|b| b.set_buckets_for_metric(Matcher::Full("scd_batch_tokens".into()), &tokens))
            .and_then(|b| b.set_buckets_for_metric(Matcher::Full("scd_batch_texts".into()), &texts))
            .expect("bucket lists are non-empty")
            .build_recorder();
        let handle = recorder.handle();
        let (queue_wait, batch_texts, batch_texts_h, encoder_texts, encoder_tokens) =
            metrics::with_local_recorder(&recorder, || {
                (
                    histogram!("scd_queue_wait_seconds"),
                    histogram!("scd_batch_texts"),
                    histogram!("scd_batch_tokens"),
                    counter!("scd_encoder_texts_total"),
                    counter!("scd_encoder_tokens_total"),
                )
            });
        Self { recorder, handle, queue_wait, batch_texts, batch_tokens: batch_texts_h, encoder_texts, encoder_tokens }
    }

    /// Counts a finished RPC by method and status code, with its duration.
    pub fn request(&self, method: &str, code: tonic::Code, seconds: f64) {
        metrics::with_local_recorder(&self.recorder, || {
            counter!("scd_requests_total", "method" => method.to_string(), "code" => format!("{code:?}")).increment(1);
            histogram!("scd_request_duration_seconds", "method" => method.to_string()).record(seconds);
        });
    }

    /// Records a stage duration in milliseconds.
    pub fn stage(&self, method: &'static str, stage: &'static str, ms: f64) {
        metrics::with_local_recorder(&self.recorder, || {
            histogram!("scd_stage_seconds", "method" => method, "stage" => stage).record(ms / 1e3);
        });
    }

    /// Time an embed request waited in the queue.
    pub fn queue_wait(&self, seconds: f64) {
        self.queue_wait.record(seconds);
    }

    /// An encoder batch of `texts` texts holding `tokens` tokens (specials included).
    pub fn batch(&self, texts: usize, tokens: usize) {
        self.batch_texts.record(texts as f64);
        self.batch_tokens.record(tokens as f64);
    }

    /// Texts handed to the encoder and the tokens it reported.
    pub fn encoded(&self, texts: usize, tokens: usize) {
        self.encoder_texts.increment(texts as u64);
        self.encoder_tokens.increment(tokens as u64);
    }

    /// An embed request dropped before encoding.
    pub fn job_dropped(&self, reason: &'static str) {
        metrics::with_local_recorder(&self.recorder, || {
            counter!("scd_jobs_dropped_total", "reason" => reason).increment(1)
        });
    }

    /// A request or connection refused for load.
    pub fn rejected(&self, kind: &'static str) {
        metrics::with_local_recorder(&self.recorder, || counter!("scd_rejected_total", "kind" => kind).increment(1));
    }

    /// Prometheus text exposition, after setting the gauges given by the caller.
    pub fn render(&self, gauges: &[(&'static str, f64)]) -> String {
        metrics::with_local_recorder(&self.recorder, || {
            for (name, v) in gauges {
                gauge!(*name).set(*v);
            }
        });
        self.handle.render()
    }
}
