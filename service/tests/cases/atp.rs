//! The ATP agent end to end: `scd atp agent` processes driven by an
//! in-process requester built from `scd-atp`, the restart test, the agent's
//! refusals, TLS, and the helpers the other `atp_*` files share (the
//! planner's tests are in `atp_planner.rs`, the tools' in `atp_tools.rs`).

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use scd_atp::agent::WorkOrder;
use scd_atp::handshake::{self, Offer};
use scd_atp::identity::{DidResolver, Identity, MemoryNonceLog, SignMessages as _, Verifier};
use scd_atp::pb;
use scd_atp::pb::atp_service_client::AtpServiceClient;
use tonic::transport::Channel;
use tonic::Code;

/// An `scd atp agent` process, killed when dropped.
pub(crate) struct AgentProc {
    pub(crate) child: Child,
    pub(crate) did: String,
    pub(crate) addr: String,
    /// Where it serves its DID document (with --http-addr).
    pub(crate) http: Option<String>,
    /// Its atp.v1 URL (https:// with --tls-cert).
    pub(crate) url: String,
}

impl Drop for AgentProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl AgentProc {
    pub(crate) fn url(&self) -> String {
        self.url.clone()
    }
}

/// Starts `scd atp agent` with its identity and store in `dir` and waits
/// for its ready line `{"event":"ready","did":…,"addr":…}`; the rest of its
/// stdout is drained, its stderr goes to `dir/agent.stderr`.
pub(crate) fn spawn_agent(dir: &Path, args: &[&str]) -> AgentProc {
    spawn_agent_with_scd(dir, "http://127.0.0.1:1", args)
}

/// [`spawn_agent`] with the SCD URL it would delegate through.
pub(crate) fn spawn_agent_with_scd(dir: &Path, scd: &str, args: &[&str]) -> AgentProc {
    std::fs::create_dir_all(dir).unwrap();
    let stderr_path = dir.join("agent.stderr");
    let mut child = Command::new(env!("CARGO_BIN_EXE_scd"))
        .args(["atp", "agent", "--addr", "127.0.0.1:0", "--scd", scd, "--identity"])
        .arg(dir.join("id.json"))
        .arg("--store")
        .arg(dir.join("store"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&stderr_path).unwrap())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut reader = BufReader::new(stdout);
        let mut line = String::new();
        let _ = reader.read_line(&mut line);
        let _ = tx.send(line);
        let _ = std::io::copy(&mut reader, &mut std::io::sink());
    });
    // a guard against a hung start, not a timing assertion
    let line = rx.recv_timeout(Duration::from_secs(120)).unwrap_or_else(|_| {
        panic!(
            "no ready line from `scd atp agent`; its stderr:\n{}",
            std::fs::read_to_string(&stderr_path).unwrap_or_default()
        )
    });
    let ready: serde_json::Value = serde_json::from_str(line.trim()).unwrap_or_else(|e| {
        panic!("ready line {line:?}: {e}; stderr:\n{}", std::fs::read_to_string(&stderr_path).unwrap_or_default())
    });
    assert_eq!(ready["event"], "ready", "{ready}");
    AgentProc {
        child,
        did: ready["did"].as_str().unwrap().to_string(),
        addr: ready["addr"].as_str().unwrap().to_string(),
        http: ready["http"].as_str().map(str::to_string),
        url: ready["url"].as_str().unwrap().to_string(),
    }
}

pub(crate) fn verifier() -> Verifier {
    Verifier::new(Arc::new(DidResolver::new()), Arc::new(MemoryNonceLog::default()))
}

pub(crate) fn qos() -> pb::QoSConstraints {
    pb::QoSConstraints { min_quality: 0.8, max_latency_ms: 5_000, max_cost: 0.1, min_trust: 0.0 }
}

pub(crate) fn probe(me: &Identity, task_id: &str) -> pb::CapabilityProbe {
    let mut p = pb::CapabilityProbe {
        from: Some(me.agent_id()),
        task_type: pb::TaskType::CodeGeneration as i32,
        qos: Some(qos()),
        task_id: task_id.into(),
        ..Default::default()
    };
    me.stamp_and_sign(&mut p);
    p
}

/// A requester: probe → offer → contract for `task_id`.
pub(crate) async fn contract(
    me: &Identity,
    v: &Verifier,
    url: &str,
    ch: &Channel,
    task_id: &str,
) -> (Offer, pb::ContractAccept) {
    let mut client = AtpServiceClient::new(ch.clone());
    let offer = client.probe(probe(me, task_id)).await.unwrap().into_inner();
    v.verify(&offer).unwrap();
    let offer = Offer { url: url.to_string(), offer, asked_at: std::time::Instant::now() };
    // nobody listens at reply_to: heartbeats from the worker are lost, which it tolerates
    let c = handshake::contract_for(me, &offer, task_id, qos(), "http://127.0.0.1:1");
    handshake::accept(v, ch.clone(), c.clone()).await.unwrap();
    (offer, c)
}

pub(crate) fn task(me: &Identity, to: &str, c: &pb::ContractAccept, steps: u32) -> pb::TaskSubmit {
    let order = WorkOrder { title: "t".into(), steps, needs: vec![], fail: None };
    let mut t = pb::TaskSubmit {
        from: Some(me.agent_id()),
        to: Some(pb::AgentId { uuid: to.into() }),
        task_id: c.task_id.clone(),
        task_type: c.task_type,
        payload: serde_json::to_vec(&order).unwrap(),
        contract_id: c.contract_id.clone(),
        ..Default::default()
    };
    me.stamp_and_sign(&mut t);
    t
}

pub(crate) async fn results(me: &Identity, ch: &Channel, task_id: &str) -> Vec<pb::TaskResult> {
    let mut q = pb::TaskQuery { task_id: task_id.into(), from: Some(me.agent_id()), ..Default::default() };
    me.stamp_and_sign(&mut q);
    let mut stream = AtpServiceClient::new(ch.clone()).stream_results(q).await.unwrap().into_inner();
    let mut out = Vec::new();
    while let Some(r) = stream.message().await.unwrap() {
        out.push(r);
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_agent_keeps_its_identity_proofs_and_seen_nonces() {
    let dir = crate::scratch("atp-restart");
    let me = Identity::generate();
    let v = verifier();
    let agent = spawn_agent(&dir, &["--capability", "code_generation:0.9:200:0.02", "--heartbeat-ms", "100"]);
    let (url, did) = (agent.url(), agent.did.clone());
    let ch = handshake::channel(&url).unwrap();
    let (_, c) = contract(&me, &v, &url, &ch, "task-r1").await;
    let mut client = AtpServiceClient::new(ch.clone());
    let ack = client.submit_task(task(&me, &did, &c, 2)).await.unwrap().into_inner();
    assert!(ack.accepted);
    let rs = results(&me, &ch, "task-r1").await;
    // two checkpointed steps, then the final result, all signed by the worker
    assert_eq!(rs.iter().map(|r| r.status).collect::<Vec<_>>(), vec![1, 1, 2]);
    for r in &rs {
        v.verify(r).unwrap();
    }
    assert_eq!(rs[1].checkpoint.as_ref().unwrap().step_number, 2);

    // the interaction proof: signed here, countersigned there, in its Merkle log
    let mut proof = pb::InteractionProof {
        evaluator: Some(me.agent_id()),
        subject: Some(pb::AgentId { uuid: did.clone() }),
        task_id: "task-r1".into(),
        task_type: 1,
        quality_score: 0.9,
        latency_ms: 250,
        cost: 0.02,
        ..Default::default()
    };
    me.stamp_and_sign(&mut proof);
    let pack = client.submit_interaction_proof(proof.clone()).await.unwrap().into_inner();
    proof.responder_signature = pack.responder_signature.clone();
    v.check_proof(&proof).unwrap();
    let inclusion = pack.inclusion.clone().unwrap();
    assert!(scd_atp::merkle::verify_inclusion(&inclusion, &pack.merkle_root));
    assert_eq!(inclusion.tree_size, 1);
    let first_probe = probe(&me, "task-r2");
    let before = client.probe(first_probe.clone()).await.unwrap().into_inner();
    assert_eq!(before.trust_evidence.as_ref().unwrap().log_size, 1);

    // SIGKILL and restart on the same identity file and store
    drop(client);
    drop(agent);
    let agent = spawn_agent(&dir, &["--capability", "code_generation:0.9:200:0.02"]);
    assert_eq!(agent.did, did, "a restarted agent keeps its DID");
    let ch = handshake::channel(&agent.url()).unwrap();
    let mut client = AtpServiceClient::new(ch);
    // the probe it already saw is still a replay after the restart
    let err = client.probe(first_probe).await.unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated, "{err:?}");
    assert!(err.message().contains("replayed"), "{err:?}");
    let after = client.probe(probe(&me, "task-r3")).await.unwrap().into_inner();
    v.verify(&after).unwrap();
    let (eb, ea) = (before.trust_evidence.unwrap(), after.trust_evidence.unwrap());
    assert_eq!(ea.log_size, 1);
    assert_eq!(ea.merkle_root, pack.merkle_root, "the Merkle root survives the restart");
    assert_eq!(after.trust_proof, pack.merkle_root);
    // (trust is recomputed from these proofs on open: store.rs's
    // everything_survives_a_restart checks the scores; one proof here is
    // below the minimum interactions, so the offer shows the prior either way)
    assert_eq!(ea.proofs, eb.proofs);
    assert_eq!(ea.proofs.len(), 1);
    v.check_proof(&ea.proofs[0]).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

/// `GET path` over plain HTTP/1.1; the status line and the body.
pub(crate) fn http_get(addr: &str, path: &str) -> (String, String) {
    use std::io::{Read, Write};
    let mut sock = std::net::TcpStream::connect(addr).unwrap();
    write!(sock, "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").unwrap();
    let mut raw = String::new();
    sock.read_to_string(&mut raw).unwrap();
    let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
    (head.lines().next().unwrap_or("").to_string(), body.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn did_wba_agents_serve_their_documents_and_verify_peers_from_a_directory() {
    let dir = crate::scratch("atp-did-wba");
    let docs = dir.join("docs");
    // a did:wba requester whose document the agent has in its directory, and one it has not
    let me = Identity::generate().with_did("did:wba:client.example.test").unwrap();
    me.write_wba_document(&docs).unwrap();
    let unknown = Identity::generate().with_did("did:wba:nowhere.example.test").unwrap();
    let did = "did:wba:agents.example.test:coder";
    let agent = spawn_agent(
        &dir.join("agent"),
        &["--capability", "code_generation:0.9:200:0.02", "--did-wba", did, "--http-addr", "127.0.0.1:0"],
    );
    assert_eq!(agent.did, did);
    let http = agent.http.clone().expect("ready line names the HTTP address");
    let (status, body) = http_get(&http, "/coder/did.json");
    assert!(status.contains("200"), "{status}");
    let doc: serde_json::Value = serde_json::from_str(body.trim()).unwrap();
    assert_eq!(doc["id"], did, "{doc}");
    assert!(http_get(&http, "/.well-known/did.json").0.contains("404"), "only the DID's own path");
    // the served document, stored where a resolver looks, verifies its offers
    let path = scd_did::document::wba_document_path(&dir.join("resolved"), did).unwrap();
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(&path, &body).unwrap();
    let v =
        Verifier::new(Arc::new(DidResolver::with_wba_dir(dir.join("resolved"))), Arc::new(MemoryNonceLog::default()));
    drop(agent);
    let agent = spawn_agent(
        &dir.join("agent"),
        &["--capability", "code_generation:0.9:200:0.02", "--did-wba", did, "--did-dir", docs.to_str().unwrap()],
    );
    let mut client = AtpServiceClient::new(handshake::channel(&agent.url()).unwrap());
    let offer = client.probe(probe(&me, "wba-1")).await.unwrap().into_inner();
    v.verify(&offer).unwrap();
    assert_eq!(offer.from.unwrap().uuid, did);
    // without the document neither side can verify the other
    let blind = verifier();
    assert!(blind.verify(&client.probe(probe(&me, "wba-2")).await.unwrap().into_inner()).is_err());
    let e = client.probe(probe(&unknown, "wba-3")).await.unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated, "{e:?}");
    assert!(e.message().contains("did:wba:nowhere.example.test"), "{e:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_refuses_what_it_must() {
    let dir = crate::scratch("atp-refusals");
    let agent =
        spawn_agent(&dir, &["--capability", "code_generation:0.9:3000:0.02", "--max-queue", "0", "--max-running", "1"]);
    let (url, did) = (agent.url(), agent.did.clone());
    let ch = handshake::channel(&url).unwrap();
    let client = AtpServiceClient::new(ch.clone());
    let mut r =
        Refusals { me: Identity::generate(), stranger: Identity::generate(), v: verifier(), url, did, ch, client };
    refuses_contracts_and_tasks(&mut r).await;
    refuses_strangers_signals(&mut r).await;
    refuses_bad_proofs(&mut r).await;
    refuses_a_foreign_envelope(&mut r).await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// What [`an_agent_refuses_what_it_must`] sends from: a requester, a
/// stranger, and the agent under test.
struct Refusals {
    me: Identity,
    stranger: Identity,
    v: Verifier,
    url: String,
    did: String,
    ch: Channel,
    client: AtpServiceClient<Channel>,
}

/// A call refused with `code` and a message containing `words`.
fn refused(r: Result<tonic::Response<pb::TaskAck>, tonic::Status>, code: Code, words: &str) {
    let e = r.unwrap_err();
    assert_eq!(e.code(), code, "{e:?}");
    assert!(e.message().contains(words), "{words:?} not in {e:?}");
}

/// Probes it cannot meet, contracts for offers it never made, tasks it
/// must not run, and a task past its queue.
async fn refuses_contracts_and_tasks(r: &mut Refusals) {
    let (me, stranger, v, url, did, ch) = (&r.me, &r.stranger, &r.v, &r.url, &r.did, &r.ch);
    let client = &mut r.client;
    // probe it cannot meet: no offer
    let mut p = probe(me, "x");
    p.task_type = pb::TaskType::Analysis as i32;
    me.stamp_and_sign(&mut p);
    let e = client.probe(p).await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(e.message().contains("no capability for TASK_TYPE_ANALYSIS"), "{e:?}");

    // a contract for an offer it never made
    let (offer, c1) = contract(me, v, url, ch, "task-a").await;
    let mut bogus = handshake::contract_for(me, &offer, "task-b", qos(), "http://127.0.0.1:1");
    bogus.offer_nonce = 12345;
    me.sign(&mut bogus);
    let ack = client.accept_contract(bogus).await.unwrap().into_inner();
    assert!(!ack.accepted);
    assert!(ack.reason.contains("no open offer"), "{ack:?}");

    // tasks: unsigned, without a contract, for someone else, under another's contract
    let mut unsigned = task(me, did, &c1, 1);
    unsigned.signature.clear();
    refused(client.submit_task(unsigned).await, Code::Unauthenticated, "unsigned");
    let mut no_contract = task(me, did, &c1, 1);
    no_contract.contract_id = "ct-none".into();
    me.stamp_and_sign(&mut no_contract);
    refused(client.submit_task(no_contract).await, Code::FailedPrecondition, "no open contract");
    refused(client.submit_task(task(me, "did:key:z6MkOther", &c1, 1)).await, Code::InvalidArgument, "another agent");
    refused(client.submit_task(task(stranger, did, &c1, 1)).await, Code::PermissionDenied, "another agent's");
    let mut bad_order = task(me, did, &c1, 1);
    bad_order.payload = br#"{"title":"t","stpes":2}"#.to_vec();
    me.stamp_and_sign(&mut bad_order);
    refused(client.submit_task(bad_order).await, Code::InvalidArgument, "task.payload.stpes: unknown field");

    // a checkpoint past the order's steps
    let (_, c2) = contract(me, v, url, ch, "task-c").await;
    let mut resume = task(me, did, &c2, 1);
    resume.resume_from = Some(pb::TaskCheckpoint { task_id: "task-c".into(), step_number: 99, ..Default::default() });
    me.stamp_and_sign(&mut resume);
    refused(client.submit_task(resume).await, Code::InvalidArgument, "task.resume_from.step_number: 99 is past");

    // one running task fills it (queue 0): the next is RESOURCE_EXHAUSTED,
    // before its body is read (so even a malformed one), with the drain time
    // as the hint
    assert!(client.submit_task(task(me, did, &c1, 3)).await.unwrap().into_inner().accepted);
    let e = client.submit_task(task(me, did, &c2, 1)).await.unwrap_err();
    assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
    assert!(
        e.message().starts_with("queue full: 1 tasks queued or running (--max-queue 0); retry after 3000 ms"),
        "{e:?}"
    );
    assert_eq!(e.metadata().get("retry-after-ms").and_then(|v| v.to_str().ok()), Some("3000"));
    let mut malformed = task(me, did, &c2, 1);
    malformed.payload = b"not json".to_vec();
    me.stamp_and_sign(&mut malformed);
    refused(client.submit_task(malformed).await, Code::ResourceExhausted, "queue full");
}

/// Heartbeats, back-pressure and route queries from peers it owes nothing.
async fn refuses_strangers_signals(r: &mut Refusals) {
    let (me, stranger, did) = (&r.me, &r.stranger, &r.did);
    let client = &mut r.client;
    // heartbeats and back-pressure only from peers that made it an offer
    let beat = |to: Option<&str>| {
        let mut hb = pb::Heartbeat {
            from: Some(stranger.agent_id()),
            sequence: 1,
            interval_ms: 1000,
            to: to.map(|d| pb::AgentId { uuid: d.into() }),
            ..Default::default()
        };
        stranger.stamp_and_sign(&mut hb);
        hb
    };
    let e = client.send_heartbeat(beat(Some(did))).await.unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
    assert!(e.message().contains("heartbeat.from"), "{e:?}");
    // and only those naming it: one for another requester (or none) cannot be replayed here
    for (to, words) in [
        (Some("did:key:z6MkAnotherPlanner"), "heartbeat.to: this message is for another agent"),
        (None, "heartbeat.to: missing"),
    ] {
        let e = client.send_heartbeat(beat(to)).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
        assert!(e.message().starts_with(words), "{e:?}");
    }
    let mut bp = pb::Backpressure { from: Some(stranger.agent_id()), queue_depth: 9, ..Default::default() };
    stranger.stamp_and_sign(&mut bp);
    let e = client.report_backpressure(bp).await.unwrap_err();
    assert!(e.message().starts_with("backpressure.to: missing"), "{e:?}");

    // routes only for a signed query
    let query = |signed: bool| {
        let mut q = pb::RouteQuery { task_type: 1, qos: Some(qos()), from: Some(me.agent_id()), ..Default::default() };
        if signed {
            me.stamp_and_sign(&mut q);
        }
        q
    };
    let e = client.query_route(query(false)).await.unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated, "{e:?}");
    client.query_route(query(true)).await.expect("a signed route query is answered");
}

/// Proofs: one countersigned per task, none from a stranger, none out of
/// range; results only to the submitter.
async fn refuses_bad_proofs(r: &mut Refusals) {
    let (me, stranger, v, did) = (&r.me, &r.stranger, &r.v, &r.did);
    let client = &mut r.client;
    // one countersigned proof per task
    let mut good = pb::InteractionProof {
        evaluator: Some(me.agent_id()),
        subject: Some(pb::AgentId { uuid: did.clone() }),
        task_id: "task-a".into(),
        task_type: 1,
        quality_score: 0.9,
        ..Default::default()
    };
    me.stamp_and_sign(&mut good);
    let ack = client.submit_interaction_proof(good.clone()).await.unwrap().into_inner();
    assert!(ack.accepted);
    // the root and inclusion it claims are signed by it
    v.verify(&ack).expect("the proof ack is signed");
    assert_eq!(ack.from.as_ref().map(|a| a.uuid.as_str()), Some(did.as_str()));
    let mut forged = ack.clone();
    forged.merkle_root[0] ^= 1;
    assert!(v.check_signature(&forged).is_err(), "an altered root still verifies");
    me.stamp_and_sign(&mut good);
    let e = client.submit_interaction_proof(good).await.unwrap_err();
    assert_eq!(e.code(), Code::AlreadyExists, "{e:?}");

    // only the submitter streams results; proofs only for tasks it ran for the evaluator
    let mut q = pb::TaskQuery { task_id: "task-a".into(), from: Some(stranger.agent_id()), ..Default::default() };
    stranger.stamp_and_sign(&mut q);
    let Err(e) = client.stream_results(q).await else { panic!("a stranger streamed another's results") };
    assert_eq!(e.code(), Code::NotFound, "{e:?}");
    let mut proof = pb::InteractionProof {
        evaluator: Some(stranger.agent_id()),
        subject: Some(pb::AgentId { uuid: did.clone() }),
        task_id: "task-a".into(),
        task_type: 1,
        quality_score: 0.0,
        ..Default::default()
    };
    stranger.stamp_and_sign(&mut proof);
    let e = client.submit_interaction_proof(proof).await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(e.message().contains("not a task this agent ran for the evaluator"), "{e:?}");
    let mut out_of_range = pb::InteractionProof {
        evaluator: Some(me.agent_id()),
        subject: Some(pb::AgentId { uuid: did.clone() }),
        task_id: "task-a".into(),
        task_type: 1,
        quality_score: 1.5,
        ..Default::default()
    };
    me.stamp_and_sign(&mut out_of_range);
    let e = client.submit_interaction_proof(out_of_range).await.unwrap_err();
    assert!(e.message().contains("proof.quality_score: 1.5 is outside [0, 1]"), "{e:?}");
}

/// An envelope whose payload claims another sender.
async fn refuses_a_foreign_envelope(r: &mut Refusals) {
    let (me, stranger, did) = (&r.me, &r.stranger, &r.did);
    let client = &mut r.client;
    // an envelope whose payload claims another sender
    let mut inner = probe(stranger, "env");
    stranger.stamp_and_sign(&mut inner);
    let mut env = pb::AtpMessage {
        message_id: "m1".into(),
        sender_did: me.did().into(),
        receiver_did: did.clone(),
        r#type: pb::MessageType::CapabilityProbe as i32,
        payload: Some(pb::atp_message::Payload::Probe(inner)),
        ..Default::default()
    };
    me.stamp_and_sign(&mut env);
    let e = client.exchange(env).await.unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated, "{e:?}");
    assert!(e.message().contains("not the envelope's sender"), "{e:?}");
}

/// A planner agent in this process (served on loopback, events subscribed)
/// over the peers at `urls`, delegating through the SCD at `scd`.
pub(crate) async fn planner(
    dir: &Path,
    scd: &str,
    urls: &[String],
) -> (Arc<scd_atp::planner::Planner>, tokio::sync::mpsc::UnboundedReceiver<scd_atp::planner::Event>) {
    planner_with_tls(dir, scd, urls, None).await
}

/// [`planner`] whose listener serves TLS (at `https://localhost:PORT`) and
/// which reaches `https://` peers with `tls`'s client half.
pub(crate) async fn planner_with_tls(
    dir: &Path,
    scd: &str,
    urls: &[String],
    tls: Option<(tonic::transport::ServerTlsConfig, tonic::transport::ClientTlsConfig)>,
) -> (Arc<scd_atp::planner::Planner>, tokio::sync::mpsc::UnboundedReceiver<scd_atp::planner::Event>) {
    use scd_atp::agent::{AgentConfig, Node};
    use scd_atp::store::{Ledger, Store};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let url = if tls.is_some() { format!("https://localhost:{port}") } else { format!("http://127.0.0.1:{port}") };
    let identity = Identity::load_or_create(&dir.join("planner.json")).unwrap();
    let store = Arc::new(Store::open(&dir.join("planner")).unwrap());
    let resolver: Arc<dyn scd_atp::identity::Resolver> = Arc::new(DidResolver::new());
    let verifier = Verifier::new(resolver.clone(), store.clone());
    let ledger = Ledger::open(store, identity.did(), Default::default(), resolver).unwrap();
    let mut config = AgentConfig::new(vec![], url, scd.to_string());
    (config.server_tls, config.client_tls) = tls.map_or((None, None), |(s, c)| (Some(s), Some(c)));
    let node = Node::new(identity, verifier, ledger, config);
    tokio::spawn(scd_atp::agent::serve(node.clone(), listener, std::future::pending()));
    let (tx, events) = tokio::sync::mpsc::unbounded_channel();
    node.planner.subscribe(tx);
    (Arc::new(scd_atp::planner::Planner::new(node, urls).unwrap()), events)
}

/// An analysis task over the demo context that needs `needs`.
pub(crate) fn analysis_job(id: &str, needs: &[&str]) -> scd_atp::planner::Job {
    let context = scd_atp::context::ContextFile::load(&crate::root().join("fixtures/atp_demo_context.json")).unwrap();
    scd_atp::planner::Job {
        task_id: id.into(),
        task_type: pb::TaskType::Analysis,
        task: scd_atp::context::Task::new("Why were cards charged twice after gateway timeouts?"),
        order: WorkOrder {
            title: id.into(),
            steps: 2,
            needs: needs.iter().map(|s| s.to_string()).collect(),
            fail: None,
        },
        context,
        qos: pb::QoSConstraints { min_quality: 0.5, max_latency_ms: 20_000, max_cost: 1.0, min_trust: 0.0 },
    }
}

/// Hostile requesters against `scd atp agent`: another requester naming a
/// running task's id (with a forged checkpoint to resume it) gets a job of
/// its own, a contract serves one task, and a contract may not aim the
/// worker's callbacks at a third host.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_requester_cannot_take_over_a_job_reuse_a_contract_or_aim_the_worker_elsewhere() {
    let dir = crate::scratch("atp-hostile-requester");
    let (me, rival) = (Identity::generate(), Identity::generate());
    let v = verifier();
    let agent = spawn_agent(&dir, &["--capability", "code_generation:0.9:1500:0.02", "--max-queue", "4"]);
    let (url, did) = (agent.url(), agent.did.clone());
    let ch = handshake::channel(&url).unwrap();
    let mut client = AtpServiceClient::new(ch.clone());
    let (_, mine) = contract(&me, &v, &url, &ch, "job-1").await;
    assert!(client.submit_task(task(&me, &did, &mine, 3)).await.unwrap().into_inner().accepted);
    // the same contract again: used
    let e = client.submit_task(task(&me, &did, &mine, 3)).await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(e.message().contains("a contract serves one task"), "{e:?}");
    // my own resume of my running job is refused, not a second copy
    let (_, again) = contract(&me, &v, &url, &ch, "job-1").await;
    let mut resume = task(&me, &did, &again, 3);
    let mut cp = pb::TaskCheckpoint {
        task_id: "job-1".into(),
        step_number: 1,
        agent: Some(me.agent_id()),
        ..Default::default()
    };
    me.stamp_and_sign(&mut cp);
    resume.resume_from = Some(cp);
    me.stamp_and_sign(&mut resume);
    let e = client.submit_task(resume).await.unwrap_err();
    assert_eq!(e.code(), Code::AlreadyExists, "{e:?}");
    // a rival's "resume" of job-1 with a checkpoint it signed itself: its own job
    let (_, theirs) = contract(&rival, &v, &url, &ch, "job-1").await;
    let mut takeover = task(&rival, &did, &theirs, 1);
    let mut cp = pb::TaskCheckpoint {
        task_id: "job-1".into(),
        step_number: 0,
        agent: Some(rival.agent_id()),
        ..Default::default()
    };
    rival.stamp_and_sign(&mut cp);
    takeover.resume_from = Some(cp);
    rival.stamp_and_sign(&mut takeover);
    assert!(client.submit_task(takeover).await.unwrap().into_inner().accepted);
    let (mine_out, theirs_out) = (results(&me, &ch, "job-1").await, results(&rival, &ch, "job-1").await);
    let steps = |rs: &[pb::TaskResult]| rs.iter().filter(|r| r.checkpoint.is_some()).count();
    assert_eq!((steps(&mine_out), steps(&theirs_out)), (3, 1), "each requester sees its own job");
    for out in [&mine_out, &theirs_out] {
        assert_eq!(out.last().unwrap().status, pb::TaskStatus::Completed as i32);
    }
    // reply_to: only the address the contract came from (loopback here)
    let mut client = AtpServiceClient::new(ch.clone());
    for (reply_to, ok) in [
        ("http://192.0.2.1:7700", false),
        ("http://10.1.2.3:1", false),
        ("http://127.0.0.1:1", true),
        ("http://localhost:1", true),
    ] {
        let offer = client.probe(probe(&me, "job-2")).await.unwrap().into_inner();
        let c = handshake::contract_for(
            &me,
            &Offer { url: url.clone(), offer, asked_at: std::time::Instant::now() },
            "job-2",
            qos(),
            reply_to,
        );
        let ack = client.accept_contract(c).await.unwrap().into_inner();
        assert_eq!(ack.accepted, ok, "{reply_to}: {ack:?}");
        if !ok {
            assert!(
                ack.reason.starts_with("contract.reply_to: its host is neither the address this contract came from"),
                "{ack:?}"
            );
            assert!(
                !ack.reason.contains("192.0.2.1") && !ack.reason.contains("10.1.2.3"),
                "the host is quoted: {ack:?}"
            );
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Paper §11.2: a sender DID over its rate is RESOURCE_EXHAUSTED with a
/// retry hint; only messages that pass every check take from its rate
/// (forgeries and replays drain nothing), and a refused message's nonce is
/// not used up; another DID is served meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flooding_did_is_rate_limited_and_others_are_served() {
    let dir = crate::scratch("atp-rate");
    let (me, other) = (Identity::generate(), Identity::generate());
    let agent = spawn_agent(
        &dir,
        &["--capability", "code_generation:0.9:500:0.02", "--rate-per-did", "0.2", "--burst-per-did", "5"],
    );
    let mut client = AtpServiceClient::new(handshake::channel(&agent.url()).unwrap());
    // forgeries in my name: refused unauthenticated, my bucket untouched
    for _ in 0..10 {
        let mut forged = probe(&me, "r");
        forged.signature[0] ^= 1;
        assert_eq!(client.probe(forged).await.unwrap_err().code(), Code::Unauthenticated);
    }
    // replays of my accepted probe (anyone may resend a message they saw):
    // refused as replayed, my bucket untouched
    let seen = probe(&me, "r");
    client.probe(seen.clone()).await.unwrap();
    for _ in 0..10 {
        let e = client.probe(seen.clone()).await.unwrap_err();
        assert!(e.code() == Code::Unauthenticated && e.message().contains("replayed"), "{e:?}");
    }
    for i in 1..5 {
        client.probe(probe(&me, "r")).await.unwrap_or_else(|e| panic!("probe {i} within the burst: {e:?}"));
    }
    let over = probe(&me, "r");
    let e = client.probe(over.clone()).await.unwrap_err();
    assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
    assert!(e.message().contains("over its rate: 0.2 messages/s, burst 5"), "{e:?}");
    let ms: u64 = e.metadata().get("retry-after-ms").unwrap().to_str().unwrap().parse().unwrap();
    assert!((1..=5000).contains(&ms), "retry-after-ms {ms}");
    client.probe(probe(&other, "r")).await.expect("another DID is served");
    // the refused message itself is accepted once the bucket refilled: its nonce was not used up
    tokio::time::sleep(Duration::from_millis(ms + 50)).await;
    client.probe(over).await.expect("the refused probe, resent");
    let _ = std::fs::remove_dir_all(&dir);
}

/// ATP over TLS and mTLS: an agent with --tls-cert/--client-ca serves
/// https:// only to peers with a certificate from its CA, and a planner
/// whose own listener is TLS delegates to it end to end, the worker calling
/// back (context requests, heartbeats) over TLS checked with --peer-ca.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn atp_runs_over_tls_and_mtls_and_refuses_what_it_must() {
    use scd_atp::planner::Outcome;
    use tonic::transport::{Certificate, ClientTlsConfig, Identity as TlsIdentity, ServerTlsConfig};
    if !crate::ready() {
        return;
    }
    let scd = crate::grpc::start(&[]);
    crate::grpc::client(&scd).await;
    let dir = crate::scratch("atp-tls");
    let pki = crate::lifecycle::pki(&dir);
    let p = |p: &Path| p.to_str().unwrap().to_string();
    #[rustfmt::skip]
    let worker = spawn_agent_with_scd(&dir.join("worker"), &scd.addr, &[
        "--capability", "analysis:0.80:300:0.02",
        "--tls-cert", &p(&pki.server_cert), "--tls-key", &p(&pki.server_key), "--client-ca", &p(&pki.ca),
        "--peer-ca", &p(&pki.ca), "--peer-cert", &p(&pki.client_cert), "--peer-key", &p(&pki.client_key),
    ]);
    assert!(worker.url().starts_with("https://127.0.0.1:"), "{}", worker.url());
    let read = |p: &Path| std::fs::read(p).unwrap();
    let ca = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(read(&pki.ca)));
    let mtls = ca.clone().identity(TlsIdentity::from_pem(read(&pki.client_cert), read(&pki.client_key)));
    let rogue = ca.clone().identity(TlsIdentity::from_pem(read(&pki.rogue_cert), read(&pki.rogue_key)));
    let me = Identity::generate();
    let probe_with = |tls: Option<ClientTlsConfig>, url: String| {
        let me = &me;
        async move {
            let ch = handshake::channel_with(&url, tls.as_ref())?;
            let mut client = AtpServiceClient::new(ch);
            let mut analysis = probe(me, "tls-probe");
            analysis.task_type = pb::TaskType::Analysis as i32;
            me.stamp_and_sign(&mut analysis);
            client.probe(analysis).await.map_err(|s| scd_atp::Error::Invalid {
                field: "probe".into(),
                reason: format!("{:?}: {}", s.code(), s.message()),
            })
        }
    };
    let offer = probe_with(Some(mtls.clone()), worker.url()).await.expect("mTLS with the CA's client certificate");
    assert_eq!(offer.into_inner().from.unwrap().uuid, worker.did);
    for (what, tls, url) in [
        ("no client certificate", Some(ca.clone()), worker.url()),
        ("a client certificate from another CA", Some(rogue), worker.url()),
        ("plaintext to a TLS port", None, worker.url().replace("https://", "http://")),
    ] {
        assert!(probe_with(tls, url).await.is_err(), "{what} was served");
    }
    let e = handshake::channel(&worker.url()).unwrap_err().to_string();
    assert!(e.contains("https:// needs the peers' CA (--peer-ca)"), "{e}");

    // a planner whose listener is TLS too (no client CA: workers' calls back
    // are signed, and the TLS keeps them private)
    let server = ServerTlsConfig::new().identity(TlsIdentity::from_pem(read(&pki.server_cert), read(&pki.server_key)));
    let (planner, mut events) =
        planner_with_tls(&dir.join("planner"), &scd.addr, &[worker.url()], Some((server, mtls))).await;
    // a need off the task's topic, which the first transfer lacks: the
    // worker asks back over TLS
    let job = analysis_job("tls-0", &["idempotency key must be derived", "loyalty program"]);
    match planner.run(&job).await.unwrap() {
        Outcome::Completed { agent, quality, .. } => {
            assert_eq!(agent, worker.did);
            assert_eq!(quality, 1.0, "every need reached the worker");
        }
        other => panic!("{other:?}"),
    }
    let mut asked = 0;
    while let Ok(e) = events.try_recv() {
        asked += matches!(e, scd_atp::planner::Event::ContextRequested { .. }) as usize;
    }
    assert!(asked >= 1, "the worker's context request reached the TLS planner");
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_caps_silent_sockets_per_peer_and_closes_them() {
    use scd_atp::agent::{AgentConfig, Node};
    use scd_atp::store::{Ledger, Store};
    let dir = tempfile::tempdir().unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let url = format!("http://{addr}");
    let identity = Identity::generate();
    let store = Arc::new(Store::open(dir.path()).unwrap());
    let resolver: Arc<dyn scd_atp::identity::Resolver> = Arc::new(DidResolver::new());
    let ledger = Ledger::open(store.clone(), identity.did(), Default::default(), resolver.clone()).unwrap();
    let mut config = AgentConfig::new(vec![], url.clone(), "http://127.0.0.1:1".into());
    config.connections = scd_net::ConnLimits {
        max_per_peer: 3,
        first_call_timeout: Duration::from_millis(300),
        ..scd_net::ConnLimits::default()
    };
    let node = Node::new(identity, Verifier::new(resolver, store), ledger, config);
    tokio::spawn(scd_atp::agent::serve(node, listener, std::future::pending()));
    let mut socks = Vec::new();
    for _ in 0..8 {
        socks.push(tokio::net::TcpStream::connect(addr).await.unwrap());
    }
    let (kept, over) = socks.split_at_mut(3);
    let _ = kept;
    let mut refused = 0;
    for s in over.iter_mut() {
        refused += usize::from(crate::closed_within(s, Duration::from_millis(200)).await);
    }
    assert_eq!(refused, 5, "past 3 per peer each socket is closed at once");
    // the silent three are closed after the first-call timeout
    for mut s in socks.drain(..3) {
        assert!(crate::closed_within(&mut s, Duration::from_secs(3)).await, "a silent socket was kept");
    }
    // and a real peer is served
    let ch = Channel::from_shared(url).unwrap().connect().await.unwrap();
    let status = tonic_health::pb::health_client::HealthClient::new(ch)
        .check(tonic_health::pb::HealthCheckRequest { service: String::new() })
        .await
        .unwrap()
        .into_inner()
        .status;
    assert_eq!(status, 1);
}
