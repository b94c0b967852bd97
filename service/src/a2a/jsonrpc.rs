//! The JSON-RPC 2.0 binding (`POST /`): one request per body (no batches,
//! no notifications: every A2A method answers), A2A v1.0 method names.
//! Malformed requests get JSON-RPC's own codes (-32700, -32600, -32601,
//! -32602) with the request's id when it could be read.

use std::convert::Infallible;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::http::{header, HeaderMap, Uri};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use serde::de::DeserializeOwned;
use serde_json::{json, Value};
use tokio_stream::StreamExt;

use super::{Agent, Caller, Error};

/// A JSON response.
pub(crate) fn json_response(status: axum::http::StatusCode, v: &Value) -> Response {
    (status, [(header::CONTENT_TYPE, "application/json")], v.to_string()).into_response()
}

fn reply(id: &Value, result: Result<Value, Error>) -> Response {
    let body = match result {
        Ok(r) => json!({"jsonrpc": "2.0", "id": id, "result": r}),
        Err(e) => json!({"jsonrpc": "2.0", "id": id, "error": e.to_json()}),
    };
    json_response(axum::http::StatusCode::OK, &body)
}

/// Reads a request body of at most `max` bytes.
pub(crate) async fn read_body(body: Body, max: usize) -> Result<bytes::Bytes, Error> {
    axum::body::to_bytes(body, max).await.map_err(|_| {
        Error::InvalidRequest(format!("the request body is over {max} bytes (--max-request-bytes) or was cut off"))
    })
}

/// Parses `params` strictly; errors name the JSON path.
pub(crate) fn params<T: DeserializeOwned>(v: Value) -> Result<T, Error> {
    serde_path_to_error::deserialize(v).map_err(|e| {
        let path = crate::input::shown_path(e.path());
        let at = if path == "." { "params".to_string() } else { format!("params.{path}") };
        Error::InvalidParams(format!("{at}: {}", crate::input::redact_json_error(&e.into_inner().to_string())))
    })
}

/// An SSE response of `items`, each wrapped by `wrap`.
pub(crate) fn sse(
    items: tokio_stream::wrappers::ReceiverStream<Value>,
    wrap: impl Fn(Value) -> Value + Send + 'static,
) -> Response {
    let events = items.map(move |v| Ok::<_, Infallible>(Event::default().data(wrap(v).to_string())));
    Sse::new(events).keep_alive(KeepAlive::default()).into_response()
}

/// The request's id, method and params, checked in this order; the error
/// reply otherwise.
fn parse_request(raw: &[u8]) -> Result<(Value, String, Value), Box<Response>> {
    let v: Value = match serde_json::from_slice(raw) {
        Ok(v) => v,
        Err(e) => return Err(Box::new(reply(&Value::Null, Err(Error::Parse(e.to_string()))))),
    };
    let Value::Object(mut req) = v else {
        let why = if v.is_array() {
            "batch requests are not supported; send one request per body"
        } else {
            "the body must be a JSON object"
        };
        return Err(Box::new(reply(&Value::Null, Err(Error::InvalidRequest(why.into())))));
    };
    let id = match req.get("id") {
        Some(id @ (Value::String(_) | Value::Number(_) | Value::Null)) => id.clone(),
        Some(_) => {
            return Err(Box::new(reply(
                &Value::Null,
                Err(Error::InvalidRequest("id: must be a string, a number or null".into())),
            )))
        }
        None => {
            return Err(Box::new(reply(
                &Value::Null,
                Err(Error::InvalidRequest("id: required (every A2A method answers)".into())),
            )))
        }
    };
    // a repeated key would leave only its last value in the map
    // (`"confidential": true, "confidential": false` a public field)
    if let Err(e) = scd_engine::context::check_unique_keys(raw) {
        let e = e.to_string();
        return Err(Box::new(reply(
            &id,
            Err(if e.starts_with("params") { Error::InvalidParams(e) } else { Error::InvalidRequest(e) }),
        )));
    }
    if let Some(k) = req.keys().find(|k| !["jsonrpc", "method", "params", "id"].contains(&k.as_str())) {
        return Err(Box::new(reply(
            &id,
            Err(Error::InvalidRequest(format!(
                "{}: unknown key (a request has jsonrpc, method, params, id)",
                crate::input::echoed_key(k)
            ))),
        )));
    }
    if req.get("jsonrpc") != Some(&json!("2.0")) {
        return Err(Box::new(reply(&id, Err(Error::InvalidRequest("jsonrpc: must be \"2.0\"".into())))));
    }
    let method = match req.remove("method") {
        Some(Value::String(m)) if !m.is_empty() => m,
        _ => {
            return Err(Box::new(reply(&id, Err(Error::InvalidRequest("method: required, a non-empty string".into())))))
        }
    };
    let p = match req.remove("params") {
        None => json!({}),
        Some(p @ Value::Object(_)) => p,
        Some(_) => return Err(Box::new(reply(&id, Err(Error::InvalidParams("params: must be an object".into()))))),
    };
    Ok((id, method, p))
}

/// `POST /`.
pub async fn handle(
    State(agent): State<Arc<Agent>>,
    who: Caller,
    headers: HeaderMap,
    uri: Uri,
    body: Body,
) -> Response {
    let raw = match read_body(body, agent.config().max_request_bytes).await {
        Ok(b) => b,
        Err(e) => return reply(&Value::Null, Err(e)),
    };
    let (id, method, p) = match parse_request(&raw) {
        Ok(r) => r,
        Err(r) => return *r,
    };
    if let Err(e) = Agent::check_version(&headers, uri.query()) {
        return reply(&id, Err(e));
    }
    // a streaming method's error goes in the stream the client asked for
    let wants_sse =
        headers.get(header::ACCEPT).and_then(|a| a.to_str().ok()).is_some_and(|a| a.contains("text/event-stream"));
    let stream_error = |id: Value, e: Error| {
        if wants_sse {
            let (tx, rx) = tokio::sync::mpsc::channel(1);
            let _ = tx.try_send(json!({"jsonrpc": "2.0", "id": id, "error": e.to_json()}));
            sse(tokio_stream::wrappers::ReceiverStream::new(rx), |v| v)
        } else {
            reply(&id, Err(e))
        }
    };
    let result = match method.as_str() {
        "SendMessage" => match params(p) {
            Ok(r) => agent.send(r, who).await.map(|t| json!({"task": t})),
            Err(e) => Err(e),
        },
        "SendStreamingMessage" => {
            return match params(p).and_then(|r| agent.send_streaming(r, who)) {
                Ok(s) => sse(s, move |v| json!({"jsonrpc": "2.0", "id": id, "result": v})),
                Err(e) => stream_error(id, e),
            }
        }
        "SubscribeToTask" => {
            return match params(p).and_then(|r| agent.subscribe(r, &who)) {
                Ok(s) => sse(s, move |v| json!({"jsonrpc": "2.0", "id": id, "result": v})),
                Err(e) => stream_error(id, e),
            }
        }
        "GetTask" => params(p).and_then(|r| agent.get(r, &who)).map(|t| json!(t)),
        "CancelTask" => params(p).and_then(|r| agent.cancel(r, &who)).map(|t| json!(t)),
        "ListTasks" => params(p).and_then(|r| agent.list(r, &who)),
        "GetExtendedAgentCard" => Err(Error::NoExtendedCard),
        "CreateTaskPushNotificationConfig"
        | "GetTaskPushNotificationConfig"
        | "ListTaskPushNotificationConfigs"
        | "DeleteTaskPushNotificationConfig" => Err(Error::PushNotSupported),
        m => Err(Error::MethodNotFound(format!(
            "{}: this agent serves SendMessage, SendStreamingMessage, GetTask, ListTasks, CancelTask, SubscribeToTask",
            scd_engine::context::shown_name(m)
        ))),
    };
    reply(&id, result)
}
