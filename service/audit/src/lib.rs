//! # scd-audit
//!
//! The audit trail: one record per Compress, OpenSession, RequestContext,
//! Handoff or ATP transfer (an ACP-style trajectory), kept in redb.
//!
//! A record ([`AuditRecord`]) names the caller (its DID or certificate
//! identity) and the peer address, the session, the task (a SHA-256 digest
//! and its first [`TASK_CHARS`] characters, with `task_truncated` saying
//! whether more was cut), the model, the chunks sent (ids, fields, scores,
//! token counts — at level [`AuditLevel::Chunks`] only; `chunk_count`
//! always), the **names** of the confidential fields withheld (never their
//! content), the budget, the totals, the timings and the outcome (`"ok"` or
//! the gRPC status code's name).
//!
//! | table | key → value | |
//! |---|---|---|
//! | `audit_records` | seq (u64, big-endian order) → the record as JSON | `seq` grows by one per record and is never reused |
//! | `audit_meta` | name → u64 | `next_seq`, `bytes` (the summed JSON sizes of the records kept), `refused_bytes` (the same of refused calls' records), `last_at_ms` |
//! | `audit_refused` | seq → JSON size | one row per refused call's (deferred) record kept, for retention |
//!
//! **Bounds.** Every record is bounded before it is stored
//! ([`AuditRecord::bounded`]): each id-like string (session, caller, peer,
//! model, method, outcome, chunk ids, field and withheld names) is kept as
//! sent when at most [`MAX_ID_BYTES`] bytes with no control character, else
//! as `sha256:` and its digest ([`bounded_id`]; a query names it the same
//! way); the task keeps [`TASK_CHARS`] characters; lists keep [`MAX_LIST`]
//! entries. A record therefore weighs a few kilobytes at most, whatever the
//! caller sent.
//!
//! **Durability.** [`AuditLog::append`] returns only after the records are
//! committed with `Durability::Immediate` (fsync'd): a server records an RPC
//! before it replies, so a reply a client saw survives a `kill -9`. One
//! writer thread takes everything pending from a bounded channel into one
//! write transaction, so concurrent callers share an fsync (group commit). A
//! full channel makes callers wait (back-pressure), it never drops a record;
//! a failed commit is returned to every caller of that batch (a server then
//! fails the RPC with INTERNAL `audit: …` rather than answer unrecorded).
//!
//! **Deferred records.** [`AuditLog::append_deferred`] (a server's refused
//! calls) is committed without an fsync of its own (`Durability::None`):
//! readers see it when the call returns, and it becomes durable with the
//! next durable commit, which the writer makes at most [`DEFER_MAX`] after
//! the first deferred one (and when the log is closed). A client sending
//! refused calls in a loop therefore costs at most one fsync per
//! [`DEFER_MAX`]; a crash may lose the refusals of that last window, never a
//! record of [`AuditLog::append`].
//!
//! **Merged refusals.** Within one merge window ([`DEFER_MAX`] from the
//! first record merged into), a deferred record of the same kind (method,
//! caller, peer address without its port, outcome) and session as one
//! already written in that window is not written again: the earlier
//! record's `count` grows instead (it keeps the first call's time, peer,
//! task and figures; the growth is not fsync'd of its own, like any
//! deferred record). Each kind gets a record for at most [`MERGE_SESSIONS`]
//! sessions per window; its calls naming further sessions merge into one
//! more record of the kind with no session, so distinct ids (or a new
//! connection per call) do not defeat the merging. A client repeating a
//! refused call therefore adds at most [`MERGE_SESSIONS`] + 1 records a
//! second, whatever else is committed meanwhile. At most [`MERGE_KEYS`]
//! keys are merged per window; past that, records are written one by one
//! (still bounded by the retention).
//!
//! **Time.** `at_ms` is the commit time (unix ms), made non-decreasing in
//! `seq` order (a clock stepping back repeats the last value), so the oldest
//! records are always the first keys.
//!
//! **Retention.** After each commit, in the same transaction: records older
//! than `max_age` are removed; then refused calls' (deferred) records, oldest
//! first, while they hold more than their share of `max_bytes`
//! ([`Retention::refused_max_bytes`], a [`REFUSED_PARTS`]th); then, while the
//! summed JSON size of all records is over `max_bytes`, refused calls'
//! oldest records first, and the oldest successful call's only when no
//! refused call's is left. A refused call can therefore never evict a
//! successful call's record; successful calls may take the whole cap. Sizes
//! are an estimate of the payload, not of the file (redb reuses freed pages
//! but does not shrink its file). Every walk starts from a table's first key
//! and stops at the first record kept: no full scan per append. Queries scan
//! records in `seq` order (stopping early past `until_ms` and at `limit`);
//! retention bounds that scan.
//!
//! ```
//! use scd_audit::{AuditFilter, AuditLevel, AuditLog, AuditRecord, Retention};
//!
//! let dir = tempfile::tempdir().unwrap();
//! let path = dir.path().join("audit.redb");
//! let log = AuditLog::open(&path, AuditLevel::Summary, Retention::default()).unwrap();
//! let mut rec = AuditRecord::new("Compress");
//! rec.session_id = Some("s-1".into());
//! rec.set_task("Fix the failing login test");
//! log.append(vec![rec]).unwrap();
//! drop(log);
//! let log = AuditLog::open(&path, AuditLevel::Summary, Retention::default()).unwrap();
//! let found = log.query(&AuditFilter { session: Some("s-1".into()), ..Default::default() }).unwrap();
//! assert_eq!(found[0].task.as_deref(), Some("Fix the failing login test"));
//! ```

#![warn(missing_docs)]

use std::time::Duration;

pub use error::{Error, Result};
pub use filter::AuditFilter;
pub use log::AuditLog;
pub use merge::{MERGE_KEYS, MERGE_SESSIONS};
pub use record::{bounded_id, AuditChunk, AuditLevel, AuditRecord, AuditTimings, MAX_ID_BYTES, MAX_LIST, TASK_CHARS};
pub use retention::{Retention, REFUSED_PARTS};

mod error;
mod filter;
mod log;
mod merge;
mod record;
mod retention;
mod writer;

#[cfg(test)]
mod tests;

/// Appends waiting for the writer thread; more wait for room.
const QUEUE: usize = 1024;

/// How long a deferred record may stay not durable (see the module docs).
pub const DEFER_MAX: Duration = Duration::from_secs(1);

fn store_err<E: Into<redb::Error>>(e: E) -> Error {
    Error::Store { source: Box::new(e.into()) }
}

fn now_ms() -> u64 {
    scd_did::time::now_ms()
}
