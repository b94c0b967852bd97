//! Lifecycle of `scd serve` / `scd client`: argument checks before the
//! model loads, settings from a file, the request log, drain on SIGTERM,
//! and a client that survives a server killed mid-load. Also the test PKI
//! and the server process that [`crate::tls`] (TLS and mTLS) uses.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose,
};
use scd_service::grpc::pb;
use scd_service::grpc::pb::scd_client::ScdClient;
use scd_service::tls::{client_config, ClientTlsFiles};
use tonic::transport::{Channel, Endpoint};
use tonic::Code;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

use crate::{ready, root, scd, scratch};

const NO_ORT: &str = "/nonexistent/libonnxruntime.so";

/// A fresh scratch folder for one test.
/// A port that was free a moment ago.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

// ---------------------------------------------------------------------------
// Test PKI: two CAs, a server certificate and two client certificates
// ---------------------------------------------------------------------------

pub(crate) struct Pki {
    pub(crate) ca: PathBuf,
    pub(crate) server_cert: PathBuf,
    pub(crate) server_key: PathBuf,
    pub(crate) client_cert: PathBuf,
    pub(crate) client_key: PathBuf,
    pub(crate) client_der: Vec<u8>,
    pub(crate) rogue_cert: PathBuf,
    pub(crate) rogue_key: PathBuf,
    pub(crate) other_cert: PathBuf,
    pub(crate) other_key: PathBuf,
}

fn ca(name: &str) -> CertifiedIssuer<'static, KeyPair> {
    let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.distinguished_name.push(DnType::CommonName, name);
    p.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    CertifiedIssuer::self_signed(p, KeyPair::generate().unwrap()).unwrap()
}

/// A leaf certificate signed by `issuer`: (cert PEM, key PEM, cert DER).
fn leaf(
    issuer: &CertifiedIssuer<'static, KeyPair>,
    sans: &[&str],
    usage: ExtendedKeyUsagePurpose,
) -> (String, String, Vec<u8>) {
    let mut p = CertificateParams::new(sans.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap();
    p.distinguished_name.push(DnType::CommonName, sans[0]);
    p.extended_key_usages = vec![usage];
    let key = KeyPair::generate().unwrap();
    let cert = p.signed_by(&key, issuer).unwrap();
    (cert.pem(), key.serialize_pem(), cert.der().to_vec())
}

pub(crate) fn pki(dir: &Path) -> Pki {
    let ca1 = ca("scd test CA");
    let rogue_ca = ca("some other CA");
    let write = |name: &str, body: &str| {
        let p = dir.join(name);
        std::fs::write(&p, body).unwrap();
        p
    };
    let (sc, sk, _) = leaf(&ca1, &["localhost", "127.0.0.1"], ExtendedKeyUsagePurpose::ServerAuth);
    let (cc, ck, client_der) = leaf(&ca1, &["scd-test-client"], ExtendedKeyUsagePurpose::ClientAuth);
    let (rc, rk, _) = leaf(&rogue_ca, &["scd-test-client"], ExtendedKeyUsagePurpose::ClientAuth);
    let (c2c, c2k, _) = leaf(&ca1, &["scd-other-client"], ExtendedKeyUsagePurpose::ClientAuth);
    Pki {
        ca: write("ca.pem", &ca1.pem()),
        server_cert: write("server.pem", &sc),
        server_key: write("server.key", &sk),
        client_cert: write("client.pem", &cc),
        client_key: write("client.key", &ck),
        client_der,
        rogue_cert: write("rogue.pem", &rc),
        rogue_key: write("rogue.key", &rk),
        other_cert: write("other.pem", &c2c),
        other_key: write("other.key", &c2k),
    }
}

pub(crate) fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

// ---------------------------------------------------------------------------
// A server process whose stderr (its log) we keep
// ---------------------------------------------------------------------------

pub(crate) struct Serve {
    child: Child,
    pub(crate) port: u16,
    /// The HTTP listener's URL (`http://host:port` or `https://…`), with `--http-addr`.
    pub(crate) http: Option<String>,
    log: PathBuf,
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Serve {
    pub(crate) fn start(dir: &Path, name: &str, args: &[&str]) -> Serve {
        Self::start_with_env(dir, name, args, &[])
    }

    pub(crate) fn start_with_env(dir: &Path, name: &str, args: &[&str], env: &[(&str, &str)]) -> Serve {
        let log = dir.join(format!("{name}.log"));
        let mut child = Command::new(env!("CARGO_BIN_EXE_scd"))
            .current_dir(root())
            .envs(env.iter().copied())
            .env("SCD_ORT_LIB", root().join(".tools/ort/libonnxruntime.so"))
            .env("SCD_MODELS_DIR", root().join("models/out"))
            // the persistent embedding cache is tested on its own
            .env("SCD_EMBEDDING_CACHE", "off")
            .env("SCD_THREADS", "2")
            .arg("serve")
            .args(args)
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut http = None;
        let port = loop {
            let line =
                lines.next().unwrap_or_else(|| panic!("server exited: {}", std::fs::read_to_string(&log).unwrap()));
            let line = line.unwrap();
            if let Some(url) = line.strip_prefix("metrics on ") {
                http = Some(url.trim_end_matches("/metrics").to_string());
            }
            if let Some(a) = line.strip_prefix("listening on ") {
                break a.rsplit(':').next().unwrap().parse().unwrap();
            }
        };
        Serve { child, port, http, log }
    }

    pub(crate) fn plain(&self) -> Endpoint {
        Endpoint::from_shared(format!("http://127.0.0.1:{}", self.port)).unwrap()
    }

    fn sigterm(&self) {
        let ok = Command::new("kill").args(["-TERM", &self.child.id().to_string()]).status().unwrap().success();
        assert!(ok, "kill -TERM");
    }

    /// Waits up to `limit` for the process to exit; its status.
    fn wait_exit(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        let t = Instant::now();
        while t.elapsed() < limit {
            if let Some(st) = self.child.try_wait().unwrap() {
                return Some(st);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

pub(crate) async fn health(ch: Channel, service: &str) -> Result<i32, tonic::Status> {
    HealthClient::new(ch).check(HealthCheckRequest { service: service.into() }).await.map(|r| r.into_inner().status)
}

/// Connects over `ep` and waits until `scd.v1.Scd` is SERVING.
pub(crate) async fn serving(ep: Endpoint) -> ScdClient<Channel> {
    for _ in 0..1200 {
        if let Ok(ch) = ep.connect().await {
            if health(ch.clone(), "scd.v1.Scd").await.ok() == Some(ServingStatus::Serving as i32) {
                return ScdClient::new(ch).max_decoding_message_size(64 << 20);
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("server never became SERVING");
}

/// Connects over `ep` and calls Info: the error as text.
pub(crate) async fn info(ep: Endpoint) -> Result<pb::InfoResponse, String> {
    let ch = ep.connect().await.map_err(|e| format!("connect: {e:?}"))?;
    ScdClient::new(ch).info(pb::InfoRequest {}).await.map(|r| r.into_inner()).map_err(|e| format!("{e:?}"))
}

pub(crate) fn tls_endpoint(port: u16, pki: &Pki, identity: Option<(&Path, &Path)>) -> Endpoint {
    let files = ClientTlsFiles {
        ca_cert: Some(pki.ca.clone()),
        client_cert: identity.map(|i| i.0.into()),
        client_key: identity.map(|i| i.1.into()),
        domain: Some("localhost".into()),
    };
    let addr = format!("https://127.0.0.1:{port}");
    Endpoint::from_shared(addr.clone()).unwrap().tls_config(client_config(&addr, &files).unwrap().unwrap()).unwrap()
}

// ---------------------------------------------------------------------------
// Argument checks: before the model loads (a missing ONNX Runtime proves it)
// ---------------------------------------------------------------------------

#[test]
fn serve_checks_arguments_and_tls_files_before_loading_the_model() {
    let dir = scratch("args");
    let pki = pki(&dir);
    let junk = dir.join("junk.pem");
    std::fs::write(&junk, "not a certificate\n").unwrap();
    let missing = dir.join("missing.pem");
    let (sc, sk, ca, cc, ck, j, m) = (
        s(&pki.server_cert),
        s(&pki.server_key),
        s(&pki.ca),
        s(&pki.client_cert),
        s(&pki.client_key),
        s(&junk),
        s(&missing),
    );
    let cases: Vec<(Vec<&str>, String)> = vec![
        (vec!["--queue-size", "0"], "--queue-size 0: must be at least 1".into()),
        (vec!["--batch-texts", "0"], "--batch-texts 0: must be at least 1".into()),
        (vec!["--max-concurrent-compress", "0"], "--max-concurrent-compress 0: must be at least 1".into()),
        (vec!["--max-request-bytes", "0"], "--max-request-bytes 0: must be at least 1".into()),
        (vec!["--drain-timeout=-1"], "--drain-timeout -1: must be between 0 and 86400 seconds".into()),
        (vec!["--tls-cert", sc], "--tls-cert needs --tls-key (the two are given together)".into()),
        (vec!["--tls-key", sk], "--tls-key needs --tls-cert (the two are given together)".into()),
        (vec!["--client-ca", ca], "--client-ca needs --tls-cert and --tls-key (mTLS runs over TLS)".into()),
        (vec!["--tls-cert", m, "--tls-key", sk], format!("--tls-cert {m}")),
        (vec!["--tls-cert", j, "--tls-key", sk], format!("--tls-cert {j}: holds no PEM CERTIFICATE block")),
        (vec!["--tls-cert", sc, "--tls-key", j], format!("--tls-key {j}: no PEM private key")),
        (
            vec!["--tls-cert", sc, "--tls-key", sk, "--client-ca", j],
            format!("--client-ca {j}: holds no PEM CERTIFICATE block"),
        ),
        // a key that belongs to another certificate
        (vec!["--tls-cert", sc, "--tls-key", ck], format!("--tls-cert {sc} / --tls-key {ck}: ")),
        (vec!["--tls-cert", cc, "--tls-key", sk], format!("--tls-cert {cc} / --tls-key {sk}: ")),
    ];
    for (extra, want) in cases {
        let mut args = vec!["--ort-lib", NO_ORT, "serve", "--addr", "127.0.0.1:0"];
        args.extend(&extra);
        let (ok, _, stderr) = scd(&args, "");
        assert!(!ok, "{extra:?} was accepted");
        assert!(stderr.contains(&want), "{extra:?}: want {want:?} in {stderr}");
        assert!(!stderr.contains("SCD_ORT_LIB"), "{extra:?}: the model was loaded before the check: {stderr}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn port_in_use_names_the_flag_and_the_listener() {
    let held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = held.local_addr().unwrap().to_string();
    let (ok, _, stderr) = scd(&["--ort-lib", NO_ORT, "serve", "--addr", &addr], "");
    assert!(!ok);
    assert!(stderr.contains(&format!("--addr {addr} (gRPC) is already in use")), "{stderr}");
    assert!(!stderr.contains("SCD_ORT_LIB"), "bound after loading the model: {stderr}");
    let (ok, _, stderr) = scd(&["--ort-lib", NO_ORT, "serve", "--addr", "127.0.0.1:0", "--http-addr", &addr], "");
    assert!(!ok);
    assert!(stderr.contains(&format!("--http-addr {addr} (HTTP metrics) is already in use")), "{stderr}");
    assert!(!stderr.contains("SCD_ORT_LIB"), "bound after loading the model: {stderr}");
}

// ---------------------------------------------------------------------------
// Client context parsing and retry policy (no server needed)
// ---------------------------------------------------------------------------

#[test]
fn client_compress_refuses_a_misspelled_context_key() {
    // Needs the engine's strict `Context` (deny_unknown_fields).
    let dir = scratch("ctx");
    let ctx = dir.join("typo.json");
    std::fs::write(
        &ctx,
        r#"{"fields": [{"name": "secret", "kind": "prose", "content": "sk_live_X", "confidental": true}]}"#,
    )
    .unwrap();
    // nothing listens on the address: the file is refused before connecting
    let addr = format!("http://127.0.0.1:{}", free_port());
    let (ok, _, stderr) =
        scd(&["client", "--addr", &addr, "compress", "--task", "t", "--context", s(&ctx), "--budget", "50"], "");
    assert!(!ok);
    assert!(stderr.contains(&format!("--context {}", ctx.display())) && stderr.contains("confidental"), "{stderr}");
    assert!(!stderr.contains("sk_live_X"), "content leaked into the error: {stderr}");
    std::fs::write(&ctx, r#"{"fields": [{"name": "a", "kind": "prose", "content": "x", "confidential": "yes"}]}"#)
        .unwrap();
    let (ok, _, stderr) =
        scd(&["client", "--addr", &addr, "compress", "--task", "t", "--context", s(&ctx), "--budget", "50"], "");
    assert!(!ok && stderr.contains("confidential"), "{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn client_gives_up_after_its_retries_when_nothing_listens() {
    let addr = format!("http://127.0.0.1:{}", free_port());
    let t = Instant::now();
    let (ok, _, stderr) = scd(&["client", "--addr", &addr, "--retries", "2", "info"], "");
    assert!(!ok);
    assert!(stderr.contains("Info: Unavailable") && stderr.contains("after 2 retries"), "{stderr}");
    assert_eq!(stderr.matches("retrying").count(), 2, "{stderr}");
    // backoff: 50..100 ms, then 100..200 ms
    assert!(t.elapsed() >= Duration::from_millis(150), "{:?}", t.elapsed());
}

// ---------------------------------------------------------------------------
// Settings from a file, and the request log
// ---------------------------------------------------------------------------

/// `scd serve --config FILE`: the file's settings start the server (the
/// HTTP listener it names is up), a flag on the command line wins over the
/// file, an unknown key or a bad value is an error naming it, before the
/// model loads.
#[test]
fn serve_reads_its_settings_from_a_config_file() {
    if !ready() {
        return;
    }
    let dir = scratch("config-file");
    let file = dir.join("scd.toml");
    std::fs::write(&file, "addr = \"127.0.0.1:1\"\nhttp-addr = \"127.0.0.1:0\"\nmax_sessions = 5\n").unwrap();
    let server = Serve::start(&dir, "config", &["--config", s(&file), "--addr", "127.0.0.1:0"]);
    assert!(server.http.as_deref().is_some_and(|u| u.starts_with("http://127.0.0.1:")), "the file's http-addr");
    assert_ne!(server.port, 1, "the command line's --addr wins");
    drop(server);
    for (toml, want) in [("adrr = \"127.0.0.1:0\"", "unknown key `adrr`"), ("queue-size = \"many\"", "--queue-size")] {
        std::fs::write(&file, toml).unwrap();
        let (ok, _, stderr) = scd(&["serve", "--config", s(&file)], "");
        assert!(!ok && stderr.contains(want), "{toml}: {stderr}");
    }
}

/// `--log-format json`: one JSON line per call (gRPC and REST alike) with
/// a request id, the method, the code and its milliseconds, and no ANSI
/// colour codes in a log that is not a terminal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_logs_have_one_line_per_request_with_an_id() {
    if !ready() {
        return;
    }
    let dir = scratch("json-logs");
    let args = ["--addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"];
    let server = Serve::start_with_env(&dir, "json-logs", &args, &[("SCD_LOG_FORMAT", "json")]);
    let c = serving(server.plain()).await;
    c.clone().info(pb::InfoRequest {}).await.unwrap();
    let http = server.http.clone().unwrap().replace("http://", "");
    assert_eq!(super::a2a::status_and_body(&http, "/v1/models").0, 200);
    let mut lines = Vec::new();
    for _ in 0..100 {
        lines = server.log().lines().map(str::to_string).collect::<Vec<_>>();
        if lines.iter().any(|l| l.contains("REST GET /v1/models")) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let log = lines.join("\n");
    assert!(!log.contains('\u{1b}'), "no colour codes: {log}");
    let requests: Vec<serde_json::Value> = lines
        .iter()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap_or_else(|_| panic!("not JSON: {l}")))
        .filter(|v| v["target"] == "scd::request")
        .collect();
    let method = |v: &serde_json::Value| v["fields"]["method"].as_str().unwrap_or_default().to_string();
    let info = requests.iter().find(|v| method(v) == "Info").expect("the Info call's line");
    let rest = requests.iter().find(|v| method(v) == "REST GET /v1/models").expect("the REST call's line");
    assert_eq!((info["fields"]["code"].as_str(), rest["fields"]["code"].as_str()), (Some("Ok"), Some("Ok")));
    let ids: Vec<u64> = requests.iter().map(|v| v["fields"]["request_id"].as_u64().unwrap()).collect();
    assert!(ids.windows(2).all(|w| w[0] != w[1]) && ids.iter().all(|&i| i > 0), "{ids:?}");
    assert!(rest["fields"]["ms"].as_f64().is_some());
}

// ---------------------------------------------------------------------------
// Drain on SIGTERM
// ---------------------------------------------------------------------------

/// An Embed request that keeps the encoder busy for a while: `n` texts of
/// `words` words each, with windows.
fn slow_embed(n: usize, words: usize) -> pb::EmbedRequest {
    pb::EmbedRequest {
        texts: (0..n).map(|i| format!("{i} ") + &"drain the queue before exit ".repeat(words / 5)).collect(),
        kind: pb::InputKind::Passage as i32,
        windows: true,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_calls_in_flight_and_refuses_new_ones() {
    if !ready() {
        return;
    }
    let dir = scratch("drain");
    let mut server = Serve::start(&dir, "drain", &["--addr", "127.0.0.1:0", "--drain-timeout", "120"]);
    let c = serving(server.plain()).await;
    let req = slow_embed(12, 300);
    let n = req.texts.len();
    let mut inflight = c.clone();
    let t0 = Instant::now();
    let call = tokio::spawn(async move { inflight.embed(req).await });
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(!call.is_finished(), "the slow request finished before SIGTERM; make it slower");
    server.sigterm();
    tokio::time::sleep(Duration::from_millis(200)).await;
    // while draining: NOT_SERVING on a fresh connection, for "" and the service
    let fresh = server.plain().connect().await.expect("listener stays open while draining");
    assert_eq!(health(fresh.clone(), "").await.unwrap(), ServingStatus::NotServing as i32);
    assert_eq!(health(fresh.clone(), "scd.v1.Scd").await.unwrap(), ServingStatus::NotServing as i32);
    // and a new call is refused (fresh connection and the existing one)
    let err = ScdClient::new(fresh).info(pb::InfoRequest {}).await.unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{err:?}");
    assert!(err.message().contains("draining"), "{err:?}");
    assert!(!call.is_finished(), "the slow request finished during the checks; make it slower");
    let err = c.clone().info(pb::InfoRequest {}).await.unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{err:?}");
    // the call in flight completes
    let r = call.await.unwrap().expect("the call in flight completes").into_inner();
    assert_eq!(r.embeddings.len(), n);
    let took = t0.elapsed();
    // and the process exits 0, well within the drain timeout
    let st = server.wait_exit(Duration::from_secs(30)).expect("server exits after draining");
    assert!(st.success(), "{st:?}: {}", server.log());
    let log = server.log();
    assert!(log.contains("draining") && log.contains("drained; bye"), "{log}");
    eprintln!("drain: in-flight call took {took:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// REST calls drain as gRPC calls do: after SIGTERM a REST call in flight
/// completes, a new one is 503 with `Retry-After`, `/ready` says draining,
/// and the process exits only after the REST call ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_rest_calls_too() {
    if !ready() {
        return;
    }
    let dir = scratch("drain-rest");
    let mut server = Serve::start(
        &dir,
        "drain-rest",
        &["--addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--drain-timeout", "120"],
    );
    let c = serving(server.plain()).await;
    drop(c);
    let http: std::net::SocketAddr = server.http.clone().unwrap().replace("http://", "").parse().unwrap();
    let models = super::a2a::status_and_body(&http.to_string(), "/v1/models").1;
    let model =
        serde_json::from_str::<serde_json::Value>(&models).unwrap()["data"][0]["id"].as_str().unwrap().to_string();
    let texts = slow_embed(12, 300).texts;
    let body = serde_json::json!({"model": model, "input": texts}).to_string();
    let host = [("Host", "x")];
    let slow = body.clone();
    let t0 = Instant::now();
    let call = tokio::spawn(async move {
        let raw = super::a2a::request_from("127.0.0.1", http, &host, "POST", "/v1/embeddings", &slow).await;
        super::a2a::parse_response(&raw)
    });
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(!call.is_finished(), "the slow request finished before SIGTERM; make it slower");
    server.sigterm();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let raw = super::a2a::request_from("127.0.0.1", http, &host, "POST", "/v1/embeddings", &body).await;
    let head = String::from_utf8_lossy(&raw).to_ascii_lowercase();
    let (status, text) = super::a2a::parse_response(&raw);
    assert!(status == 503 && text.contains("draining") && head.contains("retry-after: 1"), "{status} {text}");
    assert_eq!(super::a2a::status_and_body(&http.to_string(), "/ready").0, 503);
    assert!(!call.is_finished(), "the slow request finished during the checks; make it slower");
    let (status, text) = call.await.unwrap();
    assert_eq!(status, 200, "the REST call in flight completes: {text}");
    let took = t0.elapsed();
    let st = server.wait_exit(Duration::from_secs(30)).expect("server exits after draining");
    assert!(st.success(), "{st:?}: {}", server.log());
    eprintln!("drain: in-flight REST call took {took:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_timeout_bounds_the_exit() {
    if !ready() {
        return;
    }
    let dir = scratch("drain-timeout");
    // a call long enough to outlast the drain: over the default encoder-token bound
    let args = ["--addr", "127.0.0.1:0", "--drain-timeout", "1", "--max-request-encoder-tokens", "2000000"];
    let mut server = Serve::start(&dir, "drain-timeout", &args);
    let c = serving(server.plain()).await;
    let mut inflight = c.clone();
    let call = tokio::spawn(async move { inflight.embed(slow_embed(256, 2000)).await });
    tokio::time::sleep(Duration::from_millis(500)).await;
    let t = Instant::now();
    server.sigterm();
    let st = server.wait_exit(Duration::from_secs(15)).expect("the drain timeout bounds the exit");
    let took = t.elapsed();
    assert!(took < Duration::from_secs(6), "exit took {took:?} with --drain-timeout 1");
    assert!(took >= Duration::from_millis(900), "exit took {took:?}: did not wait for the drain");
    assert!(st.success(), "{st:?}");
    let log = server.log();
    assert!(log.contains("drain timeout: exiting with 1 call(s) still in flight"), "{log}");
    assert!(call.await.unwrap().is_err(), "the cut call cannot have succeeded");
    eprintln!("drain timeout 1 s: exited after {took:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

// ---------------------------------------------------------------------------
// A client that survives a server killed mid-load and restarted
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_loses_no_request_when_the_server_is_killed_and_restarted() {
    if !ready() {
        return;
    }
    let dir = scratch("restart");
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let mut server = Serve::start(&dir, "first", &["--addr", &addr]);
    let _ = serving(server.plain()).await;
    let lines = 200;
    let input = dir.join("texts.jsonl");
    let body: String = (0..lines)
        .map(|i| {
            serde_json::json!({ "text": format!("request {i}: ") + &"restart the server mid load ".repeat(12) })
                .to_string()
                + "\n"
        })
        .collect();
    std::fs::write(&input, body).unwrap();
    let client_log = dir.join("client.log");
    let mut client = Command::new(env!("CARGO_BIN_EXE_scd"))
        .args(["client", "--addr", &format!("http://{addr}"), "--retries", "12", "embed", "--input", s(&input)])
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&client_log).unwrap())
        .spawn()
        .unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    let stdout = client.stdout.take().unwrap();
    std::thread::spawn(move || {
        for l in BufReader::new(stdout).lines() {
            if tx.send(l.unwrap()).is_err() {
                break;
            }
        }
    });
    let mut out = Vec::new();
    while out.len() < 50 {
        out.push(rx.recv_timeout(Duration::from_secs(60)).expect("client replies"));
    }
    // SIGKILL mid-load, then restart on the same port
    server.child.kill().unwrap();
    server.child.wait().unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let restarted = Serve::start(&dir, "second", &["--addr", &addr]);
    assert_eq!(restarted.port, port);
    while let Ok(l) = rx.recv_timeout(Duration::from_secs(120)) {
        out.push(l);
    }
    let st = tokio::task::block_in_place(|| client.wait()).unwrap();
    let log = std::fs::read_to_string(&client_log).unwrap();
    assert!(st.success(), "{st:?}: {log}");
    assert!(log.contains("retrying"), "the kill did not hit the client mid-load: {log}");
    assert_eq!(out.len(), lines + 1, "one line per request and the count");
    for (i, l) in out[..lines].iter().enumerate() {
        let v: serde_json::Value = serde_json::from_str(l).unwrap();
        assert_eq!(v["line"], i + 1, "in order");
        assert_eq!(v["embedding"].as_array().unwrap().len(), 384);
    }
    assert_eq!(serde_json::from_str::<serde_json::Value>(&out[lines]).unwrap()["count"], lines);
    let retries = log.matches("retrying").count();
    eprintln!("restart: {retries} retries");

    // a request the server refuses as invalid is not retried
    let bad = dir.join("bad.jsonl");
    std::fs::write(&bad, "{\"text\": \"fine\"}\n{\"text\": \" \"}\n").unwrap();
    let (ok, stdout, stderr) = tokio::task::block_in_place(|| {
        scd(&["client", "--addr", &format!("http://{addr}"), "embed", "--input", s(&bad)], "")
    });
    assert!(!ok);
    assert_eq!(stdout.lines().count(), 1, "the first line was answered: {stdout}");
    assert!(stderr.contains("--input line 2: InvalidArgument") && !stderr.contains("retrying"), "{stderr}");
    drop(restarted);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Nothing a client sends as content reaches the log, even at trace level:
/// not a confidential field, not the task, not a question, not a token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trace_logs_carry_no_request_content() {
    if !ready() {
        return;
    }
    let dir = scratch("trace-log");
    let mut server = Serve::start_with_env(&dir, "trace", &["--addr", "127.0.0.1:0"], &[("RUST_LOG", "trace")]);
    let mut c = serving(server.plain()).await;
    let mut req = crate::grpc::compress_req(120, "");
    req.task.as_mut().unwrap().description = "TASK-SECRET-7 why are charges failing".into();
    req.fields[4].content = "CONFIDENTIAL-SECRET-9 sk_live".into();
    assert!(req.fields[4].confidential);
    let open = c.open_session(pb::OpenSessionRequest { compress: Some(req) }).await.unwrap().into_inner();
    c.request_context(pb::ContextRequest {
        session_id: open.session_id.clone(),
        session_token: open.session_token.clone(),
        specific_question: "QUESTION-SECRET-3 which table".into(),
        current_confidence: 0.2,
        ..Default::default()
    })
    .await
    .unwrap();
    // a rejected request logs too
    let mut bad = crate::grpc::compress_req(0, "");
    bad.task.as_mut().unwrap().description = "REJECTED-SECRET-5".into();
    assert!(c.compress(bad).await.is_err());
    server.sigterm();
    server.wait_exit(Duration::from_secs(30)).expect("server exits");
    let log = server.log();
    assert!(log.lines().count() > 20, "trace logging produced lines: {log}");
    for secret in
        ["TASK-SECRET-7", "CONFIDENTIAL-SECRET-9", "QUESTION-SECRET-3", "REJECTED-SECRET-5", &open.session_token]
    {
        assert!(!log.contains(secret), "{secret} leaked into the log");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
