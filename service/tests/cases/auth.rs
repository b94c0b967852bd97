//! `scd serve --auth did-wba`: DID-authenticated callers on gRPC and HTTP.
//!
//! Most run a server in-process (`serve_on`) over the engine's hash encoder;
//! the `scd client --identity` test runs the real binary with the model, and
//! one test signs from Python (PyNaCl + grpcio from `.tools/venv`).

use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use scd_atp::identity::{now_s, Identity};
use scd_audit::{AuditLevel, AuditLog, Retention};
use scd_did::time::format_rfc3339_utc;
use scd_did::wba::{sign_header, sign_header_with, WbaAuthenticator};
use scd_service::auth::AuthConfig;
use scd_service::grpc::pb;
use scd_service::grpc::pb::scd_client::ScdClient;
use scd_service::http::HttpLimits;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tonic::transport::Channel;
use tonic::{Code, Status};

use crate::grpc::compress_req;
use crate::inproc::{InProc, Options};

const ALICE: &str = "did:wba:example.com:user:alice";
const BOB: &str = "did:wba:example.com:user:bob";

/// The operator's audit token of the servers here (`--audit-token-file`).
const AUDIT_TOKEN: &str = "op-token-auth-5e1d0c9a7b";

/// An in-process server with `--auth did-wba` over `dir`.
async fn start(dir: &Path, rate_per_s: f64, burst: u32) -> InProc {
    start_with(dir, rate_per_s, burst, None).await
}

async fn start_with(dir: &Path, rate_per_s: f64, burst: u32, audit: Option<Arc<AuditLog>>) -> InProc {
    let s = crate::inproc::start(Options {
        http: HttpLimits { max_connections: 64, header_timeout: Duration::from_secs(5), ..HttpLimits::default() },
        auth: Some(AuthConfig { authenticator: WbaAuthenticator::new(dir, "scd"), rate_per_s, burst }),
        audit,
        audit_access: scd_service::grpc::audit::AuditAccess::with_operator_token(AUDIT_TOKEN),
        ..Default::default()
    });
    // health stays open without a header
    crate::inproc::wait_serving(&s).await;
    s
}

fn identities(dir: &Path) -> (Identity, Identity) {
    let alice = Identity::generate().with_did(ALICE).unwrap();
    let bob = Identity::generate().with_did(BOB).unwrap();
    alice.write_wba_document(dir).unwrap();
    bob.write_wba_document(dir).unwrap();
    (alice, bob)
}

async fn client(s: &InProc) -> ScdClient<Channel> {
    ScdClient::new(Channel::from_shared(s.grpc.clone()).unwrap().connect().await.unwrap())
}

/// `msg` with `Authorization: header` (none when `None`).
fn with<T>(msg: T, header: Option<&str>) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    if let Some(h) = header {
        r.metadata_mut().insert("authorization", h.parse().unwrap());
    }
    r
}

async fn info(c: &mut ScdClient<Channel>, header: Option<&str>) -> Result<pb::InfoResponse, Status> {
    c.info(with(pb::InfoRequest {}, header)).await.map(|r| r.into_inner())
}

fn refused(r: Result<pb::InfoResponse, Status>, code: Code, starts: &str) -> String {
    let s = r.expect_err("the call was accepted");
    assert_eq!(s.code(), code, "{s:?}");
    assert!(s.message().starts_with(starts), "{:?} does not start with {starts:?}", s.message());
    s.message().to_string()
}

/// A raw HTTP/1.1 GET: (status, head, body).
async fn http_get(addr: SocketAddr, path: &str, host: &str, auth: Option<&str>) -> (u16, String, String) {
    let mut sock = tokio::net::TcpStream::connect(addr).await.unwrap();
    let auth = auth.map(|a| format!("Authorization: {a}\r\n")).unwrap_or_default();
    let req = format!("GET {path} HTTP/1.1\r\nHost: {host}\r\n{auth}Connection: close\r\n\r\n");
    sock.write_all(req.as_bytes()).await.unwrap();
    let mut out = String::new();
    sock.read_to_string(&mut out).await.unwrap();
    let (head, body) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
    let status = head.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    (status, head.to_string(), body.to_string())
}

/// A JSON-RPC call to the A2A endpoint on the HTTP listener.
async fn a2a_rpc(addr: SocketAddr, auth: Option<&str>, method: &str, params: serde_json::Value) -> (u16, String) {
    let body = serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}).to_string();
    let mut sock = tokio::net::TcpStream::connect(addr).await.unwrap();
    let auth = auth.map(|a| format!("Authorization: {a}\r\n")).unwrap_or_default();
    let req = format!(
        "POST / HTTP/1.1\r\nHost: localhost\r\n{auth}Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    sock.write_all(req.as_bytes()).await.unwrap();
    let mut out = String::new();
    sock.read_to_string(&mut out).await.unwrap();
    let (head, body) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
    (head.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0), body.to_string())
}

fn at(who: &Identity, nonce: &str, offset_s: i64) -> String {
    sign_header_with(who, "scd", nonce, &format_rfc3339_utc(now_s() + offset_s))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_accepts_signed_calls_and_names_every_refusal() {
    let dir = tempfile::tempdir().unwrap();
    let (alice, _bob) = identities(dir.path());
    let s = start(dir.path(), 1000.0, 1000).await;
    let mut c = client(&s).await;

    // accepted: Compress opening a session, then RequestContext on it
    let opened = c
        .compress(with(compress_req(60, "alice-session"), Some(&sign_header(&alice, "scd", now_s()))))
        .await
        .unwrap()
        .into_inner();
    assert!(!opened.chunks.is_empty() && !opened.session_token.is_empty());
    let more = pb::ContextRequest {
        session_id: "alice-session".into(),
        session_token: opened.session_token.clone(),
        specific_question: "which table stores charges".into(),
        current_confidence: 0.3,
        ..Default::default()
    };
    c.request_context(with(more, Some(&sign_header(&alice, "scd", now_s())))).await.unwrap();

    // every refusal: UNAUTHENTICATED naming the reason
    refused(info(&mut c, None).await, Code::Unauthenticated, "missing Authorization header");
    let m = refused(
        info(&mut c, Some("DIDWba did=\"did:wba:example.com\"")).await,
        Code::Unauthenticated,
        "malformed Authorization header: ",
    );
    assert_eq!(m, "malformed Authorization header: nonce: missing");
    refused(info(&mut c, Some("Bearer abc")).await, Code::Unauthenticated, "malformed Authorization header: scheme");
    let carol = Identity::generate().with_did("did:wba:example.com:user:carol").unwrap();
    let m = refused(
        info(&mut c, Some(&sign_header(&carol, "scd", now_s()))).await,
        Code::Unauthenticated,
        "unknown DID did:wba:example.com:user:carol",
    );
    assert!(m.ends_with("no DID document for it in the server's DID directory (the allowlist)"), "{m}");
    let stranger = Identity::generate();
    refused(
        info(&mut c, Some(&sign_header(&stranger, "scd", now_s()))).await,
        Code::Unauthenticated,
        &format!("unknown DID {}: only did:wba DIDs", stranger.did()),
    );
    let mallory = Identity::generate().with_did(ALICE).unwrap();
    refused(
        info(&mut c, Some(&sign_header(&mallory, "scd", now_s()))).await,
        Code::Unauthenticated,
        &format!("bad signature: it does not verify against {ALICE}'s key over aud \"scd\""),
    );
    refused(
        info(&mut c, Some(&sign_header(&alice, "another-service", now_s()))).await,
        Code::Unauthenticated,
        "bad signature",
    );
    refused(
        info(&mut c, Some(&at(&alice, "future-nonce-000001", 61))).await,
        Code::Unauthenticated,
        "timestamp outside ±60 s: 61 s ahead of the server's clock",
    );
    // (a second may tick between signing and checking: 61 or 62 s behind)
    refused(
        info(&mut c, Some(&at(&alice, "past-nonce-00000001", -61))).await,
        Code::Unauthenticated,
        "timestamp outside ±60 s: 6",
    );
    let once = sign_header(&alice, "scd", now_s());
    info(&mut c, Some(&once)).await.unwrap();
    refused(info(&mut c, Some(&once)).await, Code::Unauthenticated, "replayed nonce \"");

    // health and reflection stay open
    let ch = Channel::from_shared(s.grpc.clone()).unwrap().connect().await.unwrap();
    tonic_health::pb::health_client::HealthClient::new(ch)
        .check(tonic_health::pb::HealthCheckRequest { service: String::new() })
        .await
        .unwrap();

    // refusals are counted once per call and by kind
    let (status, _, metrics) =
        http_get(s.http, "/metrics", "localhost", Some(&sign_header(&alice, "scd", now_s()))).await;
    assert_eq!(status, 200);
    let line = |prefix: &str| {
        metrics
            .lines()
            .find(|l| l.starts_with(prefix))
            .unwrap_or_else(|| panic!("no {prefix} in\n{metrics}"))
            .to_string()
    };
    assert!(line("scd_rejected_total{kind=\"auth_unauthenticated\"}").ends_with(" 10"), "{metrics}");
    assert!(line("scd_requests_total{method=\"Info\",code=\"Unauthenticated\"}").ends_with(" 10"), "{metrics}");
    assert!(line("scd_requests_total{method=\"Info\",code=\"Ok\"}").ends_with(" 1"), "{metrics}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_is_bound_to_the_did_that_opened_it() {
    let dir = tempfile::tempdir().unwrap();
    let (alice, bob) = identities(dir.path());
    let s = start(dir.path(), 1000.0, 1000).await;
    let mut c = client(&s).await;
    let sign = |who: &Identity| Some(sign_header(who, "scd", now_s()));
    let opened = c.compress(with(compress_req(60, "shared-id"), sign(&alice).as_deref())).await.unwrap().into_inner();
    let ask = pb::ContextRequest {
        session_id: "shared-id".into(),
        session_token: opened.session_token.clone(),
        specific_question: "which table stores charges".into(),
        current_confidence: 0.3,
        ..Default::default()
    };
    // bob holds alice's id and token, and is still refused: a chosen id is
    // alice's own, so under bob's DID it names nothing (not even that it exists)
    let unknown = "unknown or expired session \"shared-id\"";
    let e = c.request_context(with(ask.clone(), sign(&bob).as_deref())).await.unwrap_err();
    assert_eq!((e.code(), e.message()), (Code::NotFound, unknown));
    let close = pb::CloseSessionRequest { session_id: "shared-id".into(), session_token: opened.session_token.clone() };
    let closed = c.close_session(with(close.clone(), sign(&bob).as_deref())).await.unwrap().into_inner();
    assert!(!closed.closed, "bob closed alice's session");
    // bob compressing into the id opens his own session, alice's stays hers
    let bobs = c.compress(with(compress_req(60, "shared-id"), sign(&bob).as_deref())).await.unwrap().into_inner();
    assert_ne!(bobs.session_token, opened.session_token);
    assert!(c.request_context(with(ask.clone(), sign(&alice).as_deref())).await.is_ok(), "alice lost her session");
    // alice still can
    c.request_context(with(ask, sign(&alice).as_deref())).await.unwrap();
    let closed = c.close_session(with(close, sign(&alice).as_deref())).await.unwrap().into_inner();
    assert!(closed.closed);
}

async fn audit_of(
    c: &mut ScdClient<Channel>,
    r: pb::AuditRequest,
    who: &Identity,
) -> Result<Vec<pb::AuditRecordMsg>, Status> {
    use tokio_stream::StreamExt as _;
    let mut s = c.audit(with(r, Some(sign_header(who, "scd", now_s()).as_str()))).await?.into_inner();
    let mut out = Vec::new();
    while let Some(m) = s.next().await {
        out.push(m?);
    }
    Ok(out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_audit_trail_records_the_did_and_each_did_reads_only_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let (alice, bob) = identities(dir.path());
    let log =
        Arc::new(AuditLog::open(&dir.path().join("audit.redb"), AuditLevel::Chunks, Retention::default()).unwrap());
    let s = start_with(dir.path(), 1000.0, 1000, Some(log)).await;
    let mut c = client(&s).await;
    let sign = |who: &Identity| Some(sign_header(who, "scd", now_s()));
    let sent = c.compress(with(compress_req(60, ""), sign(&alice).as_deref())).await.unwrap().into_inner();
    // bob forwards a report through the Handoff RPC: one record, of the forward's compression
    let report = "[STATUS]\nin_progress\n[SUMMARY]\ncharges fail\n[EVIDENCE_OR_TESTS]\nlogs\n[CONFIDENCE]\nlow\n\
                  [NEXT]\nfind the failing query\n[ANSWER_CANDIDATE]\nunknown\n";
    let fwd = pb::HandoffRequest {
        op: Some(pb::handoff_request::Op::Forward(pb::ForwardReport {
            text: report.into(),
            format: 0,
            compress: Some(compress_req(80, "")),
            render: pb::ReportFormat::StructuredSoft as i32,
        })),
    };
    let fwd = c.handoff(with(fwd, sign(&bob).as_deref())).await.unwrap().into_inner().compressed.unwrap();

    let mine = audit_of(&mut c, pb::AuditRequest::default(), &alice).await.unwrap();
    assert_eq!(mine.len(), 1, "alice sees her one record: {mine:?}");
    let r = &mine[0];
    assert_eq!((r.method.as_str(), r.caller.as_str(), r.outcome.as_str()), ("gRPC Compress", ALICE, "ok"));
    assert!(r.peer.starts_with("127.0.0.1:"), "{}", r.peer);
    let ids: Vec<&str> = r.chunks.iter().map(|c| c.id.as_str()).collect();
    assert_eq!(ids, sent.chunks.iter().map(|c| c.id.as_str()).collect::<Vec<_>>());
    assert_eq!(r.withheld, vec!["api_keys".to_string()]);

    let theirs = audit_of(&mut c, pb::AuditRequest::default(), &bob).await.unwrap();
    assert_eq!(theirs.len(), 1, "{theirs:?}");
    let r = &theirs[0];
    assert_eq!((r.method.as_str(), r.caller.as_str(), r.budget_tokens), ("gRPC Handoff", BOB, 80));
    assert_eq!(r.chunk_count as usize, fwd.chunks.len());
    assert!(r.chunks.iter().any(|c| c.field.starts_with("report.")), "the report's sections were scored");
    assert_eq!(r.withheld, vec!["api_keys".to_string()]);
    assert_eq!(r.task, "Why are customer charges failing at checkout?");

    // bob may not ask for alice's trajectory, and nobody reads it unsigned
    let ask = pb::AuditRequest { caller: ALICE.into(), ..Default::default() };
    let e = audit_of(&mut c, ask, &bob).await.unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
    let e = c.audit(pb::AuditRequest::default()).await.unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated, "{e:?}");

    // the operator's token (with a signed call: DID auth still applies)
    // reads both callers' records, and may name either
    let operator = |r: pb::AuditRequest, token: &str| {
        let mut r = with(r, sign(&alice).as_deref());
        r.metadata_mut().insert("x-scd-audit-token", token.parse().unwrap());
        r
    };
    let read = |r: tonic::Request<pb::AuditRequest>| {
        let mut c = c.clone();
        async move {
            use tokio_stream::StreamExt as _;
            let mut s = c.audit(r).await?.into_inner();
            let mut out = Vec::new();
            while let Some(m) = s.next().await {
                out.push(m?);
            }
            Ok::<_, Status>(out)
        }
    };
    let all = read(operator(pb::AuditRequest::default(), AUDIT_TOKEN)).await.unwrap();
    assert_eq!(all.iter().map(|r| r.caller.as_str()).collect::<Vec<_>>(), [ALICE, BOB]);
    let bobs =
        read(operator(pb::AuditRequest { caller: BOB.into(), ..Default::default() }, AUDIT_TOKEN)).await.unwrap();
    assert_eq!(bobs.iter().map(|r| r.method.as_str()).collect::<Vec<_>>(), ["gRPC Handoff"]);
    // a wrong token does not fall back to the DID's own records
    let e = read(operator(pb::AuditRequest::default(), "op-token-auth-guess")).await.unwrap_err();
    assert_eq!((e.code(), e.message()), (Code::Unauthenticated, "x-scd-audit-token: does not match"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a2a_tasks_are_bound_to_the_did_that_sent_them() {
    let dir = tempfile::tempdir().unwrap();
    let (alice, bob) = identities(dir.path());
    let s = start(dir.path(), 1000.0, 1000).await;
    // discovery is public and says how to sign
    let (status, _, card) = http_get(s.http, "/.well-known/agent-card.json", "localhost", None).await;
    assert_eq!(status, 200, "{card}");
    assert!(card.contains("\"scheme\":\"DIDWba\""), "{card}");
    let send = serde_json::json!({"message": {"messageId": "m1", "role": "ROLE_USER", "parts": [{"data": {
        "task": "Why do charges fail?",
        "context": {"fields": [{"name": "logs", "kind": "log", "content": "ERROR payments: card declined"}]},
        "budget": 50}}]}});
    let (status, body) = a2a_rpc(s.http, None, "SendMessage", send.clone()).await;
    assert_eq!(status, 401, "unsigned A2A calls are refused: {body}");
    assert!(body.contains("missing Authorization header"), "{body}");
    let sign = |who: &Identity| sign_header(who, "scd", now_s());
    let (status, body) = a2a_rpc(s.http, Some(&sign(&alice)), "SendMessage", send).await;
    assert_eq!(status, 200, "{body}");
    let sent: serde_json::Value = serde_json::from_str(&body).unwrap();
    let id = sent["result"]["task"]["id"].as_str().unwrap_or_else(|| panic!("{sent}")).to_string();
    // bob cannot read, cancel or continue alice's task: to him it does not exist
    let more = serde_json::json!({"message": {"messageId": "m2", "role": "ROLE_USER", "taskId": id,
        "parts": [{"text": "which card?"}]}});
    for (method, params) in [
        ("GetTask", serde_json::json!({"id": id})),
        ("CancelTask", serde_json::json!({"id": id})),
        ("SubscribeToTask", serde_json::json!({"id": id})),
        ("SendMessage", more),
    ] {
        let (status, body) = a2a_rpc(s.http, Some(&sign(&bob)), method, params).await;
        assert_eq!(status, 200, "{body}");
        let r: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(r["error"]["code"], -32001, "{method}: {r}");
    }
    let (_, body) = a2a_rpc(s.http, Some(&sign(&bob)), "ListTasks", serde_json::json!({})).await;
    assert!(!body.contains(&id), "bob's list holds no task of alice's: {body}");
    let (_, body) = a2a_rpc(s.http, Some(&sign(&alice)), "GetTask", serde_json::json!({"id": id})).await;
    let r: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(r["result"]["id"], serde_json::json!(id), "{r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rate_limit_is_per_did_and_counts_only_authenticated_calls() {
    let dir = tempfile::tempdir().unwrap();
    let (alice, bob) = identities(dir.path());
    let s = start(dir.path(), 2.0, 2).await;
    let mut c = client(&s).await;
    // forged calls under alice's DID do not drain her bucket
    let mallory = Identity::generate().with_did(ALICE).unwrap();
    for _ in 0..5 {
        refused(
            info(&mut c, Some(&sign_header(&mallory, "scd", now_s()))).await,
            Code::Unauthenticated,
            "bad signature",
        );
    }
    info(&mut c, Some(&sign_header(&alice, "scd", now_s()))).await.unwrap();
    info(&mut c, Some(&sign_header(&alice, "scd", now_s()))).await.unwrap();
    let e = info(&mut c, Some(&sign_header(&alice, "scd", now_s()))).await.unwrap_err();
    assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
    assert!(
        e.message().starts_with(&format!(
            "rate limit for {ALICE}: 2 requests/s, burst 2 (--auth-rate, --auth-burst); retry after "
        )),
        "{}",
        e.message()
    );
    let wait: u64 = e.metadata().get("retry-after-ms").unwrap().to_str().unwrap().parse().unwrap();
    assert!((1..=500).contains(&wait), "retry-after-ms {wait}");
    // bob has his own bucket
    info(&mut c, Some(&sign_header(&bob, "scd", now_s()))).await.unwrap();
    // after the hinted wait alice is served again
    tokio::time::sleep(Duration::from_millis(wait)).await;
    info(&mut c, Some(&sign_header(&alice, "scd", now_s()))).await.unwrap();
    // the same over HTTP: 429 with Retry-After
    let mut last = (0, String::new(), String::new());
    for _ in 0..3 {
        last = http_get(s.http, "/metrics", "localhost", Some(&sign_header(&alice, "scd", now_s()))).await;
    }
    assert_eq!(last.0, 429, "{last:?}");
    assert!(last.1.to_lowercase().contains("retry-after: 1\r\n"), "{}", last.1);
    assert!(last.2.starts_with(&format!("rate limit for {ALICE}")), "{}", last.2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_needs_a_signature_except_for_the_did_documents() {
    let dir = tempfile::tempdir().unwrap();
    let (alice, _bob) = identities(dir.path());
    let s = start(dir.path(), 1000.0, 1000).await;
    let get = |path: &'static str, auth: Option<String>| {
        let addr = s.http;
        async move { http_get(addr, path, "example.com", auth.as_deref()).await }
    };
    let mallory = Identity::generate().with_did(ALICE).unwrap();
    let carol = Identity::generate().with_did("did:wba:example.com:user:carol").unwrap();
    let replayed = sign_header(&alice, "scd", now_s());
    assert_eq!(get("/metrics", Some(replayed.clone())).await.0, 200);
    for (auth, reason) in [
        (None, "missing Authorization header"),
        (Some("DIDWba nonce=\"x\"".to_string()), "malformed Authorization header: did: missing"),
        (Some(sign_header(&carol, "scd", now_s())), "unknown DID did:wba:example.com:user:carol"),
        (Some(sign_header(&mallory, "scd", now_s())), "bad signature"),
        (Some(at(&alice, "http-future-nonce-1", 61)), "timestamp outside ±60 s: 61 s ahead"),
        (Some(replayed), "replayed nonce"),
    ] {
        for path in ["/metrics", "/no-such-path"] {
            let (status, head, body) = get(path, auth.clone()).await;
            assert_eq!(status, 401, "{path} {reason}: {head}");
            assert!(head.to_lowercase().contains("www-authenticate: didwba"), "{head}");
            assert!(body.starts_with(reason), "{path}: {body:?} does not start with {reason:?}");
        }
    }
    // the DID documents are public, looked up by Host and path
    let (status, head, body) = get("/user/alice/did.json", None).await;
    assert_eq!(status, 200, "{head}");
    assert!(head.contains("application/did+json"), "{head}");
    let doc: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(doc["id"], ALICE);
    assert_eq!(doc["authentication"][0], format!("{ALICE}#key-1"));
    assert_eq!(get("/user/nobody/did.json", None).await.0, 404);
    assert_eq!(get("/user/../alice/did.json", None).await.0, 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_python_client_signs_independently() {
    let python = crate::root().join(".tools/venv/bin/python");
    let importable =
        Command::new(&python).args(["-c", "import grpc, grpc_tools, nacl"]).status().is_ok_and(|s| s.success());
    if !importable {
        crate::skip(&format!("{} cannot import grpc, grpc_tools, nacl; run models/setup.sh", python.display()));
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    identities(dir.path());
    let s = start(dir.path(), 1000.0, 1000).await;
    let addr = s.grpc.trim_start_matches("http://").to_string();
    let did_dir = dir.path().to_path_buf();
    let out = tokio::task::spawn_blocking(move || {
        Command::new(python)
            .arg(crate::root().join("service/tests/py/did_wba_client.py"))
            .arg(addr)
            .arg(did_dir)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{stdout}\n{stderr}");
    for check in ["signed_info_answered", "tampered_signature_refused"] {
        let line = stdout
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .find(|l| l["check"] == check);
        assert!(line.is_some_and(|l| l["ok"] == true), "{check} missing or failed:\n{stdout}\n{stderr}");
    }
    assert!(stdout.contains("\"model\": \"hash-64\""), "{stdout}");
}

#[test]
fn serve_checks_the_auth_flags_before_loading_the_model() {
    let dir = tempfile::tempdir().unwrap();
    let serve = |extra: &[&str]| {
        let mut args = vec!["--ort-lib", "/nonexistent/libonnxruntime.so", "serve", "--addr", "127.0.0.1:0"];
        args.extend_from_slice(extra);
        let (ok, _, stderr) = crate::scd(&args, "");
        assert!(!ok, "{stderr}");
        stderr
    };
    let d = dir.path().to_str().unwrap();
    let e = serve(&["--auth", "did-wba"]);
    assert!(e.contains("--auth did-wba needs --did-dir DIR"), "{e}");
    let e = serve(&["--auth", "did-wba", "--did-dir", d]);
    assert!(e.contains(&format!("--did-dir {d}: no DID documents")), "{e}");
    let e = serve(&["--auth", "did-wba", "--did-dir", &format!("{d}/missing")]);
    assert!(e.contains("not a directory"), "{e}");
    let e = serve(&["--did-dir", d]);
    assert!(e.contains("--did-dir: only used with --auth did-wba"), "{e}");
    Identity::generate().with_did(ALICE).unwrap().write_wba_document(dir.path()).unwrap();
    let e = serve(&["--auth", "did-wba", "--did-dir", d, "--auth-rate", "0"]);
    assert!(e.contains("--auth-rate 0: must be at least 0.001 requests per second"), "{e}");
    let e = serve(&["--auth", "did-wba", "--did-dir", d, "--auth-rate", "1e-20"]);
    assert!(e.contains("--auth-rate 0.00000000000000000001: must be at least 0.001"), "{e}");
    let e = serve(&["--auth", "did-wba", "--did-dir", d, "--auth-burst", "0"]);
    assert!(e.contains("--auth-burst 0: must be at least 1"), "{e}");
    let e = serve(&["--auth", "did-wba", "--did-dir", d, "--auth-aud", "a b"]);
    assert!(e.contains("--auth-aud \"a b\": must be"), "{e}");
    // with valid flags it gets as far as loading the model
    let e = serve(&["--auth", "did-wba", "--did-dir", d]);
    assert!(!e.contains("--did-dir") && !e.contains("--auth"), "{e}");
}

#[test]
fn scd_client_with_an_identity_is_accepted_by_a_real_server() {
    if !crate::ready() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let dids = dir.path().join("dids");
    let key = dir.path().join("alice.json");
    let (ok, stdout, stderr) = crate::scd(
        &["identity", "new", "--out", key.to_str().unwrap(), "--did", ALICE, "--did-dir", dids.to_str().unwrap()],
        "",
    );
    assert!(ok, "{stderr}");
    let made: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(made["did"], ALICE);
    assert!(dids.join("example.com/user/alice/did.json").is_file());
    let audit_db = dir.path().join("audit.redb");
    let server = crate::grpc::start(&[
        "--auth",
        "did-wba",
        "--did-dir",
        dids.to_str().unwrap(),
        "--audit-db",
        audit_db.to_str().unwrap(),
    ]);
    let client = |extra: &[&str]| {
        let mut args = vec!["client", "--addr", server.addr.as_str(), "--retries", "40"];
        args.extend_from_slice(extra);
        args.push("info");
        crate::scd(&args, "")
    };
    // UNAVAILABLE while the model warms is retried; a signed call then succeeds
    let (ok, stdout, stderr) = client(&["--identity", key.to_str().unwrap(), "--did", ALICE]);
    assert!(ok, "{stderr}");
    let info: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(info["dim"], 384);
    // without an identity: refused, not retried, the reason named
    let (ok, _, stderr) = client(&[]);
    assert!(!ok);
    assert!(stderr.contains("Info: Unauthenticated: missing Authorization header"), "{stderr}");
    // the key file's own did:key is not in the allowlist
    let (ok, _, stderr) = client(&["--identity", key.to_str().unwrap()]);
    assert!(!ok);
    assert!(stderr.contains("Unauthenticated: unknown DID did:key:"), "{stderr}");
    // a key file that does not exist is an error, not a new key
    let (ok, _, stderr) = client(&["--identity", dir.path().join("nope.json").to_str().unwrap()]);
    assert!(!ok && stderr.contains("no such file (create one with `scd identity new`)"), "{stderr}");
    // a signed compression is in the trail under the DID, and `scd audit` signs too
    let (ok, _, stderr) = crate::scd(
        &[
            "client",
            "--addr",
            &server.addr,
            "--identity",
            key.to_str().unwrap(),
            "--did",
            ALICE,
            "compress",
            "--task",
            "Why do charges fail?",
            "--context",
            "fixtures/agent_context.json",
            "--budget",
            "100",
        ],
        "",
    );
    assert!(ok, "{stderr}");
    let (ok, stdout, stderr) =
        crate::scd(&["audit", "--server", &server.addr, "--identity", key.to_str().unwrap(), "--did", ALICE], "");
    assert!(ok, "{stderr}");
    let records: Vec<serde_json::Value> = stdout.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(records.len(), 1, "{stdout}");
    assert_eq!((records[0]["method"].as_str(), records[0]["caller"].as_str()), (Some("gRPC Compress"), Some(ALICE)));
    let (ok, _, stderr) = crate::scd(&["audit", "--server", &server.addr], "");
    assert!(!ok && stderr.contains("Unauthenticated: missing Authorization header"), "{stderr}");
}
