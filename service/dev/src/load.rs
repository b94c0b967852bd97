//! `scd-dev bench-load`: N concurrent gRPC clients for a fixed time against a
//! real `scd serve` over loopback; throughput, latency percentiles, errors by
//! code and the server's peak RSS; then the raw encoder on the same texts in
//! the same run, and the ratio. The spawned server also gets a metrics
//! listener; at the end its `/metrics` is scraped and the p50/p99 of each
//! server-side histogram (estimated from the buckets, as Prometheus'
//! `histogram_quantile` does) and `scd_requests_total` by method and code are
//! added to the JSON.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use indicatif::{ProgressBar, ProgressStyle};
use scd_engine::encoder::{EncodeOptions, Encoder, InputKind};

use super::{cpu_seconds, rss_kib, Proc};
use scd_service::config::ModelArgs;
use scd_service::grpc::pb;

/// Arguments of `scd-dev bench-load`.
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
    /// The API the clients call: gRPC `Embed`, REST `POST /v1/embeddings`
    /// (OpenAI's, base64 vectors as OpenAI's clients ask, one keep-alive
    /// connection per client), or both, one after the other on the same
    /// server, each for --seconds, with the ratio.
    #[arg(long, value_enum, default_value = "grpc")]
    protocol: Protocol,
}

/// Which API `scd-dev bench-load` loads.
#[derive(Debug, Clone, Copy, PartialEq, clap::ValueEnum)]
enum Protocol {
    Grpc,
    Rest,
    Both,
}

/// One load client's connection.
enum LoadClient {
    Grpc(pb::scd_client::ScdClient<tonic::transport::Channel>),
    Rest(RestClient),
}

impl LoadClient {
    /// Embeds `texts` as passages: the tokens embedded, or the code of the failure.
    async fn embed(&mut self, texts: Vec<String>) -> Result<u64, String> {
        match self {
            LoadClient::Grpc(c) => {
                let r = pb::EmbedRequest { texts, kind: pb::InputKind::Passage as i32, windows: true };
                match c.embed(r).await {
                    Ok(r) => Ok(r.into_inner().embeddings.iter().map(|e| u64::from(e.tokens)).sum()),
                    Err(s) => Err(format!("{:?}", s.code())),
                }
            }
            LoadClient::Rest(c) => c.embed(texts).await,
        }
    }
}

/// A keep-alive HTTP/1.1 connection to `/v1/embeddings` (made again when the
/// server closes it).
struct RestClient {
    addr: String,
    model: String,
    conn: Option<hyper::client::conn::http1::SendRequest<axum::body::Body>>,
}

impl RestClient {
    async fn embed(&mut self, texts: Vec<String>) -> Result<u64, String> {
        let body = serde_json::json!({"model": self.model, "input": texts, "encoding_format": "base64"}).to_string();
        for attempt in 0..2 {
            if self.conn.as_ref().is_none_or(|c| c.is_closed()) {
                let stream = tokio::net::TcpStream::connect(&self.addr).await.map_err(|_| "Connect".to_string())?;
                let (send, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                    .await
                    .map_err(|_| "Handshake".to_string())?;
                tokio::spawn(conn);
                self.conn = Some(send);
            }
            let conn = self.conn.as_mut().expect("connected above");
            let req = http::Request::post("/v1/embeddings")
                .header(http::header::HOST, &self.addr)
                .header(http::header::CONTENT_TYPE, "application/json")
                .body(axum::body::Body::from(body.clone()))
                .expect("a valid request");
            let sent = match conn.ready().await {
                Ok(()) => conn.send_request(req).await,
                Err(e) => Err(e),
            };
            let resp = match sent {
                Ok(r) => r,
                // the server closed the connection (its maximum age): once more
                Err(_) if attempt == 0 => {
                    self.conn = None;
                    continue;
                }
                Err(_) => return Err("Transport".into()),
            };
            let status = resp.status();
            let bytes = axum::body::to_bytes(axum::body::Body::new(resp.into_body()), usize::MAX)
                .await
                .map_err(|_| "Transport".to_string())?;
            if status != http::StatusCode::OK {
                return Err(format!("{:?}", scd_service::http::code_of(status)));
            }
            let v: serde_json::Value = serde_json::from_slice(&bytes).map_err(|_| "Internal".to_string())?;
            return v["usage"]["prompt_tokens"].as_u64().ok_or_else(|| "Internal".to_string());
        }
        Err("Transport".into())
    }
}

/// Runs `scd-dev bench-load`.
pub fn run(model: &ModelArgs, args: LoadArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.clients > 0 && args.texts_per_request > 0,
        "--clients and --texts-per-request must be at least 1"
    );
    let texts = super::read_jsonl_texts(&args.input, "--input")?;

    let Server { mut child, _stdout, addr, metrics_addr } = start_server(model, &args)?;
    let pid = child.id();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let texts = Arc::new(texts);
    // the model REST clients name (GET /v1/models answers before the warm-up)
    let rest_model = if args.protocol == Protocol::Grpc {
        String::new()
    } else {
        let models: serde_json::Value = serde_json::from_str(&http_get(&metrics_addr, "/v1/models")?)?;
        models["data"][0]["id"].as_str().context("GET /v1/models named no model")?.to_string()
    };
    let result = rt.block_on(async {
        let ch = tonic::transport::Channel::from_shared(addr.clone())?.connect().await?;
        let mut health = tonic_health::pb::health_client::HealthClient::new(ch.clone());
        loop {
            let r =
                health.check(tonic_health::pb::HealthCheckRequest { service: "scd.v1.Scd".into() }).await?.into_inner();
            if r.status == tonic_health::pb::health_check_response::ServingStatus::Serving as i32 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let phases: &[Protocol] = match args.protocol {
            Protocol::Both => &[Protocol::Grpc, Protocol::Rest],
            Protocol::Grpc => &[Protocol::Grpc],
            Protocol::Rest => &[Protocol::Rest],
        };
        let mut out = serde_json::Map::new();
        for &p in phases {
            let label = if p == Protocol::Grpc { "grpc" } else { "rest" };
            let phase = Phase {
                protocol: p,
                grpc: &ch,
                http: &metrics_addr,
                model: &rest_model,
                pid,
                texts: &texts,
                args: &args,
            };
            out.insert(label.into(), load_phase(phase).await?);
        }
        anyhow::Ok(out)
    });
    // scrape before the server goes; a failed scrape is reported, not fatal
    let scraped = http_get(&metrics_addr, "/metrics");
    let _ = Command::new("kill").arg("-TERM").arg(pid.to_string()).status();
    let _ = child.wait();
    let phases = result?;
    // one protocol: its figures at the top (the shape earlier runs recorded)
    let mut summary = if phases.len() == 1 {
        phases.into_iter().next().map(|(_, v)| v).unwrap_or_default()
    } else {
        let ratio = phases["rest"]["tokens_per_s"].as_f64().unwrap_or(0.0)
            / phases["grpc"]["tokens_per_s"].as_f64().unwrap_or(f64::NAN);
        let mut v = serde_json::Value::Object(phases);
        v["rest_over_grpc_tokens_per_s"] = serde_json::json!(ratio);
        v
    };
    summary["server_metrics"] = match scraped {
        Ok(text) => server_summary(&text),
        Err(e) => serde_json::json!({ "error": format!("{e:#}") }),
    };
    // raw encoder on the same texts, same process settings, after the server is gone
    let raw_tps = raw_encoder_tokens_per_s(model, &texts, args.seconds)?;
    summary["raw_encoder_tokens_per_s"] = serde_json::json!(raw_tps);
    match summary["tokens_per_s"].as_f64() {
        Some(served) => summary["served_over_raw"] = serde_json::json!(served / raw_tps),
        None => {
            for p in ["grpc", "rest"] {
                let served = summary[p]["tokens_per_s"].as_f64().unwrap_or(0.0);
                summary[p]["served_over_raw"] = serde_json::json!(served / raw_tps);
            }
        }
    }
    println!("{summary}");
    Ok(())
}

/// The `scd serve` under load.
struct Server {
    child: Child,
    /// Its stdout, held open (never read again) so that what it prints
    /// later does not meet a closed pipe.
    _stdout: std::io::Lines<BufReader<ChildStdout>>,
    /// The gRPC address, `http://…`.
    addr: String,
    /// The HTTP listener's `host:port`.
    metrics_addr: String,
}

/// `scd serve` with the model flags and `--serve-args`, on free ports,
/// once it listens.
fn start_server(model: &ModelArgs, args: &LoadArgs) -> anyhow::Result<Server> {
    let mut child = Command::new(crate::scd_exe()?)
        .args(["serve", "--model", &model.model, "--models-dir"])
        .arg(&model.models_dir)
        .arg("--ort-lib")
        .arg(&model.ort_lib)
        .args(["--threads", &model.threads.to_string(), "--addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"])
        .args(args.serve_args.split_whitespace())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()?;
    let mut lines = BufReader::new(child.stdout.take().context("server stdout")?).lines();
    let mut metrics_addr = None;
    let addr = loop {
        let line = lines.next().context("server exited before listening")??;
        if let Some(a) = line.strip_prefix("metrics on http://") {
            metrics_addr = a.strip_suffix("/metrics").map(str::to_string);
        }
        if let Some(a) = line.strip_prefix("listening on ") {
            break format!("http://{a}");
        }
    };
    let metrics_addr = metrics_addr.context("server printed no \"metrics on http://ADDR/metrics\" line")?;
    Ok(Server { child, _stdout: lines, addr, metrics_addr })
}

/// The encoder alone on `texts` (32 a call, for `seconds` clamped to 5..30
/// after a warm-up): its tokens per second.
fn raw_encoder_tokens_per_s(model: &ModelArgs, texts: &[String], seconds: u64) -> anyhow::Result<f64> {
    let encoder = model.load_encoder()?;
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    let opts = EncodeOptions::new(InputKind::Passage).with_windows();
    encoder.encode(&refs[..refs.len().min(8)], &opts)?;
    let start = Instant::now();
    let mut tokens = 0usize;
    let budget = Duration::from_secs(seconds.clamp(5, 30));
    let mut i = 0;
    while start.elapsed() < budget {
        let chunk: Vec<&str> = (0..32).map(|j| refs[(i + j) % refs.len()]).collect();
        i += 32;
        tokens += encoder.encode(&chunk, &opts)?.tokens.iter().sum::<usize>();
    }
    let raw_tps = tokens as f64 / start.elapsed().as_secs_f64();
    Ok(raw_tps)
}

/// What one load phase needs.
struct Phase<'a> {
    protocol: Protocol,
    grpc: &'a tonic::transport::Channel,
    /// The HTTP listener's `host:port`.
    http: &'a str,
    /// The model REST clients name.
    model: &'a str,
    /// The server's pid (RSS, CPU).
    pid: u32,
    texts: &'a Arc<Vec<String>>,
    args: &'a LoadArgs,
}

/// `args.clients` clients of `protocol` for `args.seconds`: throughput,
/// latency percentiles, codes, the server's RSS and CPU.
async fn load_phase(phase: Phase<'_>) -> anyhow::Result<serde_json::Value> {
    let Phase { protocol, grpc, http, model, pid, texts, args } = phase;
    let lat = Arc::new(Mutex::new(Vec::<f64>::new()));
    let codes = Arc::new(Mutex::new(BTreeMap::<String, u64>::new()));
    let tokens = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let done_texts = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let end = Instant::now() + Duration::from_secs(args.seconds);
    let mut tasks = Vec::new();
    for c in 0..args.clients {
        let mut client = match protocol {
            Protocol::Rest => {
                LoadClient::Rest(RestClient { addr: http.to_string(), model: model.to_string(), conn: None })
            }
            _ => LoadClient::Grpc(pb::scd_client::ScdClient::new(grpc.clone())),
        };
        let (lat, codes, tokens, done_texts, texts) =
            (lat.clone(), codes.clone(), tokens.clone(), done_texts.clone(), texts.clone());
        let k = args.texts_per_request;
        tasks.push(tokio::spawn(async move {
            let mut i = c * k;
            while Instant::now() < end {
                let batch: Vec<String> = (0..k).map(|j| texts[(i + j) % texts.len()].clone()).collect();
                i += k * 7;
                let t = Instant::now();
                match client.embed(batch).await {
                    Ok(n) => {
                        lat.lock().unwrap().push(t.elapsed().as_secs_f64() * 1e3);
                        tokens.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
                        done_texts.fetch_add(k as u64, std::sync::atomic::Ordering::Relaxed);
                        *codes.lock().unwrap().entry("Ok".into()).or_default() += 1;
                    }
                    Err(code) => {
                        let busy = code == "ResourceExhausted";
                        *codes.lock().unwrap().entry(code).or_default() += 1;
                        if busy {
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
    let (client_cpu0, server_cpu0) = (cpu_seconds(Proc::This), cpu_seconds(Proc::Pid(pid)));
    while Instant::now() < end {
        tokio::time::sleep(Duration::from_secs(1)).await;
        rss.push(rss_kib(Proc::Pid(pid)));
        bar.set_position(start.elapsed().as_secs());
        bar.set_message(format!("rss {} MiB", rss.last().unwrap() / 1024));
    }
    for t in tasks {
        let _ = t.await;
    }
    bar.finish_and_clear();
    let secs = start.elapsed().as_secs_f64();
    let client_cpu = cpu_seconds(Proc::This) - client_cpu0;
    let server_cpu = cpu_seconds(Proc::Pid(pid)) - server_cpu0;
    let per_minute: Vec<u64> = rss.iter().step_by(60).map(|k| k / 1024).collect();
    let mut l = lat.lock().unwrap().clone();
    let codes = codes.lock().unwrap().clone();
    Ok(serde_json::json!({
        "clients": args.clients, "seconds": secs, "texts_per_request": args.texts_per_request,
        "texts_per_s": done_texts.load(std::sync::atomic::Ordering::Relaxed) as f64 / secs,
        "tokens_per_s": tokens.load(std::sync::atomic::Ordering::Relaxed) as f64 / secs,
        "p50_ms": super::percentile(&mut l, 0.5), "p95_ms": super::percentile(&mut l, 0.95), "p99_ms": super::percentile(&mut l, 0.99),
        "codes": codes,
        "rss_mib": {"first": rss.first().copied().unwrap_or(0) / 1024, "last": rss.last().copied().unwrap_or(0) / 1024, "peak": rss.iter().max().copied().unwrap_or(0) / 1024, "every_minute": per_minute},
        "cpu_seconds": {"load_generator": client_cpu, "server": server_cpu, "available": secs * std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1) as f64},
    }))
}

/// `GET path` on the HTTP listener `addr` over HTTP/1.0 (close-delimited,
/// no chunking): the body of a 200.
fn http_get(addr: &str, path: &str) -> anyhow::Result<String> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).with_context(|| format!("HTTP listener {addr}"))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())?;
    let mut raw = String::new();
    s.read_to_string(&mut raw)?;
    let (head, body) = raw.split_once("\r\n\r\n").with_context(|| format!("GET {path}: no header end"))?;
    anyhow::ensure!(
        head.starts_with("HTTP/1.") && head.contains(" 200 "),
        "GET {path}: {}",
        head.lines().next().unwrap_or("")
    );
    Ok(body.to_string())
}

/// One histogram series' cumulative buckets `(le, count)`, `le` ascending,
/// the last one `+Inf`.
type Buckets = Vec<(f64, f64)>;

/// The `q`-quantile estimated from cumulative buckets the way Prometheus'
/// `histogram_quantile` does: find the bucket holding rank `q · total` and
/// interpolate linearly inside it (the first bucket starts at 0 when its
/// bound is positive; a rank in the `+Inf` bucket answers the highest finite
/// bound). None without observations.
pub(crate) fn bucket_quantile(q: f64, buckets: &[(f64, f64)]) -> Option<f64> {
    let total = buckets.last()?.1;
    if total <= 0.0 || !(0.0..=1.0).contains(&q) {
        return None;
    }
    let rank = q * total;
    let i = buckets.iter().position(|&(_, c)| c >= rank)?;
    let (upper, count) = buckets[i];
    if upper.is_infinite() {
        return Some(buckets.get(i.wrapping_sub(1)).map_or(0.0, |b| b.0));
    }
    let (lower, below) = if i == 0 { (if upper > 0.0 { 0.0 } else { upper }, 0.0) } else { buckets[i - 1] };
    if count == below {
        return Some(upper);
    }
    Some(lower + (upper - lower) * (rank - below) / (count - below))
}

/// One sample of a text scrape: metric name, labels, value.
type Sample<'a> = (&'a str, Vec<(&'a str, &'a str)>, f64);

/// Splits `name{a="x",b="y"} value` into name, labels and value.
fn parse_sample(line: &str) -> Option<Sample<'_>> {
    let (series, value) = line.rsplit_once(' ')?;
    let value = match value {
        "+Inf" => f64::INFINITY,
        v => v.parse().ok()?,
    };
    let (name, labels) = match series.split_once('{') {
        Some((n, rest)) => (n, rest.strip_suffix('}')?),
        None => (series, ""),
    };
    // label values here never contain commas or quotes (methods, codes, numbers)
    let labels = labels
        .split(',')
        .filter(|l| !l.is_empty())
        .filter_map(|l| l.split_once('=').map(|(k, v)| (k, v.trim_matches('"'))))
        .collect();
    Some((name, labels, value))
}

/// From a Prometheus text scrape: p50/p99 and count of the request, queue and
/// batch histograms (per label set), and `scd_requests_total` by method and code.
fn server_summary(text: &str) -> serde_json::Value {
    const HISTOGRAMS: [&str; 4] =
        ["scd_request_duration_seconds", "scd_queue_wait_seconds", "scd_batch_texts", "scd_batch_tokens"];
    let mut hist: BTreeMap<(String, String), Buckets> = BTreeMap::new();
    let mut requests = BTreeMap::<String, serde_json::Value>::new();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((name, labels, value)) = parse_sample(line) else { continue };
        if let Some(h) = name.strip_suffix("_bucket").filter(|h| HISTOGRAMS.contains(h)) {
            let le = labels.iter().find(|(k, _)| *k == "le").and_then(|(_, v)| match *v {
                "+Inf" => Some(f64::INFINITY),
                v => v.parse::<f64>().ok(),
            });
            let Some(le) = le else { continue };
            let rest: Vec<String> =
                labels.iter().filter(|(k, _)| *k != "le").map(|(k, v)| format!("{k}={v}")).collect();
            hist.entry((h.to_string(), rest.join(","))).or_default().push((le, value));
        } else if name == "scd_requests_total" {
            let get = |key: &str| labels.iter().find(|(k, _)| *k == key).map_or("", |(_, v)| *v).to_string();
            requests.insert(format!("{}/{}", get("method"), get("code")), serde_json::json!(value));
        }
    }
    let mut out = serde_json::Map::new();
    for ((name, labels), mut b) in hist {
        b.sort_by(|x, y| x.0.total_cmp(&y.0));
        let key = if labels.is_empty() { name } else { format!("{name}{{{labels}}}") };
        out.insert(
            key,
            serde_json::json!({
                "count": b.last().map_or(0.0, |x| x.1),
                "p50": bucket_quantile(0.5, &b),
                "p99": bucket_quantile(0.99, &b),
            }),
        );
    }
    serde_json::json!({ "histograms": out, "requests_total": requests })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_quantile_interpolates_like_histogram_quantile() {
        // 10 observations ≤ 1, 30 more ≤ 2, 60 more ≤ 4, none above
        let b = [(1.0, 10.0), (2.0, 40.0), (4.0, 100.0), (f64::INFINITY, 100.0)];
        // rank 50 lies in (2, 4]: 2 + 2 · (50 − 40) / 60
        assert!((bucket_quantile(0.5, &b).unwrap() - (2.0 + 2.0 * 10.0 / 60.0)).abs() < 1e-12);
        // rank 5 in the first bucket, which starts at 0
        assert!((bucket_quantile(0.05, &b).unwrap() - 0.5).abs() < 1e-12);
        // rank 99 in (2, 4]
        assert!((bucket_quantile(0.99, &b).unwrap() - (2.0 + 2.0 * 59.0 / 60.0)).abs() < 1e-12);
    }

    #[test]
    fn bucket_quantile_in_inf_bucket_answers_highest_finite_bound() {
        let b = [(1.0, 10.0), (2.0, 20.0), (f64::INFINITY, 100.0)];
        assert_eq!(bucket_quantile(0.5, &b), Some(2.0));
    }

    #[test]
    fn bucket_quantile_without_observations_is_none() {
        assert_eq!(bucket_quantile(0.5, &[(1.0, 0.0), (f64::INFINITY, 0.0)]), None);
        assert_eq!(bucket_quantile(0.5, &[]), None);
    }

    #[test]
    fn server_summary_reads_histograms_and_request_counts() {
        let text = "# TYPE scd_request_duration_seconds histogram\n\
            scd_request_duration_seconds_bucket{method=\"embed\",le=\"1\"} 10\n\
            scd_request_duration_seconds_bucket{method=\"embed\",le=\"2\"} 40\n\
            scd_request_duration_seconds_bucket{method=\"embed\",le=\"4\"} 100\n\
            scd_request_duration_seconds_bucket{method=\"embed\",le=\"+Inf\"} 100\n\
            scd_request_duration_seconds_sum{method=\"embed\"} 250\n\
            scd_request_duration_seconds_count{method=\"embed\"} 100\n\
            scd_requests_total{method=\"embed\",code=\"Ok\"} 98\n\
            scd_requests_total{method=\"embed\",code=\"ResourceExhausted\"} 2\n";
        let s = server_summary(text);
        let h = &s["histograms"]["scd_request_duration_seconds{method=embed}"];
        assert_eq!(h["count"], 100.0);
        assert!((h["p50"].as_f64().unwrap() - (2.0 + 2.0 * 10.0 / 60.0)).abs() < 1e-12);
        assert_eq!(s["requests_total"]["embed/Ok"], 98.0);
        assert_eq!(s["requests_total"]["embed/ResourceExhausted"], 2.0);
    }
}
