//! The one mapping between SCD's messages and ATP's: requirements from
//! offers, chunks, stubs and embeddings, the [`Transfer`](super::Transfer) of
//! a compress and the answer to an adaptive request; withheld fields are
//! never forwarded. And the context's hash.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU32, Ordering};

use scd_proto::scd::v1 as scd;
use sha2::{Digest, Sha256};
use tracing::warn;

use super::session::SessionHandle;
use super::session::Transfer;
use crate::{pb, Error, Result};
use scd_context::Field;

/// What an offer without a `relevance_threshold` gets: SCD's calibrated
/// threshold, in standard deviations of the context's relevance scores. At 0
/// only chunks scoring at or above the context's mean are sent up front; the
/// rest of the receiver's budget stays open for adaptive requests.
pub const DEFAULT_MIN_RELATIVE_SCORE: f32 = 0.0;

/// Domain tag of [`context_hash`].
const HASH_TAG: &[u8] = b"scd-atp/context/v1\n";

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
