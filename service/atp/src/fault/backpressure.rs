//! Back-pressure (§8.4): pace with a token bucket, buffer for the drain
//! time, or reroute.

use std::collections::HashMap;

use super::health::status_from_load;
use crate::pb;
use crate::pb::AgentStatus;

/// The longest drain time a back-pressure signal can hold an agent for.
pub const MAX_DRAIN_MS: u64 = 3_600_000;

/// Back-pressure policy settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BackpressureParams {
    /// A queue deeper than this: buffer for the drain time.
    pub buffer_queue_depth: u32,
    /// A queue deeper than this: reroute.
    pub reroute_queue_depth: u32,
    /// Buffer no longer than this; a longer drain reroutes.
    pub max_buffer_ms: u64,
    /// How long a signal's decision holds when it names no drain time.
    pub hold_ms: u64,
}

impl Default for BackpressureParams {
    /// Buffer past 32 queued, reroute past 256 or a drain over 5 s; a signal
    /// holds 5 s (ours: the paper gives no numbers).
    fn default() -> BackpressureParams {
        BackpressureParams { buffer_queue_depth: 32, reroute_queue_depth: 256, max_buffer_ms: 5_000, hold_ms: 5_000 }
    }
}

/// What to do with work for an agent that signalled back-pressure.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Action {
    /// Carry on.
    Proceed,
    /// Delegate at most `per_s` tasks per second (token bucket).
    SlowTo {
        /// Tasks per second.
        per_s: f64,
    },
    /// Hold new tasks for this long, then send.
    Buffer {
        /// The agent's estimated drain time.
        for_ms: u64,
    },
    /// Send new tasks elsewhere.
    Reroute,
}

/// Whether one task may go now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admit {
    /// Send it.
    Go,
    /// Try again after this long.
    WaitMs(u64),
    /// Send it to another agent.
    Reroute,
}

/// A token bucket: `rate_per_s` tokens a second, at most `burst` stored.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TokenBucket {
    rate_per_s: f64,
    burst: f64,
    tokens: f64,
    last_ms: u64,
}

impl TokenBucket {
    /// A full bucket (burst = max(1, rate)).
    pub fn new(rate_per_s: f64, now_ms: u64) -> TokenBucket {
        let burst = rate_per_s.max(1.0);
        TokenBucket { rate_per_s, burst, tokens: burst, last_ms: now_ms }
    }

    /// Takes a token if there is one; else how long until there is.
    pub fn take(&mut self, now_ms: u64) -> Admit {
        let dt = now_ms.saturating_sub(self.last_ms) as f64 / 1000.0;
        self.tokens = (self.tokens + dt * self.rate_per_s).min(self.burst);
        self.last_ms = self.last_ms.max(now_ms);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            Admit::Go
        } else if self.rate_per_s <= 0.0 {
            Admit::Reroute
        } else {
            Admit::WaitMs((((1.0 - self.tokens) / self.rate_per_s) * 1000.0).ceil() as u64)
        }
    }
}

#[derive(Debug, Clone, Copy)]
enum Hold {
    Pace(TokenBucket),
    BufferUntil(u64),
    Reroute,
}

/// The back-pressure policy (§8.5): turns signals into [`Action`]s and keeps,
/// per agent, the pacing or hold that applies until `until_ms`.
#[derive(Debug, Clone, Default)]
pub struct Backpressure {
    params: BackpressureParams,
    agents: HashMap<String, (Hold, u64)>,
}

impl Backpressure {
    /// No agent under back-pressure.
    pub fn new(params: BackpressureParams) -> Backpressure {
        Backpressure { params, agents: HashMap::new() }
    }

    /// The policy, in order: a queue over the hard limit, an OVERLOADED
    /// agent (by `status` or `current_load`) or a drain longer than
    /// `max_buffer_ms` → Reroute; a queue over the threshold → Buffer for the
    /// drain time; a recommended rate → SlowTo; else Proceed.
    pub fn decide(&self, sig: &pb::Backpressure, status: Option<AgentStatus>) -> Action {
        let p = &self.params;
        let overloaded =
            status == Some(AgentStatus::Overloaded) || status_from_load(sig.current_load) == AgentStatus::Overloaded;
        if sig.queue_depth > p.reroute_queue_depth || overloaded {
            Action::Reroute
        } else if sig.queue_depth > p.buffer_queue_depth {
            if sig.estimated_drain_ms > p.max_buffer_ms {
                Action::Reroute
            } else {
                Action::Buffer { for_ms: sig.estimated_drain_ms }
            }
        } else if sig.recommended_rate > 0.0 {
            Action::SlowTo { per_s: sig.recommended_rate }
        } else {
            Action::Proceed
        }
    }

    /// Applies a signal from its sender (`from`): decides, and holds the
    /// decision for the drain time (or `hold_ms` when none is given).
    pub fn signal(&mut self, sig: &pb::Backpressure, status: Option<AgentStatus>, now_ms: u64) -> Action {
        let did = sig.from.as_ref().map(|a| a.uuid.clone()).unwrap_or_default();
        let action = self.decide(sig, status);
        let drain_ms = sig.estimated_drain_ms.min(MAX_DRAIN_MS);
        let until = now_ms.saturating_add(if drain_ms > 0 { drain_ms } else { self.params.hold_ms });
        let hold = match action {
            Action::Proceed => {
                self.agents.remove(&did);
                return action;
            }
            Action::SlowTo { per_s } => Hold::Pace(TokenBucket::new(per_s, now_ms)),
            Action::Buffer { for_ms } => Hold::BufferUntil(now_ms.saturating_add(for_ms.min(MAX_DRAIN_MS))),
            Action::Reroute => Hold::Reroute,
        };
        tracing::debug!(agent = %did, ?action, "back-pressure");
        self.agents.insert(did, (hold, until));
        action
    }

    /// Whether one task may go to `did` now.
    pub fn admit(&mut self, did: &str, now_ms: u64) -> Admit {
        let Some((hold, until)) = self.agents.get_mut(did) else { return Admit::Go };
        if now_ms >= *until {
            self.agents.remove(did);
            return Admit::Go;
        }
        match hold {
            Hold::Pace(bucket) => bucket.take(now_ms),
            Hold::BufferUntil(t) if now_ms < *t => Admit::WaitMs(*t - now_ms),
            Hold::BufferUntil(_) => Admit::Go,
            Hold::Reroute => Admit::Reroute,
        }
    }
}
