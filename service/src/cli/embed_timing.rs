//! What `scd embed-batch` reports about its time: the steady state (every
//! pass over the corpus after the warm-up, session creation excluded), the
//! end-to-end time of one run (scan, session creation, warm-up and the first
//! pass), the passes one by one, and where the time went per phase.

use scd_engine::encoder::Breakdown;
use serde::Serialize;

/// Tokens over seconds.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Rate {
    /// Tokens embedded (prefix and special tokens included, padding not).
    pub tokens: usize,
    /// Wall-clock seconds.
    pub seconds: f64,
    /// `tokens / seconds`.
    pub tokens_per_s: f64,
}

impl Rate {
    /// `tokens` in `seconds`.
    pub fn new(tokens: usize, seconds: f64) -> Rate {
        Rate { tokens, seconds, tokens_per_s: tokens as f64 / seconds.max(1e-9) }
    }
}

/// Where the time of the passes went. The engine's phases are summed over
/// the model workers (with several workers they overlap one another);
/// tokenization ran on the reader thread, writing on the main thread.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Phases {
    /// Tokenizing and cutting into windows (the reader thread, ahead of the model).
    pub tokenize_s: f64,
    /// Appending rows to the output (the main thread).
    pub write_s: f64,
    /// Batch assembly, host→device, model, device→host, pooling; padded and real tokens.
    pub engine: Breakdown,
    /// Share of the tokens the model computed on that were padding.
    pub padding_share: f64,
    /// Real tokens per model call.
    pub real_tokens_per_batch: f64,
    /// Padded tokens (rows × longest row) per model call.
    pub padded_tokens_per_batch: f64,
}

impl Phases {
    /// Fills the ratios from the counts.
    pub fn finish(&mut self) {
        let b = &self.engine;
        self.padding_share = b.padding_share();
        let n = b.batches.max(1) as f64;
        self.real_tokens_per_batch = b.real_tokens as f64 / n;
        self.padded_tokens_per_batch = b.padded_tokens as f64 / n;
    }
}

/// The timing section of the summary (local model only).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Timing {
    /// Every pass, after the warm-up: the figure to compare.
    pub steady: Rate,
    /// One run as a user sees it: scan, session creation, warm-up, first pass.
    pub end_to_end: Rate,
    /// Each pass over the corpus (several with --min-seconds).
    pub passes: Vec<Rate>,
    /// Reading and hashing the input.
    pub scan_s: f64,
    /// Session creation (all workers).
    pub load_s: f64,
    /// The warm-up texts (all workers).
    pub warmup_s: f64,
    /// Where the steady state's time went.
    pub phases: Phases,
    /// Model sessions on the device, each on its own thread.
    pub workers: usize,
    /// Whether the next batch was assembled while the model ran.
    pub overlap: bool,
    /// The passes went on until the steady state lasted this long.
    pub min_seconds: f64,
}

impl Timing {
    /// The steady and end-to-end rates from the passes and the set-up times.
    pub fn finish(&mut self) {
        let tokens = self.passes.iter().map(|p| p.tokens).sum();
        let seconds = self.passes.iter().map(|p| p.seconds).sum();
        self.steady = Rate::new(tokens, seconds);
        let first = self.passes.first().cloned().unwrap_or_default();
        self.end_to_end = Rate::new(first.tokens, self.scan_s + self.load_s + self.warmup_s + first.seconds);
        self.phases.finish();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steady_counts_every_pass_and_end_to_end_the_first_with_its_set_up() {
        let mut t = Timing {
            passes: vec![Rate::new(1000, 2.0), Rate::new(1000, 1.0), Rate::new(1000, 1.0)],
            scan_s: 0.5,
            load_s: 1.0,
            warmup_s: 0.5,
            ..Timing::default()
        };
        t.phases.engine = Breakdown { batches: 4, real_tokens: 3000, padded_tokens: 4000, ..Breakdown::default() };
        t.finish();
        assert_eq!(t.steady, Rate { tokens: 3000, seconds: 4.0, tokens_per_s: 750.0 });
        assert_eq!(t.end_to_end, Rate { tokens: 1000, seconds: 4.0, tokens_per_s: 250.0 });
        assert_eq!((t.phases.padding_share, t.phases.real_tokens_per_batch), (0.25, 750.0));
        assert_eq!(t.phases.padded_tokens_per_batch, 1000.0);
    }
}
