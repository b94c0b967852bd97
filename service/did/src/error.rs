//! The crate's one error type.

/// Everything that can go wrong with an identity, a DID or a replay log.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A DID that is malformed or of a method we cannot use.
    #[error("DID {did}: {reason}")]
    Did {
        /// The DID as given.
        did: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A file or directory could not be read or written.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: std::path::PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The identity file exists but cannot be used.
    #[error("identity file {}: {reason}", path.display())]
    IdentityFile {
        /// The file.
        path: std::path::PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// A durable replay log could not be read or written.
    #[error("nonce log: {reason}")]
    NonceLog {
        /// The storage error.
        reason: String,
    },
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
