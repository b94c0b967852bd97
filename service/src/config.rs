//! Command-line and environment configuration shared by several commands.
//!
//! The model flags ([`ModelArgs`]) belong to the commands that load a model
//! ([`WithModel`]); `scd --help` and the help of the others do not list them,
//! and those commands refuse them. Given before the subcommand, as recorded
//! commands have them (`scd --threads 2 compress ...`), they still work:
//! [`model_flags_after_subcommand`] moves them after it.

use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{bail, Context};
use scd_engine::encoder::{resolve_model, Device, OrtConfig, OrtEncoder, ORT_LIB_ENV};
use scd_engine::extract::ScoringConfig;
use scd_engine::rerank::{resolve_reranker, CrossEncoder, Reranker};

/// Where models and ONNX Runtime live, and how to run them.
#[derive(Debug, Clone, clap::Args)]
pub struct ModelArgs {
    /// Model name under --models-dir, or a path to a model folder.
    #[arg(long, env = "SCD_MODEL", default_value = "e5-small")]
    pub model: String,
    /// Folder holding one sub-folder per model (made by models/setup.sh).
    #[arg(long, env = "SCD_MODELS_DIR", default_value = "models/out")]
    pub models_dir: PathBuf,
    /// libonnxruntime.so from the pinned PyPI onnxruntime wheel.
    #[arg(long, env = ORT_LIB_ENV, default_value = ".tools/ort/libonnxruntime.so")]
    pub ort_lib: PathBuf,
    /// ONNX Runtime intra-op threads (0 = one per core). Tokenizing a large
    /// call runs on its own pool (one thread per core) before the model runs.
    #[arg(long, env = "SCD_THREADS", default_value_t = 0)]
    pub threads: usize,
    /// Let idle ONNX Runtime threads spin before sleeping (`false`: they
    /// sleep at once, leaving the cores to other processes).
    #[arg(long, env = "SCD_ORT_SPINNING", default_value_t = true, action = clap::ArgAction::Set)]
    pub ort_spinning: bool,
    /// Execution device: cpu, cuda or cuda:N.
    #[arg(long, env = "SCD_DEVICE", default_value = "cpu")]
    pub device: String,
    /// Padded tokens per encoder call (0 = the device's default: 512 on CPU, 16384 on CUDA).
    #[arg(long, env = "SCD_BATCH_TOKENS", default_value_t = 0)]
    pub batch_tokens: usize,
    /// Rows per encoder call (0 = the device's default: 64 on CPU, 1024 on CUDA).
    #[arg(long, env = "SCD_MAX_BATCH_ROWS", default_value_t = 0)]
    pub max_batch_rows: usize,
    /// Run batches through IoBinding with the model's pooled output (`false`:
    /// plain runs, pooling on the host).
    #[arg(long, env = "SCD_IO_BINDING", default_value_t = true, action = clap::ArgAction::Set)]
    pub io_binding: bool,
    /// With IoBinding on CUDA, leave the pooled output on the device and copy
    /// it back after the run, so the device→host copy is timed apart from
    /// the model (`scd embed-batch`'s breakdown); off, ONNX Runtime copies it
    /// to pinned host memory inside the run.
    #[arg(long, env = "SCD_SPLIT_COPIES")]
    pub split_copies: bool,
    /// The persistent embedding cache: a redb file shared by every scd
    /// process of the machine (a vector is keyed by model and text), or
    /// `off`. Default: $XDG_CACHE_HOME/scd/embeddings.redb (else
    /// ~/.cache/scd/embeddings.redb).
    #[arg(long, env = "SCD_EMBEDDING_CACHE")]
    pub embedding_cache: Option<String>,
    /// Bytes the persistent embedding cache holds at most (oldest written
    /// first out).
    #[arg(long, env = "SCD_EMBEDDING_CACHE_BYTES", default_value_t = 1 << 30)]
    pub embedding_cache_bytes: u64,
}

/// A command that loads a model: its own arguments, then the model flags
/// (under their own heading in `--help`).
#[derive(Debug, clap::Args)]
pub struct WithModel<A: clap::Args> {
    /// The command's own arguments.
    #[command(flatten)]
    pub args: A,
    /// The model flags.
    #[command(flatten, next_help_heading = "Model")]
    pub model: ModelArgs,
}

/// `argv` with the model flags given before the subcommand moved to right
/// after it (`scd --threads 2 compress` reads as `scd compress --threads 2`); any
/// other argument stays where it is. A command without model flags then
/// refuses them as clap refuses any unknown flag. `root` is the whole
/// command line's definition (its own flags, like `--log-format VALUE`, are
/// skipped over with their values).
///
/// ```
/// use std::ffi::OsString;
/// use clap::Args as _;
/// use scd_service::config::{model_flags_after_subcommand, ModelArgs};
///
/// let root = clap::Command::new("scd")
///     .arg(clap::Arg::new("log_format").long("log-format"))
///     .subcommand(ModelArgs::augment_args(clap::Command::new("eval")));
/// let argv = ["scd", "--threads", "2", "--log-format", "json", "--model=e5-base", "eval", "--limit", "5"];
/// let out = model_flags_after_subcommand(&root, argv.map(OsString::from).to_vec());
/// let want = ["scd", "--log-format", "json", "eval", "--threads", "2", "--model=e5-base", "--limit", "5"];
/// assert_eq!(out, want.map(OsString::from));
/// ```
pub fn model_flags_after_subcommand(root: &clap::Command, argv: Vec<OsString>) -> Vec<OsString> {
    use clap::Args as _;
    let model = ModelArgs::augment_args(clap::Command::new("model"));
    // Some(takes a value) for a flag of `cmd`
    let flag = |cmd: &clap::Command, arg: &str| {
        let long = arg.strip_prefix("--")?.split('=').next()?;
        let takes = cmd.get_arguments().find(|a| a.get_long() == Some(long))?.get_action().takes_values();
        Some(takes && !arg.contains('='))
    };
    let mut args = argv.into_iter();
    let mut kept: Vec<OsString> = args.next().into_iter().collect();
    let mut moved = Vec::new();
    while let Some(a) = args.next() {
        let text = a.to_string_lossy().into_owned();
        if !text.starts_with('-') || text == "--" {
            // the subcommand: the model flags follow it
            kept.push(a);
            kept.append(&mut moved);
            break;
        }
        let (to, value) = match (flag(&model, &text), flag(root, &text)) {
            (Some(value), _) => (&mut moved, value),
            (None, value) => (&mut kept, value.unwrap_or(false)),
        };
        to.push(a);
        if value {
            to.extend(args.next());
        }
    }
    kept.extend(moved);
    kept.extend(args);
    kept
}

impl ModelArgs {
    /// The persistent embedding cache's file (`None`: off).
    pub fn embedding_cache_path(&self) -> Option<PathBuf> {
        match self.embedding_cache.as_deref().map(str::trim) {
            Some("off") | Some("") => None,
            Some(p) => Some(PathBuf::from(p)),
            None => {
                let base = std::env::var_os("XDG_CACHE_HOME")
                    .map(PathBuf::from)
                    .filter(|p| p.is_absolute())
                    .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
                Some(base.join("scd").join("embeddings.redb"))
            }
        }
    }

    /// The engine's default settings with this persistent embedding cache.
    pub fn scd_config(&self) -> scd_engine::extract::ScdConfig {
        scd_engine::extract::ScdConfig {
            prepare: scd_engine::extract::PrepareConfig {
                embedding_store: self.embedding_cache_path(),
                embedding_store_bytes: self.embedding_cache_bytes,
                ..Default::default()
            },
            ..Default::default()
        }
    }

    /// Parses `--device`.
    pub fn device(&self) -> anyhow::Result<Device> {
        match self.device.as_str() {
            "cpu" => Ok(Device::Cpu),
            "cuda" => Ok(Device::Cuda(0)),
            other => match other.strip_prefix("cuda:").map(str::parse::<i32>) {
                Some(Ok(n)) if n >= 0 => Ok(Device::Cuda(n)),
                _ => bail!("--device: expected cpu, cuda or cuda:N, got {other:?}"),
            },
        }
    }

    /// The checked ONNX Runtime configuration.
    pub fn ort_config(&self) -> anyhow::Result<OrtConfig> {
        if self.batch_tokens != 0 && self.batch_tokens < 16 {
            bail!("--batch-tokens: must be 0 (device default) or at least 16, got {}", self.batch_tokens);
        }
        let mut cfg = OrtConfig::new(&self.ort_lib);
        cfg.intra_threads = self.threads;
        cfg.intra_spinning = self.ort_spinning;
        cfg.device = self.device()?;
        cfg.batch_tokens = self.batch_tokens;
        cfg.io_binding = self.io_binding;
        cfg.split_copies = self.split_copies;
        cfg.max_batch = self.max_batch_rows;
        Ok(cfg)
    }

    /// Loads the selected model.
    pub fn load_encoder(&self) -> anyhow::Result<OrtEncoder> {
        let dir = resolve_model(&self.models_dir, &self.model)?;
        let cfg = self.ort_config()?;
        OrtEncoder::load(&dir, &cfg).with_context(|| format!("loading model {}", dir.display()))
    }

    /// The model, its ONNX Runtime session made on the first embedding (a
    /// call the embedding cache answers whole loads none).
    pub fn lazy_encoder(&self) -> anyhow::Result<scd_engine::encoder::LazyOrtEncoder> {
        let dir = resolve_model(&self.models_dir, &self.model)?;
        let cfg = self.ort_config()?;
        scd_engine::encoder::LazyOrtEncoder::new(&dir, &cfg).with_context(|| format!("loading model {}", dir.display()))
    }
}

/// The second stage: a cross-encoder that reads the task with each of the
/// first stage's best chunks and lifts them by its score
/// ([`scd_engine::rerank`]). Flattened into every command that scores
/// (`scd serve`, `scd compress`, `scd mcp`, `scd-dev eval`, `scd-dev tune`).
#[derive(Debug, Clone, clap::Args)]
pub struct RerankArgs {
    /// The cross-encoder's folder (manifest.json, model.onnx,
    /// tokenizer.json), or `none`. Default: `rerank` under --models-dir when
    /// it holds a manifest, else none; a folder named here must exist.
    #[arg(long, env = "SCD_RERANKER", value_name = "DIR|none")]
    pub reranker: Option<String>,
    /// Weight of the second stage (0 turns it off; `scd` then loads no model): each
    /// of the --rerank-top best chunks gains this times the z-score of the
    /// cross-encoder's score among them. Default: the engine's (0, off;
    /// cross-validation chose 1, BENCHMARKS.md says why it is not the
    /// default yet); a weight above 0 given here needs a reranker.
    #[arg(long, env = "SCD_RERANK_WEIGHT")]
    pub rerank_weight: Option<f32>,
    /// Chunks the second stage reads with the task: the best by the first
    /// stage's score (1 to 256).
    #[arg(long, env = "SCD_RERANK_TOP", default_value_t = ScoringConfig::default().rerank_top)]
    pub rerank_top: usize,
}

/// Chunks the second stage may read per request at most (its CPU bound).
pub const MAX_RERANK_TOP: usize = 256;

impl RerankArgs {
    /// The flags checked; an error names the flag.
    pub fn check(&self) -> anyhow::Result<()> {
        let w = self.weight();
        anyhow::ensure!(w.is_finite() && (0.0..=10.0).contains(&w), "--rerank-weight {w}: must be between 0 and 10");
        anyhow::ensure!(
            (1..=MAX_RERANK_TOP).contains(&self.rerank_top),
            "--rerank-top {}: must be between 1 and {MAX_RERANK_TOP}",
            self.rerank_top
        );
        Ok(())
    }

    /// The weight: --rerank-weight, else the engine's default.
    pub fn weight(&self) -> f32 {
        self.rerank_weight.unwrap_or(ScoringConfig::default().rerank_weight)
    }

    /// `scoring` with the second stage's weight and reach.
    pub fn apply(&self, scoring: &mut ScoringConfig) {
        scoring.rerank_weight = self.weight();
        scoring.rerank_top = self.rerank_top;
    }

    /// The cross-encoder's folder: `--reranker`, else `rerank` under
    /// `--models-dir` when it holds a manifest; `None` for `none` or no
    /// default. A named folder without a manifest is an error naming it.
    pub fn dir(&self, model: &ModelArgs) -> anyhow::Result<Option<PathBuf>> {
        resolve_reranker(self.reranker.as_deref(), &model.models_dir.join("rerank"))
            .with_context(|| format!("--reranker {}", self.reranker.as_deref().unwrap_or("(default)")))
    }

    /// The flags checked and the cross-encoder loaded (on `model`'s ONNX
    /// Runtime settings) when one is configured and `needed` (the weight is
    /// above 0, or a sweep may set it); `None` otherwise.
    pub fn load(&self, model: &ModelArgs, needed: bool) -> anyhow::Result<Option<Arc<dyn CrossEncoder>>> {
        self.check()?;
        let dir = self.dir(model)?;
        // the default weight without a reranker is no error: the stage is off
        let asked = self.rerank_weight.unwrap_or(0.0);
        anyhow::ensure!(
            dir.is_some() || asked == 0.0,
            "--rerank-weight {asked}: the second stage needs a reranker (--reranker DIR, or a rerank folder under \
             --models-dir)"
        );
        let Some(dir) = dir else { return Ok(None) };
        if !needed {
            return Ok(None);
        }
        let reranker = Reranker::load(&dir, &model.ort_config()?)
            .with_context(|| format!("--reranker: loading {}", dir.display()))?;
        Ok(Some(Arc::new(reranker)))
    }

    /// [`RerankArgs::load`] when the weight is above 0 (`scd serve`, `scd
    /// compress`, `scd mcp`, `scd-dev eval`).
    pub fn load_if_weighted(&self, model: &ModelArgs) -> anyhow::Result<Option<Arc<dyn CrossEncoder>>> {
        self.load(model, self.weight() > 0.0)
    }
}

/// The connection guard of a gRPC listener (`scd serve`, `scd atp agent`):
/// see [`scd_net`].
#[derive(Debug, Clone, clap::Args)]
pub struct GrpcConnArgs {
    /// gRPC connections open at once, all peers together; past it (and the
    /// health-check reserve) new ones are closed on accept.
    #[arg(long, env = "SCD_GRPC_MAX_CONNECTIONS", default_value_t = 512)]
    pub grpc_max_connections: usize,
    /// gRPC connections from one IPv4 address or IPv6 /64.
    #[arg(long, env = "SCD_GRPC_MAX_PER_PEER", default_value_t = 64)]
    pub grpc_max_per_peer: usize,
    /// Connections past --grpc-max-connections admitted for health checks
    /// (grpc.health.v1.Health/Check) only.
    #[arg(long, env = "SCD_GRPC_RESERVE", default_value_t = 8)]
    pub grpc_reserve: usize,
    /// Milliseconds a connection with no call in flight is kept.
    #[arg(long, env = "SCD_GRPC_IDLE_TIMEOUT_MS", default_value_t = 120_000)]
    pub grpc_idle_timeout_ms: u64,
    /// Milliseconds a new connection has to start its first call.
    #[arg(long, env = "SCD_GRPC_FIRST_CALL_TIMEOUT_MS", default_value_t = 10_000)]
    pub grpc_first_call_timeout_ms: u64,
}

impl GrpcConnArgs {
    /// The checked limits; an error names the flag.
    pub fn limits(&self) -> anyhow::Result<scd_net::ConnLimits> {
        let l = scd_net::ConnLimits {
            max_connections: self.grpc_max_connections,
            max_per_peer: self.grpc_max_per_peer,
            reserve: self.grpc_reserve,
            idle_timeout: std::time::Duration::from_millis(self.grpc_idle_timeout_ms),
            first_call_timeout: std::time::Duration::from_millis(self.grpc_first_call_timeout_ms),
            ..scd_net::ConnLimits::default()
        };
        l.check().map_err(|scd_net::Error::Invalid { field, reason }| {
            let flag = match field {
                "max_connections" => "--grpc-max-connections",
                "max_per_peer" => "--grpc-max-per-peer",
                "reserve" => "--grpc-reserve",
                "idle_timeout" => "--grpc-idle-timeout-ms",
                _ => "--grpc-first-call-timeout-ms",
            };
            anyhow::anyhow!("{flag} {reason}")
        })?;
        Ok(l)
    }
}

/// The HTTP listener's caps and time limits (`scd serve --http-addr`, `scd
/// mcp --http-addr`): see [`crate::http::HttpLimits`].
#[derive(Debug, Clone, clap::Args)]
pub struct HttpConnArgs {
    /// HTTP connections open at once, all peers together; past it (and the
    /// probe reserve) new ones are closed on accept.
    #[arg(long, env = "SCD_HTTP_MAX_CONNECTIONS", default_value_t = 256)]
    pub http_max_connections: usize,
    /// HTTP connections from one IPv4 address or IPv6 /64.
    #[arg(long, env = "SCD_HTTP_MAX_PER_PEER", default_value_t = 64)]
    pub http_max_per_peer: usize,
    /// Connections past --http-max-connections admitted for `GET /health`,
    /// `GET /ready` and `GET /metrics` only.
    #[arg(long, env = "SCD_HTTP_RESERVE", default_value_t = 8)]
    pub http_reserve: usize,
    /// Milliseconds a connection has to send a complete request head (idle
    /// keep-alive connections included) before it is closed.
    #[arg(long, env = "SCD_HTTP_HEADER_TIMEOUT_MS", default_value_t = 5000)]
    pub http_header_timeout_ms: u64,
    /// Milliseconds a request's body has to arrive after its head (else 408
    /// and the connection is closed); also the longest a reply waits on a
    /// client that reads none of it.
    #[arg(long, env = "SCD_HTTP_BODY_TIMEOUT_MS", default_value_t = 30_000)]
    pub http_body_timeout_ms: u64,
    /// Milliseconds a call may run before it is cancelled and answered 504
    /// (a compress of a large repository on a busy CPU takes minutes).
    #[arg(long, env = "SCD_HTTP_REQUEST_TIMEOUT_MS", default_value_t = 600_000)]
    pub http_request_timeout_ms: u64,
}

impl HttpConnArgs {
    /// The checked limits; an error names the flag.
    pub fn limits(&self) -> anyhow::Result<crate::http::HttpLimits> {
        use std::time::Duration;
        for (flag, v) in [
            ("--http-max-connections", self.http_max_connections as u64),
            ("--http-max-per-peer", self.http_max_per_peer as u64),
            ("--http-header-timeout-ms", self.http_header_timeout_ms),
            ("--http-body-timeout-ms", self.http_body_timeout_ms),
            ("--http-request-timeout-ms", self.http_request_timeout_ms),
        ] {
            anyhow::ensure!(v > 0, "{flag} {v}: must be at least 1");
        }
        anyhow::ensure!(self.http_reserve <= 1024, "--http-reserve {}: must be at most 1024", self.http_reserve);
        let day = 86_400_000;
        for (flag, v) in [
            ("--http-header-timeout-ms", self.http_header_timeout_ms),
            ("--http-body-timeout-ms", self.http_body_timeout_ms),
            ("--http-request-timeout-ms", self.http_request_timeout_ms),
        ] {
            anyhow::ensure!(v <= day, "{flag} {v}: must be at most {day} (a day)");
        }
        Ok(crate::http::HttpLimits {
            max_connections: self.http_max_connections,
            max_per_peer: self.http_max_per_peer,
            reserve: self.http_reserve,
            header_timeout: Duration::from_millis(self.http_header_timeout_ms),
            body_timeout: Duration::from_millis(self.http_body_timeout_ms),
            request_timeout: Duration::from_millis(self.http_request_timeout_ms),
        })
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser as _;

    use super::*;

    #[derive(Debug, clap::Parser)]
    struct Cli {
        #[command(flatten)]
        model: ModelArgs,
        #[command(flatten)]
        rerank: RerankArgs,
    }

    fn parse(args: &[&str]) -> Cli {
        Cli::try_parse_from(std::iter::once("t").chain(args.iter().copied())).unwrap()
    }

    #[test]
    fn the_reranker_defaults_to_the_models_dir_and_a_named_folder_must_exist() {
        let empty = tempfile::tempdir().unwrap();
        let models = empty.path().to_str().unwrap();
        // no rerank folder under --models-dir: no second stage, and no error
        let cli = parse(&["--models-dir", models]);
        if std::env::var_os("SCD_RERANKER").is_none() {
            assert_eq!(cli.rerank.dir(&cli.model).unwrap(), None);
            assert!(cli.rerank.load(&cli.model, true).unwrap().is_none());
        }
        let missing = empty.path().join("absent");
        let cli = parse(&["--models-dir", models, "--reranker", missing.to_str().unwrap()]);
        let e = format!("{:#}", cli.rerank.dir(&cli.model).unwrap_err());
        assert!(e.starts_with(&format!("--reranker {}: ", missing.display())), "{e}");
        assert!(e.contains("manifest.json"), "{e}");
        // the default weight without a reranker: the stage is off, no error
        let cli = parse(&["--models-dir", models, "--reranker", "none"]);
        if std::env::var_os("SCD_RERANK_WEIGHT").is_none() {
            assert!(cli.rerank.load_if_weighted(&cli.model).unwrap().is_none());
        }
        let cli = parse(&["--models-dir", models, "--reranker", "none", "--rerank-weight", "1"]);
        let e = cli.rerank.load(&cli.model, true).expect_err("a weight without a reranker").to_string();
        assert!(e.starts_with("--rerank-weight 1: the second stage needs a reranker"), "{e}");
    }

    #[test]
    fn the_weight_and_reach_are_bounded_and_reach_the_scoring_config() {
        let cli = parse(&["--rerank-weight", "1.5", "--rerank-top", "12"]);
        cli.rerank.check().unwrap();
        let mut scoring = ScoringConfig::default();
        cli.rerank.apply(&mut scoring);
        assert_eq!((scoring.rerank_weight, scoring.rerank_top), (1.5, 12));
        let e = parse(&["--rerank-weight", "11"]).rerank.check().unwrap_err().to_string();
        assert_eq!(e, "--rerank-weight 11: must be between 0 and 10");
        let e = parse(&["--rerank-top", "0"]).rerank.check().unwrap_err().to_string();
        assert_eq!(e, "--rerank-top 0: must be between 1 and 256");
        let e = parse(&["--rerank-top", "257"]).rerank.check().unwrap_err().to_string();
        assert_eq!(e, "--rerank-top 257: must be between 1 and 256");
    }
}
