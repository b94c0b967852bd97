//! # REST on the HTTP listener (`scd serve --http-addr`)
//!
//! The engine for clients that speak plain HTTP+JSON: the Python package
//! (`service/clients/python`), its LangChain and LlamaIndex adapters, and
//! any OpenAI embeddings client pointed at this server's `base_url`.
//!
//! | method and path | body | answer |
//! | --- | --- | --- |
//! | `POST /v1/compress` | `compress_context`'s arguments ([`CompressBody`]), with `budget` or `rate` | [`CompressReply`]: the one output view plus the session's token |
//! | `POST /v1/sessions/{session_id}/more` | `request_more_context`'s arguments ([`MoreBody`]); header `x-scd-session-token` | [`MoreOutput`] |
//! | `DELETE /v1/sessions/{session_id}` | header `x-scd-session-token` | 204 |
//! | `POST /v1/embeddings` | OpenAI's ([`EmbeddingsBody`]) | OpenAI's ([`EmbeddingsReply`]) |
//! | `GET /v1/models` | — | OpenAI's model list |
//! | `GET /openapi.json` | — | the OpenAPI 3.1 document, generated (by `aide`) from these handlers and the types they parse and answer |
//! | `GET /ui` | — | a page that calls these routes to show what a selection kept and why ([`ui`]; off with `--no-ui`) |
//!
//! Every handler calls the same [`Core`] methods as gRPC, A2A and
//! MCP, so limits, per-caller shares, sessions (bound to the caller: its
//! DID under `--auth did-wba`, else its IP address), audit and metrics are
//! the same. Bodies are read within `--max-request-bytes` and parsed
//! strictly: an unknown key, a wrong type or a value out of range is a 400
//! whose message names the field and the limit and quotes no value. Every
//! error is OpenAI's shape, `{"error": {"message", "type", "param",
//! "code"}}`; overload is 429 with `Retry-After` (whole seconds, rounded
//! up) and `retry-after-ms`.
//!
//! ```no_run
//! # fn run(svc: std::sync::Arc<scd_service::app::Core>) {
//! // merged into the HTTP listener's router by `server::serve`
//! let routes: axum::Router = scd_service::rest::router(svc);
//! # }
//! ```

mod body;
mod embeddings;
mod error;
pub mod ui;

pub use body::{Body, CompressBody, MoreBody, RestBody};
pub use embeddings::{
    EmbeddingData, EmbeddingsBody, EmbeddingsReply, EncodingFormat, Input, InputType, Model, ModelList, Usage, Vector,
};
pub use error::{ApiError, ErrorBody, ErrorDetail};

use std::sync::Arc;

use aide::axum::routing::{delete_with, get_with, post_with};
use aide::axum::ApiRouter;
use aide::openapi::{Info, OpenApi};
use aide::transform::TransformOperation;
use axum::extract::{FromRequestParts, Path, State};
use axum::http::request::Parts;
use axum::http::{header, StatusCode};
use axum::Json;
use schemars::JsonSchema;
use serde::Serialize;

use crate::app::{json, AppError, Call, Core};
use crate::http::{Caller, Counted};
use crate::view::{self, CompressOutput, MoreOutput};

/// The header that carries a session's token (never a URL: URLs are logged).
pub const SESSION_TOKEN_HEADER: &str = "x-scd-session-token";

/// The REST routes over `svc` (and `GET /openapi.json`), to merge into the
/// HTTP listener's router.
pub fn router(svc: Arc<Core>) -> axum::Router {
    let mut api = api_info();
    let routes = api_routes().finish_api(&mut api);
    let document: Arc<str> = serde_json::to_string_pretty(&api).expect("an OpenAPI document serializes").into();
    routes
        .route(
            "/openapi.json",
            axum::routing::get(move || {
                let document = document.clone();
                async move { ([(header::CONTENT_TYPE, "application/json")], document.to_string()) }
            }),
        )
        .route_layer(axum::middleware::from_fn_with_state(
            Counted { metrics: svc.metrics.clone(), prefix: "REST", route_of },
            crate::http::counted,
        ))
        .with_state(svc)
}

/// The OpenAPI document `GET /openapi.json` serves, pretty-printed (no
/// server needed: `scd openapi` prints it, and `docs/openapi.json` is a copy
/// a test keeps in step).
pub fn openapi_document() -> String {
    let mut api = api_info();
    let _ = api_routes().finish_api(&mut api);
    serde_json::to_string_pretty(&api).expect("an OpenAPI document serializes")
}

fn api_info() -> OpenApi {
    OpenApi {
        info: Info {
            title: "SCD".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            description: Some(
                "The minimal sufficient context for a task under a token budget, over HTTP+JSON. Errors are \
                 {\"error\": {\"message\", \"type\", \"param\", \"code\"}}; `param` names the field."
                    .into(),
            ),
            ..Default::default()
        },
        ..Default::default()
    }
}

/// The documented routes (their handlers and the types they parse and answer).
fn api_routes() -> ApiRouter<Arc<Core>> {
    ApiRouter::new()
        .api_route("/v1/compress", post_with(compress, compress_docs))
        .api_route("/v1/sessions/{session_id}/more", post_with(more, more_docs))
        .api_route("/v1/sessions/{session_id}", delete_with(close, close_docs))
        .api_route("/v1/embeddings", post_with(embeddings::embeddings, embeddings::docs))
        .api_route("/v1/models", get_with(embeddings::models, embeddings::models_docs))
}

/// A path as its route (a session id is not a label).
fn route_of(path: &str) -> &'static str {
    match path {
        "/v1/compress" => "/v1/compress",
        "/v1/embeddings" => "/v1/embeddings",
        "/v1/models" => "/v1/models",
        "/openapi.json" => "/openapi.json",
        p if p.ends_with("/more") => "/v1/sessions/{session_id}/more",
        _ => "/v1/sessions/{session_id}",
    }
}

/// The `x-scd-session-token` header, when sent (at most 256 bytes).
#[derive(Default)]
pub struct SessionToken(Option<String>);

impl std::fmt::Debug for SessionToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() { "SessionToken(<secret>)" } else { "SessionToken(None)" })
    }
}

/// The longest session token accepted (the server's are 64 hex digits).
const MAX_TOKEN_BYTES: usize = 256;

impl<S: Send + Sync> FromRequestParts<S> for SessionToken {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        let Some(v) = parts.headers.get(SESSION_TOKEN_HEADER) else { return Ok(SessionToken(None)) };
        let token = v.to_str().ok().filter(|t| t.len() <= MAX_TOKEN_BYTES).ok_or_else(|| {
            ApiError::invalid(format!("{SESSION_TOKEN_HEADER}: not a token (ASCII, at most {MAX_TOKEN_BYTES} bytes)"))
        })?;
        Ok(SessionToken((!token.is_empty()).then(|| token.to_string())))
    }
}

impl aide::OperationInput for SessionToken {
    fn operation_input(_: &mut aide::generate::GenContext, operation: &mut aide::openapi::Operation) {
        operation.parameters.push(aide::openapi::ReferenceOr::Item(aide::openapi::Parameter::Header {
            parameter_data: aide::openapi::ParameterData {
                name: SESSION_TOKEN_HEADER.into(),
                description: Some(
                    "The session's token, from the answer that opened it (`session_token`): required to \
                     continue, extend or close a session"
                        .into(),
                ),
                required: false,
                format: aide::openapi::ParameterSchemaOrContent::Schema(aide::openapi::SchemaObject {
                    json_schema: schemars::json_schema!({"type": "string", "maxLength": MAX_TOKEN_BYTES}),
                    external_docs: None,
                    example: None,
                }),
                extensions: Default::default(),
                deprecated: None,
                example: None,
                examples: Default::default(),
                explode: None,
            },
            style: aide::openapi::HeaderStyle::Simple,
        }));
    }
}

/// The answer of `POST /v1/compress`: the one output view of every
/// surface, plus the token that continues the session (keep it secret).
#[derive(Debug, Serialize, JsonSchema)]
pub struct CompressReply {
    /// The selection: `text` is exactly what to hand the receiver.
    #[serde(flatten)]
    pub output: CompressOutput,
    /// The session's secret: send it as `x-scd-session-token` to ask for
    /// more or to close the session (empty when the call continued one).
    pub session_token: String,
}

/// `POST /v1/compress`.
async fn compress(
    State(svc): State<Arc<Core>>,
    who: Caller,
    SessionToken(token): SessionToken,
    Body(b): Body<CompressBody>,
) -> Result<Json<CompressReply>, ApiError> {
    let CompressBody { args, budget } = b;
    let session_id = args.session.clone().unwrap_or_default();
    if session_id.is_empty() && token.is_some() {
        return Err(ApiError::invalid(format!("{SESSION_TOKEN_HEADER}: sent without a session to continue")));
    }
    let token = token.unwrap_or_default();
    let method = if token.is_empty() { "OpenSession" } else { "Compress" };
    let call = rest_call(method, &who);
    let list_dropped = args.list_dropped;
    let seed = json::audit_seed(&args, budget, &session_id);
    let input = json::compress_input(&svc, args, budget, session_id, token);
    let mut out = svc.compress_seeded(&call, seed, input).await?;
    let session_token = out.compressed.session.as_mut().map(|g| std::mem::take(&mut g.token)).unwrap_or_default();
    Ok(Json(CompressReply { output: view::compressed_view(out.compressed, list_dropped), session_token }))
}

/// The core's call of a REST method (`REST Compress` in the audit trail).
fn rest_call(method: &str, who: &Caller) -> Call {
    who.call("REST", method)
}

fn compress_docs(op: TransformOperation) -> TransformOperation {
    op.id("compress").summary("Select the minimal sufficient context for a task").description(
        "Scores the context's chunks for the task and returns the most relevant that fit the budget (or `rate` \
         of the context's tokens) in `budget_tokenizer`; `text` is exactly what to hand the receiver. Opens a \
         session (under `session`, or a random id) unless `x-scd-session-token` continues the one named. \
         Confidential fields are never sent back.",
    )
}

/// `POST /v1/sessions/{session_id}/more`.
async fn more(
    State(svc): State<Arc<Core>>,
    who: Caller,
    Path(session_id): Path<String>,
    SessionToken(token): SessionToken,
    Body(MoreBody(mut args)): Body<MoreBody>,
) -> Result<Json<MoreOutput>, ApiError> {
    args.session = session_id;
    json::more_confidence(&args)?;
    let token = token.ok_or_else(ApiError::session_token_missing)?;
    let call = rest_call("RequestContext", &who);
    let seed = crate::app::more::MoreSeed { question: args.question.clone(), session_id: args.session.clone() };
    let out = svc.request_more(&call, seed, json::more_input(&svc, args, token)).await?;
    Ok(Json(view::more_context_view(out.more)))
}

fn more_docs(op: TransformOperation) -> TransformOperation {
    op.id("more").summary("Ask a session for more context").description(
        "The next chunks the receiver has not seen, for its specific question (or the `chunk_ids` named), \
         within this reply's budget (`max_tokens`, default the first answer's). Give `current_confidence`, or \
         the receiver's own hand-off `report` whose confidence sets it.",
    )
}

/// `DELETE /v1/sessions/{session_id}`.
async fn close(
    State(svc): State<Arc<Core>>,
    who: Caller,
    Path(session_id): Path<String>,
    SessionToken(token): SessionToken,
) -> Result<StatusCode, ApiError> {
    let token = token.ok_or_else(ApiError::session_token_missing)?;
    if svc.close_session(&rest_call("CloseSession", &who), &session_id, &token)? {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(AppError::NotFound { message: "session: no such session (expired or closed)".into() }.into())
    }
}

fn close_docs(op: TransformOperation) -> TransformOperation {
    op.id("close_session").summary("Close a session").response::<204, ()>()
}

#[cfg(test)]
mod tests {
    /// `docs/openapi.json` is the document the server serves; after a change
    /// to the REST types, `scd openapi > docs/openapi.json` renews it.
    #[test]
    fn the_documented_openapi_is_the_served_one() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/openapi.json");
        let docs = std::fs::read_to_string(path).expect("docs/openapi.json");
        assert!(
            docs.trim_end() == super::openapi_document(),
            "docs/openapi.json is out of date: run `scd openapi > docs/openapi.json`"
        );
    }
}
