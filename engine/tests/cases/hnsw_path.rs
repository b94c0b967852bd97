//! Large contexts go through the HNSW index and select as brute force does.

use std::sync::Arc;

use scd_engine::context::{Context, ContextRequirement, Field, FieldKind, Task};
use scd_engine::encoder::HashEncoder;
use scd_engine::extract::{CompressRequest, PrepareConfig, Scd, ScdConfig};

#[test]
fn large_contexts_use_hnsw_and_select_like_brute_force() {
    let words =
        ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet", "kilo", "lima"];
    let content: String = (0..400)
        .map(|i| format!("Entry {i} mentions {} and {} today.\n", words[i % 12], words[(i * 7 + 3) % 12]))
        .collect();
    let ctx =
        Context { fields: vec![Field { name: "notes".into(), kind: FieldKind::Log, content, confidential: false }] };
    let run = |hnsw_min_chunks: usize| {
        let cfg = ScdConfig {
            prepare: PrepareConfig { hnsw_min_chunks, hnsw_candidates: 64, ..Default::default() },
            ..ScdConfig::default()
        };
        let scd = Scd::new(Arc::new(HashEncoder::new(128, 512)), cfg);
        let out = scd
            .compress(&CompressRequest {
                task: Task::new("which entries mention charlie and hotel"),
                context: ctx.clone(),
                requirement: ContextRequirement::with_budget(60),
                session: None,
            })
            .unwrap();
        out.chunks.iter().map(|c| c.id.clone()).collect::<Vec<_>>()
    };
    let exact = run(usize::MAX);
    let approx = run(10);
    let same = approx.iter().filter(|id| exact.contains(id)).count();
    assert!(!exact.is_empty());
    assert!(same as f32 >= 0.9 * exact.len() as f32, "hnsw {approx:?} vs exact {exact:?}");
}
