//! The simulated work an ATP task carries: the requester's [`WorkOrder`]
//! (JSON in `TaskSubmit.payload`) and the worker's [`WorkReport`] (JSON in
//! the final `TaskResult.payload`), with their bounds. Both sides of a
//! delegation use these, so they sit below [`crate::agent`] and
//! [`crate::planner`].
//!
//! ```
//! use scd_atp::work::{WorkOrder, MAX_STEPS};
//!
//! let order = WorkOrder::parse(br#"{"title": "triage the outage", "steps": 3}"#).unwrap();
//! assert_eq!(order.steps, 3);
//! let too_long = format!(r#"{{"title": "x", "steps": {}}}"#, MAX_STEPS + 1);
//! assert!(WorkOrder::parse(too_long.as_bytes()).unwrap_err().to_string().starts_with("task.payload.steps"));
//! ```

use serde::{Deserialize, Serialize};

use crate::{Error, Result};

/// Bytes of a task payload (the work order).
pub const MAX_PAYLOAD_BYTES: usize = 64 * 1024;
/// Steps of one work order.
pub const MAX_STEPS: u32 = 100;
/// Needs of one work order.
pub const MAX_NEEDS: usize = 32;

/// The simulated work a task asks for: JSON in `TaskSubmit.payload`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkOrder {
    /// What to do.
    pub title: String,
    /// Checkpointed steps (1 to [`MAX_STEPS`]).
    #[serde(default = "default_steps")]
    pub steps: u32,
    /// Facts the work needs from the context (case-insensitive substrings):
    /// the worker's confidence is the share it found, and below θ it asks
    /// its requester for each missing one.
    #[serde(default)]
    pub needs: Vec<String>,
    /// A poison order: every agent fails it at step 2 with this error.
    #[serde(default)]
    pub fail: Option<String>,
}

fn default_steps() -> u32 {
    4
}

impl WorkOrder {
    /// Parses and checks a payload; the error names the field and the limit.
    pub fn parse(payload: &[u8]) -> Result<WorkOrder> {
        let invalid = |field: &str, reason: String| Error::Invalid { field: field.into(), reason };
        if payload.len() > MAX_PAYLOAD_BYTES {
            return Err(invalid("task.payload", format!("{} bytes (limit {MAX_PAYLOAD_BYTES})", payload.len())));
        }
        let mut de = serde_json::Deserializer::from_slice(payload);
        let order: WorkOrder = serde_path_to_error::deserialize(&mut de)
            .map_err(|e| invalid(&format!("task.payload.{}", e.path()), e.inner().to_string()))?;
        de.end().map_err(|e| invalid("task.payload", e.to_string()))?;
        if order.steps == 0 || order.steps > MAX_STEPS {
            return Err(invalid("task.payload.steps", format!("{} (1 to {MAX_STEPS})", order.steps)));
        }
        if order.needs.len() > MAX_NEEDS {
            return Err(invalid("task.payload.needs", format!("{} needs (limit {MAX_NEEDS})", order.needs.len())));
        }
        Ok(order)
    }
}

/// The most chunk ids a report lists: a finished job is kept with its
/// report, so a context of many chunks must not make it large.
pub const MAX_REPORT_CHUNKS: usize = 64;

/// What the worker did: JSON in the final `TaskResult.payload`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkReport {
    /// The order's title.
    pub title: String,
    /// Steps run here (not counting the ones resumed past).
    pub steps_run: u32,
    /// The step this agent resumed after (0 = from scratch).
    pub resumed_after: u32,
    /// Chunks of context it used (the first [`MAX_REPORT_CHUNKS`]).
    pub chunks: Vec<String>,
    /// Its confidence on the context it was sent, in [0, 1].
    pub confidence: f64,
    /// Its confidence after its context requests.
    pub final_confidence: f64,
    /// RequestContext calls it made.
    pub context_requests: u32,
}
