//! `scd client`: a small gRPC client for scripts and tests.

use std::path::PathBuf;

use anyhow::Context as _;

use crate::grpc::pb;

/// Client subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum ClientCommand {
    /// Server info.
    Info,
    /// Embed texts given as arguments.
    Embed {
        /// Texts.
        texts: Vec<String>,
        /// Query prefix.
        #[arg(long)]
        query: bool,
    },
    /// Compress a context file for a task.
    Compress {
        /// The task.
        #[arg(long)]
        task: String,
        /// Context JSON file.
        #[arg(long)]
        context: PathBuf,
        /// Budget in tokens.
        #[arg(long)]
        budget: u32,
        /// Keep a session under this id.
        #[arg(long, default_value = "")]
        session: String,
    },
    /// Adaptive request on a session.
    More {
        /// Session id.
        #[arg(long)]
        session: String,
        /// The question.
        #[arg(long)]
        question: String,
        /// Current confidence.
        #[arg(long, default_value_t = 0.5)]
        confidence: f32,
    },
}

/// Arguments of `scd client`.
#[derive(Debug, clap::Args)]
pub struct ClientArgs {
    /// Server address.
    #[arg(long, env = "SCD_CLIENT_ADDR", default_value = "http://127.0.0.1:50051")]
    addr: String,
    #[command(subcommand)]
    command: ClientCommand,
}

fn kind(k: &str) -> i32 {
    match k {
        "code" => pb::FieldKind::Code as i32,
        "log" => pb::FieldKind::Log as i32,
        "json" => pb::FieldKind::Json as i32,
        "chat" => pb::FieldKind::Chat as i32,
        "table" => pb::FieldKind::Table as i32,
        _ => pb::FieldKind::Prose as i32,
    }
}

/// Runs `scd client ...`; prints one JSON object.
pub fn run(args: ClientArgs) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    rt.block_on(async move {
        let mut c = pb::scd_client::ScdClient::connect(args.addr.clone()).await.with_context(|| format!("--addr {}", args.addr))?;
        let out = match args.command {
            ClientCommand::Info => {
                let r = c.info(pb::InfoRequest {}).await?.into_inner();
                serde_json::json!({"model": r.model, "dim": r.dim, "max_tokens": r.max_tokens, "provider": r.provider, "version": r.version})
            }
            ClientCommand::Embed { texts, query } => {
                let kind = if query { pb::InputKind::Query } else { pb::InputKind::Passage } as i32;
                let r = c.embed(pb::EmbedRequest { texts, kind, windows: true }).await?.into_inner();
                serde_json::json!({"model": r.model, "embeddings": r.embeddings.iter().map(|e| serde_json::json!({"tokens": e.tokens, "embedding": e.values})).collect::<Vec<_>>()})
            }
            ClientCommand::Compress { task, context, budget, session } => {
                let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&context).with_context(|| format!("--context {}", context.display()))?)?;
                let fields = v["fields"]
                    .as_array()
                    .context("--context: no \"fields\" array")?
                    .iter()
                    .map(|f| pb::Field {
                        name: f["name"].as_str().unwrap_or_default().into(),
                        kind: kind(f["kind"].as_str().unwrap_or("prose")),
                        content: f["content"].as_str().unwrap_or_default().into(),
                        confidential: f["confidential"].as_bool().unwrap_or(false),
                    })
                    .collect();
                let r = c
                    .compress(pb::CompressRequest {
                        task: Some(pb::Task { description: task, ..Default::default() }),
                        fields,
                        requirement: Some(pb::ContextRequirement { max_context_tokens: budget, ..Default::default() }),
                        session_id: session,
                        session_token: String::new(),
                    })
                    .await?
                    .into_inner();
                let t = r.totals.unwrap_or_default();
                serde_json::json!({"chunks": r.chunks.iter().map(|c| serde_json::json!({"field": c.field, "id": c.id, "text": c.text, "score": c.score, "tokens": c.tokens})).collect::<Vec<_>>(),
                    "totals": {"context_tokens": t.context_tokens, "sent_tokens": t.sent_tokens, "reduction_ratio": t.reduction_ratio, "r_theorem1": t.r_theorem1},
                    "dropped": r.dropped.iter().map(|d| serde_json::json!({"field": d.field, "id": d.id, "stub": d.stub, "tokens": d.tokens})).collect::<Vec<_>>()})
            }
            ClientCommand::More { session, question, confidence } => {
                let r = c
                    .request_context(pb::ContextRequest { session_id: session, specific_question: question, current_confidence: confidence, ..Default::default() })
                    .await?
                    .into_inner();
                serde_json::json!({"chunks": r.chunks.iter().map(|c| serde_json::json!({"id": c.id, "text": c.text, "tokens": c.tokens})).collect::<Vec<_>>(), "remaining_tokens": r.remaining_tokens, "reason": r.reason})
            }
        };
        println!("{out}");
        Ok(())
    })
}
