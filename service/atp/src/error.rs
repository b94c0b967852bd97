//! The crate's one error type.

/// Everything that can go wrong in the ATP stack.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A field of a message or argument is missing or out of range.
    #[error("{field}: {reason}")]
    Invalid {
        /// The field, e.g. `capability.quality`.
        field: String,
        /// What is wrong with it, with the limit.
        reason: String,
    },
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
    /// A signature, sender, clock or replay check failed.
    #[error(transparent)]
    Auth(#[from] crate::identity::AuthFailure),
    /// The redb store failed (boxed: redb's error is large).
    #[error("store: {source}")]
    Store {
        /// redb's error.
        source: Box<redb::Error>,
    },
    /// A stored record does not decode.
    #[error("{what} does not decode: {source}")]
    Decode {
        /// Which record, e.g. `proofs[3]`.
        what: String,
        /// prost's error.
        source: prost::DecodeError,
    },
    /// A stored JSON record does not parse.
    #[error("{what} is not valid JSON: {source}")]
    Json {
        /// Which record, e.g. `peers[did:key:…]`.
        what: String,
        /// serde_json's error.
        source: serde_json::Error,
    },
    /// The identity file exists but cannot be used.
    #[error("identity file {}: {reason}", path.display())]
    IdentityFile {
        /// The file.
        path: std::path::PathBuf,
        /// What is wrong with it.
        reason: String,
    },
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
