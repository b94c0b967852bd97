//! Compression speed on a ~50k-token context of real HotpotQA paragraphs:
//! * cold: first compression (chunk, count, embed every chunk) vs the pure
//!   encode time of the same chunk texts, in the same run → ratio;
//! * warm: a new task on the already-embedded context → p50/p95, with the
//!   task embedding shown separately.
//!
//! Run: `cargo bench -p scd-benches --bench scd_speed`

use std::sync::Arc;
use std::time::Instant;

use scd_benches::{hotpot_paragraphs, load_model};
use scd_engine::context::{Context, ContextRequirement, Field, FieldKind, Task};
use scd_engine::encoder::{EncodeOptions, Encoder, InputKind};
use scd_engine::extract::{CompressRequest, Scd, ScdConfig};

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * p).round() as usize]
}

fn main() {
    let Some((paras, questions)) = hotpot_paragraphs() else {
        eprintln!("skipping: ../shared/evaldata/hotpotqa absent");
        return;
    };
    let Some(encoder) = load_model("e5-small") else { return };
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

    // cold: a fresh engine embeds everything
    let scd = Scd::new(encoder.clone(), ScdConfig::default());
    let t = Instant::now();
    let first = scd.compress(&req(&questions[0])).unwrap();
    let cold_s = t.elapsed().as_secs_f64();
    // baseline in the same run: encode exactly the chunk texts SCD embedded
    let chunk_texts: Vec<String> = {
        let probe =
            Scd::new(encoder.clone(), ScdConfig { cache_bytes: 0, prepared_cache_bytes: 0, ..ScdConfig::default() });
        let all = probe
            .compress(&CompressRequest { requirement: ContextRequirement::with_budget(tokens * 2), ..req("x") })
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

    // warm: new tasks on the embedded context
    let mut total = Vec::new();
    let mut select = Vec::new();
    let mut task_embed = Vec::new();
    for q in questions.iter().skip(1).take(60) {
        let t = Instant::now();
        let out = scd.compress(&req(q)).unwrap();
        total.push(t.elapsed().as_secs_f64() * 1e3);
        select.push(out.timings.prepare_ms + out.timings.select_ms);
        task_embed.push(out.timings.task_embed_ms);
        assert!(out.totals.sent_tokens <= tokens / 3);
    }
    println!(
        "warm (60 new tasks): total p50 {:.2} ms p95 {:.2} ms; of which task embedding p50 {:.2} ms; lookup+selection p50 {:.2} ms p95 {:.2} ms",
        pct(&mut total.clone(), 0.5),
        pct(&mut total, 0.95),
        pct(&mut task_embed, 0.5),
        pct(&mut select.clone(), 0.5),
        pct(&mut select, 0.95)
    );
}
