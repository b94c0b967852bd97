//! The HTTP listener (REST, A2A, `/ready`) against slow and greedy clients
//! (issue 43, High 1) and long calls (issue 42, wall 1): real sockets on
//! loopback, from several addresses in 127.0.0.0/8.

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use scd_engine::encoder::{Encoder, HashEncoder};
use scd_service::http::HttpLimits;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

use crate::inproc::{InProc, Options};
use crate::serving::TestEncoder;

/// A server whose encoder takes `delay_ms` per call once it is ready (the
/// warm-up call is not slowed).
async fn start(http: HttpLimits, delay_ms: u64) -> InProc {
    let encoder = TestEncoder::new(0);
    let s = crate::inproc::start(Options { encoder: encoder.clone(), http, ..Default::default() });
    wait_ready(&s, 2).await;
    encoder.delay_ms.store(delay_ms, Ordering::SeqCst);
    s
}

/// A socket to `to` from the loopback address `127.0.0.<from>`.
async fn connect(from: u8, to: SocketAddr) -> TcpStream {
    let s = TcpSocket::new_v4().unwrap();
    s.bind(SocketAddr::new(IpAddr::from([127, 0, 0, from]), 0)).unwrap();
    s.connect(to).await.unwrap()
}

/// Sends `raw` (a whole HTTP/1.1 request with `Connection: close`) from
/// `127.0.0.<from>` and reads the reply to its end within `wait`.
async fn exchange(from: u8, to: SocketAddr, raw: &str, wait: Duration) -> String {
    let mut s = connect(from, to).await;
    s.write_all(raw.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(wait, s.read_to_end(&mut out)).await.expect("answered in time").unwrap();
    String::from_utf8_lossy(&out).into_owned()
}

fn get(path: &str) -> String {
    format!("GET {path} HTTP/1.1\r\nHost: scd\r\nConnection: close\r\n\r\n")
}

fn post(path: &str, body: &str) -> String {
    format!(
        "POST {path} HTTP/1.1\r\nHost: scd\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
}

fn embeddings_body() -> String {
    let model = HashEncoder::new(64, 512).model_id().split('@').next().unwrap().to_string();
    serde_json::json!({"model": model, "input": ["where is the connection pool exhausted"]}).to_string()
}

/// Waits until `/ready` says serving (from `127.0.0.<from>`).
async fn wait_ready(s: &InProc, from: u8) {
    for _ in 0..200 {
        if exchange(from, s.http, &get("/ready"), Duration::from_secs(5)).await.starts_with("HTTP/1.1 200") {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("never ready");
}

/// The value of `scd_rejected_total{kind="<kind>"}` on `/metrics`.
async fn rejected(s: &InProc, kind: &str) -> u64 {
    let text = exchange(9, s.http, &get("/metrics"), Duration::from_secs(5)).await;
    let key = format!("scd_rejected_total{{kind=\"{kind}\"}} ");
    text.lines().find_map(|l| l.strip_prefix(&key)).map_or(0, |v| v.trim().parse().unwrap())
}

/// A socket that sends a complete request head announcing a 100,000-byte
/// body, then one body byte.
async fn slow_body(from: u8, to: SocketAddr) -> TcpStream {
    let mut s = connect(from, to).await;
    let head =
        "POST /v1/compress HTTP/1.1\r\nHost: scd\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n{";
    // a socket closed on accept may refuse the write; that is the point
    let _ = s.write_all(head.as_bytes()).await;
    s
}

/// Reads what the server sends on `s` until it closes (within `wait`).
async fn until_closed(s: &mut TcpStream, wait: Duration) -> Option<String> {
    let mut out = Vec::new();
    let r = tokio::time::timeout(wait, s.read_to_end(&mut out)).await.ok()?;
    // a reset counts as closed too
    let _ = r;
    Some(String::from_utf8_lossy(&out).into_owned())
}

#[tokio::test]
async fn one_address_with_slow_bodies_holds_at_most_its_share_and_is_cut_off() {
    let http = HttpLimits {
        max_connections: 16,
        max_per_peer: 4,
        reserve: 2,
        body_timeout: Duration::from_millis(1500),
        ..HttpLimits::default()
    };
    let s = start(http, 0).await;
    let mut held = Vec::new();
    for _ in 0..10 {
        held.push(slow_body(3, s.http).await);
    }
    // another client is served at once while the slow ones are held
    let ready = exchange(2, s.http, &get("/ready"), Duration::from_secs(2)).await;
    assert!(ready.starts_with("HTTP/1.1 200"), "{ready}");
    let emb = exchange(4, s.http, &post("/v1/embeddings", &embeddings_body()), Duration::from_secs(10)).await;
    assert!(emb.starts_with("HTTP/1.1 200"), "{emb}");
    // six of ten were over the address's share: closed on accept, with no reply
    assert_eq!(rejected(&s, "http_per_peer").await, 6);
    // the four admitted ones are answered 408 once the body is late, and closed
    let mut timed_out = 0;
    for sock in &mut held {
        let reply = until_closed(sock, Duration::from_secs(5)).await.expect("closed by the server");
        if reply.starts_with("HTTP/1.1 408") {
            assert!(reply.contains("--http-body-timeout-ms"), "{reply}");
            assert!(reply.to_ascii_lowercase().contains("connection: close"), "{reply}");
            timed_out += 1;
        } else {
            assert!(reply.is_empty(), "a refused socket gets no reply: {reply}");
        }
    }
    assert_eq!(timed_out, 4);
    assert_eq!(rejected(&s, "http_body_timeout").await, 4);
}

#[tokio::test]
async fn probes_are_answered_when_clients_hold_every_slot_and_other_calls_get_a_retry_hint() {
    let http = HttpLimits {
        max_connections: 4,
        max_per_peer: 4,
        reserve: 2,
        body_timeout: Duration::from_secs(20),
        ..HttpLimits::default()
    };
    let s = start(http, 0).await;
    let mut held = Vec::new();
    for from in 10..14 {
        held.push(slow_body(from, s.http).await);
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let ready = exchange(20, s.http, &get("/ready"), Duration::from_secs(2)).await;
    assert!(ready.starts_with("HTTP/1.1 200"), "the reserve answers the probe: {ready}");
    let refused = exchange(21, s.http, &post("/v1/embeddings", &embeddings_body()), Duration::from_secs(2)).await;
    assert!(refused.starts_with("HTTP/1.1 503"), "{refused}");
    assert!(refused.contains("kept for /health, /ready and /metrics"), "{refused}");
    let hint: u64 = refused
        .lines()
        .find_map(|l| l.to_ascii_lowercase().strip_prefix("retry-after-ms: ").map(|v| v.trim().parse().unwrap()))
        .expect("retry-after-ms");
    // the held slots are due to free when their bodies run out of time
    assert!((17_000..=20_000).contains(&hint), "hint {hint} ms");
    assert!(rejected(&s, "http_reserve_call").await >= 1);
    // a slot frees: the next connection gets it
    drop(held.pop());
    tokio::time::sleep(Duration::from_millis(200)).await;
    let emb = exchange(21, s.http, &post("/v1/embeddings", &embeddings_body()), Duration::from_secs(10)).await;
    assert!(emb.starts_with("HTTP/1.1 200"), "{emb}");
}

#[tokio::test]
async fn a_call_longer_than_the_old_60_s_connection_cap_finishes() {
    let s = start(HttpLimits::default(), 62_000).await;
    let started = Instant::now();
    let reply = exchange(5, s.http, &post("/v1/embeddings", &embeddings_body()), Duration::from_secs(120)).await;
    assert!(started.elapsed() > Duration::from_secs(60), "{:?}", started.elapsed());
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    assert!(reply.contains("\"embedding\""), "{reply}");
}

#[tokio::test]
async fn a_call_past_the_request_limit_is_cancelled_and_told_so() {
    let http = HttpLimits { request_timeout: Duration::from_millis(1000), ..HttpLimits::default() };
    let s = start(http, 5_000).await;
    let started = Instant::now();
    let reply = exchange(6, s.http, &post("/v1/embeddings", &embeddings_body()), Duration::from_secs(10)).await;
    assert!(started.elapsed() < Duration::from_secs(4), "{:?}", started.elapsed());
    assert!(reply.starts_with("HTTP/1.1 504"), "{reply}");
    assert!(reply.contains("--http-request-timeout-ms"), "{reply}");
    assert_eq!(rejected(&s, "http_request_timeout").await, 1);
}

/// A context of many short paragraphs: several encoder calls.
fn big_context() -> serde_json::Value {
    let field = |f: usize| {
        let content: String = (0..400)
            .map(|i| format!("Paragraph {f} {i}: the checkout service logged charge failure number {i}.\n\n"))
            .collect();
        serde_json::json!({"name": format!("notes_{f}"), "kind": "prose", "content": content})
    };
    serde_json::json!({"fields": (0..4).map(field).collect::<Vec<_>>()})
}

/// A REST compress and an A2A compress message past
/// `--http-request-timeout-ms`: the core stops them at its deadline, a
/// little before the listener's, so each is answered as timed out (REST:
/// 504 naming the flag; A2A: a failed task) and recorded in the audit trail
/// with its outcome, where the listener's cut left no record.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_call_past_the_request_limit_is_stopped_by_the_core_and_audited() {
    use scd_audit::{AuditLevel, AuditLog, Retention};
    let dir = tempfile::tempdir().unwrap();
    let log = std::sync::Arc::new(
        AuditLog::open(&dir.path().join("a.redb"), AuditLevel::Summary, Retention::default()).unwrap(),
    );
    let encoder = TestEncoder::new(0);
    // 3 s: the core stops at 2.7 s, leaving 300 ms to record and answer
    // before the listener would cut (100 ms at 1 s was tight on a loaded CI)
    let http = HttpLimits { request_timeout: Duration::from_millis(3000), ..HttpLimits::default() };
    let s = crate::inproc::start(Options {
        encoder: encoder.clone(),
        http,
        audit: Some(log.clone()),
        ..Default::default()
    });
    wait_ready(&s, 2).await;
    encoder.delay_ms.store(1200, Ordering::SeqCst);
    let task = "Why are charges failing?";

    let body = serde_json::json!({"task": task, "context": big_context(), "budget": 200}).to_string();
    let started = Instant::now();
    let reply = exchange(7, s.http, &post("/v1/compress", &body), Duration::from_secs(10)).await;
    assert!(started.elapsed() < Duration::from_secs(6), "{:?}", started.elapsed());
    assert!(reply.starts_with("HTTP/1.1 504"), "{reply}");
    assert!(reply.contains("\"code\":\"DEADLINE_EXCEEDED\""), "{reply}");
    assert!(reply.contains("ran past the server's limit of 3000 ms (--http-request-timeout-ms)"), "{reply}");
    assert_eq!(rejected(&s, "http_request_timeout").await, 1);
    let records = log.query(&Default::default()).unwrap();
    let r = records.iter().find(|r| r.method == "REST OpenSession").unwrap_or_else(|| panic!("{records:?}"));
    assert_eq!((r.outcome.as_str(), r.task.as_deref(), r.budget_tokens), ("DeadlineExceeded", Some(task), Some(200)));
    assert!(r.peer.as_deref().is_some_and(|p| p.starts_with("127.0.0.7:")), "{r:?}");

    let data = serde_json::json!({"task": task, "context": big_context(), "budget": 200});
    let send = serde_json::json!({"message": {"messageId": "m-1", "role": "ROLE_USER", "parts": [{"data": data}]}});
    let body = serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": send}).to_string();
    let started = Instant::now();
    let reply = exchange(8, s.http, &post("/", &body), Duration::from_secs(10)).await;
    assert!(started.elapsed() < Duration::from_secs(6), "{:?}", started.elapsed());
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    assert!(reply.contains("TASK_STATE_FAILED"), "{reply}");
    assert!(reply.contains("deadline exceeded"), "{reply}");
    let records = log.query(&Default::default()).unwrap();
    let r = records.iter().find(|r| r.method == "A2A OpenSession").unwrap_or_else(|| panic!("{records:?}"));
    assert_eq!((r.outcome.as_str(), r.task.as_deref()), ("DeadlineExceeded", Some(task)));
    assert!(r.peer.as_deref().is_some_and(|p| p.starts_with("127.0.0.8:")), "{r:?}");
}
