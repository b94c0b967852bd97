//! Request bodies: read within `--max-request-bytes`, parsed strictly into
//! the JSON API's arguments ([`crate::app::json`], which MCP's tools parse
//! too: one definition of each argument), and documented in the OpenAPI
//! document by those types' own schemas.

use std::borrow::Cow;
use std::sync::Arc;

use axum::extract::{FromRequest, Request};
use schemars::{JsonSchema, Schema, SchemaGenerator};
use serde_json::{json, Map, Value};

use super::ApiError;
use crate::app::json::{compress_arguments, Args, Budget, CompressContextArgs, RequestMoreArgs};
use crate::app::Core;

/// A JSON object body parsed as `T` ([`RestBody::parse`]); a body not sent
/// as `Content-Type: application/json` is 415, one over
/// `--max-request-bytes` 413, one that is not a JSON object 400.
#[derive(Debug)]
pub struct Body<T>(pub T);

/// A type a REST body parses into, and the schema that documents it.
pub trait RestBody: Sized {
    /// Parses the body's object strictly; the error names the field.
    fn parse(body: Map<String, Value>) -> Result<Self, String>;
}

impl<T: RestBody> FromRequest<Arc<Core>> for Body<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, svc: &Arc<Core>) -> Result<Self, Self::Rejection> {
        // JSON only: a web page may POST text/plain or a form to a server on
        // this host without asking first (no CORS preflight); never JSON
        let json = req
            .headers()
            .get(axum::http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split(';').next())
            .is_some_and(|m| m.trim().eq_ignore_ascii_case("application/json"));
        if !json {
            return Err(ApiError::unsupported_media_type());
        }
        let max = svc.limits().max_request_bytes;
        let bytes = axum::body::to_bytes(req.into_body(), max).await.map_err(|_| ApiError::too_large(max))?;
        let value: Value = serde_json::from_slice(&bytes).map_err(|e| {
            ApiError::invalid(format!("body: not JSON ({})", crate::input::redact_json_error(&e.to_string())))
        })?;
        // a repeated key would leave only its last value in the map
        // (`"confidential": true, "confidential": false` a public field)
        scd_engine::context::check_unique_keys(&bytes).map_err(|e| ApiError::invalid(format!("body.{e}")))?;
        let Value::Object(map) = value else {
            return Err(ApiError::invalid("body: must be a JSON object".into()));
        };
        // MCP's "arguments" are the body here
        T::parse(map).map(Body).map_err(|m| match m.strip_prefix("arguments:") {
            Some(rest) => ApiError::invalid(format!("body:{rest}")),
            None => ApiError::invalid(m),
        })
    }
}

impl<T: JsonSchema> aide::OperationInput for Body<T> {
    fn operation_input(ctx: &mut aide::generate::GenContext, operation: &mut aide::openapi::Operation) {
        <axum::Json<T> as aide::OperationInput>::operation_input(ctx, operation);
    }
}

/// `POST /v1/compress`'s body: `compress_context`'s arguments, with the
/// budget as tokens (`budget`) or as a share of the context (`rate`).
#[derive(Debug)]
pub struct CompressBody {
    /// The arguments, checked: exactly one of `budget` and `rate`, in range.
    pub args: CompressContextArgs,
    /// What they ask to send.
    pub budget: Budget,
}

impl RestBody for CompressBody {
    fn parse(body: Map<String, Value>) -> Result<Self, String> {
        if body.get("session").is_some_and(|s| s.as_str() == Some("")) {
            return Err("session: must not be empty (leave it out to open one under a random id)".into());
        }
        let (args, budget) = compress_arguments(Args::from_map(body))?;
        Ok(CompressBody { args, budget })
    }
}

impl JsonSchema for CompressBody {
    fn schema_name() -> Cow<'static, str> {
        "CompressRequest".into()
    }

    fn json_schema(generator: &mut SchemaGenerator) -> Schema {
        let mut schema = CompressContextArgs::json_schema(generator);
        if let Some(o) = schema.as_object_mut() {
            o.insert("description".into(), json!("compress_context's arguments; exactly one of budget or rate."));
        }
        schema
    }
}

/// `schema` with `field` no longer required (and gone, with `drop`), and
/// `add` among its properties.
fn edited(mut schema: Schema, field: &str, add: Option<(&str, Value)>, drop: bool) -> Schema {
    if let Some(o) = schema.as_object_mut() {
        if let Some(Value::Object(props)) = o.get_mut("properties") {
            if drop {
                props.remove(field);
            }
            if let Some((name, value)) = add {
                props.insert(name.into(), value);
            }
        }
        if let Some(Value::Array(required)) = o.get_mut("required") {
            required.retain(|r| r != field);
        }
    }
    schema
}

/// `POST /v1/sessions/{session_id}/more`'s body: `request_more_context`'s
/// arguments, the session named by the path.
#[derive(Debug)]
pub struct MoreBody(pub RequestMoreArgs);

impl RestBody for MoreBody {
    fn parse(mut body: Map<String, Value>) -> Result<Self, String> {
        if body.contains_key("session") {
            return Err("session: named in the path, not the body".into());
        }
        body.insert("session".into(), json!("-"));
        Args::<RequestMoreArgs>::from_map(body).parse().map(MoreBody)
    }
}

impl JsonSchema for MoreBody {
    fn schema_name() -> Cow<'static, str> {
        "MoreRequest".into()
    }

    fn json_schema(generator: &mut SchemaGenerator) -> Schema {
        edited(RequestMoreArgs::json_schema(generator), "session", None, true)
    }
}
