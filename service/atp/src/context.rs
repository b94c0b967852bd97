//! Layer 3: Semantic Context Differentials (paper §6) over SCD's gRPC service.
//!
//! A delegating agent does not hand its whole context to the next one. It
//! asks SCD (reached only through `scd.v1`'s gRPC client, never the engine,
//! so SCD can run on another machine) for the minimal sufficient context of
//! the task under the receiver's budget, and forwards that as an
//! [`pb::ContextDiff`]: the chunks sent, stubs of the chunks not sent (the
//! receiver can ask for them), the names of the confidential fields withheld,
//! the token counts and e_task. The transfer opens an SCD session with a
//! server-chosen id and secret token, so a worker whose confidence drops
//! below [`THETA`] can ask for more ([`ScdLink::request_more`],
//! [`ScdLink::answer`]) and never gets a chunk twice.
//!
//! Confidential fields never cross: SCD withholds them, and this layer checks
//! every chunk and stub SCD returns and refuses ([`Error::ConfidentialChunk`])
//! to forward one whose field is withheld or was marked confidential here.
//!
//! ```no_run
//! # async fn demo() -> scd_atp::Result<()> {
//! use scd_atp::context::{ContextFile, HopLedger, ScdLink, Task};
//! use scd_atp::pb;
//!
//! let scd = ScdLink::connect("http://127.0.0.1:50051").await?;
//! let fields = ContextFile::load("fixtures/agent_context.json".as_ref())?.fields;
//! let task = Task::new("Why are customer charges failing at checkout?");
//! let offer = pb::ContextRequirement { max_context_tokens: 300, ..Default::default() };
//! let transfer = scd.compress(&task, &fields, &offer).await?;
//! let mut ledger = HopLedger::new();
//! ledger.record_transfer("task-1", "did:key:planner", "did:key:worker", &transfer);
//! // the worker is unsure: ask for one stub by index, plus what answers the question
//! let stub = transfer.diff.dropped[0].index;
//! let more = scd
//!     .request_more(&transfer.session, "which table holds charges?", 0.4, &[stub.into()])
//!     .await?;
//! ledger.record_response("task-1", "did:key:planner", "did:key:worker", &more)?;
//! scd.close(&transfer.session).await?;
//! println!("{}", ledger.to_json());
//! # Ok(()) }
//! ```

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use scd_proto::scd::v1 as scd;
use scd_proto::scd::v1::scd_client::ScdClient;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tonic::transport::Channel;
use tracing::{debug, instrument, warn};

use crate::{pb, Error, Result};
use scd_audit::{AuditChunk, AuditRecord};

/// θ_conf (paper §6.3): a receiver at or above this confidence gets no more
/// context.
pub const THETA: f64 = 0.7;

/// What an offer without a `relevance_threshold` gets: SCD's calibrated
/// threshold, in standard deviations of the context's relevance scores. At 0
/// only chunks scoring at or above the context's mean are sent up front; the
/// rest of the receiver's budget stays open for adaptive requests.
pub const DEFAULT_MIN_RELATIVE_SCORE: f32 = 0.0;

/// How long [`ScdLink::connect`] waits for SCD to accept the connection.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Largest SCD reply accepted (a compress of a large context carries its
/// task embedding, chunks and stubs).
pub const MAX_REPLY_BYTES: usize = 64 << 20;

/// Domain tag of [`context_hash`].
const HASH_TAG: &[u8] = b"scd-atp/context/v1\n";

// ---------------------------------------------------------------------------
// The task and the context, as an agent holds them
// ---------------------------------------------------------------------------

/// The task, the fields and the context file are the context model's own
/// types (`scd-context`), shared with the engine: one `Task::text`, one
/// strict parser. A context file is `{"fields": [...]}`, the format
/// `scd compress --context` reads (e.g. `fixtures/agent_context.json`).
pub use scd_context::{Context as ContextFile, Field, FieldKind, Task};

/// SHA-256 of the canonical form of a context: the tag
/// `"scd-atp/context/v1\n"`, then per field in order its name, its kind word
/// and its confidential flag, and — for non-confidential fields only — its
/// content, every string prefixed by its length as a big-endian u64. A
/// confidential field's content is never hashed (a short secret could be
/// found from its hash), so changing it leaves the hash alone.
pub fn context_hash(fields: &[Field]) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(HASH_TAG);
    let mut put = |bytes: &[u8]| {
        h.update((bytes.len() as u64).to_be_bytes());
        h.update(bytes);
    };
    for f in fields {
        put(f.name.as_bytes());
        put(f.kind.as_str().as_bytes());
        put(&[u8::from(f.confidential)]);
        if !f.confidential {
            put(f.content.as_bytes());
        }
    }
    h.finalize().into()
}

// ---------------------------------------------------------------------------
// Conversions between scd.v1 and atp.v1
// ---------------------------------------------------------------------------

/// The receiver's offer (`atp.v1.ContextRequirement`) as SCD's requirement.
///
/// `max_context_tokens` must be at least 1; a `relevance_threshold` must be a
/// cosine in [-1, 1] and is passed as SCD's absolute threshold. Without one,
/// SCD's calibrated threshold [`DEFAULT_MIN_RELATIVE_SCORE`] applies.
pub fn requirement_from_offer(offer: &pb::ContextRequirement) -> Result<scd::ContextRequirement> {
    if offer.max_context_tokens == 0 {
        return Err(Error::Invalid {
            field: "requirement.max_context_tokens".into(),
            reason: "must be at least 1 (the receiver's budget in tokens)".into(),
        });
    }
    let (relevance_threshold, min_relative_score) = match offer.relevance_threshold {
        Some(t) if !t.is_finite() || !(-1.0..=1.0).contains(&t) => {
            return Err(Error::Invalid {
                field: "requirement.relevance_threshold".into(),
                reason: format!("must be a cosine in [-1, 1], got {t}"),
            })
        }
        Some(t) => (Some(t as f32), None),
        None => (None, Some(DEFAULT_MIN_RELATIVE_SCORE)),
    };
    Ok(scd::ContextRequirement {
        required_fields: offer.required_fields.clone(),
        optional_fields: offer.optional_fields.clone(),
        max_context_tokens: offer.max_context_tokens,
        relevance_threshold,
        min_relative_score,
    })
}

/// SCD's chunk as a `ContextChunk` at `index` (text as UTF-8 bytes).
pub fn chunk_from_scd(c: &scd::Chunk, index: u32) -> pb::ContextChunk {
    pb::ContextChunk {
        index,
        data: c.text.as_bytes().to_vec(),
        relevance_score: f64::from(c.score),
        chunk_id: c.id.clone(),
        field: c.field.clone(),
        tokens: c.tokens,
    }
}

/// SCD's dropped chunk as a `ContextStub` at `index`.
pub fn stub_from_scd(d: &scd::DroppedChunk, index: u32) -> pb::ContextStub {
    pb::ContextStub { index, chunk_id: d.id.clone(), field: d.field.clone(), stub: d.stub.clone(), tokens: d.tokens }
}

/// e_task as the ATP `Embedding`.
pub fn embedding_from_scd(values: &[f32]) -> pb::Embedding {
    pb::Embedding { dimensions: values.len() as u32, values: values.iter().map(|&v| f64::from(v)).collect() }
}

/// Refuses a chunk or stub of a withheld field: it is never forwarded.
fn check_forwardable(withheld: &HashSet<String>, field: &str, chunk_id: &str) -> Result<()> {
    if withheld.contains(field) {
        warn!(field, chunk_id, "SCD returned a chunk of a withheld field; refused");
        return Err(Error::ConfidentialChunk { field: field.to_string(), chunk_id: chunk_id.to_string() });
    }
    Ok(())
}

/// Turns SCD's answer to OpenSession into a [`Transfer`], checking it first:
/// no chunk or stub of a withheld field (SCD's `withheld_fields` or any field
/// marked confidential in `fields`), every chunk of a field in `fields`, no
/// chunk twice, and no more tokens sent than `budget_tokens`.
///
/// Every chunk gets an index in reading order (field order of `fields`, then
/// SCD's `field#n`), sent chunks and stubs alike, so a stub's index is the
/// one its chunk carries when it is sent later.
pub fn transfer_from_scd(
    resp: &scd::CompressResponse,
    fields: &[Field],
    budget_tokens: u32,
    session_token: &str,
) -> Result<Transfer> {
    let mut withheld: HashSet<String> = resp.withheld_fields.iter().cloned().collect();
    withheld.extend(fields.iter().filter(|f| f.confidential).map(|f| f.name.clone()));
    for c in &resp.chunks {
        check_forwardable(&withheld, &c.field, &c.id)?;
    }
    for d in &resp.dropped {
        check_forwardable(&withheld, &d.field, &d.id)?;
    }
    let position: HashMap<&str, usize> = fields.iter().enumerate().map(|(i, f)| (f.name.as_str(), i)).collect();
    let mut all: Vec<(usize, u64, &str)> = Vec::with_capacity(resp.chunks.len() + resp.dropped.len());
    for (field, id) in
        resp.chunks.iter().map(|c| (&c.field, &c.id)).chain(resp.dropped.iter().map(|d| (&d.field, &d.id)))
    {
        let Some(&pos) = position.get(field.as_str()) else {
            return Err(Error::ScdReply {
                rpc: "OpenSession",
                reason: format!("chunk {id} names field {field:?}, which is not in the context"),
            });
        };
        let n = id.rsplit_once('#').and_then(|(_, n)| n.parse::<u64>().ok()).unwrap_or(u64::MAX);
        all.push((pos, n, id.as_str()));
    }
    all.sort_unstable();
    let ids: Vec<String> = all.iter().map(|&(_, _, id)| id.to_string()).collect();
    let mut index: HashMap<String, u32> = HashMap::with_capacity(ids.len());
    for (i, id) in ids.iter().enumerate() {
        if index.insert(id.clone(), i as u32).is_some() {
            return Err(Error::ScdReply { rpc: "OpenSession", reason: format!("chunk {id} appears twice") });
        }
    }
    let totals = resp.totals.clone().unwrap_or_default();
    let chunk_tokens: u64 = resp.chunks.iter().map(|c| u64::from(c.tokens)).sum();
    let sent_tokens = u64::from(totals.sent_tokens).max(chunk_tokens);
    if sent_tokens > u64::from(budget_tokens) {
        return Err(Error::ScdReply {
            rpc: "OpenSession",
            reason: format!("sent {sent_tokens} tokens, over the receiver's budget of {budget_tokens}"),
        });
    }
    let full_tokens = u64::from(totals.context_tokens);
    let mut withheld_fields: Vec<String> = withheld.iter().cloned().collect();
    withheld_fields.sort_unstable();
    let diff = pb::ContextDiff {
        base_hash: context_hash(fields).to_vec(),
        chunks: resp.chunks.iter().map(|c| chunk_from_scd(c, index[&c.id])).collect(),
        // SCD gives no sufficiency estimate; the receiver reports its own
        // confidence in its ContextRequest.
        confidence: 0.0,
        original_size: full_tokens,
        compressed_size: sent_tokens,
        withheld_fields,
        dropped: resp.dropped.iter().map(|d| stub_from_scd(d, index[&d.id])).collect(),
        task_embedding: Some(embedding_from_scd(&resp.task_embedding)),
    };
    let session = SessionHandle {
        id: resp.session_id.clone(),
        token: session_token.to_string(),
        ids,
        index,
        withheld,
        remaining: AtomicU32::new(budget_tokens - sent_tokens as u32),
    };
    Ok(Transfer { diff, session, full_tokens, sent_tokens })
}

/// Turns SCD's answer to RequestContext into the ATP `ContextResponse`,
/// refusing a chunk of a withheld field or one not in the transfer, and
/// records the session's remaining budget. `task_id`, `from`, the nonce and
/// the signature are the caller's to fill.
pub fn response_from_scd(resp: &scd::ContextResponse, session: &SessionHandle) -> Result<pb::ContextResponse> {
    let mut chunks = Vec::with_capacity(resp.chunks.len());
    for c in &resp.chunks {
        check_forwardable(&session.withheld, &c.field, &c.id)?;
        let Some(&i) = session.index.get(&c.id) else {
            return Err(Error::ScdReply {
                rpc: "RequestContext",
                reason: format!("chunk {} is not in the transfer's manifest", c.id),
            });
        };
        chunks.push(chunk_from_scd(c, i));
    }
    session.remaining.store(resp.remaining_tokens, Ordering::Relaxed);
    Ok(pb::ContextResponse {
        chunks,
        reason: resp.reason.clone(),
        remaining_tokens: resp.remaining_tokens,
        ..Default::default()
    })
}

// ---------------------------------------------------------------------------
// Transfers and sessions
// ---------------------------------------------------------------------------

/// An open SCD session: what a later adaptive request needs. `Debug` never
/// prints the token.
pub struct SessionHandle {
    /// The server-chosen session id.
    pub id: String,
    token: String,
    /// Chunk ids by index (every chunk of the transfer, sent or not).
    ids: Vec<String>,
    index: HashMap<String, u32>,
    /// Fields whose chunks are never forwarded.
    withheld: HashSet<String>,
    /// The receiver's budget left, as SCD last reported it.
    remaining: AtomicU32,
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

// ---------------------------------------------------------------------------
// The link to SCD
// ---------------------------------------------------------------------------

/// SCD's gRPC client with the URL it reaches, named in every error.
#[derive(Clone)]
pub struct ScdLink {
    url: String,
    client: ScdClient<Channel>,
}

impl std::fmt::Debug for ScdLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScdLink").field("url", &self.url).finish()
    }
}

impl ScdLink {
    /// Connects to SCD at `url` (`http://host:port`), waiting at most
    /// [`CONNECT_TIMEOUT`]. Errors name the URL.
    pub async fn connect(url: &str) -> Result<Self> {
        if !url.starts_with("http://") {
            return Err(Error::Invalid {
                field: "scd_url".into(),
                reason: format!("{url:?} must start with http:// (this client speaks plaintext gRPC)"),
            });
        }
        let endpoint = Channel::from_shared(url.to_string())
            .map_err(|e| Error::Invalid { field: "scd_url".into(), reason: format!("{url:?} is not a URI: {e}") })?
            .connect_timeout(CONNECT_TIMEOUT);
        let channel = endpoint.connect().await.map_err(|source| Error::ScdConnect { url: url.to_string(), source })?;
        debug!(url, "connected to SCD");
        Ok(Self::from_channel(channel, url))
    }

    /// A link over an existing channel; `url` names it in errors.
    pub fn from_channel(channel: Channel, url: impl Into<String>) -> Self {
        Self { url: url.into(), client: ScdClient::new(channel).max_decoding_message_size(MAX_REPLY_BYTES) }
    }

    /// The SCD URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    fn status(&self, rpc: &'static str, status: tonic::Status) -> Error {
        Error::Scd { url: self.url.clone(), rpc, status: Box::new(status) }
    }

    /// SCD's model, dimension and limits.
    pub async fn info(&self) -> Result<scd::InfoResponse> {
        let mut c = self.client.clone();
        c.info(scd::InfoRequest {}).await.map(|r| r.into_inner()).map_err(|s| self.status("Info", s))
    }

    /// e_task: the task's embedding as a query, from the same text SCD's
    /// Compress embeds ([`Task::text`]); like Compress, a task over the
    /// model's input length is refused rather than embedded in windows.
    #[instrument(skip_all, fields(url = %self.url))]
    pub async fn embed_task(&self, task: &Task) -> Result<pb::Embedding> {
        let text = task.text();
        if text.is_empty() {
            return Err(Error::Invalid { field: "task.description".into(), reason: "must not be empty".into() });
        }
        let mut c = self.client.clone();
        let resp = c
            .embed(scd::EmbedRequest { texts: vec![text], kind: scd::InputKind::Query as i32, windows: false })
            .await
            .map_err(|s| self.status("Embed", s))?
            .into_inner();
        match resp.embeddings.as_slice() {
            [e] => Ok(embedding_from_scd(&e.values)),
            other => Err(Error::ScdReply { rpc: "Embed", reason: format!("{} embeddings for one text", other.len()) }),
        }
    }

    /// Minimal sufficient context of `fields` for `task` under the receiver's
    /// `requirement`, in a new SCD session with a server-chosen id (so the
    /// receiver can ask for more). Confidential fields are withheld by SCD
    /// and checked here ([`transfer_from_scd`]).
    #[instrument(skip_all, fields(url = %self.url, fields = fields.len(), budget = requirement.max_context_tokens))]
    pub async fn compress(
        &self,
        task: &Task,
        fields: &[Field],
        requirement: &pb::ContextRequirement,
    ) -> Result<Transfer> {
        let req = requirement_from_offer(requirement)?;
        let compress = scd::CompressRequest {
            task: Some(scd::Task::from(task)),
            fields: fields.iter().map(scd::Field::from).collect(),
            requirement: Some(req),
            session_id: String::new(),
            session_token: String::new(),
            // ATP carries context, not hand-off reports
            render: scd::ReportFormat::Unspecified as i32,
            // the offer's budget is the receiver's whole window: the first
            // transfer and every adaptive request share it
            session_max_total_tokens: requirement.max_context_tokens,
            ..Default::default()
        };
        let mut c = self.client.clone();
        let open = c
            .open_session(scd::OpenSessionRequest { compress: Some(compress) })
            .await
            .map_err(|s| self.status("OpenSession", s))?
            .into_inner();
        let (Some(mut result), false) = (open.result, open.session_id.is_empty()) else {
            return Err(Error::ScdReply { rpc: "OpenSession", reason: "no result or no session id".into() });
        };
        result.session_id = open.session_id;
        match transfer_from_scd(&result, fields, requirement.max_context_tokens, &open.session_token) {
            Ok(t) => {
                debug!(full = t.full_tokens, sent = t.sent_tokens, stubs = t.diff.dropped.len(), "context transfer");
                Ok(t)
            }
            Err(e) => {
                // do not leave a session behind that nobody will use
                let _ = c
                    .close_session(scd::CloseSessionRequest {
                        session_id: result.session_id,
                        session_token: open.session_token,
                    })
                    .await;
                Err(e)
            }
        }
    }

    /// Adaptive context request (paper §6.3): below [`THETA`], the next
    /// unseen chunks for `question`, the ones named in `wanted` first (an
    /// index is a stub's index in the diff). At or above θ nothing is sent
    /// and the reason says why; SCD is not asked.
    pub async fn request_more(
        &self,
        session: &SessionHandle,
        question: &str,
        current_confidence: f64,
        wanted: &[ChunkRef],
    ) -> Result<pb::ContextResponse> {
        self.more(session, question, "", current_confidence, wanted).await
    }

    /// Answers a worker's `atp.v1.ContextRequest` ([`ScdLink::request_more`]
    /// with its question, reasoning, indices and ids); the reply carries the
    /// request's `task_id`. `from`, nonce and signature are the caller's.
    pub async fn answer(&self, session: &SessionHandle, req: &pb::ContextRequest) -> Result<pb::ContextResponse> {
        let wanted: Vec<ChunkRef> = req
            .requested_chunk_indices
            .iter()
            .map(|&i| ChunkRef::Index(i))
            .chain(req.requested_chunk_ids.iter().map(|id| ChunkRef::Id(id.clone())))
            .collect();
        let mut resp =
            self.more(session, &req.specific_question, &req.reasoning, req.current_confidence, &wanted).await?;
        resp.task_id = req.task_id.clone();
        Ok(resp)
    }

    #[instrument(skip_all, fields(url = %self.url, session = %session.id, confidence = current_confidence))]
    async fn more(
        &self,
        session: &SessionHandle,
        question: &str,
        reasoning: &str,
        current_confidence: f64,
        wanted: &[ChunkRef],
    ) -> Result<pb::ContextResponse> {
        if !current_confidence.is_finite() || !(0.0..=1.0).contains(&current_confidence) {
            return Err(Error::Invalid {
                field: "current_confidence".into(),
                reason: format!("must be in [0, 1], got {current_confidence}"),
            });
        }
        if current_confidence >= THETA {
            return Ok(pb::ContextResponse {
                reason: format!("confidence {current_confidence} is at or above θ = {THETA}; no context sent"),
                remaining_tokens: session.remaining_tokens(),
                ..Default::default()
            });
        }
        let mut chunk_ids = Vec::with_capacity(wanted.len());
        for w in wanted {
            match w {
                ChunkRef::Id(id) => chunk_ids.push(id.clone()),
                ChunkRef::Index(i) => match session.chunk_id(*i) {
                    Some(id) => chunk_ids.push(id.to_string()),
                    None => {
                        return Err(Error::Invalid {
                            field: "requested_chunk_indices".into(),
                            reason: format!("index {i} is not in the transfer (it has {} chunks)", session.ids.len()),
                        })
                    }
                },
            }
        }
        if question.trim().is_empty() && chunk_ids.is_empty() {
            return Err(Error::Invalid {
                field: "specific_question".into(),
                reason: "must not be empty (or name chunks by index or id)".into(),
            });
        }
        let mut c = self.client.clone();
        let resp = c
            .request_context(scd::ContextRequest {
                session_id: session.id.clone(),
                specific_question: question.to_string(),
                current_confidence: current_confidence as f32,
                reasoning: reasoning.to_string(),
                chunk_ids,
                session_token: session.token.clone(),
                report: String::new(),
                // the session's total bounds it (the offer's budget)
                max_tokens: 0,
                // no retry here: a failed call is the worker's to report
                request_id: String::new(),
            })
            .await
            .map_err(|s| self.status("RequestContext", s))?
            .into_inner();
        let out = response_from_scd(&resp, session)?;
        debug!(chunks = out.chunks.len(), remaining = out.remaining_tokens, "adaptive context");
        Ok(out)
    }

    /// Closes the session; `false` when SCD had no such session open (it
    /// expired).
    pub async fn close(&self, session: &SessionHandle) -> Result<bool> {
        let mut c = self.client.clone();
        let resp = c
            .close_session(scd::CloseSessionRequest {
                session_id: session.id.clone(),
                session_token: session.token.clone(),
            })
            .await
            .map_err(|s| self.status("CloseSession", s))?
            .into_inner();
        Ok(resp.closed)
    }
}

// ---------------------------------------------------------------------------
// What each hop cost
// ---------------------------------------------------------------------------

/// One delegation hop: the context a naive transfer would have sent against
/// what SCD sent, up front and on request.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Hop {
    /// The task delegated.
    pub task_id: String,
    /// The sender's DID.
    pub from: String,
    /// The receiver's DID.
    pub to: String,
    /// Tokens of the whole non-confidential context.
    pub full_tokens: u64,
    /// Tokens sent, up front and in answers to context requests.
    pub sent_tokens: u64,
    /// Adaptive context requests answered.
    pub context_requests: u32,
}

/// Sums over every hop of a ledger.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct HopTotals {
    /// Hops recorded.
    pub hops: usize,
    /// Tokens the naive transfers would have sent.
    pub full_tokens: u64,
    /// Tokens sent.
    pub sent_tokens: u64,
    /// Adaptive context requests answered.
    pub context_requests: u32,
    /// `full_tokens / sent_tokens`; `None` when nothing was sent.
    pub reduction_ratio: Option<f64>,
}

/// Tokens sent against full context, per hop (task, from, to).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HopLedger {
    hops: Vec<Hop>,
}

impl HopLedger {
    /// An empty ledger.
    pub fn new() -> Self {
        Self::default()
    }

    fn find(&mut self, task_id: &str, from: &str, to: &str) -> Option<&mut Hop> {
        self.hops.iter_mut().find(|h| h.task_id == task_id && h.from == from && h.to == to)
    }

    /// Records a transfer from `from` to `to`; a second transfer on the same
    /// hop (a retry) adds to it.
    pub fn record_transfer(&mut self, task_id: &str, from: &str, to: &str, t: &Transfer) {
        match self.find(task_id, from, to) {
            Some(h) => {
                h.full_tokens += t.full_tokens;
                h.sent_tokens += t.sent_tokens;
            }
            None => self.hops.push(Hop {
                task_id: task_id.to_string(),
                from: from.to_string(),
                to: to.to_string(),
                full_tokens: t.full_tokens,
                sent_tokens: t.sent_tokens,
                context_requests: 0,
            }),
        }
    }

    /// Records the answer to a context request on the hop `from` → `to`
    /// (the direction context flows); the hop must have a transfer.
    pub fn record_response(&mut self, task_id: &str, from: &str, to: &str, r: &pb::ContextResponse) -> Result<()> {
        let Some(h) = self.find(task_id, from, to) else {
            return Err(Error::Invalid {
                field: "hop".into(),
                reason: format!("no transfer recorded for task {task_id:?} from {from} to {to}"),
            });
        };
        h.context_requests += 1;
        h.sent_tokens += r.chunks.iter().map(|c| u64::from(c.tokens)).sum::<u64>();
        Ok(())
    }

    /// The hops in the order first recorded.
    pub fn hops(&self) -> &[Hop] {
        &self.hops
    }

    /// Sums over every hop.
    pub fn totals(&self) -> HopTotals {
        let full_tokens = self.hops.iter().map(|h| h.full_tokens).sum();
        let sent_tokens: u64 = self.hops.iter().map(|h| h.sent_tokens).sum();
        HopTotals {
            hops: self.hops.len(),
            full_tokens,
            sent_tokens,
            context_requests: self.hops.iter().map(|h| h.context_requests).sum(),
            reduction_ratio: (sent_tokens > 0).then(|| full_tokens as f64 / sent_tokens as f64),
        }
    }

    /// `{"hops": [...], "totals": {...}}` for the demo's report.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({ "hops": self.hops, "totals": self.totals() })
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    fn fixture() -> Vec<Field> {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/agent_context.json");
        ContextFile::load(&path).unwrap().fields
    }

    fn chunk(field: &str, id: &str, tokens: u32) -> scd::Chunk {
        scd::Chunk {
            field: field.into(),
            id: id.into(),
            text: format!("text of {id}"),
            score: 1.5,
            tokens,
            ..Default::default()
        }
    }

    fn dropped(field: &str, id: &str, tokens: u32) -> scd::DroppedChunk {
        scd::DroppedChunk { field: field.into(), id: id.into(), stub: format!("stub of {id}"), tokens }
    }

    /// SCD's answer for the fixture: two chunks sent, three stubs, api_keys withheld.
    fn response() -> scd::CompressResponse {
        scd::CompressResponse {
            chunks: vec![chunk("db_schema", "db_schema#1", 47), chunk("error_logs", "error_logs#0", 31)],
            dropped: vec![
                dropped("db_schema", "db_schema#0", 24),
                dropped("error_logs", "error_logs#1", 66),
                dropped("code", "code#0", 11),
            ],
            totals: Some(scd::Totals { context_tokens: 391, sent_tokens: 78, ..Default::default() }),
            task_embedding: vec![0.6, 0.8, 0.0],
            session_id: "s1".into(),
            session_token: "tok".into(),
            withheld_fields: vec!["api_keys".into()],
            ..Default::default()
        }
    }

    #[test]
    fn fixture_loads_strictly_and_debug_hides_content() {
        let fields = fixture();
        assert_eq!(fields.len(), 5);
        assert_eq!((fields[0].name.as_str(), fields[0].kind), ("db_schema", FieldKind::Table));
        let secret = fields.iter().find(|f| f.confidential).unwrap();
        assert_eq!(secret.name, "api_keys");
        let printed = format!("{fields:?}");
        assert!(!printed.contains("sk_live_SECRET_4242") && printed.contains("api_keys"), "{printed}");
        let err = ContextFile::from_json(r#"{"fields": [{"name": "a", "content": "x", "confidental": true}]}"#)
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("context.fields[0].confidental: unknown field `confidental`"), "{err}");
        let f = &ContextFile::from_json(r#"{"fields": [{"name": "a", "content": "x"}]}"#).unwrap().fields[0];
        assert_eq!((f.kind, f.confidential), (FieldKind::Prose, false));
        let err = ContextFile::load(Path::new("/nonexistent/ctx.json")).unwrap_err().to_string();
        assert!(err.contains("/nonexistent/ctx.json"), "{err}");
    }

    #[test]
    fn task_text_is_built_as_scd_builds_it() {
        let t = Task {
            description: "  Fix the bug ".into(),
            constraints: vec![" no new deps".into(), "keep the API".into()],
            output_schema: Some(" {\"patch\": string} ".into()),
        };
        assert_eq!(
            t.text(),
            "Fix the bug\nConstraint: no new deps\nConstraint: keep the API\nOutput: {\"patch\": string}"
        );
        // the wire has no "empty but present" schema
        let t = Task { output_schema: Some(String::new()), ..Task::new("x") };
        assert_eq!((t.text().as_str(), scd::Task::from(&t).output_schema.as_str()), ("x", ""));
        let printed = format!("{:?}", Task::new("secret plan"));
        assert!(!printed.contains("secret plan"), "{printed}");
        let err = serde_json::from_str::<Task>(r#"{"description": "x", "schema": "y"}"#).unwrap_err();
        assert!(err.to_string().contains("unknown field `schema`"));
    }

    #[test]
    fn offer_maps_to_scd_requirement() {
        let offer = pb::ContextRequirement {
            required_fields: vec!["db_schema".into()],
            optional_fields: vec!["code".into()],
            max_context_tokens: 300,
            relevance_threshold: None,
        };
        let r = requirement_from_offer(&offer).unwrap();
        assert_eq!((r.required_fields, r.optional_fields), (vec!["db_schema".to_string()], vec!["code".to_string()]));
        assert_eq!((r.max_context_tokens, r.relevance_threshold), (300, None));
        assert_eq!(r.min_relative_score, Some(DEFAULT_MIN_RELATIVE_SCORE));
        let r = requirement_from_offer(&pb::ContextRequirement { relevance_threshold: Some(0.25), ..offer.clone() })
            .unwrap();
        assert_eq!((r.relevance_threshold, r.min_relative_score), (Some(0.25), None));

        let err = requirement_from_offer(&pb::ContextRequirement { max_context_tokens: 0, ..offer.clone() })
            .unwrap_err()
            .to_string();
        assert_eq!(err, "requirement.max_context_tokens: must be at least 1 (the receiver's budget in tokens)");
        for bad in [1.5, -1.01, f64::NAN, f64::INFINITY] {
            let err =
                requirement_from_offer(&pb::ContextRequirement { relevance_threshold: Some(bad), ..offer.clone() })
                    .unwrap_err()
                    .to_string();
            assert_eq!(err, format!("requirement.relevance_threshold: must be a cosine in [-1, 1], got {bad}"));
        }
    }

    #[test]
    fn transfer_indexes_chunks_and_stubs_in_reading_order() {
        let fields = fixture();
        let t = transfer_from_scd(&response(), &fields, 100, "tok").unwrap();
        // reading order: db_schema#0, db_schema#1, error_logs#0, error_logs#1, code#0
        let idx: Vec<(u32, &str)> = t.diff.chunks.iter().map(|c| (c.index, c.chunk_id.as_str())).collect();
        assert_eq!(idx, vec![(1, "db_schema#1"), (2, "error_logs#0")]);
        let stubs: Vec<(u32, &str)> = t.diff.dropped.iter().map(|d| (d.index, d.chunk_id.as_str())).collect();
        assert_eq!(stubs, vec![(0, "db_schema#0"), (3, "error_logs#1"), (4, "code#0")]);
        assert_eq!(t.diff.chunks[0].data, b"text of db_schema#1");
        assert_eq!((t.diff.chunks[0].field.as_str(), t.diff.chunks[0].tokens), ("db_schema", 47));
        assert!((t.diff.chunks[0].relevance_score - 1.5).abs() < 1e-9);
        assert_eq!(t.diff.dropped[1].stub, "stub of error_logs#1");
        assert_eq!((t.diff.original_size, t.diff.compressed_size), (391, 78));
        assert_eq!((t.full_tokens, t.sent_tokens), (391, 78));
        assert!((t.reduction_ratio().unwrap() - 391.0 / 78.0).abs() < 1e-9);
        assert_eq!(t.diff.withheld_fields, vec!["api_keys".to_string()]);
        assert_eq!(t.diff.base_hash, context_hash(&fields).to_vec());
        let e = t.diff.task_embedding.as_ref().unwrap();
        assert_eq!(e.dimensions, 3);
        assert!((e.values[1] - 0.8).abs() < 1e-6);
        assert_eq!((t.session.id.as_str(), t.session.token()), ("s1", "tok"));
        assert_eq!((t.session.chunk_id(3), t.session.index_of("code#0")), (Some("error_logs#1"), Some(4)));
        assert_eq!(t.session.remaining_tokens(), 22);
    }

    #[test]
    fn a_chunk_or_stub_of_a_withheld_field_is_never_forwarded() {
        let fields = fixture();
        // SCD names the field withheld, yet sends a chunk of it
        let mut r = response();
        r.chunks.push(chunk("api_keys", "api_keys#0", 5));
        let err = transfer_from_scd(&r, &fields, 1000, "tok").unwrap_err();
        assert!(
            matches!(&err, Error::ConfidentialChunk { field, chunk_id } if field == "api_keys" && chunk_id == "api_keys#0")
        );
        assert_eq!(err.to_string(), "SCD returned chunk api_keys#0 of withheld field api_keys; it is not forwarded");
        // a stub of it
        let mut r = response();
        r.dropped.push(dropped("api_keys", "api_keys#0", 5));
        assert!(matches!(transfer_from_scd(&r, &fields, 1000, "tok"), Err(Error::ConfidentialChunk { .. })));
        // SCD forgot to list it as withheld: marked confidential here is enough
        let mut r = response();
        r.withheld_fields.clear();
        r.chunks.push(chunk("api_keys", "api_keys#0", 5));
        assert!(matches!(transfer_from_scd(&r, &fields, 1000, "tok"), Err(Error::ConfidentialChunk { .. })));
        // and in an adaptive answer
        let t = transfer_from_scd(&response(), &fields, 1000, "tok").unwrap();
        let more = scd::ContextResponse { chunks: vec![chunk("api_keys", "api_keys#0", 5)], ..Default::default() };
        assert!(matches!(response_from_scd(&more, &t.session), Err(Error::ConfidentialChunk { .. })));
    }

    #[test]
    fn malformed_scd_replies_are_refused() {
        let fields = fixture();
        let err = transfer_from_scd(&response(), &fields, 77, "tok").unwrap_err().to_string();
        assert_eq!(err, "SCD's OpenSession reply: sent 78 tokens, over the receiver's budget of 77");
        let mut r = response();
        r.chunks.push(chunk("nope", "nope#0", 1));
        let err = transfer_from_scd(&r, &fields, 1000, "tok").unwrap_err().to_string();
        assert!(err.contains("chunk nope#0 names field \"nope\", which is not in the context"), "{err}");
        let mut r = response();
        r.dropped.push(dropped("db_schema", "db_schema#1", 47));
        let err = transfer_from_scd(&r, &fields, 1000, "tok").unwrap_err().to_string();
        assert!(err.ends_with("chunk db_schema#1 appears twice"), "{err}");
        let t = transfer_from_scd(&response(), &fields, 1000, "tok").unwrap();
        let more = scd::ContextResponse { chunks: vec![chunk("code", "code#9", 5)], ..Default::default() };
        let err = response_from_scd(&more, &t.session).unwrap_err().to_string();
        assert_eq!(err, "SCD's RequestContext reply: chunk code#9 is not in the transfer's manifest");
    }

    #[test]
    fn adaptive_answer_keeps_stub_indices_and_tracks_the_budget() {
        let t = transfer_from_scd(&response(), &fixture(), 100, "tok").unwrap();
        let more = scd::ContextResponse {
            chunks: vec![chunk("error_logs", "error_logs#1", 15)],
            remaining_tokens: 7,
            reason: String::new(),
            ..Default::default()
        };
        let out = response_from_scd(&more, &t.session).unwrap();
        assert_eq!(out.chunks.len(), 1);
        assert_eq!((out.chunks[0].index, out.chunks[0].chunk_id.as_str()), (3, "error_logs#1"));
        assert_eq!((out.remaining_tokens, t.session.remaining_tokens()), (7, 7));
    }

    #[test]
    fn session_debug_never_prints_the_token() {
        let t = transfer_from_scd(&response(), &fixture(), 100, "s3cr3t-t0ken").unwrap();
        let printed = format!("{t:?}");
        assert!(!printed.contains("s3cr3t-t0ken") && printed.contains("<secret>"), "{printed}");
        assert!(printed.contains("s1"));
    }

    #[test]
    fn context_hash_covers_public_content_and_never_secrets() {
        let fields = fixture();
        let h = context_hash(&fields);
        let mut edited = fields.clone();
        edited[0].content.push('x');
        assert_ne!(context_hash(&edited), h);
        let mut renamed = fields.clone();
        renamed[1].name = "logs".into();
        assert_ne!(context_hash(&renamed), h);
        let mut secret = fields.clone();
        secret[4].content = "another secret".into();
        assert_eq!(context_hash(&secret), h, "confidential content is not hashed");
        // the length prefixes keep field boundaries apart
        let a = vec![Field { name: "ab".into(), kind: FieldKind::Prose, content: "c".into(), confidential: false }];
        let b = vec![Field { name: "a".into(), kind: FieldKind::Prose, content: "bc".into(), confidential: false }];
        assert_ne!(context_hash(&a), context_hash(&b));
    }

    #[test]
    fn hop_ledger_sums_hops_and_requests() {
        let t = transfer_from_scd(&response(), &fixture(), 100, "tok").unwrap();
        let mut l = HopLedger::new();
        l.record_transfer("t1", "did:a", "did:b", &t);
        l.record_transfer("t1", "did:b", "did:c", &t);
        let more = pb::ContextResponse {
            chunks: vec![pb::ContextChunk { tokens: 11, ..Default::default() }],
            ..Default::default()
        };
        l.record_response("t1", "did:a", "did:b", &more).unwrap();
        let err = l.record_response("t2", "did:a", "did:b", &more).unwrap_err().to_string();
        assert_eq!(err, "hop: no transfer recorded for task \"t2\" from did:a to did:b");
        assert_eq!(l.hops()[0].sent_tokens, 78 + 11);
        assert_eq!(l.hops()[0].context_requests, 1);
        let tot = l.totals();
        assert_eq!((tot.hops, tot.full_tokens, tot.sent_tokens, tot.context_requests), (2, 782, 167, 1));
        assert!((tot.reduction_ratio.unwrap() - 782.0 / 167.0).abs() < 1e-9);
        let json = l.to_json();
        assert_eq!(json["totals"]["sent_tokens"], 167);
        assert_eq!(json["hops"][1]["to"], "did:c");
        let back: HopLedger = serde_json::from_value(serde_json::json!({ "hops": json["hops"] })).unwrap();
        assert_eq!(back, l);
        assert_eq!(HopLedger::new().totals().reduction_ratio, None);
    }

    /// A link whose channel never connects: what it answers, it answers
    /// without asking SCD.
    fn offline() -> ScdLink {
        ScdLink::from_channel(Channel::from_static("http://127.0.0.1:9").connect_lazy(), "http://127.0.0.1:9")
    }

    #[tokio::test]
    async fn at_or_above_theta_nothing_is_sent_and_scd_is_not_asked() {
        let t = transfer_from_scd(&response(), &fixture(), 100, "tok").unwrap();
        for conf in [THETA, 0.95, 1.0] {
            let r = offline().request_more(&t.session, "anything", conf, &[]).await.unwrap();
            assert!(r.chunks.is_empty());
            assert_eq!(r.reason, format!("confidence {conf} is at or above θ = 0.7; no context sent"));
            assert_eq!(r.remaining_tokens, 22);
        }
        // a worker's ContextRequest: the answer names its task
        let req = pb::ContextRequest {
            task_id: "task-7".into(),
            current_confidence: 0.8,
            specific_question: "more?".into(),
            requested_chunk_indices: vec![0],
            ..Default::default()
        };
        let r = offline().answer(&t.session, &req).await.unwrap();
        assert_eq!((r.task_id.as_str(), r.chunks.len()), ("task-7", 0));
        assert!(r.reason.starts_with("confidence 0.8 is at or above"), "{}", r.reason);
    }

    #[tokio::test]
    async fn bad_adaptive_requests_are_refused_before_scd() {
        let t = transfer_from_scd(&response(), &fixture(), 100, "tok").unwrap();
        let link = offline();
        for conf in [-0.1, 1.5, f64::NAN] {
            let err = link.request_more(&t.session, "q", conf, &[]).await.unwrap_err().to_string();
            assert_eq!(err, format!("current_confidence: must be in [0, 1], got {conf}"));
        }
        let err = link.request_more(&t.session, "q", 0.2, &[5.into()]).await.unwrap_err().to_string();
        assert_eq!(err, "requested_chunk_indices: index 5 is not in the transfer (it has 5 chunks)");
        let req =
            pb::ContextRequest { current_confidence: 0.1, requested_chunk_indices: vec![9], ..Default::default() };
        let err = link.answer(&t.session, &req).await.unwrap_err().to_string();
        assert_eq!(err, "requested_chunk_indices: index 9 is not in the transfer (it has 5 chunks)");
        let err = link.request_more(&t.session, "  ", 0.2, &[]).await.unwrap_err().to_string();
        assert_eq!(err, "specific_question: must not be empty (or name chunks by index or id)");
        // a valid request reaches for SCD, and the error names the URL and RPC
        let err = link.request_more(&t.session, "q", 0.2, &["code#0".into()]).await.unwrap_err().to_string();
        assert!(err.starts_with("SCD RequestContext at http://127.0.0.1:9 failed: Unavailable"), "{err}");
    }

    #[tokio::test]
    async fn connect_names_the_url() {
        let err = ScdLink::connect("https://scd.example:443").await.unwrap_err().to_string();
        assert_eq!(
            err,
            "scd_url: \"https://scd.example:443\" must start with http:// (this client speaks plaintext gRPC)"
        );
        let err = ScdLink::connect("http://127.0.0.1:9").await.unwrap_err().to_string();
        assert!(err.starts_with("cannot connect to SCD at http://127.0.0.1:9"), "{err}");
        let err = ScdLink::connect("http://bad host").await.unwrap_err().to_string();
        assert!(err.starts_with("scd_url: \"http://bad host\" is not a URI"), "{err}");
    }
}
