//! [`AuditLog`]: opening the database, appending (durable or deferred),
//! queries and stats.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use redb::{Database, ReadableDatabase};
use tokio::sync::{mpsc, oneshot};

use crate::filter::AuditFilter;
use crate::record::{AuditLevel, AuditRecord};
use crate::retention::{prune_in, Retention, Tables, META, RECORDS, REFUSED};
use crate::writer::{write_loop, Pending};
use crate::{store_err, Error, Result, QUEUE};

/// The audit trail over redb (see the module docs).
pub struct AuditLog {
    db: Arc<Database>,
    path: PathBuf,
    level: AuditLevel,
    tx: Option<mpsc::Sender<Pending>>,
    writer: Option<std::thread::JoinHandle<()>>,
    /// Durable (fsync'd) commits the writer made.
    durable_commits: Arc<AtomicU64>,
}

impl std::fmt::Debug for AuditLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuditLog").field("path", &self.path).field("level", &self.level).finish_non_exhaustive()
    }
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
        Tables::open(&tx).map_err(store_err)?;
        tx.commit().map_err(store_err)?;
        let (sender, receiver) = mpsc::channel::<Pending>(QUEUE);
        let writer_db = db.clone();
        let durable_commits = Arc::new(AtomicU64::new(0));
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
        self.durable_commits.load(Ordering::Relaxed)
    }

    /// Applies the level: `None` at `Off`, no chunk list at `Summary`.
    fn leveled(&self, records: Vec<AuditRecord>) -> Option<Vec<AuditRecord>> {
        if self.level == AuditLevel::Off || records.is_empty() {
            return None;
        }
        Some(
            records
                .into_iter()
                .map(|r| {
                    let mut r = r.bounded();
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
    /// [`DEFER_MAX`](crate::DEFER_MAX) (see the module docs). For records a crash may lose,
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
        let filter = &filter.bounded();
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

    /// How many refused calls' (deferred) records are kept, and their
    /// summed JSON size in bytes (see [`Retention::refused_max_bytes`]).
    pub fn refused_stats(&self) -> Result<(u64, u64)> {
        let tx = self.db.begin_read().map_err(store_err)?;
        let count = redb::ReadableTableMetadata::len(&tx.open_table(REFUSED).map_err(store_err)?).map_err(store_err)?;
        let meta = tx.open_table(META).map_err(store_err)?;
        let bytes = meta.get("refused_bytes").map_err(store_err)?.map_or(0, |v| v.value());
        Ok((count, bytes))
    }

    /// Applies `retention` now (as if at `now_ms`), in its own durable
    /// transaction; returns how many records were removed. Appends already
    /// prune after each commit: this is for a log that is no longer
    /// written to, or a tighter policy.
    pub fn prune(&self, retention: Retention, now_ms: u64) -> Result<usize> {
        let tx = self.db.begin_write().map_err(store_err)?;
        let removed = {
            let mut t = Tables::open(&tx).map_err(store_err)?;
            prune_in(&mut t, retention, now_ms).map_err(store_err)?
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
