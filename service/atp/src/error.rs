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
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
