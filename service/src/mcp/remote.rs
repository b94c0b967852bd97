//! The tools on a running `scd serve` (`scd mcp --server URL`): a gRPC
//! client of its `scd.v1.Scd`, so this one room of MCP speaks the wire's
//! types (from `scd-proto`, the wire contract, not the gRPC surface), with
//! the retries of `scd client`.

use scd_engine::Param;
use scd_proto::scd::v1 as pb;
use scd_proto::scd::v1::PARAM_KEY;
use tonic::{Code, Status};

use super::reply::{kind_text, Embeddings};
use crate::app::json::{self, Budget, CompressContextArgs, RenderFormat, RequestMoreArgs};
use crate::app::AppError;
use crate::client::view;
use crate::client::Conn;
use crate::view::{CompressOutput, MoreOutput};

/// The `scd.v1` request of checked `compress_context` arguments (see
/// [`crate::app::json::compress_arguments`]); an empty `session_token`
/// opens a session (under `session_id`, or a random one when that is empty
/// too).
pub(crate) fn compress_request(
    a: CompressContextArgs,
    budget: Budget,
    session_id: String,
    session_token: String,
) -> pb::CompressRequest {
    let open = session_token.is_empty();
    let (budget, rate) = match budget {
        Budget::Tokens(n) => (n, None),
        Budget::Rate(r) => (0, Some(r)),
    };
    pb::CompressRequest {
        task: Some(pb::Task { description: a.task, ..Default::default() }),
        fields: a.context.0.fields.into_iter().map(pb::Field::from).collect(),
        requirement: Some(pb::ContextRequirement {
            required_fields: a.required,
            optional_fields: a.optional,
            max_context_tokens: budget,
            relevance_threshold: a.threshold,
            min_relative_score: a.min_relative_score,
        }),
        session_id,
        session_token,
        render: a.render.map_or(pb::ReportFormat::Unspecified, render_pb) as i32,
        budget_tokenizer: a.budget_tokenizer.unwrap_or_default(),
        explain: a.explain,
        session_max_total_tokens: 0,
        reserve_tokens: if open { a.reserve.unwrap_or(0) } else { 0 },
        rate,
    }
}

/// The `scd.v1` report format of a `render` argument.
fn render_pb(format: RenderFormat) -> pb::ReportFormat {
    match format {
        RenderFormat::Freeform => pb::ReportFormat::Freeform,
        RenderFormat::SemiStructured => pb::ReportFormat::SemiStructured,
        RenderFormat::StructuredSoft => pb::ReportFormat::StructuredSoft,
    }
}

/// The tool error of a failed remote call, by its code's name (see
/// [`kind_text`]): an invalid argument the server typed with its engine
/// parameter ([`PARAM_KEY`]) names the MCP argument, as in process
/// ([`json::named`]); the message is otherwise the server's, and never
/// read for a name.
pub(super) fn tool_error(s: Status) -> String {
    let message = match typed_param(&s) {
        Some(param) if s.code() == Code::InvalidArgument => {
            let e = AppError::InvalidArgument { message: s.message().to_string(), param: Some(param) };
            json::named(e).message().to_string()
        }
        _ => s.message().to_string(),
    };
    kind_text(&format!("{:?}", s.code()), message)
}

/// The engine parameter a server's status names in its [`PARAM_KEY`] metadata.
fn typed_param(s: &Status) -> Option<Param> {
    let name = s.metadata().get(PARAM_KEY)?.to_str().ok()?;
    Some(Param::from_wire(name))
}

/// `Compress`, or OpenSession when no token continues a session.
pub(super) async fn compress(
    c: &Conn,
    a: CompressContextArgs,
    budget: Budget,
    session_id: String,
    session_token: String,
) -> Result<(CompressOutput, String), String> {
    let open = session_token.is_empty();
    let list_dropped = a.list_dropped;
    let r = compress_request(a, budget, session_id, session_token);
    let mut resp = if open {
        // a retry after the server opened it would find the id taken
        let out = remote(c, "OpenSession", false, move |mut cl| {
            let compress = Some(r.clone());
            async move { cl.open_session(pb::OpenSessionRequest { compress }).await }
        })
        .await;
        out.and_then(|o| o.result.ok_or_else(|| Status::internal("OpenSession answered no result")))
    } else {
        // continuing a session (a token): safe to retry
        remote(c, "Compress", true, move |mut cl| {
            let r = r.clone();
            async move { cl.compress(r).await }
        })
        .await
    }
    .map_err(tool_error)?;
    let token = std::mem::take(&mut resp.session_token);
    Ok((view::compress_view(resp, list_dropped).map_err(tool_error)?, token))
}

/// `RequestContext` (advances the session: not retried on a broken connection).
pub(super) async fn request_context(c: &Conn, a: RequestMoreArgs, session_token: String) -> Result<MoreOutput, String> {
    let confidence = crate::app::json::more_confidence(&a).map_err(|e| e.to_string())?;
    let r = pb::ContextRequest {
        request_id: String::new(),
        session_id: a.session,
        session_token,
        specific_question: a.question,
        current_confidence: confidence,
        reasoning: a.reasoning,
        chunk_ids: a.chunk_ids,
        report: a.report.unwrap_or_default(),
        max_tokens: a.max_tokens.unwrap_or(0),
    };
    let resp = remote(c, "RequestContext", false, move |mut cl| {
        let r = r.clone();
        async move { cl.request_context(r).await }
    })
    .await
    .map_err(tool_error)?;
    Ok(view::more_view(resp))
}

/// `CountTokens`.
pub(super) async fn count_tokens(c: &Conn, text: String, tokenizer: &str) -> Result<Vec<u32>, String> {
    let r = pb::CountTokensRequest { texts: vec![text], tokenizer: tokenizer.to_string() };
    let resp = remote(c, "CountTokens", true, move |mut cl| {
        let r = r.clone();
        async move { cl.count_tokens(r).await }
    })
    .await
    .map_err(tool_error)?;
    Ok(resp.tokens)
}

/// `Embed`.
pub(super) async fn embed(c: &Conn, texts: Vec<String>, query: bool) -> Result<Embeddings, String> {
    let kind = if query { pb::InputKind::Query } else { pb::InputKind::Passage };
    let r = pb::EmbedRequest { texts, kind: kind as i32, windows: true };
    let resp = remote(c, "Embed", true, move |mut cl| {
        let r = r.clone();
        async move { cl.embed(r).await }
    })
    .await
    .map_err(tool_error)?;
    let rows = resp.embeddings.into_iter().map(|e| (e.values, e.tokens, e.windows)).collect();
    Ok(Embeddings { model: resp.model, rows })
}

/// One call on a clone of `conn` (clones share the channel), with its retries.
async fn remote<T, F, Fut>(conn: &Conn, what: &str, idempotent: bool, call: F) -> Result<T, Status>
where
    F: FnMut(crate::client::Client) -> Fut,
    Fut: std::future::Future<Output = Result<tonic::Response<T>, Status>>,
{
    let mut c = conn.clone();
    c.try_call(what, idempotent, call).await.map_err(|(s, retries)| {
        if retries > 0 {
            // the metadata (the typed parameter, the retry hint) stays
            Status::with_metadata(s.code(), format!("{} (after {retries} retries)", s.message()), s.metadata().clone())
        } else if s.code() == Code::Unavailable && s.message().is_empty() {
            Status::unavailable("the scd server (--server) is not reachable")
        } else {
            s
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A server's typed invalid argument, through the headers that carry it
    /// on the wire, to the MCP tool error: `budget`, by the typed field.
    #[test]
    fn a_servers_typed_parameter_names_the_mcp_argument() {
        let sent = Status::from(AppError::invalid_param(Param::MaxContextTokens, "must be at least 1"));
        let mut headers = http::HeaderMap::new();
        sent.add_header(&mut headers).unwrap();
        assert_eq!(headers.get(PARAM_KEY).unwrap(), "max_context_tokens");
        let got = Status::from_header_map(&headers).unwrap();
        assert_eq!((got.code(), got.message()), (Code::InvalidArgument, "max_context_tokens: must be at least 1"));
        assert_eq!(typed_param(&got), Some(Param::MaxContextTokens));
        assert_eq!(tool_error(got), "budget: must be at least 1");
        // the same text untyped passes as it came: no name is read out of it
        let untyped = Status::invalid_argument("max_context_tokens: must be at least 1");
        assert_eq!(tool_error(untyped), "max_context_tokens: must be at least 1");
        // a retried call's status keeps the typed parameter
        let retried = Status::with_metadata(
            Code::InvalidArgument,
            "max_context_tokens: x (after 1 retries)",
            sent.metadata().clone(),
        );
        assert_eq!(tool_error(retried), "budget: x (after 1 retries)");
    }
}
