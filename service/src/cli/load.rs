//! `scd bench-load`: N concurrent gRPC clients for a fixed time against a
//! real `scd serve` over loopback; throughput, latency percentiles, errors by
//! code and the server's peak RSS; then the raw encoder on the same texts in
//! the same run, and the ratio.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use indicatif::{ProgressBar, ProgressStyle};
use scd_engine::encoder::{EncodeOptions, Encoder, InputKind};

use crate::config::ModelArgs;
use crate::grpc::pb;

/// Arguments of `scd bench-load`.
#[derive(Debug, clap::Args)]
pub struct LoadArgs {
    /// JSONL file, one {"text": ...} per line.
    #[arg(long)]
    input: PathBuf,
    /// Concurrent clients.
    #[arg(long, default_value_t = 32)]
    clients: usize,
    /// Duration of the load phase.
    #[arg(long, default_value_t = 60)]
    seconds: u64,
    /// Texts per Embed request.
    #[arg(long, default_value_t = 4)]
    texts_per_request: usize,
    /// Extra arguments for `scd serve` (e.g. "--queue-size 64").
    #[arg(long, default_value = "")]
    serve_args: String,
}

/// CPU seconds (user + system) a process has used so far.
fn cpu_seconds(pid: &str) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // fields after the parenthesised command name; utime and stime are the 12th and 13th of them
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (ticks(11) + ticks(12)) / 100.0
}

/// Runs `scd bench-load`.
pub fn run(model: &ModelArgs, args: LoadArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.clients > 0 && args.texts_per_request > 0,
        "--clients and --texts-per-request must be at least 1"
    );
    let texts = super::read_jsonl_texts(&args.input, "--input")?;

    let mut child = Command::new(std::env::current_exe()?)
        .args(["--model", &model.model, "--models-dir"])
        .arg(&model.models_dir)
        .arg("--ort-lib")
        .arg(&model.ort_lib)
        .args(["--threads", &model.threads.to_string(), "serve", "--addr", "127.0.0.1:0"])
        .args(args.serve_args.split_whitespace())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()?;
    let pid = child.id();
    let mut lines = BufReader::new(child.stdout.take().context("server stdout")?).lines();
    let addr = loop {
        let line = lines.next().context("server exited before listening")??;
        if let Some(a) = line.strip_prefix("listening on ") {
            break format!("http://{a}");
        }
    };
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let texts = Arc::new(texts);
    let result = rt.block_on(async {
        let ch = tonic::transport::Channel::from_shared(addr.clone())?.connect().await?;
        let mut health = tonic_health::pb::health_client::HealthClient::new(ch.clone());
        loop {
            let r = health.check(tonic_health::pb::HealthCheckRequest { service: "scd.v1.Scd".into() }).await?.into_inner();
            if r.status == tonic_health::pb::health_check_response::ServingStatus::Serving as i32 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let lat = Arc::new(Mutex::new(Vec::<f64>::new()));
        let codes = Arc::new(Mutex::new(BTreeMap::<String, u64>::new()));
        let tokens = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let done_texts = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let end = Instant::now() + Duration::from_secs(args.seconds);
        let mut tasks = Vec::new();
        for c in 0..args.clients {
            let mut client = pb::scd_client::ScdClient::new(ch.clone());
            let (lat, codes, tokens, done_texts, texts) = (lat.clone(), codes.clone(), tokens.clone(), done_texts.clone(), texts.clone());
            let k = args.texts_per_request;
            tasks.push(tokio::spawn(async move {
                let mut i = c * k;
                while Instant::now() < end {
                    let batch: Vec<String> = (0..k).map(|j| texts[(i + j) % texts.len()].clone()).collect();
                    i += k * 7;
                    let t = Instant::now();
                    match client.embed(pb::EmbedRequest { texts: batch, kind: pb::InputKind::Passage as i32, windows: true }).await {
                        Ok(r) => {
                            let r = r.into_inner();
                            lat.lock().unwrap().push(t.elapsed().as_secs_f64() * 1e3);
                            tokens.fetch_add(r.embeddings.iter().map(|e| e.tokens as u64).sum(), std::sync::atomic::Ordering::Relaxed);
                            done_texts.fetch_add(k as u64, std::sync::atomic::Ordering::Relaxed);
                            *codes.lock().unwrap().entry("Ok".into()).or_default() += 1;
                        }
                        Err(s) => {
                            *codes.lock().unwrap().entry(format!("{:?}", s.code())).or_default() += 1;
                            if s.code() == tonic::Code::ResourceExhausted {
                                tokio::time::sleep(Duration::from_millis(100)).await;
                            }
                        }
                    }
                }
            }));
        }
        let bar = ProgressBar::new(args.seconds);
        bar.set_style(ProgressStyle::with_template("{bar:40} {pos}/{len} s {msg}")?);
        let mut rss = Vec::new();
        let start = Instant::now();
        let (client_cpu0, server_cpu0) = (cpu_seconds("self"), cpu_seconds(&pid.to_string()));
        while Instant::now() < end {
            tokio::time::sleep(Duration::from_secs(1)).await;
            rss.push(super::rss_kib(&pid.to_string()));
            bar.set_position(start.elapsed().as_secs());
            bar.set_message(format!("rss {} MiB", rss.last().unwrap() / 1024));
        }
        for t in tasks {
            let _ = t.await;
        }
        bar.finish_and_clear();
        let secs = start.elapsed().as_secs_f64();
        let client_cpu = cpu_seconds("self") - client_cpu0;
        let server_cpu = cpu_seconds(&pid.to_string()) - server_cpu0;
        let per_minute: Vec<u64> = rss.iter().step_by(60).map(|k| k / 1024).collect();
        let mut l = lat.lock().unwrap().clone();
        let codes = codes.lock().unwrap().clone();
        anyhow::Ok(serde_json::json!({
            "clients": args.clients, "seconds": secs, "texts_per_request": args.texts_per_request,
            "texts_per_s": done_texts.load(std::sync::atomic::Ordering::Relaxed) as f64 / secs,
            "tokens_per_s": tokens.load(std::sync::atomic::Ordering::Relaxed) as f64 / secs,
            "p50_ms": super::percentile(&mut l, 0.5), "p95_ms": super::percentile(&mut l, 0.95), "p99_ms": super::percentile(&mut l, 0.99),
            "codes": codes,
            "rss_mib": {"first": rss.first().copied().unwrap_or(0) / 1024, "last": rss.last().copied().unwrap_or(0) / 1024, "peak": rss.iter().max().copied().unwrap_or(0) / 1024, "every_minute": per_minute},
            "cpu_seconds": {"load_generator": client_cpu, "server": server_cpu, "available": secs * std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1) as f64},
        }))
    });
    let _ = Command::new("kill").arg("-TERM").arg(pid.to_string()).status();
    let _ = child.wait();
    let mut summary = result?;
    // raw encoder on the same texts, same process settings, after the server is gone
    let encoder = model.load_encoder()?;
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    let opts = EncodeOptions::new(InputKind::Passage).with_windows();
    encoder.encode(&refs[..refs.len().min(8)], &opts)?;
    let start = Instant::now();
    let mut tokens = 0usize;
    let budget = Duration::from_secs(args.seconds.clamp(5, 30));
    let mut i = 0;
    while start.elapsed() < budget {
        let chunk: Vec<&str> = (0..32).map(|j| refs[(i + j) % refs.len()]).collect();
        i += 32;
        tokens += encoder.encode(&chunk, &opts)?.tokens.iter().sum::<usize>();
    }
    let raw_tps = tokens as f64 / start.elapsed().as_secs_f64();
    let served = summary["tokens_per_s"].as_f64().unwrap_or(0.0);
    summary["raw_encoder_tokens_per_s"] = serde_json::json!(raw_tps);
    summary["served_over_raw"] = serde_json::json!(served / raw_tps);
    println!("{summary}");
    Ok(())
}
