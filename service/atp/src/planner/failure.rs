//! Why a delegation failed, and whose fault it was.

use tonic::Status;

use crate::handshake::Offer;
use crate::Error;

/// A composite route's stage that failed, and its agent.
#[derive(Debug)]
pub(super) struct StageFailure {
    pub(super) did: String,
    pub(super) url: String,
    pub(super) failure: Failure,
}

impl StageFailure {
    pub(super) fn local(offer: &Offer, e: Error) -> StageFailure {
        StageFailure { did: offer.did().to_string(), url: offer.url.clone(), failure: Failure::local(e) }
    }
}

/// Why a delegation to one agent failed.
#[derive(Debug)]
pub(super) struct Failure {
    pub(super) why: String,
    pub(super) kind: FailureKind,
}

/// Whose fault a failed delegation is.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum FailureKind {
    /// The agent's: counts against its circuit and toward poison; fail over.
    Agent,
    /// A refusal (queue full, contract declined): try the next route.
    Refused,
    /// The agent called our message invalid or unauthorised: a peer's word,
    /// so it is not obeyed (a hostile peer would make every task be
    /// abandoned) but counted against its circuit, and the next route gets
    /// the task; not toward poison (peers could otherwise mark any task).
    Rejected,
    /// Ours (SCD down, store error): stop.
    Local,
}

impl Failure {
    pub(super) fn agent(e: Error) -> Failure {
        Failure { why: e.to_string(), kind: FailureKind::Agent }
    }

    pub(super) fn local(e: Error) -> Failure {
        Failure { why: e.to_string(), kind: FailureKind::Local }
    }

    pub(super) fn status(rpc: &str, s: &Status) -> Failure {
        let kind = match s.code() {
            tonic::Code::ResourceExhausted | tonic::Code::FailedPrecondition | tonic::Code::AlreadyExists => {
                FailureKind::Refused
            }
            tonic::Code::InvalidArgument | tonic::Code::Unauthenticated | tonic::Code::PermissionDenied => {
                FailureKind::Rejected
            }
            _ => FailureKind::Agent,
        };
        Failure { why: format!("{rpc}: {:?}: {}", s.code(), s.message()), kind }
    }
}
