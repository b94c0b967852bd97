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

mod reoffers {
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use super::super::failure::FailureKind;
    use super::super::reoffer::{reoffer, CONTRACT_MARGIN};
    use super::*;
    use crate::agent::{AgentConfig, Node};
    use crate::handshake::{self, Offer, PeerFailure, Round};
    use crate::identity::{DidResolver, Identity, MemoryNonceLog, SignMessages as _, Verifier};
    use crate::store::{Ledger, Store};

    fn verifier() -> Verifier {
        Verifier::new(Arc::new(DidResolver::new()), Arc::new(MemoryNonceLog::default()))
    }

    fn cap(q: f64, lat: u64, cost: f64) -> pb::Capability {
        pb::Capability {
            task_type: pb::TaskType::Analysis as i32,
            estimated_quality: q,
            estimated_latency_ms: lat,
            cost_per_task: cost,
        }
    }

    /// `who`'s signed offer of `c`, open `ttl_ms`, asked for `age` ago.
    fn offer(who: &Identity, c: pb::Capability, ttl_ms: u64, age: Duration) -> Offer {
        let mut offer =
            pb::CapabilityOffer { from: Some(who.agent_id()), capability: Some(c), ttl_ms, ..Default::default() };
        who.stamp_and_sign(&mut offer);
        Offer { url: "http://127.0.0.1:1".into(), offer, asked_at: Instant::now() - age }
    }

    fn round(offers: Vec<Offer>, failures: Vec<PeerFailure>) -> Round {
        Round { offers, failures: failures.into_iter().map(|f| ("http://127.0.0.1:1".to_string(), f)).collect() }
    }

    #[test]
    fn an_offer_is_open_until_its_own_ttl_counted_from_the_probe() {
        let me = Identity::generate();
        let aged = |ttl: u64| offer(&me, cap(0.8, 300, 0.01), ttl, Duration::from_secs(2));
        assert!(!aged(1_000).open_for(Duration::ZERO), "closed 1 s ago");
        assert!(aged(2_300).open_for(Duration::ZERO));
        assert!(!aged(2_300).open_for(CONTRACT_MARGIN), "closes within the contract's margin");
        assert!(aged(10_000).open_for(CONTRACT_MARGIN));
        assert!(aged(u64::MAX).open_for(CONTRACT_MARGIN), "a lifetime past the clock's is open");
        assert!(!offer(&me, cap(0.8, 300, 0.01), 0, Duration::ZERO).open_for(Duration::ZERO), "ttl 0 is closed");
    }

    #[test]
    fn a_fresh_offer_on_the_same_terms_or_better_is_taken() {
        let me = Identity::generate();
        let chosen = offer(&me, cap(0.8, 300, 0.01), 10_000, Duration::from_secs(20));
        let fresh = offer(&me, cap(0.85, 250, 0.01), 10_000, Duration::ZERO);
        let nonce = fresh.offer.nonce;
        let got = reoffer(&chosen, round(vec![fresh], vec![]), &verifier(), |_| 0.5).unwrap();
        assert_eq!(got.offer.nonce, nonce, "the fresh offer, not the closed one");
    }

    #[test]
    fn a_re_offer_that_fails_verification_or_comes_from_another_agent_is_rejected() {
        let me = Identity::generate();
        let chosen = offer(&me, cap(0.8, 300, 0.01), 10_000, Duration::from_secs(20));
        // what probe_round reports of a forged offer
        let forged = PeerFailure::Invalid("signature: the signature does not verify".into());
        let f = reoffer(&chosen, round(vec![], vec![forged]), &verifier(), |_| 0.5).unwrap_err();
        assert_eq!(
            (f.kind, f.why.as_str()),
            (FailureKind::Rejected, "re-offer rejected: signature: the signature does not verify")
        );
        let other = offer(&Identity::generate(), cap(0.8, 300, 0.01), 10_000, Duration::ZERO);
        let f = reoffer(&chosen, round(vec![other], vec![]), &verifier(), |_| 0.5).unwrap_err();
        assert_eq!(f.kind, FailureKind::Rejected);
        assert!(f.why.starts_with("re-offer rejected: it is from "), "{}", f.why);
        // evidence whose root is not the one offered
        let mut bad = offer(&me, cap(0.8, 300, 0.01), 10_000, Duration::ZERO);
        bad.offer.trust_proof = vec![1; 32];
        bad.offer.trust_evidence = Some(pb::TrustEvidence { merkle_root: vec![2; 32], ..Default::default() });
        let f = reoffer(&chosen, round(vec![bad], vec![]), &verifier(), |_| 0.5).unwrap_err();
        assert_eq!(
            (f.kind, f.why.as_str()),
            (FailureKind::Rejected, "re-offer rejected: its trust evidence does not hold")
        );
        // a decline is a refusal, silence the agent's failure
        let f = reoffer(&chosen, round(vec![], vec![PeerFailure::Declined("busy".into())]), &verifier(), |_| 0.5);
        assert_eq!(f.unwrap_err().kind, FailureKind::Refused);
        let f = reoffer(
            &chosen,
            round(vec![], vec![PeerFailure::Down("no offer within 500 ms".into())]),
            &verifier(),
            |_| 0.5,
        );
        assert_eq!(f.unwrap_err().kind, FailureKind::Agent);
    }

    #[test]
    fn a_re_offer_on_worse_terms_sends_the_task_to_be_planned_again() {
        let me = Identity::generate();
        let chosen = offer(&me, cap(0.8, 300, 0.01), 10_000, Duration::from_secs(20));
        for (c, named) in [
            (cap(0.79, 300, 0.01), "quality 0.790 < 0.800"),
            (cap(0.8, 301, 0.01), "latency 301 ms > 300 ms"),
            (cap(0.8, 300, 0.02), "cost 0.0200 > 0.0100"),
        ] {
            let fresh = offer(&me, c, 10_000, Duration::ZERO);
            let f = reoffer(&chosen, round(vec![fresh], vec![]), &verifier(), |_| 0.5).unwrap_err();
            assert_eq!(f.kind, FailureKind::Refused, "{named}");
            assert_eq!(f.why, format!("re-offer worse than the route was chosen on ({named}): planning again"));
        }
        // lower trust in this agent's book (the fresh offer's evidence) is worse too
        let fresh = offer(&me, cap(0.8, 300, 0.01), 10_000, Duration::ZERO);
        let nonce = chosen.offer.nonce;
        let trust = |o: &Offer| if o.offer.nonce == nonce { 0.6 } else { 0.4 };
        let f = reoffer(&chosen, round(vec![fresh], vec![]), &verifier(), trust).unwrap_err();
        assert!(f.why.contains("trust 0.400 < 0.600"), "{}", f.why);
        // and one that closes before a contract could reach it
        let brief = offer(&me, cap(0.8, 300, 0.01), 100, Duration::ZERO);
        let f = reoffer(&chosen, round(vec![brief], vec![]), &verifier(), |_| 0.5).unwrap_err();
        assert_eq!(
            (f.kind, f.why.as_str()),
            (FailureKind::Refused, "re-offer open 100 ms, not past a contract's 500 ms margin")
        );
    }

    /// A real agent on loopback offering `c`, its offers open `ttl_ms`.
    async fn agent(dir: &std::path::Path, c: pb::Capability, ttl_ms: u64) -> (String, String) {
        let identity = Identity::generate();
        let did = identity.did().to_string();
        let store = Arc::new(Store::open(dir).unwrap());
        let resolver: Arc<dyn crate::identity::Resolver> = Arc::new(DidResolver::new());
        let ledger = Ledger::open(store.clone(), identity.did(), Default::default(), resolver.clone()).unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let mut config = AgentConfig::new(vec![c], url.clone(), "http://127.0.0.1:1".into());
        config.offer_ttl_ms = ttl_ms;
        let node = Node::new(identity, Verifier::new(resolver, store), ledger, config);
        tokio::spawn(crate::agent::serve(node, listener, std::future::pending()));
        (url, did)
    }

    /// A planner (no SCD needed to ask for offers) and its events.
    fn planner(dir: &std::path::Path, urls: &[String]) -> (Planner, tokio::sync::mpsc::UnboundedReceiver<Event>) {
        let identity = Identity::generate();
        let store = Arc::new(Store::open(dir).unwrap());
        let resolver: Arc<dyn crate::identity::Resolver> = Arc::new(DidResolver::new());
        let ledger = Ledger::open(store.clone(), identity.did(), Default::default(), resolver.clone()).unwrap();
        let config = AgentConfig::new(vec![], "http://127.0.0.1:1".into(), "http://127.0.0.1:1".into());
        let node = Node::new(identity, Verifier::new(resolver, store), ledger, config);
        let (tx, events) = tokio::sync::mpsc::unbounded_channel();
        node.planner.subscribe(tx);
        (Planner::new(node, urls).unwrap(), events)
    }

    fn job() -> Job {
        Job {
            task_id: "t".into(),
            task_type: pb::TaskType::Analysis,
            task: crate::context::Task::new("why"),
            order: crate::work::WorkOrder { title: "t".into(), steps: 1, needs: vec![], fail: None },
            context: Default::default(),
            qos: pb::QoSConstraints { min_quality: 0.5, max_latency_ms: 5_000, max_cost: 1.0, min_trust: 0.0 },
        }
    }

    #[tokio::test]
    async fn a_closed_offer_is_asked_again_and_the_fresh_one_contracts() {
        let dir = tempfile::tempdir().unwrap();
        // offers open 1 s (10 s by default): a first stage of 1.1 s outlives one
        let (url, did) = agent(&dir.path().join("w"), cap(0.8, 300, 0.01), 1_000).await;
        let (planner, mut events) = planner(&dir.path().join("p"), std::slice::from_ref(&url));
        let me = &planner.node().identity;
        let probe = pb::CapabilityProbe {
            task_type: pb::TaskType::Analysis as i32,
            qos: Some(job().qos),
            ..Default::default()
        };
        let peer = [(url.clone(), handshake::channel(&url).unwrap())];
        let chosen = handshake::probe_round(me, &planner.node().verifier, &peer, &probe).await.offers.remove(0);
        assert_eq!(chosen.offer.ttl_ms, 1_000, "the offer states its lifetime");
        tokio::time::sleep(Duration::from_millis(1_100)).await;
        assert!(!chosen.open_for(Duration::ZERO));
        // on the closed offer the agent refuses the contract
        let contract = handshake::contract_for(me, &chosen, "t.1", job().qos, "http://127.0.0.1:1");
        let refused = handshake::accept(&planner.node().verifier, peer[0].1.clone(), contract).await.unwrap_err();
        assert!(refused.to_string().contains("contract.offer_nonce: the offer has expired"), "{refused}");
        let fresh = planner.current(&job(), &chosen, &probe).await.unwrap();
        assert_eq!(fresh.did(), did);
        assert_ne!(fresh.offer.nonce, chosen.offer.nonce);
        assert!(fresh.open_for(CONTRACT_MARGIN));
        assert!(matches!(events.try_recv(), Ok(Event::Reoffered { age_ms, .. }) if age_ms >= 1_100));
        let contract = handshake::contract_for(me, &fresh, "t.1", job().qos, "http://127.0.0.1:1");
        let ack = handshake::accept(&planner.node().verifier, peer[0].1.clone(), contract).await.unwrap();
        assert!(ack.accepted);
        // an open offer is used as it is, without asking again
        let same = planner.current(&job(), &fresh, &probe).await.unwrap();
        assert_eq!(same.offer.nonce, fresh.offer.nonce);
        assert!(events.try_recv().is_err());
        // an agent whose fresh offer costs more than the route was chosen on
        let mut cheaper = chosen.clone();
        cheaper.offer.capability = Some(cap(0.8, 300, 0.005));
        let f = planner.current(&job(), &cheaper, &probe).await.unwrap_err();
        assert_eq!(f.did, did);
        assert_eq!(f.failure.why, "re-offer worse than the route was chosen on (cost 0.0100 > 0.0050): planning again");
    }
}
