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

use std::collections::{BTreeMap, BTreeSet, HashMap};

use crate::pb;
use crate::pb::{AgentStatus, CircuitState};

/// §8.1: an agent is failed after this many heartbeat intervals of silence.
pub const MISSED_HEARTBEATS: u64 = 3;

/// §8.1: the default heartbeat interval (1 s) when a heartbeat names none.
pub const DEFAULT_HEARTBEAT_MS: u64 = 1_000;

/// The longest heartbeat interval honoured (longer ones are clamped).
pub const MAX_HEARTBEAT_MS: u64 = 60_000;

/// The longest drain time a back-pressure signal can hold an agent for.
pub const MAX_DRAIN_MS: u64 = 3_600_000;

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

/// Poison detection settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PoisonParams {
    /// Distinct agents a task must fail on (default 3).
    pub distinct_agents: usize,
    /// Within this window (T_window, default 60 s).
    pub window_ms: u64,
}

impl Default for PoisonParams {
    /// ≥ 3 distinct agents within 60 s (§8.4).
    fn default() -> PoisonParams {
        PoisonParams { distinct_agents: 3, window_ms: 60_000 }
    }
}

/// A poison task and why (for the originator).
#[derive(Debug, Clone, PartialEq)]
pub struct Poison {
    /// The task.
    pub task_id: String,
    /// The distinct agents it failed on within the window, sorted.
    pub agents: Vec<String>,
    /// Each failure in the window, oldest first: (agent, error).
    pub errors: Vec<(String, String)>,
    /// The window.
    pub window_ms: u64,
}

impl std::fmt::Display for Poison {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "poison task {}: failed on {} distinct agents within {} s; not retried",
            self.task_id,
            self.agents.len(),
            self.window_ms / 1000
        )?;
        for (agent, error) in &self.errors {
            write!(f, "; {agent}: {error}")?;
        }
        Ok(())
    }
}

#[derive(Debug, Clone)]
struct Failure {
    agent: String,
    error: String,
    at_ms: u64,
}

/// Poison task detection (§8.4).
#[derive(Debug, Clone, Default)]
pub struct PoisonDetector {
    params: PoisonParams,
    failures: HashMap<String, Vec<Failure>>,
    poisoned: HashMap<String, Poison>,
}

impl PoisonDetector {
    /// A detector that has seen no failures.
    pub fn new(params: PoisonParams) -> PoisonDetector {
        PoisonDetector { params, ..PoisonDetector::default() }
    }

    /// Records that `task_id` failed on `did` with `error`. Returns the
    /// diagnosis once the task has failed on `distinct_agents` distinct
    /// agents within the window (and on every later call: a poison task stays
    /// poison). The same agent failing again does not count twice; failures
    /// older than the window are forgotten.
    pub fn record_failure(&mut self, task_id: &str, did: &str, error: &str, now_ms: u64) -> Option<Poison> {
        if let Some(p) = self.poisoned.get(task_id) {
            return Some(p.clone());
        }
        let window = self.params.window_ms;
        let list = self.failures.entry(task_id.to_string()).or_default();
        list.retain(|f| now_ms.saturating_sub(f.at_ms) < window);
        list.push(Failure { agent: did.to_string(), error: error.to_string(), at_ms: now_ms });
        let agents: BTreeSet<&str> = list.iter().map(|f| f.agent.as_str()).collect();
        if agents.len() < self.params.distinct_agents.max(1) {
            return None;
        }
        let poison = Poison {
            task_id: task_id.to_string(),
            agents: agents.into_iter().map(str::to_string).collect(),
            errors: list.iter().map(|f| (f.agent.clone(), f.error.clone())).collect(),
            window_ms: window,
        };
        self.failures.remove(task_id);
        tracing::warn!(task = task_id, agents = ?poison.agents, "poison task");
        self.poisoned.insert(task_id.to_string(), poison.clone());
        Some(poison)
    }

    /// The diagnostics of a task marked poison.
    pub fn poison(&self, task_id: &str) -> Option<&Poison> {
        self.poisoned.get(task_id)
    }

    /// Whether `task_id` is poison.
    pub fn is_poison(&self, task_id: &str) -> bool {
        self.poisoned.contains_key(task_id)
    }

    /// Forgets a task (it completed, or its originator gave up).
    pub fn clear(&mut self, task_id: &str) {
        self.failures.remove(task_id);
        self.poisoned.remove(task_id);
    }

    /// Drops failure records older than the window for every task.
    pub fn prune(&mut self, now_ms: u64) {
        let window = self.params.window_ms;
        self.failures.retain(|_, list| {
            list.retain(|f| now_ms.saturating_sub(f.at_ms) < window);
            !list.is_empty()
        });
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_agent_fails_after_three_silent_intervals() {
        let mut m = HealthMonitor::new();
        m.beat("a", AgentStatus::Healthy, 1_000, 0.1, 0, 0);
        m.beat("b", AgentStatus::Healthy, 100, 0.1, 0, 0);
        assert!(m.failed(99).is_empty());
        assert_eq!(m.failed(299), Vec::<String>::new());
        assert_eq!(m.failed(300), ["b"]); // aggressive detection: 3 × 100 ms
        assert_eq!(m.failed(2_999), ["b"]);
        assert_eq!(m.failed(3_000), ["a", "b"]);
        assert_eq!(m.status("a", 3_000), None);
        // A heartbeat brings it back.
        m.beat("a", AgentStatus::Healthy, 1_000, 0.1, 0, 3_500);
        assert_eq!(m.failed(3_600), ["b"]);
        assert_eq!(m.status("a", 3_600), Some(AgentStatus::Healthy));
        assert_eq!(m.status("nobody", 0), None);
    }

    #[test]
    fn absurd_signed_values_neither_overflow_nor_stick_forever() {
        let mut m = HealthMonitor::new();
        m.beat("a", AgentStatus::Healthy, u64::MAX, 0.0, 0, 10);
        assert_eq!(m.health("a").unwrap().t_fail_ms(), 3 * MAX_HEARTBEAT_MS);
        assert!(m.failed(10 + 3 * MAX_HEARTBEAT_MS).contains(&"a".to_string()));
        let mut bp = Backpressure::new(BackpressureParams::default());
        let sig = pb::Backpressure {
            from: Some(pb::AgentId { uuid: "b".into() }),
            queue_depth: 1_000_000,
            estimated_drain_ms: u64::MAX,
            ..Default::default()
        };
        bp.signal(&sig, None, u64::MAX - 5);
        bp.signal(&sig, None, 0);
        assert_eq!(bp.admit("b", MAX_DRAIN_MS + 1), Admit::Go, "held at most MAX_DRAIN_MS");
    }

    #[test]
    fn zero_interval_means_the_default() {
        let mut m = HealthMonitor::new();
        m.beat("a", AgentStatus::Unspecified, 0, 0.0, 0, 0);
        assert_eq!(m.health("a").unwrap().t_fail_ms(), 3 * DEFAULT_HEARTBEAT_MS);
        assert_eq!(m.status("a", 0), Some(AgentStatus::Healthy));
    }

    #[test]
    fn a_task_starts_the_clock_with_the_known_interval_or_the_longest() {
        let mut m = HealthMonitor::new();
        m.beat("a", AgentStatus::Degraded, 300, 0.1, 0, 0);
        // a's heartbeats for an earlier task were long ago; the new task's
        // clock starts at its hand-over, with a's 300 ms, and what a said
        // of itself stands
        m.expect("a", 10_000);
        assert_eq!(m.status("a", 10_000), Some(AgentStatus::Degraded));
        assert!(!m.failed(10_899).contains(&"a".to_string()));
        assert!(m.failed(10_900).contains(&"a".to_string()), "silent for 3 × 300 ms since the hand-over");
        // one never heard from is given the longest interval
        m.expect("b", 0);
        assert_eq!(m.health("b").unwrap().t_fail_ms(), 3 * MAX_HEARTBEAT_MS);
        assert!(!m.failed(3 * MAX_HEARTBEAT_MS - 1).contains(&"b".to_string()));
        // its first heartbeat sets its own interval
        m.beat("b", AgentStatus::Healthy, 200, 0.1, 0, 1_000);
        assert!(m.failed(1_600).contains(&"b".to_string()));
    }

    #[test]
    fn status_is_the_worse_of_report_and_load() {
        let mut m = HealthMonitor::new();
        m.beat("a", AgentStatus::Healthy, 1_000, 0.75, 3, 0);
        assert_eq!(m.status("a", 1), Some(AgentStatus::Degraded));
        m.beat("a", AgentStatus::Healthy, 1_000, 0.95, 3, 1);
        assert_eq!(m.status("a", 1), Some(AgentStatus::Overloaded));
        m.beat("a", AgentStatus::Overloaded, 1_000, 0.1, 3, 2);
        assert_eq!(m.status("a", 2), Some(AgentStatus::Overloaded));
        m.beat("a", AgentStatus::Degraded, 1_000, 0.1, 3, 3);
        assert_eq!(m.status("a", 3), Some(AgentStatus::Degraded));
        let hb = pb::Heartbeat {
            from: Some(pb::AgentId { uuid: "b".into() }),
            status: AgentStatus::Healthy as i32,
            interval_ms: 200,
            load_factor: 0.2,
            queue_depth: 7,
            ..Default::default()
        };
        m.beat_pb(&hb, 10);
        let h = m.health("b").unwrap();
        assert_eq!((h.status, h.interval_ms, h.queue_depth, h.last_ms), (AgentStatus::Healthy, 200, 7, 10));
        m.forget("b");
        assert!(m.health("b").is_none());
    }

    fn breakers() -> CircuitBreakers {
        CircuitBreakers::new(BreakerParams { failures_to_open: 3, cool_down_ms: 1_000 })
    }

    #[test]
    fn three_consecutive_failures_open_the_circuit() {
        let mut b = breakers();
        assert_eq!(b.record_failure("a", 0), None);
        assert_eq!(b.record_failure("a", 1), None);
        assert_eq!(b.state("a"), CircuitState::Closed);
        assert_eq!(
            b.record_failure("a", 2),
            Some(Transition { from: CircuitState::Closed, to: CircuitState::Open, failures: 3 })
        );
        assert_eq!(b.state("a"), CircuitState::Open);
        assert!(!b.allow("a", 3));
        assert!(!b.allow("a", 1_001)); // cool-down counts from the opening (2)
        assert_eq!(b.not_closed(), ["a"]);
        assert!(b.allow("other", 3));
        let w = b.to_pb("me", "a");
        assert_eq!((w.state(), w.failure_count), (CircuitState::Open, 3));
    }

    #[test]
    fn a_success_in_closed_resets_the_count() {
        let mut b = breakers();
        b.record_failure("a", 0);
        b.record_failure("a", 1);
        assert_eq!(b.record_success("a", 2), None);
        assert_eq!(b.failures("a"), 0);
        b.record_failure("a", 3);
        b.record_failure("a", 4);
        assert_eq!(b.state("a"), CircuitState::Closed);
        assert!(b.record_failure("a", 5).is_some());
    }

    fn opened_at_0() -> CircuitBreakers {
        let mut b = breakers();
        for _ in 0..3 {
            b.record_failure("a", 0);
        }
        b
    }

    #[test]
    fn half_open_lets_exactly_one_probe_through() {
        let mut b = opened_at_0();
        assert!(!b.allow("a", 999));
        assert!(!b.would_allow("a", 999));
        assert!(b.would_allow("a", 1_000));
        assert!(b.would_allow("a", 1_000), "asking changes nothing");
        assert!(b.allow("a", 1_000));
        assert!(!b.would_allow("a", 1_001));
        assert_eq!(b.state("a"), CircuitState::HalfOpen);
        assert!(!b.allow("a", 1_001), "a second request while the probe is out");
        assert!(!b.allow("a", 1_999));
        // The probe is the only request out, so a success in HALF-OPEN is its.
        assert_eq!(
            b.record_success("a", 1_100),
            Some(Transition { from: CircuitState::HalfOpen, to: CircuitState::Closed, failures: 0 })
        );
        assert_eq!(b.state("a"), CircuitState::Closed);
        assert!(b.allow("a", 1_101));
        assert!(b.allow("a", 1_102));
    }

    #[test]
    fn a_failed_probe_reopens() {
        let mut b = opened_at_0();
        assert!(b.allow("a", 1_000));
        assert_eq!(
            b.record_failure("a", 1_050),
            Some(Transition { from: CircuitState::HalfOpen, to: CircuitState::Open, failures: 4 })
        );
        assert_eq!(b.state("a"), CircuitState::Open);
        assert!(!b.allow("a", 2_049)); // a fresh cool-down from the reopening
        assert!(b.allow("a", 2_050));
    }

    #[test]
    fn a_lost_probe_is_replaced_after_a_cool_down() {
        let mut b = opened_at_0();
        assert!(b.allow("a", 1_000));
        assert!(!b.allow("a", 1_999));
        assert!(b.allow("a", 2_000));
        assert!(!b.allow("a", 2_001));
    }

    #[test]
    fn results_while_open_do_not_change_the_state() {
        let mut b = opened_at_0();
        assert_eq!(b.record_success("a", 10), None);
        assert_eq!(b.record_failure("a", 20), None);
        assert_eq!(b.state("a"), CircuitState::Open);
        assert!(b.allow("a", 1_000), "the cool-down still counts from the opening");
    }

    fn poison() -> PoisonDetector {
        PoisonDetector::new(PoisonParams::default())
    }

    #[test]
    fn three_distinct_agents_within_the_window_make_poison() {
        let mut d = poison();
        assert_eq!(d.record_failure("t", "a", "oom", 0), None);
        assert_eq!(d.record_failure("t", "b", "timeout", 10_000), None);
        let p = d.record_failure("t", "c", "panic", 59_999).unwrap();
        assert_eq!(p.agents, ["a", "b", "c"]);
        assert_eq!(
            p.errors,
            [("a".into(), "oom".into()), ("b".into(), "timeout".into()), ("c".into(), "panic".into())]
        );
        assert_eq!(
            p.to_string(),
            "poison task t: failed on 3 distinct agents within 60 s; not retried; a: oom; b: timeout; c: panic"
        );
        assert!(d.is_poison("t"));
        assert_eq!(d.record_failure("t", "d", "x", 70_000), Some(p), "poison stays poison");
        assert!(!d.is_poison("other"));
        d.clear("t");
        assert!(!d.is_poison("t"));
    }

    #[test]
    fn the_same_agent_three_times_is_not_poison() {
        let mut d = poison();
        for t in 0..5 {
            assert_eq!(d.record_failure("t", "a", "oom", t * 1_000), None);
        }
        assert_eq!(d.record_failure("t", "b", "oom", 6_000), None);
        assert!(!d.is_poison("t"));
        assert!(d.record_failure("t", "c", "oom", 7_000).is_some());
    }

    #[test]
    fn failures_older_than_the_window_do_not_count() {
        let mut d = poison();
        d.record_failure("t", "a", "e", 0);
        d.record_failure("t", "b", "e", 1_000);
        assert_eq!(d.record_failure("t", "c", "e", 60_000), None, "a's failure is 60 s old");
        assert!(d.record_failure("t", "a", "e", 60_500).is_some(), "b, c, a within 60 s");
        // prune drops stale records of other tasks.
        d.record_failure("u", "a", "e", 0);
        d.prune(60_000);
        assert_eq!(d.record_failure("u", "b", "e", 60_001), None);
        assert_eq!(d.record_failure("u", "c", "e", 60_002), None);
    }

    fn sig(queue_depth: u32, recommended_rate: f64, estimated_drain_ms: u64, current_load: f64) -> pb::Backpressure {
        pb::Backpressure {
            from: Some(pb::AgentId { uuid: "a".into() }),
            queue_depth,
            recommended_rate,
            estimated_drain_ms,
            current_load,
            ..Default::default()
        }
    }

    #[test]
    fn backpressure_policy() {
        let bp = Backpressure::new(BackpressureParams::default());
        assert_eq!(bp.decide(&sig(0, 0.0, 0, 0.1), None), Action::Proceed);
        assert_eq!(bp.decide(&sig(10, 5.0, 0, 0.5), None), Action::SlowTo { per_s: 5.0 });
        assert_eq!(bp.decide(&sig(33, 5.0, 2_000, 0.5), None), Action::Buffer { for_ms: 2_000 });
        assert_eq!(bp.decide(&sig(33, 5.0, 6_000, 0.5), None), Action::Reroute, "drain longer than 5 s");
        assert_eq!(bp.decide(&sig(257, 5.0, 1_000, 0.5), None), Action::Reroute);
        assert_eq!(bp.decide(&sig(0, 5.0, 0, 0.95), None), Action::Reroute, "overloaded by load");
        assert_eq!(bp.decide(&sig(0, 5.0, 0, 0.1), Some(AgentStatus::Overloaded)), Action::Reroute);
        assert_eq!(bp.decide(&sig(0, 5.0, 0, 0.1), Some(AgentStatus::Degraded)), Action::SlowTo { per_s: 5.0 });
    }

    #[test]
    fn slow_to_paces_with_a_token_bucket() {
        let mut bp = Backpressure::new(BackpressureParams::default());
        assert_eq!(bp.signal(&sig(1, 2.0, 0, 0.5), None, 0), Action::SlowTo { per_s: 2.0 });
        // Burst of 2, then one every 500 ms.
        assert_eq!(bp.admit("a", 0), Admit::Go);
        assert_eq!(bp.admit("a", 0), Admit::Go);
        assert_eq!(bp.admit("a", 0), Admit::WaitMs(500));
        assert_eq!(bp.admit("a", 250), Admit::WaitMs(250));
        assert_eq!(bp.admit("a", 500), Admit::Go);
        assert_eq!(bp.admit("a", 500), Admit::WaitMs(500));
        assert_eq!(bp.admit("other", 500), Admit::Go);
        // The hold ends after hold_ms (no drain time given).
        assert_eq!(bp.admit("a", 5_000), Admit::Go);
        assert_eq!(bp.admit("a", 5_000), Admit::Go);
        assert_eq!(bp.admit("a", 5_000), Admit::Go);
    }

    #[test]
    fn buffer_and_reroute_hold_until_the_drain_time() {
        let mut bp = Backpressure::new(BackpressureParams::default());
        bp.signal(&sig(40, 0.0, 1_000, 0.5), None, 0);
        assert_eq!(bp.admit("a", 100), Admit::WaitMs(900));
        assert_eq!(bp.admit("a", 1_000), Admit::Go);
        bp.signal(&sig(300, 0.0, 2_000, 0.5), None, 2_000);
        assert_eq!(bp.admit("a", 2_500), Admit::Reroute);
        assert_eq!(bp.admit("a", 4_000), Admit::Go);
        // A calm signal lifts the hold at once.
        bp.signal(&sig(300, 0.0, 2_000, 0.5), None, 5_000);
        assert_eq!(bp.signal(&sig(0, 0.0, 0, 0.1), None, 5_001), Action::Proceed);
        assert_eq!(bp.admit("a", 5_002), Admit::Go);
    }

    #[test]
    fn a_zero_rate_bucket_reroutes() {
        let mut tb = TokenBucket::new(0.0, 0);
        assert_eq!(tb.take(0), Admit::Go); // the burst of 1
        assert_eq!(tb.take(10_000), Admit::Reroute);
    }
}
