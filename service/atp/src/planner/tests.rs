//! The planner's unit tests.

use super::*;
use crate::pb;
use crate::requester::constraints;

#[test]
fn zero_limits_are_unbounded_for_routing() {
    let c = constraints(&pb::QoSConstraints { min_quality: 0.8, max_latency_ms: 0, max_cost: 0.0, min_trust: 0.1 });
    assert_eq!(c.max_latency_ms, u64::MAX);
    assert!(c.max_cost.is_infinite());
    let c = constraints(&pb::QoSConstraints { min_quality: 0.8, max_latency_ms: 900, max_cost: 0.5, min_trust: 0.1 });
    assert_eq!((c.max_latency_ms, c.max_cost), (900, 0.5));
}

#[test]
fn short_dids() {
    assert_eq!(short("did:key:z6MkhaXgBZDvotDkL5257faiztiGiC2QtKLGpbnnEGta2doK"), "…EGta2doK");
    assert_eq!(short("abc"), "abc");
}
