//! Where the tools' work runs: the core in this process, or a running
//! `scd serve` ([`remote`](super::remote)). Both take the tools' checked
//! arguments and answer the one view, so the two answer alike.

use scd_engine::encoder::{EncodeOptions, InputKind};
use scd_engine::handoff::ConfidenceMap;
use std::net::SocketAddr;
use std::sync::Arc;

use scd_engine::extract::Scd;

use crate::app::json::{self, Budget, CompressContextArgs, RequestMoreArgs};
use crate::app::metrics::Metrics;
use crate::app::more::MoreSeed;
use crate::app::{AppError, Call, Core, Limits};
use crate::client::Conn;
use crate::http::Caller;
use crate::view::{self, CompressOutput, MoreOutput};

use super::reply::{kind_text, Embeddings};

/// The HTTP client's address of a tool call, `None` over stdio (see
/// [`crate::mcp::peer_of`]).
pub type Peer = Option<SocketAddr>;

/// The engine behind the tools.
#[derive(Clone)]
pub enum Backend {
    /// The core of `scd serve`, called without a network: the same
    /// validation and limits, compression on `spawn_blocking` behind its
    /// semaphore (full: "resource exhausted, retry"), embeddings through its
    /// batcher thread; with an audit log (`scd mcp --audit-db`) each
    /// compress and request_more_context call is recorded as `MCP` and the
    /// core's method.
    InProcess(Arc<Core>),
    /// A running `scd serve` (`scd mcp --server URL`), with the retries of
    /// `scd client`.
    Remote(Box<Conn>),
}

/// The core's call of an MCP method from `who` (`MCP Compress` in the
/// audit trail). `who` is where a tool call comes from ([`caller_of`]):
/// over HTTP the client's address and the listener's deadline (see
/// [`crate::http::CallDeadline`]), nothing over stdio. In process the
/// address is the call's peer, so that each client draws on its own share
/// of the compress slots and the embed queue and its chosen session ids
/// are its own, as over gRPC; a remote server sees the MCP server's
/// address instead.
fn mcp_call(method: &str, who: &Caller) -> Call {
    who.call("MCP", method)
}

/// Where the tool call with `extensions` comes from: the HTTP request's
/// caller (rmcp puts the request's parts there), the default over stdio.
/// `scd mcp` verifies no identity, so the caller has no DID.
pub fn caller_of(extensions: &rmcp::model::Extensions) -> Caller {
    extensions.get::<axum::http::request::Parts>().map(Caller::of).unwrap_or_default()
}

impl Backend {
    /// The engine in this process under `limits` (see [`Core::new`]).
    pub fn in_process(scd: Arc<Scd>, limits: Limits) -> Self {
        Self::in_process_with(scd, limits, ConfidenceMap::default(), None)
    }

    /// [`Backend::in_process`] reading hand-off confidence levels through
    /// `map`, recording the audited calls in `audit` (`scd mcp --audit-db`).
    pub fn in_process_with(
        scd: Arc<Scd>,
        limits: Limits,
        map: ConfidenceMap,
        audit: Option<Arc<scd_audit::AuditLog>>,
    ) -> Self {
        let metrics = Arc::new(Metrics::new(limits.max_batch_tokens));
        Backend::InProcess(Arc::new(Core::new(scd, limits, metrics).with_confidence_map(map).with_audit(audit)))
    }

    /// `compress_context` of checked arguments: the view and the session's
    /// token (empty when the call continued a session). An empty
    /// `session_token` opens a session (under `session_id`, or a random one
    /// when that is empty too). The error is the tool error's text.
    pub async fn compress(
        &self,
        a: CompressContextArgs,
        budget: Budget,
        session_id: String,
        session_token: String,
        who: &Caller,
    ) -> Result<(CompressOutput, String), String> {
        let core = match self {
            Backend::InProcess(core) => core,
            Backend::Remote(c) => return super::remote::compress(c, a, budget, session_id, session_token).await,
        };
        let call = mcp_call(if session_token.is_empty() { "OpenSession" } else { "Compress" }, who);
        let list_dropped = a.list_dropped;
        let seed = json::audit_seed(&a, budget, &session_id);
        let input = json::compress_input(core, a, budget, session_id, session_token);
        let mut out = core.compress_seeded(&call, seed, input).await.map_err(app_tool_error)?;
        let token = out.compressed.session.as_mut().map(|g| std::mem::take(&mut g.token)).unwrap_or_default();
        Ok((view::compressed_view(out.compressed, list_dropped), token))
    }

    /// `request_more_context` of checked arguments (see
    /// [`json::more_confidence`]) in the session `session_token` continues.
    pub async fn request_context(
        &self,
        a: RequestMoreArgs,
        session_token: String,
        who: &Caller,
    ) -> Result<MoreOutput, String> {
        let core = match self {
            Backend::InProcess(core) => core,
            Backend::Remote(c) => return super::remote::request_context(c, a, session_token).await,
        };
        let call = mcp_call("RequestContext", who);
        let seed = MoreSeed { question: a.question.clone(), session_id: a.session.clone() };
        let out = core.request_more(&call, seed, json::more_input(core, a, session_token)).await;
        Ok(view::more_context_view(out.map_err(app_tool_error)?.more))
    }

    /// `count_tokens`: `text`'s tokens in `tokenizer` (empty: the encoder's).
    pub async fn count_tokens(&self, text: String, tokenizer: &str, who: &Caller) -> Result<Vec<u32>, String> {
        let core = match self {
            Backend::InProcess(core) => core,
            Backend::Remote(c) => return super::remote::count_tokens(c, text, tokenizer).await,
        };
        let texts = vec![text];
        let counted = async {
            let tokenizer = core
                .tokenizers
                .resolve(tokenizer)
                .map_err(|e| AppError::invalid(e.to_string().replacen("budget_tokenizer", "tokenizer", 1)))?;
            crate::app::check_texts(&texts, core.limits.max_texts, core.limits.max_text_bytes)?;
            core.count_tokens(&mcp_call("CountTokens", who), texts, tokenizer).await
        };
        counted.await.map_err(app_tool_error)
    }

    /// `embed`: `texts` as queries or passages, long ones in windows.
    pub async fn embed(&self, texts: Vec<String>, query: bool, who: &Caller) -> Result<Embeddings, String> {
        let core = match self {
            Backend::InProcess(core) => core,
            Backend::Remote(c) => return super::remote::embed(c, texts, query).await,
        };
        let embedded = async {
            crate::app::check_embed_texts(&texts, core.limits.max_texts, core.limits.max_text_bytes)?;
            let opts = EncodeOptions::new(if query { InputKind::Query } else { InputKind::Passage }).with_windows();
            core.embed(&mcp_call("Embed", who), texts, opts).await
        };
        let e = embedded.await.map_err(app_tool_error)?;
        let enc = e.encoded;
        let rows = (0..enc.len()).map(|i| (enc.row(i).to_vec(), enc.tokens[i] as u32, enc.windows[i] as u32)).collect();
        Ok(Embeddings { model: e.model, rows })
    }
}

/// The tool error of the core's error.
fn app_tool_error(e: AppError) -> String {
    let e = json::named(e);
    kind_text(e.kind_name(), e.message().to_string())
}
