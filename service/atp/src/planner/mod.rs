//! The requester side of an agent: it delegates a task through all five
//! layers.
//!
//! One task, in order (ARCHITECTURE.md draws it):
//!
//! 1. **context (3)**: SCD embeds the task (e_task) over gRPC;
//! 2. **handshake (2)**: a signed probe carrying e_task goes to every peer
//!    whose circuit is not open; offers are verified (signature, nonce,
//!    Merkle evidence); no offer → retries with relaxed constraints, then
//!    escalation;
//! 3. **routing (4)**: offers become candidates (trust from this agent's
//!    ledger, estimates repriced from interaction proofs) and Algorithm 1
//!    ranks the routes; the best is contracted;
//! 4. **context (3)**: SCD compresses the context to the offer's
//!    requirement; the task carries the minimal sufficient context (chunk
//!    ids and scores), never confidential fields; the worker's RequestContext
//!    calls are answered through the SCD session;
//! 5. **fault (5)**: results stream back with checkpoints, stored durably;
//!    a broken stream or missed heartbeats (T_fail) fail the worker over to
//!    the next route, resuming from the last checkpoint; breakers open after
//!    3 consecutive failures; a task that fails on 3 distinct agents within
//!    60 s is poison and goes back to the originator;
//! 6. **trust (1)**: a signed interaction proof goes to the worker, comes
//!    back countersigned with its Merkle inclusion proof, and is appended to
//!    this agent's log; a contract violation makes it a negative proof.
mod composite;
mod delegate;
mod driver;
mod failure;
mod job;
mod prove;
mod reoffer;
mod run;
#[cfg(test)]
mod tests;

pub use crate::requester::{short, Event, PlannerState};
pub use driver::Planner;
pub use job::{Job, Outcome, PatternRun, StageRun};
