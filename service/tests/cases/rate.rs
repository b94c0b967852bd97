//! `rate` (LLMLingua's meaning: the kept share of the context) on every
//! surface: gRPC (`CompressRequest.rate`, also from `scd client compress
//! --rate`), REST and A2A (in-process servers over the hash encoder), and
//! `scd compress --rate` (the real model). A valid rate makes the budget
//! that share of the context's tokens in the budget tokenizer; 0, a
//! negative, over 1 or NaN is refused naming the surface's own field.
//! MCP's `compress_context` rate is checked by the Python client (mcp.rs).

use serde_json::{json, Value};
use tonic::Code;

use crate::grpc::{compress_req, fixture_fields};
use crate::{ready, root, scd};

const TASK: &str = "Why are customer charges failing at checkout?";
/// Every surface says this after its own field's name.
const RANGE: &str = "must be a number in (0, 1], the share of the context's tokens to keep";

/// The fixture's shareable tokens in cl100k, counted independently.
fn shareable_cl100k() -> usize {
    let bpe = tiktoken_rs::cl100k_base_singleton();
    fixture_fields().iter().filter(|f| !f.confidential).map(|f| bpe.encode_ordinary(&f.content).len()).sum()
}

/// `totals` of an answer asked for `rate` of a context of `context` tokens:
/// its context counted, the ratio asked 1 / rate (the budget is the share
/// rounded down), and what was sent within that budget.
fn check_share(totals: &Value, context: usize, rate: f64) -> u64 {
    let budget = ((context as f64 * rate).floor() as u64).max(1);
    assert_eq!(totals["context_tokens"].as_u64(), Some(context as u64), "{totals}");
    let asked = totals["requested_ratio"].as_f64().unwrap();
    assert!((asked - context as f64 / budget as f64).abs() < 1e-3 * asked, "rate {rate}: {totals}");
    let sent = totals["sent_tokens"].as_u64().unwrap();
    assert!(sent > 0 && sent <= budget, "rate {rate}, budget {budget}: {totals}");
    sent
}

fn grpc_totals(t: &scd_service::grpc::pb::Totals) -> Value {
    json!({"context_tokens": t.context_tokens, "requested_ratio": t.requested_ratio, "sent_tokens": t.sent_tokens})
}

/// gRPC: Compress and OpenSession take `rate` instead of a token budget
/// (no `requirement` needed); bad rates and a rate beside a budget are
/// INVALID_ARGUMENT naming `rate`; `scd client compress --rate` reaches it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_rate_keeps_that_share_of_the_context_and_names_the_field() {
    let s = crate::inproc::start(Default::default());
    crate::inproc::wait_serving(&s).await;
    let mut c = scd_service::grpc::pb::scd_client::ScdClient::connect(s.grpc.clone()).await.unwrap();
    let context = shareable_cl100k();
    let by_rate = |rate: f64| scd_service::grpc::pb::CompressRequest {
        requirement: None,
        rate: Some(rate),
        budget_tokenizer: "cl100k".into(),
        ..compress_req(0, "")
    };
    let mut sent = Vec::new();
    for rate in [0.25, 0.5, 1.0] {
        let out = c.compress(by_rate(rate)).await.unwrap().into_inner();
        sent.push(check_share(&grpc_totals(&out.totals.unwrap()), context, rate));
    }
    // a larger share sends at least as much; the whole context's budget most of it
    assert!(sent.windows(2).all(|w| w[0] <= w[1]) && sent[2] as usize >= context / 2, "{sent:?} of {context}");
    let open = scd_service::grpc::pb::OpenSessionRequest { compress: Some(by_rate(0.5)) };
    let opened = c.open_session(open).await.unwrap().into_inner();
    assert!(!opened.session_id.is_empty() && !opened.session_token.is_empty());
    check_share(&grpc_totals(&opened.result.unwrap().totals.unwrap()), context, 0.5);

    for bad in [0.0, -0.25, 1.5, f64::NAN, f64::INFINITY] {
        let e = c.compress(by_rate(bad)).await.unwrap_err();
        assert_eq!((e.code(), e.message()), (Code::InvalidArgument, format!("rate: {RANGE}").as_str()), "{bad}");
    }
    let both = scd_service::grpc::pb::CompressRequest { rate: Some(0.5), ..compress_req(100, "") };
    let e = c.compress(both).await.unwrap_err();
    assert_eq!(e.message(), "rate: give requirement.max_context_tokens or rate, not both");
    // neither: as before, a budget is required
    let e = c.compress(compress_req(0, "")).await.unwrap_err();
    assert!(e.message().starts_with("max_context_tokens: must be at least 1"), "{}", e.message());

    // the CLI's gRPC client
    let addr = s.grpc.clone();
    tokio::task::spawn_blocking(move || {
        let client = |rate: &str| {
            let args =
                ["client", "--addr", &addr, "compress", "--task", TASK, "--context", "fixtures/agent_context.json"];
            scd(&[&args[..], &["--rate", rate, "--budget-tokenizer", "cl100k"]].concat(), "")
        };
        let (ok, stdout, stderr) = client("0.25");
        assert!(ok, "{stderr}");
        let v: Value = serde_json::from_str(stdout.trim()).unwrap();
        check_share(&v["totals"], context, 0.25);
        let (ok, _, stderr) = client("1.5");
        assert!(!ok && stderr.contains(&format!("rate: {RANGE}")), "{stderr}");
    })
    .await
    .unwrap();
}

/// REST's `rate` and A2A's data part `rate` make the same budget; bad ones
/// are refused naming the field (`param` in REST, the key's path in A2A).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rest_and_a2a_rates_keep_that_share_and_name_the_field() {
    let s = crate::inproc::start(Default::default());
    crate::inproc::wait_serving(&s).await;
    let context = shareable_cl100k();
    let ctx: Value =
        serde_json::from_str(&std::fs::read_to_string(root().join("fixtures/agent_context.json")).unwrap()).unwrap();
    let body = move |extra: Value| {
        let mut b = json!({"task": TASK, "context": ctx, "budget_tokenizer": "cl100k"});
        b.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        b
    };
    // REST
    for rate in [0.25, 1.0] {
        let (status, r) =
            crate::rest::call("127.0.0.1", s.http, "POST", "/v1/compress", None, &body(json!({"rate": rate}))).await;
        assert_eq!(status, 200, "{r}");
        check_share(&r["totals"], context, rate);
    }
    let refused = [
        (json!({"rate": 0}), "rate", format!("rate: {RANGE}")),
        (json!({"rate": 1.5}), "rate", format!("rate: {RANGE}")),
        (json!({"rate": 0.5, "budget": 10}), "rate", "rate: give budget or rate, not both".to_string()),
        (json!({}), "budget", "budget: required (tokens), or give rate".to_string()),
    ];
    for (extra, param, message) in &refused {
        let (status, e) =
            crate::rest::call("127.0.0.1", s.http, "POST", "/v1/compress", None, &body(extra.clone())).await;
        assert_eq!(
            (status, &e["error"]["param"], &e["error"]["message"]),
            (400, &json!(param), &json!(message)),
            "{e}"
        );
    }
    // A2A: the data part's rate
    let addr = s.http.to_string();
    tokio::task::spawn_blocking(move || {
        let send = |extra: Value| {
            let m = json!({"message": {"messageId": "m-rate", "role": "ROLE_USER", "parts": [{"data": body(extra)}]}});
            crate::a2a::rpc(&addr, "SendMessage", m)
        };
        let r = send(json!({"rate": 0.25}));
        let task = &r["result"]["task"];
        assert_eq!(task["status"]["state"], "TASK_STATE_COMPLETED", "{r}");
        check_share(&task["artifacts"][0]["parts"][0]["data"]["totals"], context, 0.25);
        for (extra, _, message) in refused {
            let r = send(extra);
            let e = r["error"]["message"].as_str().unwrap_or_else(|| panic!("{r}"));
            assert_eq!(e, format!("invalid params: message.parts[0].data.{message}"), "{r}");
        }
    })
    .await
    .unwrap();
}

/// `scd compress --rate` (the real model): the budget is that share of the
/// context in --budget-tokenizer, also as --batch's default and on a line;
/// bad rates fail before any model loads, naming --rate (or the line's key).
#[test]
fn cli_compress_rate_keeps_that_share_and_names_the_flag() {
    let base = ["compress", "--task", TASK, "--context", "fixtures/agent_context.json", "--budget-tokenizer", "cl100k"];
    for bad in ["0", "-0.5", "1.5", "NaN", "inf"] {
        let (ok, _, stderr) = scd(&[&base[..], &["--rate", bad]].concat(), "");
        assert!(!ok && stderr.contains(&format!("--rate: {RANGE}")), "{bad}: {stderr}");
    }
    let (ok, _, stderr) = scd(&[&base[..], &["--rate", "0.5", "--budget", "10"]].concat(), "");
    assert!(!ok && stderr.contains("--rate") && stderr.contains("--budget"), "{stderr}");
    if !ready() {
        return;
    }
    let context = shareable_cl100k();
    let (ok, stdout, stderr) = scd(&[&base[..], &["--rate", "0.25"]].concat(), "");
    assert!(ok, "{stderr}");
    check_share(&serde_json::from_str::<Value>(stdout.trim()).unwrap()["totals"], context, 0.25);

    // --batch: a line's rate, a line's budget over --rate, --rate for a line with neither, a bad line
    let ctx = std::fs::read_to_string(root().join("fixtures/agent_context.json")).unwrap();
    let ctx: Value = serde_json::from_str(&ctx).unwrap();
    let lines: Vec<String> = [json!({"rate": 0.25}), json!({"budget": 30}), json!({}), json!({"rate": 2})]
        .into_iter()
        .map(|extra| {
            let mut l = json!({"task": TASK, "context": ctx, "budget_tokenizer": "cl100k"});
            l.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
            l.to_string()
        })
        .collect();
    let dir = crate::scratch("rate-batch");
    let batch = dir.join("lines.jsonl");
    std::fs::write(&batch, lines.join("\n")).unwrap();
    let (ok, stdout, _) = scd(&["compress", "--batch", batch.to_str().unwrap(), "--rate", "0.5"], "");
    assert!(!ok, "one line fails: the exit status says so");
    let out: Vec<Value> = stdout.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(out.len(), 4, "{stdout}");
    check_share(&out[0]["totals"], context, 0.25);
    assert!(out[1]["totals"]["sent_tokens"].as_u64().unwrap() <= 30, "{}", out[1]);
    check_share(&out[2]["totals"], context, 0.5);
    assert_eq!(out[3], json!({"line": 4, "error": format!("rate: {RANGE}")}));
    let _ = std::fs::remove_dir_all(&dir);
}
