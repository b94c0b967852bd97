//! How the engine's own work grows with the context: chunking, token
//! counting, BM25, near-duplicate detection, HNSW, scoring and packing.
//!
//! * **tokens**: one context of paragraph-sized prose fields (8 sentences
//!   each) drawn from the HotpotQA paragraphs in `../shared/evaldata`,
//!   shuffled and repeated with a seeded RNG, 1k → 1M tokens (×4 apart);
//! * **fields**: 10 → 100k fields of one or two sentences each.
//!
//! The encoder is the deterministic [`HashEncoder`] (384 dims), so the
//! model's cost (linear by construction, measured in `encoder` and
//! `scd_speed`) does not hide the engine's. Limits are lifted
//! (`max_context_tokens`, `context_limits`, `max_budget_tokens`).
//!
//! For each size: **cold** = a fresh `Scd` compressing the context (wall
//! time, and `prepare_ms` / `select_ms` from `Compressed.timings`); **warm** =
//! a new task on the same, already prepared context (`prepare_ms +
//! task_embed_ms + select_ms`, median of 3 tasks). Cold is the median of 3
//! runs below 200k tokens and a single run above (multi-second runs; criterion
//! adds nothing there). Every size runs with the default config (HNSW from
//! 200,000 chunks, `PrepareConfig::hnsw_min_chunks`) and, from 16k chunks up, also with HNSW off so the LSH
//! near-duplicate path shows. A stage split (same chunks, outside `Scd`):
//! chunk, encode (hash), BM25 build, near-duplicates (brute force up to
//! 2,048 chunks, LSH above); the HNSW build is the difference between the
//! default and the HNSW-off `prepare_ms` of the same context (building it a
//! second time here would double the longest runs).
//!
//! Run: `cargo bench -p scd-benches --bench context_scale`. Writes
//! `benches/results/context_scale.{txt,json,svg}`. `SCD_SCALE_MAX_TOKENS` /
//! `SCD_SCALE_MAX_FIELDS` cap the sizes for a quick check. The default-config
//! run is skipped above `SCD_SCALE_HNSW_MAX_CHUNKS` (80,000) chunks: building
//! HNSW took 65 s at 44k chunks and 144 s at 61k on the 2-core machine, so the
//! 100k-field context (~150k chunks) runs with HNSW off only.

use std::sync::Arc;
use std::time::Instant;

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use scd_benches::{hotpot_paragraphs, root};
use scd_engine::chunk::{chunk_field, ChunkConfig};
use scd_engine::context::{Context, ContextLimits, ContextRequirement, Field, FieldKind, Task};
use scd_engine::encoder::{EncodeOptions, Encoder, HashEncoder, InputKind};
use scd_engine::extract::{CompressRequest, PrepareConfig, RequestLimits, Scd, ScdConfig};
use scd_engine::score::{dedup, Bm25};

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn config(hnsw: bool) -> ScdConfig {
    ScdConfig {
        limits: RequestLimits {
            max_context_tokens: usize::MAX,
            max_budget_tokens: usize::MAX,
            context_limits: ContextLimits {
                max_fields: usize::MAX,
                max_field_bytes: usize::MAX,
                max_context_bytes: usize::MAX,
            },
            ..Default::default()
        },
        prepare: PrepareConfig {
            prepared_cache_bytes: 4 << 30,
            cache_bytes: 4 << 30,
            hnsw_min_chunks: if hnsw { ScdConfig::default().prepare.hnsw_min_chunks } else { usize::MAX },
            ..Default::default()
        },
        ..ScdConfig::default()
    }
}

/// Sentences of the HotpotQA paragraphs (split at ". ").
fn sentences(paras: &[(String, String)]) -> Vec<String> {
    let mut out = Vec::new();
    for (_, body) in paras {
        let mut rest = body.as_str();
        while let Some(i) = rest.find(". ") {
            out.push(rest[..=i].trim().to_string());
            rest = &rest[i + 2..];
        }
        if !rest.trim().is_empty() {
            out.push(rest.trim().to_string());
        }
    }
    out.retain(|s| s.split_whitespace().count() >= 4);
    out
}

/// Fields of `per_field` sentences (or 1–2 when `per_field` is 0) drawn from a
/// seeded shuffle, until `stop(tokens, fields)`.
fn build(
    sents: &[String],
    enc: &HashEncoder,
    per_field: usize,
    seed: u64,
    stop: impl Fn(usize, usize) -> bool,
) -> (Context, usize) {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut order: Vec<usize> = (0..sents.len()).collect();
    order.shuffle(&mut rng);
    let mut pos = 0;
    let mut fields = Vec::new();
    let mut tokens = 0;
    while !stop(tokens, fields.len()) {
        let k = if per_field == 0 { rng.random_range(1..=2) } else { per_field };
        let mut content = String::new();
        for _ in 0..k {
            if pos == order.len() {
                order.shuffle(&mut rng);
                pos = 0;
            }
            if !content.is_empty() {
                content.push(' ');
            }
            content.push_str(&sents[order[pos]]);
            pos += 1;
        }
        tokens += enc.count_tokens(&content).unwrap();
        fields.push(Field {
            name: format!("doc {}", fields.len()),
            kind: FieldKind::Prose,
            content,
            confidential: false,
        });
    }
    (Context { fields }, tokens)
}

#[derive(Default, Clone)]
struct Row {
    part: &'static str,
    hnsw: bool,
    tokens: usize,
    fields: usize,
    chunks: usize,
    runs: usize,
    cold_s: f64,
    prepare_ms: f64,
    select_ms: f64,
    warm_ms: f64,
    warm_select_ms: f64,
    stages: Vec<(&'static str, f64)>,
}

impl Row {
    fn us_per_1k(&self, ms: f64) -> f64 {
        ms * 1e3 / (self.tokens as f64 / 1e3)
    }
}

fn measure(part: &'static str, ctx: &Context, tokens: usize, hnsw: bool, tasks: &[String]) -> Row {
    let enc: Arc<dyn Encoder> = Arc::new(HashEncoder::new(384, 512));
    let req = |t: &str| CompressRequest {
        task: Task::new(t),
        context: ctx.clone(),
        requirement: ContextRequirement::with_budget((tokens / 3).max(50)),
        session: None,
    };
    let runs = if tokens < 200_000 { 3 } else { 1 };
    let (mut cold, mut prep, mut sel) = (Vec::new(), Vec::new(), Vec::new());
    let mut chunks = 0;
    let mut warm = Vec::new();
    let mut warm_sel = Vec::new();
    for r in 0..runs {
        let scd = Scd::new(enc.clone(), config(hnsw));
        let t = Instant::now();
        let out = scd.compress(&req(&tasks[0])).expect("cold compress");
        cold.push(t.elapsed().as_secs_f64());
        assert!(out.totals.sent_tokens <= (tokens / 3).max(50) && !out.chunks.is_empty());
        chunks = out.chunks.len() + out.dropped.len();
        prep.push(out.timings.prepare_ms);
        sel.push(out.timings.select_ms);
        if r == runs - 1 {
            for task in &tasks[1..4] {
                let out = scd.compress(&req(task)).expect("warm compress");
                warm.push(out.timings.prepare_ms + out.timings.task_embed_ms + out.timings.select_ms);
                warm_sel.push(out.timings.select_ms);
            }
        }
    }
    Row {
        part,
        hnsw,
        tokens,
        fields: ctx.fields.len(),
        chunks,
        runs,
        cold_s: median(cold),
        prepare_ms: median(prep),
        select_ms: median(sel),
        warm_ms: median(warm),
        warm_select_ms: median(warm_sel),
        stages: Vec::new(),
    }
}

/// The preparation stages run one by one on the same context (one run).
fn stages(ctx: &Context) -> (Vec<(&'static str, f64)>, usize) {
    let enc = HashEncoder::new(384, 512);
    let t = Instant::now();
    let mut texts = Vec::new();
    for f in &ctx.fields {
        for c in chunk_field(f, ChunkConfig::default()) {
            texts.push(format!("{}: {}", f.name, &f.content[c.start..c.end]));
        }
    }
    let chunk_ms = t.elapsed().as_secs_f64() * 1e3;
    let t = Instant::now();
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    let e = enc.encode(&refs, &EncodeOptions::new(InputKind::Passage).with_windows()).unwrap();
    let encode_ms = t.elapsed().as_secs_f64() * 1e3;
    let vectors: Vec<&[f32]> = e.data.chunks(e.dim).collect();
    let t = Instant::now();
    let bm25 = Bm25::new(&refs);
    let bm25_ms = t.elapsed().as_secs_f64() * 1e3;
    std::hint::black_box(&bm25);
    let t = Instant::now();
    let nd = dedup::near_duplicates(&vectors, ScdConfig::default().scoring.redundancy_cosine);
    let dedup_ms = t.elapsed().as_secs_f64() * 1e3;
    std::hint::black_box(&nd);
    (vec![("chunk", chunk_ms), ("encode(hash)", encode_ms), ("bm25", bm25_ms), ("near-dup", dedup_ms)], texts.len())
}

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// The table's header line.
fn header_line() -> String {
    format!(
        "{:<7} {:<5} {:>9} {:>7} {:>7} {:>4} {:>9} {:>10} {:>9} {:>9} {:>11} {:>11}  stages ms",
        "part",
        "hnsw",
        "tokens",
        "fields",
        "chunks",
        "runs",
        "cold s",
        "µs/1k tok",
        "prep ms",
        "sel ms",
        "warm ms",
        "warm sel ms"
    )
}

/// One row of the table, under [`header_line`].
fn row_line(row: &Row) -> String {
    format!(
        "{:<7} {:<5} {:>9} {:>7} {:>7} {:>4} {:>9.3} {:>10.1} {:>9.1} {:>9.1} {:>11.2} {:>11.2}  {}",
        row.part,
        if row.hnsw { "dflt" } else { "off" },
        row.tokens,
        row.fields,
        row.chunks,
        row.runs,
        row.cold_s,
        row.us_per_1k(row.cold_s * 1e3),
        row.prepare_ms,
        row.select_ms,
        row.warm_ms,
        row.warm_select_ms,
        row.stages.iter().map(|(n, ms)| format!("{n} {ms:.1}")).collect::<Vec<_>>().join(", ")
    )
}

/// The contexts measured: (part, size, sentences per field), growing in
/// tokens (8 sentences a field) up to `max_tokens`, then in fields (one
/// sentence each) up to `max_fields`.
fn sizes(max_tokens: usize, max_fields: usize) -> Vec<(&'static str, usize, usize)> {
    let mut sizes = vec![];
    let mut t = 1000;
    while t <= max_tokens {
        sizes.push(("tokens", t, 8usize));
        t *= 4;
    }
    for f in [10usize, 40, 160, 640, 2560, 10_240, 40_960, 100_000] {
        if f <= max_fields {
            sizes.push(("fields", f, 0));
        }
    }
    sizes
}

/// Writes the table, the rows as JSON and the plot to `benches/results/`.
fn write_results(lines: &[String], rows: &[Row]) {
    let dir = root().join("benches/results");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("context_scale.txt"), lines.join("\n") + "\n").unwrap();
    let json: Vec<serde_json::Value> = rows
        .iter()
        .map(|r| {
            serde_json::json!({
                "part": r.part, "hnsw": if r.hnsw { "default (>= 20000 chunks)" } else { "off" },
                "tokens": r.tokens, "fields": r.fields, "chunks": r.chunks, "runs": r.runs,
                "cold_s": r.cold_s, "cold_us_per_1k_tokens": r.us_per_1k(r.cold_s * 1e3),
                "cold_prepare_ms": r.prepare_ms, "cold_select_ms": r.select_ms,
                "warm_ms": r.warm_ms, "warm_select_ms": r.warm_select_ms,
                "stages_ms": r.stages.iter().map(|(n, ms)| (n.to_string(), serde_json::json!(ms))).collect::<serde_json::Map<_, _>>(),
            })
        })
        .collect();
    std::fs::write(dir.join("context_scale.json"), serde_json::to_string_pretty(&json).unwrap()).unwrap();
    std::fs::write(dir.join("context_scale.svg"), svg(rows)).unwrap();
    eprintln!("wrote {}", dir.join("context_scale.{txt,json,svg}").display());
}

fn main() {
    let Some((paras, questions)) = hotpot_paragraphs() else {
        panic!("../shared/evaldata/hotpotqa/hotpot_hf_schema.jsonl is absent (or unreadable): this bench needs it");
    };
    let sents = sentences(&paras);
    eprintln!("{} sentences from {} paragraphs", sents.len(), paras.len());
    let enc = HashEncoder::new(384, 512);
    let max_tokens = env_usize("SCD_SCALE_MAX_TOKENS", 1 << 20);
    let max_fields = env_usize("SCD_SCALE_MAX_FIELDS", 100_000);
    let hnsw_max_chunks = env_usize("SCD_SCALE_HNSW_MAX_CHUNKS", 80_000);
    let mut rows = Vec::new();
    let header = header_line();
    println!("{header}");
    let mut lines = vec![header];
    let mut emit = |row: Row, rows: &mut Vec<Row>| {
        let line = row_line(&row);
        println!("{line}");
        lines.push(line);
        rows.push(row);
    };
    for (part, size, per_field) in sizes(max_tokens, max_fields) {
        let (ctx, tokens) = if part == "tokens" {
            build(&sents, &enc, per_field, 7, |tok, _| tok >= size)
        } else {
            build(&sents, &enc, per_field, 11, |_, n| n >= size)
        };
        let (stage_ms, chunks) = stages(&ctx);
        let stage_ms_off = stage_ms.clone();
        if chunks < hnsw_max_chunks || chunks < ScdConfig::default().prepare.hnsw_min_chunks {
            let mut row = measure(part, &ctx, tokens, true, &questions);
            row.stages = stage_ms;
            emit(row, &mut rows);
        } else {
            eprintln!("{part} {size}: {chunks} chunks, default (HNSW) run skipped (SCD_SCALE_HNSW_MAX_CHUNKS={hnsw_max_chunks})");
        }
        if chunks >= 16_000 {
            let mut off = measure(part, &ctx, tokens, false, &questions);
            off.stages = match rows.last().filter(|r| r.hnsw && r.tokens == tokens) {
                Some(d) => vec![("hnsw build = dflt prep − off prep", d.prepare_ms - off.prepare_ms)],
                None => stage_ms_off,
            };
            emit(off, &mut rows);
        }
    }
    write_results(&lines, &rows);
}

/// Log-log line plot of cold seconds vs tokens, one line per (part, hnsw),
/// with a dashed linear reference through each line's first point
/// (plotters' SVG backend; text is left to the viewer's fonts).
fn svg(rows: &[Row]) -> String {
    use plotters::prelude::*;
    let pts = |r: &Row| (r.tokens as f64, r.cold_s.max(1e-5));
    let decade = |v: f64, up: bool| 10f64.powf(if up { v.log10().ceil() } else { v.log10().floor() });
    let (xs, ys): (Vec<f64>, Vec<f64>) = rows.iter().map(pts).unzip();
    let x0 = decade(xs.iter().copied().fold(f64::MAX, f64::min), false);
    let x1 = decade(xs.iter().copied().fold(f64::MIN, f64::max), true).max(x0 * 10.0);
    let y0 = decade(ys.iter().copied().fold(f64::MAX, f64::min), false);
    let y1 = decade(ys.iter().copied().fold(f64::MIN, f64::max), true).max(y0 * 10.0);
    let colors = [
        RGBColor(0x1f, 0x77, 0xb4),
        RGBColor(0xd6, 0x27, 0x28),
        RGBColor(0x2c, 0xa0, 0x2c),
        RGBColor(0xff, 0x7f, 0x0e),
    ];
    let mut series: Vec<(&str, bool)> = Vec::new();
    for r in rows {
        if !series.contains(&(r.part, r.hnsw)) {
            series.push((r.part, r.hnsw));
        }
    }
    let mut out = String::new();
    {
        let root = SVGBackend::with_string(&mut out, (720, 480)).into_drawing_area();
        root.fill(&WHITE).unwrap();
        let mut chart = ChartBuilder::on(&root)
            .caption(
                "cold compress seconds vs context tokens (log-log, HashEncoder); dashed: linear",
                ("sans-serif", 14),
            )
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d((x0..x1).log_scale(), (y0..y1).log_scale())
            .unwrap();
        chart
            .configure_mesh()
            .light_line_style(WHITE)
            .x_label_formatter(&|v| format!("{v:.0e}"))
            .y_label_formatter(&|v| format!("{v:.0e} s"))
            .x_desc("tokens")
            .draw()
            .unwrap();
        for (k, (part, hnsw)) in series.iter().enumerate() {
            let c = colors[k % colors.len()];
            let line: Vec<(f64, f64)> = rows.iter().filter(|r| r.part == *part && r.hnsw == *hnsw).map(pts).collect();
            let label = format!(
                "{} ({})",
                if *part == "tokens" { "paragraph fields" } else { "1-2 sentence fields" },
                if *hnsw { "HNSW ≥ 20k chunks" } else { "HNSW off, LSH" }
            );
            chart
                .draw_series(LineSeries::new(line.iter().copied(), c.stroke_width(2)))
                .unwrap()
                .label(label)
                .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 10, y + 5)], c.filled()));
            chart.draw_series(line.iter().map(|&p| Circle::new(p, 3, c.filled()))).unwrap();
            if let (Some(&(ax, ay)), Some(&(bx, _))) = (line.first(), line.last()) {
                let linear = [(ax, ay), (bx, ay * bx / ax)];
                chart.draw_series(DashedLineSeries::new(linear, 4, 4, c.mix(0.6).stroke_width(1))).unwrap();
            }
        }
        chart.configure_series_labels().position(SeriesLabelPosition::UpperLeft).border_style(BLACK).draw().unwrap();
        root.present().unwrap();
    }
    out
}
