//! `scd serve`: the gRPC service.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use scd_engine::budget::TokenizerRegistry;
use scd_engine::chunk::ChunkConfig;
use scd_engine::context::ContextLimits;
use scd_engine::extract::{
    PrepareConfig, RequestLimits, Scd, ScdConfig, ScoringConfig, SessionConfig, MAX_CODE_CONTEXT_LINES,
};

use anyhow::Context as _;
use scd_audit::{AuditLevel, AuditLog};
use scd_did::wba::{list_documents, WbaAuthenticator};

use crate::app::audit::AuditAccess;
use crate::app::Limits;
use crate::auth::{AuthConfig, DidRateLimiter};
use crate::config::ModelArgs;
use crate::server::{serve, ServeConfig};
use crate::tls;

/// Arguments of `scd serve`.
#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// A TOML file of settings: any flag of `scd serve` (and the global
    /// model flags) by its long name, e.g. `http-addr = "127.0.0.1:9090"`;
    /// a flag on the command line or its SCD_* variable wins; an unknown
    /// key is an error.
    #[arg(long, env = "SCD_CONFIG")]
    config: Option<PathBuf>,
    /// gRPC address (port 0 picks a free port; the chosen one is printed).
    #[arg(long, env = "SCD_ADDR", default_value = "127.0.0.1:50051")]
    addr: SocketAddr,
    /// HTTP listener: the REST API (/v1/compress, /v1/embeddings,
    /// /openapi.json) and a page over it (/ui), the A2A agent (/.well-known/agent-card.json) and
    /// Prometheus metrics (/metrics); over TLS with --tls-cert (mTLS with
    /// --client-ca), as gRPC. Unset: no HTTP listener.
    #[arg(long, env = "SCD_HTTP_ADDR")]
    http_addr: Option<SocketAddr>,
    /// Do not serve the page at /ui on --http-addr (a page that shows what a
    /// selection kept and why, through the REST API). SCD_NO_UI=1 (or true)
    /// turns it off too.
    #[arg(long, env = "SCD_NO_UI", value_parser = clap::builder::FalseyValueParser::new())]
    no_ui: bool,
    /// Embed requests that may wait for the encoder; more are RESOURCE_EXHAUSTED.
    #[arg(long, env = "SCD_QUEUE_SIZE", default_value_t = 256)]
    queue_size: usize,
    /// Texts (rows) merged into one encoder call at most.
    #[arg(long, env = "SCD_BATCH_TEXTS", default_value_t = 64)]
    batch_texts: usize,
    /// Tokens merged into one encoder call at most (each text's tokens plus 2
    /// specials); a single request over it runs alone.
    #[arg(long, env = "SCD_MAX_BATCH_TOKENS", default_value_t = 8192)]
    max_batch_tokens: usize,
    /// Caps and idle timeouts of the gRPC listener.
    #[command(flatten)]
    grpc_conn: crate::config::GrpcConnArgs,
    /// Caps and time limits of the HTTP listener.
    #[command(flatten)]
    http_conn: crate::config::HttpConnArgs,
    /// Compress / RequestContext calls in flight at once; more are RESOURCE_EXHAUSTED.
    #[arg(long, env = "SCD_MAX_CONCURRENT_COMPRESS", default_value_t = 8)]
    max_concurrent_compress: usize,
    /// Texts per Embed request.
    #[arg(long, env = "SCD_MAX_TEXTS", default_value_t = 256)]
    max_texts: usize,
    /// Fields per Compress request.
    #[arg(long, env = "SCD_MAX_FIELDS", default_value_t = 256)]
    max_fields: usize,
    /// Largest request message in bytes.
    #[arg(long, env = "SCD_MAX_REQUEST_BYTES", default_value_t = 16 << 20)]
    max_request_bytes: usize,
    /// Embedding cache bound in bytes.
    #[arg(long, env = "SCD_CACHE_BYTES", default_value_t = 256 << 20)]
    cache_bytes: usize,
    /// Session lifetime after last use, seconds.
    #[arg(long, env = "SCD_SESSION_TTL_S", default_value_t = 1800)]
    session_ttl_s: u64,
    /// Weight of the second hop (0 turns it off): the task is embedded a
    /// second time with its best chunk, which lifts a multi-hop question's
    /// bridge facts at the cost of one more task embedding per new task
    /// (BENCHMARKS.md has both sides).
    #[arg(long, env = "SCD_SECOND_HOP_WEIGHT", default_value_t = ScdConfig::default().scoring.second_hop_weight)]
    second_hop_weight: f32,
    /// A paragraph of at most this many tokens (and, in a Compress, at most
    /// `--group-closure-share` of the budget) is sent whole once one of its
    /// sentences is, when it fits (0: only its lead comes along with a
    /// chosen sentence).
    #[arg(long, env = "SCD_GROUP_CLOSURE_TOKENS", default_value_t = ScdConfig::default().scoring.group_closure_tokens)]
    group_closure_tokens: usize,
    /// In a Compress, the rest of a paragraph comes along only when the
    /// whole paragraph costs at most this share of the budget, 0 to 1 (1:
    /// only `--group-closure-tokens` limits it; a RequestContext follow-up
    /// has no share).
    #[arg(long, env = "SCD_GROUP_CLOSURE_SHARE", default_value_t = ScdConfig::default().scoring.group_closure_share)]
    group_closure_share: f32,
    /// A markdown section of at most this many tokens is sent whole once
    /// one of its chunks is (0: only its heading comes along).
    #[arg(long, env = "SCD_SECTION_CLOSURE_TOKENS", default_value_t = ScdConfig::default().scoring.section_closure_tokens)]
    section_closure_tokens: usize,
    /// A long function (cut into its signature and body pieces) of at most
    /// this many tokens is sent whole once one of its pieces is (0: only its
    /// signature and closing line come along).
    #[arg(long, env = "SCD_FUNCTION_CLOSURE_TOKENS", default_value_t = ScdConfig::default().scoring.function_closure_tokens)]
    function_closure_tokens: usize,
    /// A cut function of at most this share of the budget, 0 to 4, is sent
    /// whole or not at all; a longer one may be trimmed to its signature and
    /// best pieces (0: any cut function may be trimmed; above 1, one between
    /// the budget and that share of it is never sent).
    #[arg(long, env = "SCD_FUNCTION_WHOLE_SHARE", default_value_t = ScdConfig::default().scoring.function_whole_share)]
    function_whole_share: f32,
    /// A code piece carries up to this many lines that are not blank from
    /// before it and after it, as a diff hunk does (0 to 8; 0: none).
    #[arg(long, env = "SCD_CODE_CONTEXT_LINES", default_value_t = ScdConfig::default().scoring.code_context_lines)]
    code_context_lines: usize,
    /// Log chunks are packed at their score less this times the natural
    /// log of their cost over 64 tokens (0: by score, as other kinds).
    #[arg(long, env = "SCD_LOG_SIZE_WEIGHT", default_value_t = ScdConfig::default().scoring.log_size_weight)]
    log_size_weight: f32,
    /// A log or chat chunk that follows a higher-scored chunk of its kind in
    /// its field is packed at its score plus this share of the difference,
    /// 0 to 1 (0: by score); a chat answer keeps its own score.
    #[arg(long, env = "SCD_FOLLOW_WEIGHT", default_value_t = ScdConfig::default().scoring.follow_weight)]
    follow_weight: f32,
    /// A code chunk nearly the same as a sent one (cosine over
    /// `redundancy_cosine`) but not the same text is packed at its score
    /// less this, 0 to 10 (0: at its score); it still comes when there is room.
    #[arg(long, env = "SCD_NEAR_DUPLICATE_PENALTY", default_value_t = ScdConfig::default().scoring.near_duplicate_penalty)]
    near_duplicate_penalty: f32,
    /// Cut a function longer than this many bytes into its signature and
    /// body pieces, so it can be sent trimmed (0: functions stay whole).
    #[arg(long, env = "SCD_LONG_FUNCTION_BYTES", default_value_t = ScdConfig::default().prepare.chunk.long_function_bytes)]
    long_function_bytes: usize,
    /// The second stage (a cross-encoder over the best chunks).
    #[command(flatten)]
    rerank: crate::config::RerankArgs,
    /// Sessions held at once.
    #[arg(long, env = "SCD_MAX_SESSIONS", default_value_t = 10_000)]
    max_sessions: usize,
    /// Bytes all sessions may hold together (each counts the whole prepared
    /// context it refers to); past it the least recently used are evicted,
    /// and their owners are told so.
    #[arg(long, env = "SCD_SESSION_BYTES", default_value_t = 1 << 30)]
    session_bytes: usize,
    /// Keep sessions (their ledgers, and the contexts they were opened on,
    /// with their embeddings) and A2A tasks and contexts in Redis,
    /// `redis://HOST:PORT/DB`, so that every replica started with the same
    /// URL serves every session and task, and a restart loses none. The
    /// bounds above (and the --a2a-* ones) hold there too. Without it, they
    /// live in this process's memory.
    #[arg(long, env = "SCD_STATE", value_name = "URL")]
    state: Option<String>,
    /// Tokens of one Compress request's non-confidential context.
    #[arg(long, env = "SCD_MAX_CONTEXT_TOKENS", default_value_t = 262_144)]
    max_context_tokens: usize,
    /// Encoder tokens one request may spend: a Compress embedding its
    /// context's uncached chunks (labels and prose neighbours included, so
    /// up to about twice its tokens), an Embed its texts. The bound on one
    /// request's CPU; over it the request is refused before the encoder runs.
    #[arg(long, env = "SCD_MAX_REQUEST_ENCODER_TOKENS", default_value_t = 262_144)]
    max_request_encoder_tokens: usize,
    /// Bytes of one field's content.
    #[arg(long, env = "SCD_MAX_FIELD_BYTES", default_value_t = 4 << 20)]
    max_field_bytes: usize,
    /// Bytes of one Embed / CountTokens text.
    #[arg(long, env = "SCD_MAX_TEXT_BYTES", default_value_t = 1 << 20)]
    max_text_bytes: usize,
    /// TLS certificate chain (PEM); with --tls-key the server speaks TLS only.
    #[arg(long, env = "SCD_TLS_CERT")]
    tls_cert: Option<PathBuf>,
    /// TLS private key (PEM: PKCS#8, PKCS#1 or SEC1) of --tls-cert.
    #[arg(long, env = "SCD_TLS_KEY")]
    tls_key: Option<PathBuf>,
    /// mTLS: clients must present a certificate signed by this CA (PEM).
    #[arg(long, env = "SCD_CLIENT_CA")]
    client_ca: Option<PathBuf>,
    /// After SIGTERM / Ctrl-C, seconds to let calls in flight finish before exiting anyway.
    #[arg(long, env = "SCD_DRAIN_TIMEOUT_S", default_value_t = 30.0)]
    drain_timeout: f64,
    /// The current_confidence of a hand-off report's confidence level, for
    /// RequestContext with a report (shown by Info).
    #[command(flatten)]
    confidence: crate::cli::handoff::ConfidenceArgs,
    /// Caller authentication on gRPC and HTTP: none, or did-wba (every call
    /// carries `Authorization: DIDWba …` signed by a DID whose document is in
    /// --did-dir; health, reflection and the DID documents stay open).
    #[arg(long, env = "SCD_AUTH", value_enum, default_value = "none")]
    auth: AuthMode,
    /// The allowlist for --auth did-wba: did:wba documents at
    /// <dir>/<host>/[<path>/]did.json (never fetched over the network).
    #[arg(long, env = "SCD_DID_DIR")]
    did_dir: Option<PathBuf>,
    /// This service's own name, signed into every DIDWba header (a header
    /// made for another service is refused).
    #[arg(long, env = "SCD_AUTH_AUD", default_value = "scd")]
    auth_aud: String,
    /// Requests per second each DID may make (token bucket refill rate; at
    /// least 0.001).
    #[arg(long, env = "SCD_AUTH_RATE", default_value_t = 50.0)]
    auth_rate: f64,
    /// Requests each DID may make at once after being idle (bucket size).
    #[arg(long, env = "SCD_AUTH_BURST", default_value_t = 100)]
    auth_burst: u32,
    /// A2A tasks held at once (and contexts); past it SendMessage answers
    /// a resource-exhausted error until tasks expire.
    #[arg(long, env = "SCD_A2A_MAX_TASKS", default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..))]
    a2a_max_tasks: u64,
    /// Bytes all A2A tasks and contexts may hold together (the heap they
    /// hold: messages and artifacts are kept as compact JSON; a compress
    /// message's context is kept in history as a summary of field names,
    /// kinds and sizes); past it SendMessage answers a resource-exhausted
    /// error until tasks expire.
    #[arg(long, env = "SCD_A2A_MAX_BYTES", default_value_t = 256 << 20, value_parser = clap::value_parser!(u64).range(1..))]
    a2a_max_bytes: u64,
    /// A2A tasks (and contexts) one caller (its DID under --auth did-wba,
    /// else its IP address) may hold; at it, the caller's oldest finished
    /// task gives way, and with none finished SendMessage answers a
    /// resource-exhausted error until one expires. Default: a tenth of
    /// --a2a-max-tasks.
    #[arg(long, env = "SCD_A2A_MAX_TASKS_PER_CALLER", value_parser = clap::value_parser!(u64).range(1..))]
    a2a_max_tasks_per_caller: Option<u64>,
    /// Bytes one caller's A2A tasks may hold (as --a2a-max-tasks-per-caller).
    /// Default: a tenth of --a2a-max-bytes.
    #[arg(long, env = "SCD_A2A_MAX_BYTES_PER_CALLER", value_parser = clap::value_parser!(u64).range(1..))]
    a2a_max_bytes_per_caller: Option<u64>,
    /// Seconds an A2A task (and its context's session binding) is kept after its last update.
    #[arg(long, env = "SCD_A2A_TASK_TTL_S", default_value_t = 3600, value_parser = clap::value_parser!(u64).range(1..))]
    a2a_task_ttl_s: u64,
    /// The URL A2A clients reach --http-addr at (behind a proxy, or a
    /// name instead of an address), written into the agent card; unset:
    /// http:// and the listener's own address, `localhost` for a loopback
    /// one or 0.0.0.0 (never a request's Host header). Set it when the
    /// listener is on every interface.
    #[arg(long, env = "SCD_A2A_PUBLIC_URL")]
    a2a_public_url: Option<String>,
    /// Register a HuggingFace tokenizer.json as a budget tokenizer requests
    /// may name: NAME=PATH (repeatable; NAME of letters, digits, '.', '_',
    /// '-'). o200k, cl100k and e5 are built in; requests never name a path.
    #[arg(long = "budget-tokenizer", value_name = "NAME=PATH")]
    budget_tokenizers: Vec<String>,
    /// The audit trail: its database, what a record holds, retention.
    #[command(flatten)]
    audit: AuditTrailArgs,
    /// A file holding the operator's secret token (at least 16 bytes, mode
    /// 0600): a call presenting it as `x-scd-audit-token` reads every audit
    /// record. Without a token a verified caller (client certificate, DID)
    /// reads only its own records and an anonymous caller none.
    #[arg(long, env = "SCD_AUDIT_TOKEN_FILE")]
    audit_token_file: Option<PathBuf>,
}

/// The audit trail's flags, shared by `scd serve` and `scd mcp` (its tools
/// in process): where the records go, what they hold, how long they stay.
/// `scd mcp` reads them from its own variables, `SCD_MCP_AUDIT_*`
/// ([`crate::cli::mcp`]).
#[derive(Debug, clap::Args)]
pub struct AuditTrailArgs {
    /// Audit trail database (redb): Compress, OpenSession and RequestContext
    /// calls are recorded before they answer; unset records nothing.
    #[arg(long, env = "SCD_AUDIT_DB")]
    pub(crate) audit_db: Option<PathBuf>,
    /// What a record holds: off, summary (no chunk list) or chunks.
    #[arg(long, env = "SCD_AUDIT_LEVEL", default_value = "summary")]
    audit_level: AuditLevel,
    /// Records older than this are removed (e.g. 7d, 12h, 30m); unset keeps them.
    #[arg(long, env = "SCD_AUDIT_MAX_AGE", value_parser = super::parse_duration)]
    pub(crate) audit_max_age: Option<Duration>,
    /// The oldest records are removed while the records' summed JSON size is
    /// over this many bytes (default 1 GiB, so failing calls cannot fill the
    /// disk); `none` keeps every record.
    #[arg(long, env = "SCD_AUDIT_MAX_BYTES", value_parser = super::parse_audit_max_bytes)]
    pub(crate) audit_max_bytes: Option<super::AuditMaxBytes>,
}

impl AuditTrailArgs {
    /// Checks the flags without opening the database: retention needs
    /// `--audit-db`, and `--audit-max-bytes` is at least 1.
    pub(crate) fn check(&self) -> anyhow::Result<()> {
        if self.audit_db.is_none() {
            for (flag, set) in [
                ("--audit-max-age", self.audit_max_age.is_some()),
                ("--audit-max-bytes", self.audit_max_bytes.is_some()),
            ] {
                anyhow::ensure!(!set, "{flag}: needs --audit-db");
            }
        }
        self.retention().map(drop)
    }

    /// The retention of `--audit-max-age` and `--audit-max-bytes`.
    fn retention(&self) -> anyhow::Result<scd_audit::Retention> {
        super::audit_retention(self.audit_max_age, self.audit_max_bytes)
    }

    /// The audit log of `--audit-db` (created when missing), `None` without it.
    pub(crate) fn open(&self) -> anyhow::Result<Option<Arc<AuditLog>>> {
        let retention = self.retention()?;
        let Some(path) = &self.audit_db else { return Ok(None) };
        let log = AuditLog::open(path, self.audit_level, retention).map_err(|e| anyhow::anyhow!("--audit-db {e}"))?;
        Ok(Some(Arc::new(log)))
    }
}

/// `--auth`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum AuthMode {
    /// Everyone is admitted (mTLS, when configured, still binds sessions).
    None,
    /// ANP DIDWba headers, checked against --did-dir.
    DidWba,
}

/// The checked auth configuration: with did-wba, --did-dir must be a
/// directory holding at least one did.json.
fn auth_config(args: &ServeArgs) -> anyhow::Result<Option<AuthConfig>> {
    if args.auth == AuthMode::None {
        anyhow::ensure!(args.did_dir.is_none(), "--did-dir: only used with --auth did-wba");
        return Ok(None);
    }
    let dir = args.did_dir.as_ref().context("--auth did-wba needs --did-dir DIR (the DID documents it accepts)")?;
    anyhow::ensure!(dir.is_dir(), "--did-dir {}: not a directory", dir.display());
    let docs = list_documents(dir).with_context(|| format!("--did-dir {}", dir.display()))?;
    anyhow::ensure!(
        !docs.is_empty(),
        "--did-dir {}: no DID documents (<host>/[<path>/]did.json) in it; create one with `scd identity new`",
        dir.display()
    );
    let aud = &args.auth_aud;
    anyhow::ensure!(
        !aud.is_empty() && aud.len() <= 256 && aud.bytes().all(|b| b.is_ascii_graphic() && b != b'"' && b != b'\\'),
        "--auth-aud {aud:?}: must be 1 to 256 printable ASCII characters without spaces, quotes or backslashes"
    );
    anyhow::ensure!(
        args.auth_rate.is_finite() && args.auth_rate >= DidRateLimiter::MIN_RATE_PER_S,
        "--auth-rate {}: must be at least {} requests per second",
        args.auth_rate,
        DidRateLimiter::MIN_RATE_PER_S
    );
    anyhow::ensure!(args.auth_burst >= 1, "--auth-burst 0: must be at least 1");
    tracing::info!(dir = %dir.display(), documents = docs.len(), aud = %aud, "DID-authenticated callers (did-wba)");
    Ok(Some(AuthConfig {
        authenticator: WbaAuthenticator::new(dir, aud),
        rate_per_s: args.auth_rate,
        burst: args.auth_burst,
    }))
}

/// A weight flag's value: finite, from 0 to `max`.
fn weight_within(flag: &str, v: f32, max: f32) -> anyhow::Result<()> {
    anyhow::ensure!(v.is_finite() && (0.0..=max).contains(&v), "{flag} {v}: must be between 0 and {max}");
    Ok(())
}

/// Checks every argument that can be checked without the model.
fn check(args: &ServeArgs) -> anyhow::Result<()> {
    for (flag, v) in [
        ("--queue-size", args.queue_size),
        ("--batch-texts", args.batch_texts),
        ("--max-concurrent-compress", args.max_concurrent_compress),
        ("--max-texts", args.max_texts),
        ("--max-fields", args.max_fields),
        ("--max-request-bytes", args.max_request_bytes),
        ("--max-sessions", args.max_sessions),
        ("--max-batch-tokens", args.max_batch_tokens),
        ("--session-bytes", args.session_bytes),
        ("--max-context-tokens", args.max_context_tokens),
        ("--max-request-encoder-tokens", args.max_request_encoder_tokens),
        ("--max-field-bytes", args.max_field_bytes),
        ("--max-text-bytes", args.max_text_bytes),
    ] {
        anyhow::ensure!(v > 0, "{flag} {v}: must be at least 1");
    }
    args.http_conn.limits()?;
    anyhow::ensure!(
        args.drain_timeout.is_finite() && (0.0..=86_400.0).contains(&args.drain_timeout),
        "--drain-timeout {}: must be between 0 and 86400 seconds",
        args.drain_timeout
    );
    weight_within("--second-hop-weight", args.second_hop_weight, 10.0)?;
    weight_within("--log-size-weight", args.log_size_weight, 10.0)?;
    weight_within("--follow-weight", args.follow_weight, 1.0)?;
    weight_within("--near-duplicate-penalty", args.near_duplicate_penalty, 10.0)?;
    weight_within("--function-whole-share", args.function_whole_share, 4.0)?;
    weight_within("--group-closure-share", args.group_closure_share, 1.0)?;
    anyhow::ensure!(
        args.code_context_lines <= MAX_CODE_CONTEXT_LINES,
        "--code-context-lines {}: must be at most {MAX_CODE_CONTEXT_LINES}",
        args.code_context_lines
    );
    args.rerank.check()?;
    args.audit.check()?;
    anyhow::ensure!(
        args.audit.audit_db.is_some() || args.audit_token_file.is_none(),
        "--audit-token-file: needs --audit-db"
    );
    if let Some(u) = &args.a2a_public_url {
        anyhow::ensure!(
            (u.starts_with("http://") || u.starts_with("https://")) && u.len() > "https://".len(),
            "--a2a-public-url {u}: must be an http:// or https:// URL"
        );
    }
    if let Some(http) = args.http_addr {
        anyhow::ensure!(
            http.port() == 0 || http != args.addr,
            "--http-addr {http}: same address as --addr; give the metrics their own port"
        );
    }
    Ok(())
}

/// Binds `addr` for `flag` (`--addr`, `--http-addr`) serving `what`
/// (`gRPC`, `HTTP metrics`): a port in use is named as such.
fn bind(flag: &str, what: &str, addr: SocketAddr) -> anyhow::Result<std::net::TcpListener> {
    std::net::TcpListener::bind(addr).map_err(|e| match e.kind() {
        std::io::ErrorKind::AddrInUse => anyhow::anyhow!("{flag} {addr} ({what}) is already in use"),
        _ => anyhow::anyhow!("{flag} {addr} ({what}): cannot listen: {e}"),
    })
}

fn a2a_limits(args: &ServeArgs) -> crate::a2a::store::StoreLimits {
    use crate::a2a::store::StoreLimits;
    let size = |n: u64| usize::try_from(n).unwrap_or(usize::MAX);
    let (max_tasks, max_bytes) = (size(args.a2a_max_tasks), size(args.a2a_max_bytes));
    StoreLimits {
        max_tasks,
        ttl: Duration::from_secs(args.a2a_task_ttl_s),
        max_bytes,
        max_tasks_per_caller: args.a2a_max_tasks_per_caller.map_or(StoreLimits::default_share(max_tasks), size),
        max_bytes_per_caller: args.a2a_max_bytes_per_caller.map_or(StoreLimits::default_share(max_bytes), size),
        ..Default::default()
    }
}

/// The registry of `--budget-tokenizer NAME=PATH` flags, each file loaded
/// and checked (before the model loads); errors name the flag.
pub(crate) fn budget_tokenizers(flags: &[String]) -> anyhow::Result<TokenizerRegistry> {
    let mut reg = TokenizerRegistry::new();
    for f in flags {
        let Some((name, path)) = f.split_once('=') else {
            anyhow::bail!("--budget-tokenizer {f}: expected NAME=PATH (a name for requests, a tokenizer.json)");
        };
        reg.register(name, path, "--budget-tokenizer").map_err(|e| anyhow::anyhow!("{e}"))?;
    }
    Ok(reg)
}

/// The engine's settings: `base` (the model's, with its persistent
/// embedding cache) with the cache, scoring, limit and session flags.
fn scd_config(args: &ServeArgs, base: ScdConfig) -> ScdConfig {
    let mut scoring = ScoringConfig {
        second_hop_weight: args.second_hop_weight,
        group_closure_tokens: args.group_closure_tokens,
        group_closure_share: args.group_closure_share,
        section_closure_tokens: args.section_closure_tokens,
        function_closure_tokens: args.function_closure_tokens,
        function_whole_share: args.function_whole_share,
        code_context_lines: args.code_context_lines,
        log_size_weight: args.log_size_weight,
        follow_weight: args.follow_weight,
        near_duplicate_penalty: args.near_duplicate_penalty,
        ..base.scoring
    };
    args.rerank.apply(&mut scoring);
    ScdConfig {
        prepare: PrepareConfig {
            cache_bytes: args.cache_bytes,
            chunk: ChunkConfig { long_function_bytes: args.long_function_bytes, ..base.prepare.chunk },
            ..base.prepare
        },
        scoring,
        limits: RequestLimits {
            max_context_tokens: args.max_context_tokens,
            max_encoder_tokens: args.max_request_encoder_tokens,
            context_limits: ContextLimits {
                max_fields: args.max_fields,
                max_field_bytes: args.max_field_bytes,
                max_context_bytes: args.max_request_bytes,
            },
            ..base.limits
        },
        sessions: SessionConfig {
            session_ttl: Duration::from_secs(args.session_ttl_s),
            max_sessions: args.max_sessions,
            session_bytes: args.session_bytes,
            ..base.sessions
        },
    }
}

/// The service's limits (`--max-texts`, `--queue-size`, …).
fn limits(args: &ServeArgs) -> Limits {
    Limits {
        max_texts: args.max_texts,
        max_text_bytes: args.max_text_bytes,
        max_fields: args.max_fields,
        max_request_bytes: args.max_request_bytes,
        queue_size: args.queue_size,
        batch_texts: args.batch_texts,
        max_batch_tokens: args.max_batch_tokens,
        max_concurrent_compress: args.max_concurrent_compress,
    }
}

/// Runs `scd serve`: checks the arguments and TLS files, binds the
/// listeners, and only then loads the model.
pub fn run(model: &ModelArgs, args: ServeArgs) -> anyhow::Result<()> {
    check(&args)?;
    let confidence_map = args.confidence.map()?;
    let auth = auth_config(&args)?;
    let tls_files = tls::ServerTlsFiles {
        cert: args.tls_cert.clone(),
        key: args.tls_key.clone(),
        client_ca: args.client_ca.clone(),
    };
    let tls = tls::server_config(&tls_files)?;
    let http_tls = if args.http_addr.is_some() { tls::http_server_config(&tls_files)? } else { None };
    let audit = args.audit.open()?;
    let audit_access = match &args.audit_token_file {
        Some(path) => AuditAccess::with_operator_token(&super::read_audit_token(path)?),
        None => AuditAccess::default(),
    };
    let tokenizers = budget_tokenizers(&args.budget_tokenizers)?;
    let connections = args.grpc_conn.limits()?;
    let listener = bind("--addr", "gRPC", args.addr)?;
    let http_listener = args.http_addr.map(|a| bind("--http-addr", "HTTP metrics", a)).transpose()?;
    if let (Some(a), None) = (args.http_addr, &args.a2a_public_url) {
        if a.ip().is_unspecified() {
            tracing::warn!(
                http_addr = %a,
                "the A2A agent card names localhost for a listener on every interface: set --a2a-public-url to the URL remote clients reach"
            );
        }
    }
    let encoder = Arc::new(model.load_encoder()?);
    let cfg = scd_config(&args, model.scd_config());
    let mut scd = Scd::new(encoder, cfg).with_reranker(args.rerank.load_if_weighted(model)?);
    let mut a2a_state = None;
    if let Some(url) = &args.state {
        a2a_state = Some(Arc::new(crate::redis::tasks::RedisTasks::open(url)?));
        let store = crate::redis::sessions::RedisSessions::open(url)?;
        match scd_engine::shared::SharedState::ping(&store) {
            Ok(()) => tracing::info!(store = store.name_str(), "sessions in Redis"),
            Err(e) => tracing::warn!(
                store = store.name_str(),
                error = %e,
                "the session store does not answer yet: session calls fail UNAVAILABLE and health is NOT_SERVING until it does"
            ),
        }
        scd = scd.with_shared_state(Arc::new(store), tokenizers.clone());
    }
    let scd = Arc::new(scd);
    let limits = limits(&args);
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let http = args.http_conn.limits()?;
    let served = rt.block_on(serve(
        scd,
        ServeConfig {
            listener,
            connections,
            http_listener,
            limits,
            http,
            tls,
            http_tls,
            drain_timeout: Duration::from_secs_f64(args.drain_timeout),
            auth,
            audit,
            audit_access,
            a2a: a2a_limits(&args),
            a2a_state,
            a2a_public_url: args.a2a_public_url.clone(),
            tokenizers,
            confidence_map,
            ui: !args.no_ui,
        },
    ));
    // calls cut by the drain timeout may still hold blocking threads: do not wait for them
    rt.shutdown_timeout(Duration::from_millis(200));
    served
}

#[cfg(test)]
mod tests {
    use clap::Parser as _;
    use scd_audit::Retention;

    use super::*;
    use crate::cli::{audit_retention, DEFAULT_AUDIT_MAX_BYTES};

    #[derive(clap::Parser)]
    struct Cmd {
        #[command(flatten)]
        serve: ServeArgs,
    }

    fn retention(args: &[&str]) -> anyhow::Result<Retention> {
        let cmd = Cmd::try_parse_from(std::iter::once("serve").chain(args.iter().copied()))?;
        check(&cmd.serve)?;
        audit_retention(cmd.serve.audit.audit_max_age, cmd.serve.audit.audit_max_bytes)
    }

    #[test]
    fn the_audit_trail_is_bounded_unless_asked_otherwise() {
        let r = retention(&["--audit-db", "a.redb"]).unwrap();
        assert_eq!(r, Retention { max_age: None, max_bytes: Some(DEFAULT_AUDIT_MAX_BYTES) });
        assert_eq!(DEFAULT_AUDIT_MAX_BYTES, 1 << 30);
        let r = retention(&["--audit-db", "a.redb", "--audit-max-bytes", "4096", "--audit-max-age", "7d"]).unwrap();
        assert_eq!(r, Retention { max_age: Some(Duration::from_secs(7 * 86_400)), max_bytes: Some(4096) });
        let r = retention(&["--audit-db", "a.redb", "--audit-max-bytes", "none"]).unwrap();
        assert_eq!(r.max_bytes, None);
        let e = retention(&["--audit-db", "a.redb", "--audit-max-bytes", "0"]).unwrap_err();
        assert_eq!(e.to_string(), "--audit-max-bytes 0: must be at least 1 (none keeps every record)");
        let e = retention(&["--audit-db", "a.redb", "--audit-max-bytes", "lots"]).unwrap_err();
        assert!(e.to_string().contains("\"lots\": expected a number of bytes, or none"), "{e}");
        let e = retention(&["--audit-max-bytes", "none"]).unwrap_err();
        assert_eq!(e.to_string(), "--audit-max-bytes: needs --audit-db");
    }
}
