//! A deterministic encoder for tests, doctests and benches: feature hashing
//! of lower-cased words and character trigrams. No model files, no ONNX.

use sha2::{Digest, Sha256};

use super::{l2_normalize, EncodeOptions, Encoded, Encoder, LongInputPolicy};
use crate::context::FieldKind;
use crate::{Error, Result};

/// Bag-of-features encoder: similar wording gives similar vectors.
#[derive(Debug, Clone)]
pub struct HashEncoder {
    dim: usize,
    max_tokens: usize,
    id: String,
    /// [`Encoder::relevance_floor`] per kind: none unless set.
    floors: Vec<(FieldKind, f32)>,
}

impl HashEncoder {
    /// An encoder with `dim` dimensions that accepts `max_tokens` words.
    pub fn new(dim: usize, max_tokens: usize) -> Self {
        Self { dim: dim.max(8), max_tokens: max_tokens.max(3), id: format!("hash-{dim}"), floors: Vec::new() }
    }

    /// The same with `floor` as its relevance floor for fields of `kind`,
    /// as a model's manifest may have one (tests of follow-ups).
    pub fn with_relevance_floor(mut self, kind: FieldKind, floor: f32) -> Self {
        self.floors.retain(|(k, _)| *k != kind);
        self.floors.push((kind, floor));
        self
    }

    fn bucket(&self, feature: &str) -> (usize, f32) {
        let h = Sha256::digest(feature.as_bytes());
        let v = u64::from_le_bytes(h[..8].try_into().expect("8 bytes"));
        ((v % self.dim as u64) as usize, if h[8] & 1 == 0 { 1.0 } else { -1.0 })
    }
}

fn words(text: &str) -> impl Iterator<Item = String> + '_ {
    text.split(|c: char| !c.is_alphanumeric()).filter(|w| !w.is_empty()).map(|w| w.to_lowercase())
}

impl Encoder for HashEncoder {
    fn model_id(&self) -> &str {
        &self.id
    }

    fn dim(&self) -> usize {
        self.dim
    }

    fn max_tokens(&self) -> usize {
        self.max_tokens
    }

    fn relevance_floor(&self, kind: FieldKind) -> Option<f32> {
        self.floors.iter().find(|(k, _)| *k == kind).map(|&(_, f)| f)
    }

    fn count_tokens(&self, text: &str) -> Result<usize> {
        Ok(words(text).count())
    }

    fn encode(&self, texts: &[&str], opts: &EncodeOptions) -> Result<Encoded> {
        let mut data = vec![0f32; texts.len() * self.dim];
        let mut tokens = Vec::with_capacity(texts.len());
        let mut windows = Vec::with_capacity(texts.len());
        for (i, text) in texts.iter().enumerate() {
            let n = words(text).count() + 2;
            let window = self.max_tokens - 2;
            if n > self.max_tokens && opts.long_inputs == LongInputPolicy::Error {
                return Err(Error::InputTooLong { index: i, tokens: n, max_tokens: self.max_tokens });
            }
            let row = &mut data[i * self.dim..(i + 1) * self.dim];
            for w in words(text) {
                let (b, s) = self.bucket(&w);
                row[b] += 2.0 * s;
                let chars: Vec<char> = format!("#{w}#").chars().collect();
                for tri in chars.windows(3) {
                    let (b, s) = self.bucket(&tri.iter().collect::<String>());
                    row[b] += s;
                }
            }
            l2_normalize(row);
            tokens.push(n);
            windows.push((n - 2).div_ceil(window).max(1));
        }
        Ok(Encoded { dim: self.dim, data, tokens, windows })
    }

    fn provider(&self) -> &str {
        "hash"
    }
}
