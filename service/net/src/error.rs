//! The crate's one error type.

/// Errors of the guard's settings.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A setting out of its range.
    #[error("{field}: {reason}")]
    Invalid {
        /// The flag or field.
        field: &'static str,
        /// What is wrong and what is allowed.
        reason: String,
    },
}

/// `Result` with this crate's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;
