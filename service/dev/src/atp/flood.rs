//! `scd-dev atp flood`: one worker (`scd atp agent`, a separate process) under a
//! flood of maximal tasks, and its resident memory sampled from
//! `/proc/PID/status` while it lasts.
//!
//! Each of `requesters` peers, every one with its own did:key, loops:
//! probe → offer → contract → TaskSubmit with the largest context the worker
//! takes ([`scd_atp::agent::MAX_CONTEXT_CHUNKS`] chunks filling a message of
//! just under [`scd_atp::agent::MAX_MESSAGE_BYTES`]), the most steps
//! ([`MAX_STEPS`], so the most checkpoints) and the most needs. A full queue
//! (RESOURCE_EXHAUSTED) is retried under the same contract after the
//! worker's `retry-after-ms` hint (a doubling pause without one). The peers never read their results while the flood lasts (finished
//! jobs stay with the worker); at the end each accepted task's results are
//! read once, to count what completed. What it shows: the worker's RSS
//! stays within what its bounds allow (the tasks it holds at once, times
//! one message each, plus one message per connection being decoded) however
//! many tasks pass through.

use std::io::{BufRead as _, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use plotters::prelude::*;
use serde::Serialize;
use tokio_stream::StreamExt as _;

use scd_atp::agent::{WorkOrder, MAX_CONTEXT_CHUNKS, MAX_MESSAGE_BYTES, MAX_NEEDS, MAX_STEPS};
use scd_atp::handshake::{self, Offer};
use scd_atp::identity::{Identity, SignMessages as _};
use scd_atp::pb;
use scd_atp::pb::atp_service_client::AtpServiceClient;

/// How to flood.
#[derive(Debug, Clone)]
pub struct FloodConfig {
    /// The `scd` binary (started as `scd atp agent`).
    pub exe: PathBuf,
    /// Where the worker's identity and store go.
    pub workdir: PathBuf,
    /// Tasks to have accepted in all.
    pub tasks: u64,
    /// Concurrent peers, each with its own DID and connection.
    pub requesters: usize,
    /// Bytes of chunk text per task (split over the most chunks allowed).
    pub context_bytes: usize,
    /// The worker's `--max-queue` and `--max-running`.
    pub max_queue: usize,
    /// See `max_queue`.
    pub max_running: usize,
    /// The worker's whole-task latency (its steps share it).
    pub task_ms: u64,
}

/// The largest context that fits one message with the work order, ids and
/// signatures beside it.
pub const DEFAULT_CONTEXT_BYTES: usize = MAX_MESSAGE_BYTES - (512 << 10);

/// What the flood measured.
#[derive(Debug, Clone, Serialize)]
pub struct FloodReport {
    /// Tasks asked for.
    pub tasks: u64,
    /// Concurrent peers.
    pub requesters: usize,
    /// Chunk text per task (bytes) and its chunks.
    pub context_bytes: usize,
    /// See `context_bytes`.
    pub chunks: usize,
    /// Steps per task.
    pub steps: u32,
    /// The worker's queue and running slots.
    pub max_queue: usize,
    /// See `max_queue`.
    pub max_running: usize,
    /// Tasks the worker accepted.
    pub accepted: u64,
    /// Submits refused because its queue was full (each retried).
    pub queue_full: u64,
    /// Other refusals (not retried), by their first words.
    pub refused: Vec<String>,
    /// Accepted tasks whose final result said Completed.
    pub completed: u64,
    /// Bytes of TaskSubmit sent (retries included).
    pub sent_bytes: u64,
    /// Wall time of the flood, without the final reads.
    pub seconds: f64,
    /// The worker's RSS before the first task (KiB).
    pub rss_idle_kib: u64,
    /// Its peak RSS over the run (VmHWM, KiB).
    pub rss_peak_kib: u64,
    /// Its RSS when a quarter of the tasks had been accepted, and at the end.
    pub rss_quarter_kib: u64,
    /// See `rss_quarter_kib`.
    pub rss_end_kib: u64,
    /// Messages the bounds admit at once: the worker's queue and running
    /// slots, plus one being decoded per peer connection.
    pub in_flight_max: u64,
    /// One copy of each of those messages (KiB): the peak above idle, over
    /// this, is how many copies a message costs at its worst.
    pub one_copy_kib: u64,
    /// (ms since start, RSS KiB), every 100 ms.
    pub samples: Vec<(u64, u64)>,
}

impl FloodReport {
    /// A few lines for the terminal.
    pub fn summary(&self) -> String {
        let mib = |k: u64| k as f64 / 1024.0;
        format!(
            "{} maximal tasks ({:.1} MiB of context, {} chunks, {} steps each) from {} peers in {:.1} s: \
             {} accepted, {} completed, {} queue-full refusals retried, {} other refusals; {:.1} GiB sent\n\
             worker RSS: idle {:.0} MiB, after a quarter {:.0} MiB, at the end {:.0} MiB, peak {:.0} MiB: \
             {:.2}× one copy of the {} messages the bounds admit at once ({:.0} MiB)",
            self.tasks,
            self.context_bytes as f64 / (1 << 20) as f64,
            self.chunks,
            self.steps,
            self.requesters,
            self.seconds,
            self.accepted,
            self.completed,
            self.queue_full,
            self.refused.len(),
            self.sent_bytes as f64 / (1u64 << 30) as f64,
            mib(self.rss_idle_kib),
            mib(self.rss_quarter_kib),
            mib(self.rss_end_kib),
            mib(self.rss_peak_kib),
            self.rss_peak_kib.saturating_sub(self.rss_idle_kib) as f64 / self.one_copy_kib.max(1) as f64,
            self.in_flight_max,
            mib(self.one_copy_kib),
        )
    }
}

/// The worker process, killed when dropped.
struct Worker(Child);

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// (VmRSS, VmHWM) of `pid` in KiB.
fn memory(pid: u32) -> Option<(u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
    };
    Some((field("VmRSS:")?, field("VmHWM:")?))
}

fn spawn_worker(cfg: &FloodConfig) -> anyhow::Result<(Worker, String, String)> {
    let capability = format!("code_generation:0.9:{}:0.01", cfg.task_ms);
    let mut child = Command::new(&cfg.exe)
        .args(["atp", "agent", "--addr", "127.0.0.1:0", "--scd", "http://127.0.0.1:1", "--capability", &capability])
        .arg("--identity")
        .arg(cfg.workdir.join("worker.identity.json"))
        .arg("--store")
        .arg(cfg.workdir.join("worker"))
        .args(["--max-queue", &cfg.max_queue.to_string(), "--max-running", &cfg.max_running.to_string()])
        .args(["--audit-level", "off"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| format!("starting {} atp agent", cfg.exe.display()))?;
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("piped")).read_line(&mut line).context("reading the ready line")?;
    let worker = Worker(child);
    let ready: serde_json::Value =
        serde_json::from_str(line.trim()).with_context(|| format!("the worker's ready line {line:?}"))?;
    let (Some(did), Some(addr)) = (ready["did"].as_str(), ready["addr"].as_str()) else {
        bail!("the worker's ready line has no did and addr: {line:?}");
    };
    Ok((worker, did.to_string(), format!("http://{addr}")))
}

/// The maximal context: `bytes` of text over the most chunks allowed.
fn context(bytes: usize) -> pb::ContextDiff {
    let per = bytes / MAX_CONTEXT_CHUNKS;
    let words = ["gateway", "timeout", "retry", "charge", "order", "ledger", "refund", "idempotency"];
    let chunks = (0..MAX_CONTEXT_CHUNKS)
        .map(|i| {
            let mut data = String::with_capacity(per + 16);
            let mut w = i;
            while data.len() < per {
                data.push_str(words[w % words.len()]);
                data.push(' ');
                w = w.wrapping_mul(31).wrapping_add(7);
            }
            data.truncate(per);
            pb::ContextChunk {
                index: i as u32,
                data: data.into_bytes(),
                relevance_score: 0.5,
                chunk_id: format!("log#{i}"),
                field: "log".into(),
                tokens: (per / 4) as u32,
            }
        })
        .collect();
    pb::ContextDiff {
        chunks,
        original_size: (bytes / 4) as u64,
        compressed_size: (bytes / 4) as u64,
        ..Default::default()
    }
}

fn qos() -> pb::QoSConstraints {
    pb::QoSConstraints { min_quality: 0.5, max_latency_ms: 0, max_cost: 0.0, min_trust: 0.0 }
}

/// What the peers share: the target, the task, and their counters.
struct Flood {
    url: String,
    worker: String,
    pid: u32,
    diff: pb::ContextDiff,
    tasks: u64,
    bar: indicatif::ProgressBar,
    accepted: AtomicU64,
    queue_full: AtomicU64,
    sent_bytes: AtomicU64,
    refused: Mutex<Vec<String>>,
    /// Accepted tasks, by submitter.
    submitted: Mutex<Vec<(Arc<Identity>, String)>>,
    /// RSS when a quarter of the tasks had been accepted.
    quarter: Mutex<Option<u64>>,
}

/// One peer: contracts and submits until the flood's tasks are accepted
/// (the peers check the count before each task, so at most one more each).
async fn requester(me: Arc<Identity>, f: Arc<Flood>) -> anyhow::Result<()> {
    let (url, tally, tasks) = (&f.url, &f, f.tasks);
    let channel = handshake::channel(url)?;
    let mut client = AtpServiceClient::new(channel).max_encoding_message_size(MAX_MESSAGE_BYTES);
    let order = WorkOrder {
        title: "flood".into(),
        steps: MAX_STEPS,
        needs: (0..MAX_NEEDS).map(|i| format!("need {i} nowhere in the context")).collect(),
        fail: None,
    };
    let payload = serde_json::to_vec(&order)?;
    let mut n = 0u64;
    loop {
        let id = tally.accepted.load(Ordering::Relaxed);
        if id >= tasks {
            return Ok(());
        }
        n += 1;
        let task_id = format!("flood-{}-{n}", &me.did()[me.did().len() - 6..]);
        let mut probe = pb::CapabilityProbe {
            from: Some(me.agent_id()),
            task_type: pb::TaskType::CodeGeneration as i32,
            qos: Some(qos()),
            task_id: task_id.clone(),
            ..Default::default()
        };
        me.stamp_and_sign(&mut probe);
        let offer = client.probe(probe).await.context("probe")?.into_inner();
        let offer = Offer { url: url.clone(), offer, asked_at: std::time::Instant::now() };
        let contract = handshake::contract_for(&me, &offer, &task_id, qos(), "http://127.0.0.1:1");
        let ack = client.accept_contract(contract.clone()).await.context("accept_contract")?.into_inner();
        if !ack.accepted {
            tally.refused.lock().unwrap().push(format!("contract: {}", ack.reason));
            continue;
        }
        let mut pause = Duration::from_millis(50);
        loop {
            let mut submit = pb::TaskSubmit {
                from: Some(me.agent_id()),
                to: Some(pb::AgentId { uuid: f.worker.clone() }),
                task_id: task_id.clone(),
                task_type: pb::TaskType::CodeGeneration as i32,
                payload: payload.clone(),
                context: Some(f.diff.clone()),
                contract_id: contract.contract_id.clone(),
                ..Default::default()
            };
            me.stamp_and_sign(&mut submit);
            tally.sent_bytes.fetch_add(prost::Message::encoded_len(&submit) as u64, Ordering::Relaxed);
            match client.submit_task(submit).await {
                Ok(r) if r.get_ref().accepted => {
                    let done = tally.accepted.fetch_add(1, Ordering::Relaxed) + 1;
                    tally.submitted.lock().unwrap().push((me.clone(), task_id.clone()));
                    f.bar.inc(1);
                    if done == tasks.div_ceil(4) {
                        *f.quarter.lock().unwrap() = memory(f.pid).map(|m| m.0);
                    }
                    break;
                }
                Ok(r) => {
                    tally.refused.lock().unwrap().push(format!("ack: {}", r.get_ref().reason));
                    break;
                }
                Err(s) if s.code() == tonic::Code::ResourceExhausted => {
                    // the worker's hint when it gives one, else a doubling pause
                    tally.queue_full.fetch_add(1, Ordering::Relaxed);
                    let hint = s.metadata().get("retry-after-ms").and_then(|v| v.to_str().ok()?.parse().ok());
                    let wait = hint.map_or(pause, |ms: u64| Duration::from_millis(ms.clamp(20, 2_000)));
                    tokio::time::sleep(wait).await;
                    pause = (pause * 2).min(Duration::from_millis(800));
                }
                Err(s) => {
                    tally.refused.lock().unwrap().push(format!("{:?}: {}", s.code(), s.message()));
                    break;
                }
            }
        }
    }
}

/// Whether `task_id` of `me` ended Completed at `url`.
async fn completed(me: &Identity, url: &str, task_id: &str) -> bool {
    let Ok(channel) = handshake::channel(url) else { return false };
    let mut client = AtpServiceClient::new(channel);
    let mut query = pb::TaskQuery { task_id: task_id.into(), from: Some(me.agent_id()), ..Default::default() };
    me.stamp_and_sign(&mut query);
    let Ok(stream) = client.stream_results(query).await else { return false };
    let mut stream = stream.into_inner();
    let deadline = tokio::time::sleep(Duration::from_secs(60));
    tokio::pin!(deadline);
    loop {
        tokio::select! {
            _ = &mut deadline => return false,
            r = stream.next() => match r {
                Some(Ok(r)) if r.status == pb::TaskStatus::Completed as i32 => return true,
                Some(Ok(r)) if r.status != pb::TaskStatus::Running as i32 => return false,
                Some(Ok(_)) => {}
                _ => return false,
            },
        }
    }
}

/// Runs the flood.
pub async fn run(cfg: &FloodConfig) -> anyhow::Result<FloodReport> {
    std::fs::create_dir_all(&cfg.workdir).with_context(|| format!("--workdir {}", cfg.workdir.display()))?;
    let (worker, did, url) = spawn_worker(cfg)?;
    let pid = worker.0.id();
    // settle, then the idle figure
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (rss_idle_kib, _) = memory(pid).context("reading the worker's /proc status")?;
    let started = Instant::now();
    let samples = Arc::new(Mutex::new(vec![(0, rss_idle_kib)]));
    let sampler = {
        let samples = samples.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(100));
            loop {
                tick.tick().await;
                let Some((rss, _)) = memory(pid) else { break };
                samples.lock().unwrap().push((started.elapsed().as_millis() as u64, rss));
            }
        })
    };
    let bar = indicatif::ProgressBar::new(cfg.tasks);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{spinner} flood {pos}/{len} tasks accepted [{elapsed}] {msg}")
            .expect("static template"),
    );
    let tally = Arc::new(Flood {
        url: url.clone(),
        worker: did,
        pid,
        diff: context(cfg.context_bytes),
        tasks: cfg.tasks,
        bar: bar.clone(),
        accepted: AtomicU64::new(0),
        queue_full: AtomicU64::new(0),
        sent_bytes: AtomicU64::new(0),
        refused: Mutex::new(Vec::new()),
        submitted: Mutex::new(Vec::new()),
        quarter: Mutex::new(None),
    });
    let peers: Vec<_> =
        (0..cfg.requesters).map(|_| tokio::spawn(requester(Arc::new(Identity::generate()), tally.clone()))).collect();
    for p in peers {
        p.await.context("a flooding peer panicked")??;
    }
    let seconds = started.elapsed().as_secs_f64();
    bar.finish_and_clear();
    // every accepted task's final result, read once
    let tasks = std::mem::take(&mut *tally.submitted.lock().unwrap());
    let mut done = 0;
    for (me, id) in &tasks {
        done += completed(me, &url, id).await as u64;
    }
    let (rss_end_kib, rss_peak_kib) = memory(pid).context("reading the worker's /proc status")?;
    sampler.abort();
    drop(worker);
    let message = (prost::Message::encoded_len(&tally.diff) + (64 << 10)) as u64 / 1024;
    let held = (cfg.max_queue + cfg.max_running + cfg.requesters) as u64;
    let samples = std::mem::take(&mut *samples.lock().unwrap());
    let refused = std::mem::take(&mut *tally.refused.lock().unwrap());
    let rss_quarter_kib = tally.quarter.lock().unwrap().unwrap_or(rss_end_kib);
    Ok(FloodReport {
        tasks: cfg.tasks,
        requesters: cfg.requesters,
        context_bytes: cfg.context_bytes,
        chunks: tally.diff.chunks.len(),
        steps: MAX_STEPS,
        max_queue: cfg.max_queue,
        max_running: cfg.max_running,
        accepted: tally.accepted.load(Ordering::Relaxed),
        queue_full: tally.queue_full.load(Ordering::Relaxed),
        refused,
        completed: done,
        sent_bytes: tally.sent_bytes.load(Ordering::Relaxed),
        seconds,
        rss_idle_kib,
        rss_peak_kib,
        rss_quarter_kib,
        rss_end_kib,
        in_flight_max: held,
        one_copy_kib: held * message,
        samples,
    })
}

/// The worker's RSS over the flood, with the idle level and the bound.
pub fn write_svg(report: &FloodReport, path: &Path) -> anyhow::Result<()> {
    let mut out = String::new();
    {
        let mib = |k: u64| k as f64 / 1024.0;
        let end_s = report.samples.last().map_or(1.0, |s| s.0 as f64 / 1000.0).max(1.0);
        let bound = mib(report.rss_idle_kib + report.one_copy_kib);
        let top = mib(report.rss_peak_kib).max(bound) * 1.1;
        let root = SVGBackend::with_string(&mut out, (860, 420)).into_drawing_area();
        root.fill(&WHITE)?;
        let title = format!(
            "scd atp agent under {} maximal tasks ({:.0} MiB each) from {} peers",
            report.tasks,
            report.context_bytes as f64 / (1 << 20) as f64,
            report.requesters
        );
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 14))
            .margin(12)
            .x_label_area_size(30)
            .y_label_area_size(50)
            .build_cartesian_2d(0f64..end_s, 0f64..top)?;
        chart.configure_mesh().x_desc("seconds").y_desc("RSS (MiB)").draw()?;
        let red = RGBColor(0xd6, 0x27, 0x28);
        chart
            .draw_series(LineSeries::new(report.samples.iter().map(|(ms, k)| (*ms as f64 / 1000.0, mib(*k))), red))?
            .label("worker RSS")
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 16, y)], red));
        let grey = RGBColor(0x7f, 0x7f, 0x7f);
        chart
            .draw_series(LineSeries::new([(0.0, bound), (end_s, bound)], grey))?
            .label("idle + one copy of each message admitted at once")
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 16, y)], grey));
        chart.configure_series_labels().position(SeriesLabelPosition::LowerRight).border_style(BLACK).draw()?;
        root.present()?;
    }
    std::fs::write(path, out).with_context(|| format!("--plot {}", path.display()))
}
