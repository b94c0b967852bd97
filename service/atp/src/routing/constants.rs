//! The paper's constants for routing and repricing, and our own choices
//! beside them (each says which it is).

/// The most routes [`route`] and [`route_patterns`] return (best first).
/// Algorithm 1 needs only the argmax; the rest are failover alternatives.
pub const ROUTE_LIMIT: usize = 64;

/// §7.3: routes are recomputed at least this often.
pub const REPRICE_INTERVAL_MS: u64 = 60_000;

/// §7.3: a relative cost change above this triggers repricing.
pub const COST_CHANGE: f64 = 0.10;

/// §7.3: a relative quality change above this triggers repricing.
pub const QUALITY_CHANGE: f64 = 0.05;

/// Draft-refine model: the share of the refiner's residual error a perfect
/// draft removes (see [`Pattern::DraftRefine`]). Our choice, not the paper's.
pub const DRAFT_LIFT: f64 = 0.5;

/// Cascade plans escalate when the answering agent's confidence is below this.
pub const CASCADE_MIN_CONFIDENCE: f64 = 0.7;
