//! `scd-dev atp …`: the ATP stack's developer tools (see the `scd-atp`
//! crate): a live demo network, a flood of maximal tasks against one
//! worker, and the seeded simulation bench. They start the product binary
//! (`scd serve`, `scd atp agent`: [`crate::scd_exe`]); `scd atp agent`
//! itself stays in `scd`, where users run it.

pub mod demo;
pub mod flood;
pub mod sim;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context as _};
use clap::{Args, Subcommand};
use scd_atp::pb;

/// `scd-dev atp` subcommands.
#[derive(Debug, Subcommand)]
pub enum AtpCommand {
    /// A live network on loopback: SCD, six worker processes, a planner; kills a worker mid-task.
    Demo(DemoArgs),
    /// AgentNet-Bench-style SIMULATION comparing ATP with three baselines.
    Bench(BenchArgs),
    /// One worker under a flood of maximal tasks from many peers; samples its RSS.
    Flood(FloodArgs),
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread().enable_all().build().context("starting the async runtime")
}

/// `scd-dev atp demo`.
#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Write the summary as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// The multi-field context the pipeline works on.
    #[arg(long, default_value = "fixtures/atp_demo_context.json")]
    pub context: PathBuf,
    /// Where identities and stores go (default: a fresh temporary directory).
    #[arg(long)]
    pub workdir: Option<PathBuf>,
    /// Use this running SCD instead of starting `scd serve`.
    #[arg(long)]
    pub scd: Option<String>,
    /// Heartbeat interval of the workers.
    #[arg(long, default_value_t = 300)]
    pub heartbeat_ms: u64,
}

/// Runs `scd-dev atp demo`.
pub fn demo(args: DemoArgs) -> anyhow::Result<()> {
    if !args.context.is_file() {
        bail!("--context {}: no such file", args.context.display());
    }
    let (workdir, _tmp) = workdir_or_temp(&args.workdir)?;
    let cfg = demo::DemoConfig {
        exe: crate::scd_exe()?,
        context: args.context.clone(),
        workdir,
        scd_url: args.scd.clone(),
        heartbeat: Duration::from_millis(args.heartbeat_ms.clamp(10, 60_000)),
    };
    let report = runtime()?.block_on(async {
        let mut out = std::io::stdout();
        demo::run(&cfg, &mut out).await
    })?;
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&report)? + "\n")
            .with_context(|| format!("--json {}", path.display()))?;
    }
    if report.tasks_lost > 0 {
        bail!("{} task(s) lost", report.tasks_lost);
    }
    Ok(())
}

/// `dir`, or a fresh temporary directory (removed when the guard drops).
fn workdir_or_temp(dir: &Option<PathBuf>) -> anyhow::Result<(PathBuf, Option<tempfile::TempDir>)> {
    match dir {
        Some(d) => Ok((d.clone(), None)),
        None => {
            let tmp = tempfile::tempdir().context("creating a temporary directory")?;
            Ok((tmp.path().to_path_buf(), Some(tmp)))
        }
    }
}

/// `scd-dev atp flood`.
#[derive(Debug, Args)]
pub struct FloodArgs {
    /// Tasks the worker must accept in all.
    #[arg(long, default_value_t = 200)]
    pub tasks: u64,
    /// Concurrent flooding peers, each with its own DID and connection.
    #[arg(long, default_value_t = 8)]
    pub requesters: usize,
    /// Chunk text per task in bytes (default: the largest that fits one
    /// 16 MiB message).
    #[arg(long, default_value_t = flood::DEFAULT_CONTEXT_BYTES)]
    pub context_bytes: usize,
    /// The worker's --max-queue.
    #[arg(long, default_value_t = 8)]
    pub max_queue: usize,
    /// The worker's --max-running.
    #[arg(long, default_value_t = 2)]
    pub max_running: usize,
    /// The simulated time one task takes at the worker (its 100 steps share it).
    #[arg(long, default_value_t = 500)]
    pub task_ms: u64,
    /// Where the worker's identity and store go (default: a fresh temporary directory).
    #[arg(long)]
    pub workdir: Option<PathBuf>,
    /// Write the report (with every RSS sample) as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Write the RSS over time as SVG here.
    #[arg(long)]
    pub plot: Option<PathBuf>,
}

/// Runs `scd-dev atp flood`.
pub fn flood(args: FloodArgs) -> anyhow::Result<()> {
    if args.tasks == 0 || args.requesters == 0 || args.requesters > 256 {
        bail!("--tasks must be at least 1 and --requesters 1 to 256");
    }
    if args.context_bytes == 0 || args.context_bytes > flood::DEFAULT_CONTEXT_BYTES {
        bail!("--context-bytes {}: must be 1 to {} (one message)", args.context_bytes, flood::DEFAULT_CONTEXT_BYTES);
    }
    if args.task_ms == 0 || args.task_ms > 600_000 {
        bail!("--task-ms {}: must be 1 to 600000", args.task_ms);
    }
    let (workdir, _tmp) = workdir_or_temp(&args.workdir)?;
    let cfg = flood::FloodConfig {
        exe: crate::scd_exe()?,
        workdir,
        tasks: args.tasks,
        requesters: args.requesters,
        context_bytes: args.context_bytes,
        max_queue: args.max_queue,
        max_running: args.max_running,
        task_ms: args.task_ms,
    };
    let report = runtime()?.block_on(flood::run(&cfg))?;
    println!("{}", report.summary());
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&report)? + "\n")
            .with_context(|| format!("--json {}", path.display()))?;
    }
    if let Some(path) = &args.plot {
        flood::write_svg(&report, path)?;
    }
    Ok(())
}

/// `scd-dev atp bench`.
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Agents in the simulated network.
    #[arg(long, default_value_t = 50)]
    pub agents: usize,
    /// Tasks to simulate.
    #[arg(long, default_value_t = 10_000)]
    pub tasks: usize,
    /// RNG seed.
    #[arg(long, default_value_t = 7)]
    pub seed: u64,
    /// Write the report as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Write an SVG plot here.
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// Use this running SCD for the context samples instead of starting `scd serve`.
    #[arg(long)]
    pub scd: Option<String>,
    /// The development sets whose contexts SCD compresses for the samples
    /// (MuSiQue and HotpotQA questions with their paragraphs).
    #[arg(long, env = "SCD_EVALDATA", default_value = "../shared/evaldata")]
    pub evaldata: PathBuf,
    /// Contexts sampled per dataset.
    #[arg(long, default_value_t = 40)]
    pub samples: usize,
    /// The receiver budget SCD compresses to (tokens), as an agent's offer asks.
    #[arg(long, default_value_t = 512)]
    pub budget: u32,
}

/// One real context: a question and its paragraphs, some marked as the
/// evidence the question needs.
struct RealContext {
    question: String,
    fields: Vec<scd_atp::context::Field>,
    evidence: Vec<String>,
}

fn paragraph(name: String, text: String) -> scd_atp::context::Field {
    scd_atp::context::Field { name, kind: scd_atp::context::FieldKind::default(), content: text, confidential: false }
}

/// Up to `n` MuSiQue and `n` HotpotQA contexts (one field per paragraph).
fn real_contexts(dir: &std::path::Path, n: usize) -> anyhow::Result<Vec<RealContext>> {
    let mut out = Vec::new();
    let musique = dir.join("musique/musique_ans_sample.jsonl");
    let raw = std::fs::read_to_string(&musique).with_context(|| format!("--evaldata: {}", musique.display()))?;
    for line in raw.lines().filter(|l| !l.trim().is_empty()).take(n) {
        let v: serde_json::Value =
            serde_json::from_str(line).with_context(|| format!("{}: not JSON", musique.display()))?;
        let mut fields = Vec::new();
        let mut evidence = Vec::new();
        for (i, p) in v["paragraphs"].as_array().into_iter().flatten().enumerate() {
            let name = format!("p{i}");
            if p["is_supporting"].as_bool() == Some(true) {
                evidence.push(name.clone());
            }
            let text = format!("{}\n{}", p["title"].as_str().unwrap_or(""), p["paragraph_text"].as_str().unwrap_or(""));
            fields.push(paragraph(name, text));
        }
        out.push(RealContext { question: v["question"].as_str().unwrap_or("").to_string(), fields, evidence });
    }
    let hotpot = dir.join("hotpotqa/hotpot_original_schema.json");
    let raw = std::fs::read_to_string(&hotpot).with_context(|| format!("--evaldata: {}", hotpot.display()))?;
    let all: Vec<serde_json::Value> =
        serde_json::from_str(&raw).with_context(|| format!("{}: not JSON", hotpot.display()))?;
    for v in all.iter().take(n) {
        let support: Vec<&str> =
            v["supporting_facts"].as_array().into_iter().flatten().filter_map(|f| f[0].as_str()).collect();
        let mut fields = Vec::new();
        let mut evidence = Vec::new();
        for (i, c) in v["context"].as_array().into_iter().flatten().enumerate() {
            let title = c[0].as_str().unwrap_or("");
            let name = format!("p{i}");
            if support.contains(&title) && !evidence.contains(&name) {
                evidence.push(name.clone());
            }
            let sentences: Vec<&str> = c[1].as_array().into_iter().flatten().filter_map(|s| s.as_str()).collect();
            fields.push(paragraph(name, format!("{title}\n{}", sentences.concat())));
        }
        out.push(RealContext { question: v["question"].as_str().unwrap_or("").to_string(), fields, evidence });
    }
    anyhow::ensure!(!out.is_empty(), "--evaldata {}: no contexts", dir.display());
    Ok(out)
}

/// Runs `scd-dev atp bench`: measures SCD's real reduction on real contexts over
/// gRPC, then runs the seeded simulation with those samples.
pub fn bench(args: BenchArgs) -> anyhow::Result<()> {
    use indicatif::{ProgressBar, ProgressStyle};

    anyhow::ensure!((2..=10_000).contains(&args.agents), "--agents {}: must be 2 to 10000", args.agents);
    anyhow::ensure!((1..=1_000_000).contains(&args.tasks), "--tasks {}: must be 1 to 1000000", args.tasks);
    anyhow::ensure!((1..=1000).contains(&args.samples), "--samples {}: must be 1 to 1000", args.samples);
    anyhow::ensure!(args.budget > 0, "--budget 0: must be at least 1 token");
    let contexts = real_contexts(&args.evaldata, args.samples)?;
    let exe = crate::scd_exe()?;
    let rt = runtime()?;
    let (samples, recall) = rt.block_on(async {
        let (_scd, url) = match &args.scd {
            Some(u) => (None, u.clone()),
            None => {
                let (p, u) = demo::start_scd(&exe)?;
                (Some(p), u)
            }
        };
        demo::wait_serving(&url).await?;
        let link = scd_atp::context::ScdLink::connect(&url).await?;
        let bar = ProgressBar::new(contexts.len() as u64);
        bar.set_style(ProgressStyle::with_template("SCD samples {bar:30} {pos}/{len} {msg}").expect("template"));
        let requirement = pb::ContextRequirement { max_context_tokens: args.budget, ..Default::default() };
        let mut samples = Vec::new();
        let (mut found, mut needed) = (0usize, 0usize);
        for c in &contexts {
            let t = link.compress(&scd_atp::context::Task::new(c.question.clone()), &c.fields, &requirement).await?;
            let sent: std::collections::HashSet<&str> = t.diff.chunks.iter().map(|k| k.field.as_str()).collect();
            found += c.evidence.iter().filter(|e| sent.contains(e.as_str())).count();
            needed += c.evidence.len();
            samples.push(sim::ContextSample { full_tokens: t.full_tokens, sent_tokens: t.sent_tokens });
            let _ = link.close(&t.session).await;
            bar.inc(1);
        }
        bar.finish_and_clear();
        Ok::<_, anyhow::Error>((samples, found as f64 / needed.max(1) as f64))
    })?;
    let full: u64 = samples.iter().map(|s| s.full_tokens).sum();
    let sent: u64 = samples.iter().map(|s| s.sent_tokens).sum();
    eprintln!(
        "SCD on {} real contexts (MuSiQue + HotpotQA, budget {}): {sent} of {full} tokens sent ({:.2}x less); evidence paragraphs kept: {:.3}",
        samples.len(),
        args.budget,
        full as f64 / sent.max(1) as f64,
        recall
    );
    let cfg = sim::SimConfig { agents: args.agents, tasks: args.tasks, seed: args.seed, ..sim::SimConfig::default() };
    let spinner = ProgressBar::new_spinner();
    spinner.set_message(format!(
        "simulating {} tasks on {} agents: four strategies, then ATP without each layer",
        args.tasks, args.agents
    ));
    spinner.enable_steady_tick(Duration::from_millis(200));
    let started = std::time::Instant::now();
    let report = sim::run(&cfg, &samples)?;
    spinner.finish_and_clear();
    eprintln!("simulated in {:.1} s", started.elapsed().as_secs_f64());
    println!(
        "SIMULATION (seeded, not a measurement of real agents): {} agents, {} tasks, seed {}",
        args.agents, args.tasks, args.seed
    );
    println!("{}", report.table());
    println!("Ablation (paper §10.3): ATP with one layer taken away, same world and seed");
    println!("{}", report.ablation_table());
    if let Some(path) = &args.json {
        let json = serde_json::json!({
            "simulation": true,
            "config": cfg,
            "scd_samples": { "contexts": samples.len(), "budget_tokens": args.budget, "full_tokens": full, "sent_tokens": sent, "evidence_recall": recall },
            "report": report,
        });
        std::fs::write(path, serde_json::to_string_pretty(&json)? + "\n")
            .with_context(|| format!("--json {}", path.display()))?;
    }
    if let Some(path) = &args.plot {
        sim::write_svg(&report, path)?;
    }
    Ok(())
}
