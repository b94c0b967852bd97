//! `scd`: the SCD command line (embed, models, compress, serve, ...).
//!
//! Thin by design: parse arguments, install telemetry, call the engine.

mod cli;
mod config;
mod telemetry;

use clap::{Parser, Subcommand};

/// SCD: minimal sufficient context for AI agents.
#[derive(Debug, Parser)]
#[command(name = "scd", version, about, propagate_version = true)]
struct Cli {
    #[command(flatten)]
    model: config::ModelArgs,
    /// Log format on stderr.
    #[arg(long, env = "SCD_LOG_FORMAT", value_enum, default_value = "text", global = true)]
    log_format: telemetry::LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Embed texts (one per input line) and print JSONL {text_index, tokens, windows, embedding}.
    Embed(cli::embed::EmbedArgs),
    /// Model management.
    #[command(subcommand)]
    Models(cli::models::ModelsCommand),
    /// Rank sample context against a task: the README's first command.
    Demo(cli::demo::DemoArgs),
    /// Minimal sufficient context for a task under a token budget.
    Compress(cli::compress::CompressArgs),
    /// Evidence recall vs reduction on a QA dataset, against baselines.
    Eval(cli::eval::EvalArgs),
    /// Measure encoder throughput (or memory over many calls); prints JSON.
    BenchEncode(cli::bench::BenchArgs),
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    telemetry::init(cli.log_format, "warn");
    match cli.command {
        Command::Embed(args) => cli::embed::run(&cli.model, args),
        Command::Models(cmd) => cli::models::run(&cli.model, cmd),
        Command::Demo(args) => cli::demo::run(&cli.model, args),
        Command::Compress(args) => cli::compress::run(&cli.model, args),
        Command::Eval(args) => cli::eval::run(&cli.model, args),
        Command::BenchEncode(args) => cli::bench::run(&cli.model, args),
    }
}
