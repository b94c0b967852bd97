//! The writer thread (see the crate docs): group commit, deferred commits
//! made durable within [`DEFER_MAX`], merged refusals, and retention after
//! each commit, in the same transaction.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use redb::{Database, Durability, ReadableTable};
use tokio::sync::{mpsc, oneshot};

use crate::merge::Merges;
use crate::record::AuditRecord;
use crate::retention::{prune_in, Retention, Tables};
use crate::{now_ms, store_err, Error, DEFER_MAX};

/// A batch waiting for the writer: the records, who to tell, and whether
/// it must be durable before they are told (`false`: deferred, a refused
/// call's).
pub(crate) struct Pending {
    pub(crate) records: Vec<AuditRecord>,
    pub(crate) ack: oneshot::Sender<std::result::Result<Vec<u64>, String>>,
    pub(crate) durable: bool,
}

/// The writer thread: drains every pending batch into one commit, durable
/// when a batch asks for it or a deferred commit is [`DEFER_MAX`] old (and
/// once more at close when deferred records are not yet durable).
pub(crate) fn write_loop(
    db: &Database,
    mut rx: mpsc::Receiver<Pending>,
    retention: Retention,
    durable_commits: &AtomicU64,
) {
    // a timer for the deferred window: this thread's own clockwork, no I/O
    let rt = match tokio::runtime::Builder::new_current_thread().enable_time().build() {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!(error = %e, "audit writer: no timer; the calls fail");
            return;
        }
    };
    let mut deferred_since: Option<Instant> = None;
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
                    durable_commits.fetch_add(1, Ordering::Relaxed);
                    deferred_since = None;
                } else {
                    deferred_since.get_or_insert_with(Instant::now);
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
fn flush(db: &Database, deferred_since: &mut Option<Instant>, durable_commits: &AtomicU64) {
    let done = db.begin_write().map_err(store_err).and_then(|mut tx| {
        tx.set_durability(Durability::Immediate).map_err(store_err)?;
        tx.commit().map_err(store_err)
    });
    match done {
        Ok(()) => {
            durable_commits.fetch_add(1, Ordering::Relaxed);
            *deferred_since = None;
        }
        // retried at the next window or commit
        Err(e) => {
            tracing::error!(error = %e, "audit: deferred records could not be made durable; retrying in one window");
            // the next try is a window later, not at once: no spin on a failing disk
            *deferred_since = Some(Instant::now());
        }
    }
}

/// The figures one commit updates as it stores records.
struct Counters {
    next: u64,
    bytes: u64,
    refused: u64,
    at_ms: u64,
}

/// One transaction: numbers, stamps and stores every record of `batch`
/// (a deferred one merged into its window's earlier record of the same
/// kind, see [`Merges`]), then prunes; returns each batch's seqs.
pub(crate) fn commit(
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
        let mut t = Tables::open(&tx).map_err(store_err)?;
        let mut c = Counters {
            next: t.meta("next_seq").map_err(store_err)?,
            bytes: t.meta("bytes").map_err(store_err)?,
            refused: t.meta("refused_bytes").map_err(store_err)?,
            at_ms: now_ms().max(t.meta("last_at_ms").map_err(store_err)?),
        };
        for p in batch.iter_mut() {
            let mut these = Vec::with_capacity(p.records.len());
            for r in p.records.iter_mut() {
                r.count = r.count.max(1);
                let seq =
                    if p.durable { store(&mut t, r, &mut c)?.0 } else { store_refused(&mut t, r, &mut c, merges)? };
                these.push(seq);
            }
            seqs.push(these);
        }
        for (k, v) in [("next_seq", c.next), ("bytes", c.bytes), ("refused_bytes", c.refused), ("last_at_ms", c.at_ms)]
        {
            t.meta.insert(k, v).map_err(store_err)?;
        }
        prune_in(&mut t, retention, c.at_ms).map_err(store_err)?;
    }
    tx.commit().map_err(store_err)?;
    Ok(seqs)
}

fn json(r: &AuditRecord, seq: u64) -> Result<Vec<u8>, Error> {
    serde_json::to_vec(r).map_err(|source| Error::Json { what: format!("audit_records[{seq}]"), source })
}

/// Stores `r` as a new record; returns its seq and JSON size.
fn store(t: &mut Tables, r: &mut AuditRecord, c: &mut Counters) -> Result<(u64, u64), Error> {
    let seq = c.next;
    r.seq = seq;
    r.at_ms = c.at_ms;
    let json = json(r, seq)?;
    t.records.insert(seq, json.as_slice()).map_err(store_err)?;
    c.bytes += json.len() as u64;
    c.next += 1;
    Ok((seq, json.len() as u64))
}

/// Stores refused call `r`: merged into its window's earlier record of
/// its kind when that is still kept, else as a new record; either way in
/// the refused index, whose share retention bounds.
fn store_refused(t: &mut Tables, r: &mut AuditRecord, c: &mut Counters, merges: &mut Merges) -> Result<u64, Error> {
    let key = merges.key(r);
    if let Some((seq, stored)) = merges.get_mut(&key) {
        // unless retention has removed it since
        let old = t.refused.get(*seq).map_err(store_err)?.map(|v| v.value());
        if let Some(old) = old {
            stored.count = stored.count.saturating_add(r.count);
            let grown = json(stored, *seq)?;
            let size = grown.len() as u64;
            t.records.insert(*seq, grown.as_slice()).map_err(store_err)?;
            t.refused.insert(*seq, size).map_err(store_err)?;
            c.bytes = (c.bytes + size).saturating_sub(old);
            c.refused = (c.refused + size).saturating_sub(old);
            return Ok(*seq);
        }
    }
    let (seq, size) = store(t, r, c)?;
    t.refused.insert(seq, size).map_err(store_err)?;
    c.refused += size;
    merges.insert(key, seq, r);
    Ok(seq)
}
