//! [`Code`]: how a finished call ended, in the core's own words, so that
//! metrics and logs name outcomes without a transport's type.
//!
//! The codes are the canonical status codes every RPC system shares
//! (google.rpc.Code, which gRPC uses too), with their numbers and names:
//! each transport converts its own outcome into one (gRPC its status code,
//! the HTTP listener its status), and the name is the `code` label of
//! `scd_requests_total` and of the `scd::request` log line.
//!
//! ```
//! use scd_service::app::Code;
//! assert_eq!(Code::ResourceExhausted.name(), "ResourceExhausted");
//! assert_eq!(Code::ResourceExhausted as i32, 8);
//! ```

/// How a call ended (see the module docs). `Debug` writes [`Code::name`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Code {
    /// It succeeded.
    Ok = 0,
    /// It was cancelled, usually by the caller.
    Cancelled = 1,
    /// An error of no other kind.
    Unknown = 2,
    /// A request field broke a rule.
    InvalidArgument = 3,
    /// Its deadline passed first.
    DeadlineExceeded = 4,
    /// What it names does not exist.
    NotFound = 5,
    /// What it would create exists already.
    AlreadyExists = 6,
    /// The caller may not do this.
    PermissionDenied = 7,
    /// A queue, a slot or a share is full.
    ResourceExhausted = 8,
    /// The server is not in the state the call needs.
    FailedPrecondition = 9,
    /// It lost a race; it may be retried.
    Aborted = 10,
    /// A value past the valid range.
    OutOfRange = 11,
    /// The method is not served.
    Unimplemented = 12,
    /// A fault of the server.
    Internal = 13,
    /// The server cannot serve now.
    Unavailable = 14,
    /// Data was lost or corrupted.
    DataLoss = 15,
    /// The caller could not be authenticated.
    Unauthenticated = 16,
}

impl Code {
    /// Every code, in number order.
    pub const ALL: [Code; 17] = [
        Code::Ok,
        Code::Cancelled,
        Code::Unknown,
        Code::InvalidArgument,
        Code::DeadlineExceeded,
        Code::NotFound,
        Code::AlreadyExists,
        Code::PermissionDenied,
        Code::ResourceExhausted,
        Code::FailedPrecondition,
        Code::Aborted,
        Code::OutOfRange,
        Code::Unimplemented,
        Code::Internal,
        Code::Unavailable,
        Code::DataLoss,
        Code::Unauthenticated,
    ];

    /// The code's name (`InvalidArgument`): the metrics' `code` label, and
    /// the audit trail's `outcome` of a failed call.
    pub fn name(self) -> &'static str {
        match self {
            Code::Ok => "Ok",
            Code::Cancelled => "Cancelled",
            Code::Unknown => "Unknown",
            Code::InvalidArgument => "InvalidArgument",
            Code::DeadlineExceeded => "DeadlineExceeded",
            Code::NotFound => "NotFound",
            Code::AlreadyExists => "AlreadyExists",
            Code::PermissionDenied => "PermissionDenied",
            Code::ResourceExhausted => "ResourceExhausted",
            Code::FailedPrecondition => "FailedPrecondition",
            Code::Aborted => "Aborted",
            Code::OutOfRange => "OutOfRange",
            Code::Unimplemented => "Unimplemented",
            Code::Internal => "Internal",
            Code::Unavailable => "Unavailable",
            Code::DataLoss => "DataLoss",
            Code::Unauthenticated => "Unauthenticated",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_numbered_in_order_and_debug_writes_the_name() {
        for (i, c) in Code::ALL.iter().enumerate() {
            assert_eq!(*c as usize, i);
            assert_eq!(format!("{c:?}"), c.name());
        }
    }
}
