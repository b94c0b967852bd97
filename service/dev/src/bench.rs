//! `scd-dev bench-encode`: encoder throughput and memory, for the comparison
//! scripts in `benches/` (which run their baselines in the same run).

use std::path::PathBuf;
use std::time::Instant;

use indicatif::{ProgressBar, ProgressStyle};
use scd_engine::encoder::{EncodeOptions, Encoder, InputKind};

use scd_service::config::ModelArgs;

/// Arguments of `scd-dev bench-encode`.
#[derive(Debug, clap::Args)]
pub struct BenchArgs {
    /// JSONL file, one {"text": ...} per line.
    #[arg(long)]
    input: PathBuf,
    /// Texts per encoder call.
    #[arg(long, default_value_t = 32)]
    batch: usize,
    /// Instead of one pass, make this many single-text calls cycling through
    /// the inputs and report resident memory every 1,000 calls.
    #[arg(long)]
    calls: Option<usize>,
}

/// Runs `scd-dev bench-encode`; prints one JSON summary on stdout.
pub fn run(model: &ModelArgs, args: BenchArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.batch > 0, "--batch: must be at least 1");
    let texts = super::read_jsonl_texts(&args.input, "--input")?;
    let encoder = model.load_encoder()?;
    let opts = EncodeOptions::new(InputKind::Passage).with_windows();
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    encoder.encode(&refs[..refs.len().min(args.batch)], &opts)?; // warm-up
    if let Some(calls) = args.calls {
        let bar = ProgressBar::new(calls as u64);
        bar.set_style(ProgressStyle::with_template("{bar:40} {pos}/{len} calls {per_sec} {msg}")?);
        let mut samples = vec![(0usize, super::rss_kib(super::Proc::This))];
        let start = Instant::now();
        let mut tokens = 0usize;
        for c in 0..calls {
            tokens += encoder.encode(&[refs[c % refs.len()]], &opts)?.tokens[0];
            if (c + 1) % 1000 == 0 {
                samples.push((c + 1, super::rss_kib(super::Proc::This)));
                bar.set_message(format!("rss {} MiB", samples.last().unwrap().1 / 1024));
            }
            bar.inc(1);
        }
        bar.finish_and_clear();
        let secs = start.elapsed().as_secs_f64();
        println!(
            "{}",
            serde_json::json!({"model": encoder.model_id(), "calls": calls, "tokens": tokens, "seconds": secs,
                "rss_kib": samples.iter().map(|s| serde_json::json!({"after_calls": s.0, "rss_kib": s.1})).collect::<Vec<_>>()})
        );
        return Ok(());
    }
    let start = Instant::now();
    let mut tokens = 0usize;
    for chunk in refs.chunks(args.batch) {
        tokens += encoder.encode(chunk, &opts)?.tokens.iter().sum::<usize>();
    }
    let secs = start.elapsed().as_secs_f64();
    println!(
        "{}",
        serde_json::json!({"model": encoder.model_id(), "provider": encoder.provider(), "texts": texts.len(),
            "batch": args.batch, "tokens": tokens, "seconds": secs, "tokens_per_s": tokens as f64 / secs})
    );
    Ok(())
}
