//! TLS for `scd serve` and `scd client` (rustls through tonic), and the
//! verified identity of a caller.
//!
//! Every file is read and parsed when the command starts, so a wrong path,
//! a file that is not PEM, or a key that does not match its certificate is
//! an error naming the flag, before the model loads.
//!
//! ```no_run
//! # fn main() -> anyhow::Result<()> {
//! use std::path::Path;
//! let tls = scd_service::tls::server_config(&scd_service::tls::ServerTlsFiles {
//!     cert: Some(Path::new("server.pem").into()),
//!     key: Some(Path::new("server.key").into()),
//!     client_ca: Some(Path::new("ca.pem").into()),
//! })?;
//! assert!(tls.is_some());
//! # Ok(())
//! # }
//! ```

use std::path::{Path, PathBuf};

use anyhow::Context as _;
use rustls_pki_types::pem::PemObject as _;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use sha2::{Digest as _, Sha256};
use tonic::transport::{Certificate, ClientTlsConfig, Identity, ServerTlsConfig};

/// The TLS files of `scd serve`, as given on the command line.
#[derive(Debug, Clone, Default)]
pub struct ServerTlsFiles {
    /// `--tls-cert`: the server's certificate chain (PEM).
    pub cert: Option<PathBuf>,
    /// `--tls-key`: the server's private key (PEM).
    pub key: Option<PathBuf>,
    /// `--client-ca`: clients must present a certificate signed by this CA.
    pub client_ca: Option<PathBuf>,
}

/// The TLS files of `scd client`, as given on the command line.
#[derive(Debug, Clone, Default)]
pub struct ClientTlsFiles {
    /// `--ca-cert`: the CA that signed the server's certificate (PEM).
    pub ca_cert: Option<PathBuf>,
    /// `--client-cert`: this client's certificate, for mTLS (PEM).
    pub client_cert: Option<PathBuf>,
    /// `--client-key`: this client's private key, for mTLS (PEM).
    pub client_key: Option<PathBuf>,
    /// `--tls-domain`: the name the server's certificate must carry
    /// (default: the host of `--addr`).
    pub domain: Option<String>,
}

impl ClientTlsFiles {
    /// Whether any TLS option was given.
    pub fn any(&self) -> bool {
        self.ca_cert.is_some() || self.client_cert.is_some() || self.client_key.is_some() || self.domain.is_some()
    }
}

/// Reads `path` (named `flag` in errors) and returns its PEM certificates;
/// none is an error.
fn read_certs(flag: &str, path: &Path) -> anyhow::Result<(Vec<u8>, Vec<CertificateDer<'static>>)> {
    let pem = std::fs::read(path).with_context(|| format!("{flag} {}", path.display()))?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| anyhow::anyhow!("{flag} {}: not a PEM certificate file: {e}", path.display()))?;
    anyhow::ensure!(!certs.is_empty(), "{flag} {}: holds no PEM CERTIFICATE block", path.display());
    Ok((pem, certs))
}

/// Reads `path` (named `flag` in errors) and checks it holds a PEM private key.
fn read_key(flag: &str, path: &Path) -> anyhow::Result<Vec<u8>> {
    let pem = std::fs::read(path).with_context(|| format!("{flag} {}", path.display()))?;
    PrivateKeyDer::from_pem_slice(&pem)
        .map_err(|e| anyhow::anyhow!("{flag} {}: no PEM private key (PKCS#8, PKCS#1 or SEC1): {e}", path.display()))?;
    Ok(pem)
}

/// Checks that `a` and `b` are given together.
fn pair<T>(a: (&str, &Option<T>), b: (&str, &Option<T>)) -> anyhow::Result<()> {
    match (a.1, b.1) {
        (Some(_), None) => anyhow::bail!("{} needs {} (the two are given together)", a.0, b.0),
        (None, Some(_)) => anyhow::bail!("{} needs {} (the two are given together)", b.0, a.0),
        _ => Ok(()),
    }
}

/// The server's TLS configuration, checked: `None` without `--tls-cert`.
///
/// The files are parsed and the rustls configuration is built here (so a
/// key that does not match the certificate fails now, not at the first
/// connection).
pub fn server_config(files: &ServerTlsFiles) -> anyhow::Result<Option<ServerTlsConfig>> {
    pair(("--tls-cert", &files.cert), ("--tls-key", &files.key))?;
    let (Some(cert), Some(key)) = (&files.cert, &files.key) else {
        anyhow::ensure!(files.client_ca.is_none(), "--client-ca needs --tls-cert and --tls-key (mTLS runs over TLS)");
        return Ok(None);
    };
    let (cert_pem, _) = read_certs("--tls-cert", cert)?;
    let key_pem = read_key("--tls-key", key)?;
    let mut cfg = ServerTlsConfig::new()
        .identity(Identity::from_pem(cert_pem, key_pem))
        .timeout(std::time::Duration::from_secs(10));
    if let Some(ca) = &files.client_ca {
        let (ca_pem, _) = read_certs("--client-ca", ca)?;
        cfg = cfg.client_ca_root(Certificate::from_pem(ca_pem));
    }
    // builds the rustls acceptor: checks the key against the certificate
    tonic::transport::Server::builder().tls_config(cfg.clone()).map_err(|e| {
        anyhow::anyhow!("--tls-cert {} / --tls-key {}: {}", cert.display(), key.display(), error_chain(&e))
    })?;
    Ok(Some(cfg))
}

/// The HTTP listener's TLS (A2A, REST, metrics) from the same files as
/// gRPC's: `--tls-cert`/`--tls-key`, and with `--client-ca` a client
/// certificate signed by it is required (mTLS). HTTP/1.1 only (ALPN
/// `http/1.1`). `None` without `--tls-cert`.
pub fn http_server_config(files: &ServerTlsFiles) -> anyhow::Result<Option<std::sync::Arc<rustls::ServerConfig>>> {
    pair(("--tls-cert", &files.cert), ("--tls-key", &files.key))?;
    let (Some(cert), Some(key)) = (&files.cert, &files.key) else { return Ok(None) };
    let (_, chain) = read_certs("--tls-cert", cert)?;
    let key_der = PrivateKeyDer::from_pem_slice(&read_key("--tls-key", key)?)
        .map_err(|e| anyhow::anyhow!("--tls-key {}: {e}", key.display()))?;
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .context("TLS protocol versions")?;
    let builder = match &files.client_ca {
        Some(ca) => {
            let (_, roots) = read_certs("--client-ca", ca)?;
            let mut store = rustls::RootCertStore::empty();
            for root in roots {
                store.add(root).map_err(|e| anyhow::anyhow!("--client-ca {}: {e}", ca.display()))?;
            }
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(store.into(), provider)
                .build()
                .map_err(|e| anyhow::anyhow!("--client-ca {}: {e}", ca.display()))?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let mut cfg = builder
        .with_single_cert(chain, key_der)
        .map_err(|e| anyhow::anyhow!("--tls-cert {} / --tls-key {}: {e}", cert.display(), key.display()))?;
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Some(std::sync::Arc::new(cfg)))
}

/// The client's TLS configuration for `addr`: `None` for `http://`.
///
/// `https://` trusts `--ca-cert`, or without it the system's root
/// certificates (`/etc/ssl/certs`, or `SSL_CERT_FILE`); a TLS option with an
/// `http://` address is an error rather than plaintext.
pub fn client_config(addr: &str, files: &ClientTlsFiles) -> anyhow::Result<Option<ClientTlsConfig>> {
    pair(("--client-cert", &files.client_cert), ("--client-key", &files.client_key))?;
    if !addr.starts_with("https://") {
        anyhow::ensure!(!files.any(), "--addr {addr}: TLS options need an https:// address");
        return Ok(None);
    }
    let cert_key = files.client_cert.as_deref().zip(files.client_key.as_deref());
    let flags = ["--ca-cert", "--client-cert", "--client-key"];
    let mut cfg = match &files.ca_cert {
        Some(ca) => client_tls(flags, ca, cert_key)?,
        None => with_identity(flags, ClientTlsConfig::new().with_native_roots(), cert_key)?,
    };
    if let Some(domain) = &files.domain {
        cfg = cfg.domain_name(domain.clone());
    }
    Ok(Some(cfg))
}

/// The TLS an ATP agent uses toward `https://` peers: `None` without
/// `--peer-ca`; with `cert_key`, its certificate for mTLS. The name checked
/// is each peer URL's host.
pub fn peer_config(ca: Option<&Path>, cert_key: Option<(&Path, &Path)>) -> anyhow::Result<Option<ClientTlsConfig>> {
    let Some(ca) = ca else {
        anyhow::ensure!(cert_key.is_none(), "--peer-cert needs --peer-ca (mTLS runs over TLS)");
        return Ok(None);
    };
    client_tls(["--peer-ca", "--peer-cert", "--peer-key"], ca, cert_key).map(Some)
}

/// A client configuration trusting the CA in `ca`, presenting the
/// certificate and key in `cert_key` when given (mTLS); `flags` name the
/// three files in errors (CA, certificate, key).
fn client_tls(flags: [&str; 3], ca: &Path, cert_key: Option<(&Path, &Path)>) -> anyhow::Result<ClientTlsConfig> {
    let (ca_pem, _) = read_certs(flags[0], ca)?;
    with_identity(flags, ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca_pem)), cert_key)
}

/// `cfg` presenting the certificate and key of `cert_key` (mTLS), if given.
fn with_identity(
    flags: [&str; 3],
    cfg: ClientTlsConfig,
    cert_key: Option<(&Path, &Path)>,
) -> anyhow::Result<ClientTlsConfig> {
    let Some((cert, key)) = cert_key else { return Ok(cfg) };
    let (cert_pem, _) = read_certs(flags[1], cert)?;
    Ok(cfg.identity(Identity::from_pem(cert_pem, read_key(flags[2], key)?)))
}

/// `e` and its sources, joined by `: `; a source whose text is already in
/// the chain (rustls' and hyper's errors repeat their sources' words) is
/// left out.
pub(crate) fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut src = e.source();
    while let Some(s) = src {
        let text = s.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        src = s.source();
    }
    out
}

/// What to change for a TLS failure that `error` (a client's error text
/// over TLS) shows, if it is one whose cause a user can fix.
pub fn tls_hint(error: &str) -> Option<&'static str> {
    let closed = "the server closed the connection right after the TLS handshake: if it requires a client \
                  certificate (mTLS, --client-ca), give --client-cert and --client-key";
    let hints: [(&str, &str); 8] = [
        (
            "CaUsedAsEndEntity",
            "the server's certificate is a CA certificate, which `openssl req -x509` makes by default: make an \
             end-entity one by adding `-addext basicConstraints=critical,CA:FALSE -addext \
             subjectAltName=DNS:localhost,IP:127.0.0.1` (the server's names) to that command, or sign a server \
             certificate with a CA (docs/operations.md#tls-and-mtls)",
        ),
        (
            "UnknownIssuer",
            "the server's certificate is not signed by --ca-cert (nor by the system's roots without it): give the CA \
             that signed it, or the certificate itself if it is self-signed",
        ),
        (
            "NotValidForName",
            "the server's certificate does not name the host of --addr: add that name to its subjectAltName, or give \
             --tls-domain with a name it carries",
        ),
        ("Expired", "the server's certificate has expired (or the clocks differ): renew it"),
        (
            "CertificateRequired",
            "client certificate required: the server asks for one (mTLS, --client-ca); give --client-cert and \
             --client-key, signed by that CA",
        ),
        (
            "UnknownCA",
            "the server does not accept this client certificate: it is not signed by the server's --client-ca",
        ),
        // TLS 1.3: a server that wants a client certificate may close the
        // connection before the client reads its alert
        ("broken pipe", closed),
        ("connection closed", closed),
    ];
    hints.into_iter().find(|(needle, _)| error.contains(needle)).map(|(_, hint)| hint)
}

/// The verified identity of the caller of `req`: `x509:sha256:<hex>` of the
/// DER of the client certificate it presented (mTLS), or `None` over
/// plaintext or when the client presented none.
///
/// Only certificates the server verified against `--client-ca` reach a
/// handler: the TLS handshake refuses the rest.
pub fn caller_identity<T>(req: &tonic::Request<T>) -> Option<String> {
    let certs = req.peer_certs()?;
    let leaf = certs.first()?;
    Some(cert_identity(leaf))
}

/// `x509:sha256:<hex>` of a DER certificate.
pub fn cert_identity(der: &[u8]) -> String {
    let digest = Sha256::digest(der);
    let mut out = String::with_capacity(12 + 64);
    out.push_str("x509:sha256:");
    for b in digest {
        out.push_str(&format!("{b:02x}"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plaintext_request_has_no_identity() {
        assert_eq!(caller_identity(&tonic::Request::new(())), None);
    }

    #[test]
    fn identity_is_the_sha256_of_the_der() {
        // sha256("") is well known
        assert_eq!(cert_identity(b""), "x509:sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    }

    #[test]
    fn cert_and_key_go_together_and_files_must_parse() {
        let dir = std::env::temp_dir().join(format!("scd-tls-unit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let junk = dir.join("junk.pem");
        std::fs::write(&junk, "not pem").unwrap();
        let files = |cert: Option<&Path>, key: Option<&Path>, ca: Option<&Path>| ServerTlsFiles {
            cert: cert.map(Into::into),
            key: key.map(Into::into),
            client_ca: ca.map(Into::into),
        };
        let err = |f: ServerTlsFiles| server_config(&f).unwrap_err().to_string();
        assert_eq!(err(files(Some(&junk), None, None)), "--tls-cert needs --tls-key (the two are given together)");
        assert_eq!(err(files(None, Some(&junk), None)), "--tls-key needs --tls-cert (the two are given together)");
        assert_eq!(
            err(files(None, None, Some(&junk))),
            "--client-ca needs --tls-cert and --tls-key (mTLS runs over TLS)"
        );
        let e = err(files(Some(&junk), Some(&junk), None));
        assert!(e.starts_with("--tls-cert ") && e.ends_with("holds no PEM CERTIFICATE block"), "{e}");
        let missing = dir.join("missing.pem");
        let e = format!("{:#}", server_config(&files(Some(&missing), Some(&junk), None)).unwrap_err());
        assert!(e.contains("--tls-cert") && e.contains("missing.pem"), "{e}");
        assert!(server_config(&ServerTlsFiles::default()).unwrap().is_none());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn tls_failures_say_what_to_change() {
        let raw = "invalid peer certificate: Other(OtherError(CaUsedAsEndEntity))";
        assert!(tls_hint(raw).unwrap().contains("basicConstraints=critical,CA:FALSE"));
        assert!(tls_hint("received fatal alert: CertificateRequired")
            .unwrap()
            .starts_with("client certificate required"));
        assert!(tls_hint("invalid peer certificate: UnknownIssuer").unwrap().contains("not signed by --ca-cert"));
        assert_eq!(tls_hint("tcp connect error: Connection refused"), None);
        // a source that repeats what the chain already says is left out
        #[derive(Debug)]
        struct E(&'static str, Option<Box<E>>);
        impl std::fmt::Display for E {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.0)
            }
        }
        impl std::error::Error for E {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                self.1.as_deref().map(|e| e as _)
            }
        }
        let inner = E("invalid peer certificate: UnknownIssuer", None);
        let e = E("transport error: invalid peer certificate: UnknownIssuer", Some(Box::new(inner)));
        assert_eq!(error_chain(&e), "transport error: invalid peer certificate: UnknownIssuer");
    }

    #[test]
    fn client_tls_needs_https() {
        let tls = ClientTlsFiles { ca_cert: Some("ca.pem".into()), ..Default::default() };
        assert_eq!(
            client_config("http://127.0.0.1:1", &tls).unwrap_err().to_string(),
            "--addr http://127.0.0.1:1: TLS options need an https:// address"
        );
        // without --ca-cert: the system's roots
        assert!(client_config("https://127.0.0.1:1", &ClientTlsFiles::default()).unwrap().is_some());
        assert!(client_config("http://127.0.0.1:1", &ClientTlsFiles::default()).unwrap().is_none());
        let half = ClientTlsFiles { client_cert: Some("c.pem".into()), ..Default::default() };
        assert_eq!(
            client_config("https://x:1", &half).unwrap_err().to_string(),
            "--client-cert needs --client-key (the two are given together)"
        );
    }
}
