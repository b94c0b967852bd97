//! The crate's one error type, and [`AuthFailure`]: why a signed message
//! was refused.

use scd_did::time::MAX_CLOCK_SKEW_S;

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
    Auth(#[from] AuthFailure),
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
    /// This agent cannot meet a probe or contract (no offer is made).
    #[error("cannot meet the probe: {reason}")]
    CannotMeet {
        /// The first constraint missed.
        reason: String,
    },
    /// No acceptable offer after every retry: back to the originator.
    #[error(
        "no acceptable offer after {rounds} probe rounds (constraints relaxed 10 % per retry); escalating: {failures}"
    )]
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
    /// SCD could not be reached.
    #[error("cannot connect to SCD at {url}: {source}")]
    ScdConnect {
        /// The SCD URL.
        url: String,
        /// Why the connection failed.
        source: tonic::transport::Error,
    },
    /// SCD answered an RPC with an error status.
    #[error("SCD {rpc} at {url} failed: {:?}: {}", .status.code(), .status.message())]
    Scd {
        /// The SCD URL.
        url: String,
        /// The RPC, e.g. `OpenSession`.
        rpc: &'static str,
        /// SCD's status.
        #[source]
        status: Box<tonic::Status>,
    },
    /// SCD's reply breaks its contract (over the budget, unknown chunks).
    #[error("SCD's {rpc} reply: {reason}")]
    ScdReply {
        /// The RPC answered.
        rpc: &'static str,
        /// What is wrong with the reply.
        reason: String,
    },
    /// SCD returned a chunk of a confidential (withheld) field; it is never
    /// forwarded.
    #[error("SCD returned chunk {chunk_id} of withheld field {field}; it is not forwarded")]
    ConfidentialChunk {
        /// The withheld field.
        field: String,
        /// The chunk's id.
        chunk_id: String,
    },
    /// A context file could not be read.
    #[error("cannot read context file {}: {source}", .path.display())]
    ReadContext {
        /// The file.
        path: std::path::PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The audit trail in the agent's store failed.
    #[error(transparent)]
    Audit(#[from] scd_audit::Error),
    /// The durable replay log failed (the message is refused).
    #[error("nonce log: {reason}")]
    NonceLog {
        /// The storage error.
        reason: String,
    },
}

impl From<Error> for tonic::Status {
    fn from(e: Error) -> tonic::Status {
        let msg = e.to_string();
        match e {
            Error::Invalid { .. } | Error::Did { .. } => tonic::Status::invalid_argument(msg),
            Error::CannotMeet { .. } | Error::Audit(scd_audit::Error::Locked { .. }) => {
                tonic::Status::failed_precondition(msg)
            }
            Error::Timeout { .. } => tonic::Status::deadline_exceeded(msg),
            Error::Escalated { .. } | Error::Peer { .. } | Error::Transport { .. } => tonic::Status::unavailable(msg),
            Error::ScdConnect { .. } => tonic::Status::unavailable(msg),
            Error::Auth(failure) => failure.into(),
            Error::Scd { status, .. } => tonic::Status::new(status.code(), msg),
            Error::Io { .. }
            | Error::IdentityFile { .. }
            | Error::ScdReply { .. }
            | Error::ConfidentialChunk { .. }
            | Error::ReadContext { .. }
            | Error::Store { .. }
            | Error::Audit(_)
            | Error::NonceLog { .. }
            | Error::Decode { .. }
            | Error::Json { .. } => tonic::Status::internal(msg),
        }
    }
}

impl From<scd_context::Error> for Error {
    fn from(e: scd_context::Error) -> Error {
        match e {
            scd_context::Error::InvalidArgument { field, message } => {
                Error::Invalid { field: field.to_string(), reason: message }
            }
            scd_context::Error::Read { path, source } => Error::ReadContext { path, source },
        }
    }
}

impl From<scd_did::Error> for Error {
    fn from(e: scd_did::Error) -> Error {
        match e {
            scd_did::Error::Did { did, reason } => Error::Did { did, reason },
            scd_did::Error::Io { path, source } => Error::Io { path, source },
            scd_did::Error::IdentityFile { path, reason } => Error::IdentityFile { path, reason },
            scd_did::Error::NonceLog { reason } => Error::NonceLog { reason },
        }
    }
}

/// Why a signed message was refused. `Display` names which check failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthFailure {
    /// The message carries no signature.
    #[error("unsigned: the message carries no signature")]
    Unsigned,
    /// The message names no sender DID.
    #[error("no sender: the message names no sender DID")]
    NoSender,
    /// The sender is not a DID we can resolve to a key.
    #[error("unknown signer {did}: {reason}")]
    UnknownSigner {
        /// The sender as the message names it.
        did: String,
        /// Why it does not resolve.
        reason: String,
    },
    /// The signature does not verify against the sender's key.
    #[error("signature does not verify against {did}'s key (altered, or signed by another key)")]
    BadSignature {
        /// The sender.
        did: String,
    },
    /// The timestamp is too far from the receiver's clock (or missing).
    #[error("stale: timestamp {} (limit ±{limit} s)", skew_words(.skew_s), limit = MAX_CLOCK_SKEW_S)]
    Stale {
        /// Timestamp minus the receiver's clock, seconds (positive = future).
        skew_s: i64,
    },
    /// The (sender, nonce) pair was already seen.
    #[error("replayed: nonce {nonce} from {did} already seen")]
    Replayed {
        /// The sender.
        did: String,
        /// The repeated nonce.
        nonce: u64,
    },
    /// The replay log could not be read or written: the message is refused
    /// (fail closed).
    #[error("replay check unavailable: {reason}")]
    ReplayCheckUnavailable {
        /// The storage error.
        reason: String,
    },
}

fn skew_words(skew_s: &i64) -> String {
    let skew_s = *skew_s;
    if skew_s >= 0 {
        format!("{skew_s} s from now")
    } else {
        format!("{} s ago", skew_s.unsigned_abs())
    }
}

impl From<AuthFailure> for tonic::Status {
    fn from(failure: AuthFailure) -> tonic::Status {
        match failure {
            AuthFailure::ReplayCheckUnavailable { .. } => tonic::Status::unavailable(failure.to_string()),
            _ => tonic::Status::unauthenticated(failure.to_string()),
        }
    }
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
