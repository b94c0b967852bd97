//! # scd-atp
//!
//! A thin but complete Agent Transport Protocol stack (the ATP paper, §4–§9)
//! over gRPC (`atp.v1`, wire-compatible with the reference implementation's
//! protos). One module per layer:
//!
//! | layer | module | what it does |
//! |---|---|---|
//! | 1 identity & trust | [`identity`], [`merkle`], [`trust`] | did:key / did:wba identities, Ed25519 signatures over deterministic protobuf, replay and staleness checks, Merkle logs of interaction proofs, Definition 3 trust |
//! | 2 handshake | [`handshake`] | probe → offer → contract with T_offer, retries that relax constraints, escalation |
//! | 3 context | [`context`] | SCD over its gRPC client: task embeddings, minimal sufficient context, adaptive requests |
//! | 4 routing | [`routing`] | Algorithm 1, composite patterns, repricing |
//! | 5 fault tolerance | [`fault`] | heartbeats, circuit breakers, poison tasks, back-pressure, checkpoints |
//!
//! plus [`agent`] (an ATP agent: a tonic server of `atp.v1.AtpService` and
//! its clients), [`planner`] (the requester side: one task through the five
//! layers), [`requester`] (what a requester keeps between calls, fed by its
//! server and read by its planner), [`work`] (the simulated work orders both
//! sides exchange) and [`store`] (what survives a restart, in redb, with the
//! audit trail's tables beside it).
//!
//! Keys, DIDs, DID documents, the key file, the replay log and the clock
//! come from `scd-did`; the audit trail from `scd-audit`. Both are general
//! trust code that `scd serve` uses without this crate.
//!
//! This crate does not depend on `scd-engine`: it reaches SCD only through
//! the `scd.v1` gRPC client, so an agent can run on another machine.
#![warn(missing_docs)]

pub mod agent;
mod bounded;
pub mod context;
pub mod error;
pub mod fault;
pub mod handshake;
pub mod identity;
pub mod merkle;
pub mod planner;
pub mod requester;
pub mod routing;
pub mod store;
pub mod trust;
pub mod work;

pub use error::{Error, Result};
pub use scd_proto::atp::v1 as pb;
