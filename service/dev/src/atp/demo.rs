//! `scd-dev atp demo`: a live network on loopback.
//!
//! Starts SCD (`scd serve`) and six worker agents as separate processes
//! (`scd atp agent`: three coders and three reviewers with different
//! cost/quality/latency), runs a planner agent in this process, and delegates
//! a series of pipeline stages over a real multi-field context from
//! `fixtures/`. Mid-way it SIGKILLs the coder running the first task; the
//! planner notices (the stream breaks), fails over to the next route from
//! the last checkpoint, and the dead coder's circuit opens after three
//! consecutive failures. Later it SIGSTOPs the coder running the third task:
//! the stream stays open and only the missing heartbeats (T_fail) tell.
//! Both failovers are timed from the signal to the task's context at the
//! next agent (Property 5). A poison work order fails on three
//! reviewers and goes back with diagnostics. Forged, replayed and stale
//! envelopes are sent to a live worker and refused. The work is simulated;
//! identities, signatures, handshakes, routing, SCD transfers over gRPC,
//! heartbeats, checkpoints and failover are real.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use scd_atp::agent::{AgentConfig, Node, WorkOrder};
use scd_atp::context::{ContextFile, Task};
use scd_atp::identity::SignMessages as _;
use scd_atp::identity::{DidResolver, Identity, Verifier};
use scd_atp::planner::{short, Event, Job, Outcome, Planner};
use scd_atp::store::{Ledger, Store};
use scd_atp::{pb, Error, Result};

/// How to run the demo.
#[derive(Debug, Clone)]
pub struct DemoConfig {
    /// The `scd` binary (started as `scd serve` and `scd atp agent`).
    pub exe: PathBuf,
    /// The multi-field context (`{"fields": [...]}`).
    pub context: PathBuf,
    /// Where identities and stores go (a fresh directory).
    pub workdir: PathBuf,
    /// Use this running SCD instead of starting one.
    pub scd_url: Option<String>,
    /// Heartbeat interval of the workers.
    pub heartbeat: Duration,
}

/// Rejected envelopes, by reason.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Rejected {
    /// Signed by a key other than the sender DID's.
    pub forged: u32,
    /// A (sender, nonce) seen before.
    pub replayed: u32,
    /// Outside ±60 s.
    pub stale: u32,
}

/// Tokens through SCD.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ContextTotals {
    /// Tokens of the full non-confidential context, summed over hops.
    pub full_tokens: u64,
    /// Tokens sent, summed over hops (adaptive requests included).
    pub sent_tokens: u64,
    /// Adaptive context requests answered.
    pub context_requests: u32,
}

/// Trust of one agent in one category.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct TrustEntry {
    /// Definition 3 score.
    pub score: f64,
    /// Countersigned proofs behind it.
    pub samples: u32,
}

/// One failover the demo caused by signalling a worker mid-task.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct FailoverTime {
    /// `SIGKILL` (the process dies and its stream breaks) or `SIGSTOP` (it
    /// freezes: the stream stays open and the heartbeats stop, so only
    /// T_fail, 3 heartbeat intervals, tells).
    pub signal: String,
    /// The task it was running.
    pub task: String,
    /// Signal → the planner's failure verdict on the worker, ms.
    pub detected_ms: Option<u64>,
    /// Signal → the task's context at the next agent, with the checkpoint to
    /// resume from (Property 5's T_fail + T_route + T_transfer; the paper's
    /// bound is 5 s), ms.
    pub at_next_agent_ms: Option<u64>,
}

/// A failover being timed: when the signal went, to whom, where the task
/// went next, and the times so far (copied into the report at the end).
struct Disruption {
    at: Instant,
    victim: String,
    next: Option<String>,
    time: FailoverTime,
}

/// What `--json` writes.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct DemoReport {
    /// Tasks the planner delegated.
    pub tasks_submitted: u32,
    /// Completed.
    pub tasks_completed: u32,
    /// Neither completed nor returned as poison.
    pub tasks_lost: u32,
    /// Poison tasks returned to the originator.
    pub tasks_poison: u32,
    /// Tasks moved to another agent.
    pub failovers: u32,
    /// The failovers the demo caused, timed from the signal.
    pub failover_times: Vec<FailoverTime>,
    /// Circuits that opened.
    pub circuit_opened: u32,
    /// Refused envelopes.
    pub rejected: Rejected,
    /// Context through SCD.
    pub context: ContextTotals,
    /// agent name → task type → trust.
    pub trust: BTreeMap<String, BTreeMap<String, TrustEntry>>,
    /// The planner's log size (countersigned proofs).
    pub proofs: u64,
    /// Wall time of the run.
    pub seconds: f64,
}

/// A worker of the demo network.
struct Worker {
    name: &'static str,
    capability: &'static str,
    child: Child,
    did: String,
    url: String,
    /// SIGSTOPped: alive to the OS, silent to its peers.
    frozen: bool,
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A `scd serve` child process, killed when dropped.
pub struct ScdProcess(Child);

impl Drop for ScdProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

const WORKERS: [(&str, &str); 6] = [
    ("coder-fast", "code_generation:0.90:900:0.020"),
    ("coder-pro", "code_generation:0.95:1500:0.060"),
    ("coder-cheap", "code_generation:0.82:1200:0.010"),
    ("reviewer-a", "analysis:0.90:600:0.015"),
    ("reviewer-b", "analysis:0.93:900:0.030"),
    ("reviewer-c", "analysis:0.85:500:0.010"),
];

/// The line `scd atp agent` prints when it serves.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Ready {
    /// Always "ready".
    pub event: String,
    /// The agent's DID.
    pub did: String,
    /// Its bound address.
    pub addr: String,
    /// Where it serves its DID document (with --http-addr).
    #[serde(default)]
    pub http: Option<String>,
    /// Its atp.v1 URL (`https://` with --tls-cert).
    pub url: String,
}

fn spawn_worker(cfg: &DemoConfig, scd_url: &str, name: &'static str, capability: &'static str) -> Result<Worker> {
    let io = |e: std::io::Error| Error::Io { path: cfg.exe.clone(), source: e };
    let mut child = Command::new(&cfg.exe)
        .args(["atp", "agent", "--addr", "127.0.0.1:0", "--scd", scd_url, "--capability", capability])
        .arg("--identity")
        .arg(cfg.workdir.join(format!("{name}.identity.json")))
        .arg("--store")
        .arg(cfg.workdir.join(name))
        .args(["--heartbeat-ms", &cfg.heartbeat.as_millis().to_string()])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(io)?;
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("piped")).read_line(&mut line).map_err(io)?;
    let ready: Ready = serde_json::from_str(line.trim())
        .map_err(|e| Error::Invalid { field: format!("{name}'s ready line"), reason: format!("{e}: {line:?}") })?;
    Ok(Worker { name, capability, child, did: ready.did, url: format!("http://{}", ready.addr), frozen: false })
}

/// Starts `exe serve` on a free loopback port; returns it and its URL
/// (it may still be loading the model: see [`wait_serving`]).
pub fn start_scd(exe: &Path) -> Result<(ScdProcess, String)> {
    let io = |e: std::io::Error| Error::Io { path: exe.to_path_buf(), source: e };
    let mut child = Command::new(exe)
        .args(["serve", "--addr", "127.0.0.1:0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(io)?;
    let out = child.stdout.take().expect("piped");
    let proc = ScdProcess(child);
    for line in BufReader::new(out).lines() {
        let line = line.map_err(io)?;
        if let Some(addr) = line.strip_prefix("listening on ") {
            return Ok((proc, format!("http://{addr}")));
        }
    }
    Err(Error::Transport {
        what: "scd serve".into(),
        message: "exited before listening (is the model set up? run models/setup.sh)".into(),
    })
}

/// Waits until the SCD at `url` reports SERVING (at most 300 s).
pub async fn wait_serving(url: &str) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        if let Ok(ch) = tonic::transport::Endpoint::from_shared(url.to_string()).expect("valid").connect().await {
            let mut health = tonic_health::pb::health_client::HealthClient::new(ch);
            let req = tonic_health::pb::HealthCheckRequest { service: "scd.v1.Scd".into() };
            if let Ok(r) = health.check(req).await {
                if r.into_inner().status == tonic_health::pb::health_check_response::ServingStatus::Serving as i32 {
                    return Ok(());
                }
            }
        }
        if Instant::now() > deadline {
            return Err(Error::Timeout { what: format!("SCD at {url} to serve"), ms: 300_000 });
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn job(id: &str, task_type: pb::TaskType, description: &str, order: WorkOrder, context: &ContextFile) -> Job {
    Job {
        task_id: id.to_string(),
        task_type,
        task: Task::new(description),
        order,
        context: context.clone(),
        qos: pb::QoSConstraints { min_quality: 0.85, max_latency_ms: 5_000, max_cost: 0.10, min_trust: 0.0 },
    }
}

fn order(title: &str, steps: u32, needs: &[&str], fail: Option<&str>) -> WorkOrder {
    WorkOrder {
        title: title.to_string(),
        steps,
        needs: needs.iter().map(|s| s.to_string()).collect(),
        fail: fail.map(str::to_string),
    }
}

/// Runs the demo, writing the story to `out`.
pub async fn run(cfg: &DemoConfig, out: &mut (dyn Write + Send)) -> Result<DemoReport> {
    let started = Instant::now();
    std::fs::create_dir_all(&cfg.workdir).map_err(io(&cfg.workdir))?;
    let context = ContextFile::load(&cfg.context)?;

    let (_scd, scd_url) = match &cfg.scd_url {
        Some(url) => (None, url.clone()),
        None => {
            let (p, url) = start_scd(&cfg.exe)?;
            (Some(p), url)
        }
    };
    say(out, format!("SCD        {scd_url} (waiting for the model)"));
    wait_serving(&scd_url).await?;

    let mut workers = Vec::new();
    for (name, cap) in WORKERS {
        let w = spawn_worker(cfg, &scd_url, name, cap)?;
        say(out, format!("agent      {:<12} {} at {}  [{}]", w.name, short(&w.did), w.url, w.capability));
        workers.push(w);
    }
    let mut side = start_planner(cfg, &scd_url, &workers, out).await?;

    let mut report = DemoReport::default();
    // the signals sent, each timed
    let mut disruptions: Vec<Disruption> = Vec::new();
    for j in jobs(&context) {
        let mut run =
            JobRun { workers: &mut workers, disruptions: &mut disruptions, report: &mut report, out: &mut *out };
        run.delegate(&mut side, j).await?;
    }

    // layer 1 on the wire: forged, replayed and stale envelopes to a live worker
    say(out, "\n== security: envelopes to a live worker".to_string());
    let alive = workers.iter_mut().position(|w| !w.frozen && w.child.try_wait().ok().flatten().is_none());
    if let Some(target) = alive.map(|i| &workers[i]) {
        report.rejected = attacks(&side.node.identity, target).await?;
        say(
            out,
            format!(
                "  forged refused: {}, replayed refused: {}, stale refused: {}",
                report.rejected.forged, report.rejected.replayed, report.rejected.stale
            ),
        );
    }

    tally_context_and_trust(&side.node, &workers, &mut report);
    report.seconds = started.elapsed().as_secs_f64();
    report.failover_times = disruptions.into_iter().map(|d| d.time).collect();
    summarize(&report, out);
    // a frozen worker holds its connections to the planner open, which the
    // planner's graceful shutdown would wait on
    for w in workers.iter_mut().filter(|w| w.frozen) {
        let _ = w.child.kill();
        let _ = w.child.wait();
    }
    let _ = side.stop.send(());
    let _ = side.server.await;
    Ok(report)
}

/// Maps an I/O error to this crate's, naming `path`.
fn io(path: &Path) -> impl Fn(std::io::Error) -> Error {
    let path = path.to_path_buf();
    move |e: std::io::Error| Error::Io { path: path.clone(), source: e }
}

/// One line of the story.
fn say(out: &mut (dyn Write + Send), line: String) {
    let _ = writeln!(out, "{line}");
}

/// A worker's demo name for an agent shown by its short DID or URL.
fn name_of(agent: &str, workers: &[Worker]) -> String {
    workers
        .iter()
        .find(|w| short(&w.did) == agent || w.url == agent)
        .map_or_else(|| agent.to_string(), |w| w.name.to_string())
}

/// The planner: an agent in this process, serving until `stop`, with its
/// events subscribed.
struct PlannerSide {
    node: Arc<Node>,
    planner: Arc<Planner>,
    events: tokio::sync::mpsc::UnboundedReceiver<Event>,
    stop: tokio::sync::oneshot::Sender<()>,
    server: tokio::task::JoinHandle<Result<()>>,
}

/// Starts the planner over the workers' URLs.
async fn start_planner(
    cfg: &DemoConfig,
    scd_url: &str,
    workers: &[Worker],
    out: &mut (dyn Write + Send),
) -> Result<PlannerSide> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.map_err(io(&cfg.workdir))?;
    let addr = listener.local_addr().map_err(io(&cfg.workdir))?;
    let identity = Identity::load_or_create(&cfg.workdir.join("planner.identity.json"))?;
    let store = Arc::new(Store::open(&cfg.workdir.join("planner"))?);
    let resolver: Arc<dyn scd_atp::identity::Resolver> = Arc::new(DidResolver::new());
    let verifier = Verifier::new(resolver.clone(), store.clone());
    let ledger = Ledger::open(store, identity.did(), scd_atp::trust::TrustParams::default(), resolver)?;
    let mut config = AgentConfig::new(vec![], format!("http://{addr}"), scd_url.to_string());
    config.heartbeat = cfg.heartbeat;
    let node = Node::new(identity, verifier, ledger, config);
    say(out, format!("planner    {} at http://{addr}", short(node.did())));
    let (stop, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(scd_atp::agent::serve(node.clone(), listener, async {
        let _ = stop_rx.await;
    }));
    let (events_tx, events) = tokio::sync::mpsc::unbounded_channel();
    node.planner.subscribe(events_tx);
    let urls: Vec<String> = workers.iter().map(|w| w.url.clone()).collect();
    let planner = Arc::new(Planner::new(node.clone(), &urls)?);
    Ok(PlannerSide { node, planner, events, stop, server })
}

/// The demo's six tasks: two fixes with their reviews, one more fix, and a
/// task that fails everywhere (poison).
fn jobs(context: &ContextFile) -> Vec<Job> {
    let needs = ["idempotency", "retry", "timeout"];
    vec![
        job(
            "task-1-fix",
            pb::TaskType::CodeGeneration,
            "Fix the duplicate card captures: payment retries after a gateway timeout must reuse the idempotency key",
            order("patch capture_payment", 6, &needs, None),
            context,
        ),
        job(
            "task-1-review",
            pb::TaskType::Analysis,
            "Review the patch to capture_payment for duplicate charges on retry",
            order("review the patch", 3, &["idempotency"], None),
            context,
        ),
        job(
            "task-2-fix",
            pb::TaskType::CodeGeneration,
            "Add a reconciliation check that flags two captures for one authorization id",
            order("reconciliation check", 4, &["authorization"], None),
            context,
        ),
        job(
            "task-3-poison",
            pb::TaskType::Analysis,
            "Summarise the gateway timeout errors by order id",
            order("summarise timeouts", 4, &[], Some("the log parser crashes on this format")),
            context,
        ),
        job(
            "task-4-fix",
            pb::TaskType::CodeGeneration,
            "Cap the capture retry policy at 3 attempts",
            order("cap retries", 3, &["retry", "digest"], None),
            context,
        ),
        job(
            "task-4-review",
            pb::TaskType::Analysis,
            "Review the retry cap for the payments runbook",
            order("review retry cap", 3, &[], None),
            context,
        ),
    ]
}

/// What one task's delegation reads and updates.
struct JobRun<'a> {
    workers: &'a mut Vec<Worker>,
    disruptions: &'a mut Vec<Disruption>,
    report: &'a mut DemoReport,
    out: &'a mut (dyn Write + Send),
}

impl JobRun<'_> {
    /// Delegates `j` through the planner, telling its events as they come
    /// and disrupting its worker where the story says so.
    async fn delegate(&mut self, side: &mut PlannerSide, j: Job) -> Result<()> {
        say(self.out, format!("\n== {} ({}): {}", j.task_id, j.task_type.as_str_name(), j.task.description));
        self.report.tasks_submitted += 1;
        let p = side.planner.clone();
        let mut handle = tokio::spawn(async move { p.run(&j).await });
        let outcome = loop {
            tokio::select! {
                done = &mut handle => break done.map_err(|e| Error::Transport { what: "planner task".into(), message: e.to_string() })?,
                Some(e) = side.events.recv() => {
                    self.tell(&e);
                    if let Event::Checkpoint { task, agent, step } = &e {
                        self.disrupt(task, agent, *step);
                    }
                }
            }
        };
        while let Ok(e) = side.events.try_recv() {
            self.tell(&e);
        }
        self.record(outcome);
        Ok(())
    }

    /// Counts an event, tells it, and times the failovers it shows.
    fn tell(&mut self, e: &Event) {
        count(self.report, e);
        let workers: &[Worker] = self.workers;
        say(self.out, story(e, &|a: &str| name_of(a, workers)));
        time_failovers(self.disruptions, e);
    }

    /// After a checkpoint: a death, which breaks the stream, then a freeze,
    /// which only the missing heartbeats show (once per task).
    fn disrupt(&mut self, task: &str, agent: &str, step: u32) {
        let signal = match (task, step) {
            ("task-1-fix", s) if s >= 2 => "SIGKILL",
            ("task-2-fix", s) if s >= 1 => "SIGSTOP",
            _ => "",
        };
        let first = !self.disruptions.iter().any(|d| d.time.task == task);
        let Some(w) = self.workers.iter_mut().find(|w| short(&w.did) == agent).filter(|_| first && !signal.is_empty())
        else {
            return;
        };
        let at = Instant::now();
        let sent = if signal == "SIGKILL" { w.child.kill().is_ok() } else { freeze(&w.child) };
        if !sent {
            say(self.out, format!("  !! {signal} {} failed: this failover is not timed", w.name));
        } else {
            w.frozen = signal == "SIGSTOP";
            let time = FailoverTime { signal: signal.into(), task: task.to_string(), ..Default::default() };
            self.disruptions.push(Disruption { at, victim: agent.to_string(), next: None, time });
            say(self.out, format!("  !! {signal} {} (pid {}) mid-task, after checkpoint {step}", w.name, w.child.id()));
        }
    }

    /// How the task ended, counted and told.
    fn record(&mut self, outcome: Result<Outcome>) {
        let (report, out) = (&mut *self.report, &mut *self.out);
        match outcome {
            Ok(Outcome::Completed { agent, failovers, .. }) => {
                report.tasks_completed += 1;
                say(
                    out,
                    format!(
                        "  => completed by {} after {failovers} failover(s)",
                        name_of(&short(&agent), self.workers)
                    ),
                );
            }
            Ok(Outcome::Poison { diagnostics, .. }) => {
                report.tasks_poison += 1;
                say(out, format!("  => POISON, returned to the originator: {diagnostics}"));
            }
            Ok(Outcome::Lost { why, .. }) => {
                report.tasks_lost += 1;
                say(out, format!("  => LOST: {why}"));
            }
            Err(e) => {
                report.tasks_lost += 1;
                say(out, format!("  => LOST: {e}"));
            }
        }
    }
}

/// The context the planner sent against the full context, its proofs, and
/// the trust it holds in each worker for the task types it serves.
fn tally_context_and_trust(node: &Node, workers: &[Worker], report: &mut DemoReport) {
    let hops = node.planner.hops.lock().unwrap().totals();
    report.context = ContextTotals {
        full_tokens: hops.full_tokens,
        sent_tokens: hops.sent_tokens,
        context_requests: hops.context_requests,
    };
    let ledger = node.ledger.lock().unwrap();
    report.proofs = ledger.len();
    let now = scd_atp::agent::now_s();
    for w in workers {
        for t in [pb::TaskType::CodeGeneration, pb::TaskType::Analysis] {
            let score = ledger.trust(&w.did, Some(t), now);
            if w.capability.starts_with(&t.as_str_name()["TASK_TYPE_".len()..].to_lowercase()) {
                report
                    .trust
                    .entry(w.name.to_string())
                    .or_default()
                    .insert(t.as_str_name().to_string(), TrustEntry { score: score.score, samples: score.samples });
            }
        }
    }
}

/// The failover times and the summary line.
fn summarize(report: &DemoReport, out: &mut (dyn Write + Send)) {
    for f in &report.failover_times {
        let ms = |v: Option<u64>| v.map_or("never".to_string(), |v| format!("{v} ms"));
        say(out, format!(
            "failover after the {} in {}: detected in {}, the task's context at the next agent in {} (Property 5 bound: 5,000 ms)",
            f.signal, f.task, ms(f.detected_ms), ms(f.at_next_agent_ms)
        ));
    }
    say(out, format!(
        "\nsummary: {} tasks, {} completed, {} poison, {} lost; {} failover(s); {} circuit(s) opened; context {} of {} tokens sent ({:.1}× less), {} adaptive request(s); {} countersigned proofs; {:.1} s",
        report.tasks_submitted, report.tasks_completed, report.tasks_poison, report.tasks_lost, report.failovers, report.circuit_opened,
        report.context.sent_tokens, report.context.full_tokens,
        report.context.full_tokens as f64 / report.context.sent_tokens.max(1) as f64,
        report.context.context_requests, report.proofs, report.seconds
    ));
}

/// Times each signalled worker's failover: its failure verdict, then the
/// next agent's transfer.
fn time_failovers(disruptions: &mut [Disruption], e: &Event) {
    for d in disruptions.iter_mut() {
        let ms = Some(d.at.elapsed().as_millis() as u64);
        let f = &mut d.time;
        match e {
            Event::AgentFailed { agent, task, .. }
                if *agent == d.victim && *task == f.task && f.detected_ms.is_none() =>
            {
                f.detected_ms = ms;
            }
            Event::Failover { from, to, task, .. } if *from == d.victim && *task == f.task && d.next.is_none() => {
                d.next = Some(to.clone());
            }
            Event::ContextSent { agent, task, .. }
                if d.next.as_ref() == Some(agent) && *task == f.task && f.at_next_agent_ms.is_none() =>
            {
                f.at_next_agent_ms = ms;
            }
            _ => {}
        }
    }
}

/// SIGSTOPs `child`; false if that failed.
fn freeze(child: &Child) -> bool {
    let Ok(pid) = libc::pid_t::try_from(child.id()) else { return false };
    // SAFETY: kill(2) takes plain integers and touches no memory of ours;
    // `pid` is our own child's, which has not been waited for (its `Worker`
    // still holds it), so the id cannot have been reused.
    unsafe { libc::kill(pid, libc::SIGSTOP) == 0 }
}

fn count(report: &mut DemoReport, e: &Event) {
    match e {
        Event::Failover { .. } => report.failovers += 1,
        Event::Circuit { to, .. } if to == "Open" => report.circuit_opened += 1,
        _ => {}
    }
}

fn story(e: &Event, name: &dyn Fn(&str) -> String) -> String {
    match e {
        Event::Probed { round, offers, down, declined, .. } => format!(
            "  probe round {round}: offers from [{}]; declined [{}]; down [{}]",
            offers.iter().map(|a| name(a)).collect::<Vec<_>>().join(", "),
            declined.iter().map(|a| name(a)).collect::<Vec<_>>().join(", "),
            down.iter().map(|a| name(a)).collect::<Vec<_>>().join(", ")
        ),
        Event::Skipped { agent, .. } => format!("  circuit open: {} skipped", name(agent)),
        Event::Routed { pattern, agents, quality, latency_ms, cost, score, candidates, .. } => format!(
            "  route ({pattern}) {} among {candidates} candidates: quality {quality:.3}, latency {latency_ms} ms, cost ${cost:.3}, score {score:.4}",
            agents.iter().map(|a| name(a)).collect::<Vec<_>>().join(" → ")
        ),
        Event::Contracted { agent, contract, .. } => format!("  contract {contract} with {}", name(agent)),
        Event::Reoffered { agent, age_ms, .. } => format!("  offer of {} {age_ms} ms old: asked again", name(agent)),
        Event::ContextSent { agent, full_tokens, sent_tokens, chunks, withheld, .. } => format!(
            "  SCD → {}: {chunks} chunks, {sent_tokens} of {full_tokens} tokens ({:.1}× less); withheld: [{}]",
            name(agent),
            *full_tokens as f64 / (*sent_tokens).max(1) as f64,
            withheld.join(", ")
        ),
        Event::ContextRequested { agent, question, confidence, chunks, remaining_tokens, .. } => format!(
            "  {} unsure (confidence {confidence:.2} < 0.7) asks \"{question}\": {chunks} new chunk(s) via the SCD session, {remaining_tokens} tokens of its budget left",
            name(agent)
        ),
        Event::Checkpoint { agent, step, .. } => format!("  checkpoint {step} from {}", name(agent)),
        Event::AgentFailed { agent, why, .. } => format!("  {} failed: {why}", name(agent)),
        Event::Failover { from, to, resumed_after, .. } => {
            format!("  FAILOVER {} → {}, resuming after checkpoint {resumed_after}", name(from), name(to))
        }
        Event::Circuit { agent, from, to } => format!("  circuit of {}: {from} → {to}", name(agent)),
        Event::Rerouted { agent, why, .. } => format!("  rerouted around {}: {why}", name(agent)),
        Event::Buffered { agent, ms, .. } => format!("  buffered {ms} ms for {}'s back-pressure", name(agent)),
        Event::Backpressure { agent, queue_depth, action } => format!("  back-pressure from {} (queue {queue_depth}): {action}", name(agent)),
        Event::Poison { diagnostics, .. } => format!("  POISON: {diagnostics}"),
        Event::Completed { agent, latency_ms, quality, resumed_after, .. } => {
            format!("  done by {} in {latency_ms} ms, quality {quality:.2}, resumed after step {resumed_after}", name(agent))
        }
        Event::Repriced { agent, why } => format!("  repricing {}: {why}", name(agent)),
        Event::Trust { agent, task_type, score, samples, log_size, note } => format!(
            "  trust of {} for {task_type}: {score:.3} ({samples} proofs); planner log size {log_size}{}",
            name(agent),
            if note.is_empty() { String::new() } else { format!("; NEGATIVE: {note}") }
        ),
    }
}

/// Sends a forged, a replayed and a stale envelope to `target` and counts
/// the UNAUTHENTICATED refusals by reason.
async fn attacks(me: &Identity, target: &Worker) -> Result<Rejected> {
    let channel = scd_atp::handshake::channel(&target.url)?;
    let mut client = pb::atp_service_client::AtpServiceClient::new(channel);
    let task_type =
        if target.capability.starts_with("analysis") { pb::TaskType::Analysis } else { pb::TaskType::CodeGeneration };
    let envelope = |signer: &Identity, stale: bool| {
        let mut probe = pb::CapabilityProbe {
            from: Some(me.agent_id()),
            task_type: task_type as i32,
            qos: Some(pb::QoSConstraints { min_quality: 0.5, ..Default::default() }),
            ..Default::default()
        };
        signer.stamp_and_sign(&mut probe);
        let mut env = pb::AtpMessage {
            message_id: format!("msg-{:016x}", rand::random::<u64>()),
            sender_did: me.did().to_string(),
            receiver_did: target.did.clone(),
            r#type: pb::MessageType::CapabilityProbe as i32,
            protocol_version: 1,
            payload: Some(pb::atp_message::Payload::Probe(probe)),
            ..Default::default()
        };
        signer.stamp_and_sign(&mut env);
        if stale {
            env.timestamp -= 120;
            signer.sign(&mut env);
        }
        env
    };
    let mut r = Rejected::default();
    let refused = |status: &tonic::Status, word: &str| {
        status.code() == tonic::Code::Unauthenticated && status.message().contains(word)
    };
    // forged: claims to be the planner, signed by another key
    let forger = Identity::generate();
    if let Err(s) = client.exchange(envelope(&forger, false)).await {
        r.forged += u32::from(refused(&s, "does not verify"));
    }
    // replayed: a good envelope, then the same bytes again
    let good = envelope(me, false);
    client.exchange(good.clone()).await.map_err(|s| Error::Peer {
        did: target.did.clone(),
        rpc: "Exchange",
        status: s.code(),
        message: s.message().into(),
    })?;
    if let Err(s) = client.exchange(good).await {
        r.replayed += u32::from(refused(&s, "replayed"));
    }
    // stale: signed correctly, two minutes old
    if let Err(s) = client.exchange(envelope(me, true)).await {
        r.stale += u32::from(refused(&s, "stale"));
    }
    Ok(r)
}
