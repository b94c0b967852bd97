//! The errors of the A2A layer, each with its JSON-RPC code and HTTP
//! status.

use axum::http::StatusCode;
use serde_json::{json, Value};

use super::types::TaskState;
use super::PROTOCOL_VERSION;

/// Errors of the A2A layer, each with its JSON-RPC code and HTTP status.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// `-32700`.
    #[error("invalid JSON payload: {0}")]
    Parse(String),
    /// `-32600`.
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    /// `-32601`.
    #[error("method not found: {0}")]
    MethodNotFound(String),
    /// `-32602`.
    #[error("invalid params: {0}")]
    InvalidParams(String),
    /// `-32603`.
    #[error("internal error: {0}")]
    Internal(String),
    /// `-32001`.
    #[error("task {} not found", scd_engine::context::shown_name(.0))]
    TaskNotFound(String),
    /// `-32002`.
    #[error("task {} is {} and cannot be canceled", scd_engine::context::shown_name(.id), state.name())]
    NotCancelable {
        /// The task.
        id: String,
        /// Its (terminal) state.
        state: TaskState,
    },
    /// `-32003`.
    #[error("push notifications are not supported (capabilities.pushNotifications is false)")]
    PushNotSupported,
    /// `-32004`.
    #[error("unsupported operation: {0}")]
    Unsupported(String),
    /// `-32004`: a message or update for a task in a terminal state.
    #[error("unsupported operation: task {id} is {} (terminal, immutable); send a new message in its contextId instead", state.name())]
    Terminal {
        /// The task.
        id: String,
        /// Its state.
        state: TaskState,
    },
    /// `-32005`.
    #[error("content type not supported: {0}")]
    ContentType(String),
    /// `-32007`.
    #[error("extended agent card not configured")]
    NoExtendedCard,
    /// `-32009`.
    #[error("A2A-Version {0}: not supported; this agent speaks {PROTOCOL_VERSION}")]
    Version(String),
    /// `-32000`: a bounded store is full.
    #[error("resource exhausted: {what} holds {limit} {unit} (the limit, {flag}); retry after {retry_after_s} s")]
    Exhausted {
        /// What is full.
        what: &'static str,
        /// Its bound.
        limit: usize,
        /// What the bound counts (`tasks`, `bytes`).
        unit: &'static str,
        /// The flag that sets it.
        flag: &'static str,
        /// When to retry.
        retry_after_s: u64,
    },
    /// `-32603`, HTTP 503: the shared task store (`--state`) does not
    /// answer; another try (on any replica) may succeed.
    #[error("task store {store} unavailable: {reason}")]
    StoreUnavailable {
        /// `redis://host:port/db`.
        store: String,
        /// What failed (never a value the store holds).
        reason: String,
    },
    /// `-32000`: the engine is at capacity (its compress slots, queue or
    /// session store are full).
    #[error("resource exhausted: {what}; retry after {retry_after_ms} ms")]
    Overloaded {
        /// What is full (the engine's message).
        what: String,
        /// When to retry.
        retry_after_ms: u64,
    },
}

impl Error {
    /// The JSON-RPC error code.
    pub fn code(&self) -> i64 {
        match self {
            Self::Parse(_) => -32700,
            Self::InvalidRequest(_) => -32600,
            Self::MethodNotFound(_) => -32601,
            Self::InvalidParams(_) => -32602,
            Self::Internal(_) | Self::StoreUnavailable { .. } => -32603,
            Self::TaskNotFound(_) => -32001,
            Self::NotCancelable { .. } => -32002,
            Self::PushNotSupported => -32003,
            Self::Unsupported(_) | Self::Terminal { .. } => -32004,
            Self::ContentType(_) => -32005,
            Self::NoExtendedCard => -32007,
            Self::Version(_) => -32009,
            Self::Exhausted { .. } | Self::Overloaded { .. } => -32000,
        }
    }

    /// The HTTP status of the REST binding.
    pub fn http_status(&self) -> StatusCode {
        match self {
            Self::TaskNotFound(_) | Self::MethodNotFound(_) => StatusCode::NOT_FOUND,
            Self::NotCancelable { .. } => StatusCode::CONFLICT,
            Self::ContentType(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Self::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
            Self::StoreUnavailable { .. } => StatusCode::SERVICE_UNAVAILABLE,
            Self::Exhausted { .. } | Self::Overloaded { .. } => StatusCode::TOO_MANY_REQUESTS,
            _ => StatusCode::BAD_REQUEST,
        }
    }

    /// When to retry an overloaded request (`None`: retrying will not help).
    pub fn retry_after_ms(&self) -> Option<u64> {
        match self {
            Self::Exhausted { retry_after_s, .. } => Some(retry_after_s * 1000),
            Self::Overloaded { retry_after_ms, .. } => Some(*retry_after_ms),
            // the store is pinged every second
            Self::StoreUnavailable { .. } => Some(1000),
            _ => None,
        }
    }

    /// The JSON-RPC `error` object (`data.retryAfterMs` on overload).
    pub fn to_json(&self) -> Value {
        let mut e = json!({"code": self.code(), "message": self.to_string()});
        if let Some(ms) = self.retry_after_ms() {
            e["data"] = json!({ "retryAfterMs": ms });
        }
        e
    }

    /// The engine's RESOURCE_EXHAUSTED, with its `retry-after-ms` hint
    /// (100 ms when it gives none).
    pub(super) fn overloaded(e: &crate::app::AppError) -> Self {
        let retry_after_ms = e.retry_after_ms().unwrap_or(100);
        let msg = e.message();
        let what = msg.split_once("; retry after").map_or(msg, |(w, _)| w).to_string();
        Self::Overloaded { what, retry_after_ms }
    }
}
