//! A three-state circuit breaker per peer (§8.2).

use std::collections::HashMap;

use crate::pb;
use crate::pb::CircuitState;

/// Circuit breaker settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BreakerParams {
    /// Consecutive failures that open the circuit (N_fail, default 3).
    pub failures_to_open: u32,
    /// How long an open circuit refuses before letting a probe through.
    pub cool_down_ms: u64,
}

impl Default for BreakerParams {
    /// N_fail = 3 (§8.3); a 30 s cool-down (ours: the paper gives none).
    fn default() -> BreakerParams {
        BreakerParams { failures_to_open: 3, cool_down_ms: 30_000 }
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
struct Breaker {
    state: CircuitState,
    failures: u32,
    opened_ms: u64,
    probe_ms: Option<u64>,
}

/// A change of a breaker's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transition {
    /// Before.
    pub from: CircuitState,
    /// After.
    pub to: CircuitState,
    /// Consecutive failures counted when it happened.
    pub failures: u32,
}

/// One three-state circuit breaker per agent (§8.3).
#[derive(Debug, Clone, Default)]
pub struct CircuitBreakers {
    params: BreakerParams,
    agents: HashMap<String, Breaker>,
}

impl CircuitBreakers {
    /// Breakers, all CLOSED.
    pub fn new(params: BreakerParams) -> CircuitBreakers {
        CircuitBreakers { params, agents: HashMap::new() }
    }

    fn get(&mut self, did: &str) -> &mut Breaker {
        self.agents.entry(did.to_string()).or_insert(Breaker {
            state: CircuitState::Closed,
            failures: 0,
            opened_ms: 0,
            probe_ms: None,
        })
    }

    /// Whether a request may go to `did` now. CLOSED: yes. OPEN: no until the
    /// cool-down has passed, then the breaker goes HALF-OPEN and this request
    /// is the one probe. HALF-OPEN: no while the probe is out (a probe that
    /// has not reported within a cool-down counts as lost and another goes).
    pub fn allow(&mut self, did: &str, now_ms: u64) -> bool {
        let cool = self.params.cool_down_ms;
        let b = self.get(did);
        match b.state {
            CircuitState::Closed | CircuitState::Unspecified => true,
            CircuitState::Open => {
                if now_ms.saturating_sub(b.opened_ms) >= cool {
                    b.state = CircuitState::HalfOpen;
                    b.probe_ms = Some(now_ms);
                    tracing::info!(agent = did, "circuit half-open: probing");
                    true
                } else {
                    false
                }
            }
            CircuitState::HalfOpen => match b.probe_ms {
                Some(t) if now_ms.saturating_sub(t) < cool => false,
                _ => {
                    b.probe_ms = Some(now_ms);
                    true
                }
            },
        }
    }

    /// Whether [`CircuitBreakers::allow`] would let a request through now,
    /// without changing anything (for choosing among candidates).
    pub fn would_allow(&self, did: &str, now_ms: u64) -> bool {
        let cool = self.params.cool_down_ms;
        match self.agents.get(did) {
            None => true,
            Some(b) => match b.state {
                CircuitState::Closed | CircuitState::Unspecified => true,
                CircuitState::Open => now_ms.saturating_sub(b.opened_ms) >= cool,
                CircuitState::HalfOpen => b.probe_ms.is_none_or(|t| now_ms.saturating_sub(t) >= cool),
            },
        }
    }

    /// A request to `did` succeeded: resets the count; closes a half-open
    /// circuit (an OPEN one stays open: only the probe decides).
    pub fn record_success(&mut self, did: &str, _now_ms: u64) -> Option<Transition> {
        let b = self.get(did);
        match b.state {
            CircuitState::Open => None,
            CircuitState::HalfOpen => {
                *b = Breaker { state: CircuitState::Closed, failures: 0, opened_ms: 0, probe_ms: None };
                tracing::info!(agent = did, "circuit closed: probe succeeded");
                Some(Transition { from: CircuitState::HalfOpen, to: CircuitState::Closed, failures: 0 })
            }
            _ => {
                b.failures = 0;
                None
            }
        }
    }

    /// A request to `did` failed: counts it; opens the circuit after
    /// `failures_to_open` in a row, reopens a half-open one.
    pub fn record_failure(&mut self, did: &str, now_ms: u64) -> Option<Transition> {
        let n = self.params.failures_to_open.max(1);
        let b = self.get(did);
        b.failures = b.failures.saturating_add(1);
        let from = b.state;
        let open = match b.state {
            CircuitState::HalfOpen => true,
            CircuitState::Closed | CircuitState::Unspecified => b.failures >= n,
            CircuitState::Open => false,
        };
        if !open {
            return None;
        }
        b.state = CircuitState::Open;
        b.opened_ms = now_ms;
        b.probe_ms = None;
        tracing::warn!(agent = did, failures = b.failures, "circuit open");
        Some(Transition { from, to: CircuitState::Open, failures: b.failures })
    }

    /// The breaker's state (CLOSED for an agent never seen).
    pub fn state(&self, did: &str) -> CircuitState {
        self.agents.get(did).map_or(CircuitState::Closed, |b| b.state)
    }

    /// Consecutive failures counted for `did`.
    pub fn failures(&self, did: &str) -> u32 {
        self.agents.get(did).map_or(0, |b| b.failures)
    }

    /// Agents whose circuit is not CLOSED, sorted (for `RouteQuery.exclude`).
    pub fn not_closed(&self) -> Vec<String> {
        let mut v: Vec<String> =
            self.agents.iter().filter(|(_, b)| b.state != CircuitState::Closed).map(|(d, _)| d.clone()).collect();
        v.sort();
        v
    }

    /// The wire notice of `target`'s breaker (unsigned: the caller signs it).
    pub fn to_pb(&self, from: &str, target: &str) -> pb::CircuitBreak {
        pb::CircuitBreak {
            from: Some(pb::AgentId { uuid: from.to_string() }),
            target: Some(pb::AgentId { uuid: target.to_string() }),
            state: self.state(target) as i32,
            failure_count: self.failures(target),
            ..Default::default()
        }
    }
}
