//! The second stage: a cross-encoder reads the task and a chunk together
//! and gives one relevance logit, more exact than the first stage's
//! embeddings but too slow for every chunk, so it rescores only the first
//! stage's best ([`crate::extract::ScoringConfig::rerank_top`]).
//!
//! [`CrossEncoder`] is the trait the engine calls (tests use a
//! deterministic one); [`Reranker`] runs an ONNX model from a folder with
//! `model.onnx` (inputs `input_ids`, `attention_mask`, `token_type_ids`;
//! output `score`, `[batch]`), a BERT `tokenizer.json` and a
//! `manifest.json` ([`RerankManifest`], its files' sha256 checked).
//!
//! ```
//! use scd_engine::rerank::Frame;
//! let frame = Frame { cls: 101, sep: 102, max_tokens: 8, query_max_tokens: 2 };
//! let x = frame.assemble(&[5, 6, 7], &[20, 21, 22, 23]);
//! assert_eq!(x.ids, vec![101, 5, 6, 102, 20, 21, 22, 102]);
//! assert_eq!(x.types, vec![0, 0, 0, 0, 1, 1, 1, 1]);
//! ```

mod input;
mod manifest;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use moka::sync::Cache;
use ort::session::Session;
use ort::value::Tensor;
use parking_lot::Mutex;
use sha2::{Digest, Sha256};
use tokenizers::Tokenizer;
use tracing::{info, instrument};

pub use self::input::{batches, pad, Frame, Padded, PairInput};
pub use self::manifest::{resolve_reranker, sha256_file, RerankManifest, CROSS_ENCODER, FILES};
use crate::cancel::Cancel;
use crate::encoder::{plain_tokenizer, session_builder, OrtConfig, OrtRuntime};
use crate::{Error, Result};

/// Pairs per model call at most.
pub const MAX_BATCH: usize = 16;

/// Logits kept at most (a 32-byte key and a float each, about 5 MiB with
/// the cache's own bookkeeping): a task's candidates come back at every
/// budget, in every variant of `scd-dev tune`, and in a session's next call.
pub const MAX_CACHED: u64 = 65_536;

/// Scores (query, passage) pairs: one relevance logit each, higher = more
/// relevant.
pub trait CrossEncoder: Send + Sync + std::fmt::Debug {
    /// The model's id (name and a digest).
    fn model_id(&self) -> &str;

    /// The passage a chunk of field `field` is read as.
    fn passage(&self, field: &str, text: &str) -> String;

    /// One logit per pair, in order; `cancel` is checked between batches.
    fn score(&self, pairs: &[(&str, &str)], cancel: &Cancel) -> Result<Vec<f32>>;
}

/// The ONNX cross-encoder of a model folder.
pub struct Reranker {
    manifest: RerankManifest,
    id: String,
    tokenizer: Tokenizer,
    tokenizer_path: PathBuf,
    frame: Frame,
    session: Mutex<Session>,
    onnx: PathBuf,
    /// sha256(query length, query, passage) → logit; holds no text.
    cache: Cache<[u8; 32], f32>,
}

/// The cache key of a pair: the query's length first, so no two pairs
/// share a key by where the query ends.
fn pair_key(query: &str, passage: &str) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update((query.len() as u64).to_le_bytes());
    h.update(query.as_bytes());
    h.update(passage.as_bytes());
    h.finalize().into()
}

impl std::fmt::Debug for Reranker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reranker").field("model", &self.id).finish()
    }
}

/// The names the graph must have.
const INPUTS: [&str; 3] = ["input_ids", "attention_mask", "token_type_ids"];
const OUTPUT: &str = "score";

impl Reranker {
    /// Loads the model in `dir`: the manifest (its kind, limits and the
    /// files' sha256), the tokenizer (`[CLS]` and `[SEP]` found by name) and
    /// an ONNX Runtime session set up as the encoder's (`config`).
    #[instrument(skip(config), fields(dir = %dir.display()))]
    pub fn load(dir: &Path, config: &OrtConfig) -> Result<Self> {
        let manifest = RerankManifest::load(dir)?;
        let rt = OrtRuntime::load(&config.lib_path)?;
        let tokenizer_path = dir.join("tokenizer.json");
        let tokenizer = plain_tokenizer(&tokenizer_path)?;
        let special = |name: &str| {
            tokenizer.token_to_id(name).map(i64::from).ok_or_else(|| Error::ModelShape {
                path: tokenizer_path.clone(),
                reason: format!("no {name} token in the vocabulary"),
            })
        };
        let frame = Frame {
            cls: special("[CLS]")?,
            sep: special("[SEP]")?,
            max_tokens: manifest.max_tokens,
            query_max_tokens: manifest.query_max_tokens,
        };
        let onnx = dir.join(FILES[0]);
        let (mut builder, provider) = session_builder(&rt, config, &manifest.session_config)?;
        let session = builder.commit_from_file(&onnx)?;
        let inputs: Vec<String> = session.inputs().iter().map(|i| i.name().to_string()).collect();
        let outputs: Vec<String> = session.outputs().iter().map(|o| o.name().to_string()).collect();
        let mut want = inputs.clone();
        want.sort();
        if want != ["attention_mask", "input_ids", "token_type_ids"] {
            let reason = format!("inputs {inputs:?}, expected {INPUTS:?}");
            return Err(Error::ModelShape { path: onnx, reason });
        }
        if !outputs.iter().any(|o| o == OUTPUT) {
            return Err(Error::ModelShape {
                path: onnx,
                reason: format!("no output {OUTPUT:?} (outputs: {outputs:?})"),
            });
        }
        let id = manifest.model_id();
        info!(model = %id, provider, "reranker ready");
        let cache = Cache::new(MAX_CACHED);
        Ok(Self { manifest, id, tokenizer, tokenizer_path, frame, session: Mutex::new(session), onnx, cache })
    }

    /// Logits in the cache now.
    pub fn cached(&self) -> u64 {
        self.cache.run_pending_tasks();
        self.cache.entry_count()
    }

    /// The manifest.
    pub fn manifest(&self) -> &RerankManifest {
        &self.manifest
    }

    /// The special tokens and limits inputs are assembled with.
    pub fn frame(&self) -> Frame {
        self.frame
    }

    /// Token ids of `text`, without special tokens.
    pub fn tokenize(&self, text: &str) -> Result<Vec<u32>> {
        let enc = self
            .tokenizer
            .encode(text, false)
            .map_err(|source| Error::Tokenizer { path: self.tokenizer_path.clone(), source })?;
        Ok(enc.get_ids().to_vec())
    }

    /// Every pair assembled ([`Frame::assemble`]); a query repeated across
    /// pairs is tokenized once.
    pub fn inputs(&self, pairs: &[(&str, &str)]) -> Result<Vec<PairInput>> {
        let mut queries: HashMap<&str, Vec<u32>> = HashMap::new();
        let mut out = Vec::with_capacity(pairs.len());
        for &(q, p) in pairs {
            if !queries.contains_key(q) {
                queries.insert(q, self.tokenize(q)?);
            }
            out.push(self.frame.assemble(&queries[q], &self.tokenize(p)?));
        }
        Ok(out)
    }

    /// One padded batch through the model: a logit per row.
    fn run(&self, rows: &[&PairInput]) -> Result<Vec<f32>> {
        let (n, len, ids, mask, types) = pad(rows);
        let inputs = ort::inputs![
            "input_ids" => Tensor::from_array(([n, len], ids))?,
            "attention_mask" => Tensor::from_array(([n, len], mask))?,
            "token_type_ids" => Tensor::from_array(([n, len], types))?,
        ];
        let mut session = self.session.lock();
        let outputs = session.run(inputs)?;
        let (shape, scores) = outputs[OUTPUT].try_extract_tensor::<f32>()?;
        let dims: Vec<i64> = shape.iter().copied().collect();
        if !(dims == [n as i64] || dims == [n as i64, 1]) {
            let reason = format!("output {OUTPUT:?} has shape {dims:?}, expected [{n}]");
            return Err(Error::ModelShape { path: self.onnx.clone(), reason });
        }
        Ok(scores.to_vec())
    }
}

impl CrossEncoder for Reranker {
    fn model_id(&self) -> &str {
        &self.id
    }

    fn passage(&self, field: &str, text: &str) -> String {
        self.manifest.passage(field, text)
    }

    /// Pairs scored before (same query, same passage) come from the cache;
    /// the rest go through the model.
    #[instrument(skip_all, fields(pairs = pairs.len(), model = %self.id))]
    fn score(&self, pairs: &[(&str, &str)], cancel: &Cancel) -> Result<Vec<f32>> {
        let keys: Vec<[u8; 32]> = pairs.iter().map(|&(q, p)| pair_key(q, p)).collect();
        let mut out: Vec<f32> = keys.iter().map(|k| self.cache.get(k).unwrap_or(f32::NAN)).collect();
        let miss: Vec<usize> = (0..pairs.len()).filter(|&i| out[i].is_nan()).collect();
        let todo: Vec<(&str, &str)> = miss.iter().map(|&i| pairs[i]).collect();
        let inputs = self.inputs(&todo)?;
        let lens: Vec<usize> = inputs.iter().map(|x| x.ids.len()).collect();
        for batch in batches(&lens, MAX_BATCH) {
            cancel.check("rerank")?;
            let rows: Vec<&PairInput> = batch.iter().map(|&i| &inputs[i]).collect();
            for (&j, s) in batch.iter().zip(self.run(&rows)?) {
                out[miss[j]] = s;
                if s.is_finite() {
                    self.cache.insert(keys[miss[j]], s);
                }
            }
        }
        Ok(out)
    }
}
