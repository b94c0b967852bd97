//! `scd demo`: compress the sample agent context in `fixtures/` for a task,
//! then ask for more context the way a receiver does mid-task.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context as _;
use scd_engine::context::{Context, ContextRequirement, Task};
use scd_engine::encoder::Encoder;
use scd_engine::extract::{CompressRequest, ContextRequest, Scd, ScdConfig, SessionRequest};

use crate::config::ModelArgs;

/// The demo's receiver budget, as a share of the context's tokens (also
/// used by `scd-dev eval`'s agent-fixture check).
pub const DEMO_SHARE: f32 = 0.8;
/// The demo's relevance floor (z-score) for the first answer.
pub const DEMO_MIN_RELATIVE_SCORE: f32 = 0.5;

/// Arguments of `scd demo`.
#[derive(Debug, clap::Args)]
pub struct DemoArgs {
    /// The task handed to the receiver.
    #[arg(
        long,
        default_value = "Why are customer charges failing at checkout, and which code path and table are involved?"
    )]
    task: String,
    /// The sender's context.
    #[arg(long, default_value = "fixtures/agent_context.json")]
    context: PathBuf,
    /// Receiver budget as a share of the context's tokens.
    #[arg(long, default_value_t = DEMO_SHARE)]
    share: f32,
    /// Send only chunks scoring at least this many standard deviations above
    /// the context's mean (the rest of the budget stays for later requests).
    #[arg(long, default_value_t = DEMO_MIN_RELATIVE_SCORE)]
    min_relative_score: f32,
}

/// Runs `scd demo`.
pub fn run(model: &ModelArgs, args: DemoArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.share > 0.0 && args.share <= 1.0, "--share: must be in (0, 1], got {}", args.share);
    let raw =
        std::fs::read_to_string(&args.context).with_context(|| format!("--context {}", args.context.display()))?;
    let context = Context::from_json(&raw).context("--context")?;
    let t0 = Instant::now();
    let encoder = Arc::new(model.load_encoder()?);
    println!(
        "model {} on {} (dim {}), loaded in {} ms",
        encoder.model_id(),
        encoder.provider(),
        encoder.dim(),
        t0.elapsed().as_millis()
    );
    let scd = Scd::new(encoder.clone(), ScdConfig::default());
    let total: usize = context
        .fields
        .iter()
        .filter(|f| !f.confidential)
        .map(|f| encoder.count_tokens(&f.content))
        .sum::<Result<_, _>>()?;
    let budget = ((total as f32 * args.share) as usize).max(1);
    let out = scd.compress(&CompressRequest {
        task: Task::new(args.task.clone()),
        context,
        requirement: ContextRequirement {
            min_relative_score: Some(args.min_relative_score),
            ..ContextRequirement::with_budget(budget)
        },
        session: Some(SessionRequest::default()),
    })?;
    let session = out.session.clone().context("the engine opened a session")?;
    println!("task: {}\nbudget: {budget} of {total} tokens\n", args.task);
    for c in &out.chunks {
        println!("[{}] (score {:.2}, {} tokens)\n{}\n", c.id, c.score, c.tokens, c.text);
    }
    println!(
        "sent {} of {} tokens: {:.2}x reduction (R = {:.2}); {} chunks dropped, listed by id for later requests; {:.0} ms",
        out.totals.sent_tokens,
        out.totals.context_tokens,
        out.totals.reduction_ratio,
        out.totals.r_theorem1,
        out.dropped.len(),
        out.timings.prepare_ms + out.timings.task_embed_ms + out.timings.select_ms
    );
    let question = "What else happened in the logs after the error?";
    let more = scd.request_more(&ContextRequest {
        session_id: session.id,
        session_token: session.token,
        caller: None,
        scope: None,
        specific_question: question.into(),
        current_confidence: 0.4,
        reasoning: "need to know whether the failure persisted".into(),
        chunk_ids: vec![],
        max_tokens: None,
        request_id: None,
    })?;
    println!("\nreceiver asks (confidence 0.4): {question}");
    for c in &more.chunks {
        println!("[{}] {}", c.id, c.text);
    }
    println!(
        "{} new chunks, {} tokens of budget left{}",
        more.chunks.len(),
        more.remaining_tokens,
        more.reason.map(|r| format!(" ({r})")).unwrap_or_default()
    );
    Ok(())
}
