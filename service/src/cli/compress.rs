//! `scd compress`: minimal sufficient context for a task (CLI contract in README).

use std::io::{BufRead, Read, Write};
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{bail, Context as _};
use scd_engine::context::{Context, ContextRequirement, Task};
use scd_engine::extract::{CompressRequest, Compressed, Scd, ScdConfig};

use crate::config::ModelArgs;

/// Output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// One JSON object per result.
    Json,
    /// The selected text, for reading.
    Text,
}

/// Arguments of `scd compress`.
#[derive(Debug, clap::Args)]
pub struct CompressArgs {
    /// The task description.
    #[arg(long, required_unless_present = "batch")]
    task: Option<String>,
    /// Context JSON `{"fields": [{"name", "kind", "content", "confidential"}]}`; `-` reads stdin.
    #[arg(long, required_unless_present = "batch")]
    context: Option<PathBuf>,
    /// The receiver's budget in tokens (hard limit).
    #[arg(long, required_unless_present = "batch")]
    budget: Option<usize>,
    /// Fields sent whole, first (comma-separated).
    #[arg(long, value_delimiter = ',')]
    required: Vec<String>,
    /// Fields that fill the rest by relevance (comma-separated).
    #[arg(long, value_delimiter = ',')]
    optional: Vec<String>,
    /// Absolute cosine threshold (paper's relevance_threshold).
    #[arg(long)]
    threshold: Option<f32>,
    /// Calibrated threshold in standard deviations of the context's scores.
    #[arg(long)]
    min_relative_score: Option<f32>,
    /// JSONL of {"task", "context", "budget"} objects; one result per line, model loaded once.
    #[arg(long, conflicts_with_all = ["task", "context"])]
    batch: Option<PathBuf>,
    /// Output format.
    #[arg(long, value_enum, default_value = "json")]
    format: Format,
}

fn to_json(out: &Compressed) -> serde_json::Value {
    serde_json::json!({
        "chunks": out.chunks.iter().map(|c| serde_json::json!({"field": c.field, "id": c.id, "text": c.text, "score": c.score, "tokens": c.tokens, "span": [c.span.0, c.span.1]})).collect::<Vec<_>>(),
        "totals": out.totals,
        "dropped": out.dropped,
        "task_embedding": out.task_embedding,
        "warnings": out.warnings,
        "timings_ms": out.timings,
    })
}

fn print(out: &Compressed, format: Format, w: &mut impl Write) -> anyhow::Result<()> {
    match format {
        Format::Json => writeln!(w, "{}", to_json(out))?,
        Format::Text => {
            for c in &out.chunks {
                writeln!(w, "[{}] {}", c.id, c.text)?;
            }
            writeln!(
                w,
                "-- {} of {} tokens sent ({:.1}x reduction, R={:.1}); {} chunks dropped",
                out.totals.sent_tokens,
                out.totals.context_tokens,
                out.totals.reduction_ratio,
                out.totals.r_theorem1,
                out.dropped.len()
            )?;
        }
    }
    Ok(())
}

/// The request on line `line_no` (1-based) of `--batch`: a JSON object with
/// a string `task`, a `context` and an integer `budget`.
pub(crate) fn parse_batch_line(line_no: usize, raw: &str) -> anyhow::Result<CompressRequest> {
    let v: serde_json::Value =
        serde_json::from_str(raw).with_context(|| format!("--batch line {line_no}: not JSON"))?;
    let task = v["task"].as_str().with_context(|| format!("--batch line {line_no}: no string \"task\""))?;
    let context: Context = serde_json::from_value(v["context"].clone())
        .with_context(|| format!("--batch line {line_no}: bad \"context\""))?;
    let budget =
        v["budget"].as_u64().with_context(|| format!("--batch line {line_no}: no integer \"budget\""))? as usize;
    Ok(CompressRequest {
        task: Task::new(task),
        context,
        requirement: ContextRequirement::with_budget(budget),
        session_id: None,
    })
}

/// Runs `scd compress`.
pub fn run(model: &ModelArgs, args: CompressArgs) -> anyhow::Result<()> {
    let scd = Scd::new(Arc::new(model.load_encoder()?), ScdConfig::default());
    let mut stdout = std::io::stdout().lock();
    if let Some(batch) = &args.batch {
        let f = std::fs::File::open(batch).with_context(|| format!("--batch {}", batch.display()))?;
        for (n, line) in std::io::BufReader::new(f).lines().enumerate() {
            let line = line?;
            if line.trim().is_empty() {
                continue;
            }
            let out = scd.compress(&parse_batch_line(n + 1, &line)?)?;
            print(&out, args.format, &mut stdout)?;
        }
        return Ok(());
    }
    let (Some(task), Some(path), Some(budget)) = (args.task, args.context, args.budget) else {
        bail!("--task, --context and --budget are required without --batch");
    };
    let mut raw = String::new();
    if path.as_os_str() == "-" {
        std::io::stdin().read_to_string(&mut raw)?;
    } else {
        raw = std::fs::read_to_string(&path).with_context(|| format!("--context {}", path.display()))?;
    }
    let context: Context = serde_json::from_str(&raw)
        .context("--context: expected {\"fields\": [{\"name\", \"kind\", \"content\", \"confidential\"}]}")?;
    let requirement = ContextRequirement {
        required_fields: args.required,
        optional_fields: args.optional,
        max_context_tokens: budget,
        relevance_threshold: args.threshold,
        min_relative_score: args.min_relative_score,
    };
    let out = scd.compress(&CompressRequest { task: Task::new(task), context, requirement, session_id: None })?;
    print(&out, args.format, &mut stdout)
}
