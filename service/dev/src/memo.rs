//! An encoder that remembers: a sweep's settings share their embeddings.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use scd_engine::encoder::{EncodeOptions, Encoded, Encoder, InputKind, OrtEncoder};

/// An encoder that embeds each distinct (kind, text) once, so a sweep's
/// settings share their embeddings (memory grows with the dataset: for
/// `--sweep` only).
pub(crate) struct Memo {
    inner: Arc<OrtEncoder>,
    seen: Mutex<MemoMap>,
}

impl Memo {
    pub(crate) fn new(inner: Arc<OrtEncoder>) -> Self {
        Self { inner, seen: Mutex::new(HashMap::new()) }
    }
}

/// (is a query, text) → embedding.
type MemoMap = HashMap<(bool, String), Arc<[f32]>>;

impl Encoder for Memo {
    fn model_id(&self) -> &str {
        self.inner.model_id()
    }
    fn dim(&self) -> usize {
        self.inner.dim()
    }
    fn max_tokens(&self) -> usize {
        self.inner.max_tokens()
    }
    fn relevance_floor(&self, kind: scd_engine::context::FieldKind) -> Option<f32> {
        self.inner.relevance_floor(kind)
    }
    fn count_tokens(&self, text: &str) -> scd_engine::Result<usize> {
        self.inner.count_tokens(text)
    }
    fn encode(&self, texts: &[&str], opts: &EncodeOptions) -> scd_engine::Result<Encoded> {
        let q = opts.kind == InputKind::Query;
        let mut missing: Vec<&str> = {
            let seen = self.seen.lock().expect("memo lock");
            texts.iter().copied().filter(|t| !seen.contains_key(&(q, (*t).to_string()))).collect()
        };
        missing.sort_unstable();
        missing.dedup();
        if !missing.is_empty() {
            let e = self.inner.encode(&missing, opts)?;
            let mut seen = self.seen.lock().expect("memo lock");
            for (i, t) in missing.iter().enumerate() {
                seen.insert((q, (*t).to_string()), Arc::from(e.row(i)));
            }
        }
        let seen = self.seen.lock().expect("memo lock");
        let mut data = Vec::with_capacity(texts.len() * self.dim());
        for t in texts {
            data.extend_from_slice(&seen[&(q, (*t).to_string())]);
        }
        Ok(Encoded { dim: self.dim(), data, tokens: vec![0; texts.len()], windows: vec![1; texts.len()] })
    }
    fn provider(&self) -> &str {
        self.inner.provider()
    }
}
