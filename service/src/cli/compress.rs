//! `scd compress`: minimal sufficient context for a task (the CLI contract is in docs/compress.md).

use std::io::{BufRead, Read, Write};
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{bail, Context as _};
use scd_engine::budget::{BudgetTokenizer, TokenizerRegistry};
use scd_engine::cancel::Cancel;
use scd_engine::context::{ContextRequirement, Task};
use scd_engine::extract::{CompressOptions, CompressRequest, Compressed, DropReason, Explanation, Scd};
use scd_engine::handoff;

use crate::cli::handoff::ReportFormat;
use crate::config::ModelArgs;
use crate::input::{parse_batch_line_with, BatchDefaults};

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
    #[arg(long, required_unless_present_any = ["batch", "files"])]
    context: Option<PathBuf>,
    /// Build the context from files instead (as `scd context` does: a field
    /// per file named by its path, the kind from the extension; folders and
    /// quoted patterns like 'src/**/*.rs' work).
    #[arg(long, num_args = 1.., conflicts_with_all = ["context", "batch"])]
    files: Vec<String>,
    /// With --files: paths matching this pattern are confidential (repeatable).
    #[arg(long, requires = "files")]
    confidential: Vec<String>,
    /// With --files: how folders are walked.
    #[command(flatten)]
    walk: crate::cli::context::WalkArgs,
    /// The second stage (a cross-encoder over the best chunks).
    #[command(flatten)]
    rerank: crate::config::RerankArgs,
    /// The receiver's budget in tokens (hard limit, at least 1). With
    /// --batch: the budget of lines that give neither budget nor rate.
    #[arg(long, required_unless_present_any = ["batch", "rate"], value_parser = clap::value_parser!(u64).range(1..))]
    budget: Option<u64>,
    /// Instead of --budget: keep this share of the context's tokens in
    /// --budget-tokenizer, in (0, 1] (LLMLingua's rate): the budget is the
    /// non-confidential fields' tokens times it, rounded down, at least 1.
    /// With --batch: the rate of lines that give neither budget nor rate.
    #[arg(long, conflicts_with = "budget", allow_negative_numbers = true)]
    rate: Option<f64>,
    /// Fields sent whole, first (comma-separated). With --batch: the
    /// default of lines that give no "required".
    #[arg(long, value_delimiter = ',')]
    required: Vec<String>,
    /// Fields that fill the rest by relevance (comma-separated). With
    /// --batch: the default of lines that give no "optional".
    #[arg(long, value_delimiter = ',')]
    optional: Vec<String>,
    /// Absolute cosine threshold in [-1, 1] (paper's relevance_threshold).
    #[arg(long, allow_negative_numbers = true)]
    threshold: Option<f32>,
    /// Calibrated threshold in standard deviations of the context's scores.
    #[arg(long, allow_negative_numbers = true)]
    min_relative_score: Option<f32>,
    /// JSONL of {"task", "context", "budget" or "rate", "required", "optional",
    /// "threshold", "min_relative_score", "budget_tokenizer", "render",
    /// "explain", "list_dropped"} objects (all but task and context default
    /// to the flags); one result per line, model loaded once. A bad
    /// line gets {"line", "error"} in its place and the others are answered;
    /// the exit status is the number of failed lines (at most 100).
    #[arg(long, conflicts_with_all = ["task", "context"])]
    batch: Option<PathBuf>,
    /// Output format.
    #[arg(long, value_enum, default_value = "json")]
    format: Format,
    /// Hand over the selected context as a hand-off report in this format,
    /// for the next agent: the report, its own text included, is what fits
    /// the budget ("text" in JSON; all that --format text prints). Required
    /// fields always appear in
    /// it whole; fields named report.* (from a parsed report) go back to
    /// their sections, others become payload entries (semi_structured: a
    /// [FIELD_NAME] section).
    #[arg(long, value_enum)]
    render: Option<ReportFormat>,
    /// Count the budget in the receiving LLM's tokenizer: `o200k`, `cl100k`,
    /// `e5` (the encoder's own, the default) or a path to a HuggingFace
    /// tokenizer.json (Llama, Qwen, Mistral, ...). What is sent (the chunks
    /// joined by newlines) never counts more than --budget in it.
    #[arg(long, env = "SCD_BUDGET_TOKENIZER")]
    budget_tokenizer: Option<String>,
    /// Say why each chunk was sent (score parts, packing order, group lead)
    /// or dropped (threshold, budget, near-duplicate of a named chunk, not
    /// eligible): an "explanation" key in JSON, a table on stderr in text.
    #[arg(long)]
    explain: bool,
    /// List the chunks held back (at most 100, best first with --explain)
    /// under "dropped.listed"; by default only their count and tokens.
    #[arg(long)]
    list_dropped: bool,
    /// No embedding progress on stderr (it shows on a terminal only, once
    /// the run has embedded for a second).
    #[arg(long, env = "SCD_QUIET")]
    quiet: bool,
}

impl CompressArgs {
    fn batch_defaults(&self) -> BatchDefaults {
        BatchDefaults {
            budget: self.budget,
            rate: self.rate,
            required: self.required.clone(),
            optional: self.optional.clone(),
            threshold: self.threshold,
            min_relative_score: self.min_relative_score,
        }
    }
}

/// The model, loaded on its first embedding, telling a bar on stderr of each
/// batch it embeds ([`crate::cli::progress`]; none with `quiet`).
fn embedding_with_progress(model: &ModelArgs, quiet: bool) -> anyhow::Result<scd_engine::encoder::LazyOrtEncoder> {
    use crate::cli::progress::{stderr_target, TokenProgress, REVEAL_AFTER};
    Ok(model.lazy_encoder()?.with_progress(TokenProgress::new(stderr_target(quiet), REVEAL_AFTER)))
}

/// The budget tokenizer a local command names (`o200k`, `cl100k`, `e5`) or
/// points at (a tokenizer.json path); errors name `flag`.
pub fn budget_tokenizer(flag: &str, value: Option<&str>) -> anyhow::Result<Option<BudgetTokenizer>> {
    let Some(v) = value else { return Ok(None) };
    TokenizerRegistry::new().resolve_or_load(v).map_err(|e| match e {
        scd_engine::Error::InvalidArgument { message, .. } => {
            anyhow::anyhow!("{flag}: {message}, or a path to a tokenizer.json")
        }
        e => anyhow::anyhow!("{flag} {v}: {e}"),
    })
}

/// `ex` as a compact table: the sent chunks in reading order, then the
/// best `max_dropped` dropped ones with their reasons and a count of the rest.
pub(crate) fn explain_table(
    ex: &Explanation,
    tokenizer: &str,
    max_dropped: usize,
    w: &mut impl Write,
) -> std::io::Result<()> {
    let idw = ex
        .selected
        .iter()
        .map(|c| c.id.len())
        .chain(ex.dropped.iter().take(max_dropped).map(|d| d.id.len()))
        .max()
        .unwrap_or(2)
        .clamp(2, 48);
    // the second stage's column only when it lifted something
    let rerank = ex.selected.iter().any(|c| c.rerank_lift != 0.0);
    let (plus, head) = if rerank { (" + rerank", format!(" {:>6}", "rerank")) } else { ("", String::new()) };
    writeln!(
        w,
        "-- why: score = dense_z + {:.2}*lexical_z + group + link + hop{plus}; tokens in {tokenizer}",
        ex.lexical_weight
    )?;
    writeln!(
        w,
        "{:<idw$} {:>5} {:>7} {:>7} {:>7} {:>6} {:>6} {:>6}{head} {:<5} {:>6}  chunker",
        "id", "order", "score", "dense_z", "lex_z", "group", "link", "hop", "lead", "tokens"
    )?;
    for c in &ex.selected {
        let lead = match (c.required, c.lead, c.by_closure) {
            (true, _, _) => "req",
            (_, true, true) => "lead+",
            (_, true, false) => "lead",
            (_, false, true) => "grp+",
            _ => "-",
        };
        let lift = if rerank { format!(" {:>6.2}", c.rerank_lift) } else { String::new() };
        writeln!(
            w,
            "{:<idw$} {:>5} {:>7.2} {:>7.2} {:>7.2} {:>6.2} {:>6.2} {:>6.2}{lift} {:<5} {:>6}  {}",
            clip(&c.id, idw),
            c.order,
            c.score,
            c.dense_z,
            c.lexical_z,
            c.group_lift,
            c.link_lift,
            c.hop_lift,
            lead,
            c.tokens,
            c.chunker.as_deref().unwrap_or("-")
        )?;
    }
    let shown = ex.dropped.len().min(max_dropped);
    writeln!(w, "-- dropped: {} (best {shown} shown)", ex.dropped.len())?;
    for d in ex.dropped.iter().take(max_dropped) {
        let why = match &d.reason {
            DropReason::BelowThreshold { threshold, value } => format!("below {threshold} ({value:.2})"),
            DropReason::OutOfBudget => "out of budget".to_string(),
            DropReason::NearDuplicate { of } => format!("near-duplicate of {of}"),
            DropReason::NotEligible => "not eligible (field not in optional_fields)".to_string(),
            DropReason::StructureOnly => "structure only (sent with a member of its group)".to_string(),
        };
        writeln!(w, "{:<idw$} {:>7.2} {:>6}  {why}", clip(&d.id, idw), d.score, d.tokens)?;
    }
    if ex.dropped.len() > shown {
        writeln!(w, "-- and {} more dropped", ex.dropped.len() - shown)?;
    }
    Ok(())
}

fn clip(s: &str, width: usize) -> String {
    if s.chars().count() <= width {
        return s.to_string();
    }
    let mut t: String = s.chars().take(width.saturating_sub(1)).collect();
    t.push('…');
    t
}

/// The one output view ([`crate::view`]), built from the engine's result as
/// every surface builds it.
fn to_json(out: Compressed, list_dropped: bool) -> anyhow::Result<serde_json::Value> {
    Ok(serde_json::to_value(crate::view::compressed_view(out, list_dropped))?)
}

/// Writes one result. Text: stdout gets exactly what the receiver pastes
/// (`text`: the chunks, or the report with --render), within the budget;
/// the sizes (and the --explain table) go to stderr.
fn print(out: Compressed, list_dropped: bool, format: Format, w: &mut impl Write) -> anyhow::Result<()> {
    match format {
        Format::Json => writeln!(w, "{}", to_json(out, list_dropped)?)?,
        Format::Text => {
            writeln!(w, "{}", out.text)?;
            let mut e = std::io::stderr().lock();
            writeln!(
                e,
                "-- {} of {} {} tokens sent ({:.1}x reduction, {:.1}x asked); {} chunks held back",
                out.totals.sent_tokens,
                out.totals.context_tokens,
                out.totals.tokenizer,
                out.totals.reduction_ratio,
                out.totals.requested_ratio,
                out.dropped.len()
            )?;
            if let Some(ex) = &out.explanation {
                explain_table(ex, &out.totals.tokenizer, 20, &mut e)?;
            }
        }
    }
    Ok(())
}

/// Checks the flags that need no model, so a typo fails at once.
fn check_args(args: &CompressArgs) -> anyhow::Result<()> {
    if let Some(rate) = args.rate {
        scd_engine::budget::check_rate("--rate", rate)?;
    }
    if let Some(t) = args.threshold {
        anyhow::ensure!(
            t.is_finite() && (-1.0..=1.0).contains(&t),
            "--threshold: must be a cosine in [-1, 1], got {t}"
        );
    }
    if let Some(t) = args.min_relative_score {
        anyhow::ensure!(t.is_finite(), "--min-relative-score: must be finite");
    }
    if let Some(batch) = &args.batch {
        anyhow::ensure!(batch.is_file(), "--batch {}: no such file", batch.display());
    }
    if let Some(path) = &args.context {
        anyhow::ensure!(path.as_os_str() == "-" || path.is_file(), "--context {}: no such file", path.display());
    }
    Ok(())
}

/// The one request of `scd compress` without --batch: the context read
/// (`--context`) or built (`--files`), the budget from --budget or, with
/// --rate, that share of the context's tokens in `tokenizer`.
fn single_request(
    scd: &Scd,
    args: &mut CompressArgs,
    tokenizer: Option<&BudgetTokenizer>,
) -> anyhow::Result<CompressRequest> {
    let Some(task) = args.task.take() else { bail!("--task is required without --batch") };
    let context = if args.files.is_empty() {
        let Some(path) = args.context.take() else { bail!("--context (or --files) is required without --batch") };
        let mut raw = String::new();
        if path.as_os_str() == "-" {
            std::io::stdin().read_to_string(&mut raw)?;
        } else {
            raw = std::fs::read_to_string(&path).with_context(|| format!("--context {}", path.display()))?;
        }
        crate::cli::context::parse_context(&path, &raw)?
    } else {
        let (files, confidential) = (std::mem::take(&mut args.files), std::mem::take(&mut args.confidential));
        let files = crate::cli::context::ContextArgs::files(files, confidential, std::mem::take(&mut args.walk));
        crate::cli::context::build(&files, &scd.config().limits.context_limits).context("--files")?
    };
    let budget = match (args.budget, args.rate) {
        (Some(budget), _) => usize::try_from(budget).unwrap_or(usize::MAX),
        (None, Some(rate)) => scd.rate_budget(&context, tokenizer, rate)?,
        (None, None) => bail!("--budget or --rate is required without --batch"),
    };
    let requirement = ContextRequirement {
        required_fields: std::mem::take(&mut args.required),
        optional_fields: std::mem::take(&mut args.optional),
        max_context_tokens: budget,
        relevance_threshold: args.threshold,
        min_relative_score: args.min_relative_score,
    };
    Ok(CompressRequest { task: Task::new(task), context, requirement, session: None })
}

/// Runs `scd compress`.
pub fn run(model: &ModelArgs, mut args: CompressArgs) -> anyhow::Result<()> {
    check_args(&args)?;
    let opts = CompressOptions {
        budget_tokenizer: budget_tokenizer("--budget-tokenizer", args.budget_tokenizer.as_deref())?,
        explain: args.explain,
        envelope: None,
    };
    // with --render the report, wrapping included, is what fits the budget
    let render = args.render;
    let with_render = |req: &CompressRequest| CompressOptions {
        envelope: render.map(|f| handoff::envelope(req, f.into(), None)),
        ..opts.clone()
    };
    // the session is made on the first embedding (a call the embedding
    // cache answers whole loads no model); batches embedded show on stderr
    let mut cfg = model.scd_config();
    args.rerank.apply(&mut cfg.scoring);
    let reranker = args.rerank.load_if_weighted(model)?;
    let scd = Scd::new(Arc::new(embedding_with_progress(model, args.quiet)?), cfg).with_reranker(reranker);
    let mut stdout = std::io::stdout().lock();
    if let Some(batch) = &args.batch {
        let f = std::fs::File::open(batch).with_context(|| format!("--batch {}", batch.display()))?;
        let (mut total, mut failed) = (0usize, 0usize);
        let defaults = args.batch_defaults();
        // tokenizers the lines name, loaded once each
        let mut tokenizers: std::collections::HashMap<String, Option<BudgetTokenizer>> = Default::default();
        for (n, line) in std::io::BufReader::new(f).lines().enumerate() {
            let line = line.with_context(|| format!("--batch line {}", n + 1))?;
            if line.trim().is_empty() {
                continue;
            }
            total += 1;
            let result = parse_batch_line_with(&line, &defaults).and_then(|(r, line_opts)| {
                // a line's own options over the flags'
                let mut o = with_render(&r);
                if let Some(name) = &line_opts.budget_tokenizer {
                    o.budget_tokenizer = match tokenizers.get(name) {
                        Some(t) => t.clone(),
                        None => {
                            let t = budget_tokenizer("budget_tokenizer", Some(name))?;
                            tokenizers.insert(name.clone(), t.clone());
                            t
                        }
                    };
                }
                if let Some(f) = line_opts.render {
                    o.envelope = Some(handoff::envelope(&r, f, None));
                }
                o.explain = line_opts.explain.unwrap_or(o.explain);
                let mut r = r;
                if let Some(rate) = line_opts.rate {
                    r.requirement.max_context_tokens =
                        scd.rate_budget(&r.context, o.budget_tokenizer.as_ref(), rate)?;
                }
                let out = scd.compress_opts(&r, &o, &Cancel::new())?;
                Ok((out, line_opts.list_dropped.unwrap_or(args.list_dropped)))
            });
            match result {
                Ok((out, list)) => print(out, list, args.format, &mut stdout)?,
                Err(e) => {
                    failed += 1;
                    let msg = format!("{e:#}");
                    match args.format {
                        Format::Json => writeln!(stdout, "{}", serde_json::json!({"line": n + 1, "error": msg}))?,
                        Format::Text => writeln!(stdout, "-- line {}: error: {msg}", n + 1)?,
                    }
                }
            }
        }
        stdout.flush()?;
        if failed > 0 {
            eprintln!("{failed} of {total} lines failed (exit status {})", failed.min(100));
            std::process::exit(failed.min(100) as i32);
        }
        return Ok(());
    }
    let req = single_request(&scd, &mut args, opts.budget_tokenizer.as_ref())?;
    let out = scd.compress_opts(&req, &with_render(&req), &Cancel::new())?;
    print(out, args.list_dropped, args.format, &mut stdout)?;
    if args.format == Format::Text {
        let s = scd.cache_stats();
        eprintln!(
            "-- embeddings: {} computed, {} from the cache file{}",
            s.misses,
            s.disk_hits,
            scd.config().prepare.embedding_store.as_ref().map_or(" (off)".to_string(), |p| format!(" {}", p.display()))
        );
    }
    stdout.flush()?;
    // the process ends here: freeing the model's 250k-entry vocabulary and
    // the caches one by one would cost a quarter of a warm call
    std::mem::forget(scd);
    Ok(())
}
