//! Heartbeats (§8.1): an agent's health from its load, and the monitor
//! that fails an agent after [`MISSED_HEARTBEATS`] silent intervals.

use std::collections::BTreeMap;

use crate::pb;
use crate::pb::AgentStatus;

/// §8.1: an agent is failed after this many heartbeat intervals of silence.
pub const MISSED_HEARTBEATS: u64 = 3;

/// §8.1: the default heartbeat interval (1 s) when a heartbeat names none.
pub const DEFAULT_HEARTBEAT_MS: u64 = 1_000;

/// The longest heartbeat interval honoured (longer ones are clamped).
pub const MAX_HEARTBEAT_MS: u64 = 60_000;

/// Load factor at which an agent counts as DEGRADED.
pub const DEGRADED_LOAD: f64 = 0.7;

/// Load factor at which an agent counts as OVERLOADED.
pub const OVERLOADED_LOAD: f64 = 0.9;

/// What the monitor knows of one agent.
#[derive(Debug, Clone, PartialEq)]
pub struct Health {
    /// The status: the worse of what the agent reported and what its load says.
    pub status: AgentStatus,
    /// Its heartbeat interval.
    pub interval_ms: u64,
    /// Load factor in [0, 1].
    pub load: f64,
    /// Queued tasks.
    pub queue_depth: u32,
    /// When the last heartbeat arrived.
    pub last_ms: u64,
}

impl Health {
    /// T_fail = 3 × interval.
    pub fn t_fail_ms(&self) -> u64 {
        MISSED_HEARTBEATS.saturating_mul(self.interval_ms)
    }

    /// Whether the agent has been silent for T_fail or longer.
    pub fn is_failed(&self, now_ms: u64) -> bool {
        now_ms.saturating_sub(self.last_ms) >= self.t_fail_ms()
    }
}

fn severity(s: AgentStatus) -> u8 {
    match s {
        AgentStatus::Unspecified | AgentStatus::Healthy => 0,
        AgentStatus::Degraded => 1,
        AgentStatus::Overloaded => 2,
    }
}

/// The status a load factor implies.
pub fn status_from_load(load: f64) -> AgentStatus {
    if load >= OVERLOADED_LOAD {
        AgentStatus::Overloaded
    } else if load >= DEGRADED_LOAD {
        AgentStatus::Degraded
    } else {
        AgentStatus::Healthy
    }
}

/// Heartbeat-based failure detection (§8.1).
#[derive(Debug, Clone, Default)]
pub struct HealthMonitor {
    agents: BTreeMap<String, Health>,
}

impl HealthMonitor {
    /// A monitor that has heard from nobody.
    pub fn new() -> HealthMonitor {
        HealthMonitor::default()
    }

    /// Records a heartbeat. An interval of 0 means the default (1 s); the
    /// status is the worse of `status` and the one `load` implies.
    pub fn beat(&mut self, did: &str, status: AgentStatus, interval_ms: u64, load: f64, queue_depth: u32, now_ms: u64) {
        let by_load = status_from_load(load);
        let status = if severity(by_load) > severity(status) { by_load } else { status };
        let status = if status == AgentStatus::Unspecified { AgentStatus::Healthy } else { status };
        // a signed but absurd interval cannot make an agent immortal
        let interval_ms = if interval_ms == 0 { DEFAULT_HEARTBEAT_MS } else { interval_ms.min(MAX_HEARTBEAT_MS) };
        let was_failed = self.agents.get(did).is_some_and(|h| h.is_failed(now_ms));
        if was_failed {
            tracing::info!(agent = did, "heartbeat from a failed agent: back");
        }
        self.agents.insert(did.to_string(), Health { status, interval_ms, load, queue_depth, last_ms: now_ms });
    }

    /// Records a wire heartbeat (sender = `from`).
    pub fn beat_pb(&mut self, hb: &pb::Heartbeat, now_ms: u64) {
        let did = hb.from.as_ref().map(|a| a.uuid.as_str()).unwrap_or_default();
        self.beat(did, hb.status(), hb.interval_ms, hb.load_factor, hb.queue_depth, now_ms);
    }

    /// The agents silent for T_fail or longer, sorted.
    pub fn failed(&self, now_ms: u64) -> Vec<String> {
        self.agents.iter().filter(|(_, h)| h.is_failed(now_ms)).map(|(d, _)| d.clone()).collect()
    }

    /// What is known of an agent (None if it never sent a heartbeat).
    pub fn health(&self, did: &str) -> Option<&Health> {
        self.agents.get(did)
    }

    /// An agent's status, or None if it is unknown or has failed.
    pub fn status(&self, did: &str, now_ms: u64) -> Option<AgentStatus> {
        self.agents.get(did).filter(|h| !h.is_failed(now_ms)).map(|h| h.status)
    }

    /// Starts an agent's T_fail clock at `now_ms` (a task was just handed
    /// to it): with the interval its last heartbeat gave, or
    /// [`MAX_HEARTBEAT_MS`] for an agent never heard from, so an agent
    /// that freezes before its first heartbeat for the task still fails,
    /// and one with a long interval is not failed before it could beat.
    /// Its next heartbeat sets the interval it sends.
    ///
    /// What its last heartbeat said of its status and load is kept. An
    /// agent never heard from is caught sooner by the planner's
    /// result-silence bound than by a 3-minute T_fail; a shorter default
    /// would fail over a slow-beating agent before its first beat.
    pub fn expect(&mut self, did: &str, now_ms: u64) {
        match self.agents.get_mut(did) {
            Some(h) => h.last_ms = now_ms,
            None => {
                let h = Health {
                    status: AgentStatus::Healthy,
                    interval_ms: MAX_HEARTBEAT_MS,
                    load: 0.0,
                    queue_depth: 0,
                    last_ms: now_ms,
                };
                self.agents.insert(did.to_string(), h);
            }
        }
    }

    /// Stops tracking an agent (e.g. after failover away from it).
    pub fn forget(&mut self, did: &str) {
        self.agents.remove(did);
    }
}
