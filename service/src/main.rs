//! `scd`: the SCD command line (embed, models, compress, serve, ...).
//!
//! Thin by design: parse arguments, install telemetry, call the engine.

use clap::{CommandFactory as _, FromArgMatches as _, Parser, Subcommand};
use scd_service::config::WithModel;
use scd_service::{cli, config, telemetry};

/// SCD: minimal sufficient context for AI agents.
#[derive(Debug, Parser)]
#[command(name = "scd", version, about, propagate_version = true)]
struct Cli {
    /// Log format on stderr.
    #[arg(long, env = "SCD_LOG_FORMAT", value_enum, default_value = "text", global = true)]
    log_format: telemetry::LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Embed texts (one per input line) and print JSONL {text_index, tokens, windows, embedding}.
    Embed(WithModel<cli::embed::EmbedArgs>),
    /// Embed a JSONL corpus into .npy or .jsonl: pipelined, resumable, with progress and a summary.
    EmbedBatch(WithModel<cli::embed_batch::EmbedBatchArgs>),
    /// Embed shards of a corpus that `scd embed-batch --queue` puts on Redis; run any number, anywhere.
    EmbedWorker(WithModel<cli::embed_queue::EmbedWorkerArgs>),
    /// Model management.
    Models(cli::models::ModelsArgs),
    /// Rank sample context against a task: the README's first command.
    Demo(WithModel<cli::demo::DemoArgs>),
    /// Minimal sufficient context for a task under a token budget.
    Compress(WithModel<cli::compress::CompressArgs>),
    /// Build a context from files (name: the path, kind: the extension): `scd context src/ notes.md > ctx.json`.
    Context(cli::context::ContextArgs),
    /// Run the gRPC service (scd.v1.Scd, health, reflection, metrics).
    Serve(Box<WithModel<cli::serve::ServeArgs>>),
    /// Serve the engine as MCP tools over stdio (or streamable HTTP with --http-addr).
    Mcp(WithModel<cli::mcp::McpArgs>),
    /// Call a running service.
    Client(cli::client::ClientArgs),
    /// Query the audit trail (a server's --audit-db) as JSON lines.
    Audit(cli::audit::AuditArgs),
    /// Hand-off reports (freeform, semi_structured, structured_soft): parse and render.
    #[command(subcommand)]
    Handoff(cli::handoff::HandoffCommand),
    /// The ATP stack: run an agent (its demo, flood and simulator: `scd-dev atp`).
    #[cfg(feature = "atp")]
    #[command(subcommand)]
    Atp(cli::atp::AtpCommand),
    /// Identities for DID-authenticated calls (serve --auth did-wba, client --identity).
    #[command(subcommand)]
    Identity(cli::identity::IdentityCommand),
    /// Print the OpenAPI document of the REST API (what `scd serve --http-addr` serves at /openapi.json).
    Openapi,
}

/// Runs the command; an error is one line on stderr and exit status 1
/// ([`scd_service::cli::exit`]).
fn main() -> std::process::ExitCode {
    scd_service::cli::exit(run())
}

fn run() -> anyhow::Result<()> {
    // model flags before the subcommand (`scd --threads 2 compress`) go after it,
    // where they are defined; then `scd serve --config FILE`: the file's
    // settings as flags (those the command line or the environment gives win)
    let argv = config::model_flags_after_subcommand(&Cli::command(), std::env::args_os().collect());
    let argv = cli::config_file::apply(&Cli::command(), argv)?;
    // the matches too: `scd mcp` tells a flag from its environment variable
    let matches = Cli::command().get_matches_from(argv);
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    let level = match &cli.command {
        Command::Serve(_) | Command::EmbedWorker(_) => "info",
        #[cfg(feature = "atp")]
        Command::Atp(cli::atp::AtpCommand::Agent(_)) => "info",
        _ => "warn",
    };
    telemetry::init(cli.log_format, level);
    match cli.command {
        Command::Embed(w) => cli::embed::run(&w.model, w.args),
        Command::EmbedBatch(WithModel { model, args }) => match args.queue_url() {
            Some(url) => cli::embed_queue::coordinate(&model, args, &url),
            None => cli::embed_batch::run(&model, args),
        },
        Command::EmbedWorker(w) => cli::embed_queue::work(&w.model, w.args),
        Command::Models(args) => cli::models::run(args),
        Command::Demo(w) => cli::demo::run(&w.model, w.args),
        Command::Compress(w) => cli::compress::run(&w.model, w.args),
        Command::Context(args) => cli::context::run(args),
        Command::Serve(w) => {
            let WithModel { model, args } = *w;
            cli::serve::run(&model, args)
        }
        Command::Mcp(w) => {
            let sub = matches.subcommand_matches("mcp").expect("the mcp subcommand ran");
            cli::mcp::run(&w.model, w.args, sub)
        }
        Command::Client(args) => cli::client::run(args),
        Command::Audit(args) => cli::audit::run(args),
        Command::Handoff(cmd) => cli::handoff::run(cmd),
        #[cfg(feature = "atp")]
        Command::Atp(cli::atp::AtpCommand::Agent(args)) => cli::atp::agent(*args),
        Command::Identity(cmd) => cli::identity::run(cmd),
        Command::Openapi => {
            println!("{}", scd_service::rest::openapi_document());
            Ok(())
        }
    }
}
