//! The crate's one error type.

/// Everything that can go wrong with the audit trail.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An argument is out of range (a level name, a retention bound).
    #[error("{field}: {reason}")]
    Invalid {
        /// The argument, e.g. `audit level`.
        field: String,
        /// What is wrong with it, with the limit.
        reason: String,
    },
    /// The audit directory could not be created.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: std::path::PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// redb failed (boxed: redb's error is large).
    #[error("store: {source}")]
    Store {
        /// redb's error.
        source: Box<redb::Error>,
    },
    /// A stored record is not valid JSON.
    #[error("{what} is not valid JSON: {source}")]
    Json {
        /// Which record, e.g. `audit_records[3]`.
        what: String,
        /// serde_json's error.
        source: serde_json::Error,
    },
    /// The audit trail could not record (its writer stopped or a commit
    /// failed): the audited call fails rather than go unrecorded.
    #[error("audit {}: {reason}", path.display())]
    Audit {
        /// The audit database.
        path: std::path::PathBuf,
        /// What failed.
        reason: String,
    },
    /// The audit database is held by another process (redb locks its file).
    #[error("{}: the audit database is open in another process (a running server holds its lock; query it with --server)", path.display())]
    Locked {
        /// The audit database.
        path: std::path::PathBuf,
    },
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
