//! The audit trail on the server (`scd serve --audit-db`): one
//! [`AuditRecord`] per Compress, OpenSession and RequestContext (and the
//! lead's Handoff, through [`crate::app::Core::record_audit`]), committed before
//! the reply is sent, and the server-streamed `Audit` RPC that reads them.
//!
//! What is recorded: `caller` is `caller(&request)` (the verified identity:
//! the mTLS certificate's, or the DID once DID auth is on), `peer` the
//! transport address. Failed calls are recorded too, with the status code's
//! name as `outcome`, except RESOURCE_EXHAUSTED: shedding load must not cost
//! an fsync per refused call. The other refusals (INVALID_ARGUMENT,
//! PERMISSION_DENIED, NOT_FOUND, …) are committed without an fsync of their
//! own ([`AuditLog::append_deferred`]): visible to readers at once, durable
//! with the next successful call's commit or within a second. Repeats of a
//! refusal (same method, caller, peer, session and outcome) within that
//! second are merged into its record, whose `count` says how many calls it
//! stands for (see `scd_audit` for the merging and for retention, which
//! never lets refused calls' records evict successful calls'). When the audit
//! log cannot commit, a call that succeeded fails with INTERNAL `audit: …`
//! instead of answering unrecorded (a failed call keeps its own status; the
//! audit error is logged).
//!
//! Who reads what is the core's [`AuditAccess`] (re-exported here).

use std::pin::Pin;

use scd_audit::{AuditChunk, AuditFilter, AuditRecord, AuditTimings};
use tokio_stream::Stream;
use tonic::{Code, Status};

use super::{pb, ScdHandler};
use crate::app::audit::audit_error;
pub use crate::app::audit::{
    recorded_id, AuditAccess, AuditReader, Outcome, AUDIT_TOKEN_HEADER, MAX_AUDIT_STREAMS, MAX_RECORDED_ID_BYTES,
    MIN_AUDIT_TOKEN_BYTES,
};

/// Records per page read from the database while streaming.
const PAGE: usize = 256;

/// The server-streamed Audit reply.
pub type AuditStream = Pin<Box<dyn Stream<Item = Result<pb::AuditRecordMsg, Status>> + Send>>;

/// The name of a status code as recorded in `outcome` (`InvalidArgument`).
pub fn code_name(code: Code) -> String {
    format!("{code:?}")
}

impl Outcome for Status {
    fn outcome(&self) -> String {
        code_name(self.code())
    }

    fn shed(&self) -> bool {
        self.code() == Code::ResourceExhausted
    }
}

/// Fills a record from a Compress reply: chunks, withheld names, totals,
/// timings and the session (when the reply carries one).
pub fn fill_from_compress(rec: &mut AuditRecord, r: &pb::CompressResponse) {
    fill_chunks(rec, &r.chunks);
    rec.withheld = r.withheld_fields.clone();
    if let Some(t) = &r.totals {
        rec.context_tokens = u64::from(t.context_tokens);
        rec.selected_tokens = u64::from(t.sent_tokens);
        rec.reduction_ratio = t.reduction_ratio;
    }
    if let Some(id) = recorded_id(&r.session_id) {
        rec.session_id = Some(id);
    }
    fill_timing(rec, r.timing.as_ref());
}

/// A call that gave `rate` instead of a budget records the budget the rate
/// came to: that share of the context's tokens (the engine's rule).
pub fn fill_rate_budget(rec: &mut AuditRecord, rate: Option<f64>, r: &pb::CompressResponse) {
    if let (Some(rate), Some(t)) = (rate, &r.totals) {
        let budget = scd_engine::budget::rate_budget(t.context_tokens as usize, rate);
        rec.budget_tokens = Some(u32::try_from(budget).unwrap_or(u32::MAX));
    }
}

/// Fills a record's chunk list and count, and the tokens sent.
pub fn fill_chunks(rec: &mut AuditRecord, chunks: &[pb::Chunk]) {
    rec.chunks = chunks
        .iter()
        .map(|c| AuditChunk { id: c.id.clone(), field: c.field.clone(), score: c.score, tokens: c.tokens })
        .collect();
    rec.chunk_count = chunks.len() as u32;
    rec.selected_tokens = chunks.iter().map(|c| u64::from(c.tokens)).sum();
}

/// Copies the server's timing into a record.
pub fn fill_timing(rec: &mut AuditRecord, t: Option<&pb::Timing>) {
    if let Some(t) = t {
        rec.timings = AuditTimings {
            queue_ms: t.queue_ms,
            inference_ms: t.inference_ms,
            selection_ms: t.selection_ms,
            total_ms: t.total_ms,
        };
    }
}

/// A record on the wire.
pub fn to_pb(r: AuditRecord) -> pb::AuditRecordMsg {
    pb::AuditRecordMsg {
        seq: r.seq,
        at_ms: r.at_ms,
        method: r.method,
        caller: r.caller.unwrap_or_default(),
        peer: r.peer.unwrap_or_default(),
        session_id: r.session_id.unwrap_or_default(),
        task_digest: r.task_digest.unwrap_or_default(),
        task: r.task.unwrap_or_default(),
        task_truncated: r.task_truncated,
        model: r.model.unwrap_or_default(),
        level: r.level.to_string(),
        chunks: r
            .chunks
            .into_iter()
            .map(|c| pb::AuditChunk { id: c.id, field: c.field, score: c.score, tokens: c.tokens })
            .collect(),
        chunk_count: r.chunk_count,
        withheld: r.withheld,
        budget_tokens: r.budget_tokens.unwrap_or_default(),
        context_tokens: r.context_tokens,
        selected_tokens: r.selected_tokens,
        reduction_ratio: r.reduction_ratio,
        timing: Some(pb::Timing {
            queue_ms: r.timings.queue_ms,
            inference_ms: r.timings.inference_ms,
            selection_ms: r.timings.selection_ms,
            total_ms: r.timings.total_ms,
        }),
        outcome: r.outcome,
        count: r.count.max(1),
    }
}

/// A record from the wire (the CLI prints it as JSON); an unknown level
/// reads as `summary`.
pub fn from_pb(m: pb::AuditRecordMsg) -> AuditRecord {
    let some = |s: String| (!s.is_empty()).then_some(s);
    let t = m.timing.unwrap_or_default();
    AuditRecord {
        seq: m.seq,
        at_ms: m.at_ms,
        method: m.method,
        caller: some(m.caller),
        peer: some(m.peer),
        session_id: some(m.session_id),
        task_digest: some(m.task_digest),
        task: some(m.task),
        task_truncated: m.task_truncated,
        model: some(m.model),
        level: m.level.parse().unwrap_or_default(),
        chunks: m
            .chunks
            .into_iter()
            .map(|c| AuditChunk { id: c.id, field: c.field, score: c.score, tokens: c.tokens })
            .collect(),
        chunk_count: m.chunk_count,
        withheld: m.withheld,
        budget_tokens: (m.budget_tokens > 0).then_some(m.budget_tokens),
        context_tokens: m.context_tokens,
        selected_tokens: m.selected_tokens,
        reduction_ratio: m.reduction_ratio,
        timings: AuditTimings {
            queue_ms: t.queue_ms,
            inference_ms: t.inference_ms,
            selection_ms: t.selection_ms,
            total_ms: t.total_ms,
        },
        outcome: m.outcome,
        count: m.count.max(1),
    }
}

/// The checked filter of an Audit request; `who`, a verified caller's
/// identity (not the operator's), restricts the records to its own.
pub fn filter(r: pb::AuditRequest, who: Option<&str>) -> Result<AuditFilter, Status> {
    let some = |s: String| (!s.is_empty()).then_some(s);
    let mut f = AuditFilter {
        session: recorded_id(&r.session_id),
        caller: some(r.caller),
        since_ms: (r.since_ms > 0).then_some(r.since_ms),
        until_ms: (r.until_ms > 0).then_some(r.until_ms),
        after_seq: None,
        limit: (r.limit > 0).then_some(r.limit as usize),
    };
    if let (Some(since), Some(until)) = (f.since_ms, f.until_ms) {
        if since > until {
            return Err(Status::invalid_argument(format!("since_ms: {since} is after until_ms {until}")));
        }
    }
    if let Some(who) = who {
        if f.caller.as_deref().is_some_and(|c| c != who) {
            return Err(Status::permission_denied(
                "caller: a caller may read only its own audit records (leave caller empty)",
            ));
        }
        f.caller = Some(who.to_string());
    }
    Ok(f)
}

fn audit_status(e: scd_audit::Error) -> Status {
    audit_error(e).into()
}

impl ScdHandler {
    /// The Audit RPC: pages of records from the database, streamed through
    /// a bounded channel. `who` is the caller's verified identity, `token`
    /// the `x-scd-audit-token` it presented ([`AuditAccess::reader`]).
    pub(crate) fn audit_stream(
        &self,
        r: pb::AuditRequest,
        who: Option<String>,
        token: Option<&[u8]>,
    ) -> Result<AuditStream, Status> {
        let log = self
            .audit
            .clone()
            .ok_or_else(|| Status::failed_precondition("audit: the server runs without --audit-db"))?;
        let reader = self.audit_access.reader(token, who.as_deref()).map_err(Status::from)?;
        let own = match &reader {
            AuditReader::Operator => None,
            AuditReader::Caller(who) => Some(who.as_str()),
        };
        let mut f = filter(r, own)?;
        let permit = self.audit_readers.clone().try_acquire_owned().map_err(|_| {
            self.metrics.rejected("audit_streams_full");
            let mut s = Status::resource_exhausted(format!(
                "audit: {MAX_AUDIT_STREAMS} Audit streams are reading (the limit); retry after 1000 ms"
            ));
            s.metadata_mut().insert("retry-after-ms", "1000".parse().expect("ascii"));
            s
        })?;
        let (tx, rx) = tokio::sync::mpsc::channel(PAGE);
        tokio::spawn(async move {
            let _permit = permit;
            let mut left = f.limit.unwrap_or(usize::MAX);
            while left > 0 {
                f.limit = Some(left.min(PAGE));
                let (query, l) = (f.clone(), log.clone());
                let page = match tokio::task::spawn_blocking(move || l.query(&query)).await {
                    Ok(Ok(page)) => page,
                    Ok(Err(e)) => {
                        let _ = tx.send(Err(audit_status(e))).await;
                        return;
                    }
                    Err(e) => {
                        let _ = tx.send(Err(Status::internal(format!("audit: reader failed: {e}")))).await;
                        return;
                    }
                };
                let full = page.len() == PAGE.min(left);
                left -= page.len();
                f.after_seq = page.last().map(|r| r.seq).or(f.after_seq);
                for rec in page {
                    if tx.send(Ok(to_pb(rec))).await.is_err() {
                        return;
                    }
                }
                if !full {
                    break;
                }
            }
        });
        Ok(Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_session_id_is_recorded_and_queried_by_its_digest() {
        assert_eq!(recorded_id(""), None);
        let short = "s".repeat(MAX_RECORDED_ID_BYTES);
        assert_eq!(recorded_id(&short).as_deref(), Some(short.as_str()));
        let long = "x".repeat(5_000_000);
        let kept = recorded_id(&long).unwrap();
        assert!(kept.starts_with("sha256:") && kept.len() == 7 + 64, "{kept}");
        assert_ne!(recorded_id(&format!("{long}y")).unwrap(), kept);
        let f = filter(pb::AuditRequest { session_id: long, ..Default::default() }, None).unwrap();
        assert_eq!(f.session, Some(kept), "a query finds what was recorded");
    }

    #[test]
    fn filter_checks_range_and_restricts_callers() {
        let req = |caller: &str, since_ms, until_ms| pb::AuditRequest {
            caller: caller.into(),
            since_ms,
            until_ms,
            ..Default::default()
        };
        let err = filter(req("", 10, 5), None).unwrap_err();
        assert_eq!((err.code(), err.message()), (Code::InvalidArgument, "since_ms: 10 is after until_ms 5"));
        let err = filter(req("did:key:other", 0, 0), Some("did:key:me")).unwrap_err();
        assert_eq!(err.code(), Code::PermissionDenied);
        assert!(err.message().starts_with("caller: a caller may read only its own audit records"));
        assert_eq!(filter(req("", 0, 0), Some("did:key:me")).unwrap().caller.as_deref(), Some("did:key:me"));
        let open = filter(req("", 1, 0), None).unwrap();
        assert_eq!((open.caller, open.since_ms, open.until_ms, open.limit), (None, Some(1), None, None));
    }

    #[test]
    fn access_needs_the_token_or_an_identity() {
        let token = "0123456789abcdef-operator";
        let access = AuditAccess::with_operator_token(token);
        assert!(access.has_operator_token());
        assert!(!format!("{access:?}").contains(token), "Debug shows no token");
        assert_eq!(access.reader(Some(token.as_bytes()), None).unwrap(), AuditReader::Operator);
        assert_eq!(access.reader(Some(token.as_bytes()), Some("did:key:me")).unwrap(), AuditReader::Operator);
        assert_eq!(access.reader(None, Some("did:key:me")).unwrap(), AuditReader::Caller("did:key:me".into()));
        let err = Status::from(access.reader(Some(b"0123456789abcdef-guess"), Some("did:key:me")).unwrap_err());
        assert_eq!((err.code(), err.message()), (Code::Unauthenticated, "x-scd-audit-token: does not match"));
        let err = Status::from(access.reader(None, None).unwrap_err());
        assert_eq!(err.code(), Code::PermissionDenied);
        assert!(err.message().contains("present x-scd-audit-token"), "{}", err.message());
        let none = AuditAccess::default();
        assert_eq!(Status::from(none.reader(Some(token.as_bytes()), None).unwrap_err()).code(), Code::Unauthenticated);
        assert_eq!(Status::from(none.reader(None, None).unwrap_err()).code(), Code::PermissionDenied);
    }

    #[test]
    fn records_round_trip_through_the_wire() {
        let mut r = AuditRecord::new("Compress");
        r.seq = 7;
        r.caller = Some("did:key:a".into());
        r.set_task("fix the bug");
        r.level = scd_audit::AuditLevel::Chunks;
        r.chunks = vec![AuditChunk { id: "c".into(), field: "f".into(), score: 0.5, tokens: 3 }];
        r.chunk_count = 1;
        r.withheld = vec!["secrets".into()];
        r.budget_tokens = Some(100);
        r.timings.total_ms = 2.5;
        assert_eq!(from_pb(to_pb(r.clone())), r);
    }

    #[test]
    fn a_rate_call_records_the_budget_it_came_to() {
        let reply = pb::CompressResponse {
            totals: Some(pb::Totals { context_tokens: 334, ..Default::default() }),
            ..Default::default()
        };
        let mut r = AuditRecord::new("Compress");
        r.budget_tokens = Some(0);
        fill_rate_budget(&mut r, None, &reply);
        assert_eq!(r.budget_tokens, Some(0), "a budget call keeps its own");
        fill_rate_budget(&mut r, Some(0.3), &reply);
        assert_eq!(r.budget_tokens, Some(100), "334 x 0.3, rounded down");
    }
}
