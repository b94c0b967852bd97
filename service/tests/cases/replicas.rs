//! Beyond one machine, against the real servers: sessions in a real
//! `redis-server`, two `scd serve` replicas behind a real HAProxy (round
//! robin, no stickiness; gRPC and HTTP), a replica killed with SIGKILL under
//! a gRPC load and under a REST session, Redis restarted with and without
//! persistence, and a corpus embedded by three `scd embed-worker` processes
//! with one killed mid-shard.
//!
//! Redis and HAProxy come from Debian's packages (`service/tests/setup.sh`
//! installs them); each test starts its own on loopback ports in a scratch
//! folder and stops them after. The HAProxy and Redis configurations are
//! docs/deploy's, as an operator would run them.

use std::collections::HashSet;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use scd_service::client::{Conn, Signer};
use scd_service::grpc::pb;
use serde_json::Value;
use tonic::Code;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

use crate::{ready, root, scratch, skip};

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Whether `program` is installed; under CI its absence fails the test.
pub(crate) fn have(program: &str) -> bool {
    let found =
        Command::new("sh").arg("-c").arg(format!("command -v {program}")).output().is_ok_and(|o| o.status.success());
    if !found {
        skip(&format!("{program} is not installed (service/tests/setup.sh installs it from Debian)"));
    }
    found
}

fn kill9(child: &Child) {
    let ok = Command::new("kill").args(["-KILL", &child.id().to_string()]).status().unwrap().success();
    assert!(ok, "kill -KILL");
}

/// SIGKILL to `r`, and wait until its ports refuse connections (it is gone,
/// not dying with a call in its hands).
fn kill9_and_wait(r: &Replica) {
    kill9(&r.child);
    let t = Instant::now();
    while [r.grpc, r.http].iter().any(|&p| std::net::TcpStream::connect(("127.0.0.1", p)).is_ok()) {
        assert!(t.elapsed() < Duration::from_secs(10), "a killed replica still accepts connections");
        std::thread::sleep(Duration::from_millis(10));
    }
}

// ---------------------------------------------------------------------------
// redis-server, started by the test
// ---------------------------------------------------------------------------

pub(crate) struct RedisServer {
    child: Option<Child>,
    port: u16,
    dir: PathBuf,
    persistent: bool,
}

impl RedisServer {
    pub(crate) fn start(dir: &Path, persistent: bool) -> RedisServer {
        let mut r = RedisServer { child: None, port: free_port(), dir: dir.to_path_buf(), persistent };
        // a free port may be taken by another test's server before ours binds
        // it: that server would answer our PING, and two tests would share one
        // Redis, so a server that is not ours is never used
        for _ in 0..5 {
            match r.try_spawn() {
                Ok(()) => return r,
                Err(log) if log.contains("Address already in use") => r.port = free_port(),
                Err(log) => panic!("redis-server exited: {log}"),
            }
        }
        panic!("redis-server found its port taken five times");
    }

    pub(crate) fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    /// Starts the server again on its port (after [`Self::stop`]).
    pub(crate) fn spawn(&mut self) {
        if let Err(log) = self.try_spawn() {
            panic!("redis-server could not start again on port {}: {log}", self.port);
        }
    }

    /// Starts redis-server on `self.port` and waits until that very process
    /// answers there with its data loaded (PONG, not LOADING); else the
    /// tail of its log once it exited.
    fn try_spawn(&mut self) -> Result<(), String> {
        let mut cmd = Command::new("redis-server");
        cmd.arg(root().join("docs/deploy/redis.conf")).args([
            "--port",
            &self.port.to_string(),
            "--dir",
            self.dir.to_str().unwrap(),
        ]);
        if !self.persistent {
            cmd.args(["--appendonly", "no"]);
        }
        let log = self.dir.join("redis.log");
        let child = cmd.stdout(std::fs::File::create(&log).unwrap()).spawn().unwrap();
        let ours = format!("process_id:{}", child.id());
        // held here at once, so that a failed start never leaves it running
        self.child = Some(child);
        let t = Instant::now();
        loop {
            if self.child.as_mut().unwrap().try_wait().unwrap().is_some() {
                self.child = None;
                let text = std::fs::read_to_string(&log).unwrap_or_default();
                let tail: Vec<&str> = text.lines().rev().take(5).collect();
                return Err(tail.into_iter().rev().collect::<Vec<_>>().join(" | "));
            }
            if self.cli(&["INFO", "server"]).lines().any(|l| l.trim() == ours) && self.cli(&["PING"]) == "PONG" {
                return Ok(());
            }
            assert!(t.elapsed() < Duration::from_secs(10), "redis-server did not start");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// One command through redis-cli; its output, trimmed.
    pub(crate) fn cli(&self, args: &[&str]) -> String {
        Command::new("redis-cli")
            .args(["-p", &self.port.to_string()])
            .args(args)
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_default()
    }

    /// SIGTERM (Redis writes its append-only file and exits) and wait.
    pub(crate) fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = Command::new("kill").args(["-TERM", &c.id().to_string()]).status();
            let _ = c.wait();
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

// ---------------------------------------------------------------------------
// scd serve replicas and HAProxy
// ---------------------------------------------------------------------------

struct Replica {
    child: Child,
    grpc: u16,
    http: u16,
}

impl Drop for Replica {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Replica {
    fn start(dir: &Path, name: &str, state: &str, extra: &[&str]) -> Replica {
        let (grpc, http) = (free_port(), free_port());
        let log = dir.join(format!("{name}.log"));
        let mut child = Command::new(env!("CARGO_BIN_EXE_scd"))
            .current_dir(root())
            .env("SCD_ORT_LIB", root().join(".tools/ort/libonnxruntime.so"))
            .env("SCD_MODELS_DIR", root().join("models/out"))
            .env("SCD_EMBEDDING_CACHE", "off")
            .env("SCD_THREADS", "1")
            .args(["serve", "--addr", &format!("127.0.0.1:{grpc}"), "--http-addr", &format!("127.0.0.1:{http}")])
            .args(["--state", state])
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        loop {
            let line =
                lines.next().unwrap_or_else(|| panic!("{name} exited: {}", std::fs::read_to_string(&log).unwrap()));
            if line.unwrap().starts_with("listening on ") {
                break;
            }
        }
        std::thread::spawn(move || for _ in lines {});
        let r = Replica { child, grpc, http };
        r.wait_ready(true);
        r
    }

    fn addr(&self) -> String {
        format!("http://127.0.0.1:{}", self.grpc)
    }

    fn get(&self, path: &str) -> (u16, String) {
        use std::io::{Read, Write};
        let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", self.http)) else { return (0, String::new()) };
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        write!(s, "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n").unwrap();
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        let code = out.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
        (code, out)
    }

    /// Waits until `/ready` says 200 (`up`) or not.
    fn wait_ready(&self, up: bool) {
        let t = Instant::now();
        while (self.get("/ready").0 == 200) != up {
            assert!(
                t.elapsed() < Duration::from_secs(120),
                "replica never became {}",
                if up { "ready" } else { "unready" }
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// `scd_requests_total` for `method` (all codes).
    fn served(&self, method: &str) -> u64 {
        let (_, body) = self.get("/metrics");
        body.lines()
            .filter(|l| l.starts_with("scd_requests_total{") && l.contains(&format!("method=\"{method}\"")))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .sum()
    }
}

struct Haproxy {
    child: Child,
    port: u16,
    http_port: u16,
}

impl Drop for Haproxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Haproxy {
    /// docs/deploy/haproxy.cfg in front of `a` and `b`: gRPC on `port`,
    /// HTTP (REST, A2A) on `http_port`.
    fn start(dir: &Path, a: &Replica, b: &Replica) -> Haproxy {
        let (port, http_port) = (free_port(), free_port());
        let child = Command::new("haproxy")
            .args(["-db", "-f", root().join("docs/deploy/haproxy.cfg").to_str().unwrap()])
            .env("SCD_LB_ADDR", format!("127.0.0.1:{port}"))
            .env("SCD_LB_HTTP_ADDR", format!("127.0.0.1:{http_port}"))
            .env("SCD_A", format!("127.0.0.1:{}", a.grpc))
            .env("SCD_B", format!("127.0.0.1:{}", b.grpc))
            .env("SCD_A_HTTP", format!("127.0.0.1:{}", a.http))
            .env("SCD_B_HTTP", format!("127.0.0.1:{}", b.http))
            .stdout(std::fs::File::create(dir.join("haproxy.log")).unwrap())
            .stderr(std::fs::File::create(dir.join("haproxy.err")).unwrap())
            .spawn()
            .unwrap();
        Haproxy { child, port, http_port }
    }

    fn addr(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn http_addr(&self) -> String {
        format!("127.0.0.1:{}", self.http_port)
    }

    /// A REST `POST path` through the HTTP frontend: status and JSON body.
    fn post(&self, path: &str, token: Option<&str>, body: &Value) -> (u16, Value) {
        let headers: Vec<(&str, &str)> = token.map(|t| ("x-scd-session-token", t)).into_iter().collect();
        let (status, text) = crate::a2a::http(&self.http_addr(), "POST", path, &headers, &body.to_string());
        (status, serde_json::from_str(&text).unwrap_or_else(|e| panic!("{status} {path}: {e}: {text:?}")))
    }

    /// Waits until a `GET /ready` through the HTTP frontend reaches a replica.
    fn wait_http(&self) {
        let t = Instant::now();
        while std::net::TcpStream::connect(self.http_addr()).is_err()
            || crate::a2a::status_and_body(&self.http_addr(), "/ready").0 != 200
        {
            assert!(t.elapsed() < Duration::from_secs(30), "HAProxy never passed an HTTP call");
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

// ---------------------------------------------------------------------------
// calls
// ---------------------------------------------------------------------------

/// The replica's gRPC health for `scd.v1.Scd`.
async fn health(r: &Replica) -> i32 {
    let Ok(ch) = tonic::transport::Endpoint::from_shared(r.addr()).unwrap().connect().await else { return -1 };
    HealthClient::new(ch)
        .check(HealthCheckRequest { service: "scd.v1.Scd".into() })
        .await
        .map_or(-1, |h| h.into_inner().status)
}

fn conn(addr: &str, retries: u32) -> Conn {
    Conn::new(addr, None, retries, Signer::new(None, "scd")).unwrap()
}

fn context() -> Vec<pb::Field> {
    let ctx: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(root().join("fixtures/agent_context.json")).unwrap()).unwrap();
    let fields = ctx.get("fields").and_then(|f| f.as_array()).cloned().unwrap_or_default();
    assert!(!fields.is_empty(), "fixtures/agent_context.json has fields");
    fields
        .iter()
        .map(|f| pb::Field {
            name: f["name"].as_str().unwrap().to_string(),
            content: f["content"].as_str().unwrap().to_string(),
            kind: match f["kind"].as_str().unwrap_or("prose") {
                "code" => pb::FieldKind::Code,
                "log" => pb::FieldKind::Log,
                "json" => pb::FieldKind::Json,
                "chat" => pb::FieldKind::Chat,
                "table" => pb::FieldKind::Table,
                _ => pb::FieldKind::Prose,
            } as i32,
            confidential: f["confidential"].as_bool().unwrap_or(false),
        })
        .collect()
}

fn open_request(session: &str, budget: u32) -> pb::CompressRequest {
    pb::CompressRequest {
        task: Some(pb::Task { description: "why did the payment service time out".into(), ..Default::default() }),
        fields: context(),
        requirement: Some(pb::ContextRequirement { max_context_tokens: budget, ..Default::default() }),
        session_id: session.into(),
        ..Default::default()
    }
}

const QUESTIONS: [&str; 4] = [
    "which setting limits the database connection pool",
    "what did the error logs say about retries",
    "who reported the outage in the chat",
    "what code path handles the timeout",
];

/// What one session's client saw.
#[derive(Debug, Default)]
struct Seen {
    chunks: Vec<String>,
    /// Sum of the replies' sent_tokens.
    received: u64,
    /// The server's session total after the last reply.
    server_total: u64,
}

async fn open(c: &mut Conn, session: &str) -> Result<(String, Seen), (tonic::Status, u32)> {
    let req = open_request(session, 160);
    let r = c
        .try_call("Compress", false, |mut cl| {
            let req = req.clone();
            async move { cl.compress(req).await }
        })
        .await?;
    let seen = Seen {
        chunks: r.chunks.iter().map(|c| c.id.clone()).collect(),
        received: u64::from(r.totals.as_ref().map_or(0, |t| t.sent_tokens)),
        server_total: u64::from(r.totals.as_ref().map_or(0, |t| t.sent_tokens)),
    };
    Ok((r.session_token, seen))
}

async fn more(c: &mut Conn, session: &str, token: &str, q: &str, seen: &mut Seen) -> Result<(), (tonic::Status, u32)> {
    let req = pb::ContextRequest {
        session_id: session.into(),
        session_token: token.into(),
        specific_question: q.into(),
        current_confidence: 0.2,
        max_tokens: 60,
        request_id: format!("r-{:032x}", rand::random::<u128>()),
        ..Default::default()
    };
    let r = c
        .try_call("RequestContext", true, |mut cl| {
            let req = req.clone();
            async move { cl.request_context(req).await }
        })
        .await?;
    seen.chunks.extend(r.chunks.iter().map(|c| c.id.clone()));
    seen.received += u64::from(r.sent_tokens);
    seen.server_total = u64::from(r.session_sent_tokens);
    Ok(())
}

// ---------------------------------------------------------------------------
// the tests
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sessions_survive_replicas_behind_haproxy_a_killed_replica_and_a_redis_restart() {
    if !ready() || !have("redis-server") || !have("haproxy") {
        return;
    }
    let dir = scratch("replicas");
    let mut redis = RedisServer::start(&dir, true);
    let a = Replica::start(&dir, "a", &redis.url(), &[]);
    let b = Replica::start(&dir, "b", &redis.url(), &[]);
    let lb = Haproxy::start(&dir, &a, &b);

    // opened on one replica, continued on the other, directly
    let (mut ca, mut cb) = (conn(&a.addr(), 0), conn(&b.addr(), 0));
    let (token, mut seen) = open(&mut ca, "direct").await.unwrap();
    more(&mut cb, "direct", &token, QUESTIONS[0], &mut seen).await.unwrap();
    more(&mut ca, "direct", &token, QUESTIONS[1], &mut seen).await.unwrap();
    let unique: HashSet<&String> = seen.chunks.iter().collect();
    assert_eq!(unique.len(), seen.chunks.len(), "a chunk was sent twice across replicas: {:?}", seen.chunks);
    assert!(seen.chunks.len() > 1);
    assert_eq!(seen.received, seen.server_total, "what the client got is what the ledger counts");
    let wrong = more(&mut cb, "direct", "0123", QUESTIONS[2], &mut Seen::default()).await.unwrap_err().0;
    assert_eq!(wrong.code(), Code::PermissionDenied, "{wrong:?}");

    // A2A: a context compressed through a, its follow-up asked through b
    let (ha, hb) = (format!("127.0.0.1:{}", a.http), format!("127.0.0.1:{}", b.http));
    let a2a_task =
        tokio::task::spawn_blocking(move || a2a_context_on_one_replica_continued_on_the_other(&ha, &hb)).await.unwrap();

    load_through_haproxy_survives_a_replica_killed(&lb, &a, &b).await;

    // Redis restarted with its append-only file: the session is still there
    redis.stop();
    let down = more(&mut cb, "direct", &token, QUESTIONS[2], &mut seen).await.unwrap_err().0;
    assert_eq!(down.code(), Code::Unavailable, "{down:?}");
    assert!(down.message().contains(&redis.url()), "the error names the store: {}", down.message());
    redis.spawn();
    more(&mut cb, "direct", &token, QUESTIONS[3], &mut seen).await.unwrap();
    assert_eq!(seen.received, seen.server_total);
    // and so is the A2A task, on the replica that never ran it
    let hb = format!("127.0.0.1:{}", b.http);
    let got = tokio::task::spawn_blocking(move || crate::a2a::rpc(&hb, "GetTask", serde_json::json!({"id": a2a_task})))
        .await
        .unwrap();
    assert_eq!(got["result"]["status"]["state"], "TASK_STATE_COMPLETED", "{got}");
}

/// A2A: a context compressed through `ha`, its follow-up asked through
/// `hb`, no chunk sent twice. The first task's id.
fn a2a_context_on_one_replica_continued_on_the_other(ha: &str, hb: &str) -> String {
    let first = crate::a2a::rpc(ha, "SendMessage", crate::a2a::compress_message(None));
    let task = &first["result"]["task"];
    assert_eq!(task["status"]["state"], "TASK_STATE_COMPLETED", "{first}");
    let (id, ctx) = (task["id"].as_str().unwrap().to_string(), task["contextId"].as_str().unwrap().to_string());
    let got = crate::a2a::rpc(hb, "GetTask", serde_json::json!({"id": id}));
    assert_eq!(got["result"]["id"], task["id"], "b serves a's task: {got}");
    let q = serde_json::json!({"message": {"messageId": "q-1", "role": "ROLE_USER", "contextId": ctx,
        "parts": [{"text": "Which function acquires the database connection?"}], "metadata": {"currentConfidence": 0.2}}});
    let second = crate::a2a::rpc(hb, "SendMessage", q);
    let t2 = &second["result"]["task"];
    assert_eq!(t2["status"]["state"], "TASK_STATE_COMPLETED", "b continues a's context: {second}");
    assert_eq!(t2["artifacts"][0]["name"], "more-context");
    let sent: Vec<Value> = [task, t2]
        .iter()
        .flat_map(|t| t["artifacts"][0]["parts"][0]["data"]["chunks"].as_array().cloned().unwrap_or_default())
        .map(|c| c["id"].clone())
        .collect();
    assert!(sent.len() > 1 && sent.iter().collect::<HashSet<_>>().len() == sent.len(), "resent: {sent:?}");
    id
}

/// A load of sessions through HAProxy, replica `a` killed with SIGKILL in
/// the middle: every session opened and continued on both replicas
/// survives, with no chunk resent and no reply lost.
async fn load_through_haproxy_survives_a_replica_killed(lb: &Haproxy, a: &Replica, b: &Replica) {
    let wait = Instant::now();
    let mut probe = conn(&lb.addr(), 10);
    while probe.try_call("Info", true, |mut cl| async move { cl.info(pb::InfoRequest {}).await }).await.is_err() {
        assert!(wait.elapsed() < Duration::from_secs(30), "HAProxy never passed a call");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    const SESSIONS: usize = 8;
    let (tx, mut rx) = tokio::sync::mpsc::channel::<()>(SESSIONS);
    // every session's first round done before the kill goes in: a barrier
    // (a Notify would miss a task not yet waiting on it)
    let gate = std::sync::Arc::new(tokio::sync::Barrier::new(SESSIONS + 1));
    let finished = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for s in 0..SESSIONS {
        let (addr, tx, gate, finished) = (lb.addr(), tx.clone(), gate.clone(), finished.clone());
        tasks.push(tokio::spawn(async move {
            let mut c = conn(&addr, 12);
            let id = format!("load-{s}");
            let (token, mut seen) = open(&mut c, &id).await.map_err(|e| format!("open {id}: {:?}", e.0))?;
            more(&mut c, &id, &token, QUESTIONS[0], &mut seen).await.map_err(|e| format!("more {id}: {:?}", e.0))?;
            tx.send(()).await.unwrap();
            gate.wait().await;
            for q in &QUESTIONS[1..] {
                more(&mut c, &id, &token, q, &mut seen).await.map_err(|e| format!("more {id}: {:?}", e.0))?;
            }
            finished.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Ok::<Seen, String>(seen)
        }));
    }
    for _ in 0..SESSIONS {
        rx.recv().await.unwrap();
    }
    let (served_a, served_b) = (a.served("RequestContext"), b.served("RequestContext"));
    assert!(served_a > 0 && served_b > 0, "round robin: a served {served_a}, b {served_b}");
    // every session opened and continued once; now the rest goes on while a dies
    gate.wait().await;
    tokio::time::sleep(Duration::from_millis(30)).await;
    kill9(&a.child);
    let done_at_kill = finished.load(std::sync::atomic::Ordering::SeqCst);
    assert!(done_at_kill < SESSIONS, "the kill came after the load ({done_at_kill} sessions done)");
    let mut survived = 0;
    let mut lost = Vec::new();
    for t in tasks {
        let done = tokio::time::timeout(Duration::from_secs(300), t).await.expect("a session's calls hung");
        match done.unwrap() {
            Ok(seen) => {
                let unique: HashSet<&String> = seen.chunks.iter().collect();
                assert_eq!(unique.len(), seen.chunks.len(), "a chunk was resent: {:?}", seen.chunks);
                assert_eq!(seen.received, seen.server_total, "a reply was lost: the ledger counts more than arrived");
                survived += 1;
            }
            Err(e) => lost.push(e),
        }
    }
    eprintln!(
        "replicas: sessions opened {SESSIONS}, continued across replicas {SESSIONS} (RequestContext served by a: {served_a}, b: {served_b}), survived a kill -9 of replica a (with {} still running): {survived}, lost: {}",
        SESSIONS - done_at_kill,
        lost.len()
    );
    assert!(lost.is_empty(), "sessions lost: {lost:?}");
}

/// REST and A2A through HAProxy's HTTP frontend: a session opened on one
/// replica goes on through the other once the first is killed with
/// SIGKILL, each follow-up with chunks not sent before and the ledger equal
/// to what arrived; an A2A task survives too. With both replicas gone,
/// each frontend answers in its own protocol's shape.
#[test]
fn a_rest_session_through_haproxy_goes_on_through_the_other_replica_after_a_kill_9() {
    if !ready() || !have("redis-server") || !have("haproxy") {
        return;
    }
    let dir = scratch("replicas-rest");
    let redis = RedisServer::start(&dir, false);
    let replicas = [Replica::start(&dir, "a", &redis.url(), &[]), Replica::start(&dir, "b", &redis.url(), &[])];
    let lb = Haproxy::start(&dir, &replicas[0], &replicas[1]);
    lb.wait_http();

    let context: Value =
        serde_json::from_str(&std::fs::read_to_string(root().join("fixtures/agent_context.json")).unwrap()).unwrap();
    let body = serde_json::json!({"task": "Why are customer charges failing at checkout?", "context": context,
                                  "budget": 120, "budget_tokenizer": "cl100k"});
    let (status, first) = lb.post("/v1/compress", None, &body);
    assert_eq!(status, 200, "{first}");
    let (session, token) = (first["session_id"].as_str().unwrap(), first["session_token"].as_str().unwrap());
    let mut seen = chunk_ids(&first);
    let mut received = first["totals"]["sent_tokens"].as_u64().unwrap();
    assert!(!seen.is_empty() && received > 0, "{first}");
    let opened: Vec<u64> = replicas.iter().map(|r| r.served("REST POST /v1/compress")).collect();
    assert_eq!(opened.iter().sum::<u64>(), 1, "one replica opened the session: {opened:?}");
    let (dead, alive) = if opened[0] == 1 { (&replicas[0], &replicas[1]) } else { (&replicas[1], &replicas[0]) };
    let a2a = crate::a2a::rpc(&lb.http_addr(), "SendMessage", crate::a2a::compress_message(None));
    let task = a2a["result"]["task"]["id"].as_str().unwrap_or_else(|| panic!("{a2a}")).to_string();

    // the replica that opened it dies; the first follow-up goes out at once
    // (HAProxy may not have seen it go: its connect is refused, it
    // redispatches), the others after
    kill9_and_wait(dead);
    let more = format!("/v1/sessions/{session}/more");
    for (i, q) in QUESTIONS.iter().enumerate() {
        let ask = serde_json::json!({"question": q, "current_confidence": 0.2, "max_tokens": 60});
        let (status, m) = lb.post(&more, Some(token), &ask);
        assert_eq!(status, 200, "follow-up {i} after the kill: {m}");
        let got = chunk_ids(&m);
        assert!(i > 0 || !got.is_empty(), "the first follow-up after the kill sent nothing: {m}");
        assert!(got.iter().all(|id| !seen.contains(id)), "a chunk sent again: {got:?} after {seen:?}");
        seen.extend(got);
        received += m["sent_tokens"].as_u64().unwrap();
        assert_eq!(Some(received), m["session_sent_tokens"].as_u64(), "the ledger counts what arrived: {m}");
    }
    let followed = alive.served("REST POST /v1/sessions/{session_id}/more");
    assert_eq!(followed, QUESTIONS.len() as u64, "the other replica served every follow-up");
    let got = crate::a2a::rpc(&lb.http_addr(), "GetTask", serde_json::json!({"id": task}));
    assert_eq!(got["result"]["status"]["state"], "TASK_STATE_COMPLETED", "{got}");
    eprintln!("replicas: a REST session through HAProxy went on after a kill -9: {} chunks, none twice", seen.len());

    // no replica left: HAProxy's own errors, REST's shape and gRPC's
    kill9_and_wait(alive);
    let (status, e) = lb.post(&more, Some(token), &serde_json::json!({"question": "any", "current_confidence": 0.2}));
    assert_eq!(status, 503, "{e}");
    let shape = (e["error"]["type"].as_str(), e["error"]["code"].as_str());
    assert_eq!(shape, (Some("service_unavailable"), Some("UNAVAILABLE")), "{e}");
    let info = tokio::runtime::Runtime::new().unwrap().block_on(async {
        conn(&lb.addr(), 0).try_call("Info", true, |mut cl| async move { cl.info(pb::InfoRequest {}).await }).await
    });
    let status = info.unwrap_err().0;
    assert_eq!((status.code(), status.message()), (Code::Unavailable, "no replica available"), "{status:?}");
}

fn chunk_ids(reply: &Value) -> Vec<String> {
    let chunks = reply["chunks"].as_array().unwrap_or_else(|| panic!("no chunks: {reply}"));
    chunks.iter().map(|c| c["id"].as_str().unwrap().to_string()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_redis_session_calls_are_unavailable_and_stateless_ones_go_on() {
    if !ready() || !have("redis-server") {
        return;
    }
    let dir = scratch("redis-down");
    let mut redis = RedisServer::start(&dir, false);
    let r = Replica::start(&dir, "r", &redis.url(), &["--max-sessions", "2", "--session-ttl-s", "2"]);
    let mut c = conn(&r.addr(), 0);

    // the bounds hold in Redis: two sessions at most, the oldest evicted
    let mut tokens = Vec::new();
    for s in ["s1", "s2", "s3"] {
        tokens.push(open(&mut c, s).await.unwrap().0);
    }
    assert_eq!(redis.cli(&["ZCARD", "scd:v1:lru"]), "2");
    let gone = more(&mut c, "s1", &tokens[0], QUESTIONS[0], &mut Seen::default()).await.unwrap_err().0;
    assert_eq!(gone.code(), Code::NotFound, "{gone:?}");
    assert!(gone.message().contains("evicted"), "{}", gone.message());
    // the token itself is never stored
    let stored = redis.cli(&["--no-raw", "DUMP", "scd:v1:lru"]) + &redis.cli(&["KEYS", "*"]);
    assert!(!stored.contains(&tokens[1]), "a session token in Redis");
    // idle past the TTL: expired, and said so
    tokio::time::sleep(Duration::from_millis(2600)).await;
    let expired = more(&mut c, "s2", &tokens[1], QUESTIONS[0], &mut Seen::default()).await.unwrap_err().0;
    assert!(expired.message().contains("expired"), "{}", expired.message());

    let (token, mut seen) = open(&mut c, "kept").await.unwrap();
    redis.stop();
    // gRPC health goes NOT_SERVING; /ready stays 200 (degraded), so a load
    // balancer still sends the stateless calls
    let t = Instant::now();
    while health(&r).await != ServingStatus::NotServing as i32 {
        assert!(t.elapsed() < Duration::from_secs(10), "health stayed SERVING with Redis down");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (code, body) = r.get("/ready");
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("degraded") && body.contains("session store"), "{body}");
    let down = more(&mut c, "kept", &token, QUESTIONS[0], &mut seen).await.unwrap_err().0;
    assert_eq!(down.code(), Code::Unavailable, "{down:?}");
    assert!(down.message().contains(&redis.url()), "{}", down.message());
    let opening = open(&mut c, "new").await.unwrap_err().0;
    assert_eq!(opening.code(), Code::Unavailable, "{opening:?}");
    // stateless calls go on
    let emb = c
        .try_call("Embed", true, |mut cl| async move {
            cl.embed(pb::EmbedRequest {
                texts: vec!["still here".into()],
                kind: pb::InputKind::Query as i32,
                ..Default::default()
            })
            .await
        })
        .await
        .unwrap();
    assert_eq!(emb.embeddings.len(), 1);
    let plain = pb::CompressRequest { session_id: String::new(), ..open_request("", 120) };
    let r2 = c.try_call("Compress", false, |mut cl| {
        let req = plain.clone();
        async move { cl.compress(req).await }
    });
    assert!(!r2.await.unwrap().chunks.is_empty());

    // restarted without persistence: the session is cleanly unknown
    redis.spawn();
    let t = Instant::now();
    while health(&r).await != ServingStatus::Serving as i32 {
        assert!(t.elapsed() < Duration::from_secs(10), "health never came back with Redis");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let unknown = more(&mut c, "kept", &token, QUESTIONS[0], &mut seen).await.unwrap_err().0;
    assert_eq!(unknown.code(), Code::NotFound, "{unknown:?}");
}

#[test]
fn a_corpus_embedded_by_three_workers_one_killed_matches_one_process() {
    if !ready() || !have("redis-server") {
        return;
    }
    let dir = scratch("embed-queue");
    let redis = RedisServer::start(&dir, false);
    // 96 texts of 60 to 250 words, in 8 shards
    let words: Vec<String> =
        std::fs::read_to_string(root().join("README.md")).unwrap().split_whitespace().map(String::from).collect();
    let corpus: String = (0..96)
        .map(|i| {
            let n = 60 + (i * 37) % 190;
            let text: Vec<&str> = (0..n).map(|k| words[(i * 11 + k) % words.len()].as_str()).collect();
            serde_json::json!({"id": i, "text": text.join(" ")}).to_string() + "\n"
        })
        .collect();
    let input = dir.join("corpus.jsonl");
    std::fs::write(&input, corpus).unwrap();
    let scd = |args: &[&str]| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_scd"));
        cmd.current_dir(root())
            .env("SCD_ORT_LIB", root().join(".tools/ort/libonnxruntime.so"))
            .env("SCD_MODELS_DIR", root().join("models/out"))
            .env("SCD_THREADS", "1")
            .args(args);
        cmd
    };
    let common = ["--input", input.to_str().unwrap(), "--block-texts", "12", "--windows"];
    let single = dir.join("single.npy");
    let out = scd(&["embed-batch", "--output", single.to_str().unwrap()]).args(common).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));

    let queued = dir.join("queued.npy");
    let coordinator = scd(&["embed-batch", "--queue", &redis.url(), "--output", queued.to_str().unwrap()])
        .args(common)
        .stderr(std::fs::File::create(dir.join("coordinator.log")).unwrap())
        .spawn()
        .unwrap();
    let workers: Vec<Child> = (1..=3)
        .map(|w| {
            scd(&["embed-worker", "--queue", &redis.url(), "--name", &format!("w{w}"), "--claim-idle-ms", "8000"])
                .stderr(std::fs::File::create(dir.join(format!("w{w}.log"))).unwrap())
                .spawn()
                .unwrap()
        })
        .collect();
    // kill the first worker seen holding a shard (whichever got one first:
    // a worker still loading its model may get none)
    let t = Instant::now();
    let victim = loop {
        let pending = redis.cli(&["XPENDING", "scd:v1:embed:shards", "workers", "-", "+", "10"]);
        if let Some(w) = (1..=3).find(|w| pending.lines().any(|l| l.trim() == format!("w{w}"))) {
            kill9(&workers[w - 1]);
            break w;
        }
        assert!(t.elapsed() < Duration::from_secs(120), "no worker took a shard: {pending}");
        std::thread::sleep(Duration::from_millis(10));
    };
    // still pending after the kill: it died mid-shard (not in the moment
    // between its acknowledgement and our look)
    std::thread::sleep(Duration::from_millis(200));
    let held = redis
        .cli(&["XPENDING", "scd:v1:embed:shards", "workers", "-", "+", "10"])
        .lines()
        .any(|l| l.trim() == format!("w{victim}"));
    let mut coordinator = coordinator;
    let status = coordinator.wait().unwrap();
    let log = std::fs::read_to_string(dir.join("coordinator.log")).unwrap();
    for mut w in workers {
        let _ = w.kill();
        let _ = w.wait();
    }
    assert!(status.success(), "coordinator: {log}");
    assert_eq!(std::fs::read(&queued).unwrap(), std::fs::read(&single).unwrap(), "rows differ from one process");
    let reclaimed: String = (1..=3)
        .filter(|&w| w != victim)
        .map(|w| std::fs::read_to_string(dir.join(format!("w{w}.log"))).unwrap())
        .collect();
    assert!(!held || reclaimed.contains("reclaimed shard"), "no worker took over w{victim}'s shard: {reclaimed}");
    assert!(log.contains("embedded 96 texts"), "{log}");
    eprintln!(
        "embed queue: 96 texts in 8 shards over 3 workers, w{victim} killed mid-shard, output identical to one process"
    );
}
