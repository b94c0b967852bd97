//! Retention (see the crate docs): after each commit, the records older
//! than `max_age` go, then refused calls' oldest records while they hold
//! more than their share (`max_bytes / REFUSED_PARTS`), then, while the
//! whole is over `max_bytes`, refused calls' oldest records first and a
//! successful call's only when no refused call's is left. A refused call
//! therefore never evicts a successful call's record.

use std::time::Duration;

use redb::{ReadableTable, Table, TableDefinition, WriteTransaction};
use serde::Deserialize;

/// seq (u64, big-endian order) → the record as JSON.
pub(crate) const RECORDS: TableDefinition<u64, &[u8]> = TableDefinition::new("audit_records");
/// name → u64: `next_seq`, `bytes`, `refused_bytes`, `last_at_ms`.
pub(crate) const META: TableDefinition<&str, u64> = TableDefinition::new("audit_meta");
/// seq → JSON size, for each refused call's (deferred) record kept.
pub(crate) const REFUSED: TableDefinition<u64, u64> = TableDefinition::new("audit_refused");

/// Refused calls' records hold at most `max_bytes / REFUSED_PARTS` bytes.
pub const REFUSED_PARTS: u64 = 4;

/// Which records to keep. `None` keeps them forever / at any size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Retention {
    /// Records older than this are removed.
    pub max_age: Option<Duration>,
    /// The oldest records are removed while the summed JSON size of all
    /// records is over this, refused calls' first; refused calls' alone
    /// hold at most [`Retention::refused_max_bytes`].
    pub max_bytes: Option<u64>,
}

impl Retention {
    /// The share of `max_bytes` refused calls' records may hold.
    pub fn refused_max_bytes(&self) -> Option<u64> {
        self.max_bytes.map(|m| m / REFUSED_PARTS)
    }
}

/// The audit tables, open in one write transaction.
pub(crate) struct Tables<'t> {
    pub(crate) records: Table<'t, u64, &'static [u8]>,
    pub(crate) refused: Table<'t, u64, u64>,
    pub(crate) meta: Table<'t, &'static str, u64>,
}

impl Tables<'_> {
    pub(crate) fn open(tx: &WriteTransaction) -> Result<Tables<'_>, redb::Error> {
        Ok(Tables { records: tx.open_table(RECORDS)?, refused: tx.open_table(REFUSED)?, meta: tx.open_table(META)? })
    }

    pub(crate) fn meta(&self, key: &str) -> Result<u64, redb::StorageError> {
        Ok(self.meta.get(key)?.map_or(0, |v| v.value()))
    }

    /// Removes record `seq` (and its refused entry): whether either was
    /// there; `bytes` and `refused` follow.
    fn remove(&mut self, seq: u64, bytes: &mut u64, refused: &mut u64) -> Result<bool, redb::StorageError> {
        let size = self.records.remove(seq)?.map(|json| json.value().len() as u64);
        if let Some(size) = size {
            *bytes = bytes.saturating_sub(size);
        }
        let was_refused = self.refused.remove(seq)?.map(|s| s.value());
        if let Some(size) = was_refused {
            *refused = refused.saturating_sub(size);
        }
        Ok(size.is_some() || was_refused.is_some())
    }

    fn first_record(&self) -> Result<Option<u64>, redb::StorageError> {
        Ok(self.records.first()?.map(|(k, _)| k.value()))
    }

    fn first_refused(&self) -> Result<Option<u64>, redb::StorageError> {
        Ok(self.refused.first()?.map(|(k, _)| k.value()))
    }
}

/// Removes the records past `retention` (see the module docs); returns how
/// many. Every walk starts from a table's first key and stops at the first
/// record kept: no full scan per commit.
pub(crate) fn prune_in(t: &mut Tables, retention: Retention, now_ms: u64) -> Result<usize, redb::Error> {
    let mut bytes = t.meta("bytes")?;
    let mut refused = t.meta("refused_bytes")?;
    let mut removed = 0;
    if let Some(cutoff) = retention.max_age.map(|a| now_ms.saturating_sub(a.as_millis() as u64)) {
        loop {
            let old = match t.records.first()? {
                // only at_ms is needed: a record that does not parse is removed as old
                Some((seq, json)) => serde_json::from_slice::<AtMs>(json.value())
                    .map_or(true, |r| r.at_ms < cutoff)
                    .then_some(seq.value()),
                None => None,
            };
            let Some(seq) = old else { break };
            if !t.remove(seq, &mut bytes, &mut refused)? {
                break;
            }
            removed += 1;
        }
    }
    if let Some(max) = retention.refused_max_bytes() {
        while refused > max {
            let Some(seq) = t.first_refused()? else { break };
            if !t.remove(seq, &mut bytes, &mut refused)? {
                break;
            }
            removed += 1;
        }
    }
    if let Some(max) = retention.max_bytes {
        while bytes > max {
            let Some(seq) = t.first_refused()?.map_or_else(|| t.first_record(), |s| Ok(Some(s)))? else { break };
            if !t.remove(seq, &mut bytes, &mut refused)? {
                break;
            }
            removed += 1;
        }
    }
    if removed > 0 {
        t.meta.insert("bytes", bytes)?;
        t.meta.insert("refused_bytes", refused)?;
        tracing::debug!(removed, bytes, refused, "audit records pruned");
    }
    Ok(removed)
}

#[derive(Deserialize)]
struct AtMs {
    at_ms: u64,
}
