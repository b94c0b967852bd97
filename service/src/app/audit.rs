//! The audit trail of the core (`scd serve --audit-db`): one
//! [`AuditRecord`] per audited call, named by its surface and method
//! ([`super::Call`]), committed before the reply is sent; and who may read
//! the trail ([`AuditAccess`]). The `Audit` RPC that streams it is gRPC's
//! (`crate::grpc::audit`).
//!
//! Failed calls are recorded too, with the error kind's name as `outcome`,
//! except a refusal for load: shedding load must not cost an fsync per
//! refused call. The other refusals are committed without an fsync of their
//! own ([`AuditLog::append_deferred`]). When the audit log cannot commit, a
//! call that succeeded fails with an internal `audit: …` error instead of
//! answering unrecorded (a failed call keeps its own error; the audit error
//! is logged).
//!
//! Who reads what ([`AuditAccess`]): a caller presenting the operator's
//! token (`x-scd-audit-token`, the contents of `--audit-token-file`) reads
//! every record and may filter by any caller; a wrong token is
//! unauthenticated. Without a token, a caller with a verified identity sees
//! only its own records, and an anonymous caller is denied.

use std::sync::Arc;

use scd_audit::{AuditLog, AuditRecord};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::error::AppError;
use super::{Call, Core};

/// Audit streams reading the log at once; more are RESOURCE_EXHAUSTED. A
/// stream holds its place until it has handed its last page to the channel
/// (a client that stops reading keeps it).
pub const MAX_AUDIT_STREAMS: usize = 4;

/// The gRPC metadata key carrying the operator's audit token.
pub const AUDIT_TOKEN_HEADER: &str = "x-scd-audit-token";

/// The shortest operator token accepted, in bytes.
pub const MIN_AUDIT_TOKEN_BYTES: usize = 16;

/// Who may read the audit trail (see the module docs): the operator, who
/// holds the token of `--audit-token-file`, reads every record; a verified
/// caller reads its own; an anonymous one reads nothing.
#[derive(Clone, Default)]
pub struct AuditAccess {
    /// SHA-256 of the operator's token; `None`: no operator token.
    token_sha256: Option<[u8; 32]>,
}

impl std::fmt::Debug for AuditAccess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuditAccess").field("operator_token", &self.token_sha256.is_some()).finish()
    }
}

/// Which records an Audit call may read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuditReader {
    /// The operator: every record, any caller filter.
    Operator,
    /// A verified caller: its own records only.
    Caller(String),
}

impl AuditAccess {
    /// Access with the operator's `token` (already trimmed and checked, see
    /// `scd serve --audit-token-file`); only its digest is kept.
    pub fn with_operator_token(token: &str) -> Self {
        Self { token_sha256: Some(Sha256::digest(token.as_bytes()).into()) }
    }

    /// Whether an operator token is configured.
    pub fn has_operator_token(&self) -> bool {
        self.token_sha256.is_some()
    }

    /// Who is reading: `token` is the `x-scd-audit-token` value, if the
    /// call carried one, `who` the caller's verified identity. The token is
    /// compared by digest in constant time and never echoed.
    pub fn reader(&self, token: Option<&[u8]>, who: Option<&str>) -> Result<AuditReader, AppError> {
        if let Some(token) = token {
            let Some(want) = &self.token_sha256 else {
                return Err(AppError::Unauthenticated {
                    message: format!(
                        "{AUDIT_TOKEN_HEADER}: this server has no operator token (it runs without --audit-token-file)"
                    ),
                });
            };
            let got: [u8; 32] = Sha256::digest(token.trim_ascii()).into();
            if !bool::from(got.ct_eq(want)) {
                return Err(AppError::Unauthenticated { message: format!("{AUDIT_TOKEN_HEADER}: does not match") });
            }
            return Ok(AuditReader::Operator);
        }
        match who {
            Some(who) => Ok(AuditReader::Caller(who.to_string())),
            None => Err(AppError::permission_denied(format!(
                "audit: an anonymous caller may not read the audit trail: present {AUDIT_TOKEN_HEADER} \
                 (the operator's token, from --audit-token-file), or call with a verified identity \
                 (a TLS client certificate, or a DID under --auth did-wba) to read your own records"
            ))),
        }
    }
}

/// The most bytes of a client-chosen session id a record keeps as sent.
pub const MAX_RECORDED_ID_BYTES: usize = scd_audit::MAX_ID_BYTES;

/// A client-chosen session id as the trail records it (and a query names
/// it): `None` when empty, else [`scd_audit::bounded_id`] (itself when at
/// most [`MAX_RECORDED_ID_BYTES`] with no control character, else `sha256:`
/// and its hex digest), so that calls naming a megabyte "id" (refused ones
/// included) cannot make the trail hold and flush it whole. The log bounds
/// every other string of a record the same way.
pub fn recorded_id(id: &str) -> Option<String> {
    (!id.is_empty()).then(|| scd_audit::bounded_id(id))
}

/// What the trail records of a failed call: its kind's name (`outcome`),
/// and whether it was a refusal for load (not recorded).
pub trait Outcome {
    /// The kind's name (`InvalidArgument`).
    fn outcome(&self) -> String;
    /// A refusal for load (RESOURCE_EXHAUSTED): not recorded.
    fn shed(&self) -> bool;
}

impl Outcome for AppError {
    fn outcome(&self) -> String {
        self.kind_name().to_string()
    }

    fn shed(&self) -> bool {
        matches!(self, AppError::ResourceExhausted { .. })
    }
}

/// The error of an audit log that could not commit.
pub(crate) fn audit_error(e: scd_audit::Error) -> AppError {
    AppError::internal(format!("audit: {e}"))
}

impl Core {
    /// The audit log, when the server was started with `--audit-db`.
    pub fn audit_log(&self) -> Option<&Arc<AuditLog>> {
        self.audit.as_ref()
    }

    /// A record of `method` with the caller, peer and model filled in, or
    /// `None` when the server keeps no audit trail (or at level `off`).
    pub fn audit_record(&self, method: &str, caller: Option<String>, peer: Option<String>) -> Option<AuditRecord> {
        let log = self.audit.as_ref()?;
        if log.level() == scd_audit::AuditLevel::Off {
            return None;
        }
        let mut rec = AuditRecord::new(method);
        rec.caller = caller;
        rec.peer = peer;
        rec.model = Some(self.scd.encoder().model_id().to_string());
        Some(rec)
    }

    /// The record of `call` (its method, caller and peer, and the model),
    /// filled by `seed` with the request as the surface saw it, or `None`
    /// when the server keeps no audit trail: where every audited core
    /// method starts.
    pub fn begin_record(&self, call: &Call, seed: impl FnOnce(&mut AuditRecord)) -> Option<AuditRecord> {
        let mut rec = self.audit_record(&call.method, call.caller.clone(), call.peer.clone())?;
        seed(&mut rec);
        Some(rec)
    }

    /// One audited call after [`Core::begin_record`]: `run` on the
    /// surface's converted `input` (its refusal passes through), the record
    /// filled from a success by `fill`, and committed before the result is
    /// passed on ([`Core::record_audit`]).
    pub(crate) async fn audited<I, O, E, Fut>(
        &self,
        mut rec: Option<AuditRecord>,
        input: Result<I, E>,
        run: impl FnOnce(I) -> Fut,
        fill: impl FnOnce(&mut AuditRecord, &O),
    ) -> Result<O, E>
    where
        Fut: std::future::Future<Output = Result<O, AppError>>,
        E: Outcome + From<AppError>,
    {
        let res = match input {
            Ok(input) => run(input).await.map_err(E::from),
            Err(e) => Err(e),
        };
        if let (Some(rec), Ok(out)) = (rec.as_mut(), &res) {
            fill(rec, out);
        }
        self.record_audit(rec, res).await
    }

    /// Records the outcome of a call and passes the call's result on (see
    /// the module docs for failures). The hook for every audited RPC: build
    /// the record with [`Core::audit_record`], fill it from the reply,
    /// then `return self.record_audit(rec, result).await`.
    pub async fn record_audit<T, E>(&self, rec: Option<AuditRecord>, result: Result<T, E>) -> Result<T, E>
    where
        E: Outcome + From<AppError>,
    {
        let (Some(log), Some(mut rec)) = (self.audit.as_ref(), rec) else { return result };
        let appended = match &result {
            Err(s) if s.shed() => return result,
            Err(s) => {
                rec.outcome = s.outcome();
                log.append_deferred(vec![rec]).await
            }
            Ok(_) => log.append_async(vec![rec]).await,
        };
        match (appended, result) {
            (Ok(_), result) => result,
            (Err(e), Ok(_)) => Err(audit_error(e).into()),
            (Err(e), Err(s)) => {
                tracing::error!(error = %e, outcome = %s.outcome(), "audit: a failed call went unrecorded");
                Err(s)
            }
        }
    }
}
