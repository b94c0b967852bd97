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
//! | `audit_meta` | name → u64 | `next_seq`, `bytes` (the summed JSON sizes of the records kept), `last_at_ms` |
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
//! first record merged into), a deferred record with the same method,
//! caller, peer, session and outcome as one already written in that window
//! is not written again: the earlier record's `count` grows instead (it
//! keeps the first call's time, task and figures; the growth is not
//! fsync'd of its own, like any deferred record). A client repeating a
//! refused call therefore adds one record a second, not one per call,
//! whatever else is committed meanwhile. At most [`MERGE_KEYS`] distinct
//! kinds are merged per window; past that, records are written one by one
//! (still bounded by the retention).
//!
//! **Time.** `at_ms` is the commit time (unix ms), made non-decreasing in
//! `seq` order (a clock stepping back repeats the last value), so the oldest
//! records are always the first keys.
//!
//! **Retention.** After each commit, in the same transaction, records older
//! than `max_age` are removed, then the oldest until the summed JSON size of
//! the records is at most `max_bytes` (an estimate of the payload, not of the
//! file: redb reuses freed pages but does not shrink its file). Both walk
//! from the first key and stop at the first record kept: no full scan per
//! append. Queries scan records in `seq` order (stopping early past
//! `until_ms` and at `limit`); retention bounds that scan.
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

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use redb::{Database, Durability, ReadableDatabase, ReadableTable, TableDefinition};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tokio::sync::{mpsc, oneshot};

pub use error::{Error, Result};

mod error;

const RECORDS: TableDefinition<u64, &[u8]> = TableDefinition::new("audit_records");
const META: TableDefinition<&str, u64> = TableDefinition::new("audit_meta");

/// Characters of the task text kept in a record; the rest is cut and
/// `task_truncated` is set (the digest covers the whole text).
pub const TASK_CHARS: usize = 200;

/// Appends waiting for the writer thread; more wait for room.
const QUEUE: usize = 1024;

/// How long a deferred record may stay not durable (see the module docs).
pub const DEFER_MAX: Duration = Duration::from_secs(1);

/// Distinct kinds of deferred record merged per window (see the module docs).
pub const MERGE_KEYS: usize = 1024;

fn store_err<E: Into<redb::Error>>(e: E) -> Error {
    Error::Store { source: Box::new(e.into()) }
}

/// How much a record holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AuditLevel {
    /// Nothing is recorded.
    Off,
    /// Everything but the chunk list (`chunk_count` stays).
    #[default]
    Summary,
    /// Also each chunk sent: id, field, score, tokens.
    Chunks,
}

impl std::fmt::Display for AuditLevel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            AuditLevel::Off => "off",
            AuditLevel::Summary => "summary",
            AuditLevel::Chunks => "chunks",
        })
    }
}

impl std::str::FromStr for AuditLevel {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s {
            "off" => Ok(AuditLevel::Off),
            "summary" => Ok(AuditLevel::Summary),
            "chunks" => Ok(AuditLevel::Chunks),
            _ => Err(Error::Invalid {
                field: "audit level".into(),
                reason: format!("{s:?}: expected off, summary or chunks"),
            }),
        }
    }
}

/// One chunk sent to the caller.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AuditChunk {
    /// The chunk id.
    pub id: String,
    /// Its field's name.
    pub field: String,
    /// Its relevance score.
    pub score: f32,
    /// Its tokens.
    pub tokens: u32,
}

/// Where the time went, in milliseconds (the server's `Timing`).
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct AuditTimings {
    /// Waiting for a slot or the encoder.
    pub queue_ms: f64,
    /// Embedding.
    pub inference_ms: f64,
    /// Selection and packing.
    pub selection_ms: f64,
    /// The whole call.
    pub total_ms: f64,
}

/// One audited call (see the module docs). `seq`, `at_ms` and `level` are
/// set by [`AuditLog::append`].
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct AuditRecord {
    /// Position in the log, from 0, never reused.
    pub seq: u64,
    /// Commit time, unix milliseconds, non-decreasing in `seq` order.
    pub at_ms: u64,
    /// `Compress`, `OpenSession`, `RequestContext`, `Handoff` or `AtpTransfer`.
    pub method: String,
    /// The caller's verified identity (DID or certificate), if any.
    pub caller: Option<String>,
    /// The caller's transport address, if known.
    pub peer: Option<String>,
    /// The session, if any.
    pub session_id: Option<String>,
    /// SHA-256 of the whole task text, hex, first 16 characters.
    pub task_digest: Option<String>,
    /// The task text's first [`TASK_CHARS`] characters.
    pub task: Option<String>,
    /// Whether `task` was cut.
    pub task_truncated: bool,
    /// The model that scored the chunks.
    pub model: Option<String>,
    /// The level the record was kept at.
    pub level: AuditLevel,
    /// The chunks sent (empty below [`AuditLevel::Chunks`]).
    pub chunks: Vec<AuditChunk>,
    /// How many chunks were sent.
    pub chunk_count: u32,
    /// Names of the confidential fields withheld (names only, never content).
    pub withheld: Vec<String>,
    /// The token budget asked for, if any.
    pub budget_tokens: Option<u32>,
    /// Tokens of the whole (non-confidential) context.
    pub context_tokens: u64,
    /// Tokens sent.
    pub selected_tokens: u64,
    /// context_tokens / selected_tokens (0 when nothing was sent).
    pub reduction_ratio: f32,
    /// Where the time went.
    pub timings: AuditTimings,
    /// `ok`, or the gRPC status code's name (`InvalidArgument`, ...).
    pub outcome: String,
    /// How many calls the record stands for: 1, or more for deferred
    /// records merged in one window (see the module docs). 0 is read as 1.
    #[serde(default = "one")]
    pub count: u32,
}

fn one() -> u32 {
    1
}

impl AuditRecord {
    /// An `ok` record of `method`, the rest empty.
    pub fn new(method: &str) -> AuditRecord {
        AuditRecord { method: method.to_string(), outcome: "ok".into(), count: 1, ..Default::default() }
    }

    /// Keeps the task's digest and first [`TASK_CHARS`] characters.
    pub fn set_task(&mut self, text: &str) {
        let digest = Sha256::digest(text.as_bytes());
        self.task_digest = Some(digest.iter().take(8).map(|b| format!("{b:02x}")).collect());
        let cut = text.char_indices().nth(TASK_CHARS).map(|(i, _)| i);
        self.task = Some(cut.map_or(text, |i| &text[..i]).to_string());
        self.task_truncated = cut.is_some();
    }
}

/// Which records to keep. `None` keeps them forever / at any size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Retention {
    /// Records older than this are removed.
    pub max_age: Option<Duration>,
    /// The oldest records are removed while the summed JSON size of all
    /// records is over this.
    pub max_bytes: Option<u64>,
}

/// Which records a query returns; `None` matches all.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct AuditFilter {
    /// Only this session.
    pub session: Option<String>,
    /// Only this caller.
    pub caller: Option<String>,
    /// Only records at or after this time (unix ms).
    pub since_ms: Option<u64>,
    /// Only records at or before this time (unix ms).
    pub until_ms: Option<u64>,
    /// Only records after this seq (paging).
    pub after_seq: Option<u64>,
    /// At most this many records (the oldest matching).
    pub limit: Option<usize>,
}

impl AuditFilter {
    /// Checks the time range.
    pub fn check(&self) -> Result<()> {
        if let (Some(since), Some(until)) = (self.since_ms, self.until_ms) {
            if since > until {
                return Err(Error::Invalid {
                    field: "since_ms".into(),
                    reason: format!("{since} is after until_ms {until}"),
                });
            }
        }
        Ok(())
    }

    fn matches(&self, r: &AuditRecord) -> bool {
        self.session.as_ref().is_none_or(|s| r.session_id.as_ref() == Some(s))
            && self.caller.as_ref().is_none_or(|c| r.caller.as_ref() == Some(c))
            && self.since_ms.is_none_or(|t| r.at_ms >= t)
    }
}

/// A batch waiting for the writer: the records, who to tell, and whether
/// it must be durable before they are told (`false`: deferred).
struct Pending {
    records: Vec<AuditRecord>,
    ack: oneshot::Sender<std::result::Result<Vec<u64>, String>>,
    durable: bool,
}

/// The audit trail over redb (see the module docs).
pub struct AuditLog {
    db: Arc<Database>,
    path: PathBuf,
    level: AuditLevel,
    tx: Option<mpsc::Sender<Pending>>,
    writer: Option<std::thread::JoinHandle<()>>,
    /// Durable (fsync'd) commits the writer made.
    durable_commits: Arc<std::sync::atomic::AtomicU64>,
}

impl std::fmt::Debug for AuditLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuditLog").field("path", &self.path).field("level", &self.level).finish_non_exhaustive()
    }
}

fn now_ms() -> u64 {
    scd_did::time::now_ms()
}

fn open_db(path: &Path) -> Result<Database> {
    Database::create(path).map_err(|e| match e {
        redb::DatabaseError::DatabaseAlreadyOpen => Error::Locked { path: path.to_path_buf() },
        e => store_err(e),
    })
}

impl AuditLog {
    /// Opens (or creates) the audit database at `path`: its own redb file.
    /// A file another process holds (a running server) is refused, naming
    /// the file.
    pub fn open(path: &Path, level: AuditLevel, retention: Retention) -> Result<AuditLog> {
        Self::on(Arc::new(open_db(path)?), path, level, retention)
    }

    /// The audit tables in an already open database (see
    /// `scd_atp::store::Store::audit_log`); `path` names it in logs.
    pub fn on(db: Arc<Database>, path: &Path, level: AuditLevel, retention: Retention) -> Result<AuditLog> {
        let tx = db.begin_write().map_err(store_err)?;
        tx.open_table(RECORDS).map_err(store_err)?;
        tx.open_table(META).map_err(store_err)?;
        tx.commit().map_err(store_err)?;
        let (sender, receiver) = mpsc::channel::<Pending>(QUEUE);
        let writer_db = db.clone();
        let durable_commits = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let counted = durable_commits.clone();
        let writer = std::thread::Builder::new()
            .name("audit-writer".into())
            .spawn(move || write_loop(&writer_db, receiver, retention, &counted))
            .map_err(|source| Error::Io { path: path.to_path_buf(), source })?;
        tracing::debug!(path = %path.display(), %level, "audit log opened");
        Ok(AuditLog { db, path: path.to_path_buf(), level, tx: Some(sender), writer: Some(writer), durable_commits })
    }

    /// The level records are kept at.
    pub fn level(&self) -> AuditLevel {
        self.level
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// How many durable (fsync'd) commits the writer has made since the
    /// log was opened.
    pub fn durable_commits(&self) -> u64 {
        self.durable_commits.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Applies the level: `None` at `Off`, no chunk list at `Summary`.
    fn leveled(&self, records: Vec<AuditRecord>) -> Option<Vec<AuditRecord>> {
        if self.level == AuditLevel::Off || records.is_empty() {
            return None;
        }
        Some(
            records
                .into_iter()
                .map(|mut r| {
                    r.level = self.level;
                    if self.level == AuditLevel::Summary {
                        r.chunks.clear();
                    }
                    r
                })
                .collect(),
        )
    }

    fn writer_gone(&self) -> Error {
        Error::Audit { path: self.path.clone(), reason: "the writer thread stopped".into() }
    }

    fn commit_failed(&self, reason: String) -> Error {
        Error::Audit { path: self.path.clone(), reason: format!("commit failed: {reason}") }
    }

    /// Appends records and returns their seqs once they are durable; an
    /// empty list at level `Off`. Blocks: not for async code (see
    /// [`AuditLog::append_async`]).
    pub fn append(&self, records: Vec<AuditRecord>) -> Result<Vec<u64>> {
        let Some(records) = self.leveled(records) else { return Ok(Vec::new()) };
        let (ack, done) = oneshot::channel();
        let tx = self.tx.as_ref().ok_or_else(|| self.writer_gone())?;
        tx.blocking_send(Pending { records, ack, durable: true }).map_err(|_| self.writer_gone())?;
        done.blocking_recv().map_err(|_| self.writer_gone())?.map_err(|e| self.commit_failed(e))
    }

    /// [`AuditLog::append`] for async callers: waits for room in the queue
    /// and for the commit without blocking the runtime.
    pub async fn append_async(&self, records: Vec<AuditRecord>) -> Result<Vec<u64>> {
        self.send(records, true).await
    }

    /// [`AuditLog::append_async`] without an fsync of its own: the records
    /// are committed (readers see them) when it returns, and durable within
    /// [`DEFER_MAX`] (see the module docs). For records a crash may lose,
    /// such as refused calls. A record merged into an earlier one of its
    /// window (see the module docs) gets that record's seq.
    pub async fn append_deferred(&self, records: Vec<AuditRecord>) -> Result<Vec<u64>> {
        self.send(records, false).await
    }

    async fn send(&self, records: Vec<AuditRecord>, durable: bool) -> Result<Vec<u64>> {
        let Some(records) = self.leveled(records) else { return Ok(Vec::new()) };
        let (ack, done) = oneshot::channel();
        let tx = self.tx.as_ref().ok_or_else(|| self.writer_gone())?;
        tx.send(Pending { records, ack, durable }).await.map_err(|_| self.writer_gone())?;
        done.await.map_err(|_| self.writer_gone())?.map_err(|e| self.commit_failed(e))
    }

    /// The matching records, oldest first (see [`AuditFilter`]).
    pub fn query(&self, filter: &AuditFilter) -> Result<Vec<AuditRecord>> {
        filter.check()?;
        let tx = self.db.begin_read().map_err(store_err)?;
        let table = tx.open_table(RECORDS).map_err(store_err)?;
        let start = filter.after_seq.map_or(0, |s| s.saturating_add(1));
        let limit = filter.limit.unwrap_or(usize::MAX);
        let mut out = Vec::new();
        if limit == 0 || filter.after_seq == Some(u64::MAX) {
            return Ok(out);
        }
        for row in table.range(start..).map_err(store_err)? {
            let (seq, json) = row.map_err(store_err)?;
            let r: AuditRecord = serde_json::from_slice(json.value())
                .map_err(|source| Error::Json { what: format!("audit_records[{}]", seq.value()), source })?;
            if filter.until_ms.is_some_and(|t| r.at_ms > t) {
                break;
            }
            if filter.matches(&r) {
                out.push(r);
                if out.len() >= limit {
                    break;
                }
            }
        }
        Ok(out)
    }

    /// How many records are kept, and their summed JSON size in bytes.
    pub fn stats(&self) -> Result<(u64, u64)> {
        let tx = self.db.begin_read().map_err(store_err)?;
        let count = redb::ReadableTableMetadata::len(&tx.open_table(RECORDS).map_err(store_err)?).map_err(store_err)?;
        let bytes = tx.open_table(META).map_err(store_err)?.get("bytes").map_err(store_err)?.map_or(0, |v| v.value());
        Ok((count, bytes))
    }

    /// Applies `retention` now (as if at `now_ms`), in its own durable
    /// transaction; returns how many records were removed. Appends already
    /// prune after each commit: this is for a log that is no longer
    /// written to, or a tighter policy.
    pub fn prune(&self, retention: Retention, now_ms: u64) -> Result<usize> {
        let tx = self.db.begin_write().map_err(store_err)?;
        let removed = {
            let mut records = tx.open_table(RECORDS).map_err(store_err)?;
            let mut meta = tx.open_table(META).map_err(store_err)?;
            prune_in(&mut records, &mut meta, retention, now_ms).map_err(store_err)?
        };
        tx.commit().map_err(store_err)?;
        Ok(removed)
    }
}

impl Drop for AuditLog {
    fn drop(&mut self) {
        // closing the channel ends the writer after the pending batches
        self.tx.take();
        if let Some(w) = self.writer.take() {
            let _ = w.join();
        }
    }
}

/// The writer thread: drains every pending batch into one commit, durable
/// when a batch asks for it or a deferred commit is [`DEFER_MAX`] old (and
/// once more at close when deferred records are not yet durable).
fn write_loop(
    db: &Database,
    mut rx: mpsc::Receiver<Pending>,
    retention: Retention,
    durable_commits: &std::sync::atomic::AtomicU64,
) {
    // a timer for the deferred window: this thread's own clockwork, no I/O
    let rt = match tokio::runtime::Builder::new_current_thread().enable_time().build() {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!(error = %e, "audit writer: no timer; the calls fail");
            return;
        }
    };
    let mut deferred_since: Option<std::time::Instant> = None;
    // the deferred records written in this window, by kind (see Merges)
    let mut merges = Merges::default();
    loop {
        let first = match deferred_since {
            None => rx.blocking_recv(),
            Some(since) => {
                let left = DEFER_MAX.saturating_sub(since.elapsed());
                match rt.block_on(async { tokio::time::timeout(left, rx.recv()).await }) {
                    Ok(got) => got,
                    Err(_) => {
                        // the window closed with no durable commit: make one
                        flush(db, &mut deferred_since, durable_commits);
                        continue;
                    }
                }
            }
        };
        let Some(first) = first else { break };
        let mut batch = vec![first];
        while let Ok(more) = rx.try_recv() {
            batch.push(more);
        }
        let records: usize = batch.iter().map(|p| p.records.len()).sum();
        let durable =
            batch.iter().any(|p| p.durable) || deferred_since.is_some_and(|since| since.elapsed() >= DEFER_MAX);
        match commit(db, &mut batch, retention, durable, &mut merges) {
            Ok(seqs) => {
                tracing::trace!(records, batches = batch.len(), durable, "audit commit");
                if durable {
                    durable_commits.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    deferred_since = None;
                } else {
                    deferred_since.get_or_insert_with(std::time::Instant::now);
                }
                for (p, seqs) in batch.into_iter().zip(seqs) {
                    let _ = p.ack.send(Ok(seqs));
                }
            }
            Err(e) => {
                tracing::error!(error = %e, records, "audit commit failed; the calls fail");
                // what the map points at may not have been written
                merges.clear();
                for p in batch {
                    let _ = p.ack.send(Err(e.to_string()));
                }
            }
        }
    }
    if deferred_since.is_some() {
        flush(db, &mut deferred_since, durable_commits);
    }
}

/// An empty durable commit: every deferred commit before it becomes durable.
fn flush(
    db: &Database,
    deferred_since: &mut Option<std::time::Instant>,
    durable_commits: &std::sync::atomic::AtomicU64,
) {
    let done = db.begin_write().map_err(store_err).and_then(|mut tx| {
        tx.set_durability(Durability::Immediate).map_err(store_err)?;
        tx.commit().map_err(store_err)
    });
    match done {
        Ok(()) => {
            durable_commits.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            *deferred_since = None;
        }
        // retried at the next window or commit
        Err(e) => {
            tracing::error!(error = %e, "audit: deferred records could not be made durable; retrying in one window");
            // the next try is a window later, not at once: no spin on a failing disk
            *deferred_since = Some(std::time::Instant::now());
        }
    }
}

/// What makes two deferred records one merged record: method, caller,
/// peer, session and outcome.
type MergeKey = (String, Option<String>, Option<String>, Option<String>, String);

/// The deferred records written in the current merge window: kind → its
/// seq and the record as stored (count included), so a repeat rewrites it
/// without reading it back. At most [`MERGE_KEYS`]; the window opens with
/// its first record and closes [`DEFER_MAX`] later (or when a commit fails).
#[derive(Default)]
struct Merges {
    seqs: std::collections::HashMap<MergeKey, (u64, AuditRecord)>,
    since: Option<std::time::Instant>,
}

impl Merges {
    fn key(r: &AuditRecord) -> MergeKey {
        (r.method.clone(), r.caller.clone(), r.peer.clone(), r.session_id.clone(), r.outcome.clone())
    }

    fn clear(&mut self) {
        self.seqs.clear();
        self.since = None;
    }

    /// Closes the window once it is [`DEFER_MAX`] old.
    fn expire(&mut self) {
        if self.since.is_some_and(|t| t.elapsed() >= DEFER_MAX) {
            self.clear();
        }
    }
}

fn meta_get(meta: &redb::Table<&str, u64>, key: &str) -> std::result::Result<u64, redb::StorageError> {
    Ok(meta.get(key)?.map_or(0, |v| v.value()))
}

/// One transaction: numbers, stamps and stores every record of `batch`
/// (a deferred one merged into its window's earlier record of the same
/// kind, see [`Merges`]), then prunes; returns each batch's seqs.
fn commit(
    db: &Database,
    batch: &mut [Pending],
    retention: Retention,
    durable: bool,
    merges: &mut Merges,
) -> std::result::Result<Vec<Vec<u64>>, Error> {
    let mut tx = db.begin_write().map_err(store_err)?;
    tx.set_durability(if durable { Durability::Immediate } else { Durability::None }).map_err(store_err)?;
    let mut seqs = Vec::with_capacity(batch.len());
    {
        let mut records = tx.open_table(RECORDS).map_err(store_err)?;
        let mut meta = tx.open_table(META).map_err(store_err)?;
        let mut next = meta_get(&meta, "next_seq").map_err(store_err)?;
        let mut bytes = meta_get(&meta, "bytes").map_err(store_err)?;
        let at_ms = now_ms().max(meta_get(&meta, "last_at_ms").map_err(store_err)?);
        for p in batch.iter_mut() {
            let mut these = Vec::with_capacity(p.records.len());
            for r in p.records.iter_mut() {
                r.count = r.count.max(1);
                if !p.durable {
                    merges.expire();
                    let key = Merges::key(r);
                    if let Some((seq, stored)) = merges.seqs.get_mut(&key) {
                        // unless retention has removed it since
                        let here = records.get(*seq).map_err(store_err)?.map(|v| v.value().len() as u64);
                        if let Some(old) = here {
                            stored.count = stored.count.saturating_add(r.count);
                            let grown = serde_json::to_vec(stored)
                                .map_err(|source| Error::Json { what: format!("audit_records[{seq}]"), source })?;
                            records.insert(*seq, grown.as_slice()).map_err(store_err)?;
                            bytes = (bytes + grown.len() as u64).saturating_sub(old);
                            these.push(*seq);
                            continue;
                        }
                    }
                }
                r.seq = next;
                r.at_ms = at_ms;
                let json = serde_json::to_vec(r)
                    .map_err(|source| Error::Json { what: format!("audit_records[{next}]"), source })?;
                if !p.durable {
                    let key = Merges::key(r);
                    if merges.seqs.len() < MERGE_KEYS || merges.seqs.contains_key(&key) {
                        merges.seqs.insert(key, (next, r.clone()));
                        merges.since.get_or_insert_with(std::time::Instant::now);
                    }
                }
                records.insert(next, json.as_slice()).map_err(store_err)?;
                bytes += json.len() as u64;
                these.push(next);
                next += 1;
            }
            seqs.push(these);
        }
        meta.insert("next_seq", next).map_err(store_err)?;
        meta.insert("bytes", bytes).map_err(store_err)?;
        meta.insert("last_at_ms", at_ms).map_err(store_err)?;
        prune_in(&mut records, &mut meta, retention, at_ms).map_err(store_err)?;
    }
    tx.commit().map_err(store_err)?;
    Ok(seqs)
}

/// Removes the oldest records past `retention` (see the module docs).
fn prune_in(
    records: &mut redb::Table<u64, &[u8]>,
    meta: &mut redb::Table<&str, u64>,
    retention: Retention,
    now_ms: u64,
) -> std::result::Result<usize, redb::Error> {
    let cutoff = retention.max_age.map(|a| now_ms.saturating_sub(a.as_millis() as u64));
    let mut bytes = meta_get(meta, "bytes")?;
    let mut removed = 0;
    loop {
        let Some((_, json)) = records.first()? else { break };
        let size = json.value().len() as u64;
        let too_big = retention.max_bytes.is_some_and(|max| bytes > max);
        let too_old = cutoff.is_some_and(|c| {
            // only at_ms is needed: a record that does not parse is removed as old
            serde_json::from_slice::<AtMs>(json.value()).map_or(true, |r| r.at_ms < c)
        });
        drop(json);
        if !(too_big || too_old) {
            break;
        }
        records.pop_first()?;
        bytes = bytes.saturating_sub(size);
        removed += 1;
    }
    if removed > 0 {
        meta.insert("bytes", bytes)?;
        tracing::debug!(removed, bytes, "audit records pruned");
    }
    Ok(removed)
}

#[derive(Deserialize)]
struct AtMs {
    at_ms: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open(dir: &tempfile::TempDir, level: AuditLevel, retention: Retention) -> AuditLog {
        AuditLog::open(&dir.path().join("audit.redb"), level, retention).unwrap()
    }

    fn rec(session: &str, caller: &str) -> AuditRecord {
        let mut r = AuditRecord::new("Compress");
        r.session_id = Some(session.into());
        r.caller = Some(caller.into());
        r.chunks = vec![AuditChunk { id: "c1".into(), field: "code".into(), score: 0.5, tokens: 12 }];
        r.chunk_count = 1;
        r.withheld = vec!["secrets".into()];
        r
    }

    #[test]
    fn levels_decide_what_is_kept() {
        let dir = tempfile::tempdir().unwrap();
        let off = open(&dir, AuditLevel::Off, Retention::default());
        assert!(off.append(vec![rec("s", "a")]).unwrap().is_empty());
        assert_eq!(off.stats().unwrap().0, 0, "off writes nothing");
        drop(off);
        let summary = open(&dir, AuditLevel::Summary, Retention::default());
        summary.append(vec![rec("s", "a")]).unwrap();
        drop(summary);
        let chunks = open(&dir, AuditLevel::Chunks, Retention::default());
        chunks.append(vec![rec("s", "a")]).unwrap();
        let all = chunks.query(&AuditFilter::default()).unwrap();
        assert_eq!(all.len(), 2);
        assert_eq!((all[0].level, all[0].chunks.len(), all[0].chunk_count), (AuditLevel::Summary, 0, 1));
        assert_eq!(all[0].withheld, ["secrets"], "summary keeps the withheld names");
        assert_eq!((all[1].level, all[1].chunks[0].id.as_str()), (AuditLevel::Chunks, "c1"));
        assert_eq!("chunks".parse::<AuditLevel>().unwrap(), AuditLevel::Chunks);
        assert_eq!(AuditLevel::Summary.to_string(), "summary");
        let err = "loud".parse::<AuditLevel>().unwrap_err();
        assert_eq!(err.to_string(), "audit level: \"loud\": expected off, summary or chunks");
    }

    #[test]
    fn task_is_cut_and_digested() {
        let mut r = AuditRecord::new("Compress");
        let long = "é".repeat(TASK_CHARS + 5);
        r.set_task(&long);
        assert_eq!(r.task.as_ref().unwrap().chars().count(), TASK_CHARS);
        assert!(r.task_truncated);
        let digest = r.task_digest.clone().unwrap();
        assert_eq!(digest.len(), 16);
        r.set_task("short");
        assert_eq!((r.task.as_deref(), r.task_truncated), (Some("short"), false));
        assert_ne!(r.task_digest.unwrap(), digest);
    }

    #[test]
    fn retention_by_size_removes_the_oldest() {
        let dir = tempfile::tempdir().unwrap();
        let one = serde_json::to_vec(&{
            let mut r = rec("s0", "a");
            r.level = AuditLevel::Summary;
            r.chunks.clear();
            r.at_ms = now_ms();
            r
        })
        .unwrap()
        .len() as u64;
        // room for 3 records (all of the same size: one-digit seqs and sessions)
        let log = open(&dir, AuditLevel::Summary, Retention { max_age: None, max_bytes: Some(3 * one + 2) });
        for i in 0..10 {
            log.append(vec![rec(&format!("s{i}"), "a")]).unwrap();
        }
        let kept = log.query(&AuditFilter::default()).unwrap();
        let sessions: Vec<_> = kept.iter().map(|r| r.session_id.clone().unwrap()).collect();
        assert_eq!(sessions, ["s7", "s8", "s9"], "the newest are kept");
        let (count, bytes) = log.stats().unwrap();
        assert_eq!(count, 3);
        assert!(bytes <= 3 * one + 2, "{bytes} bytes kept");
        assert_eq!(kept[0].seq, 7, "seqs are not reused");
    }

    #[test]
    fn retention_by_age_removes_the_old() {
        let dir = tempfile::tempdir().unwrap();
        let log = open(&dir, AuditLevel::Summary, Retention::default());
        log.append(vec![rec("old1", "a"), rec("old2", "a")]).unwrap();
        let later = now_ms() + 60_000;
        // a minute later, with a 30 s limit: both go
        let removed = log.prune(Retention { max_age: Some(Duration::from_secs(30)), max_bytes: None }, later).unwrap();
        assert_eq!(removed, 2);
        log.append(vec![rec("new", "a")]).unwrap();
        // an hour's limit keeps the new one
        assert_eq!(
            log.prune(Retention { max_age: Some(Duration::from_secs(3600)), max_bytes: None }, later).unwrap(),
            0
        );
        let kept = log.query(&AuditFilter::default()).unwrap();
        assert_eq!(kept.len(), 1);
        assert_eq!(kept[0].session_id.as_deref(), Some("new"));
        assert!(log.stats().unwrap().1 > 0);
        // a zero max_age on the writer prunes everything older than the commit
        drop(log);
        let log = open(&dir, AuditLevel::Summary, Retention { max_age: Some(Duration::ZERO), max_bytes: None });
        std::thread::sleep(Duration::from_millis(5));
        log.append(vec![rec("newest", "a")]).unwrap();
        let kept = log.query(&AuditFilter::default()).unwrap();
        assert_eq!(kept.iter().map(|r| r.session_id.clone().unwrap()).collect::<Vec<_>>(), ["newest"]);
    }

    #[test]
    fn filters_by_session_caller_time_and_limit() {
        let dir = tempfile::tempdir().unwrap();
        let log = open(&dir, AuditLevel::Summary, Retention::default());
        log.append(vec![rec("s1", "did:a"), rec("s2", "did:b")]).unwrap();
        let t1 = log.query(&AuditFilter::default()).unwrap()[0].at_ms;
        std::thread::sleep(Duration::from_millis(3));
        log.append(vec![rec("s1", "did:b")]).unwrap();
        let t2 = log.query(&AuditFilter { after_seq: Some(1), ..Default::default() }).unwrap()[0].at_ms;
        assert!(t2 > t1);
        let q = |f: AuditFilter| log.query(&f).unwrap().iter().map(|r| r.seq).collect::<Vec<_>>();
        assert_eq!(q(AuditFilter { session: Some("s1".into()), ..Default::default() }), [0, 2]);
        assert_eq!(q(AuditFilter { caller: Some("did:b".into()), ..Default::default() }), [1, 2]);
        assert_eq!(q(AuditFilter { since_ms: Some(t2), ..Default::default() }), [2]);
        assert_eq!(q(AuditFilter { until_ms: Some(t1), ..Default::default() }), [0, 1]);
        assert_eq!(q(AuditFilter { limit: Some(1), caller: Some("did:b".into()), ..Default::default() }), [1]);
        assert_eq!(
            q(AuditFilter { session: Some("s1".into()), caller: Some("did:a".into()), ..Default::default() }),
            [0]
        );
        let err = log.query(&AuditFilter { since_ms: Some(t2), until_ms: Some(t1), ..Default::default() }).unwrap_err();
        assert_eq!(err.to_string(), format!("since_ms: {t2} is after until_ms {t1}"));
    }

    #[test]
    fn concurrent_writers_lose_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let log = Arc::new(open(&dir, AuditLevel::Chunks, Retention::default()));
        let threads: Vec<_> = (0..8)
            .map(|t| {
                let log = log.clone();
                std::thread::spawn(move || {
                    (0..200).flat_map(|i| log.append(vec![rec(&format!("t{t}-{i}"), "a")]).unwrap()).collect::<Vec<_>>()
                })
            })
            .collect();
        let mut seqs: Vec<u64> = threads.into_iter().flat_map(|t| t.join().unwrap()).collect();
        seqs.sort_unstable();
        seqs.dedup();
        assert_eq!(seqs.len(), 1600, "distinct seqs");
        let all = log.query(&AuditFilter::default()).unwrap();
        assert_eq!(all.len(), 1600);
        assert!(all.windows(2).all(|w| w[0].seq + 1 == w[1].seq && w[0].at_ms <= w[1].at_ms));
        let mut sessions: Vec<_> = all.iter().map(|r| r.session_id.clone().unwrap()).collect();
        sessions.sort();
        sessions.dedup();
        assert_eq!(sessions.len(), 1600, "every record is a different append");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn async_appends_and_reopen_keep_records() {
        let dir = tempfile::tempdir().unwrap();
        let log = Arc::new(open(&dir, AuditLevel::Summary, Retention::default()));
        let tasks: Vec<_> = (0..16)
            .map(|i| {
                let log = log.clone();
                tokio::spawn(async move { log.append_async(vec![rec(&format!("s{i}"), "a")]).await.unwrap() })
            })
            .collect();
        for t in tasks {
            assert_eq!(t.await.unwrap().len(), 1);
        }
        drop(Arc::try_unwrap(log).unwrap());
        let log = open(&dir, AuditLevel::Summary, Retention::default());
        assert_eq!(log.query(&AuditFilter::default()).unwrap().len(), 16);
        assert_eq!(log.append_async(vec![rec("after", "a")]).await.unwrap(), [16], "seqs continue after a reopen");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn deferred_appends_are_visible_at_once_and_durable_within_the_window() {
        let dir = tempfile::tempdir().unwrap();
        let log = open(&dir, AuditLevel::Summary, Retention::default());
        log.append_async(vec![rec("first", "a")]).await.unwrap();
        assert_eq!(log.durable_commits(), 1);
        for i in 0..50 {
            let seqs = log.append_deferred(vec![rec(&format!("refused-{i}"), "a")]).await.unwrap();
            assert_eq!(seqs, [i + 1]);
        }
        assert_eq!(log.query(&AuditFilter::default()).unwrap().len(), 51, "readers see deferred records at once");
        let fsyncs = log.durable_commits();
        assert!(fsyncs <= 2, "50 deferred appends made {} durable commits", fsyncs - 1);
        // with no other commit, the writer makes one within the window
        tokio::time::sleep(DEFER_MAX + Duration::from_millis(300)).await;
        assert_eq!(log.durable_commits(), fsyncs + 1, "one flush for the window");
        tokio::time::sleep(DEFER_MAX + Duration::from_millis(100)).await;
        assert_eq!(log.durable_commits(), fsyncs + 1, "nothing deferred, no more flushes");
        // deferred records are flushed when the log closes, too
        log.append_deferred(vec![rec("last", "a")]).await.unwrap();
        drop(log);
        let log = open(&dir, AuditLevel::Summary, Retention::default());
        let all = log.query(&AuditFilter::default()).unwrap();
        assert_eq!(all.len(), 52);
        assert_eq!(all[51].session_id.as_deref(), Some("last"));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn repeated_deferred_records_merge_into_one_per_window() {
        let dir = tempfile::tempdir().unwrap();
        let log = open(&dir, AuditLevel::Summary, Retention::default());
        let refused = |session: &str, outcome: &str| {
            let mut r = rec(session, "a");
            r.outcome = outcome.into();
            r
        };
        // one call (merged within its commit), then a few more calls (merged
        // across commits, and across a durable one): all in one window
        let first = log.append_deferred((0..96).map(|_| refused("s", "PermissionDenied")).collect()).await.unwrap();
        assert!(first.iter().all(|&s| s == first[0]), "{first:?}");
        for _ in 0..2 {
            assert_eq!(log.append_deferred(vec![refused("s", "PermissionDenied")]).await.unwrap(), [first[0]]);
        }
        log.append_async(vec![rec("durable", "a")]).await.unwrap();
        let again = log.append_deferred(vec![refused("s", "PermissionDenied"), refused("s", "PermissionDenied")]);
        assert_eq!(again.await.unwrap(), [first[0], first[0]], "a durable commit does not end the window");
        let first = vec![first[0]];
        // another kind (outcome, session) is its own record; a durable
        // record is never merged
        let other = log.append_deferred(vec![refused("s", "InvalidArgument")]).await.unwrap();
        let third = log.append_deferred(vec![refused("t", "PermissionDenied")]).await.unwrap();
        assert_ne!(other, first);
        assert_ne!(third, other);
        let durable = log.append_async(vec![refused("s", "PermissionDenied")]).await.unwrap();
        assert!(durable[0] > third[0], "a durable record of a merged kind is its own: {durable:?}");
        let all = log.query(&AuditFilter::default()).unwrap();
        let counts: Vec<_> = all.iter().map(|r| (r.outcome.as_str(), r.count)).collect();
        let want = [
            ("PermissionDenied", 100),
            ("ok", 1),
            ("InvalidArgument", 1),
            ("PermissionDenied", 1),
            ("PermissionDenied", 1),
        ];
        assert_eq!(counts, want);
        let (n, bytes) = log.stats().unwrap();
        let json: u64 = all.iter().map(|r| serde_json::to_vec(r).unwrap().len() as u64).sum();
        assert_eq!((n, bytes), (5, json), "the byte count follows the grown record");
        // the next window starts a new record of the kind
        tokio::time::sleep(DEFER_MAX + Duration::from_millis(300)).await;
        let next = log.append_deferred(vec![refused("s", "PermissionDenied")]).await.unwrap();
        assert_ne!(next, first);
        let ok = log.append_async(vec![rec("s", "a")]).await.unwrap();
        assert_ne!(ok, next);
        // old records (no count) read as one call
        let mut old = serde_json::to_value(rec("old", "a")).unwrap();
        old.as_object_mut().unwrap().remove("count");
        assert_eq!(serde_json::from_value::<AuditRecord>(old).unwrap().count, 1);
    }

    #[test]
    fn a_second_opener_is_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let _log = open(&dir, AuditLevel::Summary, Retention::default());
        let path = dir.path().join("audit.redb");
        let err = AuditLog::open(&path, AuditLevel::Summary, Retention::default()).unwrap_err();
        assert!(matches!(err, Error::Locked { .. }));
        assert_eq!(
            err.to_string(),
            format!(
                "{}: the audit database is open in another process (a running server holds its lock; query it with --server)",
                path.display()
            )
        );
    }
}
