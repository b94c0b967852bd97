//! The audit trail: a record survives `kill -9` of the real server, the
//! `Audit` RPC filters and refuses what it should (reads need the
//! operator's token or the caller's own identity), `scd audit --db` refuses
//! a file a server holds, concurrent calls lose no record, and refused calls
//! cost no fsync each.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use scd_audit::{AuditLevel, AuditLog, AuditRecord, Retention};
use scd_service::app::Limits;
use scd_service::grpc::audit::{AuditAccess, AUDIT_TOKEN_HEADER};
use scd_service::grpc::pb;
use scd_service::grpc::pb::scd_client::ScdClient;
use tokio_stream::StreamExt;
use tonic::transport::Channel;
use tonic::Code;

use crate::{ready, root, scd, scratch};

const SECRET: &str = "sk-live-AUDIT-CANARY-7f3a9c";

/// The operator's token of the tests' servers.
const TOKEN: &str = "op-token-3b9f2c71d04e8a65";

/// A token file holding `token`, mode 0600 (what `--audit-token-file` wants).
fn token_file(dir: &Path, name: &str, token: &str) -> std::path::PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, format!("{token}\n")).unwrap();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    path
}

/// A context with one confidential field whose content must never be stored.
fn compress_request(session: &str) -> pb::CompressRequest {
    let field = |name: &str, content: &str, confidential| pb::Field {
        name: name.into(),
        kind: pb::FieldKind::Prose as i32,
        content: content.into(),
        confidential,
    };
    pb::CompressRequest {
        task: Some(pb::Task { description: "Why do checkout charges time out?".into(), ..Default::default() }),
        fields: vec![
            field(
                "incident",
                "The payment service cannot get a database connection: the pool is exhausted at 32.\n\n\
                 Charges time out after 30 seconds and the checkout page spins.\n\n\
                 The newsletter font was changed to serif last week.",
                false,
            ),
            field("api_keys", &format!("stripe: {SECRET}"), true),
        ],
        requirement: Some(pb::ContextRequirement { max_context_tokens: 200, ..Default::default() }),
        session_id: session.into(),
        ..Default::default()
    }
}

// ---------------------------------------------------------------------------
// The real server, killed with SIGKILL
// ---------------------------------------------------------------------------

/// `scd serve` on a free port with `args`; kills it (SIGKILL) when dropped.
struct Server {
    child: Child,
    port: u16,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn serve(log: &Path, args: &[&str]) -> Server {
    let mut child = Command::new(env!("CARGO_BIN_EXE_scd"))
        .current_dir(root())
        .env("SCD_ORT_LIB", root().join(".tools/ort/libonnxruntime.so"))
        .env("SCD_MODELS_DIR", root().join("models/out"))
        // the persistent embedding cache is tested on its own
        .env("SCD_EMBEDDING_CACHE", "off")
        .env("SCD_THREADS", "2")
        .args(["serve", "--addr", "127.0.0.1:0"])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let port = loop {
        let line = lines.next().unwrap_or_else(|| panic!("server exited: {}", std::fs::read_to_string(log).unwrap()));
        if let Some(a) = line.unwrap().strip_prefix("listening on ") {
            break a.rsplit(':').next().unwrap().parse().unwrap();
        }
    };
    Server { child, port }
}

async fn connect(port: u16) -> ScdClient<Channel> {
    let addr = format!("http://127.0.0.1:{port}");
    for _ in 0..600 {
        if let Ok(ch) = Channel::from_shared(addr.clone()).unwrap().connect().await {
            let mut c = ScdClient::new(ch);
            if c.info(pb::InfoRequest {}).await.is_ok() {
                return c;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("server never answered");
}

fn json_lines(out: &str) -> Vec<serde_json::Value> {
    out.lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}"))).collect()
}

#[test]
fn a_record_survives_kill_9_and_scd_audit_db_refuses_a_held_file() {
    if !ready() {
        return;
    }
    let dir = scratch("audit-kill9");
    let db = dir.join("audit.redb");
    let db_s = db.to_str().unwrap();
    let tokens = token_file(&dir, "operator.token", TOKEN);
    let tokens_s = tokens.to_str().unwrap();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let mut server = serve(&dir.join("first.log"), &["--audit-db", db_s, "--audit-level", "chunks"]);
    let reply = rt.block_on(async {
        let mut c = connect(server.port).await;
        c.compress(compress_request("")).await.unwrap().into_inner()
    });
    assert!(!reply.chunks.is_empty());
    assert_eq!(reply.withheld_fields, ["api_keys"]);

    // While the server holds the file, --db is refused and names it.
    let (ok, out, err) = scd(&["audit", "--db", db_s], "");
    assert!(!ok && out.is_empty(), "{out}");
    assert!(err.contains(&format!("--db {db_s}: the audit database is open in another process")), "stderr: {err}");

    // kill -9: no drain, no clean close.
    server.child.kill().unwrap();
    server.child.wait().unwrap();
    drop(server);

    let server = serve(
        &dir.join("second.log"),
        &["--audit-db", db_s, "--audit-level", "chunks", "--audit-token-file", tokens_s],
    );
    rt.block_on(connect(server.port));
    let addr = format!("http://127.0.0.1:{}", server.port);
    // anonymous and without the token, nothing is read; a wrong token is not echoed
    let (ok, out, err) = scd(&["audit", "--server", &addr], "");
    assert!(!ok && out.is_empty(), "{out}");
    assert!(err.contains("Audit: PermissionDenied: audit: an anonymous caller may not read the audit trail"), "{err}");
    let wrong = token_file(&dir, "wrong.token", "not-the-operator-token");
    let (ok, out, err) = scd(&["audit", "--server", &addr, "--audit-token-file", wrong.to_str().unwrap()], "");
    assert!(!ok && out.is_empty(), "{out}");
    assert!(err.contains("Audit: Unauthenticated: x-scd-audit-token: does not match"), "{err}");
    assert!(!err.contains("not-the-operator-token"), "{err}");
    let (ok, out, err) = scd(&["audit", "--server", &addr, "--audit-token-file", tokens_s], "");
    assert!(ok, "{err}");
    let records = json_lines(&out);
    assert_eq!(records.len(), 1, "{out}");
    let r = &records[0];
    assert_eq!(
        (r["method"].as_str(), r["outcome"].as_str(), r["level"].as_str()),
        (Some("gRPC Compress"), Some("ok"), Some("chunks"))
    );
    let ids: Vec<&str> = r["chunks"].as_array().unwrap().iter().map(|c| c["id"].as_str().unwrap()).collect();
    let sent: Vec<&str> = reply.chunks.iter().map(|c| c.id.as_str()).collect();
    assert_eq!(ids, sent, "the recorded chunk ids are the ones the reply carried");
    assert_eq!(r["chunk_count"], sent.len());
    assert_eq!(r["withheld"], serde_json::json!(["api_keys"]));
    assert_eq!(r["selected_tokens"], reply.totals.as_ref().unwrap().sent_tokens);
    assert_eq!(r["budget_tokens"], 200);
    assert_eq!(r["task"], "Why do checkout charges time out?");
    assert!(r["peer"].as_str().unwrap().starts_with("127.0.0.1:"));
    assert!(r["model"].as_str().is_some_and(|m| !m.is_empty()));
    assert!(!out.contains(SECRET));
    drop(server);

    // The confidential content is nowhere in the database file.
    let bytes = std::fs::read(&db).unwrap();
    assert!(!bytes.windows(SECRET.len()).any(|w| w == SECRET.as_bytes()), "the secret reached the audit db");
    assert!(bytes.windows(8).any(|w| w == b"api_keys"), "the withheld name is stored");

    // With no server holding it, --db reads the same record.
    let (ok, out, err) = scd(&["audit", "--db", db_s, "--since", "1h", "--limit", "5"], "");
    assert!(ok, "{err}");
    assert_eq!(json_lines(&out)[0]["chunks"], r["chunks"]);
}

#[test]
fn serve_checks_audit_flags_before_loading_the_model() {
    let dir = scratch("audit-args");
    let db = dir.join("a.redb");
    let db_s = db.to_str().unwrap();
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["--audit-level", "loud"], "invalid value 'loud' for '--audit-level <AUDIT_LEVEL>'"),
        (vec!["--audit-db", db_s, "--audit-max-age", "7y"], "invalid value '7y' for '--audit-max-age <AUDIT_MAX_AGE>'"),
        (vec!["--audit-max-age", "7d"], "--audit-max-age: needs --audit-db"),
        (vec!["--audit-db", db_s, "--audit-max-bytes", "0"], "--audit-max-bytes 0: must be at least 1"),
    ];
    let good = token_file(&dir, "good.token", TOKEN);
    let short = token_file(&dir, "short.token", "too-short");
    let empty = token_file(&dir, "empty.token", " \n");
    let open = token_file(&dir, "open.token", TOKEN);
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o644)).unwrap();
    }
    let (good, short, empty, open) =
        (good.to_str().unwrap(), short.to_str().unwrap(), empty.to_str().unwrap(), open.to_str().unwrap());
    let short_err = format!("--audit-token-file {short}: the token is 9 bytes, shorter than 16");
    let empty_err = format!("--audit-token-file {empty}: empty");
    let open_err = format!("--audit-token-file {open}: mode 0644 lets others read the token (limit 0600");
    let mut cases = cases;
    cases.push((vec!["--audit-token-file", good], "--audit-token-file: needs --audit-db"));
    cases.push((vec!["--audit-db", db_s, "--audit-token-file", short], &short_err));
    cases.push((vec!["--audit-db", db_s, "--audit-token-file", empty], &empty_err));
    #[cfg(unix)]
    cases.push((vec!["--audit-db", db_s, "--audit-token-file", open], &open_err));
    for (args, want) in cases {
        let mut all = vec!["--ort-lib", "/nonexistent/libonnxruntime.so", "serve", "--addr", "127.0.0.1:0"];
        all.extend(&args);
        let (ok, _, err) = scd(&all, "");
        assert!(!ok, "{args:?} was accepted");
        assert!(err.contains(want), "{args:?}: {err}");
    }
    let (ok, _, err) = scd(&["audit", "--db", dir.join("none.redb").to_str().unwrap()], "");
    assert!(!ok);
    assert!(err.contains("none.redb: no such file"), "{err}");
}

// ---------------------------------------------------------------------------
// In-process server over the hash encoder
// ---------------------------------------------------------------------------

struct InProc {
    client: ScdClient<Channel>,
    _server: crate::inproc::InProc,
}

/// An in-process server over `audit` whose operator token is [`TOKEN`].
async fn start(audit: Option<Arc<AuditLog>>) -> InProc {
    let limits = Limits { max_concurrent_compress: 64, ..crate::inproc::limits() };
    let audit_access = AuditAccess::with_operator_token(TOKEN);
    let s = crate::inproc::start(crate::inproc::Options { limits, audit, audit_access, ..Default::default() });
    let port: u16 = s.grpc.rsplit(':').next().unwrap().parse().unwrap();
    InProc { client: connect(port).await, _server: s }
}

/// `r` with `x-scd-audit-token: token` (none when `None`).
fn with_token(r: pb::AuditRequest, token: Option<&str>) -> tonic::Request<pb::AuditRequest> {
    let mut r = tonic::Request::new(r);
    if let Some(t) = token {
        r.metadata_mut().insert(AUDIT_TOKEN_HEADER, t.parse().unwrap());
    }
    r
}

/// The records `r` reads, as the operator.
async fn audit(c: &mut ScdClient<Channel>, r: pb::AuditRequest) -> Result<Vec<pb::AuditRecordMsg>, tonic::Status> {
    audit_as(c, r, Some(TOKEN)).await
}

async fn audit_as(
    c: &mut ScdClient<Channel>,
    r: pb::AuditRequest,
    token: Option<&str>,
) -> Result<Vec<pb::AuditRecordMsg>, tonic::Status> {
    let mut s = c.audit(with_token(r, token)).await?.into_inner();
    let mut out = Vec::new();
    while let Some(m) = s.next().await {
        out.push(m?);
    }
    Ok(out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn audit_rpc_filters_refuses_and_records_every_call() {
    let dir = tempfile::tempdir().unwrap();
    let log = Arc::new(AuditLog::open(&dir.path().join("a.redb"), AuditLevel::Summary, Retention::default()).unwrap());
    let mut s = start(Some(log.clone())).await;

    // Concurrent calls: every one recorded, none lost.
    let calls: Vec<_> = (0..40)
        .map(|i| {
            let mut c = s.client.clone();
            tokio::spawn(async move { c.compress(compress_request(&format!("s{i}"))).await.unwrap() })
        })
        .collect();
    for c in calls {
        c.await.unwrap();
    }
    // A session call and a refused one.
    let open = s.client.compress(compress_request("more")).await.unwrap().into_inner();
    let more = pb::ContextRequest {
        session_id: "more".into(),
        session_token: open.session_token.clone(),
        specific_question: "What is the pool size?".into(),
        current_confidence: 0.2,
        ..Default::default()
    };
    s.client.request_context(more).await.unwrap();
    let bad = pb::ContextRequest { session_id: "more".into(), session_token: "wrong".into(), ..Default::default() };
    let refused = s.client.request_context(bad).await.unwrap_err();

    let all = audit(&mut s.client, pb::AuditRequest::default()).await.unwrap();
    assert_eq!(all.len(), 43, "40 concurrent + 1 + 2 RequestContext");
    let mut seqs: Vec<u64> = all.iter().map(|r| r.seq).collect();
    seqs.dedup();
    assert_eq!(seqs, (0..43).collect::<Vec<_>>());
    assert!(all.iter().all(|r| r.level == "summary" && r.chunks.is_empty()), "summary keeps no chunk list");
    let compresses: Vec<_> = all.iter().filter(|r| r.method == "gRPC Compress").collect();
    assert_eq!(compresses.len(), 41);
    assert!(compresses.iter().all(|r| r.chunk_count > 0 && r.withheld == ["api_keys"] && r.outcome == "ok"));
    let last = &all[42];
    assert_eq!((last.method.as_str(), last.outcome.clone()), ("gRPC RequestContext", format!("{:?}", refused.code())));

    let by_session =
        audit(&mut s.client, pb::AuditRequest { session_id: "s1".into(), ..Default::default() }).await.unwrap();
    assert_eq!(by_session.len(), 1);
    assert_eq!(by_session[0].session_id, "s1");
    let more = audit(&mut s.client, pb::AuditRequest { session_id: "more".into(), limit: 2, ..Default::default() })
        .await
        .unwrap();
    assert_eq!(more.iter().map(|r| r.method.as_str()).collect::<Vec<_>>(), ["gRPC Compress", "gRPC RequestContext"]);
    let t = all[0].at_ms;
    let late = audit(&mut s.client, pb::AuditRequest { since_ms: all[42].at_ms, ..Default::default() }).await.unwrap();
    assert!(late.iter().all(|r| r.at_ms >= all[42].at_ms) && !late.is_empty());
    let none = audit(&mut s.client, pb::AuditRequest { until_ms: t - 1, ..Default::default() }).await.unwrap();
    assert!(none.is_empty());
    let nobody =
        audit(&mut s.client, pb::AuditRequest { caller: "did:key:nobody".into(), ..Default::default() }).await.unwrap();
    assert!(nobody.is_empty(), "anonymous calls record no caller");

    let err =
        audit(&mut s.client, pb::AuditRequest { since_ms: 10, until_ms: 5, ..Default::default() }).await.unwrap_err();
    assert_eq!((err.code(), err.message()), (Code::InvalidArgument, "since_ms: 10 is after until_ms 5"));

    // The RPC streams what the log holds.
    let a: Vec<AuditRecord> = log.query(&Default::default()).unwrap();
    assert_eq!(a.iter().map(|r| r.seq).collect::<Vec<_>>(), seqs);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn audit_without_a_db_is_failed_precondition() {
    let mut s = start(None).await;
    s.client.compress(compress_request("")).await.unwrap();
    let err = audit(&mut s.client, pb::AuditRequest::default()).await.unwrap_err();
    assert_eq!((err.code(), err.message()), (Code::FailedPrecondition, "audit: the server runs without --audit-db"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn audit_reads_need_the_operator_token_or_an_identity() {
    let dir = tempfile::tempdir().unwrap();
    let log = Arc::new(AuditLog::open(&dir.path().join("a.redb"), AuditLevel::Summary, Retention::default()).unwrap());
    let mut s = start(Some(log)).await;
    s.client.compress(compress_request("mine")).await.unwrap();

    // anonymous, no token: refused, saying what to do
    let err = audit_as(&mut s.client, pb::AuditRequest::default(), None).await.unwrap_err();
    assert_eq!(
        (err.code(), err.message()),
        (
            Code::PermissionDenied,
            "audit: an anonymous caller may not read the audit trail: present x-scd-audit-token \
             (the operator's token, from --audit-token-file), or call with a verified identity \
             (a TLS client certificate, or a DID under --auth did-wba) to read your own records"
        )
    );
    // naming a caller does not help
    let ask = pb::AuditRequest { caller: "did:key:someone".into(), ..Default::default() };
    assert_eq!(audit_as(&mut s.client, ask, None).await.unwrap_err().code(), Code::PermissionDenied);

    // a wrong token: UNAUTHENTICATED, never echoed
    let wrong = "op-token-3b9f2c71d04e8a66";
    let err = audit_as(&mut s.client, pb::AuditRequest::default(), Some(wrong)).await.unwrap_err();
    assert_eq!((err.code(), err.message()), (Code::Unauthenticated, "x-scd-audit-token: does not match"));
    assert!(!format!("{err:?}").contains(wrong), "{err:?}");
    let err = audit_as(&mut s.client, pb::AuditRequest::default(), Some(&TOKEN[..16])).await.unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated, "a prefix of the token is wrong");

    // the operator reads everything, and may name any caller
    let all = audit(&mut s.client, pb::AuditRequest::default()).await.unwrap();
    assert_eq!(all.iter().map(|r| r.session_id.as_str()).collect::<Vec<_>>(), ["mine"]);
    let ask = pb::AuditRequest { caller: "did:key:someone".into(), ..Default::default() };
    assert!(audit(&mut s.client, ask).await.unwrap().is_empty());

    // a server without an operator token refuses any token
    let dir2 = tempfile::tempdir().unwrap();
    let log2 =
        Arc::new(AuditLog::open(&dir2.path().join("a.redb"), AuditLevel::Summary, Retention::default()).unwrap());
    let limits = Limits { max_concurrent_compress: 64, ..crate::inproc::limits() };
    let plain = crate::inproc::start(crate::inproc::Options { limits, audit: Some(log2), ..Default::default() });
    let port: u16 = plain.grpc.rsplit(':').next().unwrap().parse().unwrap();
    let mut c = connect(port).await;
    let err = audit(&mut c, pb::AuditRequest::default()).await.unwrap_err();
    assert_eq!(
        (err.code(), err.message()),
        (
            Code::Unauthenticated,
            "x-scd-audit-token: this server has no operator token (it runs without --audit-token-file)"
        )
    );
    assert_eq!(audit_as(&mut c, pb::AuditRequest::default(), None).await.unwrap_err().code(), Code::PermissionDenied);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_calls_are_recorded_without_an_fsync_each() {
    let dir = tempfile::tempdir().unwrap();
    let log = Arc::new(AuditLog::open(&dir.path().join("a.redb"), AuditLevel::Summary, Retention::default()).unwrap());
    let mut s = start(Some(log.clone())).await;
    let open = s.client.compress(compress_request("sess")).await.unwrap().into_inner();
    assert!(!open.session_token.is_empty());
    let before = log.durable_commits();
    const N: usize = 40;
    for _ in 0..N {
        let bad = pb::ContextRequest { session_id: "sess".into(), session_token: "wrong".into(), ..Default::default() };
        assert_eq!(s.client.request_context(bad).await.unwrap_err().code(), Code::PermissionDenied);
        let empty = pb::ContextRequest::default();
        assert_eq!(s.client.request_context(empty).await.unwrap_err().code(), Code::InvalidArgument);
    }
    let fsyncs = log.durable_commits() - before;
    // at most one durable commit per second of refusals (the deferred window)
    assert!(fsyncs <= 3, "{} refused calls cost {fsyncs} fsyncs", 2 * N);
    // every refusal is still counted, and readable at once; repeats within a
    // window are merged into one record per kind (one per window: a slow
    // machine may see a window close mid-loop)
    let all = audit(&mut s.client, pb::AuditRequest::default()).await.unwrap();
    let records = |o: &str| all.iter().filter(|r| r.outcome == o).count();
    let calls = |o: &str| all.iter().filter(|r| r.outcome == o).map(|r| r.count as usize).sum::<usize>();
    assert_eq!((calls("ok"), calls("PermissionDenied"), calls("InvalidArgument")), (1, N, N));
    let windows = 1 + fsyncs as usize;
    assert!(records("PermissionDenied") <= windows && records("InvalidArgument") <= windows, "{all:?}");
    assert!(all.len() <= 1 + 2 * windows, "{} refused calls made {} records", 2 * N, all.len() - 1);
    // a successful call is durable at once (and makes the refusals before it durable)
    s.client.compress(compress_request("")).await.unwrap();
    assert!(log.durable_commits() > before + fsyncs);
}

// ---------------------------------------------------------------------------
// ATP: a delegation records its context transfer in the planner's store
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_atp_delegation_records_its_transfer_in_the_node_store() {
    use scd_atp::agent::{AgentConfig, Node};
    use scd_atp::identity::{DidResolver, Identity, Verifier};
    use scd_atp::planner::{Job, Outcome, Planner};
    use scd_atp::store::{Ledger, Store};

    if !ready() {
        return;
    }
    let scd = crate::grpc::start(&[]);
    crate::grpc::client(&scd).await;
    let dir = scratch("audit-atp");
    let worker =
        crate::atp::spawn_agent_with_scd(&dir.join("w"), &scd.addr, &["--capability", "analysis:0.9:300:0.01"]);

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let identity = Identity::load_or_create(&dir.join("planner.json")).unwrap();
    let store = Arc::new(Store::open(&dir.join("planner")).unwrap());
    let log = Arc::new(store.audit_log(AuditLevel::Chunks, Retention::default()).unwrap());
    let resolver: Arc<dyn scd_atp::identity::Resolver> = Arc::new(DidResolver::new());
    let verifier = Verifier::new(resolver.clone(), store.clone());
    let ledger = Ledger::open(store, identity.did(), Default::default(), resolver).unwrap();
    let node = Node::new(identity, verifier, ledger, AgentConfig::new(vec![], url, scd.addr.clone()));
    assert!(node.set_audit(log.clone()));
    tokio::spawn(scd_atp::agent::serve(node.clone(), listener, std::future::pending()));
    let planner = Planner::new(node.clone(), &[worker.url()]).unwrap();

    let context = scd_atp::context::ContextFile::load(&root().join("fixtures/atp_demo_context.json")).unwrap();
    let job = Job {
        task_id: "audited-1".into(),
        task_type: scd_atp::pb::TaskType::Analysis,
        task: scd_atp::context::Task::new("Why were cards charged twice after gateway timeouts?"),
        order: scd_atp::agent::WorkOrder { title: "audited".into(), steps: 1, needs: vec![], fail: None },
        context,
        qos: scd_atp::pb::QoSConstraints { min_quality: 0.5, max_latency_ms: 20_000, max_cost: 1.0, min_trust: 0.0 },
    };
    let outcome = planner.run(&job).await.unwrap();
    assert!(matches!(outcome, Outcome::Completed { .. }), "{outcome:?}");

    let records = log.query(&Default::default()).unwrap();
    assert_eq!(records.len(), 1, "{records:#?}");
    let r = &records[0];
    assert_eq!(r.method, "AtpTransfer");
    assert_eq!((r.caller.as_deref(), r.peer.as_deref()), (Some(node.did()), Some(worker.did.as_str())));
    assert_eq!(r.withheld, ["gateway_credentials"]);
    assert!(r.chunk_count > 0 && r.chunks.len() == r.chunk_count as usize);
    assert!(r.chunks.iter().all(|c| c.field != "gateway_credentials"));
    assert!(r.selected_tokens > 0 && r.context_tokens >= r.selected_tokens);
    assert_eq!(r.task.as_deref(), Some("Why were cards charged twice after gateway timeouts?"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn audit_streams_are_bounded_and_a_closed_one_frees_its_place() {
    let dir = tempfile::tempdir().unwrap();
    let log = Arc::new(AuditLog::open(&dir.path().join("a.redb"), AuditLevel::Summary, Retention::default()).unwrap());
    // A stream nobody reads keeps its place only while the server cannot
    // finish it: the records must overflow the channel (256 records) and
    // HTTP/2's windows (hyper's client grants 2 MiB a stream, 5 MiB a
    // connection). 1,000 records of ~10 KB are ~10 MB.
    const N: usize = 1000;
    let records: Vec<AuditRecord> = (0..N)
        .map(|i| AuditRecord {
            withheld: (0..100).map(|j| format!("{i:04}-{j:03}-{}", "w".repeat(92))).collect(),
            ..AuditRecord::new("Compress")
        })
        .collect();
    log.append_async(records).await.unwrap();
    let s = start(Some(log)).await;
    // each stream on its own connection: unread streams that share one
    // would hold its connection window and stall the one read to its end
    let port: u16 = s._server.grpc.rsplit(':').next().unwrap().parse().unwrap();
    let mut open = Vec::new();
    for _ in 0..scd_service::grpc::audit::MAX_AUDIT_STREAMS {
        let all = with_token(pb::AuditRequest::default(), Some(TOKEN));
        open.push(connect(port).await.audit(all).await.unwrap().into_inner());
    }
    let e = s.client.clone().audit(with_token(pb::AuditRequest::default(), Some(TOKEN))).await.unwrap_err();
    assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
    assert!(e.message().starts_with("audit: 4 Audit streams are reading (the limit)"), "{}", e.message());
    assert_eq!(e.metadata().get("retry-after-ms").unwrap(), "1000");
    // a stream read to its end gives its place back
    let mut first = open.remove(0);
    let mut n = 0;
    while let Some(r) = first.next().await {
        r.unwrap();
        n += 1;
    }
    assert_eq!(n, N);
    let mut again = None;
    for _ in 0..100 {
        match s.client.clone().audit(with_token(pb::AuditRequest { limit: 1, ..Default::default() }, Some(TOKEN))).await
        {
            Ok(st) => {
                again = Some(st);
                break;
            }
            Err(e) => {
                assert_eq!(e.code(), Code::ResourceExhausted);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
    assert!(again.is_some(), "a finished stream frees its place");
}

// ---------------------------------------------------------------------------
// Refused calls cannot flush the trail (issue 43, High 2)
// ---------------------------------------------------------------------------

/// An anonymous client sending refused calls (a budget over the limit, a
/// wrong session token) with a fresh connection and a distinct session id
/// each, over REST and gRPC,
/// cannot evict another caller's successful record, whatever the cap: its
/// records merge, and stay within their share of the cap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_calls_cannot_flush_a_successful_calls_record() {
    let dir = tempfile::tempdir().unwrap();
    let max = 60_000;
    let retention = Retention { max_age: None, max_bytes: Some(max) };
    let log = Arc::new(AuditLog::open(&dir.path().join("a.redb"), AuditLevel::Summary, retention).unwrap());
    let mut s = start(Some(log.clone())).await;
    let victim = s.client.compress(compress_request("victim")).await.unwrap().into_inner();
    assert!(!victim.session_token.is_empty());
    let http = s._server.http;
    const N: usize = 150;
    for i in 0..N {
        let body = serde_json::json!({
            "task": "t",
            "context": {"fields": [{"name": "notes", "kind": "prose", "content": "a b c"}]},
            "budget": 2_000_000,
            "session": format!("flood-{i}-{}", "y".repeat(100)),
        });
        let headers = [("Host", "scd")];
        let raw =
            super::a2a::request_from("127.0.0.2", http, &headers, "POST", "/v1/compress", &body.to_string()).await;
        let (status, text) = super::a2a::parse_response(&raw);
        assert!((400..500).contains(&status), "{status} {text}");
        let mut req = compress_request("victim");
        req.session_token = format!("wrong-{i}");
        assert!(s.client.compress(req).await.is_err());
        let mut req = compress_request(&format!("grpc-{i}-{}", "z".repeat(100)));
        req.requirement.as_mut().unwrap().max_context_tokens = 2_000_000;
        assert!(s.client.compress(req).await.is_err());
    }
    let all = audit(&mut s.client, pb::AuditRequest::default()).await.unwrap();
    let ok: Vec<_> = all.iter().filter(|r| r.outcome == "ok").collect();
    assert_eq!(ok.len(), 1, "the successful call's record was evicted: {} records kept", all.len());
    assert_eq!(ok[0].session_id, "victim");
    let (_, refused_bytes) = log.refused_stats().unwrap();
    assert!(refused_bytes <= max / scd_audit::REFUSED_PARTS, "{refused_bytes} bytes of refused records");
    // the calls merged: far fewer records than calls, none over the id bound
    assert!(all.len() < N / 2, "{} records for {} refused calls", all.len(), 3 * N);
    assert!(all.iter().all(|r| r.session_id.len() <= scd_audit::MAX_ID_BYTES && r.peer.len() <= 64));
}

/// REST and A2A calls are audited under their surface and the core's
/// method: a REST compress opening a session, one continuing it and a
/// request for more; an A2A compress message and a question in its context
/// (in-process server over the hash encoder: no model needed).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rest_and_a2a_calls_are_audited_by_surface_and_method() {
    use serde_json::json;
    let dir = tempfile::tempdir().unwrap();
    let log = Arc::new(AuditLog::open(&dir.path().join("a.redb"), AuditLevel::Summary, Retention::default()).unwrap());
    let s = crate::inproc::start(crate::inproc::Options { audit: Some(log.clone()), ..Default::default() });
    crate::inproc::wait_serving(&s).await;
    let ctx = json!({"fields": [{"name": "notes", "kind": "prose", "content":
        "The pool is exhausted. Charges time out. The newsletter font is small. The database has 32 connections."}]});
    let body = json!({"task": "Why do charges fail?", "context": ctx, "budget": 12, "session": "rest-s"});
    let (status, first) = crate::rest::call("127.0.0.1", s.http, "POST", "/v1/compress", None, &body).await;
    assert_eq!(status, 200, "{first}");
    let token = first["session_token"].as_str().unwrap().to_string();
    let (status, r) = crate::rest::call("127.0.0.1", s.http, "POST", "/v1/compress", Some(&token), &body).await;
    assert_eq!(status, 200, "{r}");
    let more = json!({"question": "How many connections?", "current_confidence": 0.2});
    let path = "/v1/sessions/rest-s/more";
    let (status, r) = crate::rest::call("127.0.0.1", s.http, "POST", path, Some(&token), &more).await;
    assert_eq!(status, 200, "{r}");

    let addr = s.http.to_string();
    let replies = tokio::task::spawn_blocking(move || {
        let r1 = crate::a2a::rpc(&addr, "SendMessage", crate::a2a::compress_message(Some("a2a-ctx")));
        let q = json!({"message": {"messageId": "m-2", "role": "ROLE_USER", "contextId": "a2a-ctx",
            "parts": [{"text": "Which function acquires the connection?"}], "metadata": {"currentConfidence": 0.2}}});
        (r1, crate::a2a::rpc(&addr, "SendMessage", q))
    })
    .await
    .unwrap();
    for r in [&replies.0, &replies.1] {
        assert_eq!(r["result"]["task"]["status"]["state"], "TASK_STATE_COMPLETED", "{r}");
    }

    let records = log.query(&Default::default()).unwrap();
    let named: Vec<(&str, &str)> = records.iter().map(|r| (r.method.as_str(), r.outcome.as_str())).collect();
    assert_eq!(
        named,
        [
            ("REST OpenSession", "ok"),
            ("REST Compress", "ok"),
            ("REST RequestContext", "ok"),
            ("A2A OpenSession", "ok"),
            ("A2A RequestContext", "ok"),
        ]
    );
    assert!(records[..3].iter().all(|r| r.session_id.as_deref() == Some("rest-s")), "{records:?}");
    assert_eq!(records[2].task.as_deref(), Some("How many connections?"));
    assert_eq!(records[4].task.as_deref(), Some("Which function acquires the connection?"));
    assert_eq!(records[3].session_id, records[4].session_id, "the question asks the message's session");
    assert!(records.iter().all(|r| r.peer.as_deref().is_some_and(|p| p.starts_with("127.0.0.1:"))), "{records:?}");
}
