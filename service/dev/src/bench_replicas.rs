//! `scd-dev bench-replicas`: served session throughput of one replica against
//! two replicas behind HAProxy (both on Redis state), and the latency
//! Redis adds to a session call against in-process sessions, in one run.
//!
//! It starts everything itself, on loopback, in a scratch folder, and stops
//! it after: a `redis-server` (docs/deploy/redis.conf), `scd serve`
//! replicas (this binary), and HAProxy (docs/deploy/haproxy.cfg). The
//! workload is what an agent does: open a session with a Compress of a
//! real context, then two RequestContext follow-ups. Every session has its
//! own task and questions (each call embeds a query); the context is the
//! same, so it is prepared once per replica.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::json;

use super::percentile;
use scd_service::grpc::pb;

/// Arguments of `scd-dev bench-replicas`.
#[derive(Debug, clap::Args)]
pub struct BenchReplicasArgs {
    /// The context every session is opened on (the CLI's context JSON).
    #[arg(long, default_value = "fixtures/agent_context.json")]
    context: PathBuf,
    /// Concurrent clients in the throughput phases.
    #[arg(long, default_value_t = 8)]
    clients: usize,
    /// Seconds of each throughput phase.
    #[arg(long, default_value_t = 30)]
    seconds: u64,
    /// Sessions (each: open + two follow-ups) of the latency phases, one client.
    #[arg(long, default_value_t = 150)]
    latency_sessions: usize,
    /// HAProxy's configuration (its addresses come from the environment).
    #[arg(long, default_value = "docs/deploy/haproxy.cfg")]
    haproxy_config: PathBuf,
    /// Redis's configuration.
    #[arg(long, default_value = "docs/deploy/redis.conf")]
    redis_config: PathBuf,
    /// Also write the JSON report here.
    #[arg(long)]
    json: Option<PathBuf>,
}

fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// A child process killed when dropped.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

struct Replica {
    _proc: Proc,
    grpc: u16,
    http: u16,
}

fn replica(dir: &Path, name: &str, threads: usize, state: Option<&str>) -> anyhow::Result<Replica> {
    let (grpc, http) = (free_port()?, free_port()?);
    let mut cmd = Command::new(crate::scd_exe()?);
    cmd.env("SCD_THREADS", threads.to_string()).env("SCD_EMBEDDING_CACHE", "off").args([
        "serve",
        "--addr",
        &format!("127.0.0.1:{grpc}"),
        "--http-addr",
        &format!("127.0.0.1:{http}"),
    ]);
    if let Some(url) = state {
        cmd.args(["--state", url]);
    }
    let log = dir.join(format!("{name}.log"));
    let mut child = cmd.stdout(Stdio::piped()).stderr(std::fs::File::create(&log)?).spawn()?;
    let mut lines = BufReader::new(child.stdout.take().expect("piped")).lines();
    loop {
        match lines.next() {
            Some(line) => {
                if line?.starts_with("listening on ") {
                    break;
                }
            }
            None => bail!("replica {name} exited: {}", std::fs::read_to_string(&log).unwrap_or_default()),
        }
    }
    std::thread::spawn(move || for _ in lines {});
    let r = Replica { _proc: Proc(child), grpc, http };
    let t = Instant::now();
    while !ready(http) {
        if t.elapsed() > Duration::from_secs(120) {
            bail!("replica {name} never became ready");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(r)
}

fn ready(http: u16) -> bool {
    use std::io::{Read, Write};
    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", http)) else { return false };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    let _ = write!(s, "GET /ready HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out.starts_with("HTTP/1.1 200")
}

fn redis(dir: &Path, config: &Path) -> anyhow::Result<(Proc, String)> {
    let port = free_port()?;
    let child = Command::new("redis-server")
        .arg(config)
        .args(["--port", &port.to_string(), "--dir", dir.to_str().context("scratch path")?])
        .stdout(std::fs::File::create(dir.join("redis.log"))?)
        .spawn()
        .context("redis-server (Debian's redis-server package)")?;
    let p = Proc(child);
    let t = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if t.elapsed() > Duration::from_secs(10) {
            bail!("redis-server did not start");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok((p, format!("redis://127.0.0.1:{port}/0")))
}

fn haproxy(dir: &Path, config: &Path, a: &Replica, b: &Replica) -> anyhow::Result<(Proc, u16)> {
    let port = free_port()?;
    let child = Command::new("haproxy")
        .args(["-db", "-f"])
        .arg(config)
        .env("SCD_LB_ADDR", format!("127.0.0.1:{port}"))
        // the HTTP frontend is unused here, but the file binds it
        .env("SCD_LB_HTTP_ADDR", format!("127.0.0.1:{}", free_port()?))
        .env("SCD_A", format!("127.0.0.1:{}", a.grpc))
        .env("SCD_B", format!("127.0.0.1:{}", b.grpc))
        .env("SCD_A_HTTP", format!("127.0.0.1:{}", a.http))
        .env("SCD_B_HTTP", format!("127.0.0.1:{}", b.http))
        .stdout(std::fs::File::create(dir.join("haproxy.log"))?)
        .stderr(std::fs::File::create(dir.join("haproxy.err"))?)
        .spawn()
        .context("haproxy (Debian's haproxy package)")?;
    Ok((Proc(child), port))
}

/// Latencies (ms) per method and errors by code.
#[derive(Default)]
struct Tally {
    ms: BTreeMap<&'static str, Vec<f64>>,
    errors: BTreeMap<String, u64>,
    sessions: u64,
}

impl Tally {
    fn merge(&mut self, o: Tally) {
        for (k, mut v) in o.ms {
            self.ms.entry(k).or_default().append(&mut v);
        }
        for (k, n) in o.errors {
            *self.errors.entry(k).or_default() += n;
        }
        self.sessions += o.sessions;
    }

    fn report(mut self, seconds: f64) -> serde_json::Value {
        let calls: usize = self.ms.values().map(Vec::len).sum();
        let methods: serde_json::Map<String, serde_json::Value> = self
            .ms
            .iter_mut()
            .map(|(k, v)| {
                let n = v.len();
                (k.to_string(), json!({"calls": n, "p50_ms": percentile(v, 0.5), "p99_ms": percentile(v, 0.99)}))
            })
            .collect();
        json!({
            "seconds": seconds,
            "sessions": self.sessions,
            "calls": calls,
            "calls_per_s": calls as f64 / seconds.max(1e-9),
            "sessions_per_s": self.sessions as f64 / seconds.max(1e-9),
            "methods": methods,
            "errors": self.errors,
        })
    }
}

const QUESTIONS: [&str; 2] = ["which setting limits the connection pool", "what did the logs say about retries"];

/// One session: open, then two follow-ups; latencies into `t`.
async fn session(
    c: &mut pb::scd_client::ScdClient<tonic::transport::Channel>,
    open: &pb::CompressRequest,
    id: String,
    vary: bool,
    t: &mut Tally,
) {
    // `vary`: each session its own task and questions, so every call embeds
    // a query (the context itself is prepared once and shared, as an
    // agent's is); else the embeddings are cached and a call is the
    // selection and the session store
    let mut req = open.clone();
    req.session_id = id.clone();
    if let Some(task) = req.task.as_mut().filter(|_| vary) {
        task.description = format!("{} ({id})", task.description);
    }
    let s = Instant::now();
    let token = match c.compress(req).await {
        Ok(r) => r.into_inner().session_token,
        Err(e) => {
            *t.errors.entry(format!("Compress {:?}", e.code())).or_default() += 1;
            return;
        }
    };
    t.ms.entry("Compress (opens)").or_default().push(s.elapsed().as_secs_f64() * 1e3);
    for q in QUESTIONS {
        let req = pb::ContextRequest {
            session_id: id.clone(),
            session_token: token.clone(),
            specific_question: if vary { format!("{q} ({id})") } else { q.to_string() },
            current_confidence: 0.2,
            max_tokens: 60,
            ..Default::default()
        };
        let s = Instant::now();
        match c.request_context(req).await {
            Ok(_) => t.ms.entry("RequestContext").or_default().push(s.elapsed().as_secs_f64() * 1e3),
            Err(e) => *t.errors.entry(format!("RequestContext {:?}", e.code())).or_default() += 1,
        }
    }
    t.sessions += 1;
}

/// `clients` clients running sessions against `addr` for `seconds`.
async fn load(
    addr: String,
    open: &pb::CompressRequest,
    clients: usize,
    seconds: u64,
    bar: &ProgressBar,
) -> serde_json::Value {
    let stop = Instant::now() + Duration::from_secs(seconds);
    let started = Instant::now();
    let tasks: Vec<_> = (0..clients)
        .map(|k| {
            let (addr, open, bar) = (addr.clone(), open.clone(), bar.clone());
            tokio::spawn(async move {
                let mut t = Tally::default();
                let Ok(mut c) = pb::scd_client::ScdClient::connect(addr).await else {
                    *t.errors.entry("connect".into()).or_default() += 1;
                    return t;
                };
                let mut n = 0;
                while Instant::now() < stop {
                    session(&mut c, &open, format!("bench-{k}-{n}-{:08x}", rand::random::<u32>()), true, &mut t).await;
                    n += 1;
                    bar.inc(1);
                }
                t
            })
        })
        .collect();
    let mut all = Tally::default();
    for task in tasks {
        if let Ok(t) = task.await {
            all.merge(t);
        }
    }
    all.report(started.elapsed().as_secs_f64())
}

/// One client, `n` sessions one after another on each of `addrs` in turn
/// (so that drift on the machine falls on each alike); a report per address.
async fn alternating(
    addrs: &[String],
    open: &pb::CompressRequest,
    n: usize,
    bar: &ProgressBar,
) -> anyhow::Result<Vec<serde_json::Value>> {
    let mut clients = Vec::new();
    for a in addrs {
        clients.push(pb::scd_client::ScdClient::connect(a.clone()).await?);
    }
    let mut tallies: Vec<Tally> = addrs.iter().map(|_| Tally::default()).collect();
    let mut spent = vec![Duration::ZERO; addrs.len()];
    for k in 0..n {
        for (i, c) in clients.iter_mut().enumerate() {
            let s = Instant::now();
            session(c, open, format!("lat-{k}-{:08x}", rand::random::<u32>()), false, &mut tallies[i]).await;
            spent[i] += s.elapsed();
        }
        bar.inc(1);
    }
    Ok(tallies.into_iter().zip(spent).map(|(t, d)| t.report(d.as_secs_f64())).collect())
}

/// One session on `addr`, unmeasured: the context prepared, the model warm.
async fn warm(addr: String, open: &pb::CompressRequest, vary: bool) -> anyhow::Result<()> {
    let mut c = pb::scd_client::ScdClient::connect(addr).await?;
    let mut t = Tally::default();
    session(&mut c, open, format!("warm-{:08x}", rand::random::<u32>()), vary, &mut t).await;
    anyhow::ensure!(t.errors.is_empty(), "warm-up failed: {:?}", t.errors);
    Ok(())
}

fn p50(v: &serde_json::Value, method: &str, q: &str) -> f64 {
    v["methods"][method][q].as_f64().unwrap_or(f64::NAN)
}

/// Runs `scd-dev bench-replicas`.
pub fn run(args: BenchReplicasArgs) -> anyhow::Result<()> {
    let open = pb::CompressRequest {
        task: Some(pb::Task { description: "why did the payment service time out".into(), ..Default::default() }),
        fields: scd_service::cli::client::read_context(&args.context)?,
        requirement: Some(pb::ContextRequirement { max_context_tokens: 160, ..Default::default() }),
        ..Default::default()
    };
    let dir = tempfile::tempdir()?;
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let bar = ProgressBar::new_spinner();
    bar.set_style(ProgressStyle::with_template("{spinner} {msg}: {pos} sessions, {elapsed}")?);
    bar.enable_steady_tick(Duration::from_millis(200));
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());

    // throughput: one replica with every core, then two sharing them behind HAProxy
    bar.set_message("one replica (Redis state)");
    let (_redis, url) = redis(dir.path(), &args.redis_config)?;
    let one = {
        let r = replica(dir.path(), "one", cores, Some(&url))?;
        rt.block_on(warm(format!("http://127.0.0.1:{}", r.grpc), &open, true))?;
        rt.block_on(load(format!("http://127.0.0.1:{}", r.grpc), &open, args.clients, args.seconds, &bar))
    };
    bar.set_position(0);
    bar.set_message("two replicas behind HAProxy (Redis state)");
    let two = {
        let per = (cores / 2).max(1);
        let a = replica(dir.path(), "a", per, Some(&url))?;
        let b = replica(dir.path(), "b", per, Some(&url))?;
        for r in [&a, &b] {
            rt.block_on(warm(format!("http://127.0.0.1:{}", r.grpc), &open, true))?;
        }
        let (_lb, port) = haproxy(dir.path(), &args.haproxy_config, &a, &b)?;
        std::thread::sleep(Duration::from_secs(2));
        rt.block_on(load(format!("http://127.0.0.1:{port}"), &open, args.clients, args.seconds, &bar))
    };

    // latency Redis adds: one client, sessions alternating between a
    // replica with in-process sessions and one on Redis; embeddings cached,
    // so a call is selection plus the session store
    bar.set_position(0);
    bar.set_message("latency: in-process vs Redis sessions, alternating");
    let (memory, in_redis) = {
        let m = replica(dir.path(), "memory", cores, None)?;
        let r = replica(dir.path(), "redis", cores, Some(&url))?;
        let addrs = [format!("http://127.0.0.1:{}", m.grpc), format!("http://127.0.0.1:{}", r.grpc)];
        for a in &addrs {
            rt.block_on(warm(a.clone(), &open, false))?;
        }
        let mut both = rt.block_on(alternating(&addrs, &open, args.latency_sessions, &bar))?;
        let in_redis = both.pop().expect("two reports");
        (both.pop().expect("two reports"), in_redis)
    };
    bar.finish_and_clear();

    let added = |m: &str, q: &str| p50(&in_redis, m, q) - p50(&memory, m, q);
    let report = json!({
        "machine_cores": cores,
        "clients": args.clients,
        "one_replica": one,
        "two_replicas_haproxy": two,
        "two_over_one": two["calls_per_s"].as_f64().unwrap_or(0.0) / one["calls_per_s"].as_f64().unwrap_or(f64::NAN),
        "latency_in_process": memory,
        "latency_redis": in_redis,
        "redis_adds_ms": {
            "RequestContext": {"p50": added("RequestContext", "p50_ms"), "p99": added("RequestContext", "p99_ms")},
            "Compress (opens)": {"p50": added("Compress (opens)", "p50_ms"), "p99": added("Compress (opens)", "p99_ms")},
        },
    });
    println!("{}", serde_json::to_string_pretty(&report)?);
    if let Some(p) = &args.json {
        std::fs::write(p, serde_json::to_string_pretty(&report)? + "\n")
            .with_context(|| format!("--json {}", p.display()))?;
    }
    eprintln!(
        "served {:.1} calls/s on one replica, {:.1} on two behind HAProxy ({:.2}x); Redis adds {:.2} ms p50 / {:.2} ms p99 to RequestContext",
        one["calls_per_s"].as_f64().unwrap_or(0.0),
        two["calls_per_s"].as_f64().unwrap_or(0.0),
        report["two_over_one"].as_f64().unwrap_or(0.0),
        added("RequestContext", "p50_ms"),
        added("RequestContext", "p99_ms"),
    );
    Ok(())
}
