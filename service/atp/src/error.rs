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
    /// The identity file exists but cannot be used.
    #[error("identity file {}: {reason}", path.display())]
    IdentityFile {
        /// The file.
        path: std::path::PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// This agent cannot meet a probe or contract (no offer is made).
    #[error("cannot meet the probe: {reason}")]
    CannotMeet {
        /// The first constraint missed.
        reason: String,
    },
    /// No acceptable offer after every retry: back to the originator.
    #[error("no acceptable offer after {rounds} probe rounds (constraints relaxed 10 % per retry); escalating: {failures}")]
    Escalated {
        /// Probe rounds sent.
        rounds: u32,
        /// Each peer's failure.
        failures: String,
    },
    /// A peer did not answer in time.
    #[error("{what}: no answer within {ms} ms")]
    Timeout {
        /// What was awaited.
        what: String,
        /// The limit.
        ms: u64,
    },
    /// A peer refused a call or its answer did not verify.
    #[error("{rpc} to {did}: {status:?}: {message}")]
    Peer {
        /// The peer's DID (or URL when unknown).
        did: String,
        /// The RPC.
        rpc: &'static str,
        /// The gRPC status code.
        status: tonic::Code,
        /// Its message.
        message: String,
    },
    /// A transport (listener or channel) failed.
    #[error("{what}: {message}")]
    Transport {
        /// What was being done.
        what: String,
        /// The transport's error.
        message: String,
    },
}

impl From<Error> for tonic::Status {
    fn from(e: Error) -> tonic::Status {
        let msg = e.to_string();
        match e {
            Error::Invalid { .. } | Error::Did { .. } => tonic::Status::invalid_argument(msg),
            Error::CannotMeet { .. } => tonic::Status::failed_precondition(msg),
            Error::Timeout { .. } => tonic::Status::deadline_exceeded(msg),
            Error::Escalated { .. } | Error::Peer { .. } | Error::Transport { .. } => tonic::Status::unavailable(msg),
            Error::Io { .. } | Error::IdentityFile { .. } => tonic::Status::internal(msg),
        }
    }
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
