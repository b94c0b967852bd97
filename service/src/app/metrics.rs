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
//! | `scd_encoder_texts_total`, `scd_encoder_tokens_total` | counter | texts fed to the encoder (embed requests, and what compressions embedded), tokens it reported |
//! | `scd_jobs_dropped_total` | counter | `reason` (`deadline`, `cancelled`, `over_request_tokens`): embed requests dropped unrun |
//! | `scd_rejected_total` | counter | `kind` (`embed_queue_full`, `compress_slots_full`, `count_slots_full`, `embed_caller_share`, `compress_caller_share`, `http_connections`, and the listener guard's `grpc_connections`, `grpc_connections_per_peer`, `grpc_idle_closed`, `grpc_silent_closed`, `grpc_reserve_call`, `grpc_idle_evicted`) |
//! | `scd_queue_depth`, `scd_sessions`, `scd_session_bytes`, `scd_cache_bytes` | gauge | |
//! | `scd_sessions_evicted_total`, `scd_sessions_expired_total`, `scd_cache_hits_total`, `scd_cache_misses_total` | counter | |
//! | `scd_build_info` | gauge (1) | `version`, `model` |
//! | `process_*` | the client libraries' standard process metrics (CPU, memory, threads, file descriptors, start time) | |
//!
//! Every metric has a `# HELP` line.

use std::sync::atomic::{AtomicU64, Ordering};

use metrics::{counter, gauge, histogram, Histogram};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle, PrometheusRecorder};

use super::Code;

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
    /// Texts and tokens the batcher fed the encoder (the engine counts its
    /// own; a scrape reports the sum).
    encoder_texts: AtomicU64,
    encoder_tokens: AtomicU64,
    /// Calls finished so far: the next one's request id.
    requests: AtomicU64,
}

/// What each metric counts: the `# HELP` lines.
const HELP: &[(&str, &str)] = &[
    ("scd_requests_total", "Finished calls by method and gRPC status code (REST as REST <verb> <route>)."),
    ("scd_request_duration_seconds", "Duration of finished calls by method."),
    ("scd_stage_seconds", "Duration of a call's stages (queue, inference, selection)."),
    ("scd_queue_wait_seconds", "Time an embed request waited for the encoder."),
    ("scd_batch_texts", "Texts per encoder batch."),
    ("scd_batch_tokens", "Tokens per encoder batch, two specials per text included."),
    (
        "scd_encoder_texts_total",
        "Texts fed to the encoder: embed requests and the chunks and tasks compressions embedded.",
    ),
    ("scd_encoder_tokens_total", "Tokens the encoder reported for those texts."),
    ("scd_jobs_dropped_total", "Embed requests dropped before encoding, by reason."),
    ("scd_rejected_total", "Requests or connections refused for load, by kind."),
    ("scd_queue_depth", "Embed requests waiting for the encoder."),
    ("scd_sessions", "Live sessions."),
    ("scd_session_bytes", "Bytes the live sessions hold."),
    ("scd_sessions_evicted_total", "Sessions evicted to stay within the session bounds."),
    ("scd_sessions_expired_total", "Sessions expired after their idle TTL."),
    ("scd_cache_hits_total", "Embedding cache hits."),
    ("scd_cache_misses_total", "Embedding cache misses."),
    ("scd_cache_bytes", "Bytes the embedding cache holds in memory."),
    ("scd_build_info", "1, labelled with the version and the loaded model."),
];

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
        let (queue_wait, batch_texts, batch_texts_h) = metrics::with_local_recorder(&recorder, || {
            for (name, help) in HELP {
                metrics::describe_counter!(*name, *help);
            }
            (histogram!("scd_queue_wait_seconds"), histogram!("scd_batch_texts"), histogram!("scd_batch_tokens"))
        });
        Self {
            recorder,
            handle,
            queue_wait,
            batch_texts,
            batch_tokens: batch_texts_h,
            encoder_texts: AtomicU64::new(0),
            encoder_tokens: AtomicU64::new(0),
            requests: AtomicU64::new(0),
        }
    }

    /// Counts a finished call by method and status code, with its duration,
    /// and logs it: one `scd::request` line per call (a JSON object with
    /// `--log-format json`) with a request id, the method, the code and the
    /// milliseconds, never the request's content. The transport names the
    /// [`Code`] (gRPC its status's, HTTP its status's); the label is its name.
    pub fn request(&self, method: &str, code: Code, seconds: f64) {
        let id = self.requests.fetch_add(1, Ordering::Relaxed) + 1;
        tracing::info!(target: "scd::request", request_id = id, method, code = ?code, ms = seconds * 1e3, "request");
        metrics::with_local_recorder(&self.recorder, || {
            counter!("scd_requests_total", "method" => method.to_string(), "code" => code.name()).increment(1);
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

    /// Texts the batcher handed the encoder and the tokens it reported.
    pub fn encoded(&self, texts: usize, tokens: usize) {
        self.encoder_texts.fetch_add(texts as u64, Ordering::Relaxed);
        self.encoder_tokens.fetch_add(tokens as u64, Ordering::Relaxed);
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

    /// Prometheus text exposition, after setting the gauges and the
    /// monotonic totals (`counters`, kept elsewhere) given by the caller, the
    /// encoder totals (the batcher's plus `engine_encoded`, the engine's own
    /// texts and tokens), `scd_build_info{version,model}` and the process's
    /// `process_*` metrics.
    pub fn render(&self, view: &Scrape<'_>) -> String {
        metrics::with_local_recorder(&self.recorder, || {
            for (name, v) in view.gauges {
                gauge!(*name).set(*v);
            }
            for (name, v) in view.counters {
                counter!(*name).absolute(*v);
            }
            let (texts, tokens) = view.engine_encoded;
            counter!("scd_encoder_texts_total").absolute(self.encoder_texts.load(Ordering::Relaxed) + texts);
            counter!("scd_encoder_tokens_total").absolute(self.encoder_tokens.load(Ordering::Relaxed) + tokens);
            gauge!("scd_build_info", "version" => env!("CARGO_PKG_VERSION"), "model" => view.model.to_string())
                .set(1.0);
        });
        let mut text = self.handle.render();
        process_metrics(&mut text);
        text
    }
}

/// What a scrape reports besides the recorder's own metrics.
#[derive(Debug, Default)]
pub struct Scrape<'a> {
    /// Gauges: (name, value).
    pub gauges: &'a [(&'static str, f64)],
    /// Monotonic totals kept elsewhere: (name, value).
    pub counters: &'a [(&'static str, u64)],
    /// Texts and tokens the engine had the encoder embed.
    pub engine_encoded: (u64, u64),
    /// The loaded model's id.
    pub model: &'a str,
}

/// Appends the Prometheus client libraries' standard `process_*` metrics of
/// this process (Linux; nothing elsewhere).
fn process_metrics(out: &mut String) {
    #[cfg(target_os = "linux")]
    {
        use std::fmt::Write as _;
        let Ok(me) = procfs::process::Process::myself() else { return };
        let mut put = |name: &str, kind: &str, help: &str, v: f64| {
            let _ = write!(out, "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {v}\n");
        };
        if let Ok(stat) = me.stat() {
            let tps = procfs::ticks_per_second() as f64;
            put(
                "process_cpu_seconds_total",
                "counter",
                "User and system CPU time spent in seconds.",
                (stat.utime + stat.stime) as f64 / tps,
            );
            put("process_virtual_memory_bytes", "gauge", "Virtual memory size in bytes.", stat.vsize as f64);
            put(
                "process_resident_memory_bytes",
                "gauge",
                "Resident memory size in bytes.",
                (stat.rss * procfs::page_size()) as f64,
            );
            put("process_threads", "gauge", "Number of OS threads in the process.", stat.num_threads as f64);
            if let Ok(boot) = procfs::boot_time_secs() {
                put(
                    "process_start_time_seconds",
                    "gauge",
                    "Start time of the process since unix epoch in seconds.",
                    boot as f64 + stat.starttime as f64 / tps,
                );
            }
        }
        if let Ok(n) = me.fd_count() {
            put("process_open_fds", "gauge", "Number of open file descriptors.", n as f64);
        }
        if let Ok(limits) = me.limits() {
            if let procfs::process::LimitValue::Value(n) = limits.max_open_files.soft_limit {
                put("process_max_fds", "gauge", "Maximum number of open file descriptors.", n as f64);
            }
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = out;
}
