//! REST on `scd serve --http-addr` against the real model: compress (by
//! budget and by rate), more, close, sessions scoped to their caller,
//! OpenAI's embeddings checked against `scd embed` by cosine, strict input
//! answered with OpenAI-shaped errors that name the field and quote no
//! value, the generated OpenAPI document, and the calls counted in metrics.

use std::net::SocketAddr;

use base64::Engine as _;
use serde_json::{json, Value};

use super::a2a::{parse_response, request_from, start};
use crate::{ready, root, scd};

/// A REST call from `from` (a 127.x.y.z address): status, headers and body.
pub(crate) async fn call(
    from: &str,
    addr: SocketAddr,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: &Value,
) -> (u16, Value) {
    let host = addr.to_string();
    let mut headers = vec![("Host", host.as_str())];
    if let Some(t) = token {
        headers.push(("x-scd-session-token", t));
    }
    let body = if body.is_null() { String::new() } else { body.to_string() };
    let raw = request_from(from, addr, &headers, method, path, &body).await;
    let (status, text) = parse_response(&raw);
    (status, if text.is_empty() { Value::Null } else { serde_json::from_str(&text).expect(&text) })
}

fn context() -> Value {
    serde_json::from_str(&std::fs::read_to_string(root().join("fixtures/agent_context.json")).unwrap()).unwrap()
}

fn cosine(a: &[f32], b: &[f32]) -> f32 {
    let dot: f32 = a.iter().zip(b).map(|(x, y)| x * y).sum();
    let n = |v: &[f32]| v.iter().map(|x| x * x).sum::<f32>().sqrt();
    dot / (n(a) * n(b))
}

fn floats(v: &Value) -> Vec<f32> {
    v.as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect()
}

/// Compress by budget and by rate, ask for more, close; a client at
/// another address cannot reach a session by its chosen id; a call without
/// or with a wrong token is refused; the calls are counted in metrics.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rest_compresses_asks_more_and_closes_within_its_callers_scope() {
    if !ready() {
        return;
    }
    let s = start(&[]);
    let addr: SocketAddr = s.http.parse().unwrap();
    let task = "Why are customer charges failing at checkout?";
    let body = json!({"task": task, "context": context(), "budget": 120, "budget_tokenizer": "cl100k",
                      "session": "mine"});
    let (status, first) = call("127.0.0.1", addr, "POST", "/v1/compress", None, &body).await;
    assert_eq!(status, 200, "{first}");
    let text = first["text"].as_str().unwrap();
    assert!(!text.is_empty() && first["totals"]["sent_tokens"].as_u64().unwrap() <= 120, "{first}");
    let counted = tiktoken_rs::cl100k_base().unwrap().encode_ordinary(text).len();
    assert!(counted <= 120, "the receiver's tokenizer counts {counted}");
    assert!(!first.to_string().contains("sk_live_SECRET"), "a confidential field never comes back");
    assert_eq!(first["withheld_fields"], json!(["api_keys"]));
    assert_eq!(first["session_id"], "mine");
    let token = first["session_token"].as_str().unwrap().to_string();
    assert!(token.len() >= 32);
    let sent: Vec<String> =
        first["chunks"].as_array().unwrap().iter().map(|c| c["id"].as_str().unwrap().into()).collect();

    // by rate: the budget is a quarter of the context's tokens
    let by_rate = json!({"task": task, "context": context(), "rate": 0.25, "budget_tokenizer": "cl100k"});
    let (status, r) = call("127.0.0.1", addr, "POST", "/v1/compress", None, &by_rate).await;
    assert_eq!(status, 200, "{r}");
    let (ctx, asked) =
        (r["totals"]["context_tokens"].as_f64().unwrap(), r["totals"]["requested_ratio"].as_f64().unwrap());
    assert!((asked - 4.0).abs() < 0.1, "context {ctx} tokens, ratio asked {asked}");
    assert!(r["totals"]["sent_tokens"].as_f64().unwrap() <= (ctx * 0.25).floor(), "{r}");

    // more: new chunks only
    let more = json!({"question": "which table stores charges and their status?", "current_confidence": 0.3});
    let (status, m) = call("127.0.0.1", addr, "POST", "/v1/sessions/mine/more", Some(&token), &more).await;
    assert_eq!(status, 200, "{m}");
    let got: Vec<&str> = m["chunks"].as_array().unwrap().iter().map(|c| c["id"].as_str().unwrap()).collect();
    assert!(!got.is_empty() && got.iter().all(|id| !sent.iter().any(|s| s == id)), "{m}");

    // another caller (127.0.0.2) naming the id, even with the token: its own scope, no such session
    let (status, e) = call("127.0.0.2", addr, "POST", "/v1/sessions/mine/more", Some(&token), &more).await;
    assert_eq!(status, 404, "{e}");
    assert_eq!(e["error"]["type"], "not_found_error");
    // no token, a wrong token
    let (status, e) = call("127.0.0.1", addr, "POST", "/v1/sessions/mine/more", None, &more).await;
    assert_eq!((status, e["error"]["param"].as_str()), (401, Some("x-scd-session-token")), "{e}");
    let wrong = "0".repeat(64);
    let (status, e) = call("127.0.0.1", addr, "POST", "/v1/sessions/mine/more", Some(&wrong), &more).await;
    assert!(matches!(status, 401 | 403), "{status} {e}");
    assert!(!e.to_string().contains(&token) && !e.to_string().contains(&wrong), "{e}");

    // close, then the session is gone
    let (status, _) = call("127.0.0.1", addr, "DELETE", "/v1/sessions/mine", Some(&token), &Value::Null).await;
    assert_eq!(status, 204);
    let (status, e) = call("127.0.0.1", addr, "POST", "/v1/sessions/mine/more", Some(&token), &more).await;
    assert_eq!(status, 404, "{e}");

    // an A2A call is counted too
    crate::a2a::get(&s.http, "/.well-known/agent-card.json");
    let metrics = crate::a2a::get(&s.http, "/metrics");
    // compressions embed: the encoder's totals move; every metric is described
    let encoded = metrics
        .lines()
        .find_map(|l| l.strip_prefix("scd_encoder_texts_total "))
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or(0.0);
    assert!(encoded >= 5.0, "the chunks and tasks embedded are counted: {encoded}");
    for line in [
        "# HELP scd_requests_total ",
        "# TYPE scd_cache_misses_total counter",
        "# TYPE scd_sessions_evicted_total counter",
        "# HELP scd_encoder_texts_total ",
        "scd_build_info{",
        "# TYPE process_resident_memory_bytes gauge",
        "# TYPE process_cpu_seconds_total counter",
        "process_open_fds ",
    ] {
        assert!(metrics.contains(line), "{line} not in\n{metrics}");
    }
    for line in [
        r#"scd_requests_total{method="REST POST /v1/compress",code="Ok"} 2"#,
        r#"scd_requests_total{method="REST POST /v1/sessions/{session_id}/more",code="NotFound"} 2"#,
        r#"scd_requests_total{method="REST DELETE /v1/sessions/{session_id}",code="Ok"} 1"#,
        r#"scd_requests_total{method="A2A GET /.well-known/agent-card.json",code="Ok"} 1"#,
    ] {
        assert!(metrics.contains(line), "{line} not in\n{metrics}");
    }
}

/// Every bad body is a 400 in OpenAI's shape whose `param` names the field,
/// quoting no value (a secret put where a kind belongs stays out of it);
/// a body over --max-request-bytes is 413.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rest_refuses_bad_bodies_naming_the_field() {
    if !ready() {
        return;
    }
    let s = start(&["--max-request-bytes", "65536"]);
    let addr: SocketAddr = s.http.parse().unwrap();
    let ctx = context();
    let secret = "sk_live_SECRET_4242";
    let mut bad_kind = ctx.clone();
    bad_kind["fields"][0]["kind"] = json!(secret);
    let cases: Vec<(&str, Value, &str)> = vec![
        ("/v1/compress", json!({"task": "t", "context": ctx, "budget": 0}), "budget"),
        ("/v1/compress", json!({"task": "t", "context": ctx, "budget": 10, "budgte": 1}), "budgte"),
        ("/v1/compress", json!({"task": "t", "context": ctx, "budget": 10, "rate": 0.5}), "rate"),
        ("/v1/compress", json!({"task": "t", "context": ctx, "rate": 1.5}), "rate"),
        ("/v1/compress", json!({"task": "t", "context": ctx}), "budget"),
        ("/v1/compress", json!({"task": "t", "context": secret, "budget": 10}), "context"),
        ("/v1/compress", json!({"task": "t", "context": bad_kind, "budget": 10}), "context.fields[0].kind"),
        (
            "/v1/compress",
            json!({"task": "t", "context": ctx, "budget": 10, "budget_tokenizer": "nope"}),
            "budget_tokenizer",
        ),
        ("/v1/compress", json!([1, 2]), "body"),
        ("/v1/sessions/x/more", json!({"question": "q", "current_confidence": 2.0}), "current_confidence"),
        ("/v1/sessions/x/more", json!({"question": "q", "current_confidence": 0.5, "session": "y"}), "session"),
        ("/v1/embeddings", json!({"model": "x", "input": [[1, 2, 4_000_000]]}), "input"),
        ("/v1/embeddings", json!({"model": "x", "input": [1, -2]}), "input"),
        ("/v1/embeddings", json!({"model": "x", "input": ["a", [1, 2]]}), "input"),
        ("/v1/embeddings", json!({"model": "x", "input": []}), "input"),
        ("/v1/embeddings", json!({"model": "x", "input": "a", "encoding_format": "hex"}), "encoding_format"),
    ];
    for (path, body, param) in cases {
        let token = path.ends_with("/more").then_some("t");
        let (status, e) = call("127.0.0.1", addr, "POST", path, token, &body).await;
        assert_eq!(status, 400, "{path} {body}: {e}");
        assert_eq!(e["error"]["type"], "invalid_request_error", "{e}");
        let message = e["error"]["message"].as_str().unwrap();
        assert!(message.starts_with(param), "{path} {body}: {message}");
        if param != "body" {
            assert_eq!(e["error"]["param"].as_str(), Some(param), "{e}");
        }
        assert!(!e.to_string().contains(secret) && message.len() <= 1024, "{e}");
    }
    // a form or text/plain (what a web page may send unasked) is refused unread
    let form = [("Host", "x"), ("Content-Type", "text/plain")];
    let body = json!({"task": "t", "context": ctx, "budget": 10}).to_string();
    let raw = request_from("127.0.0.1", addr, &form, "POST", "/v1/compress", &body).await;
    let (status, text) = parse_response(&raw);
    assert!(status == 415 && text.contains("Content-Type: must be application/json"), "{status} {text}");
    // not JSON at all, and over the byte limit
    let raw = request_from("127.0.0.1", addr, &[("Host", "x")], "POST", "/v1/compress", "{not json").await;
    let (status, text) = parse_response(&raw);
    assert!(status == 400 && text.contains("body: not JSON"), "{text}");
    let big = json!({"task": "t", "context": {"fields": [{"name": "a", "content": "x".repeat(70_000)}]}, "budget": 9});
    let (status, e) = call("127.0.0.1", addr, "POST", "/v1/compress", None, &big).await;
    assert_eq!(status, 413, "{e}");
    // the model must be the loaded one, and the dimensions its own
    let (_, models) = call("127.0.0.1", addr, "GET", "/v1/models", None, &Value::Null).await;
    let model = models["data"][0]["id"].as_str().unwrap().to_string();
    let (status, e) =
        call("127.0.0.1", addr, "POST", "/v1/embeddings", None, &json!({"model": "gpt", "input": "a"})).await;
    assert_eq!((status, e["error"]["param"].as_str()), (404, Some("model")), "{e}");
    let wrong_dim = json!({"model": model, "input": "a", "dimensions": 7});
    let (status, e) = call("127.0.0.1", addr, "POST", "/v1/embeddings", None, &wrong_dim).await;
    assert_eq!((status, e["error"]["param"].as_str()), (400, Some("dimensions")), "{e}");
}

/// `/v1/embeddings` gives `scd embed`'s vectors (cosine > 0.999), as
/// floats or base64, with passage and query prefixes, and counts usage.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rest_embeddings_match_scd_embed_by_cosine() {
    if !ready() {
        return;
    }
    let s = start(&[]);
    let addr: SocketAddr = s.http.parse().unwrap();
    let texts = ["The payment gateway times out after 30 seconds.", "Which table stores charges?"];
    let (_, models) = call("127.0.0.1", addr, "GET", "/v1/models", None, &Value::Null).await;
    let model = models["data"][0]["id"].as_str().unwrap().to_string();
    let (ok, out, err) = scd(&["embed"], &texts.join("\n"));
    assert!(ok, "{err}");
    let reference: Vec<Vec<f32>> =
        out.lines().map(|l| floats(&serde_json::from_str::<Value>(l).unwrap()["embedding"])).collect();
    let (status, r) =
        call("127.0.0.1", addr, "POST", "/v1/embeddings", None, &json!({"model": model, "input": texts})).await;
    assert_eq!(status, 200, "{r}");
    assert_eq!((r["object"].as_str(), r["model"].as_str()), (Some("list"), Some(model.as_str())));
    let usage = r["usage"]["prompt_tokens"].as_u64().unwrap();
    assert!(usage > 10 && r["usage"]["total_tokens"].as_u64() == Some(usage), "{r}");
    let as_b64 = json!({"model": model, "input": texts, "encoding_format": "base64"});
    let (_, b) = call("127.0.0.1", addr, "POST", "/v1/embeddings", None, &as_b64).await;
    for (i, want) in reference.iter().enumerate() {
        let got = floats(&r["data"][i]["embedding"]);
        assert_eq!(r["data"][i]["index"], i);
        assert!(cosine(&got, want) > 0.999, "text {i}: {}", cosine(&got, want));
        let bytes =
            base64::engine::general_purpose::STANDARD.decode(b["data"][i]["embedding"].as_str().unwrap()).unwrap();
        let decoded: Vec<f32> = bytes.chunks(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
        assert_eq!(decoded, got, "base64 carries the same floats");
    }
    // cl100k token ids, as OpenAI's clients send them by default (LangChain's
    // OpenAIEmbeddings): the same vectors as the texts
    let cl100k = tiktoken_rs::cl100k_base_singleton();
    let ids: Vec<Vec<u32>> = texts.iter().map(|t| cl100k.encode_ordinary(t)).collect();
    for input in [json!(ids), json!(ids[0])] {
        let (status, t) =
            call("127.0.0.1", addr, "POST", "/v1/embeddings", None, &json!({"model": model, "input": input})).await;
        assert_eq!(status, 200, "{t}");
        for (i, row) in t["data"].as_array().unwrap().iter().enumerate() {
            assert!(cosine(&floats(&row["embedding"]), &reference[i]) > 0.9999, "token ids of text {i}");
        }
    }
    // the model's name without its digest names it too
    let name = model.split('@').next().unwrap();
    let (status, r2) =
        call("127.0.0.1", addr, "POST", "/v1/embeddings", None, &json!({"model": name, "input": texts})).await;
    assert_eq!((status, &r2["data"]), (200, &r["data"]));
    // one string is one input; a query is embedded with the query prefix
    let (ok, out, _) = scd(&["embed", "--query"], texts[1]);
    assert!(ok);
    let query_ref = floats(&serde_json::from_str::<Value>(out.lines().next().unwrap()).unwrap()["embedding"]);
    let q = json!({"model": model, "input": texts[1], "input_type": "query"});
    let (_, r) = call("127.0.0.1", addr, "POST", "/v1/embeddings", None, &q).await;
    let got = floats(&r["data"][0]["embedding"]);
    assert_eq!(r["data"].as_array().unwrap().len(), 1);
    assert!(cosine(&got, &query_ref) > 0.999 && cosine(&got, &reference[1]) < 0.999);
}

/// `GET /openapi.json` is an OpenAPI 3.1 document generated from the
/// handlers: every route, the request schemas with their fields (`rate`
/// beside `budget`, the token header), the replies and the error shape.
#[test]
fn rest_serves_a_generated_openapi_document() {
    if !ready() {
        return;
    }
    let s = start(&[]);
    let doc: Value = serde_json::from_str(&crate::a2a::get(&s.http, "/openapi.json")).unwrap();
    assert!(doc["openapi"].as_str().unwrap().starts_with("3.1"), "{doc}");
    let paths = doc["paths"].as_object().unwrap();
    for (path, verb) in [
        ("/v1/compress", "post"),
        ("/v1/sessions/{session_id}/more", "post"),
        ("/v1/sessions/{session_id}", "delete"),
        ("/v1/embeddings", "post"),
        ("/v1/models", "get"),
    ] {
        assert!(paths[path][verb].is_object(), "{path} {verb}");
        if verb == "post" {
            assert!(paths[path][verb]["responses"]["429"].is_object(), "{path}: the retry answer is documented");
        }
    }
    let text = doc.to_string();
    for needle in
        ["\"rate\"", "\"budget_tokenizer\"", "x-scd-session-token", "\"session_token\"", "\"encoding_format\""]
    {
        assert!(text.contains(needle), "{needle} missing");
    }
}

/// docs/openapi.json is what `scd openapi` prints today (docs/rest.md says
/// a test fails when the copy is out of date: this one).
#[test]
fn the_openapi_copy_in_docs_is_up_to_date() {
    let (ok, out, err) = scd(&["openapi"], "");
    assert!(ok, "{err}");
    let printed: Value = serde_json::from_str(&out).unwrap();
    let copy: Value =
        serde_json::from_str(&std::fs::read_to_string(root().join("docs/openapi.json")).unwrap()).unwrap();
    assert!(printed == copy, "docs/openapi.json is out of date: run `scd openapi > docs/openapi.json`");
}

/// `GET /health` answers whatever the state; `GET /ready` is 503 until the
/// model is warm, then 200; both answer without a signature under
/// `--auth did-wba`, which every other route still asks for.
#[test]
fn health_and_ready_over_http_need_no_signature() {
    if !ready() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (dids, key) = (dir.path().join("dids"), dir.path().join("alice.json"));
    let (d, k) = (dids.to_str().unwrap(), key.to_str().unwrap());
    let (ok, _, stderr) =
        scd(&["identity", "new", "--out", k, "--did", "did:wba:example.com:user:alice", "--did-dir", d], "");
    assert!(ok, "{stderr}");
    let s = start(&["--auth", "did-wba", "--did-dir", dids.to_str().unwrap()]);
    let http = |path: &str| super::a2a::status_and_body(&s.http, path);
    assert_eq!(http("/health"), (200, "ok\n".to_string()));
    let mut states = Vec::new();
    for _ in 0..600 {
        let (status, body) = http("/ready");
        states.push((status, body.trim().to_string()));
        if status == 200 {
            break;
        }
        assert!(status == 503 && body.starts_with("starting"), "{status} {body}");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert_eq!(states.last().unwrap(), &(200, "serving".to_string()), "{states:?}");
    assert_eq!(http("/metrics").0, 401, "other routes still need a signature");
}

/// `api_keys` marked confidential, then public, in one object.
const DUPLICATE_BODY: &str = r#"{"task": "Which key does checkout use?", "budget": 200, "context": {"fields": [
    {"name": "notes", "content": "Checkout calls the payment API."},
    {"name": "api_keys", "content": "sk_live_SECRET_4242", "confidential": true, "confidential": false}]}}"#;

/// A key twice in one object is refused (in-process server, hash encoder),
/// so `"confidential": true, "confidential": false` never reads as public;
/// the body with the key once compresses with the field withheld.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rest_refuses_a_repeated_key_so_a_confidential_field_is_never_public() {
    let s = crate::inproc::start(Default::default());
    crate::inproc::wait_serving(&s).await;
    let host = s.http.to_string();
    let post = |body: String| {
        let host = host.clone();
        async move {
            let raw = request_from("127.0.0.1", s.http, &[("Host", &host)], "POST", "/v1/compress", &body).await;
            parse_response(&raw)
        }
    };
    let (status, text) = post(DUPLICATE_BODY.to_string()).await;
    assert_eq!(status, 400, "{text}");
    let e: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(
        e["error"]["message"],
        "body.context.fields[1].confidential: duplicate key; each key may appear once in an object",
        "{text}"
    );
    assert!(!text.contains("SECRET"), "{text}");
    // anywhere in the body, not only in a field
    let (status, text) = post(DUPLICATE_BODY.replace(r#""budget": 200"#, r#""budget": 200, "budget": 1"#)).await;
    assert_eq!(status, 400, "{text}");
    assert!(text.contains("body.budget: duplicate key"), "{text}");
    let (status, text) = post(DUPLICATE_BODY.replace(r#", "confidential": false"#, "")).await;
    assert_eq!(status, 200, "{text}");
    let out: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(out["withheld_fields"], json!(["api_keys"]), "{text}");
    assert!(!text.contains("SECRET"), "{text}");
}

/// Issue 43, error text over REST: an unknown key, a field name and a
/// path id are quoted only when short and plain (at most 64 bytes without
/// control characters; a key: a plain word of at most 40), else named by
/// their size.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rest_errors_quote_no_long_value_of_the_request() {
    let s = crate::inproc::start(Default::default());
    crate::inproc::wait_serving(&s).await;
    let long = "k".repeat(5000);
    let field = |name: &str| json!({"name": name, "kind": "prose", "content": "Checkout failed."});
    let ctx = json!({"fields": [field("notes")]});
    let mut unknown = json!({"task": "t", "context": ctx, "budget": 10});
    unknown[long.as_str()] = json!(1);
    let (status, v) = call("127.0.0.1", s.http, "POST", "/v1/compress", None, &unknown).await;
    assert_eq!(status, 400, "{v}");
    let m = v["error"]["message"].as_str().unwrap();
    assert!(m.contains("unknown field `<5000-byte key>`") && !m.contains("kkkkk"), "{m}");
    let mut odd = json!({"task": "t", "context": ctx, "budget": 10});
    odd["a\u{1b}[2Jb"] = json!(1);
    let (_, v) = call("127.0.0.1", s.http, "POST", "/v1/compress", None, &odd).await;
    let m = v["error"]["message"].as_str().unwrap();
    assert!(m.contains("unknown field `<6-byte key>`") && !m.contains('\u{1b}'), "{m}");
    let name = "n".repeat(100);
    let twice = json!({"task": "t", "context": {"fields": [field(&name), field(&name)]}, "budget": 10});
    let (status, v) = call("127.0.0.1", s.http, "POST", "/v1/compress", None, &twice).await;
    let m = v["error"]["message"].as_str().unwrap();
    assert_eq!(status, 400, "{v}");
    assert!(m.contains("duplicate field name <a 100-byte name>") && !m.contains("nnnnn"), "{m}");
    let path = format!("/v1/sessions/{}/more", "x".repeat(2000));
    let ask = json!({"question": "q", "current_confidence": 0.5});
    let (status, v) = call("127.0.0.1", s.http, "POST", &path, Some("t"), &ask).await;
    let m = v["error"]["message"].as_str().unwrap_or_default();
    assert!(status == 404 && m.contains("<a 2000-byte name>") && !m.contains("xxxxx"), "{status} {v}");
}
