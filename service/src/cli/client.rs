//! `scd client`: a small gRPC client for scripts and tests.
//!
//! Plaintext (`http://`) or TLS (`https://` with `--ca-cert`, plus
//! `--client-cert`/`--client-key` for mTLS). Every call is retried with
//! exponential backoff and jitter on UNAVAILABLE, broken connections and
//! RESOURCE_EXHAUSTED (waiting at least the server's `retry-after-ms`),
//! never on INVALID_ARGUMENT and the like.
//!
//! With `--identity FILE` (and `--did` for a did:wba) every call, retries
//! included, carries a freshly signed `Authorization: DIDWba …` header (a
//! new nonce and timestamp each time) for a server run with `--auth did-wba`.

use std::future::Future;
use std::io::{BufRead as _, Write as _};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use scd_atp::identity::Identity;
use scd_engine::context::{Context, FieldKind};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, ClientTlsConfig, Endpoint};
use tonic::{Code, Status};
use tracing::warn;

use crate::grpc::pb;
use crate::tls;

/// Client subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum ClientCommand {
    /// Server info.
    Info,
    /// Embed texts given as arguments (one request), or every line of
    /// --input (one request per line, one JSON line out per request, in order,
    /// then {"count": N}).
    Embed {
        /// Texts.
        #[arg(conflicts_with = "input")]
        texts: Vec<String>,
        /// JSONL file of {"text": ...} objects, one request per line.
        #[arg(long)]
        input: Option<PathBuf>,
        /// Query prefix.
        #[arg(long)]
        query: bool,
    },
    /// Compress a context file for a task.
    Compress {
        /// The task.
        #[arg(long)]
        task: String,
        /// Context JSON file.
        #[arg(long)]
        context: PathBuf,
        /// Budget in tokens.
        #[arg(long)]
        budget: u32,
        /// Open (or, with --token, continue) a session under this id.
        #[arg(long, default_value = "")]
        session: String,
        /// The session's secret, printed when it was opened.
        #[arg(long, env = "SCD_SESSION_TOKEN", default_value = "")]
        token: String,
        /// Also write the selection as a hand-off report in this format ("report").
        #[arg(long, value_enum)]
        render: Option<crate::cli::handoff::ReportFormat>,
        /// The receiving LLM's tokenizer the budget is counted in: `o200k`,
        /// `cl100k`, `e5` (default) or a name the server registered (never a path).
        #[arg(long, env = "SCD_BUDGET_TOKENIZER", default_value = "")]
        budget_tokenizer: String,
        /// Say why each chunk was sent or dropped ("explanation").
        #[arg(long)]
        explain: bool,
        /// Output: json (one object) or text (the chunks, totals and, with
        /// --explain, the table).
        #[arg(long, value_enum, default_value = "json")]
        format: crate::cli::compress::Format,
    },
    /// Adaptive request on a session.
    More {
        /// Session id.
        #[arg(long)]
        session: String,
        /// The session's secret, printed by the compress that opened it.
        #[arg(long, env = "SCD_SESSION_TOKEN")]
        token: String,
        /// The question (default with --report: the report's next step).
        #[arg(long, required_unless_present = "report", default_value = "")]
        question: String,
        /// Current confidence (default 0.5; with --report: the report's).
        #[arg(long, conflicts_with = "report")]
        confidence: Option<f32>,
        /// The receiver's own hand-off report (any format): its confidence
        /// sets the current confidence through the server's confidence map.
        #[arg(long)]
        report: Option<PathBuf>,
    },
}

/// Arguments of `scd client`.
#[derive(Debug, clap::Args)]
pub struct ClientArgs {
    /// Server address.
    #[arg(long, env = "SCD_CLIENT_ADDR", default_value = "http://127.0.0.1:50051")]
    addr: String,
    /// CA certificate (PEM) that signed the server's certificate; needs an https:// --addr.
    #[arg(long, env = "SCD_CLIENT_CA_CERT")]
    ca_cert: Option<PathBuf>,
    /// Client certificate (PEM) for mTLS; with --client-key.
    #[arg(long, env = "SCD_CLIENT_CERT")]
    client_cert: Option<PathBuf>,
    /// Client private key (PEM) for mTLS; with --client-cert.
    #[arg(long, env = "SCD_CLIENT_KEY")]
    client_key: Option<PathBuf>,
    /// Name the server's certificate must carry (default: the host of --addr).
    #[arg(long, env = "SCD_TLS_DOMAIN")]
    tls_domain: Option<String>,
    /// Retries per call on UNAVAILABLE, broken connections and RESOURCE_EXHAUSTED
    /// (backoff 100 ms doubling, capped at 2 s, with jitter).
    #[arg(long, env = "SCD_CLIENT_RETRIES", default_value_t = 5)]
    retries: u32,
    #[command(flatten)]
    sign: IdentityArgs,
    #[command(subcommand)]
    command: ClientCommand,
}

/// Who signs the calls, for `--auth did-wba` servers (`scd client`, `scd audit`).
#[derive(Debug, clap::Args)]
pub struct IdentityArgs {
    /// Sign every call (`--auth did-wba` servers) with this identity file's
    /// key (see `scd identity new`); a fresh nonce per call and per retry.
    #[arg(long, env = "SCD_CLIENT_IDENTITY")]
    identity: Option<PathBuf>,
    /// Sign as this did:wba instead of the identity file's DID (its document
    /// must be in the server's --did-dir).
    #[arg(long, env = "SCD_CLIENT_DID", requires = "identity")]
    did: Option<String>,
    /// The server's name (its --auth-aud), signed into the header.
    #[arg(long, env = "SCD_AUTH_AUD", default_value = "scd")]
    auth_aud: String,
}

impl IdentityArgs {
    /// The signer: signs as the identity, or passes calls through without one.
    pub fn signer(&self) -> anyhow::Result<Signer> {
        let identity = match &self.identity {
            Some(path) => {
                // never create a key here: a mistyped path would sign as a stranger
                anyhow::ensure!(
                    path.is_file(),
                    "--identity {}: no such file (create one with `scd identity new`)",
                    path.display()
                );
                let id = Identity::load_or_create(path).with_context(|| format!("--identity {}", path.display()))?;
                Some(match &self.did {
                    Some(did) => id.with_did(did).with_context(|| format!("--did {did}"))?,
                    None => id,
                })
            }
            None => None,
        };
        Ok(Signer::new(identity, &self.auth_aud))
    }
}

/// The wire kind of an engine field kind.
pub(crate) fn field_kind(k: FieldKind) -> pb::FieldKind {
    match k {
        FieldKind::Prose => pb::FieldKind::Prose,
        FieldKind::Code => pb::FieldKind::Code,
        FieldKind::Log => pb::FieldKind::Log,
        FieldKind::Json => pb::FieldKind::Json,
        FieldKind::Chat => pb::FieldKind::Chat,
        FieldKind::Table => pb::FieldKind::Table,
    }
}

/// The fields of a context file, parsed strictly by the engine's own type
/// (unknown keys and non-boolean `confidential` are errors).
fn read_context(path: &std::path::Path) -> anyhow::Result<Vec<pb::Field>> {
    let raw = std::fs::read_to_string(path).with_context(|| format!("--context {}", path.display()))?;
    let ctx = Context::from_json(&raw).map_err(|e| anyhow::anyhow!("--context {}: {e}", path.display()))?;
    Ok(ctx
        .fields
        .into_iter()
        .map(|f| pb::Field {
            name: f.name,
            kind: field_kind(f.kind) as i32,
            content: f.content,
            confidential: f.confidential,
        })
        .collect())
}

/// A plaintext call that a server broke off at the transport level (an
/// HTTP/2 protocol error, a reset or closed connection, an unexpected EOF —
/// anything but a refused connection or an unknown host): what a TLS-only
/// server does to a plaintext client, whichever way the race goes.
fn looks_like_tls_server(err: &Status) -> bool {
    let mut text = err.message().to_string();
    let mut source = std::error::Error::source(err);
    let transport = source.is_some() || text.contains("h2 protocol error");
    while let Some(e) = source {
        text.push_str(&format!(": {e}"));
        source = e.source();
    }
    let text = text.to_lowercase();
    transport && !["refused", "dns", "failed to lookup"].iter().any(|m| text.contains(m))
}

/// Whether a failed call may be retried, and how long to wait at least.
///
/// UNAVAILABLE (server down, draining, not reachable) and RESOURCE_EXHAUSTED
/// (queue full; wait its `retry-after-ms`) always; a connection that broke
/// under the call (a transport error, reported as UNKNOWN, INTERNAL or
/// CANCELLED with a source) only for `idempotent` calls. A status the server
/// answered (INVALID_ARGUMENT, NOT_FOUND, ...) never.
pub(crate) fn retryable(s: &Status, idempotent: bool) -> Option<Duration> {
    match s.code() {
        Code::Unavailable => Some(Duration::ZERO),
        Code::ResourceExhausted => Some(Duration::from_millis(
            s.metadata().get("retry-after-ms").and_then(|v| v.to_str().ok()?.parse().ok()).unwrap_or(0),
        )),
        Code::Unknown | Code::Internal | Code::Cancelled if idempotent && std::error::Error::source(s).is_some() => {
            Some(Duration::ZERO)
        }
        _ => None,
    }
}

/// Backoff before retry `attempt` (0-based): 100 ms doubling, capped at 2 s,
/// with jitter in its upper half; never below `floor`.
pub(crate) fn backoff(attempt: u32, floor: Duration) -> Duration {
    let base = 100u64.saturating_mul(1 << attempt.min(5)).min(2_000);
    let jittered = Duration::from_millis(rand::random_range(base / 2..=base));
    jittered.max(floor)
}

/// Adds a freshly signed `Authorization: DIDWba …` header to every request
/// when it has an identity; passes requests through otherwise.
#[derive(Clone)]
pub struct Signer {
    identity: Option<Arc<Identity>>,
    aud: String,
}

impl Signer {
    /// Signs as `identity` for the service named `aud`.
    pub fn new(identity: Option<Identity>, aud: &str) -> Signer {
        Signer { identity: identity.map(Arc::new), aud: aud.to_string() }
    }
}

impl tonic::service::Interceptor for Signer {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, Status> {
        if let Some(id) = &self.identity {
            let header = scd_atp::wba_auth::sign_header(id, &self.aud, scd_atp::identity::now_s());
            let value = header.parse().map_err(|_| Status::internal("signed header is not ASCII"))?;
            req.metadata_mut().insert("authorization", value);
        }
        Ok(req)
    }
}

pub(crate) type Client = pb::scd_client::ScdClient<InterceptedService<Channel, Signer>>;

/// A reconnecting client: the channel is built lazily, and rebuilt after a
/// broken connection. Clones share the channel (one per concurrent caller,
/// as `scd mcp --server` does).
#[derive(Clone)]
pub struct Conn {
    endpoint: Endpoint,
    client: Client,
    signer: Signer,
    retries: u32,
}

impl Conn {
    pub(crate) fn new(addr: &str, tls: Option<ClientTlsConfig>, retries: u32, signer: Signer) -> anyhow::Result<Self> {
        let mut endpoint = Endpoint::from_shared(addr.to_string())
            .with_context(|| format!("--addr {addr}: not a URI"))?
            .connect_timeout(Duration::from_secs(5));
        if let Some(tls) = tls {
            endpoint =
                endpoint.tls_config(tls).map_err(|e| anyhow::anyhow!("--addr {addr}: {}", tls::error_chain(&e)))?;
        }
        let client = Self::client(&endpoint, &signer);
        Ok(Self { endpoint, client, signer, retries })
    }

    fn client(endpoint: &Endpoint, signer: &Signer) -> Client {
        pb::scd_client::ScdClient::with_interceptor(endpoint.connect_lazy(), signer.clone())
            .max_decoding_message_size(64 << 20)
    }

    /// Runs `call` with retries (see [`retryable`]).
    async fn call<T, F, Fut>(&mut self, what: &str, idempotent: bool, call: F) -> anyhow::Result<T>
    where
        F: FnMut(Client) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, Status>>,
    {
        self.try_call(what, idempotent, call).await.map_err(|(err, attempt)| {
            let e = status_error(what, &err, attempt);
            let plaintext = self.endpoint.uri().scheme_str() == Some("http");
            if plaintext && looks_like_tls_server(&err) {
                e.context("the server may speak TLS: use an https:// --addr with --ca-cert")
            } else {
                e
            }
        })
    }

    /// Runs `call` with retries (see [`retryable`]); the last status and the
    /// retries made when it fails.
    pub(crate) async fn try_call<T, F, Fut>(
        &mut self,
        what: &str,
        idempotent: bool,
        mut call: F,
    ) -> Result<T, (Status, u32)>
    where
        F: FnMut(Client) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, Status>>,
    {
        let mut attempt = 0;
        loop {
            let err = match call(self.client.clone()).await {
                Ok(r) => return Ok(r.into_inner()),
                Err(s) => s,
            };
            let Some(floor) = retryable(&err, idempotent).filter(|_| attempt < self.retries) else {
                return Err((err, attempt));
            };
            let wait = backoff(attempt, floor);
            warn!(call = what, code = ?err.code(), attempt = attempt + 1, of = self.retries, wait_ms = wait.as_millis() as u64, "retrying: {}", err.message());
            if err.code() != Code::ResourceExhausted {
                // the connection may be gone: start a fresh one
                self.client = Self::client(&self.endpoint, &self.signer);
            }
            tokio::time::sleep(wait).await;
            attempt += 1;
        }
    }
}

fn status_error(what: &str, s: &Status, retries: u32) -> anyhow::Error {
    let detail = std::error::Error::source(s).map(|e| format!(" ({})", tls::error_chain(e))).unwrap_or_default();
    let tries = if retries > 0 { format!(" after {retries} retries") } else { String::new() };
    anyhow::anyhow!("{what}: {:?}: {}{detail}{tries}", s.code(), s.message())
}

fn embedding_json(e: &pb::Embedding) -> serde_json::Value {
    serde_json::json!({"tokens": e.tokens, "windows": e.windows, "embedding": e.values})
}

/// `embed --input`: one request per JSONL line, one JSON line out per request.
async fn embed_file(c: &mut Conn, path: &std::path::Path, kind: i32) -> anyhow::Result<()> {
    let file = std::fs::File::open(path).with_context(|| format!("--input {}", path.display()))?;
    let mut out = std::io::stdout().lock();
    let mut count = 0usize;
    for (i, line) in std::io::BufReader::new(file).lines().enumerate() {
        let line = line.with_context(|| format!("--input {}: line {}", path.display(), i + 1))?;
        if line.trim().is_empty() {
            continue;
        }
        let (text, _) = super::jsonl_text(i + 1, &line)?;
        let r = c
            .call(&format!("--input line {}", i + 1), true, |mut cl| {
                let texts = vec![text.clone()];
                async move { cl.embed(pb::EmbedRequest { texts, kind, windows: true }).await }
            })
            .await?;
        let e = r.embeddings.first().context("server answered no embedding")?;
        let mut v = embedding_json(e);
        v["line"] = (i + 1).into();
        writeln!(out, "{v}")?;
        out.flush()?;
        count += 1;
    }
    writeln!(out, "{}", serde_json::json!({ "count": count }))?;
    Ok(())
}

/// Runs `scd client ...`; prints one JSON object (or JSON lines for `embed --input`).
pub fn run(args: ClientArgs) -> anyhow::Result<()> {
    let tls = tls::client_config(
        &args.addr,
        &tls::ClientTlsFiles {
            ca_cert: args.ca_cert.clone(),
            client_cert: args.client_cert.clone(),
            client_key: args.client_key.clone(),
            domain: args.tls_domain.clone(),
        },
    )?;
    let signer = args.sign.signer()?;
    let fields = match &args.command {
        ClientCommand::Compress { context, .. } => read_context(context)?,
        _ => Vec::new(),
    };
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    rt.block_on(async move {
        let mut c = Conn::new(&args.addr, tls, args.retries, signer)?;
        let out = match args.command {
            ClientCommand::Info => {
                let r = c.call("Info", true, |mut cl| async move { cl.info(pb::InfoRequest {}).await }).await?;
                serde_json::json!({"model": r.model, "dim": r.dim, "max_tokens": r.max_tokens, "provider": r.provider, "version": r.version})
            }
            ClientCommand::Embed { input: Some(path), query, .. } => {
                let kind = if query { pb::InputKind::Query } else { pb::InputKind::Passage } as i32;
                return embed_file(&mut c, &path, kind).await;
            }
            ClientCommand::Embed { texts, query, input: None } => {
                let kind = if query { pb::InputKind::Query } else { pb::InputKind::Passage } as i32;
                let r = c
                    .call("Embed", true, |mut cl| {
                        let texts = texts.clone();
                        async move { cl.embed(pb::EmbedRequest { texts, kind, windows: true }).await }
                    })
                    .await?;
                serde_json::json!({"model": r.model, "embeddings": r.embeddings.iter().map(|e| serde_json::json!({"tokens": e.tokens, "embedding": e.values})).collect::<Vec<_>>()})
            }
            ClientCommand::Compress {
                task, budget, session, token, render, budget_tokenizer, explain, format, ..
            } => {
                // a retry after the server opened the session would find it
                // taken: only session-less or continuing calls are idempotent
                let idempotent = session.is_empty() || !token.is_empty();
                let req = pb::CompressRequest {
                    task: Some(pb::Task { description: task, ..Default::default() }),
                    fields,
                    requirement: Some(pb::ContextRequirement { max_context_tokens: budget, ..Default::default() }),
                    session_id: session,
                    session_token: token,
                    render: render.map_or(pb::ReportFormat::Unspecified, |f| {
                        crate::grpc::handoff::format_pb(f.into())
                    }) as i32,
                    budget_tokenizer,
                    explain,
                };
                let r = c
                    .call("Compress", idempotent, |mut cl| {
                        let req = req.clone();
                        async move { cl.compress(req).await }
                    })
                    .await?;
                let t = r.totals.clone().unwrap_or_default();
                let explanation = r.explanation.clone().map(crate::grpc::convert::explanation_from_wire);
                if format == crate::cli::compress::Format::Text {
                    let mut w = std::io::stdout().lock();
                    for ch in &r.chunks {
                        writeln!(w, "[{}] {}", ch.id, ch.text)?;
                    }
                    writeln!(
                        w,
                        "-- {} of {} tokens sent in {}: {:.1}x asked, {:.1}x achieved; {} chunks dropped",
                        t.sent_tokens, t.context_tokens, t.tokenizer, t.requested_ratio, t.reduction_ratio, r.dropped.len()
                    )?;
                    if let Some(ex) = &explanation {
                        crate::cli::compress::explain_table(ex, &t.tokenizer, 20, &mut w)?;
                    }
                    return Ok(());
                }
                let mut out = serde_json::json!({"chunks": r.chunks.iter().map(|c| serde_json::json!({"field": c.field, "id": c.id, "text": c.text, "score": c.score, "tokens": c.tokens})).collect::<Vec<_>>(),
                    "totals": {"context_tokens": t.context_tokens, "sent_tokens": t.sent_tokens, "reduction_ratio": t.reduction_ratio, "r_theorem1": t.r_theorem1, "tokenizer": t.tokenizer, "requested_ratio": t.requested_ratio},
                    "dropped": r.dropped.iter().map(|d| serde_json::json!({"field": d.field, "id": d.id, "stub": d.stub, "tokens": d.tokens})).collect::<Vec<_>>(),
                    "withheld_fields": r.withheld_fields, "session_id": r.session_id, "session_token": r.session_token,
                    "report": (!r.report.is_empty()).then_some(r.report)});
                if let Some(ex) = explanation {
                    out["explanation"] = serde_json::to_value(ex)?;
                }
                out
            }
            ClientCommand::More { session, token, question, confidence, report } => {
                let report = match &report {
                    Some(p) => std::fs::read_to_string(p).with_context(|| format!("--report {}", p.display()))?,
                    None => String::new(),
                };
                let req = pb::ContextRequest {
                    session_id: session,
                    session_token: token,
                    specific_question: question,
                    current_confidence: confidence.unwrap_or(if report.is_empty() { 0.5 } else { 0.0 }),
                    report,
                    ..Default::default()
                };
                // advances the session: not retried when the connection broke under it
                let r = c
                    .call("RequestContext", false, |mut cl| {
                        let req = req.clone();
                        async move { cl.request_context(req).await }
                    })
                    .await?;
                serde_json::json!({"chunks": r.chunks.iter().map(|c| serde_json::json!({"id": c.id, "text": c.text, "tokens": c.tokens})).collect::<Vec<_>>(), "remaining_tokens": r.remaining_tokens, "reason": r.reason})
            }
        };
        println!("{out}");
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tls_hint_is_for_broken_off_calls_only() {
        assert!(looks_like_tls_server(&Status::unavailable("h2 protocol error: http2 error")));
        let io = std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "connection closed before message completed");
        let mut closed = Status::unavailable("transport error");
        closed.set_source(std::sync::Arc::new(io));
        assert!(looks_like_tls_server(&closed));
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "Connection refused (os error 111)");
        let mut refused = Status::unavailable("tcp connect error");
        refused.set_source(std::sync::Arc::new(io));
        assert!(!looks_like_tls_server(&refused));
        assert!(!looks_like_tls_server(&Status::invalid_argument("texts: must hold at least one text")));
    }

    #[test]
    fn only_transient_failures_are_retried() {
        assert_eq!(retryable(&Status::unavailable("down"), false), Some(Duration::ZERO));
        let mut busy = Status::resource_exhausted("queue full");
        busy.metadata_mut().insert("retry-after-ms", "250".parse().unwrap());
        assert_eq!(retryable(&busy, false), Some(Duration::from_millis(250)));
        for code in [Code::InvalidArgument, Code::NotFound, Code::PermissionDenied, Code::Unauthenticated] {
            assert_eq!(retryable(&Status::new(code, "no"), true), None, "{code:?}");
        }
        // an UNKNOWN the server answered (no transport source) is not retried
        assert_eq!(retryable(&Status::unknown("handler said so"), true), None);
        let broken = Status::from_error(Box::new(std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset")));
        assert_eq!(broken.code(), Code::Unknown);
        assert_eq!(retryable(&broken, true), Some(Duration::ZERO));
        assert_eq!(retryable(&broken, false), None);
    }

    #[test]
    fn backoff_doubles_with_jitter_and_caps_at_two_seconds() {
        for _ in 0..100 {
            let b0 = backoff(0, Duration::ZERO).as_millis();
            assert!((50..=100).contains(&b0), "{b0}");
            let b3 = backoff(3, Duration::ZERO).as_millis();
            assert!((400..=800).contains(&b3), "{b3}");
            let b9 = backoff(9, Duration::ZERO).as_millis();
            assert!((1000..=2000).contains(&b9), "{b9}");
        }
        assert_eq!(backoff(0, Duration::from_millis(700)), Duration::from_millis(700));
    }
}
