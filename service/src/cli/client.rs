//! `scd client`: a small gRPC client for scripts and tests.
//!
//! Plaintext (`http://`) or TLS (`https://`, trusting `--ca-cert` or else
//! the system's root certificates, plus `--client-cert`/`--client-key` for
//! mTLS). Every call is retried with
//! exponential backoff and jitter on UNAVAILABLE, broken connections and
//! RESOURCE_EXHAUSTED (waiting at least the server's `retry-after-ms`),
//! never on INVALID_ARGUMENT and the like.
//!
//! With `--identity FILE` (and `--did` for a did:wba) every call, retries
//! included, carries a freshly signed `Authorization: DIDWba …` header (a
//! new nonce and timestamp each time) for a server run with `--auth did-wba`.

use std::io::{BufRead as _, Write as _};
use std::path::PathBuf;

use anyhow::Context as _;
use scd_did::Identity;

use crate::client::{Conn, Signer};
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
    Compress(CompressArgs),
    /// Adaptive request on a session.
    More(MoreArgs),
}

/// The flags of `scd client compress`.
#[derive(Debug, clap::Args)]
pub struct CompressArgs {
    /// The task.
    #[arg(long)]
    task: String,
    /// Context JSON file; `-` reads stdin.
    #[arg(long)]
    context: PathBuf,
    /// Budget in tokens (at least 1); or give --rate.
    #[arg(long, required_unless_present = "rate", value_parser = clap::value_parser!(u32).range(1..))]
    budget: Option<u32>,
    /// Instead of --budget: keep this share of the context's tokens in
    /// --budget-tokenizer, in (0, 1] (LLMLingua's rate; the server counts
    /// them and checks it).
    #[arg(long, conflicts_with = "budget", allow_negative_numbers = true)]
    rate: Option<f64>,
    /// Fields sent whole, first (comma-separated).
    #[arg(long, value_delimiter = ',')]
    required: Vec<String>,
    /// Fields that fill the rest by relevance (comma-separated).
    #[arg(long, value_delimiter = ',')]
    optional: Vec<String>,
    /// Absolute cosine threshold in [-1, 1].
    #[arg(long, allow_negative_numbers = true)]
    threshold: Option<f32>,
    /// Calibrated threshold in standard deviations of the context's scores.
    #[arg(long, allow_negative_numbers = true)]
    min_relative_score: Option<f32>,
    /// When opening a session: tokens of --budget held back for follow-ups
    /// (the session's total is then --budget).
    #[arg(long, default_value_t = 0)]
    reserve: u32,
    /// When opening a session: its total over every reply (0: none).
    #[arg(long, default_value_t = 0)]
    session_total: u32,
    /// List the chunks held back (at most 100) under "dropped.listed".
    #[arg(long)]
    list_dropped: bool,
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
}

/// The flags of `scd client more`.
#[derive(Debug, clap::Args)]
pub struct MoreArgs {
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
    /// This reply's own budget (default: the opening answer's budget,
    /// cut to what the session's total leaves).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    max_tokens: Option<u32>,
    /// Output: json, or text (exactly the new chunks; sizes on stderr).
    #[arg(long, value_enum, default_value = "json")]
    format: crate::cli::compress::Format,
}

/// Arguments of `scd client`.
#[derive(Debug, clap::Args)]
pub struct ClientArgs {
    /// Server address.
    #[arg(long, env = "SCD_CLIENT_ADDR", default_value = "http://127.0.0.1:50051")]
    addr: String,
    /// CA certificate (PEM) that signed the server's certificate; needs an
    /// https:// --addr. Without it https:// trusts the system's root
    /// certificates (or SSL_CERT_FILE).
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

/// A `--render` format on the wire (unset: no report).
fn render_pb(render: Option<crate::cli::handoff::ReportFormat>) -> i32 {
    render.map_or(pb::ReportFormat::Unspecified, |f| crate::grpc::handoff::format_pb(f.into())) as i32
}

/// The fields of a context file, parsed strictly by the engine's own type
/// (unknown keys and non-boolean `confidential` are errors).
pub fn read_context(path: &std::path::Path) -> anyhow::Result<Vec<pb::Field>> {
    let raw = if path.as_os_str() == "-" {
        std::io::read_to_string(std::io::stdin()).context("--context -: reading stdin")?
    } else {
        std::fs::read_to_string(path).with_context(|| format!("--context {}", path.display()))?
    };
    let ctx = crate::cli::context::parse_context(path, &raw)?;
    Ok(ctx.fields.into_iter().map(pb::Field::from).collect())
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
        ClientCommand::Compress(a) => read_context(&a.context)?,
        _ => Vec::new(),
    };
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    rt.block_on(async move {
        let mut c = Conn::new(&args.addr, tls, args.retries, signer)?;
        let kind = |query: bool| if query { pb::InputKind::Query } else { pb::InputKind::Passage } as i32;
        match args.command {
            ClientCommand::Info => info(&mut c).await,
            ClientCommand::Embed { input: Some(path), query, .. } => embed_file(&mut c, &path, kind(query)).await,
            ClientCommand::Embed { texts, query, input: None } => embed(&mut c, texts, kind(query)).await,
            ClientCommand::Compress(a) => compress(&mut c, a, fields).await,
            ClientCommand::More(a) => more(&mut c, a).await,
        }
    })
}

/// `info`: the server's model, as one JSON object.
async fn info(c: &mut Conn) -> anyhow::Result<()> {
    let r = c.call("Info", true, |mut cl| async move { cl.info(pb::InfoRequest {}).await }).await?;
    let out = serde_json::json!({"model": r.model, "dim": r.dim, "max_tokens": r.max_tokens, "provider": r.provider, "version": r.version});
    println!("{out}");
    Ok(())
}

/// `embed TEXT…`: one request, one JSON object.
async fn embed(c: &mut Conn, texts: Vec<String>, kind: i32) -> anyhow::Result<()> {
    let r = c
        .call("Embed", true, |mut cl| {
            let texts = texts.clone();
            async move { cl.embed(pb::EmbedRequest { texts, kind, windows: true }).await }
        })
        .await?;
    let out = serde_json::json!({"model": r.model, "embeddings": r.embeddings.iter().map(|e| serde_json::json!({"tokens": e.tokens, "embedding": e.values})).collect::<Vec<_>>()});
    println!("{out}");
    Ok(())
}

/// `compress`: the request from the flags and the context's `fields`;
/// prints the one output view (with the session's secret, which this
/// client holds), or with `--format text` the text, sizes on stderr.
async fn compress(c: &mut Conn, a: CompressArgs, fields: Vec<pb::Field>) -> anyhow::Result<()> {
    // a retry after the server opened the session would find it
    // taken: only session-less or continuing calls are idempotent
    let idempotent = a.session.is_empty() || !a.token.is_empty();
    let req = pb::CompressRequest {
        task: Some(pb::Task { description: a.task, ..Default::default() }),
        fields,
        requirement: Some(pb::ContextRequirement {
            max_context_tokens: a.budget.unwrap_or(0),
            required_fields: a.required,
            optional_fields: a.optional,
            relevance_threshold: a.threshold,
            min_relative_score: a.min_relative_score,
        }),
        session_id: a.session,
        session_token: a.token,
        render: render_pb(a.render),
        budget_tokenizer: a.budget_tokenizer,
        explain: a.explain,
        session_max_total_tokens: a.session_total,
        reserve_tokens: a.reserve,
        rate: a.rate,
    };
    let r = c
        .call("Compress", idempotent, |mut cl| {
            let req = req.clone();
            async move { cl.compress(req).await }
        })
        .await?;
    let t = r.totals.clone().unwrap_or_default();
    let explanation = r.explanation.clone().map(crate::client::view::explanation).transpose()?;
    if a.format == crate::cli::compress::Format::Text {
        // stdout: exactly what the receiver pastes; the sizes on stderr
        writeln!(std::io::stdout().lock(), "{}", r.text)?;
        let mut e = std::io::stderr().lock();
        writeln!(
            e,
            "-- {} of {} {} tokens sent ({:.1}x reduction, {:.1}x asked); {} chunks held back",
            t.sent_tokens,
            t.context_tokens,
            t.tokenizer,
            t.reduction_ratio,
            t.requested_ratio,
            r.dropped.len()
        )?;
        if let Some(ex) = &explanation {
            crate::cli::compress::explain_table(ex, &t.tokenizer, 20, &mut e)?;
        }
        return Ok(());
    }
    // the one output view, and the session's secret (this client holds it)
    let token = r.session_token.clone();
    let mut out = serde_json::to_value(crate::client::view::compress_view(r, a.list_dropped)?)?;
    out["session_token"] = token.into();
    println!("{out}");
    Ok(())
}

/// `more`: an adaptive request on a session; prints its view, or with
/// `--format text` exactly the new chunks, sizes on stderr.
async fn more(c: &mut Conn, a: MoreArgs) -> anyhow::Result<()> {
    let report = match &a.report {
        Some(p) => std::fs::read_to_string(p).with_context(|| format!("--report {}", p.display()))?,
        None => String::new(),
    };
    let req = pb::ContextRequest {
        session_id: a.session,
        session_token: a.token,
        specific_question: a.question,
        current_confidence: a.confidence.unwrap_or(if report.is_empty() { 0.5 } else { 0.0 }),
        report,
        max_tokens: a.max_tokens.unwrap_or(0),
        // every try names it: a retry after a broken connection
        // gets the reply that may have been lost, not new chunks
        request_id: format!("r-{:032x}", rand::random::<u128>()),
        ..Default::default()
    };
    let r = c
        .call("RequestContext", true, |mut cl| {
            let req = req.clone();
            async move { cl.request_context(req).await }
        })
        .await?;
    if a.format == crate::cli::compress::Format::Text {
        writeln!(std::io::stdout().lock(), "{}", r.text)?;
        eprintln!(
            "-- {} of {} tokens sent ({} in the session); {}",
            r.sent_tokens,
            r.budget,
            r.session_sent_tokens,
            if r.reason.is_empty() { "more may be asked for" } else { &r.reason }
        );
        return Ok(());
    }
    println!("{}", serde_json::to_value(crate::client::view::more_view(r))?);
    Ok(())
}
