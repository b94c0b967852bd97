//! Layer 5: fault tolerance (paper §8), as pure state machines.
//!
//! Every function takes `now_ms` (milliseconds on any monotonic clock the
//! caller picks), so nothing here sleeps or reads a clock and every
//! transition is testable:
//!
//! - [`HealthMonitor`]: heartbeats; an agent silent for T_fail = 3 × its
//!   heartbeat interval has failed (§8.1); HEALTHY / DEGRADED / OVERLOADED
//!   from what it reports and its load.
//! - [`CircuitBreakers`]: per agent, CLOSED → OPEN after 3 consecutive
//!   failures; OPEN refuses until a cool-down, then HALF-OPEN lets exactly one
//!   probe through; the probe's success closes, its failure reopens (§8.3).
//! - [`PoisonDetector`]: a task that failed on ≥ 3 distinct agents within
//!   60 s is poison: no more retries, diagnostics to the originator (§8.4).
//! - [`Backpressure`]: what an upstream agent does with a back-pressure
//!   signal: proceed, pace to the recommended rate (token bucket), buffer for
//!   the drain time, or reroute (§8.5).
//!
//! ```
//! use scd_atp::fault::{BreakerParams, CircuitBreakers};
//!
//! let mut b = CircuitBreakers::new(BreakerParams { failures_to_open: 3, cool_down_ms: 1_000 });
//! for t in 0..3 {
//!     assert!(b.allow("did:key:zA", t));
//!     b.record_failure("did:key:zA", t);
//! }
//! assert!(!b.allow("did:key:zA", 500)); // open
//! assert!(b.allow("did:key:zA", 1_002)); // half-open: the one probe
//! assert!(!b.allow("did:key:zA", 1_003)); // a second request waits for the probe
//! b.record_success("did:key:zA", 1_010);
//! assert!(b.allow("did:key:zA", 1_011)); // closed again
//! ```

mod backpressure;
mod breaker;
mod health;
mod poison;
#[cfg(test)]
mod tests;

pub use backpressure::{Action, Admit, Backpressure, BackpressureParams, TokenBucket, MAX_DRAIN_MS};
pub use breaker::{BreakerParams, CircuitBreakers, Transition};
pub use health::{
    status_from_load, Health, HealthMonitor, DEFAULT_HEARTBEAT_MS, DEGRADED_LOAD, MAX_HEARTBEAT_MS, MISSED_HEARTBEATS,
    OVERLOADED_LOAD,
};
pub use poison::{Poison, PoisonDetector, PoisonParams};
