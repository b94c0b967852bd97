//! Budgets in the receiver's tokenizer (`budget_tokenizer`) and `explain`
//! over gRPC against `scd serve` with the real model; the sent text is
//! counted again here with `tiktoken-rs` itself, not with the engine's code.

use scd_service::grpc::pb;
use scd_service::grpc::pb::scd_client::ScdClient;
use tonic::transport::Channel;
use tonic::Code;

use crate::{grpc, ready, root, scd};

/// o200k tokens of `text`, as an OpenAI API counts them (no special tokens).
fn o200k(text: &str) -> usize {
    tiktoken_rs::o200k_base_singleton().encode_ordinary(text).len()
}

/// What the receiver gets: the chunks in reading order joined by a newline.
fn e5_tokenizer_json() -> String {
    root().join("models/out/e5-small/tokenizer.json").display().to_string()
}

fn with_tokenizer(budget: u32, name: &str) -> pb::CompressRequest {
    pb::CompressRequest { budget_tokenizer: name.into(), ..grpc::compress_req(budget, "") }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_budget_tokenizer_is_checked_reported_and_never_overflowed() {
    if !ready() {
        return;
    }
    let llama = format!("llama={}", e5_tokenizer_json());
    let server = grpc::start(&["--budget-tokenizer", &llama]);
    let mut c = grpc::client(&server).await;

    // unknown names and paths: INVALID_ARGUMENT listing the choices; a path is never read
    for bad in ["nope", "/etc/passwd"] {
        let e = c.compress(with_tokenizer(150, bad)).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{bad}: {e:?}");
        let m = e.message();
        assert!(m.starts_with("budget_tokenizer: unknown tokenizer"), "{m}");
        assert!(m.contains("choose one of: e5, o200k, cl100k, llama"), "{m}");
        assert!(!m.contains("root:"), "the file was read: {m}");
    }

    // the default is the encoder's own tokenizer
    let out = c.compress(grpc::compress_req(150, "")).await.unwrap().into_inner();
    assert_eq!(out.totals.unwrap().tokenizer, "e5");

    o200k_is_named_and_never_overflowed(&mut c).await;

    // cl100k and a registered tokenizer.json are accepted and named
    let out = c.compress(with_tokenizer(100, "cl100k")).await.unwrap().into_inner();
    let sent = tiktoken_rs::cl100k_base_singleton().encode_ordinary(&out.text.clone()).len();
    assert!(sent <= 100, "{sent} cl100k tokens sent");
    assert_eq!(out.totals.unwrap().tokenizer, "cl100k");
    let out = c.compress(with_tokenizer(100, "llama")).await.unwrap().into_inner();
    assert_eq!(out.totals.clone().unwrap().tokenizer, "llama");
    let hf = scd_engine::budget::HfTokenizer::load("llama", e5_tokenizer_json()).unwrap();
    use scd_engine::budget::TokenCounter as _;
    let sent = hf.count(&out.text.clone()).unwrap();
    assert!(sent <= 100 && out.totals.unwrap().sent_tokens > 0, "{sent} llama tokens sent");

    scd_client_compress_names_its_tokenizer(&server.addr);

    a_session_counts_its_follow_ups_in_the_same_tokenizer(&mut c).await;
}

/// o200k: named in the totals, the sent text within each budget counted by
/// tiktoken itself, the ratios true.
async fn o200k_is_named_and_never_overflowed(c: &mut ScdClient<Channel>) {
    for budget in [30u32, 60, 150, 400] {
        let out = c.compress(with_tokenizer(budget, "o200k")).await.unwrap().into_inner();
        let t = out.totals.clone().unwrap();
        assert_eq!(t.tokenizer, "o200k");
        assert!(!out.chunks.is_empty(), "budget {budget}: nothing sent");
        let sent = o200k(&out.text.clone());
        assert!(sent <= budget as usize, "budget {budget}: {sent} o200k tokens sent");
        assert!(t.sent_tokens as usize <= budget as usize && t.sent_tokens > 0, "{t:?}");
        for ch in &out.chunks {
            assert_eq!(ch.tokens as usize, o200k(&ch.text), "{}: tokens not counted in o200k", ch.id);
        }
        let asked = t.context_tokens as f32 / budget as f32;
        assert!(
            (t.requested_ratio - asked).abs() <= 1e-3 * asked,
            "requested {} vs C/budget {asked}",
            t.requested_ratio
        );
        let achieved = t.context_tokens as f32 / t.sent_tokens as f32;
        assert!((t.reduction_ratio - achieved).abs() <= 1e-3 * achieved, "{t:?}");
        assert!(t.reduction_ratio >= t.requested_ratio * 0.999, "asked {t:?}");
        assert!(!format!("{out:?}").contains("sk_live_SECRET_4242"), "confidential content leaked");
    }
}

/// `scd client compress` against `addr`: the registered name, the table,
/// and an unknown name failing with the server's message.
fn scd_client_compress_names_its_tokenizer(addr: &str) {
    let client = |extra: &[&str]| {
        let mut args = vec!["client", "--addr", addr, "compress", "--task"];
        args.extend(["Why are customer charges failing at checkout?", "--context", "fixtures/agent_context.json"]);
        args.extend(["--budget", "150"]);
        args.extend(extra);
        scd(&args, "")
    };
    let (ok, stdout, stderr) = client(&["--budget-tokenizer", "llama", "--explain", "--format", "text"]);
    assert!(ok, "{stderr}");
    // stdout: only the text; stderr: the sizes and the table
    assert!(!stdout.contains("-- ") && !stdout.trim().is_empty(), "{stdout}");
    assert!(stderr.contains(" llama tokens sent (") && stderr.contains("; tokens in llama"), "{stderr}");
    assert!(stderr.lines().any(|l| l.starts_with("id ") && l.ends_with(" chunker")), "{stderr}");
    assert!(stderr.lines().any(|l| l.starts_with("-- dropped: ")), "{stderr}");
    let (ok, stdout, stderr) = client(&["--budget-tokenizer", "o200k"]);
    assert!(ok, "{stderr}");
    let v: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(v["totals"]["tokenizer"], "o200k", "{v}");
    assert!(v.get("explanation").is_none(), "{v}");
    let (ok, _, stderr) = client(&["--budget-tokenizer", "nope"]);
    assert!(!ok && stderr.contains("budget_tokenizer: unknown tokenizer \"nope\""), "{stderr}");
}

/// A session counts its follow-ups in the same tokenizer (o200k), within
/// the session total, and a follow-up's own budget bounds it too.
async fn a_session_counts_its_follow_ups_in_the_same_tokenizer(c: &mut ScdClient<Channel>) {
    let budget = 120;
    let mut open = with_tokenizer(budget, "o200k");
    open.session_id = "budget-o200k".into();
    // a session total: the first answer and its follow-ups share the budget
    open.session_max_total_tokens = budget;
    open.requirement.as_mut().unwrap().min_relative_score = Some(1.0);
    let first = c.compress(open).await.unwrap().into_inner();
    let first_sent = o200k(&first.text.clone());
    let more = c
        .request_context(pb::ContextRequest {
            session_id: first.session_id.clone(),
            session_token: first.session_token.clone(),
            specific_question: "which function acquires the database connection?".into(),
            current_confidence: 0.1,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    for ch in &more.chunks {
        assert_eq!(ch.tokens as usize, o200k(&ch.text), "{}", ch.id);
    }
    let more_sent = o200k(&more.text);
    // the pasted text: each chunk under its piece's header line
    assert!(
        more.text.starts_with('[') && more.chunks.iter().all(|ch| more.text.contains(ch.text.trim())),
        "{}",
        more.text
    );
    assert_eq!(more.sent_tokens as usize, more_sent);
    assert!(first_sent + more_sent <= budget as usize, "{first_sent} + {more_sent} o200k tokens over {budget}");
    assert_eq!(more.session_sent_tokens as usize, first_sent + more_sent, "{more:?}");
    assert_eq!(more.remaining_tokens as usize, budget as usize - first_sent - more_sent, "{more:?}");
    // a follow-up's own budget bounds it too
    let small = c
        .request_context(pb::ContextRequest {
            session_id: first.session_id.clone(),
            session_token: first.session_token.clone(),
            specific_question: "what did the user report?".into(),
            current_confidence: 0.1,
            max_tokens: 10,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(o200k(&small.text) <= 10 && small.budget <= 10, "{small:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_explain_parts_add_up_to_each_score() {
    if !ready() {
        return;
    }
    let server = grpc::start(&[]);
    let mut c = grpc::client(&server).await;
    let out = c.compress(grpc::compress_req(150, "")).await.unwrap().into_inner();
    assert!(out.explanation.is_none(), "an explanation nobody asked for");

    let req = pb::CompressRequest { explain: true, ..grpc::compress_req(150, "") };
    let out = c.compress(req).await.unwrap().into_inner();
    let ex = out.explanation.clone().expect("explain: an explanation");
    assert!(ex.lexical_weight.is_finite() && ex.lexical_weight >= 0.0, "{}", ex.lexical_weight);
    // one entry per sent chunk, in reading order
    let ids: Vec<&str> = ex.selected.iter().map(|w| w.id.as_str()).collect();
    let sent: Vec<&str> = out.chunks.iter().map(|c| c.id.as_str()).collect();
    assert_eq!(ids, sent);
    for (w, ch) in ex.selected.iter().zip(&out.chunks) {
        let sum = w.dense_z + ex.lexical_weight * w.lexical_z + w.group_lift + w.link_lift + w.hop_lift + w.rerank_lift;
        assert!((sum - w.score).abs() <= 1e-3, "{}: parts add up to {sum}, score {}", w.id, w.score);
        assert_eq!(w.tokens, ch.tokens, "{}", w.id);
        assert!(!w.required, "{}: no field was required", w.id);
    }
    // packing orders are 1..=n
    let mut orders: Vec<u32> = ex.selected.iter().map(|w| w.order).collect();
    orders.sort_unstable();
    assert_eq!(orders, (1..=ex.selected.len() as u32).collect::<Vec<_>>());
    // every dropped chunk has a reason, and the confidential field is never listed
    assert!(!ex.dropped.is_empty(), "150 tokens of the fixture drop something");
    for d in &ex.dropped {
        let reason = pb::DropReason::try_from(d.reason).unwrap();
        assert_ne!(reason, pb::DropReason::Unspecified, "{}", d.id);
        assert!(!d.id.starts_with("api_keys"), "confidential field listed: {}", d.id);
        if reason == pb::DropReason::NearDuplicate {
            assert!(sent.contains(&d.duplicate_of.as_str()), "{}: duplicate of unsent {:?}", d.id, d.duplicate_of);
        }
    }
    let dropped: std::collections::BTreeSet<&str> = out.dropped.iter().map(|d| d.id.as_str()).collect();
    assert!(ex.dropped.iter().all(|d| dropped.contains(d.id.as_str())), "explained drops not in the manifest");
    assert!(!format!("{out:?}").contains("sk_live_SECRET_4242"), "confidential content leaked");

    // each row names the chunker that cut it: the Rust field by its parser
    let mut req = pb::CompressRequest { explain: true, ..grpc::compress_req(400, "") };
    req.requirement.as_mut().unwrap().required_fields = vec!["code".into()];
    let out = c.compress(req).await.unwrap().into_inner();
    let ex = out.explanation.unwrap();
    let chunker = |prefix: &str| -> Vec<&str> {
        ex.selected.iter().filter(|w| w.id.starts_with(prefix)).map(|w| w.chunker.as_str()).collect()
    };
    let code = chunker("code#");
    assert!(!code.is_empty() && code.iter().all(|c| *c == "tree-sitter:rust"), "{:?}", ex.selected);
    assert!(ex.selected.iter().filter(|w| w.id.starts_with("code#")).all(|w| w.required));
    assert!(chunker("error_logs#").iter().all(|c| *c == "log"), "{:?}", ex.selected);
    assert!(ex.selected.iter().all(|w| !w.chunker.is_empty()), "{:?}", ex.selected);

    // a calibrated threshold: chunks under it are dropped as below the threshold, with their value
    let mut req = pb::CompressRequest { explain: true, ..grpc::compress_req(400, "") };
    req.requirement.as_mut().unwrap().min_relative_score = Some(0.5);
    let out = c.compress(req).await.unwrap().into_inner();
    let ex = out.explanation.unwrap();
    let below: Vec<&pb::DropWhy> =
        ex.dropped.iter().filter(|d| d.reason == pb::DropReason::BelowThreshold as i32).collect();
    assert!(!below.is_empty(), "{:?}", ex.dropped);
    for d in below {
        assert_eq!(d.threshold, "min_relative_score", "{d:?}");
        assert!(d.value < 0.5, "{d:?}");
    }
}

#[test]
fn serve_checks_budget_tokenizer_flags_before_the_model_loads() {
    // a models dir that does not exist: the flag's error must come first
    let serve = |flag: &str| {
        let (ok, _, stderr) =
            scd(&["--models-dir", "/nonexistent", "serve", "--addr", "127.0.0.1:0", "--budget-tokenizer", flag], "");
        assert!(!ok, "{flag}: served");
        stderr
    };
    let e = serve("bad");
    assert!(e.contains("--budget-tokenizer bad: expected NAME=PATH"), "{e}");
    let e = serve("x=/missing.json");
    assert!(e.contains("--budget-tokenizer") && e.contains("x=/missing.json"), "{e}");
    let e = serve(&format!("o200k={}", e5_tokenizer_json()));
    assert!(e.contains("--budget-tokenizer") && e.contains("\"o200k\" is already taken"), "{e}");
    let e = serve("x=/etc/passwd");
    assert!(e.contains("--budget-tokenizer") && e.contains("x=/etc/passwd") && !e.contains("root:"), "{e}");
}
