//! Merged refusals (see the crate docs): the deferred records written in
//! the current merge window, by kind, so that a repeat grows the earlier
//! record's `count` instead of adding one.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Instant;

use crate::record::AuditRecord;
use crate::DEFER_MAX;

/// Distinct merge keys kept per window (see the crate docs).
pub const MERGE_KEYS: usize = 1024;

/// Distinct sessions of one kind that get a record each per window; the
/// calls of that kind naming further sessions share one more record, with
/// no session (see the crate docs).
pub const MERGE_SESSIONS: usize = 8;

/// What makes two deferred records one kind: method, caller, the peer's
/// address without its port (a new connection per call is the same
/// client), outcome.
pub(crate) type Kind = (String, Option<String>, Option<String>, String);

/// Which record of its kind a deferred record merges into.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum Slot {
    /// The record of this session (or of no session).
    Session(Option<String>),
    /// The record standing for the sessions past [`MERGE_SESSIONS`].
    Others,
}

/// A merge key: kind and slot.
pub(crate) type MergeKey = (Kind, Slot);

/// The deferred records written in the current merge window: key → its seq
/// and the record as stored (count included), so a repeat rewrites it
/// without reading it back. At most [`MERGE_KEYS`]; the window opens with
/// its first record and closes [`DEFER_MAX`] later (or when a commit fails).
#[derive(Default)]
pub(crate) struct Merges {
    seqs: HashMap<MergeKey, (u64, AuditRecord)>,
    /// Session slots per kind in this window.
    sessions: HashMap<Kind, usize>,
    since: Option<Instant>,
}

fn host(peer: &str) -> String {
    peer.parse::<SocketAddr>().map_or_else(|_| peer.to_string(), |a| a.ip().to_canonical().to_string())
}

impl Merges {
    pub(crate) fn clear(&mut self) {
        self.seqs.clear();
        self.sessions.clear();
        self.since = None;
    }

    /// The key deferred record `r` merges under (closing the window first
    /// once it is [`DEFER_MAX`] old). Past [`MERGE_SESSIONS`] sessions of
    /// its kind, `r` loses its session and joins the kind's `Others` record.
    pub(crate) fn key(&mut self, r: &mut AuditRecord) -> MergeKey {
        if self.since.is_some_and(|t| t.elapsed() >= DEFER_MAX) {
            self.clear();
        }
        let kind = (r.method.clone(), r.caller.clone(), r.peer.as_deref().map(host), r.outcome.clone());
        let own = (kind.clone(), Slot::Session(r.session_id.clone()));
        if self.seqs.contains_key(&own) || self.sessions.get(&kind).copied().unwrap_or(0) < MERGE_SESSIONS {
            return own;
        }
        r.session_id = None;
        (kind, Slot::Others)
    }

    /// The earlier record of `key` in this window: its seq and the record
    /// as stored.
    pub(crate) fn get_mut(&mut self, key: &MergeKey) -> Option<&mut (u64, AuditRecord)> {
        self.seqs.get_mut(key)
    }

    /// Remembers `r`, written at `seq`, as the record of `key` (unless the
    /// window already holds [`MERGE_KEYS`] others).
    pub(crate) fn insert(&mut self, key: MergeKey, seq: u64, r: &AuditRecord) {
        if self.seqs.len() >= MERGE_KEYS && !self.seqs.contains_key(&key) {
            return;
        }
        if matches!(key.1, Slot::Session(_)) && !self.seqs.contains_key(&key) {
            *self.sessions.entry(key.0.clone()).or_default() += 1;
        }
        self.seqs.insert(key, (seq, r.clone()));
        self.since.get_or_insert_with(Instant::now);
    }
}
