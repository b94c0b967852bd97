//! Prometheus metrics, served as text on `--http-addr` at `/metrics`.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// (method, stage) → (seconds summed, count).
type StageSums = BTreeMap<(String, &'static str), (f64, u64)>;

/// Counters and sums the server keeps.
#[derive(Default)]
pub struct Metrics {
    requests: Mutex<BTreeMap<(String, String), u64>>,
    durations: Mutex<StageSums>,
    batches: AtomicU64,
    batch_texts: AtomicU64,
    tokens: AtomicU64,
}

impl Metrics {
    /// Counts a finished request by method and status code.
    pub fn request(&self, method: &str, code: tonic::Code) {
        *self
            .requests
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry((method.to_string(), format!("{code:?}")))
            .or_default() += 1;
    }

    /// Adds a stage duration in milliseconds.
    pub fn stage(&self, method: &str, stage: &'static str, ms: f64) {
        let mut d = self.durations.lock().unwrap_or_else(|p| p.into_inner());
        let e = d.entry((method.to_string(), stage)).or_default();
        e.0 += ms / 1e3;
        e.1 += 1;
    }

    /// Counts an encoder batch of `texts` texts.
    pub fn batch(&self, texts: usize) {
        self.batches.fetch_add(1, Ordering::Relaxed);
        self.batch_texts.fetch_add(texts as u64, Ordering::Relaxed);
    }

    /// Counts tokens fed to the encoder.
    pub fn tokens(&self, n: usize) {
        self.tokens.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// Prometheus text exposition, with gauges given by the caller.
    pub fn render(&self, gauges: &[(&str, &str, f64)]) -> String {
        let mut s = String::new();
        s += "# HELP scd_requests_total Finished gRPC requests by method and status code.\n# TYPE scd_requests_total counter\n";
        for ((m, c), n) in self.requests.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            s += &format!("scd_requests_total{{method=\"{m}\",code=\"{c}\"}} {n}\n");
        }
        s += "# HELP scd_stage_seconds Time per request stage.\n# TYPE scd_stage_seconds summary\n";
        for ((m, st), (sum, n)) in self.durations.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            s += &format!("scd_stage_seconds_sum{{method=\"{m}\",stage=\"{st}\"}} {sum}\nscd_stage_seconds_count{{method=\"{m}\",stage=\"{st}\"}} {n}\n");
        }
        s += &format!(
            "# TYPE scd_batches_total counter\nscd_batches_total {}\n# TYPE scd_batch_texts_total counter\nscd_batch_texts_total {}\n# TYPE scd_encoder_tokens_total counter\nscd_encoder_tokens_total {}\n",
            self.batches.load(Ordering::Relaxed),
            self.batch_texts.load(Ordering::Relaxed),
            self.tokens.load(Ordering::Relaxed)
        );
        for (name, help, v) in gauges {
            s += &format!("# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}\n");
        }
        s
    }
}
