//! Errors in OpenAI's shape, `{"error": {"message", "type", "param",
//! "code"}}`, with the HTTP status of the core's error kind.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use schemars::JsonSchema;
use serde::Serialize;

use super::SESSION_TOKEN_HEADER;
use crate::app::AppError;

/// A REST error: the status, the body, and for 429 the retry hint.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    detail: ErrorDetail,
    retry_after_ms: Option<u64>,
}

/// The body of every REST error.
#[derive(Debug, Serialize, JsonSchema)]
pub struct ErrorBody {
    /// What went wrong.
    pub error: ErrorDetail,
}

/// What went wrong: OpenAI's error object.
#[derive(Debug, Serialize, JsonSchema)]
pub struct ErrorDetail {
    /// Names the field and the limit; never quotes a value of the request.
    pub message: String,
    /// `invalid_request_error`, `authentication_error`, `permission_error`,
    /// `not_found_error`, `conflict_error`, `rate_limit_error`,
    /// `timeout_error`, `service_unavailable` or `api_error`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The field at fault (a JSON path such as `context.fields[2].kind`), if any.
    pub param: Option<String>,
    /// The gRPC code behind it (`INVALID_ARGUMENT`, `RESOURCE_EXHAUSTED`, …).
    pub code: Option<String>,
}

impl ApiError {
    fn new(status: StatusCode, kind: &str, message: String, code: Option<&str>) -> ApiError {
        let param = param_of(&message);
        ApiError {
            status,
            detail: ErrorDetail { message, kind: kind.into(), param, code: code.map(str::to_string) },
            retry_after_ms: None,
        }
    }

    /// A bad request whose `message` starts with the field (`budget: …`).
    pub fn invalid(message: String) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, "invalid_request_error", message, Some("INVALID_ARGUMENT"))
    }

    /// A body over `max` bytes.
    pub fn too_large(max: usize) -> ApiError {
        let message = format!("body: over {max} bytes (--max-request-bytes) or cut off");
        ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, "invalid_request_error", message, Some("INVALID_ARGUMENT"))
    }

    /// A body not sent as JSON.
    pub fn unsupported_media_type() -> ApiError {
        let message = "Content-Type: must be application/json".to_string();
        ApiError::new(StatusCode::UNSUPPORTED_MEDIA_TYPE, "invalid_request_error", message, Some("INVALID_ARGUMENT"))
    }

    /// A session call without its token.
    pub fn session_token_missing() -> ApiError {
        ApiError::new(
            StatusCode::UNAUTHORIZED,
            "authentication_error",
            format!("{SESSION_TOKEN_HEADER}: required (the session_token the session was opened with)"),
            Some("UNAUTHENTICATED"),
        )
    }

    /// The HTTP status.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// The message.
    pub fn message(&self) -> &str {
        &self.detail.message
    }
}

/// The core's answer: its kind as an HTTP status, its message with the
/// field named as the JSON API names it (`budget`, `context.fields`, …;
/// [`crate::app::json::named`]) and, for a refusal for load, its retry hint
/// (1000 ms when it has none).
impl From<AppError> for ApiError {
    fn from(e: AppError) -> ApiError {
        let (status, kind) = match &e {
            AppError::InvalidArgument { .. } => (StatusCode::BAD_REQUEST, "invalid_request_error"),
            AppError::Unauthenticated { .. } => (StatusCode::UNAUTHORIZED, "authentication_error"),
            AppError::PermissionDenied { .. } => (StatusCode::FORBIDDEN, "permission_error"),
            AppError::NotFound { .. } => (StatusCode::NOT_FOUND, "not_found_error"),
            AppError::FailedPrecondition { .. } | AppError::Aborted { .. } => (StatusCode::CONFLICT, "conflict_error"),
            AppError::ResourceExhausted { .. } => (StatusCode::TOO_MANY_REQUESTS, "rate_limit_error"),
            AppError::DeadlineExceeded { .. } | AppError::Cancelled { .. } => {
                (StatusCode::GATEWAY_TIMEOUT, "timeout_error")
            }
            AppError::Unavailable { .. } => (StatusCode::SERVICE_UNAVAILABLE, "service_unavailable"),
            AppError::Internal { .. } => (StatusCode::INTERNAL_SERVER_ERROR, "api_error"),
        };
        let code = screaming(e.kind_name());
        let retry = e.retry_after_ms();
        let mut out = ApiError::new(status, kind, crate::app::json::named(e).to_string(), None);
        out.detail.code = Some(code);
        out.retry_after_ms = retry;
        if status == StatusCode::TOO_MANY_REQUESTS && out.retry_after_ms.is_none() {
            out.retry_after_ms = Some(1000);
        }
        out
    }
}

/// `ResourceExhausted` → `RESOURCE_EXHAUSTED`.
fn screaming(camel: &str) -> String {
    let mut out = String::with_capacity(camel.len() + 4);
    for (i, c) in camel.chars().enumerate() {
        if c.is_ascii_uppercase() && i > 0 {
            out.push('_');
        }
        out.push(c.to_ascii_uppercase());
    }
    out
}

/// The field a message starts with (`context.fields[2].kind: …`), if it
/// starts with one: a path without spaces before the first `": "`.
fn param_of(message: &str) -> Option<String> {
    let (head, _) = message.split_once(": ")?;
    let path =
        !head.is_empty() && head.len() <= 128 && head.chars().all(|c| c.is_ascii_alphanumeric() || "_.[]-".contains(c));
    path.then(|| head.to_string())
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = serde_json::to_string(&ErrorBody { error: self.detail }).unwrap_or_default();
        let mut r = (self.status, [(header::CONTENT_TYPE, "application/json")], body).into_response();
        if let Some(ms) = self.retry_after_ms {
            let h = r.headers_mut();
            h.insert(header::RETRY_AFTER, HeaderValue::from(ms.div_ceil(1000).max(1)));
            h.insert("retry-after-ms", HeaderValue::from(ms));
        }
        r
    }
}

impl aide::OperationOutput for ApiError {
    type Inner = ErrorBody;

    fn inferred_responses(
        ctx: &mut aide::generate::GenContext,
        operation: &mut aide::openapi::Operation,
    ) -> Vec<(Option<aide::openapi::StatusCode>, aide::openapi::Response)> {
        let Some(mut base) = <axum::Json<ErrorBody> as aide::OperationOutput>::operation_response(ctx, operation)
        else {
            return Vec::new();
        };
        [
            (400, "Invalid input: `param` names the field, `message` the limit"),
            (401, "Not authenticated (`--auth did-wba`), or a session call without its token"),
            (404, "No such session or model"),
            (413, "Body over --max-request-bytes"),
            (408, "The body did not arrive within --http-body-timeout-ms of the head; the connection is closed"),
            (415, "Body not sent as Content-Type: application/json"),
            (429, "Busy: retry after `Retry-After` seconds (`retry-after-ms` to the millisecond)"),
            (503, "The engine is unavailable, or every connection slot is held (then with `Retry-After`)"),
            (504, "The call ran past --http-request-timeout-ms and was cancelled"),
        ]
        .into_iter()
        .map(|(code, description)| {
            base.description = description.into();
            (Some(aide::openapi::StatusCode::Code(code)), base.clone())
        })
        .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_field_is_the_param_and_overload_carries_its_hint() {
        assert_eq!(param_of("context.fields[2].kind: unknown variant").as_deref(), Some("context.fields[2].kind"));
        assert_eq!(param_of("budget: must be at least 1").as_deref(), Some("budget"));
        assert_eq!(param_of("the encoder thread stopped: x"), None);
        let r = ApiError::from(AppError::exhausted("compress slots: all 8 busy", 1500)).into_response();
        assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(r.headers()[header::RETRY_AFTER], "2");
        assert_eq!(r.headers()["retry-after-ms"], "1500");
        let e = ApiError::from(AppError::invalid_param(scd_engine::Param::MaxContextTokens, "too big"));
        assert_eq!((e.status(), e.detail.param.as_deref()), (StatusCode::BAD_REQUEST, Some("budget")));
        assert_eq!(e.detail.code.as_deref(), Some("INVALID_ARGUMENT"));
        let gone = AppError::NotFound { message: "x".into() };
        assert_eq!(ApiError::from(gone).status(), StatusCode::NOT_FOUND);
    }
}
