//! `scd-dev bench-conns`: idle sockets against a real `scd serve` over
//! loopback, and whether a new client is still served. The server runs
//! under a file-descriptor limit (`ulimit -n`, 1,024 by default, a common
//! default), once with its connection guard as configured and once, in the
//! same run, with the guard's caps and timeouts lifted (the baseline: the
//! server before the guard). Each run opens `--idle` sockets that never
//! speak, spread over `--sources` loopback addresses (127.0.0.2, …), then:
//! how many the server closed at once and after its first-call timeout, and
//! whether a new client (from 127.0.0.1) gets a health check, a CountTokens
//! and the HTTP listener's `/metrics`, each within `--probe-timeout-ms`.
//! Prints one JSON report on stdout.

use std::io::{BufRead, BufReader};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use indicatif::{ProgressBar, ProgressStyle};
use tokio::net::{TcpSocket, TcpStream};

use scd_service::config::ModelArgs;
use scd_service::grpc::pb;

/// Arguments of `scd-dev bench-conns`.
#[derive(Debug, clap::Args)]
pub struct ConnsArgs {
    /// Idle sockets to open (they connect and never send a byte).
    #[arg(long, default_value_t = 1100)]
    idle: usize,
    /// Loopback source addresses the idle sockets come from (127.0.0.2 on).
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u16).range(1..=250))]
    sources: u16,
    /// The server's file-descriptor limit (`ulimit -n`).
    #[arg(long, default_value_t = 1024)]
    fd_limit: u32,
    /// How long a probe (connect and call) may take before it counts as not
    /// served.
    #[arg(long, default_value_t = 3000)]
    probe_timeout_ms: u64,
    /// Extra arguments for the guarded `scd serve` (e.g.
    /// "--grpc-first-call-timeout-ms 5000").
    #[arg(long, default_value = "")]
    serve_args: String,
}

/// The baseline's flags: caps and timeouts out of reach.
const UNGUARDED: &str = "--grpc-max-connections 1000000 --grpc-max-per-peer 1000000 --grpc-idle-timeout-ms 86400000 --grpc-first-call-timeout-ms 86400000";

/// Runs `scd-dev bench-conns`.
pub fn run(model: &ModelArgs, args: ConnsArgs) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let guarded = rt.block_on(one_run(model, &args, "guarded", &args.serve_args))?;
    let baseline = rt.block_on(one_run(model, &args, "caps lifted", &format!("{} {UNGUARDED}", args.serve_args)))?;
    let report = serde_json::json!({
        "idle_sockets": args.idle, "sources": args.sources, "server_fd_limit": args.fd_limit,
        "probe_timeout_ms": args.probe_timeout_ms, "guarded": guarded, "caps_lifted": baseline,
    });
    println!("{}", serde_json::to_string_pretty(&report)?);
    let served = |r: &serde_json::Value, at: &str| {
        ["grpc_health", "grpc_count_tokens", "http_metrics"].iter().filter(|k| r[at][**k]["ok"] == true).count()
    };
    eprintln!(
        "guarded: {} of {} idle sockets stayed open after the flood, {} after the first-call timeout; new client served {}/3 during, {}/3 after | caps lifted: {} open after, new client served {}/3 during, {}/3 after",
        guarded["open_after_flood"], args.idle, guarded["open_after_timeout"], served(&guarded, "probe_during"),
        served(&guarded, "probe_after"), baseline["open_after_timeout"], served(&baseline, "probe_during"),
        served(&baseline, "probe_after"),
    );
    Ok(())
}

/// One server, flooded and probed.
async fn one_run(
    model: &ModelArgs,
    args: &ConnsArgs,
    name: &str,
    serve_args: &str,
) -> anyhow::Result<serde_json::Value> {
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(format!("ulimit -n {} && exec \"$@\"", args.fd_limit))
        .arg("sh")
        .arg(crate::scd_exe()?)
        .args(["serve", "--model", &model.model, "--models-dir"])
        .arg(&model.models_dir)
        .arg("--ort-lib")
        .arg(&model.ort_lib)
        .args(["--addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--embedding-cache", "off"])
        .args(serve_args.split_whitespace())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .context("spawning scd serve")?;
    let result = flood_and_probe(&mut child, args, name).await;
    let _ = child.kill();
    let _ = child.wait();
    result
}

async fn flood_and_probe(
    child: &mut std::process::Child,
    args: &ConnsArgs,
    name: &str,
) -> anyhow::Result<serde_json::Value> {
    let mut lines = BufReader::new(child.stdout.take().context("server stdout")?).lines();
    let (mut grpc, mut http) = (None, None);
    while grpc.is_none() || http.is_none() {
        let line = lines.next().context("the server exited before listening")??;
        if let Some(a) = line.strip_prefix("metrics on http://") {
            http = a.strip_suffix("/metrics").map(str::to_string);
        }
        if let Some(a) = line.strip_prefix("listening on ") {
            grpc = Some(a.to_string());
        }
    }
    let (grpc, http) = (grpc.unwrap_or_default(), http.unwrap_or_default());
    let grpc_addr: SocketAddr = grpc.parse().with_context(|| format!("server address {grpc}"))?;
    let timeout = Duration::from_millis(args.probe_timeout_ms);
    let before = probe(&grpc, &http, timeout).await;
    anyhow::ensure!(
        before["grpc_health"]["ok"] == true,
        "{name}: the server does not answer before the flood: {before}"
    );

    let bar = ProgressBar::new(args.idle as u64);
    bar.set_style(ProgressStyle::with_template(&format!("{name}: {{bar:40}} {{pos}}/{{len}} idle sockets {{msg}}"))?);
    let started = Instant::now();
    let mut sockets = Vec::with_capacity(args.idle);
    let mut failed = 0usize;
    for i in 0..args.idle {
        let source = Ipv4Addr::new(127, 0, 0, 2 + (i % usize::from(args.sources)) as u8);
        match tokio::time::timeout(Duration::from_secs(2), connect_from(source, grpc_addr)).await {
            Ok(Ok(s)) => sockets.push(s),
            _ => failed += 1,
        }
        bar.inc(1);
    }
    bar.finish_and_clear();
    let flood_ms = started.elapsed().as_millis();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let open_after_flood = still_open(&sockets);
    let during = probe(&grpc, &http, timeout).await;
    // the guard's first-call timeout (10 s by default) and a margin
    let wait = Duration::from_millis(first_call_timeout_ms(&args.serve_args) + 2000);
    tokio::time::sleep(wait.saturating_sub(started.elapsed())).await;
    let open_after_timeout = still_open(&sockets);
    let after = probe(&grpc, &http, timeout).await;
    let metrics = scrape(&http, timeout).await.map(|text| {
        text.lines()
            .filter(|l| l.starts_with("scd_rejected_total") && l.contains("grpc_"))
            .filter_map(|l| l.rsplit_once(' '))
            .map(|(k, v)| (k.to_string(), serde_json::json!(v.parse::<f64>().unwrap_or(f64::NAN))))
            .collect::<serde_json::Map<_, _>>()
    });
    Ok(serde_json::json!({
        "connected": sockets.len(), "connect_failed": failed, "flood_ms": flood_ms,
        "open_after_flood": open_after_flood, "open_after_timeout": open_after_timeout,
        "waited_ms": started.elapsed().as_millis(),
        "probe_before": before, "probe_during": during, "probe_after": after,
        "server_rejections": metrics.map_or_else(|e| serde_json::json!({"error": e}), serde_json::Value::Object),
    }))
}

/// The guarded run's `--grpc-first-call-timeout-ms` (from `--serve-args`,
/// else the default); the baseline waits as long.
fn first_call_timeout_ms(serve_args: &str) -> u64 {
    let words: Vec<&str> = serve_args.split_whitespace().collect();
    words
        .windows(2)
        .rev()
        .find(|w| w[0] == "--grpc-first-call-timeout-ms")
        .and_then(|w| w[1].parse().ok())
        .unwrap_or(10_000)
}

async fn connect_from(source: Ipv4Addr, to: SocketAddr) -> std::io::Result<TcpStream> {
    let s = TcpSocket::new_v4()?;
    s.bind(SocketAddr::new(IpAddr::V4(source), 0))?;
    s.connect(to).await
}

/// Sockets the server has not closed: what it sent (an HTTP/2 server's
/// SETTINGS) is read off until a read would block; EOF or a reset is
/// closed.
fn still_open(sockets: &[TcpStream]) -> usize {
    let mut buf = [0u8; 4096];
    let mut open = |s: &TcpStream| loop {
        match s.try_read(&mut buf) {
            Ok(0) => return false,
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return true,
            Err(_) => return false,
        }
    };
    sockets.iter().filter(|s| open(s)).count()
}

/// A new client: a health check and a CountTokens on a fresh gRPC
/// connection, and a fresh HTTP `/metrics`; each `{ok, ms}` or `{ok,
/// error}`.
async fn probe(grpc: &str, http: &str, timeout: Duration) -> serde_json::Value {
    let timed = |r: Result<(), String>, t: Instant| match r {
        Ok(()) => serde_json::json!({"ok": true, "ms": t.elapsed().as_secs_f64() * 1e3}),
        Err(e) => serde_json::json!({"ok": false, "error": e}),
    };
    let t = Instant::now();
    let ch = tokio::time::timeout(timeout, async {
        tonic::transport::Channel::from_shared(format!("http://{grpc}"))
            .map_err(|e| e.to_string())?
            .connect()
            .await
            .map_err(|e| e.to_string())
    })
    .await
    .map_err(|_| "connect timed out".to_string())
    .and_then(|r| r);
    let (health, count) = match ch {
        Err(e) => (timed(Err(e.clone()), t), timed(Err(e), t)),
        Ok(ch) => {
            let mut h = tonic_health::pb::health_client::HealthClient::new(ch.clone());
            let req = tonic_health::pb::HealthCheckRequest { service: "scd.v1.Scd".into() };
            let r = tokio::time::timeout(timeout, h.check(req)).await;
            let health = timed(flatten(r), t);
            let t = Instant::now();
            let mut c = pb::scd_client::ScdClient::new(ch);
            let req =
                pb::CountTokensRequest { texts: vec!["a new client is still served".into()], tokenizer: String::new() };
            let r = tokio::time::timeout(timeout, c.count_tokens(req)).await;
            (health, timed(flatten(r), t))
        }
    };
    let t = Instant::now();
    let metrics = timed(scrape(http, timeout).await.map(|_| ()), t);
    serde_json::json!({"grpc_health": health, "grpc_count_tokens": count, "http_metrics": metrics})
}

fn flatten<T>(r: Result<Result<T, tonic::Status>, tokio::time::error::Elapsed>) -> Result<(), String> {
    match r {
        Err(_) => Err("timed out".into()),
        Ok(Err(s)) => Err(format!("{:?}: {}", s.code(), s.message())),
        Ok(Ok(_)) => Ok(()),
    }
}

/// GET `/metrics` on a fresh connection, within `timeout`.
async fn scrape(addr: &str, timeout: Duration) -> Result<String, String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let get = async {
        let mut s = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
        s.write_all(format!("GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
            .await
            .map_err(|e| e.to_string())?;
        let mut raw = String::new();
        s.read_to_string(&mut raw).await.map_err(|e| e.to_string())?;
        match raw.split_once("\r\n\r\n") {
            Some((head, body)) if head.contains(" 200 ") => Ok(body.to_string()),
            _ => Err(format!("answered {:?}", raw.lines().next().unwrap_or(""))),
        }
    };
    tokio::time::timeout(timeout, get).await.unwrap_or_else(|_| Err("timed out".into()))
}
