//! What one record holds ([`AuditRecord`]), at which level
//! ([`AuditLevel`]), and the bounds every string in it is kept within
//! ([`bounded_id`], [`AuditRecord::bounded`]): many of them are chosen by
//! the caller (session ids, field names, a task), refused calls' included.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::{Error, Result};

/// Characters of the task text kept in a record; the rest is cut and
/// `task_truncated` is set (the digest covers the whole text).
pub const TASK_CHARS: usize = 200;

/// The most bytes of an id-like string (session, caller, peer, model,
/// method, outcome, chunk id, field name) a record keeps as sent; a longer
/// one, or one with a control character, is kept as its digest
/// ([`bounded_id`]).
pub const MAX_ID_BYTES: usize = 128;

/// The most entries of a record's chunk list and of its withheld names;
/// past it the list is cut (`chunk_count` still counts every chunk).
pub const MAX_LIST: usize = 1024;

/// An id-like string as a record keeps it (and a query names it): itself
/// when it is at most [`MAX_ID_BYTES`] bytes with no control character,
/// else `sha256:` and the hex digest of the whole, so that a caller naming
/// a megabyte "id" cannot make the trail hold (and flush) a megabyte.
pub fn bounded_id(s: &str) -> String {
    if s.len() <= MAX_ID_BYTES && !s.chars().any(char::is_control) {
        return s.to_string();
    }
    let digest = Sha256::digest(s.as_bytes());
    format!("sha256:{}", digest.iter().map(|b| format!("{b:02x}")).collect::<String>())
}

fn bound_opt(s: &mut Option<String>) {
    if let Some(v) = s.as_mut() {
        bound(v);
    }
}

fn bound(s: &mut String) {
    if s.len() > MAX_ID_BYTES || s.chars().any(char::is_control) {
        *s = bounded_id(s);
    }
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

    /// The record within its bounds: every id-like string through
    /// [`bounded_id`], the task cut to [`TASK_CHARS`] characters (when it
    /// was set directly, not through [`AuditRecord::set_task`]), the chunk
    /// and withheld lists to [`MAX_LIST`] entries. [`crate::AuditLog`]
    /// applies it to every record it is given.
    pub fn bounded(mut self) -> AuditRecord {
        bound(&mut self.method);
        bound(&mut self.outcome);
        for s in [&mut self.caller, &mut self.peer, &mut self.session_id, &mut self.model, &mut self.task_digest] {
            bound_opt(s);
        }
        if let Some(task) = self.task.as_mut() {
            if let Some((i, _)) = task.char_indices().nth(TASK_CHARS) {
                task.truncate(i);
                self.task_truncated = true;
            }
        }
        self.chunks.truncate(MAX_LIST);
        for c in &mut self.chunks {
            bound(&mut c.id);
            bound(&mut c.field);
        }
        self.withheld.truncate(MAX_LIST);
        self.withheld.iter_mut().for_each(bound);
        self
    }
}
