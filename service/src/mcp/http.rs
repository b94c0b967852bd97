//! The streamable HTTP transport's bounds: at most `--max-http-sessions`
//! MCP sessions at once ([`CappedSessions`], rmcp's in-memory session
//! manager with a cap), and past it a new `initialize` is answered HTTP 503
//! with `Retry-After` and a JSON-RPC error saying so ([`refuse_when_full`]).
//! Connections are bounded by the listener ([`crate::http::serve_router`]).
//!
//! A session is its opener's: [`bind_to_address`] keeps the address each
//! `initialize` came from, and a request naming the session from another
//! address is answered 404 as for an unknown session. [`check_origin`]
//! refuses (403) a request whose `Origin` is neither a loopback origin nor
//! one named by `--allowed-origins` (MCP 2025-06-18, against DNS
//! rebinding from a browser).

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use rmcp::model::{ClientJsonRpcMessage, ServerJsonRpcMessage};
use rmcp::transport::streamable_http_server::session::local::{LocalSessionManager, LocalSessionManagerError};
use rmcp::transport::streamable_http_server::session::{ServerSseMessage, SessionId, SessionManager};
use tokio_stream::Stream;

/// Seconds a client refused at the session cap is told to wait.
pub const RETRY_AFTER_S: u64 = 5;

/// The header naming the MCP session of a request.
pub const SESSION_HEADER: &str = "mcp-session-id";

/// Why a session operation failed.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    /// `max` sessions are open.
    #[error(
        "too many MCP sessions: {max} open (--max-http-sessions); retry after {RETRY_AFTER_S} s, or end an idle \
         session (DELETE /mcp with its Mcp-Session-Id)"
    )]
    Full {
        /// The cap.
        max: usize,
    },
    /// From rmcp's session manager.
    #[error(transparent)]
    Local(#[from] LocalSessionManagerError),
}

/// rmcp's [`LocalSessionManager`] holding at most `max` sessions (each one
/// a worker task that lives until the client ends it or it is idle for
/// rmcp's keep-alive, 5 minutes).
pub struct CappedSessions {
    inner: LocalSessionManager,
    max: usize,
    /// Serializes creation, so that the count checked is the count kept.
    create: tokio::sync::Mutex<()>,
}

impl CappedSessions {
    /// At most `max` (at least 1) sessions.
    pub fn new(max: usize) -> Arc<Self> {
        Arc::new(Self { inner: LocalSessionManager::default(), max: max.max(1), create: tokio::sync::Mutex::new(()) })
    }

    /// Sessions open now.
    pub async fn open(&self) -> usize {
        self.inner.sessions.read().await.len()
    }

    /// Whether a new session would be refused.
    pub async fn is_full(&self) -> bool {
        self.open().await >= self.max
    }
}

impl SessionManager for CappedSessions {
    type Error = SessionError;
    type Transport = <LocalSessionManager as SessionManager>::Transport;

    async fn create_session(&self) -> Result<(SessionId, Self::Transport), Self::Error> {
        let _one_at_a_time = self.create.lock().await;
        if self.is_full().await {
            return Err(SessionError::Full { max: self.max });
        }
        Ok(self.inner.create_session().await?)
    }

    async fn initialize_session(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<ServerJsonRpcMessage, Self::Error> {
        Ok(self.inner.initialize_session(id, message).await?)
    }

    async fn has_session(&self, id: &SessionId) -> Result<bool, Self::Error> {
        Ok(self.inner.has_session(id).await?)
    }

    async fn close_session(&self, id: &SessionId) -> Result<(), Self::Error> {
        Ok(self.inner.close_session(id).await?)
    }

    async fn create_stream(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        Ok(self.inner.create_stream(id, message).await?)
    }

    async fn accept_message(&self, id: &SessionId, message: ClientJsonRpcMessage) -> Result<(), Self::Error> {
        Ok(self.inner.accept_message(id, message).await?)
    }

    async fn create_standalone_stream(
        &self,
        id: &SessionId,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        Ok(self.inner.create_standalone_stream(id).await?)
    }

    async fn resume(
        &self,
        id: &SessionId,
        last_event_id: String,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        Ok(self.inner.resume(id, last_event_id).await?)
    }
}

/// What [`refuse_when_full`] needs.
#[derive(Clone)]
pub struct Gate {
    /// The sessions.
    pub sessions: Arc<CappedSessions>,
    /// `--max-request-bytes`: the most of a body read to see whether it is
    /// an `initialize`.
    pub max_body_bytes: usize,
}

/// Middleware: while the sessions are at their cap, a POST without
/// `Mcp-Session-Id` carrying an `initialize` request is answered 503 with
/// `Retry-After` and a JSON-RPC error naming the limit (rather than the
/// 500 rmcp gives a failed session creation). Everything else passes.
pub async fn refuse_when_full(State(gate): State<Gate>, req: Request, next: Next) -> Response {
    if req.method() != Method::POST || req.headers().contains_key(SESSION_HEADER) || !gate.sessions.is_full().await {
        return next.run(req).await;
    }
    let (parts, body) = req.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, gate.max_body_bytes).await else {
        return too_large(gate.max_body_bytes);
    };
    match serde_json::from_slice::<Probe>(&bytes) {
        Ok(Probe { method: Some(m), id }) if m == "initialize" => {
            let msg = SessionError::Full { max: gate.sessions.max }.to_string();
            tracing::warn!(max = gate.sessions.max, "MCP initialize refused: sessions at --max-http-sessions");
            let body = serde_json::json!({
                "jsonrpc": "2.0",
                "id": id.unwrap_or(serde_json::Value::Null),
                "error": {"code": -32000, "message": msg},
            });
            (
                StatusCode::SERVICE_UNAVAILABLE,
                [
                    (header::CONTENT_TYPE, HeaderValue::from_static("application/json")),
                    (header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_S)),
                ],
                body.to_string(),
            )
                .into_response()
        }
        _ => next.run(Request::from_parts(parts, Body::from(bytes))).await,
    }
}

/// The part of a JSON-RPC request the middlewares look at.
#[derive(serde::Deserialize)]
struct Probe {
    method: Option<String>,
    id: Option<serde_json::Value>,
}

fn too_large(max: usize) -> Response {
    (StatusCode::PAYLOAD_TOO_LARGE, format!("request body over {max} bytes (--max-request-bytes)\n")).into_response()
}

/// Middleware: a POST whose body repeats a key in any object is answered
/// HTTP 400 with a JSON-RPC error naming the key's path
/// (`params.arguments.context.fields[0].confidential: duplicate key; …`).
/// rmcp reads a request into maps that keep a repeated key's last value,
/// so `"confidential": true, "confidential": false` would reach the tools
/// as a public field. The state is `--max-request-bytes`.
pub async fn refuse_duplicate_keys(State(max_body_bytes): State<usize>, req: Request, next: Next) -> Response {
    if req.method() != Method::POST {
        return next.run(req).await;
    }
    let (parts, body) = req.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, max_body_bytes).await else {
        return too_large(max_body_bytes);
    };
    let Err(e) = scd_engine::context::check_unique_keys(&bytes) else {
        return next.run(Request::from_parts(parts, Body::from(bytes))).await;
    };
    let msg = e.to_string();
    let code = if msg.starts_with("params") { -32602 } else { -32600 };
    let id = serde_json::from_slice::<Probe>(&bytes).ok().and_then(|p| p.id).unwrap_or(serde_json::Value::Null);
    let body = serde_json::json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": msg}});
    (StatusCode::BAD_REQUEST, [(header::CONTENT_TYPE, HeaderValue::from_static("application/json"))], body.to_string())
        .into_response()
}

/// The address each MCP session was opened from.
#[derive(Clone)]
pub struct Owners {
    by_session: Arc<Mutex<HashMap<String, Option<IpAddr>>>>,
    sessions: Arc<CappedSessions>,
}

impl Owners {
    /// Owners of `sessions`' sessions.
    pub fn new(sessions: Arc<CappedSessions>) -> Self {
        Self { by_session: Arc::default(), sessions }
    }

    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<String, Option<IpAddr>>> {
        self.by_session.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Keeps `id`'s owner; past twice the cap, forgets the sessions gone.
    async fn insert(&self, id: String, owner: Option<IpAddr>) {
        if self.map().len() >= 2 * self.sessions.max {
            let live = self.sessions.inner.sessions.read().await;
            self.map().retain(|k, _| live.keys().any(|l| l.as_ref() == k));
        }
        self.map().insert(id, owner);
    }
}

/// The caller's IP address, as the listener put it in the request.
fn peer_ip(req: &Request) -> Option<IpAddr> {
    req.extensions().get::<ConnectInfo<SocketAddr>>().map(|c| c.0.ip().to_canonical())
}

/// Middleware: an `Mcp-Session-Id` works only from the address that opened
/// the session; from another one the answer is rmcp's 404 for an unknown
/// session, so the id reveals nothing.
pub async fn bind_to_address(State(owners): State<Owners>, req: Request, next: Next) -> Response {
    let ip = peer_ip(&req);
    let named = req.headers().get(SESSION_HEADER).and_then(|v| v.to_str().ok()).map(str::to_string);
    match named {
        Some(id) => {
            let owner = owners.map().get(&id).copied();
            if owner.is_some_and(|o| o != ip) {
                return (StatusCode::NOT_FOUND, "Not Found: Session not found").into_response();
            }
            let closing = req.method() == Method::DELETE;
            let r = next.run(req).await;
            if closing && r.status().is_success() {
                owners.map().remove(&id);
            }
            r
        }
        None => {
            let r = next.run(req).await;
            if let Some(id) = r.headers().get(SESSION_HEADER).and_then(|v| v.to_str().ok()) {
                owners.insert(id.to_string(), ip).await;
            }
            r
        }
    }
}

/// Whether `origin` (`scheme://host[:port]`) is a loopback origin: http or
/// https to `localhost`, 127.0.0.0/8 or `[::1]`.
fn is_loopback_origin(origin: &str) -> bool {
    let Some(rest) = origin.strip_prefix("http://").or_else(|| origin.strip_prefix("https://")) else {
        return false;
    };
    let host = match rest.strip_prefix('[') {
        Some(v6) => v6.split_once(']').map_or("", |(h, _)| h),
        None => rest.split_once(':').map_or(rest, |(h, _)| h),
    };
    host.eq_ignore_ascii_case("localhost") || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// Whether a request with `origin` may be served: a loopback origin, or one
/// of `allowed` (`--allowed-origins`, compared without a trailing `/` and
/// case-insensitively).
pub fn origin_allowed(origin: &str, allowed: &[String]) -> bool {
    is_loopback_origin(origin) || allowed.iter().any(|a| a.trim_end_matches('/').eq_ignore_ascii_case(origin))
}

/// Middleware: a request carrying an `Origin` that [`origin_allowed`]
/// refuses is answered 403 (the origin is not quoted). Requests without
/// `Origin` (not from a browser) pass. The state is `--allowed-origins`.
pub async fn check_origin(State(allowed): State<Arc<Vec<String>>>, req: Request, next: Next) -> Response {
    if let Some(origin) = req.headers().get(header::ORIGIN) {
        if !origin.to_str().is_ok_and(|o| origin_allowed(o, &allowed)) {
            tracing::debug!("MCP request refused: Origin neither loopback nor in --allowed-origins");
            return (
                StatusCode::FORBIDDEN,
                "Forbidden: the Origin is neither a loopback origin nor one of --allowed-origins\n",
            )
                .into_response();
        }
    }
    next.run(req).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_cap_refuses_the_session_past_it_and_frees_on_close() {
        let s = CappedSessions::new(2);
        let (a, _ta) = s.create_session().await.unwrap();
        let (_b, _tb) = s.create_session().await.unwrap();
        assert!(s.is_full().await);
        let e = s.create_session().await.err().unwrap();
        assert_eq!(
            e.to_string(),
            "too many MCP sessions: 2 open (--max-http-sessions); retry after 5 s, or end an idle session \
             (DELETE /mcp with its Mcp-Session-Id)"
        );
        s.close_session(&a).await.unwrap();
        assert_eq!(s.open().await, 1);
        s.create_session().await.unwrap();
        assert_eq!(s.open().await, 2);
    }

    #[test]
    fn origins_are_loopback_or_named() {
        for o in
            ["http://localhost:3000", "https://127.0.0.1", "http://127.1.2.3:8", "http://[::1]:9", "http://LOCALHOST"]
        {
            assert!(origin_allowed(o, &[]), "{o}");
        }
        for o in ["null", "http://evil.example", "http://127.0.0.1.evil.example", "http://[::2]:1", "file://x", ""] {
            assert!(!origin_allowed(o, &[]), "{o}");
        }
        let named = ["https://app.example.com/".to_string()];
        assert!(origin_allowed("https://app.example.com", &named));
        assert!(!origin_allowed("https://other.example.com", &named));
    }
}
