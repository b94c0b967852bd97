//! A corpus embedded by many workers: `scd embed-batch --queue` (the
//! coordinator) and `scd embed-worker` (any number, each on its own CPU or
//! GPU), over a Redis Stream ([`crate::redis::queue`]).
//!
//! Shards are the one-process run's blocks (`--block-texts` records from
//! the same place), so every row comes from the same model call it would
//! in one process: the output is the same row for row, and resumes the
//! same way (the output file is the truth).

use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure};
use indicatif::{ProgressBar, ProgressStyle};
use scd_engine::encoder::{EncodeOptions, Encoded, Encoder, InputKind, Manifest};
use tracing::{info, warn};

use super::embed_batch::{open_output, parse, record_lines, scan, EmbedBatchArgs, Record, Sink, Summary};
use crate::config::ModelArgs;
use crate::redis::queue::{Queue, Shard, ShardRows, Taken};

/// How long a coordinator's run stays alive without a refresh: workers
/// drop the shards of a run whose coordinator is gone.
const LIVE_TTL: Duration = Duration::from_secs(30);

/// With no rows for this long and nothing on the stream (neither waiting
/// nor held by a worker), the shards still owed were lost (their rows
/// expired, or a worker dropped them while this run looked gone): sent again.
const RESEND_AFTER: Duration = Duration::from_secs(60);

/// Forgets the run on the queue however the coordinator ends.
struct RunGuard<'a> {
    queue: &'a Queue,
    run: String,
}

impl Drop for RunGuard<'_> {
    fn drop(&mut self) {
        if let Err(e) = self.queue.end(&self.run) {
            warn!(run = %self.run, error = %e, "could not clear the run's keys (they expire)");
        }
    }
}

/// Arguments of `scd embed-worker`.
#[derive(Debug, clap::Args)]
pub struct EmbedWorkerArgs {
    /// The queue (`redis://HOST:PORT/DB`) that `scd embed-batch --queue` fills.
    #[arg(long, env = "SCD_QUEUE", value_name = "URL")]
    queue: String,
    /// This worker's name in the consumer group (default: host and pid).
    #[arg(long, env = "SCD_WORKER_NAME")]
    name: Option<String>,
    /// Take over a shard another worker has held this long without
    /// finishing it (it died or hangs), in milliseconds. Above the time
    /// one shard takes, or a slow worker's shard is done twice.
    #[arg(long, env = "SCD_CLAIM_IDLE_MS", default_value_t = 60_000)]
    claim_idle_ms: u64,
    /// Exit after this many seconds without a shard (default: run until killed).
    #[arg(long)]
    exit_idle_s: Option<f64>,
}

/// The shard's records' rows as the sink takes them.
fn encoded(rows: &ShardRows) -> Encoded {
    Encoded { dim: rows.dim, data: rows.data.clone(), tokens: rows.tokens.clone(), windows: rows.windows.clone() }
}

/// `--queue`'s errors, naming it.
fn queue_error(queue: &Queue) -> impl Fn(scd_engine::shared::StoreError) -> anyhow::Error + '_ {
    move |e| anyhow::anyhow!("--queue {}: {e}", queue.name())
}

/// The shards of one run between the queue and the sink: those sent and
/// not yet written (with their records, for the sink), and what the
/// written ones held.
struct InFlight {
    /// What every shard of the run shares (run, model, options); each
    /// shard's place and texts are its own.
    template: Shard,
    /// The run's shards, all told.
    shards: usize,
    waiting: HashMap<usize, (Shard, Vec<Record>)>,
    sent: usize,
    written: usize,
    /// The row of the next shard's first record.
    first: usize,
    tokens: usize,
    embedded: usize,
    workers: BTreeSet<String>,
}

impl InFlight {
    /// `shards` to send, none sent yet; the first starts at row `first`.
    fn new(template: Shard, shards: usize, first: usize) -> Self {
        let (waiting, workers) = (HashMap::new(), BTreeSet::new());
        Self { template, shards, waiting, sent: 0, written: 0, first, tokens: 0, embedded: 0, workers }
    }

    /// Whether every shard's rows are written.
    fn done(&self) -> bool {
        self.written >= self.shards
    }

    /// Sends shards of `block_texts` records from `lines` until `depth` are
    /// in flight or all are sent.
    fn send(
        &mut self,
        queue: &Queue,
        lines: &mut impl Iterator<Item = anyhow::Result<(usize, String)>>,
        block_texts: usize,
        depth: usize,
    ) -> anyhow::Result<()> {
        while self.sent < self.shards && self.sent < self.written + depth {
            let mut block = Vec::with_capacity(block_texts);
            for item in lines.by_ref().take(block_texts) {
                let (n, raw) = item?;
                block.push(parse(n, &raw)?);
            }
            let shard = Shard {
                index: self.sent,
                first: self.first,
                texts: block.iter().map(|r| r.text.clone()).collect(),
                lines: block.iter().map(|r| r.line).collect(),
                ..self.template.clone()
            };
            queue.push(&shard).map_err(queue_error(queue))?;
            self.first += block.len();
            self.waiting.insert(self.sent, (shard, block));
            self.sent += 1;
        }
        Ok(())
    }

    /// Writes the next shard's `rows` (`dim` wide) to `sink`, in order.
    fn write(&mut self, rows: &ShardRows, sink: &mut Sink, dim: usize) -> anyhow::Result<()> {
        if let Some(e) = &rows.error {
            bail!("{e}");
        }
        let written = self.written;
        let (shard, block) = self.waiting.remove(&written).expect("a written shard was sent");
        ensure!(
            rows.tokens.len() == block.len() && rows.dim == dim,
            "shard {written}: worker {} sent {} rows of {}, not {} of {}",
            rows.worker,
            rows.tokens.len(),
            rows.dim,
            block.len(),
            dim
        );
        sink.write(shard.first, &block, &encoded(rows))?;
        self.tokens += rows.tokens.iter().sum::<usize>();
        self.embedded += block.len();
        self.workers.insert(rows.worker.clone());
        self.written += 1;
        Ok(())
    }

    /// The progress bar's message after `secs` of the run.
    fn message(&self, secs: f64) -> String {
        format!(
            "{} texts, {:.0} tokens/s, {} worker{}",
            self.embedded,
            self.tokens as f64 / secs.max(1e-9),
            self.workers.len(),
            if self.workers.len() == 1 { "" } else { "s" }
        )
    }

    /// Sends the shards still owed again, in order.
    fn resend(&self, queue: &Queue) -> anyhow::Result<()> {
        let mut owed: Vec<&Shard> = self.waiting.values().map(|(s, _)| s).collect();
        owed.sort_by_key(|s| s.index);
        for s in owed {
            queue.push(s).map_err(queue_error(queue))?;
        }
        Ok(())
    }
}

/// Runs `scd embed-batch --queue`: shards out, rows in, in order.
pub fn coordinate(model: &ModelArgs, args: EmbedBatchArgs, url: &str) -> anyhow::Result<()> {
    ensure!(args.queue_depth > 0, "--queue-depth: must be at least 1");
    ensure!(args.block_texts > 0, "--block-texts: must be at least 1");
    let started = Instant::now();
    let (records, input_sha256) = scan(&args.input)?;
    ensure!(records > 0, "--input {}: no records", args.input.display());
    let dir = scd_engine::encoder::resolve_model(&model.models_dir, &model.model)?;
    let manifest = Manifest::load(&dir)?;
    let (meta, mut sink, done) = open_output(&args, manifest.model_id(), manifest.dim, input_sha256, records)?;

    let queue = Queue::open("--queue", url)?;
    let fail = queue_error(&queue);
    queue.ensure_group().map_err(&fail)?;
    let run = format!("{:016x}", rand::random::<u64>());
    queue.keep_alive(&run, LIVE_TTL).map_err(&fail)?;
    let _guard = RunGuard { queue: &queue, run: run.clone() };
    let load_seconds = started.elapsed().as_secs_f64();

    let remaining = records - done;
    let shards = remaining.div_ceil(args.block_texts);
    let bar = ProgressBar::new(shards as u64);
    bar.set_style(ProgressStyle::with_template(
        "{bar:40} {pos}/{len} shards  {msg}  elapsed {elapsed_precise} eta {eta}",
    )?);
    let run_start = Instant::now();
    let mut lines = record_lines(&args.input)?.skip(done);
    let template = Shard {
        run: run.clone(),
        index: 0,
        first: done,
        model: meta.model.clone(),
        query: args.query,
        windows: args.windows,
        texts: Vec::new(),
        lines: Vec::new(),
    };
    let mut flight = InFlight::new(template, shards, done);
    let mut last_progress = Instant::now();
    let mut refreshed = Instant::now();
    while !flight.done() {
        flight.send(&queue, &mut lines, args.block_texts, args.queue_depth)?;
        if refreshed.elapsed() > LIVE_TTL / 6 {
            queue.keep_alive(&run, LIVE_TTL).map_err(&fail)?;
            refreshed = Instant::now();
        }
        match queue.rows(&run, flight.written).map_err(&fail)? {
            Some(rows) => {
                flight.write(&rows, &mut sink, meta.dim)?;
                last_progress = Instant::now();
                bar.inc(1);
                bar.set_message(flight.message(run_start.elapsed().as_secs_f64()));
            }
            None => {
                if last_progress.elapsed() > RESEND_AFTER && queue.backlog().map_err(&fail)? == 0 {
                    warn!(run = %run, shards = flight.waiting.len(), "no rows and nothing on the queue: sending the owed shards again");
                    flight.resend(&queue)?;
                    last_progress = Instant::now();
                }
                if last_progress.elapsed() > Duration::from_secs(10) {
                    bar.set_message(format!(
                        "waiting for shard {}: is an `scd embed-worker --queue {}` running?",
                        flight.written,
                        queue.name()
                    ));
                }
                queue.wait_done(&run, Duration::from_secs(1)).map_err(&fail)?;
            }
        }
    }
    bar.finish_and_clear();
    let seconds = run_start.elapsed().as_secs_f64();
    let (tokens, embedded, workers) = (flight.tokens, flight.embedded, flight.workers);
    Summary {
        output: args.output.clone(),
        model: meta.model.clone(),
        provider: format!("queue {} ({} workers: {})", queue.name(), workers.len(), Vec::from_iter(workers).join(", ")),
        records,
        embedded,
        skipped: done,
        tokens,
        seconds,
        tokens_per_s: tokens as f64 / seconds.max(1e-9),
        texts_per_s: embedded as f64 / seconds.max(1e-9),
        load_seconds,
        ..Summary::default()
    }
    .report(args.summary_json.as_deref())
}

/// Embeds one shard; an input error becomes the shard's error, naming its line.
fn embed_shard<E: Encoder + ?Sized>(enc: &E, name: &str, shard: &Shard) -> ShardRows {
    let mut opts = EncodeOptions::new(if shard.query { InputKind::Query } else { InputKind::Passage });
    if shard.windows {
        opts = opts.with_windows();
    }
    let texts: Vec<&str> = shard.texts.iter().map(String::as_str).collect();
    let empty = |error: String| ShardRows {
        worker: name.to_string(),
        dim: enc.dim(),
        tokens: vec![],
        windows: vec![],
        data: vec![],
        error: Some(error),
    };
    match enc.encode(&texts, &opts) {
        Ok(e) => ShardRows { worker: name.to_string(), dim: e.dim, tokens: e.tokens, windows: e.windows, data: e.data, error: None },
        Err(scd_engine::Error::InputTooLong { index, tokens, max_tokens }) => empty(format!(
            "--input line {}: {tokens} tokens, over the model's max_tokens {max_tokens}; pass --windows to embed it whole",
            shard.lines.get(index).copied().unwrap_or(0)
        )),
        Err(e) => empty(format!("worker {name}: {e}")),
    }
}

/// Runs `scd embed-worker` until killed (or idle for `--exit-idle-s`).
pub fn work(model: &ModelArgs, args: EmbedWorkerArgs) -> anyhow::Result<()> {
    let name = args.name.clone().unwrap_or_else(|| {
        let host = std::fs::read_to_string("/etc/hostname").map(|h| h.trim().to_string()).unwrap_or_default();
        format!("{}-{}", if host.is_empty() { "worker" } else { &host }, std::process::id())
    });
    let queue = Queue::open("--queue", &args.queue)?;
    let enc = model.load_encoder()?;
    let claim_idle = Duration::from_millis(args.claim_idle_ms);
    let mut idle_since = Instant::now();
    let mut down_since: Option<Instant> = None;
    info!(worker = %name, queue = queue.name(), model = enc.model_id(), "embed worker ready");
    eprintln!("worker {name} on {} with {}", queue.name(), enc.model_id());
    loop {
        let got = queue.ensure_group().and_then(|()| queue.take(&name, claim_idle, Duration::from_secs(1)));
        let taken: Taken = match got {
            Ok(Some(t)) => {
                down_since = None;
                t
            }
            Ok(None) => {
                down_since = None;
                if args.exit_idle_s.is_some_and(|s| idle_since.elapsed().as_secs_f64() > s) {
                    eprintln!("worker {name}: idle, exiting");
                    return Ok(());
                }
                continue;
            }
            Err(e) => {
                let since = *down_since.get_or_insert_with(Instant::now);
                warn!(worker = %name, queue = queue.name(), error = %e, down_s = since.elapsed().as_secs(), "queue unavailable; retrying");
                std::thread::sleep(Duration::from_secs(1));
                continue;
            }
        };
        let shard = &taken.shard;
        if !queue.is_live(&shard.run).map_err(|e| anyhow::anyhow!("--queue {}: {e}", queue.name()))? {
            info!(run = %shard.run, shard = shard.index, "its coordinator is gone; dropping the shard");
            queue.done_with(&taken.entry).map_err(|e| anyhow::anyhow!("--queue {}: {e}", queue.name()))?;
            continue;
        }
        if shard.model != enc.model_id() {
            bail!(
                "shard {} of run {} is for model {}, and this worker runs {}: start it with that --model (the shard is left for another worker)",
                shard.index,
                shard.run,
                shard.model,
                enc.model_id()
            );
        }
        if taken.reclaimed {
            warn!(worker = %name, run = %shard.run, shard = shard.index, "reclaimed a shard its worker left unfinished");
            eprintln!("worker {name}: reclaimed shard {} of run {}", shard.index, shard.run);
        }
        let t = Instant::now();
        let rows = embed_shard(&enc, &name, shard);
        queue.finish(&taken, &rows).map_err(|e| anyhow::anyhow!("--queue {}: {e}", queue.name()))?;
        info!(
            worker = %name,
            run = %shard.run,
            shard = shard.index,
            texts = shard.texts.len(),
            tokens = rows.tokens.iter().sum::<usize>(),
            ms = t.elapsed().as_millis() as u64,
            "shard done"
        );
        idle_since = Instant::now();
    }
}
