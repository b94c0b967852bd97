//! # MCP tool server (`scd mcp`)
//!
//! The engine as four [Model Context Protocol](https://modelcontextprotocol.io)
//! tools, served with the official Rust SDK (`rmcp`) over stdio or
//! streamable HTTP:
//!
//! | tool | arguments | structured result |
//! | --- | --- | --- |
//! | `compress_context` | `task`, `context`, `budget` (or `rate`, the share of the context to keep), optional `required`, `optional`, `session`, `threshold`, `min_relative_score`, `render`, `budget_tokenizer`, `explain` | `chunks`, `totals`, `dropped`, `withheld_fields`, `warnings`, `session_id`, `report` (with `render`), `explanation` (with `explain`) |
//! | `request_more_context` | `session`, `question`, `current_confidence` (or `report`), optional `chunk_ids`, `reasoning` | `chunks`, `remaining_tokens`, `reason` |
//! | `count_tokens` | `text` | `tokens` |
//! | `embed` | `texts`, optional `query` | `model`, `dim`, `embeddings` |
//!
//! The work runs in this process ([`Backend::InProcess`]: the application
//! core `scd serve` runs, called without a network, with each call audited
//! as `MCP` and its method) or on a running `scd serve`
//! ([`Backend::Remote`], a gRPC client).
//!
//! **Sessions:** every `compress_context` opens one (under the given
//! `session` id, or a random one) or continues the one named. The session's
//! secret token never reaches the MCP client: this server keeps the tokens
//! of the sessions it opened ([`SessionTokens`], bounded, oldest forgotten
//! first), and a client names only the session id. Each token is bound to
//! the MCP client that opened the session ([`Owner`]): over HTTP its MCP
//! session (`Mcp-Session-Id`), over stdio the one client of the process.
//! Another MCP client naming the id is refused (`session: "…" is not a
//! session of this MCP client`), whether it asks for more or tries to
//! continue it. Requests without an MCP session (the stateless HTTP mode
//! of protocol 2026-07-28) are bound by their address: those from one
//! address share a binding (they continue each other's sessions by id,
//! 128 random bits unless the client chose one), never those of another
//! address or of an MCP session. An id a client chose is its own: another
//! client choosing the same id gets its own session (as the engine scopes
//! chosen ids), so no client can take or block another's chosen id.
//!
//! **Errors:** a bad argument is a tool result with `isError: true` whose
//! text names the argument (`budget: must be at least 1`,
//! `context.fields[2].kind: unknown variant ...`); arguments are parsed here
//! (not by the SDK) for that reason, strictly: unknown keys are errors.
//! Confidential field content appears in no result and no error.
//!
//! ```no_run
//! # async fn run(scd: std::sync::Arc<scd_engine::extract::Scd>, limits: scd_service::app::Limits) -> anyhow::Result<()> {
//! use rmcp::ServiceExt as _;
//! use scd_service::mcp::{Backend, ScdMcp, SessionTokens};
//!
//! let server = ScdMcp::new(Backend::in_process(scd, limits), SessionTokens::new(1024));
//! server.serve(rmcp::transport::stdio()).await?.waiting().await?;
//! # Ok(()) }
//! ```

mod args;
mod backend;
pub mod http;
mod remote;
mod reply;
pub mod schema;
pub mod stdio;
mod tokens;

pub(crate) use crate::app::json::compress_arguments;
pub use crate::app::json::{Args, CompressContextArgs, ContextArg, RenderFormat, RequestMoreArgs};
pub use args::{CountTokensArgs, EmbedArgs, EmbedOutput, EmbeddingOut, TokensOutput};
pub use backend::{caller_of, Backend, Peer};
pub use reply::Embeddings;

use std::sync::Arc;

use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{Implementation, ServerCapabilities, ServerConfig};
use rmcp::{tool, tool_handler, tool_router, Json, ServerHandler};
use serde::Serialize;

use crate::view;
pub use crate::view::{
    ChunkOut, ChunkWhyOut, CompressOutput, DropWhyOut, DroppedOut, DroppedSummary, ExplanationOut, MoreOutput,
    TotalsOut, MAX_EXPLAINED_DROPPED, MAX_LISTED_DROPPED,
};

use tokens::NotYours;
pub use tokens::{peer_of, Owner, SessionTokens};

/// The error for a session held for another MCP client.
/// The refusal of a session another MCP client opened (the id, which the
/// client chose or was given, is not quoted back).
const NOT_YOURS: &str = "session: not a session of this MCP client; open one with compress_context";

/// A tool result as the receiving model gets it: one text block (a
/// one-line header, then the context itself) and the machine view as
/// structured content, never the JSON repeated as text.
#[derive(Debug)]
pub struct Delivered<T> {
    /// The text block.
    pub text: String,
    /// The structured result.
    pub out: T,
}

impl<T: Serialize> rmcp::handler::server::tool::IntoCallToolResult for Delivered<T> {
    fn into_call_tool_result(self) -> Result<rmcp::model::CallToolResponse, rmcp::ErrorData> {
        let value = serde_json::to_value(&self.out)
            .map_err(|e| rmcp::ErrorData::internal_error(format!("serializing the result: {e}"), None))?;
        let mut r = rmcp::model::CallToolResult::structured(value);
        r.content = vec![rmcp::model::ContentBlock::text(self.text)];
        Ok(r.into())
    }
}

/// `text` after the header line (the header alone when `text` is empty).
fn with_header(header: String, text: &str) -> String {
    if text.is_empty() {
        header
    } else {
        format!("{header}\n{text}")
    }
}

/// The MCP server: the four tools over a [`Backend`].
#[derive(Clone)]
pub struct ScdMcp {
    backend: Backend,
    tokens: Arc<SessionTokens>,
    tool_router: ToolRouter<Self>,
}

#[tool_router(router = tool_router)]
impl ScdMcp {
    /// A server over `backend`, keeping session tokens in `tokens` (shared by
    /// every MCP connection of this process).
    pub fn new(backend: Backend, tokens: Arc<SessionTokens>) -> Self {
        Self { backend, tokens, tool_router: Self::tool_router() }
    }

    /// The tools' definitions (names, input and output schemas).
    pub fn tools(&self) -> Vec<rmcp::model::Tool> {
        self.tool_router.list_all()
    }

    #[tool(
        name = "compress_context",
        title = "Compress context",
        annotations(read_only_hint = true, open_world_hint = false),
        input_schema = schema::input::<CompressContextArgs>(),
        output_schema = schema::output::<CompressOutput>(),
        description = "Select the minimal context for a task within a token budget; hand the text result to the \
                       receiver. For more, call request_more_context with the session_id."
    )]
    async fn compress_context(
        &self,
        extensions: rmcp::model::Extensions,
        Parameters(args): Parameters<Args<CompressContextArgs>>,
    ) -> Result<Delivered<CompressOutput>, String> {
        let owner = Owner::of(&extensions);
        let (mut a, budget) = compress_arguments(args)?;
        let (session_id, session_token) = match a.session.take() {
            Some(id) if id.is_empty() => return Err("session: must not be empty (leave it out to open one)".into()),
            Some(id) => {
                let token = self.tokens.get(&id, &owner).map_err(|NotYours| NOT_YOURS.to_string())?.unwrap_or_default();
                (id, token)
            }
            None => (String::new(), String::new()),
        };
        let (out, token) = self.backend.compress(a, budget, session_id, session_token, &caller_of(&extensions)).await?;
        if !token.is_empty() {
            self.tokens.insert(out.session_id.clone(), owner, token);
        }
        let header = view::compress_header(&out, &format!("request_more_context session {:?}", out.session_id));
        Ok(Delivered { text: with_header(header, &out.text), out })
    }

    #[tool(
        name = "request_more_context",
        title = "More context",
        annotations(read_only_hint = true, open_world_hint = false),
        input_schema = schema::input::<RequestMoreArgs>(),
        output_schema = schema::output::<MoreOutput>(),
        description = "More of a session's context: unsent chunks for the question or chunk_ids, within max_tokens."
    )]
    async fn request_more_context(
        &self,
        extensions: rmcp::model::Extensions,
        Parameters(args): Parameters<Args<RequestMoreArgs>>,
    ) -> Result<Delivered<MoreOutput>, String> {
        let owner = Owner::of(&extensions);
        let a: RequestMoreArgs = args.parse()?;
        crate::app::json::more_confidence(&a).map_err(|e| e.to_string())?;
        let Some(token) = self.tokens.get(&a.session, &owner).map_err(|NotYours| NOT_YOURS.to_string())? else {
            return Err(
                "session: not opened by this MCP server (or long forgotten); open one with compress_context".into()
            );
        };
        let out = self.backend.request_context(a, token, &caller_of(&extensions)).await?;
        let header = view::more_header(&out);
        Ok(Delivered { text: with_header(header, &out.text), out })
    }

    #[tool(
        name = "count_tokens",
        title = "Count tokens",
        annotations(read_only_hint = true, open_world_hint = false),
        input_schema = schema::input::<CountTokensArgs>(),
        output_schema = schema::output::<TokensOutput>(),
        description = "Count a text's tokens."
    )]
    async fn count_tokens(
        &self,
        extensions: rmcp::model::Extensions,
        Parameters(args): Parameters<Args<CountTokensArgs>>,
    ) -> Result<Json<TokensOutput>, String> {
        let a = args.parse()?;
        let tokenizer = a.tokenizer.unwrap_or_default();
        let counted = self
            .backend
            .count_tokens(a.text, &tokenizer, &caller_of(&extensions))
            .await
            .map_err(|e| e.replacen("texts[0]", "text", 1))?;
        let tokens = counted.first().copied().ok_or("the server counted no text")?;
        let tokenizer = if tokenizer.trim().is_empty() { scd_engine::budget::E5.to_string() } else { tokenizer };
        Ok(Json(TokensOutput { tokens, tokenizer }))
    }

    #[tool(
        name = "embed",
        title = "Embed texts",
        annotations(read_only_hint = true, open_world_hint = false),
        input_schema = schema::input::<EmbedArgs>(),
        output_schema = schema::output::<EmbedOutput>(),
        description = "Embed texts (L2-normalized): each embedding's dimensions, tokens and digest."
    )]
    async fn embed(
        &self,
        extensions: rmcp::model::Extensions,
        Parameters(args): Parameters<Args<EmbedArgs>>,
    ) -> Result<Delivered<EmbedOutput>, String> {
        let a = args.parse()?;
        let r = self.backend.embed(a.texts, a.query, &caller_of(&extensions)).await?;
        let dim = r.rows.first().map_or(0, |(values, _, _)| values.len() as u32);
        let out = EmbedOutput {
            model: r.model,
            dim,
            embeddings: r
                .rows
                .into_iter()
                .map(|(values, tokens, windows)| EmbeddingOut {
                    digest: vector_digest(&values),
                    values: if a.vectors { values } else { Vec::new() },
                    tokens,
                    windows,
                })
                .collect(),
        };
        let digests: Vec<&str> = out.embeddings.iter().map(|e| e.digest.as_str()).collect();
        let text = format!(
            "[SCD: {} embeddings of {} dimensions by {}{}] digests: {}",
            out.embeddings.len(),
            out.dim,
            out.model,
            if a.vectors { "; the vectors are in the structured result" } else { "" },
            digests.join(" ")
        );
        Ok(Delivered { text, out })
    }
}

/// SHA-256 of a vector's little-endian f32 bytes, the first 16 hex digits.
fn vector_digest(values: &[f32]) -> String {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    for v in values {
        h.update(v.to_le_bytes());
    }
    h.finalize().iter().take(8).map(|b| format!("{b:02x}")).collect()
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for ScdMcp {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("scd", env!("CARGO_PKG_VERSION")))
            .with_instructions(
                "SCD selects the minimal sufficient context for a task under a token budget. Call \
                 compress_context with the task, the context fields and the receiver's budget; hand the chunks \
                 on; if the receiver needs more, call request_more_context with the session id.",
            )
    }
}

#[cfg(test)]
mod tests {
    use std::marker::PhantomData;

    use scd_engine::Param;
    use serde_json::Value;
    use tonic::Status;

    use super::remote::tool_error;
    use super::*;
    use crate::app::{AppError, Limits};

    fn args<T: serde::de::DeserializeOwned>(v: Value) -> Result<T, String> {
        let Value::Object(m) = v else { panic!("not an object") };
        Args::<T>(m, PhantomData).parse()
    }

    #[test]
    fn bad_arguments_are_named_by_their_path() {
        let e = args::<CompressContextArgs>(serde_json::json!({"task": "t", "context": {"fields": []}, "budget": -1}))
            .unwrap_err();
        assert!(e.starts_with("budget: invalid value: an integer, expected"), "{e}");
        let ctx = serde_json::json!({"fields": [{"name": "a", "content": "x"}, {"name": "b", "kind": "poem", "content": "y"}]});
        let e = args::<CompressContextArgs>(serde_json::json!({"task": "t", "context": ctx, "budget": 5})).unwrap_err();
        assert!(e.starts_with("context.fields[1].kind: unknown variant, expected one of `prose`"), "{e}");
        assert!(!e.contains("poem"), "the value is not echoed: {e}");
        let secret = "The production payment gateway key is sk_live_SECRET_4242";
        let as_string =
            serde_json::json!({"fields": [{"name": "k", "content": secret, "confidential": true}]}).to_string();
        let e = args::<CompressContextArgs>(serde_json::json!({"task": "t", "context": as_string, "budget": 5}))
            .unwrap_err();
        assert!(e.starts_with("context: invalid type: a string, expected") && !e.contains("sk_live"), "{e}");
        let e = args::<CompressContextArgs>(
            serde_json::json!({"task": "t", "context": {"fields": []}, "budget": 5, "budgte": 1}),
        )
        .unwrap_err();
        assert!(e.starts_with("budgte: unknown field `budgte`"), "{e}");
        let e = args::<EmbedArgs>(serde_json::json!({"query": true})).unwrap_err();
        assert_eq!(e, "arguments: missing field `texts`");
        let ok = args::<EmbedArgs>(serde_json::json!({"texts": ["a"]})).unwrap();
        assert!(!ok.query);
    }

    /// A remote server's error as a tool error: the server types the
    /// parameter (`From<AppError> for Status` puts it in the `scd-param`
    /// metadata) and the tool error names the MCP argument by it.
    #[test]
    fn wire_names_in_server_errors_become_argument_names() {
        let server = |param: Param, why: &str| Status::from(AppError::invalid_param(param, why));
        let e = server(Param::RequiredFields, "field \"k\" is confidential");
        assert_eq!(e.message(), "required_fields: field \"k\" is confidential", "gRPC says the wire name");
        assert_eq!(tool_error(e), "required: field \"k\" is confidential");
        assert_eq!(tool_error(server(Param::SpecificQuestion, "must not be empty")), "question: must not be empty");
        // a path named alike on every surface (the engine says `context.fields` itself)
        assert_eq!(
            tool_error(server(Param::from("context.fields[2].name"), "must not be empty")),
            "context.fields[2].name: must not be empty"
        );
        // REST and A2A name it `reserve` too (the JSON key), not the engine's name
        assert_eq!(
            tool_error(server(Param::ReserveTokens, "300 is not below the budget 200")),
            "reserve: 300 is not below the budget 200"
        );
        // no typed parameter: the server's message as it is, never read for a name
        assert_eq!(tool_error(Status::invalid_argument("fieldsx: no")), "fieldsx: no");
        assert_eq!(
            tool_error(Status::invalid_argument("specific_question: said in a string")),
            "specific_question: said in a string"
        );
        assert_eq!(
            tool_error(Status::resource_exhausted("compress queue is full; retry after 100 ms")),
            "busy: compress queue is full; retry after 100 ms"
        );
    }

    fn in_process() -> ScdMcp {
        let (scd, limits) = engine();
        ScdMcp::new(Backend::in_process(scd, limits), SessionTokens::new(4))
    }

    /// A hashing engine and small limits.
    fn engine() -> (Arc<scd_engine::extract::Scd>, Limits) {
        let enc = Arc::new(scd_engine::encoder::HashEncoder::new(32, 128));
        let scd = Arc::new(scd_engine::extract::Scd::new(enc, scd_engine::extract::ScdConfig::default()));
        let limits = Limits {
            max_texts: 8,
            max_text_bytes: 1 << 16,
            max_fields: 8,
            max_request_bytes: 1 << 20,
            queue_size: 8,
            batch_texts: 8,
            max_batch_tokens: 1024,
            max_concurrent_compress: 2,
        };
        (scd, limits)
    }

    fn compress_args(v: Value) -> Parameters<Args<CompressContextArgs>> {
        let Value::Object(m) = v else { panic!("not an object") };
        Parameters(Args(m, PhantomData))
    }

    fn more_args(v: Value) -> Parameters<Args<RequestMoreArgs>> {
        let Value::Object(m) = v else { panic!("not an object") };
        Parameters(Args(m, PhantomData))
    }

    /// The extensions of a request over stdio.
    fn stdio() -> rmcp::model::Extensions {
        rmcp::model::Extensions::new()
    }

    /// The extensions of a request over HTTP in MCP session `id` (none: stateless).
    fn over_http(id: Option<&str>) -> rmcp::model::Extensions {
        over_http_from(id, None)
    }

    /// [`over_http`] from the client at `peer`, as the HTTP listener marks it.
    fn over_http_from(id: Option<&str>, peer: Option<std::net::SocketAddr>) -> rmcp::model::Extensions {
        let mut req = axum::http::Request::builder().method("POST").uri("/mcp");
        if let Some(id) = id {
            req = req.header("mcp-session-id", id);
        }
        if let Some(p) = peer {
            req = req.extension(axum::extract::ConnectInfo(p));
        }
        let (parts, ()) = req.body(()).unwrap().into_parts();
        let mut ext = rmcp::model::Extensions::new();
        ext.insert(parts);
        ext
    }

    /// An in-process server keeping an audit trail (in the folder returned
    /// with it).
    fn audited() -> (ScdMcp, Arc<scd_audit::AuditLog>, tempfile::TempDir) {
        use scd_audit::{AuditLevel, AuditLog, Retention};
        let dir = tempfile::tempdir().unwrap();
        let log = Arc::new(
            AuditLog::open(&dir.path().join("audit.redb"), AuditLevel::Summary, Retention::default()).unwrap(),
        );
        let (scd, limits) = engine();
        let metrics = Arc::new(crate::app::metrics::Metrics::new(limits.max_batch_tokens));
        let service = crate::app::Core::new(scd, limits, metrics).with_audit(Some(log.clone()));
        (ScdMcp::new(Backend::InProcess(Arc::new(service)), SessionTokens::new(8)), log, dir)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_http_clients_calls_reach_the_engine_from_its_own_address() {
        use scd_audit::AuditFilter;
        let (mcp, log, _dir) = audited();
        let (a, b): (std::net::SocketAddr, std::net::SocketAddr) =
            ("10.0.0.7:5000".parse().unwrap(), "[2001:db8::9]:41000".parse().unwrap());
        for ext in [over_http_from(Some("mcp-a"), Some(a)), over_http_from(None, Some(b)), stdio()] {
            let args = serde_json::json!({"task": "why do charges fail?", "context": charges_context(), "budget": 12});
            mcp.compress_context(ext, compress_args(args)).await.unwrap();
        }
        let records = log.query(&AuditFilter::default()).unwrap();
        // named by the surface and the core's method
        assert!(records.iter().all(|r| r.method == "MCP OpenSession"), "{records:?}");
        let peers: Vec<Option<String>> = records.into_iter().map(|r| r.peer).collect();
        // each HTTP client is its own peer (its own share and session scope); stdio has none
        assert_eq!(peers, [Some(a.to_string()), Some(b.to_string()), None]);
        assert_eq!(peer_of(&over_http_from(None, Some(a))), Some(a));
        assert_eq!(peer_of(&over_http(Some("mcp-a"))), None);
    }

    /// Each tool call is audited under its own name: opening a session,
    /// continuing it and asking it for more (in process, over stdio).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn mcp_calls_are_audited_as_open_compress_and_request_context() {
        use scd_audit::AuditFilter;
        let (mcp, log, _dir) = audited();
        let args = serde_json::json!({"task": "why do charges fail?", "context": charges_context(), "budget": 12,
                                      "session": "charges"});
        mcp.compress_context(stdio(), compress_args(args.clone())).await.unwrap();
        mcp.compress_context(stdio(), compress_args(args)).await.unwrap();
        let more = serde_json::json!({"session": "charges", "question": "how many connections?",
                                      "current_confidence": 0.1});
        mcp.request_more_context(stdio(), more_args(more)).await.unwrap();
        let records = log.query(&AuditFilter::default()).unwrap();
        let named: Vec<(&str, &str, Option<&str>)> =
            records.iter().map(|r| (r.method.as_str(), r.outcome.as_str(), r.session_id.as_deref())).collect();
        assert_eq!(
            named,
            [
                ("MCP OpenSession", "ok", Some("charges")),
                ("MCP Compress", "ok", Some("charges")),
                ("MCP RequestContext", "ok", Some("charges")),
            ]
        );
        assert_eq!(records[2].task.as_deref(), Some("how many connections?"));
    }

    fn charges_context() -> Value {
        serde_json::json!({"fields": [
            {"name": "notes", "content": "The pool is exhausted. Charges time out. The newsletter font is small. \
                                          Retries happen every second. The database has 32 connections."},
            {"name": "keys", "content": "sk_live_SECRET_4242", "confidential": true},
        ]})
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn sessions_continue_by_id_alone_and_secrets_stay_out() {
        let mcp = in_process();
        let context = charges_context();
        let Delivered { out, .. } = mcp
            .compress_context(
                stdio(),
                compress_args(serde_json::json!({
                    "task": "why do charges fail?", "context": context, "budget": 12
                })),
            )
            .await
            .unwrap();
        assert!(!out.session_id.is_empty());
        assert_eq!(out.withheld_fields, ["keys"]);
        assert_eq!(mcp.tokens.len(), 1, "the token is held here");
        let shown = serde_json::to_string(&out).unwrap();
        let token = mcp.tokens.get(&out.session_id, &Owner::Stdio).unwrap().unwrap();
        assert!(!shown.contains("sk_live") && !shown.contains(&token), "{shown}");
        // the id alone continues the session
        let Delivered { out: more, .. } = mcp
            .request_more_context(
                stdio(),
                more_args(serde_json::json!({
                    "session": out.session_id, "question": "how many connections?", "current_confidence": 0.1
                })),
            )
            .await
            .unwrap();
        assert!(more.remaining_tokens <= 12);
        // an error naming the confidential field never shows its content
        let e = mcp
            .compress_context(
                stdio(),
                compress_args(serde_json::json!({
                    "task": "t", "context": context, "budget": 12, "optional": ["keys"]
                })),
            )
            .await
            .err()
            .unwrap();
        assert_eq!(e, "optional: field \"keys\" is confidential and is never sent");
        let e = mcp
            .request_more_context(
                stdio(),
                more_args(serde_json::json!({
                    "session": "not-ours", "question": "q", "current_confidence": 0.5
                })),
            )
            .await
            .err()
            .unwrap();
        assert_eq!(e, "session: not opened by this MCP server (or long forgotten); open one with compress_context");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_session_belongs_to_the_mcp_client_that_opened_it() {
        let mcp = in_process();
        let open = |ext, session: Option<&str>| {
            let mut args =
                serde_json::json!({"task": "why do charges fail?", "context": charges_context(), "budget": 12});
            if let Some(id) = session {
                args["session"] = Value::from(id);
            }
            mcp.compress_context(ext, compress_args(args))
        };
        let more = |ext, session: &str| {
            mcp.request_more_context(
                ext,
                more_args(serde_json::json!({"session": session, "question": "q", "current_confidence": 0.1})),
            )
        };
        let Delivered { out: a, .. } = open(over_http(Some("mcp-a")), None).await.unwrap();
        let id = a.session_id.clone();
        let refused = NOT_YOURS.to_string();
        // another MCP session, a stateless request, stdio: neither asks for more nor continues it
        for other in [over_http(Some("mcp-b")), over_http(None), stdio()] {
            assert_eq!(more(other.clone(), &id).await.err().unwrap(), refused);
            assert_eq!(open(other, Some(&id)).await.err().unwrap(), refused);
        }
        // its own client still does both
        more(over_http(Some("mcp-a")), &id).await.unwrap();
        let Delivered { out: again, .. } = open(over_http(Some("mcp-a")), Some(&id)).await.unwrap();
        assert_eq!(again.session_id, id);
        // a client-chosen id taken by another client is refused too
        open(over_http(Some("mcp-a")), Some("mine")).await.unwrap();
        assert!(open(over_http(Some("mcp-b")), Some("mine")).await.is_err());
        // stateless requests share one binding per address
        let Delivered { out: s, .. } = open(over_http(None), None).await.unwrap();
        more(over_http(None), &s.session_id).await.unwrap();
        assert!(more(over_http(Some("mcp-a")), &s.session_id).await.is_err());
        let (x, y): (std::net::SocketAddr, std::net::SocketAddr) =
            ("127.0.0.2:4000".parse().unwrap(), "127.0.0.3:4000".parse().unwrap());
        let Delivered { out: s, .. } = open(over_http_from(None, Some(x)), None).await.unwrap();
        more(over_http_from(None, Some(x)), &s.session_id).await.unwrap();
        assert_eq!(more(over_http_from(None, Some(y)), &s.session_id).await.err().unwrap(), refused);
        // a chosen id is each stateless address's own: neither takes nor
        // blocks the other's
        let Delivered { out: mine, .. } = open(over_http_from(None, Some(x)), Some("deploy")).await.unwrap();
        let Delivered { out: theirs, .. } = open(over_http_from(None, Some(y)), Some("deploy")).await.unwrap();
        assert_eq!((mine.session_id.as_str(), theirs.session_id.as_str()), ("deploy", "deploy"));
        more(over_http_from(None, Some(x)), "deploy").await.unwrap();
        more(over_http_from(None, Some(y)), "deploy").await.unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn compress_context_counts_in_the_named_tokenizer_and_explains_when_asked() {
        let mcp = in_process();
        let call = |extra: Value| {
            let mut args =
                serde_json::json!({"task": "why do charges fail?", "context": charges_context(), "budget": 12});
            args.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
            mcp.compress_context(stdio(), compress_args(args))
        };
        let Delivered { out, .. } = call(serde_json::json!({})).await.unwrap();
        assert_eq!(out.totals.tokenizer, "e5");
        assert!(out.explanation.is_none());
        assert!(!serde_json::to_string(&out).unwrap().contains("explanation"));

        let Delivered { out, .. } = call(serde_json::json!({"budget_tokenizer": "o200k"})).await.unwrap();
        assert_eq!(out.totals.tokenizer, "o200k");
        let n = scd_engine::budget::builtin("o200k").unwrap().count(&out.text).unwrap();
        assert!(n <= 12 && !out.chunks.is_empty(), "{n} o200k tokens");
        for bad in ["nope", "/etc/passwd"] {
            let e = call(serde_json::json!({"budget_tokenizer": bad})).await.err().unwrap();
            assert!(e.starts_with("budget_tokenizer: unknown tokenizer"), "{e}");
            assert!(e.contains("e5, o200k, cl100k"), "{e}");
        }
        let e = call(serde_json::json!({"explain": "yes"})).await.err().unwrap();
        assert!(e.starts_with("explain: invalid type"), "{e}");

        let Delivered { out, .. } = call(serde_json::json!({"explain": true})).await.unwrap();
        let ex = out.explanation.as_ref().expect("an explanation");
        let ids: Vec<&str> = ex.selected.iter().map(|w| w.id.as_str()).collect();
        assert_eq!(ids, out.chunks.iter().map(|c| c.id.as_str()).collect::<Vec<_>>());
        for w in &ex.selected {
            let sum = w.dense_z + ex.lexical_weight * w.lexical_z + w.group_lift + w.link_lift + w.hop_lift;
            assert!((sum - w.score).abs() < 1e-3, "{w:?}");
        }
        let mut orders: Vec<u32> = ex.selected.iter().map(|w| w.order).collect();
        orders.sort_unstable();
        assert_eq!(orders, (1..=ex.selected.len() as u32).collect::<Vec<_>>());
        assert!(!ex.dropped.is_empty());
        for d in &ex.dropped {
            assert!(!d.id.starts_with("keys"), "confidential field listed");
            let ok = match d.reason.as_str() {
                "below_threshold" => d.threshold.is_some() && d.value.is_some() && d.of.is_none(),
                "near_duplicate" => d.of.as_deref().is_some_and(|of| ids.contains(&of)),
                "out_of_budget" | "not_eligible" | "structure_only" => d.threshold.is_none() && d.of.is_none(),
                _ => false,
            };
            assert!(ok, "{d:?}");
        }
        let shown = serde_json::to_string(&out).unwrap();
        assert!(shown.contains("\"explanation\"") && !shown.contains("sk_live"), "{shown}");
    }

    #[test]
    fn every_tool_has_an_input_and_an_object_output_schema() {
        let names: Vec<String> = ScdMcp::tool_router()
            .list_all()
            .into_iter()
            .map(|t| {
                let out = t.output_schema.clone().expect("output schema");
                assert_eq!(out.get("type"), Some(&Value::from("object")), "{}", t.name);
                assert_eq!(t.input_schema.get("type"), Some(&Value::from("object")), "{}", t.name);
                t.name.to_string()
            })
            .collect();
        let mut sorted = names.clone();
        sorted.sort();
        assert_eq!(sorted, ["compress_context", "count_tokens", "embed", "request_more_context"]);
        let compress = ScdMcp::tool_router().list_all().into_iter().find(|t| t.name == "compress_context").unwrap();
        let schema = Value::Object((*compress.input_schema).clone());
        let context = match schema["properties"]["context"]["$ref"].as_str() {
            Some(r) => schema.pointer(r.trim_start_matches('#')).cloned().unwrap(),
            None => schema["properties"]["context"].clone(),
        };
        assert_eq!(context["properties"]["fields"]["items"]["additionalProperties"], Value::Bool(false), "{schema}");
        assert_eq!(schema["additionalProperties"], Value::Bool(false), "{schema}");
        assert_eq!(schema["properties"]["explain"]["type"], "boolean", "{schema}");
        // optional arguments are typed without null (null still parses: see mcp::schema's tests)
        assert_eq!(schema["properties"]["budget_tokenizer"]["type"], "string", "{schema}");
        // the output schema names the keys every result has (types and the optional
        // `explanation` are the docs'): see mcp::schema
        let out = Value::Object((*compress.output_schema.clone().unwrap()).clone());
        assert!(out["required"].as_array().unwrap().contains(&Value::from("session_id")), "{out}");
    }
}
