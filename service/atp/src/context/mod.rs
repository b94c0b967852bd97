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

/// The task, the fields and the context file are the context model's own
/// types (`scd-context`), shared with the engine: one `Task::text`, one
/// strict parser. A context file is `{"fields": [...]}`, the format
/// `scd compress --context` reads (e.g. `fixtures/agent_context.json`).
pub use scd_context::{Context as ContextFile, Field, FieldKind, Task};

mod convert;
mod hops;
mod link;
mod session;
#[cfg(test)]
mod tests;

pub use convert::{
    chunk_from_scd, context_hash, embedding_from_scd, requirement_from_offer, response_from_scd, stub_from_scd,
    transfer_from_scd, DEFAULT_MIN_RELATIVE_SCORE,
};
pub use hops::{Hop, HopLedger, HopTotals};
pub use link::{ScdLink, CONNECT_TIMEOUT, MAX_REPLY_BYTES, THETA};
pub use session::{ChunkRef, SessionHandle, Transfer};
