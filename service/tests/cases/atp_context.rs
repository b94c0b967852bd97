//! ATP layer 3 (`scd_atp::context`) against a real `scd serve` with the
//! default model: transfers withhold confidential fields, stay within the
//! receiver's budget, and answer adaptive requests below θ.

use std::collections::HashSet;

use prost::Message;
use scd_atp::context::{ContextFile, Field, HopLedger, ScdLink, Task, THETA};
use scd_atp::pb;

use crate::grpc::{client, start};
use crate::{ready, root};

const SECRET: &str = "sk_live_SECRET_4242";

fn fields() -> Vec<Field> {
    ContextFile::load(&root().join("fixtures/agent_context.json")).unwrap().fields
}

fn task() -> Task {
    Task {
        description: "Why are customer charges failing at checkout?".into(),
        constraints: vec!["name the table and the code path involved".into()],
        output_schema: Some("{\"cause\": string, \"table\": string, \"function\": string}".into()),
    }
}

fn offer(budget: u32) -> pb::ContextRequirement {
    pb::ContextRequirement { max_context_tokens: budget, ..Default::default() }
}

fn holds(haystack: &[u8], needle: &str) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle.as_bytes())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transfer_withholds_secrets_and_answers_adaptive_requests() {
    if !ready() {
        return;
    }
    let server = start(&[]);
    let dim = client(&server).await.info(scd_service::grpc::pb::InfoRequest {}).await.unwrap().into_inner().dim;
    let scd = ScdLink::connect(&server.addr).await.unwrap();
    let fields = fields();
    let budget = 300;
    let t = scd.compress(&task(), &fields, &offer(budget)).await.unwrap();
    eprintln!(
        "transfer: full {} sent {} chunks {:?} stubs {:?}",
        t.full_tokens,
        t.sent_tokens,
        t.diff.chunks.iter().map(|c| (&c.chunk_id, c.tokens)).collect::<Vec<_>>(),
        t.diff.dropped.iter().map(|d| (&d.chunk_id, d.tokens)).collect::<Vec<_>>()
    );

    assert_withheld_and_within_budget(&t, &fields, budget);

    // e_task: the model's dimension, the same vector as Embed of the task text
    let e = t.diff.task_embedding.clone().unwrap();
    assert_eq!((e.dimensions, e.values.len()), (dim, dim as usize));
    let direct = scd.embed_task(&task()).await.unwrap();
    let c = crate::cosine(&e.values, &direct.values);
    eprintln!("e_task cosine to Embed: {c:.6}");
    assert!(c > 0.99, "cosine {c}");

    // below θ: chunks never sent before, carrying their stubs' indices
    let sent: HashSet<String> = t.diff.chunks.iter().map(|c| c.chunk_id.clone()).collect();
    let stubs: HashSet<(u32, String)> = t.diff.dropped.iter().map(|d| (d.index, d.chunk_id.clone())).collect();
    let more = scd
        .request_more(&t.session, "what does the newsletter code render, and which topics exist?", 0.3, &[])
        .await
        .unwrap();
    eprintln!(
        "more: {:?} remaining {} reason {:?}",
        more.chunks.iter().map(|c| (&c.chunk_id, c.tokens)).collect::<Vec<_>>(),
        more.remaining_tokens,
        more.reason
    );
    assert!(!more.chunks.is_empty(), "reason: {}", more.reason);
    for c in &more.chunks {
        assert!(!sent.contains(&c.chunk_id), "{} resent", c.chunk_id);
        assert!(stubs.contains(&(c.index, c.chunk_id.clone())), "{} at {} is not a stub", c.chunk_id, c.index);
        assert!(c.field != "api_keys" && !holds(&c.data, SECRET));
    }
    let more_tokens: u64 = more.chunks.iter().map(|c| u64::from(c.tokens)).sum();
    // the reply is counted as pasted: its chunks and their header lines
    let left = u64::from(budget) - t.sent_tokens - more_tokens;
    assert!(u64::from(more.remaining_tokens) < left, "{} of {left}", more.remaining_tokens);

    // at or above θ: nothing, with the reason
    for conf in [THETA, 0.9] {
        let none = scd.request_more(&t.session, "anything else?", conf, &[]).await.unwrap();
        assert!(none.chunks.is_empty());
        assert_eq!(none.reason, format!("confidence {conf} is at or above θ = 0.7; no context sent"));
        assert_eq!(none.remaining_tokens, more.remaining_tokens);
    }

    // the ledger of this hop
    let mut ledger = HopLedger::new();
    ledger.record_transfer("task-1", "did:key:planner", "did:key:worker", &t);
    ledger.record_response("task-1", "did:key:planner", "did:key:worker", &more).unwrap();
    let tot = ledger.totals();
    assert_eq!(
        (tot.hops, tot.full_tokens, tot.sent_tokens, tot.context_requests),
        (1, t.full_tokens, t.sent_tokens + more_tokens, 1)
    );
    let ratio = tot.reduction_ratio.unwrap();
    assert!((ratio - t.full_tokens as f64 / (t.sent_tokens + more_tokens) as f64).abs() < 1e-9);
    eprintln!("ledger: {}", ledger.to_json());

    // closed once; afterwards SCD has no such session, and says so by RPC and URL
    assert!(scd.close(&t.session).await.unwrap());
    assert!(!scd.close(&t.session).await.unwrap());
    let err = scd.request_more(&t.session, "more?", 0.1, &[]).await.unwrap_err().to_string();
    assert!(err.starts_with(&format!("SCD RequestContext at {} failed: NotFound", server.addr)), "{err}");

    // SCD's refusals name the RPC and the URL; a zero budget never reaches SCD
    let bad = pb::ContextRequirement { required_fields: vec!["nope".into()], ..offer(100) };
    let err = scd.compress(&task(), &fields, &bad).await.unwrap_err().to_string();
    assert!(
        err.starts_with(&format!(
            "SCD OpenSession at {} failed: InvalidArgument: required_fields: unknown field",
            server.addr
        )),
        "{err}"
    );
    let err = scd.compress(&task(), &fields, &offer(0)).await.unwrap_err().to_string();
    assert!(err.starts_with("requirement.max_context_tokens: must be at least 1"), "{err}");
}

/// A transfer names the confidential field and never sends it, fits the
/// budget, and is smaller than the whole context.
fn assert_withheld_and_within_budget(t: &scd_atp::context::Transfer, fields: &[scd_atp::context::Field], budget: u32) {
    // the confidential field is named, never sent: not in any byte of the diff
    assert_eq!(t.diff.withheld_fields, vec!["api_keys".to_string()]);
    assert!(!holds(&t.diff.encode_to_vec(), SECRET), "confidential content in the diff");
    assert!(t.diff.chunks.iter().all(|c| c.field != "api_keys" && !holds(&c.data, SECRET)));
    assert!(t.diff.dropped.iter().all(|d| d.field != "api_keys" && !d.stub.contains(SECRET)));
    assert!(!t.diff.chunks.is_empty() && !t.diff.dropped.is_empty());

    // within the budget, smaller than the whole context
    assert!(t.sent_tokens > 0 && t.sent_tokens <= u64::from(budget), "sent {}", t.sent_tokens);
    // what SCD counts is the pasted text: the chunks and their header lines
    assert!(t.sent_tokens >= t.diff.chunks.iter().map(|c| u64::from(c.tokens)).sum::<u64>());
    assert_eq!((t.diff.original_size, t.diff.compressed_size), (t.full_tokens, t.sent_tokens));
    assert!(t.reduction_ratio().unwrap() > 1.0, "full {} sent {}", t.full_tokens, t.sent_tokens);
    assert_eq!(t.diff.base_hash, scd_atp::context::context_hash(fields).to_vec());
    assert!(t.session.id.len() >= 16 && !format!("{:?}", t.session).contains(t.session.token()));
}

/// Tokens a piece's header line may take (`[error_logs:4-5]`).
const HEADER_ROOM: u32 = 12;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_by_stub_index_returns_exactly_that_chunk() {
    if !ready() {
        return;
    }
    // two budgets, one over and one under 512 tokens, must send the same
    // text: without the lines around code pieces, which only the larger has
    let server = start(&["--code-context-lines", "0"]);
    let _ = client(&server).await; // SERVING
    let scd = ScdLink::connect(&server.addr).await.unwrap();
    let fields = fields();
    // a budget that does not bind: what is sent is what is relevant enough
    let open = scd.compress(&task(), &fields, &offer(4000)).await.unwrap();
    let relevant = open.sent_tokens;
    let stub = open.diff.dropped.iter().min_by_key(|d| d.tokens).unwrap().clone();
    scd.close(&open.session).await.unwrap();
    // the same transfer with room for that stub's tokens and its header line
    let room = stub.tokens + HEADER_ROOM;
    let budget = u32::try_from(relevant).unwrap() + room;
    let t = scd.compress(&task(), &fields, &offer(budget)).await.unwrap();
    assert_eq!(t.sent_tokens, relevant, "the same chunks are sent");
    assert_eq!(t.session.remaining_tokens(), room);
    let want = t.diff.dropped.iter().find(|d| d.chunk_id == stub.chunk_id).unwrap();
    let more = scd.request_more(&t.session, "show me this part", 0.2, &[want.index.into()]).await.unwrap();
    assert_eq!(more.chunks.len(), 1, "{:?}", more.chunks);
    let got = &more.chunks[0];
    assert_eq!(
        (got.index, got.chunk_id.as_str(), got.field.as_str()),
        (want.index, want.chunk_id.as_str(), want.field.as_str())
    );
    assert_eq!(got.tokens, want.tokens);
    assert!(more.remaining_tokens < HEADER_ROOM, "{}", more.remaining_tokens);
    let text = String::from_utf8(got.data.clone()).unwrap();
    let words: Vec<&str> = want.stub.split_whitespace().take(2).collect();
    assert!(text.contains(words[0]), "stub {:?} vs chunk {text:?}", want.stub);
    // an index outside the transfer is refused here, before SCD
    let n = t.diff.chunks.len() + t.diff.dropped.len();
    let err = scd.request_more(&t.session, "x", 0.2, &[(n as u32).into()]).await.unwrap_err().to_string();
    assert_eq!(err, format!("requested_chunk_indices: index {n} is not in the transfer (it has {n} chunks)"));
    scd.close(&t.session).await.unwrap();
}

#[tokio::test]
async fn an_unreachable_scd_is_an_error_naming_its_url() {
    let err = ScdLink::connect("http://127.0.0.1:1").await.unwrap_err().to_string();
    assert!(err.starts_with("cannot connect to SCD at http://127.0.0.1:1"), "{err}");
}
