//! [`AppError`]: the one error of the application core, which every
//! transport turns into its own (gRPC's `Status`, REST's `ApiError`, MCP's
//! tool error, A2A's failed task) with one `From` each.
//!
//! Messages name the API's field and the limit, never a value that could be
//! content; a refusal for load carries the true retry hint.

use super::Code;

/// What went wrong with a call, by kind; each kind has one wire code on
/// every transport (gRPC's name in brackets).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum AppError {
    /// A request field broke a rule; the message starts with the field
    /// (`budget: …`) and names the limit (INVALID_ARGUMENT).
    #[error("{message}")]
    InvalidArgument {
        /// The field, then what is wrong with it.
        message: String,
        /// The engine's parameter the message starts with (by its wire
        /// name), when the message came from one: the JSON surfaces name it
        /// their way ([`super::json::named`]). `None`: the message names
        /// its field as every surface does.
        param: Option<scd_engine::Param>,
    },
    /// The caller could not be authenticated (UNAUTHENTICATED).
    #[error("{message}")]
    Unauthenticated {
        /// Why.
        message: String,
    },
    /// The caller may not do this (PERMISSION_DENIED).
    #[error("{message}")]
    PermissionDenied {
        /// Why.
        message: String,
    },
    /// A session or record the request names does not exist (NOT_FOUND).
    #[error("{message}")]
    NotFound {
        /// What was not found.
        message: String,
    },
    /// The server or a session is not in the state the call needs
    /// (FAILED_PRECONDITION).
    #[error("{message}")]
    FailedPrecondition {
        /// The state it needs.
        message: String,
    },
    /// Another call won a race (a session committed by another replica);
    /// the call may be retried (ABORTED).
    #[error("{message}")]
    Aborted {
        /// What it lost to.
        message: String,
    },
    /// A queue, a slot or the caller's share is full (RESOURCE_EXHAUSTED).
    #[error("{message}")]
    ResourceExhausted {
        /// What is full, and when to retry.
        message: String,
        /// When a place likely frees, in ms (the `retry-after-ms` hint).
        retry_after_ms: Option<u64>,
    },
    /// The caller's deadline passed (DEADLINE_EXCEEDED).
    #[error("{message}")]
    DeadlineExceeded {
        /// Where the call was when it passed.
        message: String,
    },
    /// The work was cancelled (CANCELLED).
    #[error("{message}")]
    Cancelled {
        /// At which stage.
        message: String,
    },
    /// The model, the encoder or the shared store cannot serve now
    /// (UNAVAILABLE).
    #[error("{message}")]
    Unavailable {
        /// What is missing.
        message: String,
    },
    /// A fault of the server (INTERNAL); the message quotes no request.
    #[error("{message}")]
    Internal {
        /// What failed.
        message: String,
    },
}

/// The core's result.
pub type Result<T, E = AppError> = std::result::Result<T, E>;

impl AppError {
    /// A bad request field (`message` starts with the field, named as
    /// every surface names it).
    pub fn invalid(message: impl Into<String>) -> AppError {
        AppError::InvalidArgument { message: message.into(), param: None }
    }

    /// A bad engine parameter, which each surface names its own way
    /// (`session_id` over gRPC, `session` in the JSON API).
    pub fn invalid_param(param: scd_engine::Param, why: impl std::fmt::Display) -> AppError {
        AppError::InvalidArgument { message: format!("{param}: {why}"), param: Some(param) }
    }

    /// A full queue or share, retried after `retry_after_ms`.
    pub fn exhausted(message: impl Into<String>, retry_after_ms: u64) -> AppError {
        AppError::ResourceExhausted { message: message.into(), retry_after_ms: Some(retry_after_ms) }
    }

    /// The deadline passed.
    pub fn deadline(message: impl Into<String>) -> AppError {
        AppError::DeadlineExceeded { message: message.into() }
    }

    /// Cannot serve now.
    pub fn unavailable(message: impl Into<String>) -> AppError {
        AppError::Unavailable { message: message.into() }
    }

    /// A fault of the server.
    pub fn internal(message: impl Into<String>) -> AppError {
        AppError::Internal { message: message.into() }
    }

    /// The server is not in the state the call needs.
    pub fn failed_precondition(message: impl Into<String>) -> AppError {
        AppError::FailedPrecondition { message: message.into() }
    }

    /// The caller may not do this.
    pub fn permission_denied(message: impl Into<String>) -> AppError {
        AppError::PermissionDenied { message: message.into() }
    }

    /// The message.
    pub fn message(&self) -> &str {
        match self {
            AppError::InvalidArgument { message, .. }
            | AppError::Unauthenticated { message }
            | AppError::PermissionDenied { message }
            | AppError::NotFound { message }
            | AppError::FailedPrecondition { message }
            | AppError::Aborted { message }
            | AppError::ResourceExhausted { message, .. }
            | AppError::DeadlineExceeded { message }
            | AppError::Cancelled { message }
            | AppError::Unavailable { message }
            | AppError::Internal { message } => message,
        }
    }

    /// The engine parameter an invalid argument's message starts with (by
    /// its wire name), when the core knows it; gRPC carries it under
    /// `scd_proto::scd::v1::PARAM_KEY`.
    pub fn param(&self) -> Option<&scd_engine::Param> {
        match self {
            AppError::InvalidArgument { param, .. } => param.as_ref(),
            _ => None,
        }
    }

    /// The same error with its message rewritten by `f`.
    pub fn map_message(self, f: impl FnOnce(String) -> String) -> AppError {
        match self {
            AppError::InvalidArgument { message, param } => AppError::InvalidArgument { message: f(message), param },
            AppError::Unauthenticated { message } => AppError::Unauthenticated { message: f(message) },
            AppError::PermissionDenied { message } => AppError::PermissionDenied { message: f(message) },
            AppError::NotFound { message } => AppError::NotFound { message: f(message) },
            AppError::FailedPrecondition { message } => AppError::FailedPrecondition { message: f(message) },
            AppError::Aborted { message } => AppError::Aborted { message: f(message) },
            AppError::ResourceExhausted { message, retry_after_ms } => {
                AppError::ResourceExhausted { message: f(message), retry_after_ms }
            }
            AppError::DeadlineExceeded { message } => AppError::DeadlineExceeded { message: f(message) },
            AppError::Cancelled { message } => AppError::Cancelled { message: f(message) },
            AppError::Unavailable { message } => AppError::Unavailable { message: f(message) },
            AppError::Internal { message } => AppError::Internal { message: f(message) },
        }
    }

    /// The code of a call that failed so: one per kind.
    pub fn code(&self) -> Code {
        match self {
            AppError::InvalidArgument { .. } => Code::InvalidArgument,
            AppError::Unauthenticated { .. } => Code::Unauthenticated,
            AppError::PermissionDenied { .. } => Code::PermissionDenied,
            AppError::NotFound { .. } => Code::NotFound,
            AppError::FailedPrecondition { .. } => Code::FailedPrecondition,
            AppError::Aborted { .. } => Code::Aborted,
            AppError::ResourceExhausted { .. } => Code::ResourceExhausted,
            AppError::DeadlineExceeded { .. } => Code::DeadlineExceeded,
            AppError::Cancelled { .. } => Code::Cancelled,
            AppError::Unavailable { .. } => Code::Unavailable,
            AppError::Internal { .. } => Code::Internal,
        }
    }

    /// The kind's name as the audit trail's `outcome` records it and gRPC
    /// names its code (`InvalidArgument`): its [`Code`]'s name.
    pub fn kind_name(&self) -> &'static str {
        self.code().name()
    }

    /// The retry hint of a refusal for load, in ms.
    pub fn retry_after_ms(&self) -> Option<u64> {
        match self {
            AppError::ResourceExhausted { retry_after_ms, .. } => *retry_after_ms,
            _ => None,
        }
    }

    /// A worker that failed (a panic in the engine, whose text may quote a
    /// request's content): a fixed INTERNAL for the client, the cause logged.
    pub(crate) fn worker_failed(e: tokio::task::JoinError) -> AppError {
        tracing::error!(error = %e, "an engine worker failed");
        AppError::internal("the engine failed on this request; the server's log has the cause")
    }
}

/// validation → invalid argument, unknown session → not found, cancelled →
/// cancelled, deadline → deadline, model problems → unavailable, everything
/// else → internal; the engine's message unchanged.
impl From<scd_engine::Error> for AppError {
    fn from(err: scd_engine::Error) -> AppError {
        use scd_engine::Error as E;
        let message = err.to_string();
        match err {
            E::InvalidArgument { field, .. } => AppError::InvalidArgument { message, param: Some(field) },
            E::InputTooLong { .. } | E::BudgetTooSmall { .. } => AppError::InvalidArgument { message, param: None },
            E::UnknownSession { .. } | E::SessionGone { .. } => AppError::NotFound { message },
            E::SessionForbidden { .. } => AppError::PermissionDenied { message },
            E::SessionContextMismatch { .. } => AppError::FailedPrecondition { message },
            E::SessionContended { .. } => AppError::Aborted { message },
            E::StateUnavailable { .. } => AppError::Unavailable { message },
            E::Cancelled { .. } => AppError::Cancelled { message },
            E::DeadlineExceeded { .. } => AppError::DeadlineExceeded { message },
            E::OrtLibraryMissing { .. }
            | E::OrtLibraryLoad { .. }
            | E::ProviderUnavailable { .. }
            | E::ModelNotFound { .. }
            | E::ModelManifest { .. }
            | E::ModelShape { .. } => AppError::Unavailable { message },
            _ => AppError::Internal { message },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engine_errors_keep_their_message_and_map_to_one_kind() {
        let e = AppError::from(scd_engine::Error::BudgetTooSmall { needed: 10, budget: 2 });
        assert_eq!(e.kind_name(), "InvalidArgument");
        assert_eq!(e.message(), scd_engine::Error::BudgetTooSmall { needed: 10, budget: 2 }.to_string());
        let busy = AppError::exhausted("compress queue is full; retry after 40 ms", 40);
        assert_eq!((busy.kind_name(), busy.retry_after_ms()), ("ResourceExhausted", Some(40)));
        assert_eq!(AppError::invalid("budget: must be > 0").retry_after_ms(), None);
    }
}
