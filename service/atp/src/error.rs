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
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
