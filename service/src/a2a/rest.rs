//! The HTTP+JSON binding (A2A v1.0 REST): the paths of `a2a.proto`'s HTTP
//! annotations, bodies and results in the same JSON as JSON-RPC; errors are
//! `{"error": {"code", "status", "message"}}` with the spec's HTTP status.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, StatusCode, Uri};
use axum::response::Response;
use serde_json::{json, Map, Value};

use super::jsonrpc::{json_response, params, read_body, sse};
use super::{Agent, Caller, Error};

/// The error body; overload is 429 with `Retry-After` (whole seconds,
/// rounded up) and `retryAfterMs` in the body.
pub(crate) fn error(e: Error) -> Response {
    let status = e.http_status();
    let mut body = json!({"error": {"code": status.as_u16(), "status": status.canonical_reason().unwrap_or(""), "message": e.to_string(), "a2aCode": e.code()}});
    let retry = e.retry_after_ms();
    if let Some(ms) = retry {
        body["error"]["retryAfterMs"] = json!(ms);
    }
    let mut r = json_response(status, &body);
    if let Some(ms) = retry {
        r.headers_mut().insert(header::RETRY_AFTER, ms.div_ceil(1000).max(1).into());
    }
    r
}

fn done(r: Result<Value, Error>) -> Response {
    match r {
        Ok(v) => json_response(StatusCode::OK, &v),
        Err(e) => error(e),
    }
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < b.len() => {
                match u8::from_str_radix(std::str::from_utf8(&b[i + 1..i + 3]).unwrap_or("zz"), 16) {
                    Ok(v) => {
                        out.push(v);
                        i += 2;
                    }
                    Err(_) => out.push(b'%'),
                }
            }
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The query string as a JSON object of the request type's keys: numbers
/// and booleans where they parse as such, `A2A-Version` left out.
fn query_object(q: Option<&str>, numeric: &[&str], boolean: &[&str]) -> Result<Value, Error> {
    let mut m = Map::new();
    for kv in q.unwrap_or("").split('&').filter(|s| !s.is_empty()) {
        let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
        let (k, v) = (percent_decode(k), percent_decode(v));
        if k.eq_ignore_ascii_case("A2A-Version") {
            continue;
        }
        let val = if numeric.contains(&k.as_str()) {
            json!(v.parse::<i64>().map_err(|_| Error::InvalidParams(format!("{k}: not an integer")))?)
        } else if boolean.contains(&k.as_str()) {
            json!(v.parse::<bool>().map_err(|_| Error::InvalidParams(format!("{k}: not true or false")))?)
        } else {
            json!(v)
        };
        m.insert(k, val);
    }
    Ok(Value::Object(m))
}

async fn body_json(agent: &Agent, body: Body) -> Result<Value, Error> {
    let raw = read_body(body, agent.config().max_request_bytes).await?;
    let v = serde_json::from_slice(&raw).map_err(|e| Error::Parse(e.to_string()))?;
    unique_keys(&raw)?;
    Ok(v)
}

/// A repeated key would leave only its last value in the parsed body
/// (`"confidential": true, "confidential": false` a public field).
fn unique_keys(raw: &[u8]) -> Result<(), Error> {
    scd_engine::context::check_unique_keys(raw).map_err(|e| Error::InvalidParams(e.to_string()))
}

/// `GET /.well-known/agent-card.json`: URLs on `--a2a-public-url` or the
/// listener's own address, never the request's Host header (a client
/// could name any host there, and a cache would hand that card to others).
pub async fn card(State(agent): State<Arc<Agent>>) -> Response {
    json_response(StatusCode::OK, &agent.card(&agent.config().base_url()))
}

/// `POST /message:send`.
pub async fn send(State(agent): State<Arc<Agent>>, who: Caller, headers: HeaderMap, uri: Uri, body: Body) -> Response {
    let r = async {
        Agent::check_version(&headers, uri.query())?;
        let req = params(body_json(&agent, body).await?)?;
        agent.send(req, who).await.map(|t| json!({"task": t}))
    };
    done(r.await)
}

/// `POST /message:stream`.
pub async fn stream(
    State(agent): State<Arc<Agent>>,
    who: Caller,
    headers: HeaderMap,
    uri: Uri,
    body: Body,
) -> Response {
    let r = async {
        Agent::check_version(&headers, uri.query())?;
        let req = params(body_json(&agent, body).await?)?;
        agent.send_streaming(req, who)
    };
    match r.await {
        Ok(s) => sse(s, |v| v),
        Err(e) => error(e),
    }
}

/// `GET /tasks`.
pub async fn list(State(agent): State<Arc<Agent>>, who: Caller, headers: HeaderMap, uri: Uri) -> Response {
    let r = (|| {
        Agent::check_version(&headers, uri.query())?;
        let q = query_object(uri.query(), &["pageSize", "historyLength"], &["includeArtifacts"])?;
        agent.list(params(q)?, &who)
    })();
    done(r)
}

/// `GET /tasks/{id}` and `GET /tasks/{id}:subscribe`.
pub async fn get_task(
    State(agent): State<Arc<Agent>>,
    who: Caller,
    Path(id): Path<String>,
    headers: HeaderMap,
    uri: Uri,
) -> Response {
    if let Err(e) = Agent::check_version(&headers, uri.query()) {
        return error(e);
    }
    if let Some(id) = id.strip_suffix(":subscribe") {
        return match agent
            .subscribe(super::types::TaskIdRequest { tenant: String::new(), id: id.to_string(), metadata: None }, &who)
        {
            Ok(s) => sse(s, |v| v),
            Err(e) => error(e),
        };
    }
    let r = (|| {
        let mut q = query_object(uri.query(), &["historyLength"], &[])?;
        q["id"] = json!(id);
        agent.get(params(q)?, &who).map(|t| json!(t))
    })();
    done(r)
}

/// `POST /tasks/{id}:cancel`.
pub async fn post_task(
    State(agent): State<Arc<Agent>>,
    who: Caller,
    Path(id): Path<String>,
    headers: HeaderMap,
    uri: Uri,
    body: Body,
) -> Response {
    let r = async {
        Agent::check_version(&headers, uri.query())?;
        let Some(id) = id.strip_suffix(":cancel") else {
            let id = scd_engine::context::shown_name(&id);
            return Err(Error::MethodNotFound(format!("POST /tasks/{id}: did you mean /tasks/{{id}}:cancel?")));
        };
        let raw = read_body(body, agent.config().max_request_bytes).await?;
        let mut v = if raw.iter().all(u8::is_ascii_whitespace) {
            json!({})
        } else {
            let v = serde_json::from_slice(&raw).map_err(|e| Error::Parse(e.to_string()))?;
            unique_keys(&raw)?;
            v
        };
        if !v.is_object() {
            return Err(Error::InvalidParams("the body must be a JSON object".into()));
        }
        v["id"] = json!(id);
        agent.cancel(params(v)?, &who).map(|t| json!(t))
    };
    done(r.await)
}

/// `GET /extendedAgentCard`.
pub async fn extended_card() -> Response {
    error(Error::NoExtendedCard)
}

/// Push notification configuration routes.
pub async fn push() -> Response {
    error(Error::PushNotSupported)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_strings_become_typed_objects() {
        let q = query_object(
            Some("pageSize=2&contextId=a%2Fb&includeArtifacts=true&A2A-Version=1.0"),
            &["pageSize"],
            &["includeArtifacts"],
        )
        .unwrap();
        assert_eq!(q, json!({"pageSize": 2, "contextId": "a/b", "includeArtifacts": true}));
        let e = query_object(Some("pageSize=x"), &["pageSize"], &[]).unwrap_err();
        assert_eq!(e.to_string(), "invalid params: pageSize: not an integer");
    }

    #[test]
    fn overload_is_429_with_retry_after() {
        let r = error(Error::Overloaded { what: "compress queue is full".into(), retry_after_ms: 100 });
        assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(r.headers()[header::RETRY_AFTER], "1");
        let r = error(Error::Exhausted {
            what: "task store",
            limit: 1,
            unit: "tasks",
            flag: "--a2a-max-tasks",
            retry_after_s: 2,
        });
        assert_eq!(r.headers()[header::RETRY_AFTER], "2");
        assert!(error(Error::TaskNotFound("x".into())).headers().get(header::RETRY_AFTER).is_none());
    }
}
