//! `scd embed-batch`: a whole corpus through the encoder, resumably.
//!
//! The corpus is JSONL (`{"text": ..., "id": ...}` per line; blank lines are
//! skipped, `id` is optional). Row `i` of the output is the `i`-th record:
//!
//! * `.npy`   float32 `[records, dim]`, written row by row after a header
//!   that already holds the final shape;
//! * `.jsonl` `{"index", "id"?, "tokens", "windows", "embedding"}` per line.
//!
//! Beside the output, `<output>.meta.json` names the model, the input's
//! sha256 and the options. Re-running the same command finds the rows already
//! written (the output file is the truth: a torn last row or line is cut
//! off), checks the meta file matches, and embeds only the rest. A different
//! model, input or option is an error unless `--overwrite` starts over.
//!
//! Memory stays bounded: one thread reads and tokenizes block `k+1` while the
//! model runs block `k`; at most three blocks exist at once (with
//! `--workers N`, N sessions take blocks in turn and at most `2N` are in
//! flight). Within a block, `--overlap` assembles the next padded batch while
//! the model runs the current one.
//!
//! The summary separates the steady state (after the warm-up, session
//! creation excluded; `--min-seconds` repeats the corpus until it lasts that
//! long) from one run end to end, and says where the time went per phase
//! (`service/src/cli/embed_timing.rs`).

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, BufWriter, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{sync_channel, SyncSender};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, ensure, Context};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use npyz::WriterBuilder as _;
use scd_engine::encoder::{Breakdown, EncodeOptions, Encoded, Encoder, InputKind, OrtEncoder, Prepared};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::embed_remote::Remote;
use super::embed_timing::{Rate, Timing};
use super::embed_workers;
use super::progress::{stderr_target, Delayed, TextProgress, REVEAL_AFTER};
use crate::config::ModelArgs;

/// Arguments of `scd embed-batch`.
#[derive(Debug, clap::Args)]
pub struct EmbedBatchArgs {
    /// Corpus: JSONL with a "text" field per line (and optionally "id").
    #[arg(long)]
    pub(super) input: PathBuf,
    /// Output: `.npy` (float32 [records, dim]) or `.jsonl`. Re-running resumes it.
    #[arg(long)]
    pub(super) output: PathBuf,
    /// Embed as queries (E5 `query: ` prefix) instead of passages.
    #[arg(long)]
    pub(super) query: bool,
    /// Embed texts longer than the model's window as a weighted mean of
    /// windows (default: stop, naming the line).
    #[arg(long)]
    pub(super) windows: bool,
    /// Records per block: the unit of pipelining, progress and resumption.
    #[arg(long, env = "SCD_BLOCK_TEXTS", default_value_t = 2048)]
    pub(super) block_texts: usize,
    /// Start over when --output holds a run with another model, input or options.
    #[arg(long)]
    pub(super) overwrite: bool,
    /// Embed through a running `scd serve` (e.g. http://127.0.0.1:50051)
    /// instead of a local model; texts go over EmbedStream.
    #[arg(long, env = "SCD_SERVER")]
    server: Option<String>,
    /// Texts per EmbedStream request with --server (at most the server's --max-texts).
    #[arg(long, default_value_t = 64)]
    request_texts: usize,
    /// Embed this many texts from the start of the corpus before the clock
    /// starts (results discarded): kernel selection and memory-pool growth
    /// stay out of a throughput figure. Local model only.
    #[arg(long, default_value_t = 0)]
    warmup_texts: usize,
    /// Assemble the next padded batch on a producer thread while the model
    /// runs the current one (`false`: one after the other).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    overlap: bool,
    /// Model sessions on the device, each on its own thread, taking blocks in
    /// turn; rows are still written in corpus order. Local model only.
    #[arg(long, default_value_t = 1)]
    workers: usize,
    /// Pass over the corpus again until the timed passes (after the warm-up)
    /// have lasted this many seconds, rewriting --output each pass: a
    /// steady-state figure for a corpus one pass embeds too fast. Local
    /// model only; the output must start empty (--overwrite).
    #[arg(long, default_value_t = 0.0)]
    min_seconds: f64,
    /// Also write the final summary as JSON to this file.
    #[arg(long)]
    pub(super) summary_json: Option<PathBuf>,
    /// Split the corpus into shards (of --block-texts records) on this
    /// Redis (`redis://HOST:PORT/DB`) for `scd embed-worker` processes to
    /// embed, on any machines; this process assembles their rows in order.
    /// The output is row for row what a one-process run writes, and
    /// resumes the same way.
    #[arg(long, env = "SCD_QUEUE", value_name = "URL", conflicts_with_all = ["server", "warmup_texts"])]
    pub(super) queue: Option<String>,
    /// With --queue: shards on the queue ahead of the next one written
    /// (bounds what waits in Redis and in this process).
    #[arg(long, default_value_t = 8)]
    pub(super) queue_depth: usize,
    /// No progress bar on stderr (it shows on a terminal only, once the run
    /// has embedded for a second, advancing with each model batch).
    #[arg(long, env = "SCD_QUIET")]
    pub(super) quiet: bool,
}

impl EmbedBatchArgs {
    /// `--queue`: the Redis whose workers embed the shards (`None`: this process embeds).
    pub fn queue_url(&self) -> Option<String> {
        self.queue.clone()
    }
}

/// What `<output>.meta.json` records about a run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(super) struct RunMeta {
    pub(super) model: String,
    pub(super) dim: usize,
    pub(super) kind: String,
    pub(super) windows: bool,
    pub(super) input_sha256: String,
    pub(super) records: usize,
    pub(super) format: String,
}

impl RunMeta {
    /// The first field in which `self` (a previous run) differs from `now`.
    fn difference(&self, now: &RunMeta) -> Option<String> {
        let pairs = [
            ("model", &self.model, &now.model),
            ("input sha256", &self.input_sha256, &now.input_sha256),
            ("kind", &self.kind, &now.kind),
            ("format", &self.format, &now.format),
        ];
        if let Some((what, was, is)) = pairs.into_iter().find(|(_, a, b)| a != b) {
            return Some(format!("{what} was {was}, now {is}"));
        }
        if self.dim != now.dim || self.records != now.records || self.windows != now.windows {
            return Some(format!(
                "dim/records/windows were {}/{}/{}, now {}/{}/{}",
                self.dim, self.records, self.windows, now.dim, now.records, now.windows
            ));
        }
        None
    }
}

/// One corpus record.
pub(super) struct Record {
    pub(super) line: usize,
    pub(super) text: String,
    pub(super) id: Option<serde_json::Value>,
}

/// Counts the records of `path` and hashes its bytes, in one streaming pass.
pub(super) fn scan(path: &Path) -> anyhow::Result<(usize, String)> {
    let f = File::open(path).with_context(|| format!("--input {}", path.display()))?;
    let mut reader = BufReader::with_capacity(1 << 20, f);
    let mut hash = Sha256::new();
    let mut records = 0usize;
    let mut line = Vec::new();
    loop {
        line.clear();
        if reader.read_until(b'\n', &mut line)? == 0 {
            break;
        }
        hash.update(&line);
        if line.iter().any(|b| !b.is_ascii_whitespace()) {
            records += 1;
        }
    }
    Ok((records, format!("{:x}", hash.finalize())))
}

/// Parses one JSONL line into a record (`line` is 1-based, for errors).
pub(super) fn parse(line: usize, raw: &str) -> anyhow::Result<Record> {
    let (text, v) = super::jsonl_text(line, raw)?;
    ensure!(!text.trim().is_empty(), "--input line {line}: \"text\" is empty");
    Ok(Record { line, text, id: v.get("id").cloned() })
}

/// The non-blank lines of `path`, with their 1-based numbers: one record each.
pub(super) fn record_lines(path: &Path) -> anyhow::Result<impl Iterator<Item = anyhow::Result<(usize, String)>>> {
    let f = File::open(path).with_context(|| format!("--input {}", path.display()))?;
    Ok(BufReader::with_capacity(1 << 20, f).lines().enumerate().filter_map(|(n, line)| match line {
        Ok(l) if l.trim().is_empty() => None,
        Ok(l) => Some(Ok((n + 1, l))),
        Err(e) => Some(Err(anyhow::Error::new(e).context(format!("--input line {}: not UTF-8 text", n + 1)))),
    }))
}

/// Where the vectors go.
pub(super) enum Sink {
    Npy { file: BufWriter<File>, dim: usize },
    Jsonl { file: BufWriter<File> },
}

/// The `.npy` header (written by `npyz`) for a float32 C-order `[rows, dim]`
/// array; the data that follows is `rows * dim` little-endian `f32`s.
fn npy_header(rows: usize, dim: usize) -> std::io::Result<Vec<u8>> {
    let mut header = Vec::new();
    npyz::WriteOptions::<f32>::new()
        .default_dtype()
        .shape(&[rows as u64, dim as u64])
        .writer(&mut header)
        .write_header_only()?;
    Ok(header)
}

/// Reads the `.npy` header at the start of `file` and returns its length
/// in bytes when it describes a float32 C-order `[rows, dim]` array.
fn npy_data_offset(file: &mut File, path: &Path, rows: usize, dim: usize) -> anyhow::Result<u64> {
    file.seek(SeekFrom::Start(0))?;
    let header = npyz::NpyHeader::from_reader(&mut *file).with_context(|| format!("--output {}", path.display()))?;
    ensure!(
        header.dtype() == <f32 as npyz::AutoSerialize>::default_dtype()
            && header.order() == npyz::Order::C
            && header.shape() == [rows as u64, dim as u64],
        "--output {}: the .npy header is {:?} {} in {:?} order, not [{rows}, {dim}] float32",
        path.display(),
        header.shape(),
        header.dtype().descr(),
        header.order(),
    );
    Ok(file.stream_position()?)
}

impl Sink {
    /// Opens `path` for `records` rows of `dim`; when `resume`, keeps the
    /// whole rows already there and returns how many.
    pub(super) fn open(path: &Path, records: usize, dim: usize, resume: bool) -> anyhow::Result<(Sink, usize)> {
        let npy = match path.extension().and_then(|e| e.to_str()) {
            Some("npy") => true,
            Some("jsonl") => false,
            _ => bail!("--output {}: must end in .npy or .jsonl", path.display()),
        };
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(!resume)
            .open(path)
            .with_context(|| format!("--output {}", path.display()))?;
        let size = file.metadata()?.len();
        let (keep, done) = if npy {
            let header = npy_header(records, dim)?;
            let row = 4 * dim as u64;
            if resume && size >= header.len() as u64 {
                let offset = npy_data_offset(&mut file, path, records, dim)?;
                let done = (size.saturating_sub(offset) / row).min(records as u64);
                (offset + done * row, done as usize)
            } else {
                file.set_len(0)?;
                file.write_all(&header)?;
                (header.len() as u64, 0)
            }
        } else if resume {
            complete_lines(&mut file)?
        } else {
            (0, 0)
        };
        file.set_len(keep)?;
        file.seek(SeekFrom::Start(keep))?;
        let file = BufWriter::with_capacity(1 << 20, file);
        Ok((if npy { Sink::Npy { file, dim } } else { Sink::Jsonl { file } }, done))
    }

    /// Starts the rows over (the next pass of `--min-seconds`): the file is
    /// cut back to its header (`.npy`, for `records` rows) or emptied.
    pub(super) fn rewind(&mut self, records: usize) -> anyhow::Result<()> {
        let start = match self {
            Sink::Npy { dim, .. } => npy_header(records, *dim)?.len() as u64,
            Sink::Jsonl { .. } => 0,
        };
        let (Sink::Npy { file, .. } | Sink::Jsonl { file }) = self;
        file.flush()?;
        file.get_mut().set_len(start)?;
        file.seek(SeekFrom::Start(start))?;
        Ok(())
    }

    /// Appends the rows of one block (records `first..`), then flushes.
    pub(super) fn write(&mut self, first: usize, records: &[Record], enc: &Encoded) -> anyhow::Result<()> {
        match self {
            Sink::Npy { file, dim } => {
                debug_assert_eq!(enc.dim, *dim);
                for v in &enc.data {
                    file.write_all(&v.to_le_bytes())?;
                }
            }
            Sink::Jsonl { file } => {
                for (i, r) in records.iter().enumerate() {
                    let mut line = serde_json::json!({
                        "index": first + i,
                        "tokens": enc.tokens[i],
                        "windows": enc.windows[i],
                        "embedding": enc.row(i),
                    });
                    if let Some(id) = &r.id {
                        line["id"] = id.clone();
                    }
                    writeln!(file, "{line}")?;
                }
            }
        }
        match self {
            Sink::Npy { file, .. } | Sink::Jsonl { file } => file.flush()?,
        }
        Ok(())
    }
}

/// Length of the complete (newline-terminated) lines of `file` and their count.
fn complete_lines(file: &mut File) -> anyhow::Result<(u64, usize)> {
    file.seek(SeekFrom::Start(0))?;
    let mut reader = BufReader::with_capacity(1 << 20, &mut *file);
    let (mut keep, mut lines) = (0u64, 0usize);
    let mut buf = Vec::new();
    loop {
        buf.clear();
        let n = reader.read_until(b'\n', &mut buf)?;
        if n == 0 || buf.last() != Some(&b'\n') {
            break;
        }
        keep += n as u64;
        lines += 1;
    }
    Ok((keep, lines))
}

/// A block on its way from the reader to the model.
struct Block {
    first: usize,
    records: Vec<Record>,
    /// Tokenized ahead (local backend only).
    prepared: Option<Prepared>,
    /// Seconds the reader spent tokenizing it.
    tokenize_s: f64,
}

/// What the reader sends: a block, or the end of one pass over the corpus.
enum Item {
    Block(Block),
    PassEnd,
}

/// A block with its rows (and, from a local model, where its time went).
enum Embedded {
    Block(Box<Block>, Encoded, Option<Box<Breakdown>>),
    PassEnd,
}

/// Maps an engine error on block text `index` to the input line.
fn block_error(e: scd_engine::Error, block: &Block) -> anyhow::Error {
    match e {
        scd_engine::Error::InputTooLong { index, tokens, max_tokens } => anyhow::anyhow!(
            "--input line {}: {tokens} tokens, over the model's max_tokens {max_tokens}; pass --windows to embed it whole",
            block.records[index].line
        ),
        other => other.into(),
    }
}

/// The final summary (also the --summary-json file).
#[derive(Debug, Default, Serialize)]
pub(super) struct Summary {
    pub(super) output: PathBuf,
    pub(super) model: String,
    pub(super) provider: String,
    pub(super) records: usize,
    pub(super) embedded: usize,
    pub(super) skipped: usize,
    pub(super) tokens: usize,
    pub(super) seconds: f64,
    pub(super) tokens_per_s: f64,
    pub(super) texts_per_s: f64,
    pub(super) batch_tokens: usize,
    pub(super) max_batch_rows: usize,
    pub(super) io_binding: bool,
    pub(super) load_seconds: f64,
    /// Steady state, end to end, the passes and the phases (not with --queue).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) timing: Option<Timing>,
}

/// Runs `scd embed-batch`.
pub fn run(model: &ModelArgs, args: EmbedBatchArgs) -> anyhow::Result<()> {
    ensure!(args.block_texts > 0, "--block-texts: must be at least 1");
    ensure!(args.request_texts > 0, "--request-texts: must be at least 1");
    ensure!(args.workers > 0, "--workers: must be at least 1");
    ensure!(args.min_seconds.is_finite() && args.min_seconds >= 0.0, "--min-seconds: must be 0 or more seconds");
    ensure!(
        args.server.is_none() || (args.workers == 1 && args.min_seconds == 0.0),
        "--workers and --min-seconds need a local model, not --server"
    );
    let started = Instant::now();
    let (records, input_sha256) = scan(&args.input)?;
    ensure!(records > 0, "--input {}: no records", args.input.display());
    let scan_s = started.elapsed().as_secs_f64();
    // exactly one of the two is set
    let (local, mut remote) = match &args.server {
        Some(addr) => (Vec::new(), Some(Remote::connect(addr, args.request_texts)?)),
        None => ((0..args.workers).map(|_| model.load_encoder()).collect::<anyhow::Result<Vec<_>>>()?, None),
    };
    let (model_id, dim, provider) = match (local.first(), &remote) {
        (Some(e), _) => (e.model_id().to_string(), e.dim(), e.provider().to_string()),
        (None, Some(r)) => (r.info.model.clone(), r.info.dim as usize, format!("{} (server)", r.info.provider)),
        (None, None) => unreachable!("one backend is always set"),
    };
    let load_seconds = started.elapsed().as_secs_f64();
    let mut opts = EncodeOptions::new(if args.query { InputKind::Query } else { InputKind::Passage });
    if args.windows {
        opts = opts.with_windows();
    }
    let (meta, sink, done) = open_output(&args, model_id, dim, input_sha256, records)?;
    ensure!(
        args.min_seconds == 0.0 || done == 0,
        "--min-seconds times whole passes, but --output {} already holds {done} rows; pass --overwrite",
        args.output.display()
    );
    let warm = Instant::now();
    for enc in local.iter().filter(|_| args.warmup_texts > 0) {
        warm_up(enc, &args.input, args.warmup_texts, &opts)?;
    }
    let timing = Timing {
        scan_s,
        load_s: load_seconds - scan_s,
        warmup_s: warm.elapsed().as_secs_f64(),
        workers: local.len(),
        overlap: args.overlap,
        min_seconds: args.min_seconds,
        ..Timing::default()
    };

    let bar = ProgressBar::with_draw_target(Some(records as u64), ProgressDrawTarget::hidden());
    bar.set_style(ProgressStyle::with_template(
        "{bar:40} {pos}/{len} texts  {prefix}  {msg}  elapsed {elapsed_precise}",
    )?);
    bar.set_position(done as u64);
    let shown = Arc::new(Delayed::new(bar, stderr_target(args.quiet), REVEAL_AFTER));
    // a local model advances the bar by each batch it embeds (not the warm-up's)
    let local: Vec<OrtEncoder> = local.into_iter().map(|e| e.with_progress(TextProgress::new(shown.clone()))).collect();
    let mut progress = Progress::new(&args, records, sink, shown, timing);
    stream(&args, &local, remote.as_mut(), &opts, done, &mut progress)?;
    let Progress { shown, mut timing, embedded, .. } = progress;
    shown.bar().finish_and_clear();
    timing.finish();

    let (batch_tokens, max_batch_rows, io_binding) = match local.first() {
        Some(e) => (e.batch_tokens(), e.max_batch_rows(), e.uses_io_binding()),
        None => (0, 0, false),
    };
    let steady = timing.steady.clone();
    let summary = Summary {
        output: args.output.clone(),
        model: meta.model.clone(),
        provider,
        records,
        embedded,
        skipped: done,
        tokens: steady.tokens,
        seconds: steady.seconds,
        tokens_per_s: steady.tokens_per_s,
        texts_per_s: embedded as f64 * timing.passes.len() as f64 / steady.seconds.max(1e-9),
        batch_tokens,
        max_batch_rows,
        io_binding,
        load_seconds,
        timing: Some(timing),
    };
    summary.report(args.summary_json.as_deref())
}

/// Streams the corpus from a reader thread through the backend (the
/// server, one local session, or several) into `progress`.
fn stream(
    args: &EmbedBatchArgs,
    local: &[OrtEncoder],
    remote: Option<&mut Remote>,
    opts: &EncodeOptions,
    done: usize,
    progress: &mut Progress,
) -> anyhow::Result<()> {
    std::thread::scope(|scope| -> anyhow::Result<()> {
        let (tx, rx) = sync_channel::<anyhow::Result<Item>>(1);
        let (input, block_texts, repeat) = (&args.input, args.block_texts, args.min_seconds > 0.0);
        let reader = local.first();
        scope.spawn(move || read_blocks(tx, input, done, block_texts, reader, opts, repeat));
        let overlap = args.overlap;
        match (remote, local) {
            (Some(r), _) => {
                for item in rx {
                    if progress.take(embed_remote(r, item?, opts)?)? {
                        break;
                    }
                }
            }
            (None, [enc]) => {
                for item in rx {
                    if progress.take(embed_local(enc, item, overlap)?)? {
                        break;
                    }
                }
            }
            (None, encs) => embed_workers::ordered(
                encs.len(),
                rx,
                |w, item| embed_local(&encs[w], item, overlap),
                |r| progress.take(r?),
            )?,
        }
        Ok(())
    })
}

/// Reads the corpus into blocks (tokenized when the model is local) and
/// sends them, then a [`Item::PassEnd`]; with `repeat`, pass after pass
/// until the receiver hangs up. A read error is sent as the last item.
fn read_blocks(
    tx: SyncSender<anyhow::Result<Item>>,
    input: &Path,
    done: usize,
    block_texts: usize,
    local: Option<&OrtEncoder>,
    opts: &EncodeOptions,
    repeat: bool,
) {
    let send_all = || -> anyhow::Result<()> {
        for pass in 0usize.. {
            let mut first = if pass == 0 { done } else { 0 };
            let mut block = Vec::with_capacity(block_texts);
            for item in record_lines(input)?.skip(first) {
                let (n, raw) = item?;
                block.push(parse(n, &raw)?);
                if block.len() == block_texts {
                    let records = std::mem::replace(&mut block, Vec::with_capacity(block_texts));
                    let len = records.len();
                    if tx.send(prepare(local, first, records, opts).map(Item::Block)).is_err() {
                        return Ok(());
                    }
                    first += len;
                }
            }
            if !block.is_empty() && tx.send(prepare(local, first, block, opts).map(Item::Block)).is_err() {
                return Ok(());
            }
            if tx.send(Ok(Item::PassEnd)).is_err() || !repeat {
                return Ok(());
            }
        }
        Ok(())
    };
    if let Err(e) = send_all() {
        let _ = tx.send(Err(e));
    }
}

/// Runs a prepared block through a local model.
fn embed_local(enc: &OrtEncoder, item: anyhow::Result<Item>, overlap: bool) -> anyhow::Result<Embedded> {
    let block = match item? {
        Item::PassEnd => return Ok(Embedded::PassEnd),
        Item::Block(block) => block,
    };
    let prepared = block.prepared.as_ref().expect("local blocks are prepared by the reader");
    let (enc, breakdown) = enc.run_prepared_timed(prepared, overlap).map_err(|e| block_error(e, &block))?;
    Ok(Embedded::Block(Box::new(block), enc, Some(Box::new(breakdown))))
}

/// Sends a block to the server.
fn embed_remote(remote: &mut Remote, item: Item, opts: &EncodeOptions) -> anyhow::Result<Embedded> {
    let block = match item {
        Item::PassEnd => return Ok(Embedded::PassEnd),
        Item::Block(block) => block,
    };
    let texts: Vec<String> = block.records.iter().map(|r| r.text.clone()).collect();
    let enc = remote.embed(&texts, opts).with_context(|| format!("--input lines {}..", block.records[0].line))?;
    Ok(Embedded::Block(Box::new(block), enc, None))
}

/// The writing side of a run: rows in order, the passes and their times.
struct Progress<'a> {
    args: &'a EmbedBatchArgs,
    records: usize,
    sink: Sink,
    /// The bar of texts: a local model's batches advance it, a server's
    /// blocks as they come back.
    shown: Arc<Delayed>,
    pass_start: Instant,
    pass_tokens: usize,
    embedded: usize,
    timing: Timing,
}

impl<'a> Progress<'a> {
    fn new(args: &'a EmbedBatchArgs, records: usize, sink: Sink, shown: Arc<Delayed>, timing: Timing) -> Self {
        let pass_start = Instant::now();
        Progress { args, records, sink, shown, pass_start, pass_tokens: 0, embedded: 0, timing }
    }

    /// Writes one embedded block, or closes a pass; true when the run is
    /// over (one pass, or the passes have lasted --min-seconds).
    fn take(&mut self, item: Embedded) -> anyhow::Result<bool> {
        let (block, enc, breakdown) = match item {
            Embedded::Block(block, enc, breakdown) => (block, enc, breakdown),
            Embedded::PassEnd => {
                let now = Instant::now();
                let seconds = (now - self.pass_start).as_secs_f64();
                self.timing.passes.push(Rate::new(self.pass_tokens, seconds));
                (self.pass_start, self.pass_tokens) = (now, 0);
                let steady: f64 = self.timing.passes.iter().map(|p| p.seconds).sum();
                if steady >= self.args.min_seconds {
                    return Ok(true);
                }
                let t = Instant::now();
                self.sink.rewind(self.records)?;
                self.timing.phases.write_s += t.elapsed().as_secs_f64();
                self.shown.bar().set_position(0);
                return Ok(false);
            }
        };
        let t = Instant::now();
        self.sink.write(block.first, &block.records, &enc)?;
        let phases = &mut self.timing.phases;
        phases.write_s += t.elapsed().as_secs_f64();
        phases.tokenize_s += block.tokenize_s;
        if let Some(b) = &breakdown {
            phases.engine.add(b);
        }
        self.pass_tokens += enc.tokens.iter().sum::<usize>();
        if self.timing.passes.is_empty() {
            self.embedded += block.records.len();
        }
        if self.args.server.is_some() {
            self.shown.advance(block.records.len() as u64, "texts");
        }
        let secs = self.pass_start.elapsed().as_secs_f64().max(1e-9);
        self.shown.bar().set_message(format!(
            "pass {}: {:.0} tokens/s",
            self.timing.passes.len() + 1,
            self.pass_tokens as f64 / secs
        ));
        Ok(false)
    }
}

impl Summary {
    /// Prints the summary line, and writes the JSON file if asked.
    pub(super) fn report(&self, json: Option<&Path>) -> anyhow::Result<()> {
        eprintln!(
            "embedded {} texts ({} already in {}), {} tokens in {:.2}s: {:.0} tokens/s, {:.1} texts/s; model {} on {}",
            self.embedded,
            self.skipped,
            self.output.display(),
            self.tokens,
            self.seconds,
            self.tokens_per_s,
            self.texts_per_s,
            self.model,
            self.provider,
        );
        if let Some(t) = &self.timing {
            eprintln!(
                "steady {:.0} tokens/s over {} pass(es) and {:.1}s; end to end {:.0} tokens/s (scan {:.2}s, load {:.2}s, warm-up {:.2}s)",
                t.steady.tokens_per_s,
                t.passes.len(),
                t.steady.seconds,
                t.end_to_end.tokens_per_s,
                t.scan_s,
                t.load_s,
                t.warmup_s
            );
        }
        if let Some(path) = json {
            std::fs::write(path, serde_json::to_string_pretty(self)? + "\n")
                .with_context(|| format!("--summary-json {}", path.display()))?;
        }
        Ok(())
    }
}

/// Embeds the first `n` records of `input` and throws the vectors away.
fn warm_up(enc: &OrtEncoder, input: &Path, n: usize, opts: &EncodeOptions) -> anyhow::Result<()> {
    let records = record_lines(input)?
        .take(n)
        .map(|r| r.and_then(|(line, raw)| parse(line, &raw)))
        .collect::<anyhow::Result<_>>()?;
    let block = prepare(Some(enc), 0, records, opts)?;
    let started = Instant::now();
    enc.run_prepared(block.prepared.as_ref().expect("prepared locally")).map_err(|e| block_error(e, &block))?;
    tracing::info!(texts = block.records.len(), seconds = started.elapsed().as_secs_f64(), "warm-up done");
    Ok(())
}

/// Tokenizes a block ahead of the model when the encoder is local.
fn prepare(
    local: Option<&OrtEncoder>,
    first: usize,
    records: Vec<Record>,
    opts: &EncodeOptions,
) -> anyhow::Result<Block> {
    let started = Instant::now();
    let mut block = Block { first, records, prepared: None, tokenize_s: 0.0 };
    if let Some(enc) = local {
        let texts: Vec<&str> = block.records.iter().map(|r| r.text.as_str()).collect();
        match enc.prepare(&texts, opts) {
            Ok(p) => block.prepared = Some(p),
            Err(e) => return Err(block_error(e, &block)),
        }
    }
    block.tokenize_s = started.elapsed().as_secs_f64();
    Ok(block)
}

/// The run's record, and `--output` opened for it: resumed (its whole rows
/// kept, their count returned) when a previous run of the same model,
/// input and options left it, else started over; the meta file written.
pub(super) fn open_output(
    args: &EmbedBatchArgs,
    model: String,
    dim: usize,
    input_sha256: String,
    records: usize,
) -> anyhow::Result<(RunMeta, Sink, usize)> {
    let meta = RunMeta {
        model,
        dim,
        kind: if args.query { "query" } else { "passage" }.into(),
        windows: args.windows,
        input_sha256,
        records,
        format: args.output.extension().and_then(|e| e.to_str()).unwrap_or_default().to_string(),
    };
    let meta_path = PathBuf::from(format!("{}.meta.json", args.output.display()));
    let resume = decide_resume(args, &meta, &meta_path)?;
    let (sink, done) = Sink::open(&args.output, records, meta.dim, resume)?;
    std::fs::write(&meta_path, serde_json::to_string_pretty(&meta)? + "\n")
        .with_context(|| format!("writing {}", meta_path.display()))?;
    Ok((meta, sink, done))
}

/// Whether to resume `--output`: yes when its meta file matches this run;
/// no when there is nothing there or --overwrite; an error otherwise.
fn decide_resume(args: &EmbedBatchArgs, meta: &RunMeta, meta_path: &Path) -> anyhow::Result<bool> {
    if !args.output.exists() || args.overwrite {
        return Ok(false);
    }
    let previous: RunMeta = match std::fs::read_to_string(meta_path) {
        Ok(text) => {
            serde_json::from_str(&text).with_context(|| format!("{}: not a run record", meta_path.display()))?
        }
        Err(_) => bail!(
            "--output {} exists but {} does not, so it cannot be resumed; pass --overwrite to replace it",
            args.output.display(),
            meta_path.display()
        ),
    };
    if let Some(diff) = previous.difference(meta) {
        bail!(
            "--output {} holds another run ({diff}); pass --overwrite to start over or pick another --output",
            args.output.display()
        );
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn npy_header_is_aligned_and_parsable() {
        for (rows, dim) in [(1, 384), (123_456, 1024), (0, 8)] {
            let h = npy_header(rows, dim).unwrap();
            assert_eq!(h.len() % 64, 0);
            assert_eq!(&h[..8], b"\x93NUMPY\x01\x00");
            let len = u16::from_le_bytes([h[8], h[9]]) as usize;
            assert_eq!(10 + len, h.len());
            let dict = std::str::from_utf8(&h[10..]).unwrap();
            assert!(dict.contains(&format!("'shape': ({rows}, {dim}")) && dict.ends_with('\n'), "{dict}");
        }
    }

    #[test]
    fn npy_resume_reads_the_header_and_refuses_another_shape() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("v.npy");
        let mut bytes = npy_header(3, 2).unwrap();
        bytes.extend([1f32, 2., 3., 4., 5.].iter().flat_map(|v| v.to_le_bytes())); // 2.5 rows: torn
        std::fs::write(&path, &bytes).unwrap();
        let (_, done) = Sink::open(&path, 3, 2, true).unwrap();
        assert_eq!(done, 2);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), npy_header(3, 2).unwrap().len() as u64 + 16);
        // The header written before npyz (`'shape': (3, 2)`, no trailing comma) still resumes.
        let mut old = b"\x93NUMPY\x01\x00".to_vec();
        let dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 2), }";
        let pad = (10 + dict.len() + 1).div_ceil(64) * 64 - (10 + dict.len() + 1);
        old.extend(((dict.len() + pad + 1) as u16).to_le_bytes());
        old.extend(dict.as_bytes());
        old.extend(std::iter::repeat_n(b' ', pad));
        old.push(b'\n');
        old.extend(1f32.to_le_bytes());
        old.extend(2f32.to_le_bytes());
        std::fs::write(&path, &old).unwrap();
        assert_eq!(Sink::open(&path, 3, 2, true).unwrap().1, 1);
        let e = Sink::open(&path, 4, 2, true).err().unwrap().to_string();
        assert_eq!(
            e,
            format!("--output {}: the .npy header is [3, 2] '<f4' in C order, not [4, 2] float32", path.display())
        );
    }

    #[test]
    fn meta_difference_names_the_field() {
        let a = RunMeta {
            model: "e5-small@1".into(),
            dim: 384,
            kind: "passage".into(),
            windows: false,
            input_sha256: "ab".into(),
            records: 3,
            format: "npy".into(),
        };
        assert_eq!(a.difference(&a.clone()), None);
        let b = RunMeta { model: "e5-small-fp16@2".into(), ..a.clone() };
        assert_eq!(a.difference(&b).unwrap(), "model was e5-small@1, now e5-small-fp16@2");
        let c = RunMeta { records: 4, ..a.clone() };
        assert!(a.difference(&c).unwrap().contains("3/false"));
    }

    #[test]
    fn torn_jsonl_line_is_not_counted() {
        let dir = std::env::temp_dir().join(format!("scd-lines-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("x.jsonl");
        std::fs::write(&p, "{\"index\":0}\n{\"index\":1}\n{\"ind").unwrap();
        let mut f = OpenOptions::new().read(true).write(true).open(&p).unwrap();
        assert_eq!(complete_lines(&mut f).unwrap(), (24, 2));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
