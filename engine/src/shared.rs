//! Sessions shared by replicas: the store outside the process that keeps
//! them (the service implements it on Redis), and what the engine writes
//! there.
//!
//! A session in a shared store is a small [`SessionRecord`] (the sent chunk
//! ids, the tokens used, the token's hash, the caller binding, the context's
//! digest) and, once per context, a [`ContextBlob`]: the public fields and
//! their chunks' embeddings, so any replica can rebuild the prepared
//! context without embedding it again. Confidential fields are split off
//! before either is made: they never reach the store.
//!
//! * **Bounded in the store.** The store enforces the same
//!   [`SessionLimits`](crate::session::SessionLimits) as the in-process one:
//!   idle time, count and bytes (each session weighs its context, as in
//!   memory), a tenth per caller scope when full, and tombstones that say
//!   why a session is gone.
//! * **No chunk twice across replicas.** Every change is a compare-and-set
//!   on the record's version: a request that lost the race to another
//!   replica works again on the new ledger. Within one replica, requests on
//!   one session take turns on a local lock first.

use std::collections::HashSet;
use std::sync::{Arc, Condvar, Mutex};

use serde::{Deserialize, Serialize};

use crate::context::Field;
pub use crate::session::{gone_cause, GONE_CAUSES};
use crate::session::{SessionLimits, SessionStats};

/// What a store failure says: the engine turns it into
/// [`Error::StateUnavailable`](crate::Error::StateUnavailable) naming the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreError(pub String);

impl std::fmt::Display for StoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// What opening a session in the store did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Opened {
    /// Written; sessions evicted to make room (if any) left tombstones.
    Fresh,
    /// A live session already holds that key.
    Taken,
}

/// A session as the store has it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Loaded {
    /// Live: its record and the version a commit must name.
    Live {
        /// The serialized [`SessionRecord`].
        record: Vec<u8>,
        /// Bumped by every commit.
        version: u64,
    },
    /// Gone, with its tombstone's cause: one of [`GONE_CAUSES`]' codes.
    Gone(String),
    /// Never opened here, or its tombstone has expired.
    Unknown,
}

/// What a compare-and-set did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Committed {
    /// Written.
    Done,
    /// Another request committed first: load again and redo.
    Conflict,
    /// The session went away meanwhile (its tombstone's cause, if any).
    Gone(Option<String>),
}

/// A store of sessions shared by replicas. Every method is one round trip
/// (or one atomic script) and blocks; the engine calls them from the
/// threads that run its requests. Keys are opaque printable strings.
pub trait SharedState: Send + Sync + std::fmt::Debug {
    /// The store as an operator knows it (`redis://127.0.0.1:6379/0`),
    /// without credentials: errors name it.
    fn name(&self) -> &str;

    /// Opens session `key` holding `record`, weighing `weight` bytes,
    /// in `scope` (its caller's share), and stores `context` (its digest
    /// and blob) beside it unless already there. Makes room under `limits`
    /// first: the scope's own least recently used sessions when it is past
    /// its share and others hold sessions, then anyone's.
    fn open(
        &self,
        key: &str,
        scope: Option<&str>,
        weight: u64,
        record: &[u8],
        context: (&str, &[u8]),
        limits: &SessionLimits,
    ) -> Result<Opened, StoreError>;

    /// Session `key`, marking it used (an idle one past `limits.ttl` is
    /// expired now).
    fn load(&self, key: &str, limits: &SessionLimits) -> Result<Loaded, StoreError>;

    /// Replaces the record of `key` if it is still at `version`.
    fn commit(&self, key: &str, version: u64, record: &[u8], limits: &SessionLimits) -> Result<Committed, StoreError>;

    /// Closes `key`, leaving a tombstone; `false` when it was not live.
    fn close(&self, key: &str, limits: &SessionLimits) -> Result<bool, StoreError>;

    /// The blob of context `digest`, if the store still has it.
    fn context(&self, digest: &str) -> Result<Option<Vec<u8>>, StoreError>;

    /// Live sessions, their bytes, evictions and expiries, over all replicas.
    fn stats(&self, limits: &SessionLimits) -> Result<SessionStats, StoreError>;

    /// Whether the store answers (readiness).
    fn ping(&self) -> Result<(), StoreError>;
}

/// One session's ledger as the store keeps it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SessionRecord {
    /// SHA-256 of the session token, hex: the token itself is never stored.
    pub token_sha256: String,
    /// The caller the session is bound to, if the transport knew it.
    pub owner: Option<String>,
    /// The digest of the context it was opened on, hex.
    pub context: String,
    /// Chunks sent so far (indices into the prepared context).
    pub sent: Vec<usize>,
    /// Tokens sent over every reply.
    pub total_sent: usize,
    /// The session's total over every reply, if it has one.
    pub cap: Option<usize>,
    /// A follow-up's budget when it names none.
    pub reply_budget: usize,
    /// The budget tokenizer's name (`None`: the encoder's).
    pub tokenizer: Option<String>,
    /// The last adaptive reply, replayed to a retry naming its request id.
    #[serde(default)]
    pub last: Option<LastReply>,
}

/// A session's last adaptive reply, for a retry that names its request id.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LastReply {
    /// The request's id.
    pub request_id: String,
    /// The chunks it sent (indices, reading order) with their scores.
    pub chunks: Vec<(usize, f32)>,
    /// Its tokens, budget and reason.
    pub sent_tokens: usize,
    /// The reply's budget.
    pub budget: usize,
    /// Why less was sent, if it said.
    pub reason: Option<String>,
    /// The lines it carried around each code piece (`code_context_lines`
    /// under its budget), so a retry renders the same text (0 in a reply
    /// stored before there were any).
    #[serde(default)]
    pub around: usize,
}

/// A context as the store keeps it: the public fields and, per chunk, the
/// embedding cache key and vector of what the encoder embedded.
#[derive(Debug, Clone, PartialEq)]
pub struct ContextBlob {
    /// The public fields, in order.
    pub fields: Vec<Field>,
    /// Embedding cache keys with their vectors.
    pub embeddings: Vec<([u8; 32], Vec<f32>)>,
}

#[derive(Serialize, Deserialize)]
struct BlobHead {
    fields: Vec<Field>,
    dim: usize,
    keys: Vec<String>,
}

impl ContextBlob {
    /// Bytes: a little-endian `u32` header length, the JSON header (fields
    /// and keys), then the vectors as little-endian `f32`s.
    pub fn encode(&self) -> Vec<u8> {
        let dim = self.embeddings.first().map_or(0, |(_, v)| v.len());
        let head =
            BlobHead { fields: self.fields.clone(), dim, keys: self.embeddings.iter().map(|(k, _)| hex(k)).collect() };
        let head = serde_json::to_vec(&head).expect("fields serialize");
        let mut out = Vec::with_capacity(4 + head.len() + self.embeddings.len() * dim * 4);
        out.extend_from_slice(&(head.len() as u32).to_le_bytes());
        out.extend_from_slice(&head);
        for (_, v) in &self.embeddings {
            for x in v {
                out.extend_from_slice(&x.to_le_bytes());
            }
        }
        out
    }

    /// The inverse of [`ContextBlob::encode`]; `None` when malformed.
    pub fn decode(bytes: &[u8]) -> Option<Self> {
        let n = u32::from_le_bytes(bytes.get(..4)?.try_into().ok()?) as usize;
        let head: BlobHead = serde_json::from_slice(bytes.get(4..4 + n)?).ok()?;
        let rows = bytes.get(4 + n..)?;
        if rows.len() != head.keys.len() * head.dim * 4 {
            return None;
        }
        let mut embeddings = Vec::with_capacity(head.keys.len());
        for (i, k) in head.keys.iter().enumerate() {
            let row = &rows[i * head.dim * 4..(i + 1) * head.dim * 4];
            let v = row.chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().expect("4 bytes"))).collect();
            embeddings.push((unhex(k)?, v));
        }
        Some(Self { fields: head.fields, embeddings })
    }
}

/// Lower-case hex of a digest.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The digest written by [`hex`]; `None` when `s` is not 64 hex digits.
pub(crate) fn unhex(s: &str) -> Option<[u8; 32]> {
    if s.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

/// Keys some request of this process is working on: requests on one
/// session take turns here before they reach the store.
#[derive(Debug, Default)]
pub(crate) struct Inflight {
    held: Mutex<HashSet<String>>,
    freed: Condvar,
}

/// Holds a key of [`Inflight`] until dropped.
pub(crate) struct Turn {
    inflight: Arc<Inflight>,
    key: String,
}

impl Inflight {
    /// Waits for `key`'s turn.
    pub(crate) fn take(self: &Arc<Self>, key: &str) -> Turn {
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        while held.contains(key) {
            held = self.freed.wait(held).unwrap_or_else(|p| p.into_inner());
        }
        held.insert(key.to_string());
        Turn { inflight: self.clone(), key: key.to_string() }
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        let mut held = self.inflight.held.lock().unwrap_or_else(|p| p.into_inner());
        held.remove(&self.key);
        self.inflight.freed.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::context::FieldKind;

    #[test]
    fn a_blob_round_trips_and_a_cut_one_is_refused() {
        let blob = ContextBlob {
            fields: vec![Field {
                name: "a".into(),
                kind: FieldKind::Code,
                content: "fn x() {}".into(),
                confidential: false,
            }],
            embeddings: vec![([7; 32], vec![0.5, -1.25, 3.0]), ([9; 32], vec![1e-7, 0.0, -0.0])],
        };
        let bytes = blob.encode();
        assert_eq!(ContextBlob::decode(&bytes), Some(blob));
        assert_eq!(ContextBlob::decode(&bytes[..bytes.len() - 1]), None);
        assert_eq!(ContextBlob::decode(&[1, 0]), None);
    }

    #[test]
    fn turns_on_one_key_are_taken_one_at_a_time() {
        let inflight = Arc::new(Inflight::default());
        let busy = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let worst = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let (inflight, busy, worst) = (inflight.clone(), busy.clone(), worst.clone());
                std::thread::spawn(move || {
                    for _ in 0..50 {
                        let _turn = inflight.take("k");
                        let now = busy.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
                        worst.fetch_max(now, std::sync::atomic::Ordering::SeqCst);
                        std::thread::yield_now();
                        busy.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
                    }
                })
            })
            .collect();
        threads.into_iter().for_each(|t| t.join().unwrap());
        assert_eq!(worst.load(std::sync::atomic::Ordering::SeqCst), 1);
        assert!(inflight.held.lock().unwrap().is_empty());
    }

    #[test]
    fn every_tombstone_code_has_its_own_message() {
        let all: HashSet<&str> = GONE_CAUSES.iter().map(|(c, _)| gone_cause(c)).collect();
        assert_eq!(all.len(), GONE_CAUSES.len());
        assert_eq!(gone_cause("expired"), "expired after its idle time");
    }
}
