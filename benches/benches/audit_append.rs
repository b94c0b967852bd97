//! The audit trail (`scd_audit::AuditLog`): the cost of one durable
//! append (one fsync'd redb commit), alone and with 8 threads appending at
//! once (group commit: one commit carries every pending record), and the
//! size of a 200-step run's trail at level `summary` vs `chunks`.
//!
//! Records look like a Compress record of the agent demo: a did:key caller,
//! a 120-character task, 12 chunks sent, one withheld field.
//!
//! Run: `cargo bench -p scd-benches --bench audit_append`

use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use scd_audit::{AuditChunk, AuditFilter, AuditLevel, AuditLog, AuditRecord, Retention};

fn record(step: usize) -> AuditRecord {
    let mut r = AuditRecord::new("Compress");
    r.caller = Some("did:key:z6MkhaXgBZDvotDkL5257faiztiGiC2QtKLGpbnnEGta2doK".into());
    r.peer = Some("127.0.0.1:53124".into());
    r.session_id = Some(format!("b7c1e0f4a9d24c55a1f0e3d2c4b5a6{step:02x}"));
    r.set_task(&format!("Step {step}: why are checkout charges timing out after the gateway deploy, and which retry path double-charges cards?"));
    r.model = Some("e5-small".into());
    r.chunks = (0..12)
        .map(|i| AuditChunk {
            id: format!("error_logs#{}", i * 3 + step % 3),
            field: "error_logs".into(),
            score: 0.4 + i as f32 / 40.0,
            tokens: 38 + i as u32,
        })
        .collect();
    r.chunk_count = 12;
    r.withheld = vec!["gateway_credentials".into()];
    r.budget_tokens = Some(512);
    r.context_tokens = 5120;
    r.selected_tokens = 498;
    r.reduction_ratio = 10.3;
    r
}

/// Bytes of a 200-step run's trail: (summed record JSON, file on disk).
fn run_size(level: AuditLevel) -> (u64, u64) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.redb");
    let log = AuditLog::open(&path, level, Retention::default()).unwrap();
    for step in 0..200 {
        log.append(vec![record(step)]).unwrap();
    }
    assert_eq!(log.query(&AuditFilter::default()).unwrap().len(), 200);
    let (_, json) = log.stats().unwrap();
    drop(log);
    (json, std::fs::metadata(&path).unwrap().len())
}

fn bench(c: &mut Criterion) {
    for level in [AuditLevel::Summary, AuditLevel::Chunks] {
        let (json, file) = run_size(level);
        println!("audit 200-step run at level {level}: {json} bytes of records, {file} bytes of redb file");
    }
    let mut g = c.benchmark_group("audit_append");
    g.sample_size(20).measurement_time(Duration::from_secs(5));
    g.throughput(Throughput::Elements(1));
    let dir = tempfile::tempdir().unwrap();
    let log = AuditLog::open(&dir.path().join("one.redb"), AuditLevel::Chunks, Retention::default()).unwrap();
    g.bench_function("one_writer", |b| b.iter(|| assert_eq!(log.append(vec![record(1)]).unwrap().len(), 1)));
    let log =
        Arc::new(AuditLog::open(&dir.path().join("eight.redb"), AuditLevel::Chunks, Retention::default()).unwrap());
    // time per record with 8 threads appending one record at a time
    g.bench_function("eight_writers_per_record", |b| {
        b.iter_custom(|iters| {
            let per = iters.div_ceil(8).max(1);
            let start = Instant::now();
            let threads: Vec<_> = (0..8)
                .map(|_| {
                    let log = log.clone();
                    std::thread::spawn(move || {
                        for _ in 0..per {
                            assert_eq!(log.append(vec![record(2)]).unwrap().len(), 1);
                        }
                    })
                })
                .collect();
            for t in threads {
                t.join().unwrap();
            }
            start.elapsed().mul_f64(iters as f64 / (per * 8) as f64)
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
