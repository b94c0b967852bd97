//! The agent's unit tests.

use super::node::push;
use super::node::Job;
use super::reading::check_context;
use super::reading::cited;
use super::reading::merge_chunks;
use super::reading::missing;
use super::*;
use crate::pb;
use std::sync::atomic::AtomicU64;
use tokio::sync::watch;

#[test]
fn work_orders_are_strict() {
    let ok = WorkOrder::parse(br#"{"title":"fix","steps":3,"needs":["retry"]}"#).unwrap();
    assert_eq!(ok.steps, 3);
    assert_eq!(WorkOrder::parse(br#"{"title":"fix"}"#).unwrap().steps, 4);
    let cases: [(&[u8], &str); 5] = [
        (br#"{"title":"fix","stpes":3}"#, "task.payload.stpes: unknown field"),
        (br#"{"title":"fix","steps":0}"#, "task.payload.steps: 0 (1 to 100)"),
        (br#"{"title":"fix","steps":101}"#, "task.payload.steps: 101 (1 to 100)"),
        (br#"{"title":"fix"} x"#, "task.payload: trailing characters"),
        (br#"{"steps":1}"#, "task.payload"),
    ];
    for (payload, want) in cases {
        let err = WorkOrder::parse(payload).unwrap_err().to_string();
        assert!(err.starts_with(want), "{err} (wanted {want})");
    }
    let big = vec![b' '; MAX_PAYLOAD_BYTES + 1];
    assert_eq!(
        WorkOrder::parse(&big).unwrap_err().to_string(),
        format!("task.payload: {} bytes (limit 65536)", MAX_PAYLOAD_BYTES + 1)
    );
    let needs = serde_json::json!({"title": "x", "needs": vec!["a"; MAX_NEEDS + 1]}).to_string();
    assert!(WorkOrder::parse(needs.as_bytes()).unwrap_err().to_string().starts_with("task.payload.needs: 33 needs"));
}

#[test]
fn a_job_holds_its_latest_checkpoint_then_only_its_final_result() {
    let (tx, rx) = watch::channel(Vec::new());
    let job = Job { results: tx, pushed: AtomicU64::new(0), proved: Default::default(), proof_ack: Default::default() };
    let result = |status: pb::TaskStatus, step: u32| pb::TaskResult {
        status: status as i32,
        checkpoint: Some(pb::TaskCheckpoint { step_number: step, ..Default::default() }),
        ..Default::default()
    };
    for step in 1..=100 {
        push(&job, result(pb::TaskStatus::Running, step));
        let held = rx.borrow();
        assert_eq!(held.len(), 1, "step {step}");
        assert_eq!((held[0].0, held[0].1.checkpoint.as_ref().unwrap().step_number), (u64::from(step), step));
    }
    push(&job, result(pb::TaskStatus::Completed, 0));
    let held = rx.borrow();
    let kept: Vec<(u64, i32)> = held.iter().map(|(n, r)| (*n, r.status)).collect();
    assert_eq!(kept, [(100, pb::TaskStatus::Running as i32), (101, pb::TaskStatus::Completed as i32)]);
}

#[test]
fn contexts_past_the_chunk_limits_are_refused_naming_them() {
    let chunk = |id: String| pb::ContextChunk { chunk_id: id, field: "f".into(), ..Default::default() };
    let many = pb::ContextDiff {
        chunks: (0..=MAX_CONTEXT_CHUNKS).map(|i| chunk(format!("f#{i}"))).collect(),
        ..Default::default()
    };
    let e = check_context(&many, "task.context").unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert_eq!(e.message(), "task.context: 1025 chunks and 0 withheld fields, over the limit of 1024 each");
    let long = pb::ContextDiff { chunks: vec![chunk("x".repeat(300))], ..Default::default() };
    let e = check_context(&long, "task.resume_from.context").unwrap_err();
    assert!(e.message().starts_with("task.resume_from.context.chunks[0]: a chunk_id or field over 256 bytes"), "{e:?}");
    assert!(!e.message().contains("xxx"), "the name is quoted");
    let mut ctx = pb::ContextDiff::default();
    merge_chunks(&mut ctx, &many.chunks);
    assert_eq!(ctx.chunks.len(), MAX_CONTEXT_CHUNKS, "an answer does not grow a context past the limit");
    check_context(&ctx, "task.context").unwrap();
}

#[test]
fn reply_to_must_be_the_requesters_own_address_or_allowed() {
    let peer = |a: &str| Some(a.parse::<std::net::SocketAddr>().unwrap());
    let allowed = vec!["planner.internal".to_string()];
    for (url, from, ok) in [
        ("http://10.0.0.5:7700", peer("10.0.0.5:41000"), true),
        ("https://10.0.0.5:7700", peer("[::ffff:10.0.0.5]:41000"), true),
        ("http://[2001:db8::1]:7700", peer("[2001:db8::1]:5"), true),
        ("http://localhost:7700", peer("127.0.0.1:5"), true),
        ("http://planner.internal:7700", peer("10.9.9.9:5"), true),
        ("http://10.0.0.6:7700", peer("10.0.0.5:41000"), false),
        ("http://localhost:7700", peer("10.0.0.5:5"), false),
        ("http://victim.example:80", peer("10.0.0.5:5"), false),
        ("http://10.0.0.5:7700", None, false),
        ("ftp://10.0.0.5/x", peer("10.0.0.5:5"), false),
    ] {
        assert_eq!(check_reply_to(url, from, &allowed).is_ok(), ok, "{url} from {from:?}");
    }
}

#[test]
fn confidence_is_the_share_of_needs_found() {
    let order =
        WorkOrder { title: "t".into(), steps: 1, needs: vec!["Retry policy".into(), "idempotency".into()], fail: None };
    let chunk = |id: &str, text: &str| pb::ContextChunk {
        chunk_id: id.into(),
        data: text.as_bytes().to_vec(),
        ..Default::default()
    };
    let mut ctx = pb::ContextDiff { chunks: vec![chunk("a#0", "the retry policy doubles")], ..Default::default() };
    assert_eq!(confidence(&order, &ctx), 0.5);
    assert_eq!(missing(&order, &ctx), vec!["idempotency".to_string()]);
    merge_chunks(&mut ctx, &[chunk("a#0", "dup"), chunk("b#1", "the IDEMPOTENCY key")]);
    assert_eq!(ctx.chunks.len(), 2);
    assert_eq!(confidence(&order, &ctx), 1.0);
    let none = WorkOrder { needs: vec![], ..order.clone() };
    assert_eq!(confidence(&none, &pb::ContextDiff::default()), 1.0);
    // a report cites the need-bearing chunks first, whatever their place
    let mut many = pb::ContextDiff {
        chunks: (0..100).map(|i| chunk(&format!("f#{i}"), "filler")).collect(),
        ..Default::default()
    };
    many.chunks.push(chunk("late#0", "our retry policy"));
    let ids = cited(&order, &many);
    assert_eq!(ids.len(), crate::work::MAX_REPORT_CHUNKS);
    assert_eq!((ids[0].as_str(), ids[1].as_str()), ("late#0", "f#0"));
    // a need cut by a chunk boundary: found, and both halves cited first
    let at = |id: &str, index: u32, text: &str| pb::ContextChunk { index, field: "a".into(), ..chunk(id, text) };
    let cut = pb::ContextDiff {
        chunks: vec![at("a#0", 0, "filler"), at("a#2", 2, "policy holds"), at("a#1", 1, "our retry")],
        ..Default::default()
    };
    assert_eq!(missing(&order, &cut), vec!["idempotency".to_string()]);
    assert_eq!(cited(&order, &cut), ["a#1", "a#2", "a#0"]);
}
