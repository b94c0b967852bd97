//! What a worker makes of the context it was sent: the limits on it, its
//! confidence against the work order's needs, the needs it cites, and the
//! check that a reply is addressed to it.

use tonic::Status;

pub use crate::work::WorkOrder;
use crate::work::{normalize, reading_text};
use crate::{pb, Result};

/// The most chunks a task's context (or its checkpoint) may hold.
pub const MAX_CONTEXT_CHUNKS: usize = 1024;
/// The longest chunk id or field name, in bytes.
pub const MAX_CHUNK_NAME_BYTES: usize = 256;

/// Checks the shape of a context a peer sent: at most
/// [`MAX_CONTEXT_CHUNKS`] chunks (and withheld fields), names of at most
/// [`MAX_CHUNK_NAME_BYTES`]; the error names the field and the limit.
pub(super) fn check_context(diff: &pb::ContextDiff, field: &str) -> Result<(), Status> {
    if diff.chunks.len() > MAX_CONTEXT_CHUNKS || diff.withheld_fields.len() > MAX_CONTEXT_CHUNKS {
        return Err(Status::invalid_argument(format!(
            "{field}: {} chunks and {} withheld fields, over the limit of {MAX_CONTEXT_CHUNKS} each",
            diff.chunks.len(),
            diff.withheld_fields.len()
        )));
    }
    let long = |s: &str| s.len() > MAX_CHUNK_NAME_BYTES;
    if let Some(i) = diff.chunks.iter().position(|c| long(&c.chunk_id) || long(&c.field)) {
        return Err(Status::invalid_argument(format!(
            "{field}.chunks[{i}]: a chunk_id or field over {MAX_CHUNK_NAME_BYTES} bytes"
        )));
    }
    if diff.withheld_fields.iter().any(|f| long(f)) {
        return Err(Status::invalid_argument(format!(
            "{field}.withheld_fields: a name over {MAX_CHUNK_NAME_BYTES} bytes"
        )));
    }
    Ok(())
}

/// A chunk without its text: what a checkpoint holds of it.
pub(super) fn chunk_ref(c: &pb::ContextChunk) -> pb::ContextChunk {
    pb::ContextChunk {
        index: c.index,
        data: Vec::new(),
        relevance_score: c.relevance_score,
        chunk_id: c.chunk_id.clone(),
        field: c.field.clone(),
        tokens: c.tokens,
    }
}

/// The share of the order's needs found in the context (1.0 without needs).
pub fn confidence(order: &WorkOrder, context: &pb::ContextDiff) -> f64 {
    if order.needs.is_empty() {
        return 1.0;
    }
    let found = order.needs.len() - missing(order, context).len();
    found as f64 / order.needs.len() as f64
}

/// The order's needs the context does not hold (read in order, so a need
/// across two neighbouring chunks is held).
pub(super) fn missing(order: &WorkOrder, context: &pb::ContextDiff) -> Vec<String> {
    let reading = reading_text(&context.chunks);
    order.needs.iter().filter(|n| !reading.holds(&normalize(n))).cloned().collect()
}

/// The chunk ids a report cites (at most [`crate::work::MAX_REPORT_CHUNKS`]):
/// those holding one of the order's needs first (every chunk a need
/// straddles), as that is what the requester checks, then the others in
/// context order.
pub(super) fn cited(order: &WorkOrder, context: &pb::ContextDiff) -> Vec<String> {
    let reading = reading_text(&context.chunks);
    let mut ids: Vec<String> = Vec::new();
    let mut seen: std::collections::HashSet<&str> = std::collections::HashSet::new();
    let used = order.needs.iter().flat_map(|n| reading.holding(&normalize(n)));
    for c in used.chain(context.chunks.iter()) {
        if ids.len() >= crate::work::MAX_REPORT_CHUNKS {
            break;
        }
        if seen.insert(c.chunk_id.as_str()) {
            ids.push(c.chunk_id.clone());
        }
    }
    ids
}

/// Adds the chunks of `more` not in `context` yet (by id), in one pass.
pub(super) fn merge_chunks(context: &mut pb::ContextDiff, more: &[pb::ContextChunk]) {
    let mut seen: std::collections::HashSet<String> = context.chunks.iter().map(|k| k.chunk_id.clone()).collect();
    for c in more {
        if context.chunks.len() >= MAX_CONTEXT_CHUNKS {
            tracing::warn!(limit = MAX_CONTEXT_CHUNKS, "context answer past the chunk limit; the rest is dropped");
            break;
        }
        if seen.insert(c.chunk_id.clone()) {
            context.chunks.push(c.clone());
        }
    }
}

/// Why `reply_to` may not be called back for a contract that came from
/// `peer`: it must name that address (`localhost` for a loopback one) or one
/// of `allowed`. The host is not quoted back.
pub fn check_reply_to(
    url: &str,
    peer: Option<std::net::SocketAddr>,
    allowed: &[String],
) -> std::result::Result<(), String> {
    let uri: tonic::codegen::http::Uri = url.parse().map_err(|_| "contract.reply_to: not a URL".to_string())?;
    if !matches!(uri.scheme_str(), Some("http" | "https")) {
        return Err("contract.reply_to: not an http or https URL".into());
    }
    let host = uri.host().unwrap_or_default().trim_start_matches('[').trim_end_matches(']');
    if allowed.iter().any(|a| a.eq_ignore_ascii_case(host)) {
        return Ok(());
    }
    let from = peer.map(|p| p.ip().to_canonical());
    let same = match host.parse::<std::net::IpAddr>() {
        Ok(ip) => from == Some(ip.to_canonical()),
        Err(_) => host.eq_ignore_ascii_case("localhost") && from.is_some_and(|ip| ip.is_loopback()),
    };
    if same {
        Ok(())
    } else {
        Err("contract.reply_to: its host is neither the address this contract came from nor a --reply-to-host; \
             an agent calls back only its requester"
            .into())
    }
}
