//! Layer 5's unit tests.

use super::*;
use crate::pb;
use crate::pb::{AgentStatus, CircuitState};

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
    assert_eq!(p.errors, [("a".into(), "oom".into()), ("b".into(), "timeout".into()), ("c".into(), "panic".into())]);
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
