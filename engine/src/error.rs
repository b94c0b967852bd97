//! The engine's one error type.

use std::path::PathBuf;

pub use scd_context::Param;

/// `Result` with the engine's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong inside the engine.
///
/// Variants carry their data in named fields so callers (the gRPC layer, the
/// CLI) can map them to status codes and messages without parsing strings.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The ONNX Runtime shared library is not at the configured path.
    #[error(
        "ONNX Runtime library not found at {path}: set {env_var} to the libonnxruntime.so \
         shipped in the pinned PyPI onnxruntime wheel (models/setup.sh installs it)"
    )]
    OrtLibraryMissing {
        /// Where we looked.
        path: PathBuf,
        /// The environment variable that overrides the path.
        env_var: &'static str,
    },
    /// The library exists but could not be loaded (wrong file, wrong version).
    #[error("cannot load ONNX Runtime from {path} (set {env_var} to override): {source}")]
    OrtLibraryLoad {
        /// The library path.
        path: PathBuf,
        /// The environment variable that overrides the path.
        env_var: &'static str,
        /// What `ort` reported.
        #[source]
        source: ort::LoadDynamicError,
    },
    /// ONNX Runtime failed while building a session or running the model.
    #[error("ONNX Runtime: {0}")]
    Ort(#[from] ort::Error),
    /// An execution provider was asked for and could not be registered.
    #[error("execution provider {provider} is unavailable: {reason}")]
    ProviderUnavailable {
        /// Provider name, e.g. `cuda`.
        provider: &'static str,
        /// Why, including the library that failed to load where known.
        reason: String,
    },
    /// No model folder with that name.
    #[error("model {name:?} not found in {dir} (run models/setup.sh, or point --models-dir at a folder holding it)")]
    ModelNotFound {
        /// The model name asked for.
        name: String,
        /// The models folder searched.
        dir: PathBuf,
    },
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A manifest is not valid JSON of the expected shape.
    #[error("invalid model manifest {path}: {source}")]
    Manifest {
        /// The manifest file.
        path: PathBuf,
        /// The parse error.
        #[source]
        source: serde_json::Error,
    },
    /// The tokenizer failed to load or to encode.
    #[error("tokenizer {path}: {source}")]
    Tokenizer {
        /// The tokenizer file.
        path: PathBuf,
        /// What the tokenizers crate reported.
        #[source]
        source: tokenizers::Error,
    },
    /// A model folder's manifest is missing a field SCD needs, or a field is
    /// wrong (its `kind`, a file's sha256): `field` names it.
    #[error("model manifest {path}: {field}: {reason}")]
    ModelManifest {
        /// The manifest file.
        path: PathBuf,
        /// The field, e.g. `kind` or `files.model.onnx`.
        field: String,
        /// What is wrong.
        reason: String,
    },
    /// The model graph does not have the inputs or outputs SCD needs.
    #[error("model {path} is not usable: {reason}")]
    ModelShape {
        /// The ONNX file.
        path: PathBuf,
        /// What is missing or wrong.
        reason: String,
    },
    /// An input is longer than the model accepts and the caller asked for an error.
    #[error(
        "texts[{index}] has {tokens} tokens, over the model's max_tokens {max_tokens}; \
         ask for sliding windows to embed it whole"
    )]
    InputTooLong {
        /// Index of the text in the request.
        index: usize,
        /// Its token count, prefix and special tokens included.
        tokens: usize,
        /// The model's limit.
        max_tokens: usize,
    },
    /// The required fields alone exceed the receiver's budget.
    #[error("required fields need {needed} tokens, over the budget of {budget}")]
    BudgetTooSmall {
        /// Tokens the required fields need.
        needed: usize,
        /// The receiver's budget.
        budget: usize,
    },
    /// No live session with that id (never opened, closed or expired).
    #[error("unknown or expired session {}", scd_context::shown_name(.session_id))]
    UnknownSession {
        /// The id asked for.
        session_id: String,
    },
    /// The session exists but the caller may not use it: wrong token, or
    /// another caller's session. One message for both, so it tells nothing.
    #[error("session {}: the session_token does not match, or the session belongs to another caller", scd_context::shown_name(.session_id))]
    SessionForbidden {
        /// The id asked for.
        session_id: String,
    },
    /// The session was evicted, expired or closed; `cause` says which.
    #[error("session {} is gone: {cause}", scd_context::shown_name(.session_id))]
    SessionGone {
        /// The id asked for.
        session_id: String,
        /// Why it is gone.
        cause: &'static str,
    },
    /// The shared session store (`scd serve --state`) cannot be reached or
    /// answered in error: calls that need a session fail, stateless ones go on.
    #[error("the session store {store} is unavailable: {reason}")]
    StateUnavailable {
        /// The store, as the operator named it (no password).
        store: String,
        /// What failed.
        reason: String,
    },
    /// Another replica changed the session while this request worked on it,
    /// every time it tried: the client may retry.
    #[error("session {} was changed by concurrent requests on other replicas; retry", scd_context::shown_name(.session_id))]
    SessionContended {
        /// The id asked for.
        session_id: String,
    },
    /// A follow-up compress named a session opened on another context.
    #[error("session {} was opened on another context; open a new session for this one", scd_context::shown_name(.session_id))]
    SessionContextMismatch {
        /// The id asked for.
        session_id: String,
    },
    /// The caller went away (client cancelled); the work stopped before `stage`.
    #[error("cancelled during {stage}: the caller went away")]
    Cancelled {
        /// The stage that was about to run (chunk, embed, score, pack).
        stage: &'static str,
    },
    /// The caller's deadline passed; the work stopped before `stage`.
    #[error("deadline exceeded during {stage}")]
    DeadlineExceeded {
        /// The stage that was about to run.
        stage: &'static str,
    },
    /// A request argument is out of range; `field` names it, `limit` says the bound.
    #[error("{field}: {message}")]
    InvalidArgument {
        /// The offending field, e.g. [`Param::MaxContextTokens`]; its
        /// `Display` is the wire name, [`Param::json_name`] the JSON API's.
        field: Param,
        /// What is wrong and what the limit is.
        message: String,
    },
}

impl Error {
    /// Shorthand for [`Error::InvalidArgument`].
    pub fn invalid(field: impl Into<Param>, message: impl Into<String>) -> Self {
        Self::InvalidArgument { field: field.into(), message: message.into() }
    }

    /// Wraps an I/O error with its path.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Self::Io { path: path.into(), source }
    }
}
