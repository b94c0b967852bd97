//! HNSW vs brute force on real e5-small embeddings (HotpotQA sentences,
//! questions as queries): recall@10 at the default parameters and the query
//! time of both at growing sizes, in the same run → crossover. Sizes beyond
//! the real sentences (marked `aug`) add noisy copies of real embeddings
//! (each real vector plus Gaussian noise of norm ~0.35, renormalized).
//!
//! Recall@10 and the build time are printed as a table (one measurement per
//! size: the 64k build alone takes ~30 s); the query times are criterion
//! benchmarks `hnsw_recall/brute/N` and `hnsw_recall/hnsw/N`, one query per
//! iteration, cycling through the 100 questions.
//!
//! Run: `cargo bench -p scd-benches --bench hnsw_recall`

use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rand_distr::StandardNormal;
use scd_benches::{hotpot_paragraphs, load_model};
use scd_engine::encoder::{EncodeOptions, Encoder, InputKind};
use scd_engine::index::{brute_force, recall_at_k, HnswIndex, HnswParams};

fn hnsw_recall(c: &mut Criterion) {
    let Some((paras, questions)) = hotpot_paragraphs() else {
        eprintln!("skipping: ../shared/evaldata/hotpotqa absent");
        return;
    };
    let Some(encoder) = load_model("e5-small") else { return };
    let n_max: usize = std::env::var("SCD_BENCH_VECTORS").ok().and_then(|v| v.parse().ok()).unwrap_or(8000);
    let mut sentences: Vec<String> = Vec::new();
    for (title, body) in &paras {
        for s in body.split(". ") {
            if sentences.len() < n_max && s.len() > 20 {
                sentences.push(format!("{title}: {s}"));
            }
        }
    }
    let t = Instant::now();
    let refs: Vec<&str> = sentences.iter().map(String::as_str).collect();
    let emb = encoder.encode(&refs, &EncodeOptions::new(InputKind::Passage).with_windows()).unwrap();
    let qs: Vec<&str> = questions.iter().take(100).map(String::as_str).collect();
    let q = encoder.encode(&qs, &EncodeOptions::new(InputKind::Query)).unwrap();
    eprintln!("embedded {} sentences and {} questions in {:.0}s", emb.len(), q.len(), t.elapsed().as_secs_f64());
    let real = emb.len();
    let target: usize = std::env::var("SCD_BENCH_AUGMENT").ok().and_then(|v| v.parse().ok()).unwrap_or(65_536);
    let mut all: Vec<Vec<f32>> = (0..real).map(|i| emb.row(i).to_vec()).collect();
    let mut rng = StdRng::seed_from_u64(0x853c_49e6_748f_ea9b);
    let mut gauss = || -> f32 { rng.sample(StandardNormal) };
    while all.len() < target {
        let base = &all[all.len() % real];
        let scale = 0.35 / (base.len() as f32).sqrt();
        let mut v: Vec<f32> = base.iter().map(|x| x + scale * gauss()).collect();
        scd_engine::encoder::l2_normalize(&mut v);
        all.push(v);
    }
    let params = HnswParams::default();
    println!(
        "params: M={} ef_construction={} ef_search={}",
        params.max_connections, params.ef_construction, params.ef_search
    );
    println!("{:>7} {:>10} {:>10} data", "n", "recall@10", "build_ms");
    let mut g = c.benchmark_group("hnsw_recall");
    g.sample_size(20).warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(3));
    let mut n = 1000;
    loop {
        let n_now = n.min(all.len());
        let vecs: Vec<&[f32]> = all[..n_now].iter().map(Vec::as_slice).collect();
        let t = Instant::now();
        let idx = HnswIndex::build(&vecs, params);
        let build_ms = t.elapsed().as_secs_f64() * 1e3;
        let recall: f64 = (0..q.len())
            .map(|i| f64::from(recall_at_k(&idx.search(q.row(i), 10), &brute_force(&vecs, q.row(i), 10))))
            .sum::<f64>()
            / q.len() as f64;
        let data = if n_now <= real { "real" } else { "aug" };
        println!("{n_now:>7} {recall:>10.4} {build_ms:>10.0} {data}");
        let mut i = 0;
        g.bench_with_input(BenchmarkId::new("brute", n_now), &vecs, |b, vecs| {
            b.iter(|| {
                i = (i + 1) % q.len();
                let hits = brute_force(vecs, q.row(i), 10);
                assert_eq!(hits.len(), 10);
                hits
            })
        });
        g.bench_with_input(BenchmarkId::new("hnsw", n_now), &idx, |b, idx| {
            b.iter(|| {
                i = (i + 1) % q.len();
                let hits = idx.search(q.row(i), 10);
                assert_eq!(hits.len(), 10);
                hits
            })
        });
        if n_now == all.len() {
            break;
        }
        n *= 2;
    }
    g.finish();
}

criterion_group!(benches, hnsw_recall);
criterion_main!(benches);
