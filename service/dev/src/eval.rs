//! `scd-dev eval`: evidence recall vs token reduction on real QA data, for SCD
//! and baselines (random, lead, BM25, plain dense sentence ranking) in the
//! same run. Writes a table, a JSON report and an SVG plot.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context as _;
use indicatif::{ProgressBar, ProgressStyle};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::SeedableRng;
use scd_engine::budget::BudgetTokenizer;
use scd_engine::cache::CacheStats;
use scd_engine::context::{Context, ContextRequirement, Task};
use scd_engine::encoder::{EncodeOptions, Encoder, InputKind, OrtEncoder};
use scd_engine::eval::{among_others, evidence_recall, load_with, sent_spans, Dataset, Example, Join};
use scd_engine::extract::{CompressOptions, CompressRequest, Scd, ScdConfig};
use scd_engine::score::{dot, Bm25};
use serde::Serialize;

use super::plot;
use scd_engine::rerank::CrossEncoder;
use scd_service::config::{ModelArgs, RerankArgs};

/// Arguments of `scd-dev eval`.
#[derive(Debug, clap::Args)]
pub struct EvalArgs {
    /// hotpotqa, squad, musique, 2wiki, code (for code the baselines rank
    /// blank-line-separated blocks, not sentences) or agent (logs, docs,
    /// JSON, chat and code cases with gold line ranges, reported per kind
    /// beside grep-like, BM25-over-lines and first-N-lines baselines).
    #[arg(long)]
    dataset: String,
    /// Dataset files (read by path; several are concatenated). For agent,
    /// also folders (their `*.jsonl` files, in name order).
    #[arg(long, visible_alias = "data", num_args = 1.., required = true)]
    path: Vec<PathBuf>,
    /// Budgets as fractions of each context's tokens, as sent (every
    /// field's whole text counted).
    #[arg(long, value_delimiter = ',', default_value = "0.2,0.25,0.33,0.5")]
    budgets: Vec<f32>,
    /// HotpotQA and 2Wiki: how a paragraph's sentences become its field:
    /// `natural` (each trimmed, one space between) or `as-given`
    /// (concatenated as the dataset gives them, as `"".join` does:
    /// HotpotQA's carry their leading space, 2Wiki's arrive glued).
    #[arg(long, default_value = "natural", value_parser = ["natural", "as-given"])]
    join: String,
    /// The long-context set: each example's paragraphs among the other
    /// examples' paragraphs, this many fields in all, in a seeded order
    /// (100 with HotpotQA: ~13k tokens; report it at budgets 0.1,0.05,0.02).
    /// Not for code.
    #[arg(long, value_name = "FIELDS")]
    among: Option<usize>,
    /// Seed of `--among`'s choice and order of paragraphs.
    #[arg(long, default_value_t = 27)]
    among_seed: u64,
    /// Instead of evaluating, write every chunk's features and its label
    /// (1 when at least half its bytes are gold evidence) as JSON lines
    /// `{"set", "id", "label", "tokens", "x", "group", "lead", "prose",
    /// "hand", "field", "header"}` (packing needs the group, lead and prose
    /// flags, the field and the tokens of the header line a piece it opens
    /// costs; "hand" is the hand sum's score): what `models/fit_scorer.py`
    /// fits the learned scorer on (use the train samples).
    #[arg(long, value_name = "FILE")]
    dump_features: Option<PathBuf>,
    /// Examples per file at most.
    #[arg(long, default_value_t = 200)]
    limit: usize,
    /// JSON report path.
    #[arg(long, default_value = "eval_report.json")]
    report: PathBuf,
    /// SVG plot path (recall vs reduction per method).
    #[arg(long, default_value = "eval_plot.svg")]
    plot: PathBuf,
    /// Per-example results as JSON lines (`id`, `method`, `budget`,
    /// `recall`, `all_kept`), e.g. for cross-validation by crate. With
    /// --adaptive, one line per example and first budget: each step's
    /// chunks (`[id, tokens, score]`; a follow-up's question and reason
    /// too), the off-topic probe (`off_topic`: another example's question
    /// after the loop), and per supporting paragraph whether the first
    /// answer, the loop and one-shot kept it.
    #[arg(long)]
    per_example: Option<PathBuf>,
    /// Code chunker: `parser` (tree-sitter where a grammar exists) or
    /// `heuristic` (blank lines and definition lines, functions cut at
    /// 2 KiB, no code names: the engine before the parser, for comparisons).
    #[arg(long, default_value = "parser")]
    code_chunker: String,
    /// Also run SCD with other settings, for tuning: a grid
    /// `key=v1,v2 key2=v3,v4` (every combination); repeat the flag for
    /// several grids. Keys: the settings `scd-dev tune --grid` knows (an
    /// unknown key's error lists them all: the weights lexical_weight,
    /// field_weight, link_weight, lead_link_bonus, owner_link_weight,
    /// second_hop_weight; link_sources, second_hop_sources; the closure
    /// limits group_closure_tokens, group_closure_share, section_closure_tokens,
    /// function_closure_tokens; embed_neighbour, rerank_weight, rerank_top),
    /// code_names (0 or 1), before
    /// (1: the code chunker and scoring before the parser, as
    /// `--code-chunker heuristic`). Each setting is a method
    /// named `scd[key=v ...]`; each distinct text is embedded once. With
    /// `--dataset agent`, the settings (today's defaults among them) are
    /// also chosen by `--folds`-fold cross-validation, and `scd-cv` reports
    /// each case as the setting chosen on the other folds did.
    #[arg(long)]
    sweep: Vec<String>,
    /// Also run SCD at the same settings with this model, as the method
    /// `scd@NAME`, on the same examples and budgets in the same run (e.g.
    /// `--also-model e5-small-int8` against the default). It must share the
    /// main model's tokenizer, so that the budgets are the same.
    #[arg(long)]
    also_model: Vec<String>,
    /// The hand-written agent context checked after the dataset (skipped
    /// when absent): compressed as `scd demo` does, its recall of the gold
    /// substrings in `--fixture-gold` is printed and reported.
    #[arg(long, default_value = "fixtures/agent_context.json")]
    fixture: PathBuf,
    /// Gold labels of `--fixture` (`task`, `gold_substrings`, `confidential_marker`).
    #[arg(long, default_value = "fixtures/agent_context_gold.json")]
    fixture_gold: PathBuf,
    /// Only SCD, no baselines (faster while developing).
    #[arg(long)]
    scd_only: bool,
    /// With --dataset agent: only the cases of these kinds (logs, docs,
    /// json, chat, code); all when left out.
    #[arg(long, value_delimiter = ',')]
    kinds: Vec<String>,
    /// Override ScoringConfig::lexical_weight (a weight of the hand-weighted
    /// sum: any of these three scores with it instead of the learned scorer).
    #[arg(long)]
    lexical_weight: Option<f32>,
    /// Override ScoringConfig::field_weight (selects the hand-weighted sum).
    #[arg(long)]
    field_weight: Option<f32>,
    /// Override ScoringConfig::link_weight (selects the hand-weighted sum).
    #[arg(long)]
    link_weight: Option<f32>,
    /// Override ScoringConfig::link_sources.
    #[arg(long)]
    link_sources: Option<usize>,
    /// Count budgets, totals and ratios in this tokenizer (o200k, cl100k,
    /// e5 or a tokenizer.json path), for SCD and the baselines alike.
    #[arg(long)]
    budget_tokenizer: Option<String>,
    /// MuSiQue: the adaptive loop (paper §6.3) beside one-shot at the
    /// same total tokens. --budgets are the first answer's budgets; each
    /// later hop's question is a follow-up with its own budget. A --sweep
    /// of one setting runs the loop with it in place of the defaults (rerun
    /// without it for the defaults); more than one is refused. With
    /// --dataset agent: follow-up probes in place of the comparison (per
    /// case, budget and setting: the case's task asked again as a follow-up;
    /// in a second session the next case's task of another kind; in a third,
    /// a case with the same context's task), per kind.
    #[arg(long)]
    adaptive: bool,
    /// With --adaptive: each follow-up's budget, a fraction of the context.
    #[arg(long, default_value_t = 0.1)]
    hop_budget: f32,
    /// With --adaptive: folds the report splits the examples into. With
    /// --dataset agent and --sweep: folds of the cross-validation (each
    /// kind's cases dealt into them in turn; at least 2).
    #[arg(long, default_value_t = 5)]
    folds: usize,
    /// Keep embeddings in this redb file (`PrepareConfig::embedding_store`),
    /// so a later run or sweep over the same texts with the same model
    /// reads them instead of computing them again; off when left out.
    #[arg(long, value_name = "FILE")]
    embedding_store: Option<PathBuf>,
    /// The second stage: its cross-encoder (loaded whenever one is
    /// configured, so `--sweep rerank_weight=...` can weigh it), weight and
    /// reach.
    #[command(flatten)]
    rerank: RerankArgs,
}

#[derive(Debug, Clone, Serialize)]
struct Row {
    method: String,
    budget: f32,
    evidence_recall: f32,
    all_evidence_kept: f32,
    reduction_ratio: f32,
    r_theorem1: f32,
    p50_ms: f64,
    p95_ms: f64,
    cache_hit_rate: Option<f64>,
}

#[derive(Default)]
struct Acc {
    recall: Vec<f32>,
    all: Vec<f32>,
    ratio: Vec<f32>,
    r1: Vec<f32>,
    ms: Vec<f64>,
}

fn mean(xs: &[f32]) -> f32 {
    if xs.is_empty() {
        0.0
    } else {
        xs.iter().sum::<f32>() / xs.len() as f32
    }
}

/// Selected (field, byte span) pairs.
type Selection = Vec<(usize, (usize, usize))>;

/// Greedy fill in `order` under `budget`; returns selected sentence spans.
fn fill(order: &[usize], units: &[(usize, (usize, usize), usize)], budget: usize) -> (Selection, usize) {
    let mut used = 0;
    let mut sel = Vec::new();
    for &i in order {
        let (f, span, t) = units[i];
        if used + t <= budget {
            used += t;
            sel.push((f, span));
        }
    }
    (sel, used)
}

struct Baselines {
    units: Vec<(usize, (usize, usize), usize)>,
    dense: Vec<f32>,
    bm25: Vec<f32>,
    total: usize,
}

fn baselines(enc: &OrtEncoder, ex: &Example, tok: Option<&BudgetTokenizer>) -> anyhow::Result<Baselines> {
    let mut base = sentence_units(enc, ex, tok)?;
    let texts: Vec<&str> = base.units.iter().map(|&(f, (a, b), _)| &ex.context.fields[f].content[a..b]).collect();
    let q = enc.encode(&[ex.question.as_str()], &EncodeOptions::new(InputKind::Query))?;
    let e = enc.encode(&texts, &EncodeOptions::new(InputKind::Passage).with_windows())?;
    base.dense = (0..texts.len()).map(|i| dot(q.row(0), e.row(i))).collect();
    base.bm25 = Bm25::new(&texts).scores(&ex.question);
    Ok(base)
}

/// Sentence units and token totals (scores zero until [`baselines`] fills them).
fn sentence_units(enc: &OrtEncoder, ex: &Example, tok: Option<&BudgetTokenizer>) -> anyhow::Result<Baselines> {
    let mut units = Vec::new();
    for (f, spans) in ex.sentences.iter().enumerate() {
        for &(a, b) in spans {
            let t = &ex.context.fields[f].content[a..b];
            if !t.trim().is_empty() {
                let n = match tok {
                    Some(tok) => tok.count(t)?,
                    None => enc.count_tokens(t)?,
                };
                units.push((f, (a, b), n));
            }
        }
    }
    let n = units.len();
    // the budget base: the context as a user sends it, each field whole
    let mut total = 0;
    for f in &ex.context.fields {
        total += match tok {
            Some(tok) => tok.count(&f.content)?,
            None => enc.count_tokens(&f.content)?,
        };
    }
    Ok(Baselines { units, dense: vec![0.0; n], bm25: vec![0.0; n], total })
}

fn ranked(scores: &[f32]) -> Vec<usize> {
    let mut o: Vec<usize> = (0..scores.len()).collect();
    o.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]));
    o
}

/// The code chunking and scoring before the parser: the line heuristic,
/// code cut at the prose bound, no code names.
fn before_parser(cfg: &mut ScdConfig) {
    cfg.prepare.chunk.code_parser = false;
    cfg.prepare.chunk.max_code_chunk_bytes = cfg.prepare.chunk.max_chunk_bytes;
    cfg.prepare.code_names = false;
}

/// The settings of `--sweep`: (method name, config) for each combination.
fn sweep(base: &ScdConfig, grids: &[String]) -> anyhow::Result<Vec<(String, ScdConfig)>> {
    let mut all = Vec::new();
    for grid in grids {
        all.extend(grid_of(base, grid)?);
    }
    Ok(all)
}

/// Every combination of one `--sweep` grid.
fn grid_of(base: &ScdConfig, grid: &str) -> anyhow::Result<Vec<(String, ScdConfig)>> {
    let mut out = vec![(String::new(), base.clone())];
    let mut keys = Vec::new();
    for spec in grid.split_whitespace() {
        let (key, values) = spec.split_once('=').with_context(|| format!("--sweep {spec:?}: expected key=v1,v2"))?;
        keys.push(key);
        let mut next = Vec::new();
        for (name, cfg) in &out {
            for v in values.split(',') {
                let x: f32 = v.trim().parse().with_context(|| format!("--sweep {key}: {v:?} is not a number"))?;
                let mut c = cfg.clone();
                match key {
                    // these change how chunks are cut or embedded
                    "code_names" => c.prepare.code_names = x != 0.0,
                    "before" if x != 0.0 => before_parser(&mut c),
                    "before" => {}
                    // and the scoring settings `scd-dev tune` knows
                    other => super::tune::apply_one(&mut c, other, f64::from(x))
                        .map_err(|e| anyhow::anyhow!("--sweep: {e} (or code_names, before)"))?,
                }
                next.push((format!("{name} {key}={}", v.trim()), c));
            }
        }
        out = next;
    }
    for (name, c) in &out {
        super::tune::weights_need_the_hand_sum(c, keys.iter().copied())
            .map_err(|e| anyhow::anyhow!("--sweep: scd[{}]: {e}", name.trim()))?;
    }
    Ok(out.into_iter().filter(|(n, _)| !n.is_empty()).map(|(n, c)| (format!("scd[{}]", n.trim()), c)).collect())
}

/// The agent fixture compressed the way `scd demo` does (its task, 0.8 of
/// the context's tokens, relevance floor 0.5): which gold substrings the
/// first answer holds, and whether the confidential marker stayed out.
fn fixture_recall(scd: &Scd, context: &std::path::Path, gold: &std::path::Path) -> anyhow::Result<serde_json::Value> {
    let raw = std::fs::read_to_string(context).with_context(|| format!("--fixture {}", context.display()))?;
    let ctx = Context::from_json(&raw).context("--fixture")?;
    let raw = std::fs::read_to_string(gold).with_context(|| format!("--fixture-gold {}", gold.display()))?;
    let g: serde_json::Value = serde_json::from_str(&raw).context("--fixture-gold: not JSON")?;
    let task = g["task"].as_str().context("--fixture-gold: task must be a string")?;
    let subs: Vec<&str> = g["gold_substrings"]
        .as_array()
        .context("--fixture-gold: gold_substrings must be a list")?
        .iter()
        .filter_map(|v| v.as_str())
        .collect();
    let total: usize = ctx
        .fields
        .iter()
        .filter(|f| !f.confidential)
        .map(|f| scd.encoder().count_tokens(&f.content))
        .sum::<Result<_, _>>()?;
    let budget = ((total as f32 * scd_service::cli::demo::DEMO_SHARE) as usize).max(1);
    let out = scd.compress(&CompressRequest {
        task: Task::new(task),
        context: ctx,
        requirement: ContextRequirement {
            min_relative_score: Some(scd_service::cli::demo::DEMO_MIN_RELATIVE_SCORE),
            ..ContextRequirement::with_budget(budget)
        },
        session: None,
    })?;
    // what the receiver pastes (headers and the lines around code pieces
    // included), and for the leak check every chunk too
    let text = &out.text;
    let missing: Vec<&str> = subs.iter().copied().filter(|s| !text.contains(s)).collect();
    let leaked = g["confidential_marker"]
        .as_str()
        .is_some_and(|m| text.contains(m) || out.chunks.iter().any(|c| c.text.contains(m)));
    Ok(serde_json::json!({
        "task": task,
        "gold": subs.len(),
        "found": subs.len() - missing.len(),
        "recall": (subs.len() - missing.len()) as f32 / subs.len().max(1) as f32,
        "missing": missing,
        "confidential_leaked": leaked,
        "sent_tokens": out.totals.sent_tokens,
        "context_tokens": out.totals.context_tokens,
    }))
}

/// Writes every chunk's features and label (`--dump-features`).
fn dump_features(scd: &Scd, set: &str, examples: &[Example], path: &std::path::Path) -> anyhow::Result<()> {
    use std::io::Write as _;
    let mut out = std::io::BufWriter::new(
        std::fs::File::create(path).with_context(|| format!("--dump-features {}", path.display()))?,
    );
    let bar = ProgressBar::new(examples.len() as u64);
    bar.set_style(ProgressStyle::with_template("{bar:40} {pos}/{len} examples {per_sec} eta {eta}")?);
    let (mut rows, mut positive) = (0usize, 0usize);
    for ex in examples {
        let req = CompressRequest {
            task: Task::new(ex.question.clone()),
            context: ex.context.clone(),
            requirement: ContextRequirement::with_budget(1),
            session: None,
        };
        for c in scd.chunk_features(&req, &scd_engine::cancel::Cancel::new())? {
            let gold: usize = ex
                .gold
                .iter()
                .filter(|(f, _)| *f == c.field)
                .map(|(_, g)| c.span.1.min(g.1).saturating_sub(c.span.0.max(g.0)))
                .sum();
            let label = u8::from(2 * gold >= (c.span.1 - c.span.0).max(1));
            positive += usize::from(label);
            rows += 1;
            let line = serde_json::json!({
                "set": set, "id": ex.id, "label": label, "tokens": c.tokens, "x": c.features,
                "group": [c.group.0, c.group.1], "lead": c.lead, "prose": c.prose, "hand": c.hand,
                "field": c.field, "header": c.header,
            });
            writeln!(out, "{line}")?;
        }
        bar.inc(1);
    }
    out.flush()?;
    bar.finish_and_clear();
    println!("{rows} chunks ({positive} evidence) of {} examples -> {}", examples.len(), path.display());
    Ok(())
}

/// SCD's settings from the flags that set them.
fn scd_config(args: &EvalArgs) -> anyhow::Result<ScdConfig> {
    let mut cfg = ScdConfig::default();
    cfg.prepare.embedding_store = args.embedding_store.clone();
    if args.lexical_weight.is_some() || args.field_weight.is_some() || args.link_weight.is_some() {
        cfg.scoring.scorer = scd_engine::extract::Scorer::Hand;
    }
    cfg.scoring.lexical_weight = args.lexical_weight.unwrap_or(cfg.scoring.lexical_weight);
    cfg.scoring.field_weight = args.field_weight.unwrap_or(cfg.scoring.field_weight);
    cfg.scoring.link_weight = args.link_weight.unwrap_or(cfg.scoring.link_weight);
    cfg.scoring.link_sources = args.link_sources.unwrap_or(cfg.scoring.link_sources);
    args.rerank.apply(&mut cfg.scoring);
    match args.code_chunker.as_str() {
        "parser" => {}
        "heuristic" => before_parser(&mut cfg),
        other => anyhow::bail!("--code-chunker: expected parser or heuristic, got {other:?}"),
    }
    Ok(cfg)
}

/// `--dataset agent`'s run, refusing the flags it does not take.
fn agent_eval(
    args: &EvalArgs,
    tok: Option<BudgetTokenizer>,
    reranker: Option<Arc<dyn CrossEncoder>>,
) -> anyhow::Result<super::eval_agent::AgentEval> {
    let unused = [
        ("--among", args.among.is_some()),
        ("--also-model", !args.also_model.is_empty()),
        ("--dump-features", args.dump_features.is_some()),
        ("--join", args.join != "natural"),
    ];
    for k in &args.kinds {
        anyhow::ensure!(
            scd_engine::eval::agent::KINDS.contains(&k.as_str()),
            "--kinds: unknown kind {k:?} (logs, docs, json, chat, code)"
        );
    }
    if let Some((flag, _)) = unused.iter().find(|(_, set)| *set) {
        anyhow::bail!("{flag}: not for --dataset agent");
    }
    let cfg = scd_config(args)?;
    let variants = sweep(&cfg, &args.sweep)?;
    anyhow::ensure!(
        variants.is_empty() || args.folds >= 2,
        "--folds: at least 2 to cross-validate --sweep, got {}",
        args.folds
    );
    Ok(super::eval_agent::AgentEval {
        paths: args.path.clone(),
        limit: args.limit,
        follow_ups: args.adaptive,
        budgets: args.budgets.clone(),
        tokenizer: tok,
        cfg,
        scd_only: args.scd_only,
        report: args.report.clone(),
        plot: args.plot.clone(),
        per_example: args.per_example.clone(),
        variants,
        folds: args.folds,
        kinds: args.kinds.clone(),
        reranker,
    })
}

/// The examples of `--path`, at most `--limit` per file; with `--among`,
/// each among the others' paragraphs.
fn load_examples(args: &EvalArgs, dataset: Dataset) -> anyhow::Result<Vec<Example>> {
    let mut examples = Vec::new();
    let join = if args.join == "as-given" { Join::AsGiven } else { Join::Natural };
    for p in &args.path {
        examples.extend(load_with(dataset, p, args.limit, join).with_context(|| format!("--path {}", p.display()))?);
    }
    if let Some(n) = args.among {
        anyhow::ensure!(dataset != Dataset::Code, "--among: code examples are files, not paragraphs to mix");
        anyhow::ensure!(n >= 2, "--among: {n} fields; at least 2");
        examples = among_others(&examples, n, args.among_seed);
    }
    Ok(examples)
}

/// The other SCDs compared with `scd`: the `--sweep` settings `variants`
/// (on the shared memo encoder), then each `--also-model` at `scd`'s
/// settings, which must share `encoder`'s tokenizer.
fn other_scds(
    model: &ModelArgs,
    args: &EvalArgs,
    variants: Vec<(String, ScdConfig)>,
    memo: &Arc<dyn Encoder>,
    (encoder, scd): (&OrtEncoder, &Scd),
) -> anyhow::Result<Vec<(String, Scd)>> {
    let with = |c| Scd::new(memo.clone(), c).with_reranker(scd.reranker().cloned());
    let mut others: Vec<(String, Scd)> = variants.into_iter().map(|(n, c)| (n, with(c))).collect();
    for name in &args.also_model {
        let other = ModelArgs { model: name.clone(), ..model.clone() }.load_encoder()?;
        let tokenizer = |e: &OrtEncoder| e.manifest().files.get("tokenizer.json").cloned();
        anyhow::ensure!(
            tokenizer(&other).is_some() && tokenizer(&other) == tokenizer(encoder),
            "--also-model {name}: its tokenizer.json differs from {}'s, so the budgets would differ",
            encoder.model_id()
        );
        let other = Scd::new(Arc::new(other), scd.config().clone()).with_reranker(scd.reranker().cloned());
        others.push((format!("scd@{name}"), other));
    }
    Ok(others)
}

impl Acc {
    /// One example's result at one budget: its recall (and whether all
    /// evidence was kept), reduction, R and milliseconds.
    fn push(&mut self, (recall, all): (f32, bool), ratio: f32, r1: f32, ms: f64) {
        self.recall.push(recall);
        self.all.push(f32::from(u8::from(all)));
        self.ratio.push(ratio);
        self.r1.push(r1);
        self.ms.push(ms);
    }
}

/// What the methods scored: per method and budget, per example (for
/// `--per-example`), and SCD's embedding-cache hits and misses per budget.
struct Tally {
    acc: Vec<Vec<Acc>>,
    per_example: Vec<serde_json::Value>,
    scd_hits: Vec<(u64, u64)>,
    hits_before: CacheStats,
}

/// The methods of one run, compared on each example at each budget: SCD,
/// the baselines (unless `scd_only`) and the other SCDs, named in `names`
/// in that order.
struct Methods<'a> {
    names: Vec<&'a str>,
    scd: &'a Scd,
    others: &'a [(String, Scd)],
    encoder: &'a OrtEncoder,
    opts: &'a CompressOptions,
    dataset: Dataset,
    budgets: &'a [f32],
    scd_only: bool,
}

impl Methods<'_> {
    /// An empty tally for these methods and budgets.
    fn tally(&self) -> Tally {
        Tally {
            acc: self.names.iter().map(|_| self.budgets.iter().map(|_| Acc::default()).collect()).collect(),
            per_example: Vec::new(),
            scd_hits: vec![(0u64, 0u64); self.budgets.len()],
            hits_before: self.scd.cache_stats(),
        }
    }

    /// Every method on `ex` at every budget, into `tally` (`rng` orders the
    /// random baseline).
    fn run_example(&self, ex: &Example, rng: &mut StdRng, tally: &mut Tally) -> anyhow::Result<()> {
        let tok = self.opts.budget_tokenizer.as_ref();
        let t = Instant::now();
        let base =
            if self.scd_only { sentence_units(self.encoder, ex, tok)? } else { baselines(self.encoder, ex, tok)? };
        let base_ms = t.elapsed().as_secs_f64() * 1e3;
        let dense_order = ranked(&base.dense);
        let bm25_order = ranked(&base.bm25);
        // lead: first sentences of every paragraph, then second ones, ...
        let mut lead_order: Vec<usize> = (0..base.units.len()).collect();
        let pos_in_field = |i: usize| base.units[..i].iter().filter(|u| u.0 == base.units[i].0).count();
        lead_order.sort_by_key(|&i| (pos_in_field(i), i));
        let mut random_order: Vec<usize> = (0..base.units.len()).collect();
        random_order.shuffle(rng);
        for (bi, &frac) in self.budgets.iter().enumerate() {
            let budget = scd_engine::eval::budget_at(base.total, frac);
            self.scd_at(ex, (bi, frac), budget, tally)?;
            for (mi, order) in [(1, &dense_order), (2, &bm25_order), (3, &lead_order), (4, &random_order)] {
                if self.scd_only {
                    break;
                }
                let (sel, used) = fill(order, &base.units, budget);
                let (r, all) = evidence_recall(ex, &sel, self.dataset);
                tally.per_example.push(
                    serde_json::json!({"id": ex.id, "method": self.names[mi], "budget": frac, "recall": r, "all_kept": all}),
                );
                let ratio = if used == 0 { 0.0 } else { base.total as f32 / used as f32 };
                let r1 = base.total as f32 / (used + self.encoder.dim()) as f32;
                tally.acc[mi][bi].push((r, all), ratio, r1, if mi == 1 { base_ms } else { 0.0 });
            }
            self.others_at(ex, (bi, frac), budget, tally)?;
        }
        Ok(())
    }

    /// SCD on `ex` at budget `bi` (`frac` of the context, `budget` tokens).
    fn scd_at(&self, ex: &Example, (bi, frac): (usize, f32), budget: usize, tally: &mut Tally) -> anyhow::Result<()> {
        let t = Instant::now();
        let req = CompressRequest {
            task: Task::new(ex.question.clone()),
            context: ex.context.clone(),
            requirement: ContextRequirement::with_budget(budget),
            session: None,
        };
        let out = self.scd.compress_opts(&req, self.opts, &scd_engine::cancel::Cancel::new())?;
        let ms = t.elapsed().as_secs_f64() * 1e3;
        let stats = self.scd.cache_stats();
        tally.scd_hits[bi].0 += stats.hits - tally.hits_before.hits;
        tally.scd_hits[bi].1 += stats.misses - tally.hits_before.misses;
        tally.hits_before = stats;
        let sel = sent_spans(ex, &out);
        let (r, all) = evidence_recall(ex, &sel, self.dataset);
        tally
            .per_example
            .push(serde_json::json!({"id": ex.id, "method": "scd", "budget": frac, "recall": r, "all_kept": all}));
        tally.acc[0][bi].push((r, all), out.totals.reduction_ratio, out.totals.r_theorem1, ms);
        Ok(())
    }

    /// The other SCDs on `ex` at budget `bi`.
    fn others_at(
        &self,
        ex: &Example,
        (bi, frac): (usize, f32),
        budget: usize,
        tally: &mut Tally,
    ) -> anyhow::Result<()> {
        for (vi, (vname, v)) in self.others.iter().enumerate() {
            let mi = self.names.len() - self.others.len() + vi;
            let t = Instant::now();
            let out = v.compress(&CompressRequest {
                task: Task::new(ex.question.clone()),
                context: ex.context.clone(),
                requirement: ContextRequirement::with_budget(budget),
                session: None,
            })?;
            let ms = t.elapsed().as_secs_f64() * 1e3;
            let sel = sent_spans(ex, &out);
            let (r, all) = evidence_recall(ex, &sel, self.dataset);
            tally
                .per_example
                .push(serde_json::json!({"id": ex.id, "method": vname, "budget": frac, "recall": r, "all_kept": all}));
            tally.acc[mi][bi].push((r, all), out.totals.reduction_ratio, out.totals.r_theorem1, ms);
        }
        Ok(())
    }

    /// The table's rows: each method at each budget.
    fn rows(&self, tally: &mut Tally) -> Vec<Row> {
        let mut rows = Vec::new();
        for (mi, m) in self.names.iter().enumerate() {
            for (bi, &b) in self.budgets.iter().enumerate() {
                let a = &mut tally.acc[mi][bi];
                let (h, mi_) = tally.scd_hits[bi];
                rows.push(Row {
                    method: m.to_string(),
                    budget: b,
                    evidence_recall: mean(&a.recall),
                    all_evidence_kept: mean(&a.all),
                    reduction_ratio: mean(&a.ratio),
                    r_theorem1: mean(&a.r1),
                    p50_ms: super::percentile(&mut a.ms, 0.5),
                    p95_ms: super::percentile(&mut a.ms, 0.95),
                    cache_hit_rate: (*m == "scd").then(|| h as f64 / (h + mi_).max(1) as f64),
                });
            }
        }
        rows
    }
}

/// Prints the table of `rows`.
fn print_rows(rows: &[Row]) {
    println!(
        "{:<8} {:>6} {:>8} {:>8} {:>9} {:>7} {:>8} {:>8} {:>6}",
        "method", "budget", "recall", "all_kept", "reduction", "R", "p50_ms", "p95_ms", "cache"
    );
    for r in rows {
        println!(
            "{:<8} {:>6.2} {:>8.3} {:>8.3} {:>9.2} {:>7.2} {:>8.1} {:>8.1} {:>6}",
            r.method,
            r.budget,
            r.evidence_recall,
            r.all_evidence_kept,
            r.reduction_ratio,
            r.r_theorem1,
            r.p50_ms,
            r.p95_ms,
            r.cache_hit_rate.map(|h| format!("{h:.2}")).unwrap_or_default()
        );
    }
}

/// `--fixture`'s recall, printed and for the report (null when it or its
/// gold labels are absent).
fn fixture_result(scd: &Scd, args: &EvalArgs) -> anyhow::Result<serde_json::Value> {
    if !(args.fixture.is_file() && args.fixture_gold.is_file()) {
        eprintln!("agent fixture: {} not found, skipped", args.fixture.display());
        return Ok(serde_json::Value::Null);
    }
    let f = fixture_recall(scd, &args.fixture, &args.fixture_gold)?;
    println!(
        "agent fixture ({}, as scd demo): {} of {} gold substrings in the first answer{}; confidential leaked: {}",
        args.fixture.display(),
        f["found"],
        f["gold"],
        if f["missing"].as_array().is_some_and(|m| !m.is_empty()) {
            format!(" (missing {})", f["missing"])
        } else {
            String::new()
        },
        f["confidential_leaked"]
    );
    Ok(f)
}

/// Writes `--report`, `--plot` (recall vs reduction per method) and, when
/// asked, `--per-example`.
fn write_outputs(
    args: &EvalArgs,
    report: &serde_json::Value,
    rows: &[Row],
    per_example: &[serde_json::Value],
) -> anyhow::Result<()> {
    std::fs::write(&args.report, serde_json::to_string_pretty(report)?)
        .with_context(|| format!("--report {}", args.report.display()))?;
    let series = plot::by_label(rows.iter().map(|r| (r.method.as_str(), (r.reduction_ratio, r.evidence_recall))));
    let title = format!("{}: evidence recall vs token reduction", args.dataset);
    plot::write_recall_vs_reduction(&args.plot, &title, &series)?;
    eprintln!("wrote {} and {}", args.report.display(), args.plot.display());
    if let Some(p) = &args.per_example {
        let lines: String = per_example.iter().map(|v| format!("{v}\n")).collect();
        std::fs::write(p, lines).with_context(|| format!("--per-example {}", p.display()))?;
    }
    Ok(())
}

/// Runs `scd-dev eval`.
pub fn run(model: &ModelArgs, args: EvalArgs) -> anyhow::Result<()> {
    let tok = scd_service::cli::compress::budget_tokenizer("--budget-tokenizer", args.budget_tokenizer.as_deref())?;
    for b in &args.budgets {
        anyhow::ensure!(*b > 0.0 && *b <= 1.0, "--budgets: each must be in (0, 1], got {b}");
    }
    if args.dataset == "agent" {
        let reranker = args.rerank.load(model, true)?;
        return super::eval_agent::run(model, agent_eval(&args, tok, reranker)?);
    }
    let cfg = scd_config(&args)?;
    let mut variants = sweep(&cfg, &args.sweep)?;
    // the adaptive loop runs one configuration: a swept setting replaces the defaults
    let (cfg, settings) = match (args.adaptive, variants.len()) {
        (false, _) | (true, 0) => (cfg, "defaults".to_string()),
        (true, 1) => {
            let (name, c) = variants.remove(0);
            println!("settings: {name} (in place of the defaults)");
            (c, name)
        }
        (true, n) => anyhow::bail!("--sweep: --adaptive runs one setting at a time, got {n}"),
    };
    let reranker = args.rerank.load(model, true)?;
    let dataset = args.dataset.parse::<Dataset>().map_err(|e| anyhow::anyhow!("{e} (or agent)"))?;
    let opts = CompressOptions { budget_tokenizer: tok, ..Default::default() };
    let examples = load_examples(&args, dataset)?;
    let encoder = Arc::new(model.load_encoder()?);
    let model_id = encoder.model_id().to_string();
    let memo: Arc<dyn Encoder> =
        if variants.is_empty() { encoder.clone() } else { Arc::new(crate::memo::Memo::new(encoder.clone())) };
    let scd = Scd::new(memo.clone(), cfg).with_reranker(reranker);
    if let Some(path) = &args.dump_features {
        return dump_features(&scd, &args.dataset, &examples, path);
    }
    if args.adaptive {
        anyhow::ensure!(
            dataset == Dataset::Musique,
            "--adaptive: needs --dataset musique (its question_decomposition)"
        );
        let run = super::eval_adaptive::AdaptiveRun {
            budgets: &args.budgets,
            hop_budget: args.hop_budget,
            folds: args.folds,
            model_id: &model_id,
            settings: &settings,
            report: &args.report,
            plot: &args.plot,
            per_example: args.per_example.as_deref(),
        };
        return super::eval_adaptive::run(&scd, &opts, &examples, &run);
    }
    let others = other_scds(model, &args, variants, &memo, (&encoder, &scd))?;
    let mut names: Vec<&str> = vec!["scd"];
    if !args.scd_only {
        names.extend(["dense", "bm25", "lead", "random"]);
    }
    names.extend(others.iter().map(|(n, _)| n.as_str()));
    let methods = Methods {
        names,
        scd: &scd,
        others: &others,
        encoder: &encoder,
        opts: &opts,
        dataset,
        budgets: &args.budgets,
        scd_only: args.scd_only,
    };
    let mut tally = methods.tally();
    let bar = ProgressBar::new(examples.len() as u64);
    bar.set_style(ProgressStyle::with_template("{bar:40} {pos}/{len} examples {per_sec} eta {eta} {msg}")?);
    // Seeded: the random baseline is the same on every run.
    let mut rng = StdRng::seed_from_u64(0x9E37_79B9_7F4A_7C15);
    for ex in &examples {
        methods.run_example(ex, &mut rng, &mut tally)?;
        bar.inc(1);
    }
    bar.finish_and_clear();
    let rows = methods.rows(&mut tally);
    println!("{} examples of {} with {model_id}", examples.len(), args.dataset);
    print_rows(&rows);
    let fixture = fixture_result(&scd, &args)?;
    let reranker_id = scd.reranker().map(|r| r.model_id().to_string());
    let report = serde_json::json!({"dataset": args.dataset, "model": model_id, "reranker": reranker_id,
        "examples": examples.len(),
        "join": args.join, "among": args.among, "among_seed": args.among.map(|_| args.among_seed),
        "results": rows, "agent_fixture": fixture});
    write_outputs(&args, &report, &rows, &tally.per_example)
}
