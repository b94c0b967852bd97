//! What each hop cost: the [`HopLedger`] of tokens sent against the full
//! context, per delegation.

use serde::{Deserialize, Serialize};

use super::session::Transfer;
use crate::{pb, Error, Result};

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
