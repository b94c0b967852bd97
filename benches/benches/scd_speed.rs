//! Compression speed on a ~50k-token context of real HotpotQA paragraphs:
//! * cold: first compression (chunk, count, embed every chunk) vs the pure
//!   encode time of the same chunk texts, in the same run → ratio. One
//!   measurement, printed, not a criterion benchmark: each side takes ~20 s
//!   on 2 cores, and criterion's minimum of 10 samples (plus warm-up) would
//!   make it ~7 minutes; `SCD_BENCH_COLD_RUNS` repeats it;
//! * warm: a new task on the already-embedded context → p50/p95 over 60
//!   tasks, with the task embedding shown separately (printed), then the
//!   criterion benchmarks `scd_speed/warm_new_task` (whole call, a task never
//!   seen before on every iteration) and `scd_speed/warm_selection` (the
//!   engine's own lookup + selection time of those calls, via `iter_custom`).
//!
//! Run: `cargo bench -p scd-benches --bench scd_speed` (the model is
//! `SCD_BENCH_MODEL`, default `e5-small`; `e5-small-int8` for the int8 encoder).

use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};

use scd_benches::{hotpot_paragraphs, load_model};
use scd_engine::context::{Context, ContextRequirement, Field, FieldKind, Task};
use scd_engine::encoder::{EncodeOptions, Encoder, InputKind};
use scd_engine::extract::{CompressRequest, PrepareConfig, Scd, ScdConfig};

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * p).round() as usize]
}

fn scd_speed(c: &mut Criterion) {
    let Some((paras, questions)) = hotpot_paragraphs() else {
        eprintln!("skipping: ../shared/evaldata/hotpotqa absent");
        return;
    };
    let model = std::env::var("SCD_BENCH_MODEL").unwrap_or_else(|_| "e5-small".into());
    let Some(encoder) = load_model(&model) else { return };
    eprintln!("model: {}", encoder.model_id());
    let encoder: Arc<dyn Encoder> = Arc::new(encoder);
    let target: usize = std::env::var("SCD_BENCH_TOKENS").ok().and_then(|v| v.parse().ok()).unwrap_or(50_000);
    let mut fields = Vec::new();
    let mut seen = std::collections::HashSet::new();
    let mut tokens = 0;
    for (title, body) in paras {
        if tokens >= target || !seen.insert(title.clone()) {
            continue;
        }
        tokens += encoder.count_tokens(&body).unwrap();
        fields.push(Field { name: title, kind: FieldKind::Prose, content: body, confidential: false });
    }
    let context = Context { fields };
    let req = |task: &str| CompressRequest {
        task: Task::new(task),
        context: context.clone(),
        requirement: ContextRequirement::with_budget(tokens / 3),
        session: None,
    };
    eprintln!("context: {} fields, {tokens} tokens", context.fields.len());

    let cold_runs: usize = std::env::var("SCD_BENCH_COLD_RUNS").ok().and_then(|v| v.parse().ok()).unwrap_or(1);
    for _ in 1..cold_runs {
        cold(&encoder, &req(&questions[0]), tokens);
    }
    let scd = cold(&encoder, &req(&questions[0]), tokens);

    // warm: new tasks on the embedded context
    let mut total = Vec::new();
    let mut select = Vec::new();
    let mut task_embed = Vec::new();
    let mut hop_embed = Vec::new();
    for q in questions.iter().skip(1).take(60) {
        let t = Instant::now();
        let out = scd.compress(&req(q)).unwrap();
        total.push(t.elapsed().as_secs_f64() * 1e3);
        select.push(out.timings.prepare_ms + out.timings.select_ms);
        task_embed.push(out.timings.task_embed_ms);
        hop_embed.push(out.timings.hop_embed_ms);
        assert!(out.totals.sent_tokens <= tokens / 3);
    }
    println!(
        "warm (60 new tasks): total p50 {:.2} ms p95 {:.2} ms; of which task embedding p50 {:.2} ms (the second hop's p50 {:.2} ms); lookup+selection p50 {:.2} ms p95 {:.2} ms",
        pct(&mut total.clone(), 0.5),
        pct(&mut total, 0.95),
        pct(&mut task_embed, 0.5),
        pct(&mut hop_embed, 0.5),
        pct(&mut select.clone(), 0.5),
        pct(&mut select, 0.95)
    );

    // criterion: every iteration asks a task the engine has not seen (a
    // question with a fresh suffix), so the task embedding is never cached.
    let mut g = c.benchmark_group("scd_speed");
    g.sample_size(30).warm_up_time(Duration::from_secs(2)).measurement_time(Duration::from_secs(10));
    let mut n = 0usize;
    let mut fresh = move || {
        n += 1;
        format!("{} (variant {n})", questions[1 + n % (questions.len() - 1)])
    };
    g.bench_function("warm_new_task", |b| {
        b.iter_batched(
            &mut fresh,
            |task| {
                let out = scd.compress(&req(&task)).unwrap();
                assert!(out.totals.sent_tokens <= tokens / 3 && !out.chunks.is_empty());
                out
            },
            criterion::BatchSize::SmallInput,
        )
    });
    g.bench_function("warm_selection", |b| {
        b.iter_custom(|iters| {
            let mut engine_ms = 0.0;
            for _ in 0..iters {
                let out = scd.compress(&req(&fresh())).unwrap();
                assert!(out.totals.sent_tokens <= tokens / 3 && !out.chunks.is_empty());
                engine_ms += out.timings.prepare_ms + out.timings.select_ms;
            }
            Duration::from_secs_f64(engine_ms / 1e3)
        })
    });
    g.finish();
}

/// A fresh engine embeds everything for `req`; prints the ratio to the pure
/// encode time of the same chunk texts and returns the warmed engine.
fn cold(encoder: &Arc<dyn Encoder>, req: &CompressRequest, tokens: usize) -> Scd {
    let scd = Scd::new(encoder.clone(), ScdConfig::default());
    let t = Instant::now();
    let first = scd.compress(req).unwrap();
    let cold_s = t.elapsed().as_secs_f64();
    // baseline in the same run: encode exactly the chunk texts SCD embedded
    let chunk_texts: Vec<String> = {
        let probe = Scd::new(
            encoder.clone(),
            ScdConfig {
                prepare: PrepareConfig { cache_bytes: 0, prepared_cache_bytes: 0, ..Default::default() },
                ..ScdConfig::default()
            },
        );
        let all = probe
            .compress(&CompressRequest {
                task: Task::new("x"),
                requirement: ContextRequirement::with_budget(tokens * 2),
                ..req.clone()
            })
            .unwrap();
        all.chunks.iter().map(|c| format!("{}: {}", c.field, c.text)).collect()
    };
    let refs: Vec<&str> = chunk_texts.iter().map(String::as_str).collect();
    let t = Instant::now();
    encoder.encode(&refs, &EncodeOptions::new(InputKind::Passage).with_windows()).unwrap();
    let encode_s = t.elapsed().as_secs_f64();
    println!(
        "cold: compress {cold_s:.2}s, pure encode of the {} chunks {encode_s:.2}s, ratio {:.3} (target <= 1.1); sent {} of {} tokens",
        chunk_texts.len(),
        cold_s / encode_s,
        first.totals.sent_tokens,
        first.totals.context_tokens
    );
    scd
}

criterion_group!(benches, scd_speed);
criterion_main!(benches);
