//! The ONNX Runtime encoder.
//!
//! `ort` is built with `load-dynamic`: the process loads `libonnxruntime.so`
//! from a path the caller gives ([`OrtConfig::lib_path`], usually from
//! `SCD_ORT_LIB`), once, through [`OrtRuntime::load`]. A missing or wrong
//! library is an [`Error::OrtLibraryMissing`] / [`Error::OrtLibraryLoad`]
//! naming the path and the variable, never a panic.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use ort::environment::Environment;
use ort::memory::{AllocationDevice, Allocator, AllocatorType, MemoryInfo, MemoryType};
use ort::session::builder::{GraphOptimizationLevel, SessionBuilder};
use ort::session::Session;
use ort::value::{Tensor, TensorValueType};
use parking_lot::FairMutex;
use rayon::prelude::*;
use tokenizers::Tokenizer;
use tracing::{debug, info, instrument, warn};

use super::batch::{drive, BatchTimes, Breakdown, HostBatch};
use super::cpu::int8_saturates;
use super::{
    l2_normalize, plan_batches, windows, EncodeOptions, EncodeProgress, Encoded, Encoder, InputKind, LongInputPolicy,
    Manifest, Sequence,
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
    /// Whether idle intra-op threads spin before they sleep (ONNX Runtime's
    /// default, on): lower latency between model calls, at the price of CPU
    /// that other work on the machine could use (not measured yet: see
    /// BENCHMARKS.md, issue #25).
    pub intra_spinning: bool,
    /// CPU or CUDA.
    pub device: Device,
    /// Padded tokens per model call (batch rows × longest row); 0 picks the
    /// device's default ([`OrtConfig::CPU_BATCH_TOKENS`] or [`OrtConfig::CUDA_BATCH_TOKENS`]).
    pub batch_tokens: usize,
    /// Rows per model call; 0 picks the device's default
    /// ([`OrtConfig::CPU_MAX_BATCH`] or [`OrtConfig::CUDA_MAX_BATCH`]).
    pub max_batch: usize,
    /// Run through IoBinding with the graph's pooled `sentence_embedding`
    /// output when the model has one: only `[rows, dim]` leaves the device,
    /// and on CUDA the inputs are staged in pinned host memory. `false` (or a
    /// model without that output) runs plainly and pools `last_hidden_state`
    /// on the host.
    pub io_binding: bool,
    /// With IoBinding on CUDA, bind the pooled output to device memory and
    /// copy it back after the run, so the device→host copy is timed apart
    /// from the model ([`Breakdown::d2h_s`]); off, the output is bound to
    /// pinned host memory and ONNX Runtime copies it inside the run.
    pub split_copies: bool,
}

impl OrtConfig {
    /// CPU default for [`OrtConfig::batch_tokens`]: small batches keep the
    /// attention tensors in cache (measured in BENCHMARKS.md: 512 beats 8192
    /// by 2.2x on mixed-length HotpotQA paragraphs).
    pub const CPU_BATCH_TOKENS: usize = 512;
    /// GPU default for [`OrtConfig::batch_tokens`].
    pub const CUDA_BATCH_TOKENS: usize = 16384;

    /// CPU default for [`OrtConfig::max_batch`].
    pub const CPU_MAX_BATCH: usize = 64;
    /// GPU default for [`OrtConfig::max_batch`]: short texts still fill the
    /// token budget.
    pub const CUDA_MAX_BATCH: usize = 1024;

    /// Defaults for CPU inference with the library at `lib_path`.
    pub fn new(lib_path: impl Into<PathBuf>) -> Self {
        Self {
            lib_path: lib_path.into(),
            intra_threads: 0,
            intra_spinning: true,
            device: Device::Cpu,
            batch_tokens: 0,
            max_batch: 0,
            io_binding: true,
            split_copies: false,
        }
    }

    /// The rows-per-call cap in effect.
    pub fn effective_max_batch(&self) -> usize {
        match (self.max_batch, self.device) {
            (0, Device::Cpu) => Self::CPU_MAX_BATCH,
            (0, Device::Cuda(_)) => Self::CUDA_MAX_BATCH,
            (n, _) => n,
        }
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

/// A session builder on `rt` with `config`'s threads, spinning and device,
/// ONNX Runtime's exact int8 kernel where its default one saturates
/// ([`int8_saturates`]), and `entries` (a manifest's `session_config`): how
/// every model of SCD runs (the encoder, the reranker). Also the provider's name.
pub(crate) fn session_builder(
    rt: &OrtRuntime,
    config: &OrtConfig,
    entries: &std::collections::BTreeMap<String, String>,
) -> Result<Registered> {
    let mut builder =
        Session::builder(&rt.env)?.with_optimization_level(GraphOptimizationLevel::All).map_err(builder_err)?;
    if config.intra_threads > 0 {
        builder = builder.with_intra_threads(config.intra_threads).map_err(builder_err)?;
    }
    if !config.intra_spinning {
        builder = builder.with_intra_op_spinning(false).map_err(builder_err)?;
    }
    if int8_saturates() {
        debug!("x86-64 CPU without VNNI: exact U8U8 kernel for any int8 MatMuls (session.x64quantprecision)");
        builder = builder.with_config_entry("session.x64quantprecision", "1").map_err(builder_err)?;
    }
    for (key, value) in entries {
        builder = builder.with_config_entry(key, value).map_err(builder_err)?;
    }
    register_provider(builder, config.device)
}

/// Name of the pooled output the models/ script adds to every graph.
const POOLED_OUTPUT: &str = "sentence_embedding";

/// The session and what runs beside it (behind one lock: ONNX Runtime's
/// `Run` is thread-safe, but IoBinding runs are not).
struct Runner {
    session: Session,
    /// Page-locked host memory for inputs (CUDA only).
    pinned: Option<Allocator>,
    /// Where bound outputs land: host memory (pinned on CUDA), or device
    /// memory when `device_output`.
    output_memory: Option<MemoryInfo<'static>>,
    /// The bound output stays on the device and is copied back after the run.
    device_output: bool,
}

/// Texts tokenized and cut into windows: the CPU half of [`OrtEncoder::encode`],
/// made by [`OrtEncoder::prepare`] so a caller can tokenize the next block
/// while the model runs this one ([`OrtEncoder::run_prepared`]).
#[derive(Debug, Clone)]
pub struct Prepared {
    seqs: Vec<Sequence>,
    tokens: Vec<usize>,
    windows: Vec<usize>,
}

impl Prepared {
    /// Number of texts.
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// True when there are no texts.
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }
}

/// An E5/BERT-style ONNX encoder with masked mean pooling.
pub struct OrtEncoder {
    manifest: Manifest,
    id: String,
    tokenizer: Tokenizer,
    tokenizer_path: PathBuf,
    lead: Vec<i64>,
    trail: Vec<i64>,
    /// Handed over in arrival order ([`FairMutex`]): a context's encode
    /// takes it once per batch, so a one-text call (a new task) that arrives
    /// meanwhile runs after the batch in progress, not after the whole
    /// context nor behind callers that came later (std's mutex promises no
    /// order; in a test it happened to behave, see BENCHMARKS.md).
    runner: FairMutex<Runner>,
    token_type_ids: bool,
    output: String,
    /// The graph's pooled output is used (through IoBinding).
    bound: bool,
    provider: &'static str,
    batch_tokens: usize,
    max_batch: usize,
    /// Told of each call and model batch.
    progress: Option<Arc<dyn EncodeProgress>>,
}

impl std::fmt::Debug for OrtEncoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OrtEncoder").field("model", &self.id).field("provider", &self.provider).finish()
    }
}

/// The tokenizer in `path`, set to neither truncate nor pad: SCD decides
/// what happens to long inputs (the encoder's and the reranker's).
pub(crate) fn plain_tokenizer(path: &Path) -> Result<Tokenizer> {
    let tokenizer_error = |source| Error::Tokenizer { path: path.to_path_buf(), source };
    let mut tokenizer = Tokenizer::from_file(path).map_err(tokenizer_error)?;
    tokenizer.with_truncation(None).map_err(tokenizer_error)?;
    tokenizer.with_padding(None);
    Ok(tokenizer)
}

impl OrtEncoder {
    /// Loads the model in `dir` (a folder with `manifest.json`, the ONNX file
    /// and `tokenizer.json`).
    #[instrument(skip(config), fields(dir = %dir.display()))]
    pub fn load(dir: &Path, config: &OrtConfig) -> Result<Self> {
        let manifest = Manifest::load(dir)?;
        let rt = OrtRuntime::load(&config.lib_path)?;
        let tokenizer_path = dir.join("tokenizer.json");
        let tokenizer = plain_tokenizer(&tokenizer_path)?;

        let (lead, trail) = special_frame(&tokenizer, &tokenizer_path)?;
        if lead.len() + trail.len() + 1 > manifest.max_tokens {
            return Err(Error::invalid("manifest.max_tokens", "smaller than the special tokens around a text"));
        }

        let onnx = dir.join(&manifest.onnx);
        if !onnx.is_file() {
            return Err(Error::ModelShape { path: onnx, reason: "file missing (run models/setup.sh)".into() });
        }
        let (mut builder, provider) = session_builder(&rt, config, &manifest.session_config)?;
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
        let bound = config.io_binding && outputs.iter().any(|o| o == POOLED_OUTPUT);
        let (pinned, output_memory) = if bound { bound_memory(&session, config.device)? } else { (None, None) };
        let device_output = bound && config.split_copies && matches!(config.device, Device::Cuda(_));
        let output_memory = match (device_output, config.device) {
            (true, Device::Cuda(id)) => {
                Some(MemoryInfo::new(AllocationDevice::CUDA, id, AllocatorType::Device, MemoryType::Default)?)
            }
            _ => output_memory,
        };
        let id = manifest.model_id();
        info!(model = %id, provider, token_type_ids, io_binding = bound, "encoder ready");
        Ok(Self {
            manifest,
            id,
            tokenizer,
            tokenizer_path,
            lead,
            trail,
            runner: FairMutex::new(Runner { session, pinned, output_memory, device_output }),
            token_type_ids,
            output,
            bound,
            provider,
            batch_tokens: config.effective_batch_tokens(),
            max_batch: config.effective_max_batch(),
            progress: None,
        })
    }

    /// This encoder telling `progress` of each call and model batch.
    pub fn with_progress(mut self, progress: Arc<dyn EncodeProgress>) -> Self {
        self.progress = Some(progress);
        self
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

    /// Padded tokens per model call in effect.
    pub fn batch_tokens(&self) -> usize {
        self.batch_tokens
    }

    /// Rows per model call in effect.
    pub fn max_batch_rows(&self) -> usize {
        self.max_batch
    }

    /// True when batches run through IoBinding with the graph's pooled output.
    pub fn uses_io_binding(&self) -> bool {
        self.bound
    }

    /// Tokenizes `texts` and cuts over-long ones into windows (or fails with
    /// [`Error::InputTooLong`] naming the text, per `opts`). Pure CPU work;
    /// safe to run on another thread while [`OrtEncoder::run_prepared`] runs.
    pub fn prepare(&self, texts: &[&str], opts: &EncodeOptions) -> Result<Prepared> {
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
        Ok(Prepared { seqs, tokens, windows: nwin })
    }

    /// Runs the model over prepared texts: length-sorted batches under the
    /// token budget, window averages, normalization.
    #[instrument(skip_all, fields(texts = prepared.len(), model = %self.id))]
    pub fn run_prepared(&self, prepared: &Prepared) -> Result<Encoded> {
        self.run_prepared_cancellable(prepared, &crate::cancel::Cancel::new())
    }

    /// [`OrtEncoder::run_prepared`], checking `cancel` before each batch.
    pub fn run_prepared_cancellable(&self, prepared: &Prepared, cancel: &crate::cancel::Cancel) -> Result<Encoded> {
        Ok(self.run_timed(prepared, cancel, false)?.0)
    }

    /// [`OrtEncoder::run_prepared`] with the time of each phase: padded
    /// batch assembly, host→device, the model, device→host, pooling
    /// ([`Breakdown`]). With `overlap`, a producer thread assembles the next
    /// batches while the model runs the current one; the embeddings are the
    /// same, in the same order.
    pub fn run_prepared_timed(&self, prepared: &Prepared, overlap: bool) -> Result<(Encoded, Breakdown)> {
        self.run_timed(prepared, &crate::cancel::Cancel::new(), overlap)
    }

    fn run_timed(
        &self,
        prepared: &Prepared,
        cancel: &crate::cancel::Cancel,
        overlap: bool,
    ) -> Result<(Encoded, Breakdown)> {
        let dim = self.manifest.dim;
        let n = prepared.len();
        let seqs = &prepared.seqs;
        let lens: Vec<usize> = seqs.iter().map(|s| s.ids.len()).collect();
        let plan = plan_batches(&lens, self.batch_tokens, self.max_batch);
        debug!(sequences = seqs.len(), batches = plan.len(), overlap, "encoding");
        let progress = self.progress.as_deref();
        if let Some(p) = progress {
            p.begin(n, lens.iter().sum());
        }
        let mut acc = vec![0f32; n * dim];
        let mut weight = vec![0f32; n];
        let run = |batch: &HostBatch| {
            cancel.check("embed")?;
            self.run_batch(batch)
        };
        let consume = |index: usize, pooled: Vec<f32>| {
            for (&i, row) in plan[index].iter().zip(pooled.chunks_exact(dim)) {
                let s = &seqs[i];
                let out = &mut acc[s.text * dim..(s.text + 1) * dim];
                out.iter_mut().zip(row).for_each(|(a, p)| *a += s.weight * p);
                weight[s.text] += s.weight;
            }
            if let Some(p) = progress {
                p.advance(plan[index].iter().map(|&i| lens[i]).sum());
            }
        };
        let mut breakdown = drive(seqs, &plan, overlap, run, consume)?;
        let t = Instant::now();
        for (i, w) in weight.iter().enumerate() {
            let row = &mut acc[i * dim..(i + 1) * dim];
            if *w > 0.0 {
                row.iter_mut().for_each(|a| *a /= w);
            }
            if self.manifest.normalize {
                l2_normalize(row);
            }
        }
        let spent = t.elapsed().as_secs_f64();
        breakdown.pool_s += spent;
        breakdown.total_s += spent;
        let enc = Encoded { dim, data: acc, tokens: prepared.tokens.clone(), windows: prepared.windows.clone() };
        Ok((enc, breakdown))
    }

    /// Runs one padded batch; returns `rows * dim` mean-pooled (unnormalized)
    /// floats and the time of each phase.
    fn run_batch(&self, batch: &HostBatch) -> Result<(Vec<f32>, BatchTimes)> {
        let mut runner = self.runner.lock();
        if self.bound {
            return self.run_bound(&mut runner, batch);
        }
        let (rows, len) = (batch.rows, batch.len);
        let t = Instant::now();
        let mut inputs = ort::inputs![
            "input_ids" => Tensor::from_array(([rows, len], batch.ids.clone()))?,
            "attention_mask" => Tensor::from_array(([rows, len], batch.mask.clone()))?,
        ];
        if self.token_type_ids {
            inputs.push(("token_type_ids".into(), Tensor::from_array(([rows, len], vec![0i64; rows * len]))?.into()));
        }
        let mut times = BatchTimes { h2d: t.elapsed(), ..BatchTimes::default() };
        let t = Instant::now();
        let outputs = runner.session.run(inputs)?;
        times.model = t.elapsed();
        let t = Instant::now();
        let (shape, hidden) = outputs[self.output.as_str()].try_extract_tensor::<f32>()?;
        let dim = self.manifest.dim;
        self.check_shape(shape, &[rows, len, dim])?;
        let mut pooled = vec![0f32; rows * dim];
        for r in 0..rows {
            let v = &mut pooled[r * dim..(r + 1) * dim];
            let n = batch.mask[r * len..(r + 1) * len].iter().filter(|&&m| m == 1).count();
            for t in 0..n {
                let h = &hidden[(r * len + t) * dim..(r * len + t + 1) * dim];
                v.iter_mut().zip(h).for_each(|(a, b)| *a += b);
            }
            v.iter_mut().for_each(|a| *a /= n.max(1) as f32);
        }
        times.pool = t.elapsed();
        Ok((pooled, times))
    }

    /// The IoBinding path: inputs staged (in pinned memory on CUDA), bound and
    /// synchronized (the host→device copy, timed apart), only the pooled
    /// `[rows, dim]` output bound: to host memory, or with split copies to
    /// device memory and copied back after the run (timed apart).
    fn run_bound(&self, runner: &mut Runner, batch: &HostBatch) -> Result<(Vec<f32>, BatchTimes)> {
        let (rows, len) = (batch.rows, batch.len);
        let t = Instant::now();
        let staged = |runner: &Runner, src: Option<&[i64]>| -> Result<Tensor<i64>> {
            Ok(match (&runner.pinned, src) {
                (Some(alloc), _) => {
                    let mut t = Tensor::<i64>::new(alloc, [rows, len])?;
                    match src {
                        Some(s) => t.extract_tensor_mut().1.copy_from_slice(s),
                        None => t.extract_tensor_mut().1.fill(0),
                    }
                    t
                }
                (None, Some(s)) => Tensor::from_array(([rows, len], s.to_vec()))?,
                (None, None) => Tensor::from_array(([rows, len], vec![0i64; rows * len]))?,
            })
        };
        let ids = staged(runner, Some(&batch.ids))?;
        let mask = staged(runner, Some(&batch.mask))?;
        let mut binding = runner.session.create_binding()?;
        binding.bind_input("input_ids", &ids)?;
        binding.bind_input("attention_mask", &mask)?;
        if self.token_type_ids {
            binding.bind_input("token_type_ids", &staged(runner, None)?)?;
        }
        binding.synchronize_inputs()?;
        let mut times = BatchTimes { h2d: t.elapsed(), ..BatchTimes::default() };
        let memory = runner.output_memory.as_ref().expect("bound encoders have an output memory");
        binding.bind_output_to_device(POOLED_OUTPUT, memory)?;
        let t = Instant::now();
        let mut outputs = runner.session.run_binding(&binding)?;
        times.model = t.elapsed();
        let t = Instant::now();
        let pooled = if runner.device_output {
            let on_device = outputs.remove(POOLED_OUTPUT).expect("the pooled output is bound");
            let host = on_device.downcast::<TensorValueType<f32>>()?.to(AllocationDevice::CPU, 0)?;
            let (shape, pooled) = host.try_extract_tensor::<f32>()?;
            self.check_shape(shape, &[rows, self.manifest.dim])?;
            pooled.to_vec()
        } else {
            let (shape, pooled) = outputs[POOLED_OUTPUT].try_extract_tensor::<f32>()?;
            self.check_shape(shape, &[rows, self.manifest.dim])?;
            pooled.to_vec()
        };
        times.d2h = t.elapsed();
        Ok((pooled, times))
    }

    fn check_shape(&self, shape: &[i64], want: &[usize]) -> Result<()> {
        if shape.len() != want.len() || shape.iter().zip(want).any(|(&a, &b)| a as usize != b) {
            return Err(Error::ModelShape {
                path: self.manifest.onnx.clone().into(),
                reason: format!("output shape {shape:?}, expected {want:?}"),
            });
        }
        Ok(())
    }
}

/// Memory for the IoBinding path: a pinned-input allocator and pinned output
/// memory on CUDA; plain host output memory on CPU. Pinned memory is an
/// optimization: when the provider offers none, inputs and outputs use plain
/// host memory (ONNX Runtime copies them), with a warning.
fn bound_memory(session: &Session, device: Device) -> Result<(Option<Allocator>, Option<MemoryInfo<'static>>)> {
    let host = || MemoryInfo::new(AllocationDevice::CPU, 0, AllocatorType::Device, MemoryType::Default);
    let Device::Cuda(id) = device else { return Ok((None, Some(host()?))) };
    let pinned = |kind| MemoryInfo::new(AllocationDevice::CUDA_PINNED, id, AllocatorType::Device, kind);
    match pinned(MemoryType::CPUInput).and_then(|m| Allocator::new(session, m)) {
        Ok(alloc) => Ok((Some(alloc), Some(pinned(MemoryType::CPUOutput)?))),
        Err(e) => {
            warn!(error = %e, "no pinned host memory from the CUDA provider; binding plain host memory");
            Ok((None, Some(host()?)))
        }
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

pub(crate) type Registered = (SessionBuilder, &'static str);

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

    fn relevance_floor(&self, kind: crate::context::FieldKind) -> Option<f32> {
        self.manifest.relevance_floor_for(kind)
    }

    fn count_tokens(&self, text: &str) -> Result<usize> {
        let enc = self
            .tokenizer
            .encode(text, false)
            .map_err(|source| Error::Tokenizer { path: self.tokenizer_path.clone(), source })?;
        Ok(enc.len())
    }

    fn encode(&self, texts: &[&str], opts: &EncodeOptions) -> Result<Encoded> {
        self.run_prepared(&self.prepare(texts, opts)?)
    }

    fn encode_cancellable(
        &self,
        texts: &[&str],
        opts: &EncodeOptions,
        cancel: &crate::cancel::Cancel,
    ) -> Result<Encoded> {
        cancel.check("embed")?;
        self.run_prepared_cancellable(&self.prepare(texts, opts)?, cancel)
    }

    fn provider(&self) -> &str {
        self.provider
    }
}

/// An [`OrtEncoder`] whose ONNX Runtime session is made on the first
/// [`Encoder::encode`]: the id, the dimension and token counts come from
/// the manifest and the tokenizer alone. A call whose embeddings are all in
/// the cache (a second `scd compress` on the same files) never loads the
/// model.
pub struct LazyOrtEncoder {
    dir: PathBuf,
    config: OrtConfig,
    manifest: Manifest,
    id: String,
    tokenizer: Tokenizer,
    tokenizer_path: PathBuf,
    loaded: Mutex<Option<Arc<OrtEncoder>>>,
    progress: Option<Arc<dyn EncodeProgress>>,
}

impl std::fmt::Debug for LazyOrtEncoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LazyOrtEncoder").field("model", &self.id).finish()
    }
}

impl LazyOrtEncoder {
    /// The model in `dir`, its manifest and tokenizer read now, its session
    /// made when first needed (errors then name what failed).
    pub fn new(dir: &Path, config: &OrtConfig) -> Result<Self> {
        let manifest = Manifest::load(dir)?;
        let tokenizer_path = dir.join("tokenizer.json");
        let mut tokenizer = Tokenizer::from_file(&tokenizer_path)
            .map_err(|source| Error::Tokenizer { path: tokenizer_path.clone(), source })?;
        tokenizer.with_truncation(None).map_err(|source| Error::Tokenizer { path: tokenizer_path.clone(), source })?;
        tokenizer.with_padding(None);
        let onnx = dir.join(&manifest.onnx);
        if !onnx.is_file() {
            return Err(Error::ModelShape { path: onnx, reason: "file missing (run models/setup.sh)".into() });
        }
        Ok(Self {
            dir: dir.to_path_buf(),
            config: config.clone(),
            id: manifest.model_id(),
            manifest,
            tokenizer,
            tokenizer_path,
            loaded: Mutex::new(None),
            progress: None,
        })
    }

    /// The encoder, once loaded, telling `progress` of each call and model
    /// batch ([`OrtEncoder::with_progress`]).
    pub fn with_progress(mut self, progress: Arc<dyn EncodeProgress>) -> Self {
        self.progress = Some(progress);
        self
    }

    /// The encoder, loaded on first use.
    pub fn loaded(&self) -> Result<Arc<OrtEncoder>> {
        let mut slot = self.loaded.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(e) = slot.as_ref() {
            return Ok(e.clone());
        }
        let mut e = OrtEncoder::load(&self.dir, &self.config)?;
        e.progress = self.progress.clone();
        let e = Arc::new(e);
        *slot = Some(e.clone());
        Ok(e)
    }

    /// Whether the session was made.
    pub fn is_loaded(&self) -> bool {
        self.loaded.lock().unwrap_or_else(|p| p.into_inner()).is_some()
    }
}

impl Encoder for LazyOrtEncoder {
    fn model_id(&self) -> &str {
        &self.id
    }

    fn dim(&self) -> usize {
        self.manifest.dim
    }

    fn max_tokens(&self) -> usize {
        self.manifest.max_tokens
    }

    fn relevance_floor(&self, kind: crate::context::FieldKind) -> Option<f32> {
        self.manifest.relevance_floor_for(kind)
    }

    fn count_tokens(&self, text: &str) -> Result<usize> {
        let enc = self
            .tokenizer
            .encode(text, false)
            .map_err(|source| Error::Tokenizer { path: self.tokenizer_path.clone(), source })?;
        Ok(enc.len())
    }

    fn encode(&self, texts: &[&str], opts: &EncodeOptions) -> Result<Encoded> {
        self.loaded()?.encode(texts, opts)
    }

    fn encode_cancellable(
        &self,
        texts: &[&str],
        opts: &EncodeOptions,
        cancel: &crate::cancel::Cancel,
    ) -> Result<Encoded> {
        self.loaded()?.encode_cancellable(texts, opts, cancel)
    }

    fn provider(&self) -> &str {
        match self.config.device {
            Device::Cpu => "cpu",
            Device::Cuda(_) => "cuda",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// e5-small and the ONNX Runtime library, as `engine/tests/tests.rs` finds
    /// them; None (a failure under CI or `SCD_REQUIRE_MODELS=1`) when absent.
    fn e5_small(io_binding: bool) -> Option<OrtEncoder> {
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
        let models = std::env::var_os("SCD_MODELS_DIR").map(PathBuf::from).unwrap_or_else(|| root.join("models/out"));
        let lib = std::env::var_os(ORT_LIB_ENV)
            .map(PathBuf::from)
            .unwrap_or_else(|| root.join(".tools/ort/libonnxruntime.so"));
        let dir = models.join("e5-small");
        if !dir.join("manifest.json").is_file() || !lib.is_file() {
            let required = |var: &str, on: &str| std::env::var(var).is_ok_and(|v| v == on);
            assert!(
                !required("CI", "true") && !required("SCD_REQUIRE_MODELS", "1"),
                "e5-small or {ORT_LIB_ENV} absent"
            );
            eprintln!("SKIP: e5-small or the ONNX Runtime library absent (run models/setup.sh)");
            return None;
        }
        let config = OrtConfig { intra_threads: 1, batch_tokens: 256, io_binding, ..OrtConfig::new(lib) };
        Some(OrtEncoder::load(&dir, &config).unwrap())
    }

    fn texts() -> Vec<String> {
        (0..24)
            .map(|i| {
                let words = ["the river", "a mountain pass", "tokens per second", "an old library", "GPU batches"];
                (0..1 + (i * 7) % 19).map(|k| words[(i + k) % words.len()]).collect::<Vec<_>>().join(" ")
            })
            .collect()
    }

    #[test]
    fn overlapped_batches_embed_like_the_serial_path_in_the_same_order() {
        for io_binding in [true, false] {
            let Some(enc) = e5_small(io_binding) else { return };
            let texts = texts();
            let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
            let prepared = enc.prepare(&refs, &EncodeOptions::new(InputKind::Passage)).unwrap();
            let (serial, bs) = enc.run_prepared_timed(&prepared, false).unwrap();
            let (overlapped, bo) = enc.run_prepared_timed(&prepared, true).unwrap();
            assert_eq!(serial.len(), texts.len());
            assert_eq!(serial.tokens, overlapped.tokens);
            for i in 0..texts.len() {
                let cos: f32 = serial.row(i).iter().zip(overlapped.row(i)).map(|(a, b)| a * b).sum();
                assert!(cos >= 0.99999, "text {i}: cosine {cos} (io_binding {io_binding})");
            }
            // rows are not swapped: each text is closer to itself than to its neighbour
            let cross: f32 = serial.row(0).iter().zip(overlapped.row(1)).map(|(a, b)| a * b).sum();
            assert!(cross < 0.99999, "rows 0 and 1 differ ({cross})");
            for b in [&bs, &bo] {
                assert!(b.batches > 1, "several batches at 256 tokens: {b:?}");
                assert_eq!(b.real_tokens, serial.tokens.iter().sum::<usize>());
                assert!(b.model_s > 0.0 && b.model_thread_s() <= b.total_s + 1e-9, "{b:?}");
            }
        }
    }
}
