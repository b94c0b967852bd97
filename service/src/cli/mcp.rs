//! `scd mcp`: the engine as an MCP tool server (see [`crate::mcp`]).
//!
//! Over stdio by default (stdout is the protocol; logs go to stderr), or
//! over streamable HTTP at `http://ADDR/mcp` with `--http-addr` (the bound
//! address is printed on stdout: `mcp on http://127.0.0.1:PORT/mcp`).
//! In process, `--audit-db` keeps the audit trail as `scd serve` does,
//! each tool call named `MCP` and the core's method. Its audit flags read
//! `scd mcp`'s own variables (`SCD_MCP_AUDIT_DB`, …), not `scd serve`'s
//! `SCD_AUDIT_*`: an environment set up for the server neither opens the
//! server's file here nor stops `scd mcp --server`, which ignores the
//! variables (its server keeps the trail) and refuses the flags.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context as _;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::ServiceExt as _;
use scd_engine::extract::Scd;

use crate::app::Limits;
use crate::cli::client::IdentityArgs;
use crate::client::Conn;
use crate::config::ModelArgs;
use crate::http::serve_router;
use crate::mcp::http::{
    bind_to_address, check_origin, refuse_duplicate_keys, refuse_when_full, CappedSessions, Gate, Owners,
};
use crate::mcp::stdio::StrictLines;
use crate::mcp::{Backend, ScdMcp, SessionTokens};
use crate::tls;

/// The audit flags `scd mcp` shares with `scd serve` (clap ids) and the
/// variables they read here.
const AUDIT_ENV: [(&str, &str); 4] = [
    ("audit_db", "SCD_MCP_AUDIT_DB"),
    ("audit_level", "SCD_MCP_AUDIT_LEVEL"),
    ("audit_max_age", "SCD_MCP_AUDIT_MAX_AGE"),
    ("audit_max_bytes", "SCD_MCP_AUDIT_MAX_BYTES"),
];

/// Arguments of `scd mcp`.
#[derive(Debug, clap::Args)]
#[command(
    mut_arg(AUDIT_ENV[0].0, |a| a.env(AUDIT_ENV[0].1)),
    mut_arg(AUDIT_ENV[1].0, |a| a.env(AUDIT_ENV[1].1)),
    mut_arg(AUDIT_ENV[2].0, |a| a.env(AUDIT_ENV[2].1)),
    mut_arg(AUDIT_ENV[3].0, |a| a.env(AUDIT_ENV[3].1))
)]
pub struct McpArgs {
    /// Serve streamable HTTP at http://ADDR/mcp instead of stdio (port 0
    /// picks a free port; the address is printed on stdout).
    #[arg(long, env = "SCD_MCP_HTTP_ADDR")]
    http_addr: Option<SocketAddr>,
    /// Host names (or host:port) accepted in the Host header over HTTP, a
    /// guard against DNS rebinding (comma-separated). Default: loopback only.
    #[arg(long, env = "SCD_MCP_ALLOWED_HOSTS", value_delimiter = ',', requires = "http_addr")]
    allowed_hosts: Vec<String>,
    /// Origins (scheme://host[:port]) a browser's request may come from over
    /// HTTP, besides loopback ones (comma-separated); a request with
    /// another `Origin` is refused 403 (MCP 2025-06-18).
    #[arg(long, env = "SCD_MCP_ALLOWED_ORIGINS", value_delimiter = ',', requires = "http_addr")]
    allowed_origins: Vec<String>,
    /// Forward the tools to a running `scd serve` at this URL (http:// or
    /// https://) instead of loading the model here.
    #[arg(long, env = "SCD_MCP_SERVER")]
    server: Option<String>,
    /// With --server https://: CA certificate (PEM) that signed the server's.
    #[arg(long, env = "SCD_MCP_CA_CERT", requires = "server")]
    ca_cert: Option<PathBuf>,
    /// With --server: client certificate (PEM) for mTLS; with --client-key.
    #[arg(long, env = "SCD_MCP_CLIENT_CERT", requires = "server")]
    client_cert: Option<PathBuf>,
    /// With --server: client private key (PEM) for mTLS; with --client-cert.
    #[arg(long, env = "SCD_MCP_CLIENT_KEY", requires = "server")]
    client_key: Option<PathBuf>,
    /// With --server: name the server's certificate must carry (default: its host).
    #[arg(long, env = "SCD_MCP_TLS_DOMAIN", requires = "server")]
    tls_domain: Option<String>,
    /// With --server: retries per call on UNAVAILABLE, broken connections
    /// and RESOURCE_EXHAUSTED (backoff 100 ms doubling, capped at 2 s).
    #[arg(long, env = "SCD_CLIENT_RETRIES", default_value_t = 5)]
    retries: u32,
    /// With --server: who signs the calls (`--auth did-wba` servers).
    #[command(flatten)]
    sign: IdentityArgs,
    /// Session tokens this server holds for its clients (one per session it
    /// opened); past it the oldest is forgotten.
    #[arg(long, env = "SCD_MCP_MAX_SESSIONS", default_value_t = 1024)]
    max_sessions: usize,
    /// Over HTTP: MCP sessions open at once (each `initialize` opens one,
    /// kept until the client ends it or 5 minutes idle); past it a new
    /// `initialize` is answered HTTP 503 with Retry-After.
    #[arg(long, env = "SCD_MCP_MAX_HTTP_SESSIONS", default_value_t = 256, requires = "http_addr")]
    max_http_sessions: usize,
    /// Over HTTP: the listener's caps and time limits.
    #[command(flatten)]
    http_conn: crate::config::HttpConnArgs,
    /// Largest MCP message in bytes (a stdio line, an HTTP request body);
    /// a longer stdio line is dropped and answered with an error.
    #[arg(long, env = "SCD_MAX_REQUEST_BYTES", default_value_t = 16 << 20)]
    max_request_bytes: usize,
    /// In-process: compress / request_more_context calls in flight at once;
    /// more are answered "busy ... retry".
    #[arg(long, env = "SCD_MAX_CONCURRENT_COMPRESS", default_value_t = 8)]
    max_concurrent_compress: usize,
    /// In-process: texts per embed call.
    #[arg(long, env = "SCD_MAX_TEXTS", default_value_t = 256)]
    max_texts: usize,
    /// In-process: fields per compress_context call.
    #[arg(long, env = "SCD_MAX_FIELDS", default_value_t = 256)]
    max_fields: usize,
    /// In-process: bytes of one embed / count_tokens text.
    #[arg(long, env = "SCD_MAX_TEXT_BYTES", default_value_t = 1 << 20)]
    max_text_bytes: usize,
    /// In-process: the current_confidence of a report's confidence level.
    #[command(flatten)]
    confidence: crate::cli::handoff::ConfidenceArgs,
    /// In-process: the audit trail of `scd serve`, recording the tools'
    /// compress and request_more_context calls (`MCP OpenSession`, `MCP
    /// Compress`, `MCP RequestContext`); `scd audit --db` reads it. The
    /// variables are `SCD_MCP_AUDIT_*`, not the server's `SCD_AUDIT_*`.
    #[command(flatten)]
    audit: crate::cli::serve::AuditTrailArgs,
    /// In-process: the second stage (a cross-encoder over the best chunks).
    #[command(flatten)]
    rerank: crate::config::RerankArgs,
}

impl McpArgs {
    fn check(&mut self, matches: &clap::ArgMatches) -> anyhow::Result<()> {
        for (flag, v) in [
            ("--max-sessions", self.max_sessions),
            ("--max-concurrent-compress", self.max_concurrent_compress),
            ("--max-texts", self.max_texts),
            ("--max-fields", self.max_fields),
            ("--max-text-bytes", self.max_text_bytes),
            ("--max-request-bytes", self.max_request_bytes),
            ("--max-http-sessions", self.max_http_sessions),
        ] {
            anyhow::ensure!(v > 0, "{flag} {v}: must be at least 1");
        }
        self.http_conn.limits()?;
        if self.server.is_some() {
            self.ignore_audit_env(matches);
        } else if std::env::var_os("SCD_AUDIT_DB").is_some() {
            tracing::info!(
                "SCD_AUDIT_DB is scd serve's audit trail; scd mcp records with --audit-db or SCD_MCP_AUDIT_DB"
            );
        }
        self.audit.check()?;
        anyhow::ensure!(
            self.server.is_none() || self.audit.audit_db.is_none(),
            "--audit-db: with --server the tools run on that server, which keeps the audit trail (scd serve --audit-db)"
        );
        Ok(())
    }

    /// With --server: the audit settings that only the environment gives
    /// (`SCD_MCP_AUDIT_*`) are dropped, with one line naming them, since the
    /// server keeps the trail; the flags, given on the command line, stay
    /// to be refused.
    fn ignore_audit_env(&mut self, matches: &clap::ArgMatches) {
        let from_env = |id: &str| matches.value_source(id) == Some(clap::parser::ValueSource::EnvVariable);
        let ignored: Vec<&str> = AUDIT_ENV.iter().filter(|(id, _)| from_env(id)).map(|&(_, var)| var).collect();
        if ignored.is_empty() {
            return;
        }
        if from_env("audit_db") {
            self.audit.audit_db = None;
        }
        if from_env("audit_max_age") {
            self.audit.audit_max_age = None;
        }
        if from_env("audit_max_bytes") {
            self.audit.audit_max_bytes = None;
        }
        tracing::info!(
            "{} ignored: with --server the tools run on that server, which keeps the audit trail",
            ignored.join(", ")
        );
    }

    /// The serve defaults, with this command's limits.
    fn limits(&self) -> Limits {
        Limits {
            max_texts: self.max_texts,
            max_text_bytes: self.max_text_bytes,
            max_fields: self.max_fields,
            max_request_bytes: self.max_request_bytes,
            queue_size: 256,
            batch_texts: 64,
            max_batch_tokens: 8192,
            max_concurrent_compress: self.max_concurrent_compress,
        }
    }

    fn backend(&self, model: &ModelArgs) -> anyhow::Result<Backend> {
        match &self.server {
            Some(url) => {
                let tls = tls::client_config(
                    url,
                    &tls::ClientTlsFiles {
                        ca_cert: self.ca_cert.clone(),
                        client_cert: self.client_cert.clone(),
                        client_key: self.client_key.clone(),
                        domain: self.tls_domain.clone(),
                    },
                )
                .context("--server")?;
                let conn = Conn::new(url, tls, self.retries, self.sign.signer()?).context("--server")?;
                Ok(Backend::Remote(Box::new(conn)))
            }
            None => {
                let mut cfg = model.scd_config();
                self.rerank.apply(&mut cfg.scoring);
                let reranker = self.rerank.load_if_weighted(model)?;
                let scd = Scd::new(Arc::new(model.lazy_encoder()?), cfg).with_reranker(reranker);
                Ok(Backend::in_process_with(Arc::new(scd), self.limits(), self.confidence.map()?, self.audit.open()?))
            }
        }
    }
}

/// The line `scd mcp` prints on stderr when it serves HTTP on a
/// non-loopback address: it has neither TLS nor authentication.
pub fn exposed_warning(local: SocketAddr) -> String {
    format!(
        "warning: scd mcp serves HTTP on {local} without TLS or authentication: anyone who reaches it can call \
         its tools; bind a loopback address, or put it behind an authenticating TLS proxy"
    )
}

/// Runs `scd mcp` until stdin closes (stdio) or Ctrl-C / SIGTERM (HTTP).
///
/// `matches` are the subcommand's: they tell a flag from its variable.
pub fn run(model: &ModelArgs, mut args: McpArgs, matches: &clap::ArgMatches) -> anyhow::Result<()> {
    args.check(matches)?;
    let listener = match args.http_addr {
        Some(addr) => Some(std::net::TcpListener::bind(addr).map_err(|e| match e.kind() {
            std::io::ErrorKind::AddrInUse => anyhow::anyhow!("--http-addr {addr} is already in use"),
            _ => anyhow::anyhow!("--http-addr {addr}: cannot listen: {e}"),
        })?),
        None => None,
    };
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    rt.block_on(async move {
        // the engine (or the channel to --server) is made inside the runtime:
        // the in-process handler starts its batcher there
        let backend = args.backend(model)?;
        let server = ScdMcp::new(backend, SessionTokens::new(args.max_sessions));
        match listener {
            None => {
                tracing::info!("MCP over stdio");
                let (stdin, stdout) = rmcp::transport::stdio();
                let transport = StrictLines::new(stdin, stdout, args.max_request_bytes);
                let running = server.serve(transport).await.context("MCP initialization")?;
                running.waiting().await.context("MCP over stdio")?;
                Ok(())
            }
            Some(listener) => {
                listener.set_nonblocking(true)?;
                let listener = tokio::net::TcpListener::from_std(listener)?;
                let local = listener.local_addr()?;
                let mut config = StreamableHttpServerConfig::default();
                config.max_request_body_bytes = args.max_request_bytes;
                if !args.allowed_hosts.is_empty() {
                    config.allowed_hosts = args.allowed_hosts.clone();
                }
                let stop = config.cancellation_token.clone();
                let sessions = CappedSessions::new(args.max_http_sessions);
                let service = StreamableHttpService::new(move || Ok(server.clone()), sessions.clone(), config);
                let owners = Owners::new(sessions.clone());
                let gate = Gate { sessions, max_body_bytes: args.max_request_bytes };
                let origins = Arc::new(args.allowed_origins.clone());
                let router = axum::Router::new()
                    .nest_service("/mcp", service)
                    .layer(axum::middleware::from_fn_with_state(gate, refuse_when_full))
                    .layer(axum::middleware::from_fn_with_state(args.max_request_bytes, refuse_duplicate_keys))
                    .layer(axum::middleware::from_fn_with_state(owners, bind_to_address))
                    .layer(axum::middleware::from_fn_with_state(origins, check_origin));
                let limits = args.http_conn.limits()?;
                if !local.ip().is_loopback() {
                    eprintln!("{}", exposed_warning(local));
                }
                println!("mcp on http://{local}/mcp");
                tracing::info!(%local, "MCP over streamable HTTP at /mcp");
                tokio::select! {
                    () = serve_router(listener, router, limits, |_| {}) => {}
                    () = crate::server::shutdown_signal() => stop.cancel(),
                }
                Ok(())
            }
        }
    })
}
