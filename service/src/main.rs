//! `scd`: the SCD command line (embed, models, compress, serve, ...).
//!
//! Thin by design: parse arguments, install telemetry, call the engine.

use clap::{CommandFactory as _, Parser, Subcommand};
use scd_service::{cli, config, telemetry};

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
    /// Embed a JSONL corpus into .npy or .jsonl: pipelined, resumable, with progress and a summary.
    EmbedBatch(cli::embed_batch::EmbedBatchArgs),
    /// Embed shards of a corpus that `scd embed-batch --queue` puts on Redis; run any number, anywhere.
    EmbedWorker(cli::embed_queue::EmbedWorkerArgs),
    /// Model management.
    #[command(subcommand)]
    Models(cli::models::ModelsCommand),
    /// Rank sample context against a task: the README's first command.
    Demo(cli::demo::DemoArgs),
    /// Minimal sufficient context for a task under a token budget.
    Compress(cli::compress::CompressArgs),
    /// Build a context from files (name: the path, kind: the extension): `scd context src/ notes.md > ctx.json`.
    Context(cli::context::ContextArgs),
    /// Evidence recall vs reduction on a QA dataset, against baselines.
    Eval(cli::eval::EvalArgs),
    /// Choose scoring settings by cross-validation over development sets; reports every fold.
    Tune(cli::tune::TuneArgs),
    /// Run the gRPC service (scd.v1.Scd, health, reflection, metrics).
    Serve(Box<cli::serve::ServeArgs>),
    /// Serve the engine as MCP tools over stdio (or streamable HTTP with --http-addr).
    Mcp(cli::mcp::McpArgs),
    /// Call a running service.
    Client(cli::client::ClientArgs),
    /// Query the audit trail (a server's --audit-db) as JSON lines.
    Audit(cli::audit::AuditArgs),
    /// Load-test a real server over loopback against the raw encoder; prints JSON.
    BenchLoad(cli::load::LoadArgs),
    /// Idle sockets against a real server under a file-descriptor limit, guarded and with the caps lifted; prints JSON.
    BenchConns(cli::conns::ConnsArgs),
    /// Measure encoder throughput (or memory over many calls); prints JSON.
    BenchEncode(cli::bench::BenchArgs),
    /// Session throughput of one replica vs two behind HAProxy, and the latency Redis adds (starts Redis, replicas, HAProxy); prints JSON.
    BenchReplicas(cli::bench_replicas::BenchReplicasArgs),
    /// Hand-off reports (freeform, semi_structured, structured_soft): parse and render.
    #[command(subcommand)]
    Handoff(cli::handoff::HandoffCommand),
    /// The ATP stack: run an agent, the live demo, or the simulation bench.
    #[cfg(feature = "atp")]
    #[command(subcommand)]
    Atp(cli::atp::AtpCommand),
    /// Identities for DID-authenticated calls (serve --auth did-wba, client --identity).
    #[command(subcommand)]
    Identity(cli::identity::IdentityCommand),
    /// Print the OpenAPI document of the REST API (what `scd serve --http-addr` serves at /openapi.json).
    Openapi,
}

/// Runs the command; an error is one line on stderr (`Error: what: why`,
/// its causes joined), whatever `RUST_BACKTRACE` says, and exit status 1.
fn main() -> std::process::ExitCode {
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("Error: {}", format!("{e:#}").replace('\n', " "));
            std::process::ExitCode::FAILURE
        }
    }
}

fn run() -> anyhow::Result<()> {
    // `scd serve --config FILE`: the file's settings as flags (those the
    // command line or the environment gives win)
    let argv = cli::config_file::apply(&Cli::command(), std::env::args_os().collect())?;
    let cli = Cli::parse_from(argv);
    let level = match &cli.command {
        Command::Serve(_) | Command::EmbedWorker(_) => "info",
        #[cfg(feature = "atp")]
        Command::Atp(cli::atp::AtpCommand::Agent(_)) => "info",
        // the simulated agents' circuits open by design: their WARNs are noise
        #[cfg(feature = "atp")]
        Command::Atp(cli::atp::AtpCommand::Bench(_)) => "error",
        _ => "warn",
    };
    telemetry::init(cli.log_format, level);
    match cli.command {
        Command::Embed(args) => cli::embed::run(&cli.model, args),
        Command::EmbedBatch(args) => match args.queue_url() {
            Some(url) => cli::embed_queue::coordinate(&cli.model, args, &url),
            None => cli::embed_batch::run(&cli.model, args),
        },
        Command::EmbedWorker(args) => cli::embed_queue::work(&cli.model, args),
        Command::Models(cmd) => cli::models::run(&cli.model, cmd),
        Command::Demo(args) => cli::demo::run(&cli.model, args),
        Command::Compress(args) => cli::compress::run(&cli.model, args),
        Command::Context(args) => cli::context::run(args),
        Command::Eval(args) => cli::eval::run(&cli.model, args),
        Command::Tune(args) => cli::tune::run(&cli.model, args),
        Command::Serve(args) => cli::serve::run(&cli.model, *args),
        Command::Mcp(args) => cli::mcp::run(&cli.model, args),
        Command::Client(args) => cli::client::run(args),
        Command::Audit(args) => cli::audit::run(args),
        Command::BenchLoad(args) => cli::load::run(&cli.model, args),
        Command::BenchConns(args) => cli::conns::run(&cli.model, args),
        Command::BenchEncode(args) => cli::bench::run(&cli.model, args),
        Command::BenchReplicas(args) => cli::bench_replicas::run(args),
        Command::Handoff(cmd) => cli::handoff::run(cmd),
        #[cfg(feature = "atp")]
        Command::Atp(cli::atp::AtpCommand::Agent(args)) => cli::atp::agent(*args),
        #[cfg(feature = "atp")]
        Command::Atp(cli::atp::AtpCommand::Demo(args)) => cli::atp::demo(args),
        #[cfg(feature = "atp")]
        Command::Atp(cli::atp::AtpCommand::Bench(args)) => cli::atp::bench(args),
        #[cfg(feature = "atp")]
        Command::Atp(cli::atp::AtpCommand::Flood(args)) => cli::atp::flood(args),
        Command::Identity(cmd) => cli::identity::run(cmd),
        Command::Openapi => {
            println!("{}", scd_service::rest::openapi_document());
            Ok(())
        }
    }
}
