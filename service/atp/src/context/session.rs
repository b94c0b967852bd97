//! What a compress leaves the requester: the SCD session it opened
//! ([`SessionHandle`]), the transfer ([`Transfer`]) and how a receiver names
//! a chunk it asks for ([`ChunkRef`]).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU32, Ordering};

use crate::pb;
use scd_audit::{AuditChunk, AuditRecord};
use scd_context::Task;

/// An open SCD session: what a later adaptive request needs. `Debug` never
/// prints the token.
pub struct SessionHandle {
    /// The server-chosen session id.
    pub id: String,
    pub(super) token: String,
    /// Chunk ids by index (every chunk of the transfer, sent or not).
    pub(super) ids: Vec<String>,
    pub(super) index: HashMap<String, u32>,
    /// Fields whose chunks are never forwarded.
    pub(super) withheld: HashSet<String>,
    /// The receiver's budget left, as SCD last reported it.
    pub(super) remaining: AtomicU32,
}

impl std::fmt::Debug for SessionHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionHandle")
            .field("id", &self.id)
            .field("token", &if self.token.is_empty() { "<none>" } else { "<secret>" })
            .field("chunks", &self.ids.len())
            .field("withheld", &self.withheld)
            .field("remaining_tokens", &self.remaining_tokens())
            .finish()
    }
}

impl SessionHandle {
    /// The session's secret, which SCD asks for on every later call.
    pub fn token(&self) -> &str {
        &self.token
    }

    /// The chunk id at `index` (a stub's or a sent chunk's).
    pub fn chunk_id(&self, index: u32) -> Option<&str> {
        self.ids.get(index as usize).map(String::as_str)
    }

    /// The index of chunk `id`.
    pub fn index_of(&self, id: &str) -> Option<u32> {
        self.index.get(id).copied()
    }

    /// Tokens of the receiver's budget not yet used, as SCD last said.
    pub fn remaining_tokens(&self) -> u32 {
        self.remaining.load(Ordering::Relaxed)
    }

    /// A handle to no session, for tests of what is kept beside one.
    #[cfg(test)]
    pub(crate) fn detached() -> SessionHandle {
        SessionHandle {
            id: String::new(),
            token: String::new(),
            ids: Vec::new(),
            index: HashMap::new(),
            withheld: HashSet::new(),
            remaining: AtomicU32::new(0),
        }
    }
}

/// One context transfer: the diff to forward, the session for adaptive
/// requests, and what it saved.
#[derive(Debug)]
pub struct Transfer {
    /// What crosses to the receiver.
    pub diff: pb::ContextDiff,
    /// The SCD session behind it.
    pub session: SessionHandle,
    /// Tokens of the whole non-confidential context (the naive transfer).
    pub full_tokens: u64,
    /// Tokens sent.
    pub sent_tokens: u64,
}

impl Transfer {
    /// `full_tokens / sent_tokens`; `None` when nothing was sent.
    pub fn reduction_ratio(&self) -> Option<f64> {
        (self.sent_tokens > 0).then(|| self.full_tokens as f64 / self.sent_tokens as f64)
    }

    /// The `AtpTransfer` audit record of this transfer from `sender` to
    /// `receiver` (DIDs: the sender is the record's `caller`, the receiver
    /// its `peer`): the chunk ids sent, the withheld field names, the totals.
    pub fn audit_record(&self, sender: &str, receiver: &str, task: &Task, budget_tokens: u32) -> AuditRecord {
        let mut r = AuditRecord::new("AtpTransfer");
        r.caller = Some(sender.to_string());
        r.peer = Some(receiver.to_string());
        r.session_id = Some(self.session.id.clone());
        r.set_task(&task.text());
        r.chunks = self
            .diff
            .chunks
            .iter()
            .map(|c| AuditChunk {
                id: c.chunk_id.clone(),
                field: c.field.clone(),
                score: c.relevance_score as f32,
                tokens: c.tokens,
            })
            .collect();
        r.chunk_count = self.diff.chunks.len() as u32;
        r.withheld = self.diff.withheld_fields.clone();
        r.budget_tokens = Some(budget_tokens);
        r.context_tokens = self.full_tokens;
        r.selected_tokens = self.sent_tokens;
        r.reduction_ratio = self.reduction_ratio().unwrap_or(0.0) as f32;
        r
    }
}

/// A chunk a receiver asks for: by id (`"field#n"`) or by its index in the
/// transfer (a stub's index).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChunkRef {
    /// SCD's chunk id.
    Id(String),
    /// The index of a chunk or stub in the transfer's diff.
    Index(u32),
}

impl From<u32> for ChunkRef {
    fn from(i: u32) -> Self {
        ChunkRef::Index(i)
    }
}

impl From<&str> for ChunkRef {
    fn from(id: &str) -> Self {
        ChunkRef::Id(id.to_string())
    }
}
