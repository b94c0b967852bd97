//! The ONNX Runtime encoder.
//!
//! `ort` is built with `load-dynamic`: the process loads `libonnxruntime.so`
//! from a path the caller gives ([`OrtConfig::lib_path`], usually from
//! `SCD_ORT_LIB`), once, through [`OrtRuntime::load`]. A missing or wrong
//! library is an [`Error::OrtLibraryMissing`] / [`Error::OrtLibraryLoad`]
//! naming the path and the variable, never a panic.

use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use ort::environment::Environment;
use ort::session::builder::{GraphOptimizationLevel, SessionBuilder};
use ort::session::Session;
use ort::value::Tensor;
use rayon::prelude::*;
use tokenizers::Tokenizer;
use tracing::{debug, info, instrument};

use super::{
    l2_normalize, plan_batches, windows, EncodeOptions, Encoded, Encoder, InputKind, LongInputPolicy, Manifest,
    Sequence,
};
use crate::{Error, Result};

/// Texts per call from which tokenization runs on the rayon pool.
const PARALLEL_TOKENIZE_MIN: usize = 16;

/// Environment variable naming the ONNX Runtime library.
pub const ORT_LIB_ENV: &str = "SCD_ORT_LIB";

/// Where the model runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Device {
    /// ONNX Runtime's CPU provider.
    #[default]
    Cpu,
    /// The CUDA provider on this GPU ordinal (needs the `cuda` feature and
    /// onnxruntime-gpu's library). Registration failure is an error, never a
    /// silent CPU fallback.
    Cuda(i32),
}

impl Device {
    /// `cpu` or `cuda`.
    pub fn name(&self) -> &'static str {
        match self {
            Device::Cpu => "cpu",
            Device::Cuda(_) => "cuda",
        }
    }
}

/// How to build an [`OrtEncoder`].
#[derive(Debug, Clone)]
pub struct OrtConfig {
    /// Path of `libonnxruntime.so`.
    pub lib_path: PathBuf,
    /// Intra-op threads; 0 lets ONNX Runtime choose (one per core).
    pub intra_threads: usize,
    /// CPU or CUDA.
    pub device: Device,
    /// Padded tokens per model call (batch rows × longest row); 0 picks the
    /// device's default ([`OrtConfig::CPU_BATCH_TOKENS`] or [`OrtConfig::CUDA_BATCH_TOKENS`]).
    pub batch_tokens: usize,
    /// Rows per model call.
    pub max_batch: usize,
}

impl OrtConfig {
    /// CPU default for [`OrtConfig::batch_tokens`]: small batches keep the
    /// attention tensors in cache (measured in BENCHMARKS.md: 512 beats 8192
    /// by 2.2x on mixed-length HotpotQA paragraphs).
    pub const CPU_BATCH_TOKENS: usize = 512;
    /// GPU default for [`OrtConfig::batch_tokens`].
    pub const CUDA_BATCH_TOKENS: usize = 16384;

    /// Defaults for CPU inference with the library at `lib_path`.
    pub fn new(lib_path: impl Into<PathBuf>) -> Self {
        Self { lib_path: lib_path.into(), intra_threads: 0, device: Device::Cpu, batch_tokens: 0, max_batch: 64 }
    }

    /// The batch token budget in effect.
    pub fn effective_batch_tokens(&self) -> usize {
        match (self.batch_tokens, self.device) {
            (0, Device::Cpu) => Self::CPU_BATCH_TOKENS,
            (0, Device::Cuda(_)) => Self::CUDA_BATCH_TOKENS,
            (n, _) => n,
        }
    }
}

/// The loaded ONNX Runtime library and its environment (one per process).
#[derive(Debug, Clone)]
pub struct OrtRuntime {
    env: Environment,
    lib_path: PathBuf,
}

static RUNTIME: OnceLock<OrtRuntime> = OnceLock::new();
static RUNTIME_INIT: Mutex<()> = Mutex::new(());

impl OrtRuntime {
    /// Loads the library at `lib_path` (first call) or returns the runtime
    /// already loaded. Asking for a second, different library is an error.
    pub fn load(lib_path: &Path) -> Result<OrtRuntime> {
        if !lib_path.is_file() {
            return Err(Error::OrtLibraryMissing { path: lib_path.to_path_buf(), env_var: ORT_LIB_ENV });
        }
        let _guard = RUNTIME_INIT.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(rt) = RUNTIME.get() {
            if rt.lib_path != lib_path {
                return Err(Error::invalid(
                    "ort_lib",
                    format!(
                        "ONNX Runtime is already loaded from {}; cannot switch to {}",
                        rt.lib_path.display(),
                        lib_path.display()
                    ),
                ));
            }
            return Ok(rt.clone());
        }
        let builder = ort::init_from(lib_path).map_err(|source| Error::OrtLibraryLoad {
            path: lib_path.to_path_buf(),
            env_var: ORT_LIB_ENV,
            source,
        })?;
        let env = builder.with_name("scd").build()?;
        info!(lib = %lib_path.display(), "ONNX Runtime loaded");
        let rt = OrtRuntime { env, lib_path: lib_path.to_path_buf() };
        let _ = RUNTIME.set(rt.clone());
        Ok(rt)
    }

    /// The library path in use.
    pub fn lib_path(&self) -> &Path {
        &self.lib_path
    }
}

fn builder_err(e: ort::Error<SessionBuilder>) -> Error {
    Error::Ort(e.into())
}

/// An E5/BERT-style ONNX encoder with masked mean pooling.
pub struct OrtEncoder {
    manifest: Manifest,
    id: String,
    tokenizer: Tokenizer,
    tokenizer_path: PathBuf,
    lead: Vec<i64>,
    trail: Vec<i64>,
    session: Mutex<Session>,
    token_type_ids: bool,
    output: String,
    provider: &'static str,
    batch_tokens: usize,
    max_batch: usize,
}

impl std::fmt::Debug for OrtEncoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OrtEncoder").field("model", &self.id).field("provider", &self.provider).finish()
    }
}

impl OrtEncoder {
    /// Loads the model in `dir` (a folder with `manifest.json`, the ONNX file
    /// and `tokenizer.json`).
    #[instrument(skip(config), fields(dir = %dir.display()))]
    pub fn load(dir: &Path, config: &OrtConfig) -> Result<Self> {
        let manifest = Manifest::load(dir)?;
        let rt = OrtRuntime::load(&config.lib_path)?;
        let tokenizer_path = dir.join("tokenizer.json");
        let mut tokenizer = Tokenizer::from_file(&tokenizer_path)
            .map_err(|source| Error::Tokenizer { path: tokenizer_path.clone(), source })?;
        // SCD decides what happens to long inputs; the tokenizer never truncates or pads.
        tokenizer.with_truncation(None).map_err(|source| Error::Tokenizer { path: tokenizer_path.clone(), source })?;
        tokenizer.with_padding(None);

        let (lead, trail) = special_frame(&tokenizer, &tokenizer_path)?;
        if lead.len() + trail.len() + 1 > manifest.max_tokens {
            return Err(Error::invalid("manifest.max_tokens", "smaller than the special tokens around a text"));
        }

        let onnx = dir.join(&manifest.onnx);
        if !onnx.is_file() {
            return Err(Error::ModelShape { path: onnx, reason: "file missing (run models/setup.sh)".into() });
        }
        let mut builder =
            Session::builder(&rt.env)?.with_optimization_level(GraphOptimizationLevel::All).map_err(builder_err)?;
        if config.intra_threads > 0 {
            builder = builder.with_intra_threads(config.intra_threads).map_err(builder_err)?;
        }
        let provider = register_provider(builder, config.device)?;
        let (mut builder, provider) = provider;
        let session = builder.commit_from_file(&onnx)?;

        let inputs: Vec<String> = session.inputs().iter().map(|i| i.name().to_string()).collect();
        for needed in ["input_ids", "attention_mask"] {
            if !inputs.iter().any(|n| n == needed) {
                return Err(Error::ModelShape {
                    path: onnx,
                    reason: format!("no input named {needed} (inputs: {inputs:?})"),
                });
            }
        }
        if let Some(other) =
            inputs.iter().find(|n| !["input_ids", "attention_mask", "token_type_ids"].contains(&n.as_str()))
        {
            return Err(Error::ModelShape { path: onnx, reason: format!("unexpected input {other}") });
        }
        let token_type_ids = inputs.iter().any(|n| n == "token_type_ids");
        let outputs: Vec<String> = session.outputs().iter().map(|o| o.name().to_string()).collect();
        let output = if outputs.iter().any(|o| o == "last_hidden_state") {
            "last_hidden_state".to_string()
        } else {
            outputs
                .first()
                .cloned()
                .ok_or_else(|| Error::ModelShape { path: onnx.clone(), reason: "no outputs".into() })?
        };
        let digest =
            manifest.files.get(&manifest.onnx).map(|h| h.chars().take(12).collect::<String>()).unwrap_or_default();
        let id = if digest.is_empty() { manifest.name.clone() } else { format!("{}@{digest}", manifest.name) };
        info!(model = %id, provider, token_type_ids, "encoder ready");
        Ok(Self {
            manifest,
            id,
            tokenizer,
            tokenizer_path,
            lead,
            trail,
            session: Mutex::new(session),
            token_type_ids,
            output,
            provider,
            batch_tokens: config.effective_batch_tokens(),
            max_batch: config.max_batch.max(1),
        })
    }

    /// The model's manifest.
    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// Token ids of `text` (with the query/passage prefix and special tokens).
    pub fn tokenize(&self, text: &str, kind: InputKind) -> Result<Vec<u32>> {
        let full = format!("{}{}", self.prefix(kind), text);
        let enc = self
            .tokenizer
            .encode(full.as_str(), true)
            .map_err(|source| Error::Tokenizer { path: self.tokenizer_path.clone(), source })?;
        Ok(enc.get_ids().to_vec())
    }

    fn prefix(&self, kind: InputKind) -> &str {
        match kind {
            InputKind::Query => &self.manifest.query_prefix,
            InputKind::Passage => &self.manifest.passage_prefix,
        }
    }

    /// Runs one padded batch and returns the mean-pooled (unnormalized) rows.
    fn run_batch(&self, seqs: &[&Sequence]) -> Result<Vec<Vec<f32>>> {
        let rows = seqs.len();
        let len = seqs.iter().map(|s| s.ids.len()).max().unwrap_or(0);
        let mut ids = vec![0i64; rows * len];
        let mut mask = vec![0i64; rows * len];
        for (r, s) in seqs.iter().enumerate() {
            ids[r * len..r * len + s.ids.len()].copy_from_slice(&s.ids);
            mask[r * len..r * len + s.ids.len()].iter_mut().for_each(|m| *m = 1);
        }
        let mut inputs = ort::inputs![
            "input_ids" => Tensor::from_array(([rows, len], ids))?,
            "attention_mask" => Tensor::from_array(([rows, len], mask))?,
        ];
        if self.token_type_ids {
            inputs.push(("token_type_ids".into(), Tensor::from_array(([rows, len], vec![0i64; rows * len]))?.into()));
        }
        let mut session = self.session.lock().unwrap_or_else(|p| p.into_inner());
        let outputs = session.run(inputs)?;
        let (shape, hidden) = outputs[self.output.as_str()].try_extract_tensor::<f32>()?;
        let dim = self.manifest.dim;
        if shape.len() != 3 || shape[0] as usize != rows || shape[1] as usize != len || shape[2] as usize != dim {
            return Err(Error::ModelShape {
                path: self.manifest.onnx.clone().into(),
                reason: format!("output shape {shape:?}, expected [{rows}, {len}, {dim}]"),
            });
        }
        Ok(seqs
            .iter()
            .enumerate()
            .map(|(r, s)| {
                let mut v = vec![0f32; dim];
                let n = s.ids.len();
                for t in 0..n {
                    let h = &hidden[(r * len + t) * dim..(r * len + t + 1) * dim];
                    v.iter_mut().zip(h).for_each(|(a, b)| *a += b);
                }
                v.iter_mut().for_each(|a| *a /= n as f32);
                v
            })
            .collect())
    }
}

/// The special tokens the post-processor puts before and after a text.
fn special_frame(tok: &Tokenizer, path: &Path) -> Result<(Vec<i64>, Vec<i64>)> {
    let enc = tok.encode("a", true).map_err(|source| Error::Tokenizer { path: path.to_path_buf(), source })?;
    let ids = enc.get_ids();
    let mask = enc.get_special_tokens_mask();
    let first = mask.iter().position(|&m| m == 0).unwrap_or(ids.len());
    let last = mask.iter().rposition(|&m| m == 0).map(|p| p + 1).unwrap_or(first);
    Ok((ids[..first].iter().map(|&i| i as i64).collect(), ids[last..].iter().map(|&i| i as i64).collect()))
}

type Registered = (SessionBuilder, &'static str);

#[cfg(feature = "cuda")]
fn register_provider(builder: SessionBuilder, device: Device) -> Result<Registered> {
    match device {
        Device::Cpu => Ok((builder, "cpu")),
        Device::Cuda(id) => {
            let ep = ort::ep::CUDA::default().with_device_id(id).with_tf32(true).build().error_on_failure();
            let builder = builder.with_execution_providers([ep]).map_err(|e| Error::ProviderUnavailable {
                provider: "cuda",
                reason: format!(
                    "{e} (needs libonnxruntime_providers_cuda.so beside {ORT_LIB_ENV}'s library, and CUDA 13 + cuDNN 9 on the loader path)"
                ),
            })?;
            Ok((builder, "cuda"))
        }
    }
}

#[cfg(not(feature = "cuda"))]
fn register_provider(builder: SessionBuilder, device: Device) -> Result<Registered> {
    match device {
        Device::Cpu => Ok((builder, "cpu")),
        Device::Cuda(_) => Err(Error::ProviderUnavailable {
            provider: "cuda",
            reason: "this build has no CUDA support; rebuild with `--features cuda`".into(),
        }),
    }
}

impl Encoder for OrtEncoder {
    fn model_id(&self) -> &str {
        &self.id
    }

    fn dim(&self) -> usize {
        self.manifest.dim
    }

    fn max_tokens(&self) -> usize {
        self.manifest.max_tokens
    }

    fn count_tokens(&self, text: &str) -> Result<usize> {
        let enc = self
            .tokenizer
            .encode(text, false)
            .map_err(|source| Error::Tokenizer { path: self.tokenizer_path.clone(), source })?;
        Ok(enc.len())
    }

    #[instrument(skip_all, fields(texts = texts.len(), model = %self.id))]
    fn encode(&self, texts: &[&str], opts: &EncodeOptions) -> Result<Encoded> {
        let dim = self.manifest.dim;
        let max = self.manifest.max_tokens;
        let window = max - self.lead.len() - self.trail.len();
        // rayon only pays off on larger batches: its idle workers spin and
        // compete with ONNX Runtime's threads for the same cores
        let tokenized: Vec<Result<Vec<u32>>> = if texts.len() >= PARALLEL_TOKENIZE_MIN {
            texts.par_iter().map(|t| self.tokenize(t, opts.kind)).collect()
        } else {
            texts.iter().map(|t| self.tokenize(t, opts.kind)).collect()
        };
        let mut seqs = Vec::new();
        let mut tokens = vec![0usize; texts.len()];
        let mut nwin = vec![0usize; texts.len()];
        for (i, ids) in tokenized.into_iter().enumerate() {
            let ids: Vec<i64> = ids?.into_iter().map(i64::from).collect();
            if ids.len() > max && opts.long_inputs == LongInputPolicy::Error {
                return Err(Error::InputTooLong { index: i, tokens: ids.len(), max_tokens: max });
            }
            let content = &ids[self.lead.len()..ids.len() - self.trail.len()];
            let w = windows(i, &self.lead, content, &self.trail, window);
            tokens[i] = w.iter().map(|s| s.ids.len()).sum();
            nwin[i] = w.len();
            seqs.extend(w);
        }
        let lens: Vec<usize> = seqs.iter().map(|s| s.ids.len()).collect();
        let batches = plan_batches(&lens, self.batch_tokens, self.max_batch);
        debug!(sequences = seqs.len(), batches = batches.len(), "encoding");
        let mut acc = vec![0f32; texts.len() * dim];
        let mut weight = vec![0f32; texts.len()];
        for batch in &batches {
            let group: Vec<&Sequence> = batch.iter().map(|&i| &seqs[i]).collect();
            for (s, pooled) in group.iter().zip(self.run_batch(&group)?) {
                let row = &mut acc[s.text * dim..(s.text + 1) * dim];
                row.iter_mut().zip(&pooled).for_each(|(a, p)| *a += s.weight * p);
                weight[s.text] += s.weight;
            }
        }
        for (i, w) in weight.iter().enumerate() {
            let row = &mut acc[i * dim..(i + 1) * dim];
            if *w > 0.0 {
                row.iter_mut().for_each(|a| *a /= w);
            }
            if self.manifest.normalize {
                l2_normalize(row);
            }
        }
        Ok(Encoded { dim, data: acc, tokens, windows: nwin })
    }

    fn provider(&self) -> &str {
        self.provider
    }
}
