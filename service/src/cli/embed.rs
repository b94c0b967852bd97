//! `scd embed`: texts in, JSONL embeddings out.

use std::io::{BufRead, BufWriter, Write};
use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use indicatif::{ProgressBar, ProgressStyle};
use scd_engine::encoder::{EncodeOptions, Encoder, InputKind};

use crate::config::ModelArgs;

/// Arguments of `scd embed`.
#[derive(Debug, clap::Args)]
pub struct EmbedArgs {
    /// Embed as queries (E5 `query: ` prefix) instead of passages.
    #[arg(long)]
    query: bool,
    /// Input file, one text per line; `-` reads stdin.
    #[arg(long, default_value = "-")]
    input: PathBuf,
    /// Input lines are JSON objects with a "text" field (texts may then hold newlines).
    #[arg(long)]
    jsonl: bool,
    /// Embed texts longer than the model's window as a weighted mean of windows
    /// (default: fail naming the text).
    #[arg(long)]
    windows: bool,
    /// Texts per encoder call.
    #[arg(long, default_value_t = 256)]
    chunk: usize,
}

fn read_texts(args: &EmbedArgs) -> anyhow::Result<Vec<String>> {
    let reader: Box<dyn BufRead> = if args.input.as_os_str() == "-" {
        Box::new(std::io::stdin().lock())
    } else {
        let f = std::fs::File::open(&args.input).with_context(|| format!("--input {}", args.input.display()))?;
        Box::new(std::io::BufReader::new(f))
    };
    let mut texts = Vec::new();
    for (n, line) in reader.lines().enumerate() {
        let line = line.with_context(|| format!("--input line {}: not UTF-8 text", n + 1))?;
        if args.jsonl {
            if line.trim().is_empty() {
                continue;
            }
            texts.push(super::jsonl_text(n + 1, &line)?.0);
        } else {
            texts.push(line);
        }
    }
    Ok(texts)
}

/// Runs `scd embed`.
pub fn run(model: &ModelArgs, args: EmbedArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.chunk > 0, "--chunk: must be at least 1");
    let texts = read_texts(&args)?;
    let encoder = model.load_encoder()?;
    let mut opts = EncodeOptions::new(if args.query { InputKind::Query } else { InputKind::Passage });
    if args.windows {
        opts = opts.with_windows();
    }
    let bar = if texts.len() > args.chunk { ProgressBar::new(texts.len() as u64) } else { ProgressBar::hidden() };
    bar.set_style(ProgressStyle::with_template("{bar:40} {pos}/{len} texts {per_sec} eta {eta}")?);
    let start = Instant::now();
    let mut out = BufWriter::new(std::io::stdout().lock());
    let mut total_tokens = 0usize;
    for (c, chunk) in texts.chunks(args.chunk).enumerate() {
        let refs: Vec<&str> = chunk.iter().map(String::as_str).collect();
        let enc = encoder.encode(&refs, &opts).map_err(|e| match e {
            scd_engine::Error::InputTooLong { index, tokens, max_tokens } => anyhow::anyhow!(
                "input text {} has {tokens} tokens, over the model's max_tokens {max_tokens}; pass --windows to embed it whole",
                c * args.chunk + index
            ),
            other => other.into(),
        })?;
        for i in 0..enc.len() {
            total_tokens += enc.tokens[i];
            let line = serde_json::json!({
                "text_index": c * args.chunk + i,
                "tokens": enc.tokens[i],
                "windows": enc.windows[i],
                "embedding": enc.row(i),
            });
            writeln!(out, "{line}")?;
        }
        bar.inc(chunk.len() as u64);
    }
    out.flush()?;
    bar.finish_and_clear();
    let secs = start.elapsed().as_secs_f64();
    eprintln!(
        "embedded {} texts, {total_tokens} tokens in {secs:.2}s ({:.0} tokens/s) with {} on {}",
        texts.len(),
        total_tokens as f64 / secs.max(1e-9),
        encoder.model_id(),
        encoder.provider()
    );
    Ok(())
}
