//! `scd-dev`: SCD's developer tools (eval, tune, the bench commands, the
//! ATP demo, flood and simulator), apart from the product binary `scd`.
//!
//! Thin by design: parse arguments, install telemetry, call the library.

use clap::{CommandFactory as _, Parser, Subcommand};
use scd_dev::{atp, bench, bench_replicas, conns, eval, load, tune};
use scd_service::config::{self, WithModel};
use scd_service::telemetry;

/// SCD's developer tools: evaluation, tuning and benchmarks (users run `scd`).
#[derive(Debug, Parser)]
#[command(name = "scd-dev", version, about, propagate_version = true)]
struct Cli {
    /// Log format on stderr.
    #[arg(long, env = "SCD_LOG_FORMAT", value_enum, default_value = "text", global = true)]
    log_format: telemetry::LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Evidence recall vs reduction on a QA dataset, against baselines.
    Eval(Box<WithModel<eval::EvalArgs>>),
    /// Choose scoring settings by cross-validation over development sets; reports every fold.
    Tune(Box<WithModel<tune::TuneArgs>>),
    /// Load-test a real server over loopback against the raw encoder; prints JSON.
    BenchLoad(WithModel<load::LoadArgs>),
    /// Idle sockets against a real server under a file-descriptor limit, guarded and with the caps lifted; prints JSON.
    BenchConns(WithModel<conns::ConnsArgs>),
    /// Measure encoder throughput (or memory over many calls); prints JSON.
    BenchEncode(WithModel<bench::BenchArgs>),
    /// Session throughput of one replica vs two behind HAProxy, and the latency Redis adds (starts Redis, replicas, HAProxy); prints JSON.
    BenchReplicas(bench_replicas::BenchReplicasArgs),
    /// The ATP stack's tools: the live demo, a flood against one worker, the simulation bench.
    #[command(subcommand)]
    Atp(atp::AtpCommand),
}

/// Runs the command; an error is one line on stderr and exit status 1
/// ([`scd_service::cli::exit`]).
fn main() -> std::process::ExitCode {
    scd_service::cli::exit(run())
}

fn run() -> anyhow::Result<()> {
    // model flags before the subcommand (`scd-dev --threads 2 eval`) go after it
    let argv = config::model_flags_after_subcommand(&Cli::command(), std::env::args_os().collect());
    let cli = Cli::parse_from(argv);
    let level = match &cli.command {
        // the simulated agents' circuits open by design: their WARNs are noise
        Command::Atp(atp::AtpCommand::Bench(_)) => "error",
        _ => "warn",
    };
    telemetry::init(cli.log_format, level);
    match cli.command {
        Command::Eval(w) => {
            let WithModel { model, args } = *w;
            eval::run(&model, args)
        }
        Command::Tune(w) => tune::run(&w.model, w.args),
        Command::BenchLoad(w) => load::run(&w.model, w.args),
        Command::BenchConns(w) => conns::run(&w.model, w.args),
        Command::BenchEncode(w) => bench::run(&w.model, w.args),
        Command::BenchReplicas(args) => bench_replicas::run(args),
        Command::Atp(atp::AtpCommand::Demo(args)) => atp::demo(args),
        Command::Atp(atp::AtpCommand::Bench(args)) => atp::bench(args),
        Command::Atp(atp::AtpCommand::Flood(args)) => atp::flood(args),
    }
}
