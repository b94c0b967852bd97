//! Encoder throughput (tokens/s) for each built model at batch 1, 8 and 32 on
//! mixed-length text. Models missing from models/out are skipped with a note
//! (`make bench` builds e5-large-arch first).

use std::path::PathBuf;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use scd_engine::encoder::{EncodeOptions, Encoder, InputKind, OrtConfig, OrtEncoder};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Deterministic mixed-length passages (8 to ~300 words).
fn mixed_texts(n: usize) -> Vec<String> {
    let words = [
        "agent",
        "context",
        "budget",
        "token",
        "the",
        "receiver",
        "asks",
        "for",
        "more",
        "chunks",
        "when",
        "its",
        "confidence",
        "drops",
        "below",
        "threshold",
    ];
    let mut state = 0x2545F4914F6CDD1Du64;
    (0..n)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let len = 8 + (state % 300) as usize;
            (0..len).map(|i| words[(i * 7 + (state as usize >> 8)) % words.len()]).collect::<Vec<_>>().join(" ")
        })
        .collect()
}

fn bench_encoders(c: &mut Criterion) {
    let lib = std::env::var_os("SCD_ORT_LIB")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join(".tools/ort/libonnxruntime.so"));
    let models = std::env::var_os("SCD_MODELS_DIR").map(PathBuf::from).unwrap_or_else(|| root().join("models/out"));
    let texts = mixed_texts(32);
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    let opts = EncodeOptions::new(InputKind::Passage).with_windows();
    for name in ["e5-small", "minilm", "e5-large-arch"] {
        let dir = models.join(name);
        if !dir.join("manifest.json").exists() {
            eprintln!("skipping {name}: not built (models/setup.sh {name})");
            continue;
        }
        let encoder = OrtEncoder::load(&dir, &OrtConfig::new(&lib)).expect("model loads");
        let mut group = c.benchmark_group(format!("encode/{name}"));
        group.sample_size(10);
        for batch in [1usize, 8, 32] {
            let input = &refs[..batch];
            let tokens: usize = encoder.encode(input, &opts).unwrap().tokens.iter().sum();
            group.throughput(Throughput::Elements(tokens as u64));
            group.bench_with_input(BenchmarkId::new("mixed", batch), &input, |b, input| {
                b.iter(|| {
                    let out = encoder.encode(input, &opts).unwrap();
                    assert_eq!(out.len(), input.len());
                })
            });
        }
        group.finish();
    }
}

criterion_group!(benches, bench_encoders);
criterion_main!(benches);
