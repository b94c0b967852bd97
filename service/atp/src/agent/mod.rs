//! An ATP agent: a tonic server of `atp.v1.AtpService` plus the clients it
//! uses to reach its peers.
//!
//! Every agent answers probes with signed offers (layer 2), accepts
//! contracts, runs the tasks it is contracted for (their "work" is
//! simulated: a number of steps, each checkpointed, whose length comes from
//! the agent's declared latency), asks its requester for more context when
//! its confidence drops below θ (layer 3), sends heartbeats and back-pressure
//! to its requesters (layer 5), and countersigns the interaction proofs its
//! requesters send it, appending them to its Merkle log (layer 1).
//!
//! The requester side (probing, routing, SCD transfers, failover) is in
//! [`crate::planner`]; a planner is an agent too, so its workers can reach
//! it with RequestContext, SendHeartbeat and ReportBackpressure.
//!
//! Every signed message goes through the [`Verifier`](crate::identity::Verifier) first: unsigned,
//! tampered, foreign-key, stale or replayed messages are UNAUTHENTICATED.

mod config;
mod node;
mod reading;
mod serve;
mod service;
#[cfg(test)]
mod tests;

pub use crate::work::{WorkOrder, WorkReport, MAX_NEEDS, MAX_PAYLOAD_BYTES, MAX_STEPS};
pub use config::AgentConfig;
pub use node::Node;
pub use reading::{check_reply_to, confidence, MAX_CHUNK_NAME_BYTES, MAX_CONTEXT_CHUNKS};
pub use scd_did::time::now_s;
pub use serve::{serve, MAX_MESSAGE_BYTES};
pub use service::AgentService;
