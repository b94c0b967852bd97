//! TLS and mTLS of `scd serve` and `scd client`: the caller identity a
//! verified client certificate gives, the system's roots, the HTTP listener
//! over TLS, exactly the right clients admitted, and sessions bound to the
//! certificate that opened them. The test PKI and the server process are
//! [`crate::lifecycle`]'s.

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use scd_service::grpc::pb;
use scd_service::tls::{caller_identity, cert_identity, server_config, ServerTlsFiles};
use tonic_health::pb::health_check_response::ServingStatus;

use crate::lifecycle::{health, info, pki, s, serving, tls_endpoint, Pki, Serve};
use crate::{ready, scd, scratch};

// ---------------------------------------------------------------------------
// caller_identity: the verified client certificate, in process
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn caller_identity_is_the_verified_client_certificate() {
    let dir = scratch("identity");
    let pki = pki(&dir);
    let tls = server_config(&ServerTlsFiles {
        cert: Some(pki.server_cert.clone()),
        key: Some(pki.server_key.clone()),
        client_ca: Some(pki.ca.clone()),
    })
    .unwrap()
    .unwrap();
    let seen: Arc<Mutex<Vec<Option<String>>>> = Arc::default();
    let record = seen.clone();
    let (_, health_service) = tonic_health::server::health_reporter();
    let svc = tonic::service::interceptor::InterceptedService::new(health_service, move |req: tonic::Request<()>| {
        record.lock().unwrap().push(caller_identity(&req));
        Ok(req)
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(
        tonic::transport::Server::builder()
            .tls_config(tls)
            .unwrap()
            .add_service(svc)
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    let ch = tls_endpoint(port, &pki, Some((&pki.client_cert, &pki.client_key))).connect().await.unwrap();
    assert_eq!(health(ch, "").await.unwrap(), ServingStatus::Serving as i32);
    let want = cert_identity(&pki.client_der);
    assert!(want.starts_with("x509:sha256:") && want.len() == 12 + 64, "{want}");
    assert_eq!(*seen.lock().unwrap(), vec![Some(want)]);
    // a certificate from another CA never reaches the handler
    let rogue = tls_endpoint(port, &pki, Some((&pki.rogue_cert, &pki.rogue_key)));
    let refused = match rogue.connect().await {
        Ok(ch) => health(ch, "").await.is_err(),
        Err(_) => true,
    };
    assert!(refused);
    assert_eq!(seen.lock().unwrap().len(), 1);
    let _ = std::fs::remove_dir_all(&dir);
}

// ---------------------------------------------------------------------------
// TLS and mTLS against the real server
// ---------------------------------------------------------------------------

/// `GET path` over TLS to `addr` with `roots` trusted and, for mTLS, a
/// client certificate: the response head's status line, or the error.
async fn https_get(addr: &str, pki: &Pki, client: Option<(&Path, &Path)>, path: &str) -> Result<String, String> {
    use rustls_pki_types::pem::PemObject as _;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls_pki_types::CertificateDer::pem_file_iter(&pki.ca).unwrap() {
        roots.add(c.unwrap()).unwrap();
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let b = rustls::ClientConfig::builder_with_provider(provider).with_safe_default_protocol_versions().unwrap();
    let b = b.with_root_certificates(roots);
    let cfg = match client {
        Some((cert, key)) => {
            let chain = rustls_pki_types::CertificateDer::pem_file_iter(cert).unwrap().map(|c| c.unwrap()).collect();
            b.with_client_auth_cert(chain, rustls_pki_types::PrivateKeyDer::from_pem_file(key).unwrap()).unwrap()
        }
        None => b.with_no_client_auth(),
    };
    let tcp = tokio::net::TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
    let name = rustls_pki_types::ServerName::try_from("localhost").unwrap();
    let mut tls =
        tokio_rustls::TlsConnector::from(Arc::new(cfg)).connect(name, tcp).await.map_err(|e| e.to_string())?;
    let req = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    tls.write_all(req.as_bytes()).await.map_err(|e| e.to_string())?;
    let mut raw = Vec::new();
    tls.read_to_end(&mut raw).await.map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&raw).into_owned();
    text.lines().next().map(str::to_string).filter(|l| l.starts_with("HTTP/1.1")).ok_or(text)
}

/// `scd client` on an `https://` address without `--ca-cert` trusts the
/// system's roots: the test CA through `SSL_CERT_FILE` is trusted, the
/// system's own store (which does not hold it) is not.
#[test]
fn scd_client_trusts_the_systems_roots_without_ca_cert() {
    if !ready() {
        return;
    }
    let dir = scratch("native-roots");
    let pki = pki(&dir);
    let args = ["--addr", "127.0.0.1:0", "--tls-cert", s(&pki.server_cert), "--tls-key", s(&pki.server_key)];
    let server = Serve::start(&dir, "native-roots", &args);
    let addr = format!("https://localhost:{}", server.port);
    let client = |cert_file: Option<&Path>| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_scd"));
        c.args(["client", "--addr", &addr, "--retries", "0", "info"]).stdin(Stdio::null());
        c.env_remove("SSL_CERT_FILE").env_remove("SSL_CERT_DIR");
        if let Some(f) = cert_file {
            c.env("SSL_CERT_FILE", f);
        }
        let out = c.output().unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (ok, stdout, stderr) = client(Some(&pki.ca));
    assert!(ok && stdout.contains("e5-small"), "{stdout}{stderr}");
    let (ok, _, stderr) = client(None);
    assert!(!ok, "a CA the system does not hold is not trusted: {stderr}");
}

/// The HTTP listener (REST, A2A, metrics) is served over TLS with
/// `--tls-cert`, and over mTLS with `--client-ca`, like gRPC: its URL says
/// https; a plaintext request gets no HTTP answer; without the client
/// certificate mTLS refuses the handshake.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_http_listener_serves_tls_and_mtls() {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    if !ready() {
        return;
    }
    let dir = scratch("http-tls");
    let pki = pki(&dir);
    let tls = ["--addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--tls-cert", s(&pki.server_cert)];
    let tls = [&tls[..], &["--tls-key", s(&pki.server_key)]].concat();
    let one = Serve::start(&dir, "http-tls", &tls);
    let url = one.http.clone().expect("a metrics line");
    let addr = url.strip_prefix("https://").expect("the start-up line says https").to_string();
    assert_eq!(https_get(&addr, &pki, None, "/v1/models").await, Ok("HTTP/1.1 200 OK".to_string()));
    assert_eq!(https_get(&addr, &pki, None, "/metrics").await, Ok("HTTP/1.1 200 OK".to_string()));
    // plaintext on the TLS port: no HTTP answer
    let mut plain = tokio::net::TcpStream::connect(&addr).await.unwrap();
    plain.write_all(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
    let mut raw = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), plain.read_to_end(&mut raw)).await;
    assert!(!String::from_utf8_lossy(&raw).contains("200 OK"), "plaintext answered");
    drop(one);
    let two = Serve::start(&dir, "http-mtls", &[&tls[..], &["--client-ca", s(&pki.ca)]].concat());
    let addr = two.http.clone().unwrap().replace("https://", "");
    let me = (pki.client_cert.as_path(), pki.client_key.as_path());
    assert_eq!(https_get(&addr, &pki, Some(me), "/v1/models").await, Ok("HTTP/1.1 200 OK".to_string()));
    assert!(https_get(&addr, &pki, None, "/v1/models").await.is_err(), "no client certificate, no answer");
    let rogue = (pki.rogue_cert.as_path(), pki.rogue_key.as_path());
    assert!(https_get(&addr, &pki, Some(rogue), "/v1/models").await.is_err(), "another CA's certificate");
}

/// `scd serve` with TLS and `--client-ca` (mTLS) from `pki`.
fn start_mtls(dir: &Path, name: &str, pki: &Pki) -> Serve {
    let args = ["--addr", "127.0.0.1:0", "--tls-cert", s(&pki.server_cert), "--tls-key", s(&pki.server_key)];
    Serve::start(dir, name, &[&args[..], &["--client-ca", s(&pki.ca)]].concat())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_and_mtls_admit_exactly_the_right_clients() {
    if !ready() {
        return;
    }
    let dir = scratch("tls");
    let pki = pki(&dir);
    let server = Serve::start(
        &dir,
        "tls",
        &["--addr", "127.0.0.1:0", "--tls-cert", s(&pki.server_cert), "--tls-key", s(&pki.server_key)],
    );
    // (a) a TLS client trusting the CA reaches Info
    let mut c = serving(tls_endpoint(server.port, &pki, None)).await;
    assert_eq!(c.info(pb::InfoRequest {}).await.unwrap().into_inner().dim, 384);
    // (b) a plaintext client does not
    let err = info(server.plain()).await.unwrap_err();
    assert!(!err.is_empty());
    let plain = format!("http://127.0.0.1:{}", server.port);
    let (ok, _, stderr) =
        tokio::task::block_in_place(|| scd(&["client", "--retries", "0", "--addr", &plain, "info"], ""));
    assert!(!ok && stderr.contains("the server may speak TLS: use an https:// --addr with --ca-cert"), "{stderr}");
    // (d) `scd client --ca-cert ... info`, by name and by IP with --tls-domain
    for (addr, domain) in [
        (format!("https://localhost:{}", server.port), None),
        (format!("https://127.0.0.1:{}", server.port), Some("localhost")),
    ] {
        let mut args = vec!["client", "--addr", &addr, "--ca-cert", s(&pki.ca)];
        if let Some(d) = domain {
            args.extend(["--tls-domain", d]);
        }
        args.push("info");
        let (ok, stdout, stderr) = tokio::task::block_in_place(|| scd(&args, ""));
        assert!(ok, "{addr}: {stderr}");
        let v: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
        assert_eq!(v["dim"], 384);
    }
    // a client that does not trust the server's CA is refused
    let (ok, _, stderr) = tokio::task::block_in_place(|| {
        scd(
            &[
                "client",
                "--retries",
                "0",
                "--addr",
                &format!("https://localhost:{}", server.port),
                "--ca-cert",
                s(&pki.client_cert),
                "info",
            ],
            "",
        )
    });
    assert!(!ok && stderr.contains("TLS: the server's certificate is not signed by --ca-cert"), "{stderr}");
    assert_eq!(stderr.matches("UnknownIssuer").count(), 1, "the cause said once: {stderr}");

    // (c) mTLS: only clients with a certificate from --client-ca
    let mtls = start_mtls(&dir, "mtls", &pki);
    let mut c = serving(tls_endpoint(mtls.port, &pki, Some((&pki.client_cert, &pki.client_key)))).await;
    assert!(c.info(pb::InfoRequest {}).await.is_ok());
    let no_cert = info(tls_endpoint(mtls.port, &pki, None)).await;
    assert!(no_cert.is_err(), "a client without a certificate got in");
    let rogue = info(tls_endpoint(mtls.port, &pki, Some((&pki.rogue_cert, &pki.rogue_key)))).await;
    assert!(rogue.is_err(), "a client with another CA's certificate got in");
    let addr = format!("https://localhost:{}", mtls.port);
    let base = ["client", "--retries", "0", "--addr", &addr, "--ca-cert", s(&pki.ca)];
    let with_cert =
        [&base[..], &["--client-cert", s(&pki.client_cert), "--client-key", s(&pki.client_key), "info"]].concat();
    let (ok, _, stderr) = tokio::task::block_in_place(|| scd(&with_cert, ""));
    assert!(ok, "{stderr}");
    let without = [&base[..], &["info"]].concat();
    let (ok, _, stderr) = tokio::task::block_in_place(|| scd(&without, ""));
    // the server's alert, or (TLS 1.3) the connection it closed first
    let hinted =
        stderr.contains("TLS: client certificate required") || stderr.contains("requires a client certificate");
    assert!(!ok && hinted, "without a certificate: {stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A session opened over mTLS belongs to the certificate that opened it:
/// another client of the same CA holding the id and the token is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_opened_over_mtls_are_bound_to_the_client_certificate() {
    if !ready() {
        return;
    }
    let dir = scratch("mtls-sessions");
    let pki = pki(&dir);
    let server = start_mtls(&dir, "mtls-sessions", &pki);
    let mut alice = serving(tls_endpoint(server.port, &pki, Some((&pki.client_cert, &pki.client_key)))).await;
    let mut bob = serving(tls_endpoint(server.port, &pki, Some((&pki.other_cert, &pki.other_key)))).await;
    let open = alice
        .open_session(pb::OpenSessionRequest { compress: Some(crate::grpc::compress_req(200, "")) })
        .await
        .unwrap()
        .into_inner();
    let ask = |token: String| pb::ContextRequest {
        session_id: open.session_id.clone(),
        session_token: token,
        specific_question: "what happened after the error".into(),
        current_confidence: 0.2,
        ..Default::default()
    };
    let stolen = bob.request_context(ask(open.session_token.clone())).await.unwrap_err();
    assert_eq!(stolen.code(), tonic::Code::PermissionDenied, "{stolen:?}");
    let closed = bob
        .close_session(pb::CloseSessionRequest {
            session_id: open.session_id.clone(),
            session_token: open.session_token.clone(),
        })
        .await
        .unwrap_err();
    assert_eq!(closed.code(), tonic::Code::PermissionDenied);
    assert!(alice.request_context(ask(open.session_token.clone())).await.is_ok());
    let _ = std::fs::remove_dir_all(&dir);
}
