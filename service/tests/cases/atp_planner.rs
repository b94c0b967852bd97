//! The requester side over the wire: the planner choosing composites,
//! rerouting around full or rejecting peers, checkpoints without text, and
//! ratings that are the requester's own.

use std::path::Path;
use std::process::Command;
use std::sync::Arc;

use scd_atp::handshake;
use scd_atp::identity::{DidResolver, Identity, SignMessages as _, Verifier};
use scd_atp::pb;
use scd_atp::pb::atp_service_client::AtpServiceClient;
use tonic::Code;

use crate::atp::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_five_composite_patterns_run_over_the_wire() {
    use scd_atp::routing::Pattern;
    if !crate::ready() {
        return;
    }
    let scd = crate::grpc::start(&[]);
    crate::grpc::client(&scd).await;
    let dir = crate::scratch("atp-patterns");
    let workers: Vec<AgentProc> = ["analysis:0.90:400:0.03", "analysis:0.80:200:0.01", "analysis:0.85:300:0.02"]
        .iter()
        .enumerate()
        .map(|(i, cap)| spawn_agent_with_scd(&dir.join(format!("w{i}")), &scd.addr, &["--capability", cap]))
        .collect();
    let urls: Vec<String> = workers.iter().map(|w| w.url()).collect();
    let (planner, _events) = planner(&dir, &scd.addr, &urls).await;
    let dids: Vec<&str> = workers.iter().map(|w| w.did.as_str()).collect();
    for (pattern, needs, stages) in [
        (Pattern::Single, &[][..], 1),
        (Pattern::DraftRefine, &[][..], 2),
        (Pattern::Pipeline, &[][..], 2),
        (Pattern::ParallelMerge, &[][..], 2),
        (Pattern::Ensemble, &[][..], 3),
        (Pattern::Cascade, &[][..], 1),
        // the first agent cannot find what it needs: below 0.7 the cascade escalates
        (Pattern::Cascade, &["a fact this context does not hold"][..], 2),
    ] {
        let id = format!("pat-{}-{}", pattern.name(), needs.len());
        let run = planner.run_pattern(&analysis_job(&id, needs), pattern).await.unwrap();
        assert_eq!(run.stages.len(), stages, "{pattern:?}: {run:#?}");
        let route_len = match pattern {
            Pattern::Single => 1,
            Pattern::Ensemble => 3,
            _ => 2,
        };
        assert_eq!(run.route.len(), route_len, "{run:#?}");
        // each stage ran on its own agent of the route, over the wire
        for (stage, agent) in run.stages.iter().zip(&run.route) {
            assert_eq!(&stage.agent, agent, "{run:#?}");
            assert!(dids.contains(&stage.agent.as_str()));
            assert!(stage.quality > 0.0 && stage.latency_ms > 0, "{stage:?}");
        }
        let distinct: std::collections::HashSet<&str> = run.stages.iter().map(|s| s.agent.as_str()).collect();
        assert_eq!(distinct.len(), run.stages.len(), "{run:#?}");
        assert!(run.answer.is_some(), "{pattern:?} has an answer: {run:#?}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `Planner::run` chooses a composite route where Theorem 4's condition holds:
/// no cheap agent meets q_min alone, a cheap drafter and a mid refiner meet it
/// together for less than the one agent that does, and both stages run over
/// the wire; with cascades allowed, the cheapest start escalates only on low
/// confidence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn planner_run_chooses_a_composite_that_meets_q_min_for_less() {
    use scd_atp::planner::{Event, Outcome, Planner};
    use scd_atp::routing::Pattern;
    if !crate::ready() {
        return;
    }
    let scd = crate::grpc::start(&[]);
    crate::grpc::client(&scd).await;
    let dir = crate::scratch("atp-composite-run");
    // drafter, refiner, and the one agent that meets q_min 0.85 alone ($0.10)
    let workers: Vec<AgentProc> = ["analysis:0.70:200:0.002", "analysis:0.80:300:0.01", "analysis:0.92:600:0.10"]
        .iter()
        .enumerate()
        .map(|(i, cap)| spawn_agent_with_scd(&dir.join(format!("w{i}")), &scd.addr, &["--capability", cap]))
        .collect();
    let urls: Vec<String> = workers.iter().map(|w| w.url()).collect();
    // each case plans from a fresh node: the proofs of one case would reprice
    // the agents for the next (the drafter measures better than it offers)
    let fresh = |name: &str| {
        let d = dir.join(name);
        std::fs::create_dir_all(&d).unwrap();
        d
    };
    let (dr, mut events) = planner(&fresh("p-dr"), &scd.addr, &urls).await;
    let job = |id: &str| {
        let mut job = analysis_job(id, &[]);
        job.qos.min_quality = 0.85;
        job
    };
    let routed = |events: &mut tokio::sync::mpsc::UnboundedReceiver<Event>| {
        let mut routes = Vec::new();
        while let Ok(e) = events.try_recv() {
            if let Event::Routed { pattern, cost, .. } = e {
                routes.push((pattern, cost));
            }
        }
        routes
    };
    // draft-refine, Algorithm 1's two-agent route: 1 − 0.2·(1 − 0.5·0.7) = 0.87
    // for $0.012, against $0.10 alone
    let out = dr.run(&job("dr")).await.unwrap();
    let Outcome::Completed { agent, stages, cost, .. } = &out else { panic!("{out:?}") };
    let agents: Vec<&str> = stages.iter().map(|s| s.agent.as_str()).collect();
    assert_eq!(agents, [workers[0].did.as_str(), workers[1].did.as_str()], "{out:#?}");
    assert_eq!(agent, &workers[1].did, "the refiner answers");
    assert!(stages.iter().all(|s| s.task_id.starts_with("dr.") && s.quality > 0.0), "{stages:#?}");
    assert!((cost - 0.012).abs() < 1e-9, "{cost}");
    let routes = routed(&mut events);
    assert_eq!(routes.len(), 1, "{routes:?}");
    assert_eq!(routes[0].0, "draft-refine");
    assert!(routes[0].1 < 0.10, "Theorem 4: {routes:?}");
    // cascades allowed: the $0.01 agent first, the $0.10 one only below 0.7
    // confidence: 1 − 0.2·0.08 = 0.984 for $0.01 + 0.2·$0.10 = $0.03 expected
    // (score 0.0997, above the cascade from the $0.002 agent, 0.0901); it
    // finds what it needs, so it answers alone
    let (p, mut events) = planner(&fresh("p-cascade"), &scd.addr, &urls).await;
    let cascading = Planner::new(p.node().clone(), &urls).unwrap().with_composites(&[Pattern::Cascade]);
    let out = cascading.run(&job("cascade")).await.unwrap();
    let Outcome::Completed { agent, stages, .. } = &out else { panic!("{out:?}") };
    assert_eq!(routed(&mut events).first().map(|r| r.0.as_str()), Some("cascade"));
    assert_eq!((stages.len(), agent), (1, &workers[1].did), "{out:#?}");
    // no composites: the one agent that meets q_min alone
    let (p, mut events) = planner(&fresh("p-single"), &scd.addr, &urls).await;
    let single = Planner::new(p.node().clone(), &urls).unwrap().with_composites(&[]);
    let out = single.run(&job("single")).await.unwrap();
    let Outcome::Completed { agent, stages, .. } = &out else { panic!("{out:?}") };
    assert!(stages.is_empty());
    assert_eq!(agent, &workers[2].did);
    assert_eq!(routed(&mut events).first().map(|r| r.0.as_str()), Some("single"));
    let _ = std::fs::remove_dir_all(&dir);
}

/// A worker in this process offering analysis at `cap` (quality, latency,
/// cost), its offers open `offer_ttl_ms`; its DID and URL.
async fn worker_with_offer_ttl(dir: &Path, scd: &str, cap: (f64, u64, f64), offer_ttl_ms: u64) -> (String, String) {
    use scd_atp::agent::{AgentConfig, Node};
    use scd_atp::store::{Ledger, Store};
    let identity = Identity::generate();
    let did = identity.did().to_string();
    let store = Arc::new(Store::open(dir).unwrap());
    let resolver: Arc<dyn scd_atp::identity::Resolver> = Arc::new(DidResolver::new());
    let ledger = Ledger::open(store.clone(), identity.did(), Default::default(), resolver.clone()).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let (estimated_quality, estimated_latency_ms, cost_per_task) = cap;
    let cap = pb::Capability {
        task_type: pb::TaskType::Analysis as i32,
        estimated_quality,
        estimated_latency_ms,
        cost_per_task,
    };
    let mut config = AgentConfig::new(vec![cap], url.clone(), scd.to_string());
    config.offer_ttl_ms = offer_ttl_ms;
    let node = Node::new(identity, Verifier::new(resolver, store), ledger, config);
    tokio::spawn(scd_atp::agent::serve(node, listener, std::future::pending()));
    (did, url)
}

/// A draft-refine route whose first stage outlives the refiner's offer
/// (offers open 1 s here, the drafter's stage takes 1.5 s of work alone):
/// the refiner is asked again and contracted on its fresh offer, and both
/// stages run (before, it refused the contract on the closed offer, and the
/// planner fell back to one agent).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_later_stage_contracts_on_a_fresh_offer_when_the_first_outlives_its_offer() {
    use scd_atp::planner::{Event, Outcome};
    if !crate::ready() {
        return;
    }
    let scd = crate::grpc::start(&[]);
    crate::grpc::client(&scd).await;
    let dir = crate::scratch("atp-reoffer");
    let (drafter, d_url) = worker_with_offer_ttl(&dir.join("drafter"), &scd.addr, (0.70, 1_500, 0.002), 1_000).await;
    let (refiner, r_url) = worker_with_offer_ttl(&dir.join("refiner"), &scd.addr, (0.80, 300, 0.01), 1_000).await;
    let (planner, mut events) = planner(&dir, &scd.addr, &[d_url, r_url]).await;
    // q_min 0.85: neither alone, the drafter then the refiner together (0.87)
    let mut job = analysis_job("reoffer", &[]);
    job.qos.min_quality = 0.85;
    let out = planner.run(&job).await.unwrap();
    let Outcome::Completed { agent, stages, failovers, .. } = &out else { panic!("{out:?}") };
    let agents: Vec<&str> = stages.iter().map(|s| s.agent.as_str()).collect();
    assert_eq!(agents, [drafter.as_str(), refiner.as_str()], "{out:#?}");
    assert_eq!((agent, *failovers), (&refiner, 0), "{out:#?}");
    assert!(stages[0].latency_ms >= 1_500, "the first stage outlived the offers: {stages:#?}");
    let (mut contracted, mut reoffered) = (Vec::new(), Vec::new());
    while let Ok(e) = events.try_recv() {
        match e {
            Event::Contracted { agent, task, .. } => contracted.push((agent, task)),
            Event::Reoffered { agent, age_ms, .. } => reoffered.push((agent, age_ms)),
            Event::Rerouted { why, .. } => panic!("rerouted: {why}"),
            _ => {}
        }
    }
    let short = |did: &str| scd_atp::planner::short(did);
    let tasks: Vec<&str> = contracted.iter().map(|(_, t)| t.as_str()).collect();
    assert!(tasks[0].starts_with("reoffer.1.") && tasks[1].starts_with("reoffer.2."), "{contracted:?}");
    assert_eq!(contracted.iter().map(|(a, _)| a.clone()).collect::<Vec<_>>(), [short(&drafter), short(&refiner)]);
    assert!(reoffered.iter().any(|(a, age)| *a == short(&refiner) && *age >= 1_500), "{reoffered:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Paper §6.2 step 2 against a live `scd atp agent --specialization`: its
/// offer's ContextRequirement depends on the probed task's e_task (from
/// SCD): a payments task gets about half the budget, a haiku the whole of
/// it; an agent without a specialization always asks for the whole budget.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_offers_context_requirement_follows_the_task_and_the_specialization() {
    if !crate::ready() {
        return;
    }
    let scd = crate::grpc::start(&[]);
    crate::grpc::client(&scd).await;
    let dir = crate::scratch("atp-requirement");
    let common = ["--capability", "code_generation:0.9:500:0.01", "--context-budget", "512"];
    let specialist = spawn_agent_with_scd(
        &dir.join("specialist"),
        &scd.addr,
        &[&common[..], &["--specialization", "payment gateway timeouts, retries and duplicate card charges"]].concat(),
    );
    let generalist = spawn_agent_with_scd(&dir.join("generalist"), &scd.addr, &common);
    let link = scd_atp::context::ScdLink::connect(&scd.addr).await.unwrap();
    let me = Identity::generate();
    let asked = |agent: &AgentProc, task: &'static str| {
        let (url, link, me) = (agent.url(), &link, &me);
        async move {
            let e_task = link.embed_task(&scd_atp::context::Task::new(task)).await.unwrap();
            let mut p = pb::CapabilityProbe {
                from: Some(me.agent_id()),
                task_type: pb::TaskType::CodeGeneration as i32,
                qos: Some(qos()),
                context_embedding: Some(e_task),
                task_id: "req".into(),
                ..Default::default()
            };
            me.stamp_and_sign(&mut p);
            let mut client = AtpServiceClient::new(handshake::channel(&url).unwrap());
            let offer = client.probe(p).await.unwrap().into_inner();
            offer.context_requirements.unwrap().max_context_tokens
        }
    };
    let payments = "Why were cards charged twice after gateway timeouts?";
    let haiku = "Write a haiku about autumn leaves";
    let (fit, off) = (asked(&specialist, payments).await, asked(&specialist, haiku).await);
    assert!((256..=300).contains(&fit), "a payments task asks for about half: {fit}");
    assert_eq!(off, 512, "a haiku is outside the specialization");
    assert_eq!((asked(&generalist, payments).await, asked(&generalist, haiku).await), (512, 512));
    // a specialization it cannot embed is a start-up error naming the flag
    let out = Command::new(env!("CARGO_BIN_EXE_scd"))
        .args(["atp", "agent", "--addr", "127.0.0.1:0", "--scd", "http://127.0.0.1:1"])
        .args(["--capability", "analysis:0.9:500:0.01", "--specialization", "payments"])
        .arg("--identity")
        .arg(dir.join("bad.json"))
        .arg("--store")
        .arg(dir.join("bad"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("--specialization: reaching SCD at http://127.0.0.1:1"),
        "{stderr}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_agent_makes_the_planner_reroute() {
    use scd_atp::planner::{Event, Outcome};

    if !crate::ready() {
        return;
    }
    let scd = crate::grpc::start(&[]);
    crate::grpc::client(&scd).await; // SERVING
    let dir = crate::scratch("atp-backpressure");
    // the better, cheaper agent runs one task at a time and queues none
    let busy = spawn_agent_with_scd(
        &dir.join("busy"),
        &scd.addr,
        &["--capability", "analysis:0.95:3000:0.01", "--max-queue", "0", "--max-running", "1"],
    );
    let spare = spawn_agent_with_scd(&dir.join("spare"), &scd.addr, &["--capability", "analysis:0.88:300:0.02"]);

    let (planner, mut events) = planner(&dir, &scd.addr, &[busy.url(), spare.url()]).await;
    let job = |id: &str| analysis_job(id, &[]);
    let (a, b) = (planner.clone(), planner.clone());
    let (ja, jb) = (job("bp-1"), job("bp-2"));
    let (ra, rb) = tokio::join!(async move { a.run(&ja).await }, async move { b.run(&jb).await });
    let mut agents = Vec::new();
    for r in [ra.unwrap(), rb.unwrap()] {
        match r {
            Outcome::Completed { agent, failovers, .. } => {
                assert_eq!(failovers, 0, "a refusal is a reroute, not a failure");
                agents.push(agent);
            }
            other => panic!("{other:?}"),
        }
    }
    agents.sort();
    let mut want = vec![busy.did.clone(), spare.did.clone()];
    want.sort();
    assert_eq!(agents, want, "one task on each agent");
    let mut seen = Vec::new();
    while let Ok(e) = events.try_recv() {
        seen.push(e);
    }
    assert!(seen.iter().any(|e| matches!(e, Event::Rerouted { why, .. } if why.contains("queue full"))), "{seen:#?}");
    assert!(!seen.iter().any(|e| matches!(e, Event::AgentFailed { .. } | Event::Circuit { .. })), "{seen:#?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A step's checkpoint names the chunks the worker holds (id, field,
/// score) and copies none of their text: 100 steps of a 16 MiB context
/// would otherwise hold 1.6 GiB per job.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkpoints_name_the_chunks_and_copy_no_text() {
    let dir = crate::scratch("atp-checkpoints");
    let me = Identity::generate();
    let v = verifier();
    let agent = spawn_agent(&dir, &["--capability", "code_generation:0.9:300:0.02"]);
    let (url, did) = (agent.url(), agent.did.clone());
    let ch = handshake::channel(&url).unwrap();
    let (_, c) = contract(&me, &v, &url, &ch, "cp-1").await;
    let mut t = task(&me, &did, &c, 3);
    let chunk = |i: u32| pb::ContextChunk {
        index: i,
        data: format!("chunk {i} ").repeat(2000).into_bytes(),
        chunk_id: format!("notes#{i}"),
        field: "notes".into(),
        relevance_score: 0.5,
        tokens: 4000,
    };
    t.context = Some(pb::ContextDiff { chunks: vec![chunk(0), chunk(1)], ..Default::default() });
    me.stamp_and_sign(&mut t);
    assert!(AtpServiceClient::new(ch.clone()).submit_task(t).await.unwrap().into_inner().accepted);
    let out = results(&me, &ch, "cp-1").await;
    let cps: Vec<&pb::TaskCheckpoint> = out.iter().filter_map(|r| r.checkpoint.as_ref()).collect();
    assert_eq!(cps.len(), 3);
    for cp in cps {
        let chunks = &cp.context.as_ref().unwrap().chunks;
        assert_eq!(chunks.iter().map(|c| c.chunk_id.as_str()).collect::<Vec<_>>(), ["notes#0", "notes#1"]);
        assert!(chunks.iter().all(|c| c.data.is_empty() && c.field == "notes" && c.tokens == 4000), "{chunks:?}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A peer that is a real agent in every RPC but one, which it answers with
/// `code`: SubmitTask (a peer's word that the planner's message is bad) or
/// SubmitInteractionProof (a worker refusing to countersign its rating).
struct Rejecting(scd_atp::agent::AgentService, Code, Refuse, std::sync::atomic::AtomicBool);

#[derive(Clone, Copy, PartialEq)]
enum Refuse {
    Task,
    Proof,
    /// The first SubmitInteractionProof only (a transport hiccup).
    ProofOnce,
    /// The first SubmitInteractionProof's answer: countersigned there, lost
    /// on the way back.
    ProofAnswerLost,
}

#[tonic::async_trait]
impl pb::atp_service_server::AtpService for Rejecting {
    type StreamResultsStream =
        <scd_atp::agent::AgentService as pb::atp_service_server::AtpService>::StreamResultsStream;
    async fn probe(
        &self,
        r: tonic::Request<pb::CapabilityProbe>,
    ) -> Result<tonic::Response<pb::CapabilityOffer>, tonic::Status> {
        self.0.probe(r).await
    }
    async fn accept_contract(
        &self,
        r: tonic::Request<pb::ContractAccept>,
    ) -> Result<tonic::Response<pb::ContractAck>, tonic::Status> {
        self.0.accept_contract(r).await
    }
    async fn submit_task(
        &self,
        r: tonic::Request<pb::TaskSubmit>,
    ) -> Result<tonic::Response<pb::TaskAck>, tonic::Status> {
        if self.2 == Refuse::Task {
            return Err(tonic::Status::new(self.1, "task: refused as malformed (says this peer)"));
        }
        self.0.submit_task(r).await
    }
    async fn stream_results(
        &self,
        r: tonic::Request<pb::TaskQuery>,
    ) -> Result<tonic::Response<Self::StreamResultsStream>, tonic::Status> {
        self.0.stream_results(r).await
    }
    async fn request_context(
        &self,
        r: tonic::Request<pb::ContextRequest>,
    ) -> Result<tonic::Response<pb::ContextResponse>, tonic::Status> {
        self.0.request_context(r).await
    }
    async fn query_route(
        &self,
        r: tonic::Request<pb::RouteQuery>,
    ) -> Result<tonic::Response<pb::RouteResponse>, tonic::Status> {
        self.0.query_route(r).await
    }
    async fn send_heartbeat(
        &self,
        r: tonic::Request<pb::Heartbeat>,
    ) -> Result<tonic::Response<pb::HeartbeatAck>, tonic::Status> {
        self.0.send_heartbeat(r).await
    }
    async fn report_backpressure(
        &self,
        r: tonic::Request<pb::Backpressure>,
    ) -> Result<tonic::Response<pb::BackpressureAck>, tonic::Status> {
        self.0.report_backpressure(r).await
    }
    async fn report_circuit_break(
        &self,
        r: tonic::Request<pb::CircuitBreak>,
    ) -> Result<tonic::Response<pb::CircuitBreakAck>, tonic::Status> {
        self.0.report_circuit_break(r).await
    }
    async fn submit_interaction_proof(
        &self,
        r: tonic::Request<pb::InteractionProof>,
    ) -> Result<tonic::Response<pb::ProofAck>, tonic::Status> {
        if self.2 == Refuse::ProofAnswerLost && !self.3.swap(true, std::sync::atomic::Ordering::Relaxed) {
            let _countersigned = self.0.submit_interaction_proof(r).await?;
            return Err(tonic::Status::new(self.1, "the answer was lost"));
        }
        let once = self.2 == Refuse::ProofOnce && !self.3.swap(true, std::sync::atomic::Ordering::Relaxed);
        if self.2 == Refuse::Proof || once {
            return Err(tonic::Status::new(self.1, "proof: not countersigning that (says this peer)"));
        }
        self.0.submit_interaction_proof(r).await
    }
    async fn exchange(
        &self,
        r: tonic::Request<pb::AtpMessage>,
    ) -> Result<tonic::Response<pb::AtpMessage>, tonic::Status> {
        self.0.exchange(r).await
    }
}

/// A [`Rejecting`] peer with capability `cap`, served on loopback; its URL.
async fn rejecting_peer(dir: &Path, cap: &str, code: Code, refuse: Refuse) -> String {
    use scd_atp::agent::{AgentConfig, AgentService, Node};
    use scd_atp::store::{Ledger, Store};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let identity = Identity::generate();
    let store = Arc::new(Store::open(dir).unwrap());
    let resolver: Arc<dyn scd_atp::identity::Resolver> = Arc::new(DidResolver::new());
    let verifier = Verifier::new(resolver.clone(), store.clone());
    let ledger = Ledger::open(store, identity.did(), Default::default(), resolver).unwrap();
    let caps = vec![parse_cap(cap)];
    let node = Node::new(identity, verifier, ledger, AgentConfig::new(caps, url.clone(), "http://127.0.0.1:1".into()));
    let svc =
        pb::atp_service_server::AtpServiceServer::new(Rejecting(AgentService(node), code, refuse, Default::default()));
    let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
    tokio::spawn(tonic::transport::Server::builder().add_service(svc).serve_with_incoming(incoming));
    url
}

fn parse_cap(s: &str) -> pb::Capability {
    scd_service::cli::atp::parse_capability(s).unwrap()
}

/// A peer that answers InvalidArgument, PermissionDenied or Unauthenticated
/// to a task is failed over (its circuit counts it), not obeyed: the task
/// completes on the next route instead of being abandoned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_calling_the_task_invalid_is_rerouted_not_obeyed() {
    use scd_atp::planner::{Event, Outcome};
    if !crate::ready() {
        return;
    }
    let scd = crate::grpc::start(&[]);
    crate::grpc::client(&scd).await;
    let dir = crate::scratch("atp-rejecting-peer");
    let honest = spawn_agent_with_scd(&dir.join("honest"), &scd.addr, &["--capability", "analysis:0.80:300:0.02"]);
    for (i, code) in [Code::InvalidArgument, Code::PermissionDenied, Code::Unauthenticated].into_iter().enumerate() {
        // the better, cheaper offer is the rejecting peer's: routed first
        let hostile =
            rejecting_peer(&dir.join(format!("hostile-{i}")), "analysis:0.95:200:0.01", code, Refuse::Task).await;
        let (planner, mut events) =
            planner(&dir.join(format!("planner-{i}")), &scd.addr, &[hostile, honest.url()]).await;
        match planner.run(&analysis_job(&format!("rej-{i}"), &[])).await.unwrap() {
            Outcome::Completed { agent, .. } => assert_eq!(agent, honest.did, "{code:?}"),
            other => panic!("{code:?}: {other:?}"),
        }
        let mut seen = Vec::new();
        while let Ok(e) = events.try_recv() {
            seen.push(e);
        }
        assert!(
            seen.iter().any(|e| matches!(e, Event::Rerouted { why, .. } if why.contains("refused as malformed"))),
            "{code:?}: {seen:#?}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The requester rates what it measured, not what the worker says of
/// itself, and rates a worker that refuses to countersign: quality 0, the
/// refusal noted as a violation, signed by the requester alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ratings_are_the_requesters_own_and_a_refused_countersignature_is_a_violation() {
    use scd_atp::planner::{Event, Outcome};
    if !crate::ready() {
        return;
    }
    let scd = crate::grpc::start(&[]);
    crate::grpc::client(&scd).await;
    let dir = crate::scratch("atp-own-ratings");
    let needs = ["idempotency key must be derived", "p99 latency"];
    // a modest self-report (0.60); the work is complete and finds its needs
    let honest = spawn_agent_with_scd(&dir.join("honest"), &scd.addr, &["--capability", "analysis:0.60:300:0.02"]);
    let (planner_a, _) = planner(&dir.join("planner-a"), &scd.addr, &[honest.url()]).await;
    let Outcome::Completed { quality, .. } = planner_a.run(&analysis_job("own-0", &needs)).await.unwrap() else {
        panic!("the honest agent completes")
    };
    assert_eq!(quality, 1.0, "measured: all steps seen, every need cited in a chunk sent");
    let p = planner_a.node().ledger.lock().unwrap().proofs().last().cloned().unwrap();
    assert!(p.quality_score == 1.0 && !p.responder_signature.is_empty() && p.note.is_empty(), "{p:?}");

    // a worker claiming 1.00 that will not countersign its rating
    let hostile =
        rejecting_peer(&dir.join("hostile"), "analysis:1.00:200:0.01", Code::PermissionDenied, Refuse::Proof).await;
    let (planner_b, mut events) = planner(&dir.join("planner-b"), &scd.addr, &[hostile]).await;
    let Outcome::Completed { agent, quality, .. } = planner_b.run(&analysis_job("own-1", &needs)).await.unwrap() else {
        panic!("the work itself completes")
    };
    assert_eq!(quality, 0.0);
    {
        let ledger = planner_b.node().ledger.lock().unwrap();
        let p = ledger.proofs().last().unwrap();
        assert_eq!(p.subject.as_ref().unwrap().uuid, agent);
        assert!(p.quality_score == 0.0 && p.responder_signature.is_empty(), "{p:?}");
        assert!(
            p.note.contains("countersignature refused (SubmitInteractionProof answered PermissionDenied)"),
            "{p:?}"
        );
        assert!(!p.note.contains("says this peer"), "a peer's message is not quoted into the log: {p:?}");
        assert_eq!(ledger.book().trust(&agent, Some(pb::TaskType::Analysis), scd_atp::identity::now_s()).samples, 1);
    }
    let mut seen = Vec::new();
    while let Ok(e) = events.try_recv() {
        seen.push(e);
    }
    assert!(
        seen.iter().any(|e| matches!(e, Event::Trust { note, .. } if note.contains("countersignature refused"))),
        "{seen:#?}"
    );

    // a worker whose first answer to the proof is a transport failure
    // (Unavailable) is asked again, and its countersignature counts; one
    // that countersigned but whose answer was lost answers the same proof
    // again with its ack (not as a replay): no violation either way
    for (name, refuse) in [("flaky", Refuse::ProofOnce), ("lost", Refuse::ProofAnswerLost)] {
        let peer = rejecting_peer(&dir.join(name), "analysis:0.90:200:0.01", Code::Unavailable, refuse).await;
        let (p, _) = planner(&dir.join(format!("planner-{name}")), &scd.addr, &[peer]).await;
        let Outcome::Completed { quality, .. } = p.run(&analysis_job(&format!("own-{name}"), &needs)).await.unwrap()
        else {
            panic!("{name}: the agent completes")
        };
        assert_eq!(quality, 1.0, "{name}");
        let proof = p.node().ledger.lock().unwrap().proofs().last().cloned().unwrap();
        assert!(!proof.responder_signature.is_empty() && proof.note.is_empty(), "{name}: countersigned: {proof:?}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
