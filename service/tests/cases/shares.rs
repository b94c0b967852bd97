//! Per-caller shares of the shared bounds: CountTokens' own lane and its
//! shares, work a caller gave up holding its share until it stops, one
//! client against every compress slot and the embed queue, and session ids
//! in their caller's scope. In-process servers over the test encoder of
//! [`crate::serving`]; a caller is its address in 127.0.0.0/8.

use std::sync::atomic::Ordering;
use std::time::Duration;

use scd_service::app::Limits;
use scd_service::grpc::pb;
use scd_service::http::HttpLimits;
use tonic::Code;

use crate::serving::{big_compress, client, client_from, embed, is_deadline, limits, start, TestEncoder};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn count_tokens_has_its_own_lane_while_compressions_hold_every_slot() {
    let enc = TestEncoder::new(0);
    let s = start(enc.clone(), Limits { max_concurrent_compress: 1, ..limits() }, HttpLimits::default()).await;
    let c = client(&s).await;
    enc.delay_ms.store(300, Ordering::SeqCst);
    let mut busy = c.clone();
    let busy = tokio::spawn(async move { busy.compress(big_compress("busy")).await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    // the only compress slot is taken: another compress is refused ...
    let e = c.clone().compress(big_compress("refused")).await.unwrap_err();
    assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
    // ... but counting is served, every time
    for i in 0..20 {
        let r = c
            .clone()
            .count_tokens(pb::CountTokensRequest { texts: vec![format!("count me {i}")], ..Default::default() })
            .await
            .unwrap();
        assert_eq!(r.into_inner().tokens.len(), 1);
    }
    enc.delay_ms.store(0, Ordering::SeqCst);
    busy.await.unwrap().unwrap();
}

/// CountTokens' own lane has per-caller shares too, and a caller that gives
/// up stops its work at the next text, freeing its places.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn count_tokens_has_per_caller_shares_and_stops_when_its_caller_gives_up() {
    let enc = TestEncoder::new(0);
    let s = start(enc.clone(), limits(), HttpLimits::default()).await;
    let (hog, other) = (client_from("127.0.0.2", &s.grpc).await, client_from("127.0.0.3", &s.grpc).await);
    let count = |n: usize| pb::CountTokensRequest {
        texts: (0..n).map(|i| format!("text {i}")).collect(),
        ..Default::default()
    };
    other.clone().count_tokens(count(1)).await.unwrap();
    enc.count_ms.store(300, Ordering::SeqCst);
    // three calls of 8 texts (2.4 s each) give up after 50 ms
    let gave_up: Vec<_> = (0..3)
        .map(|_| {
            let (mut c, r) = (hog.clone(), count(8));
            tokio::spawn(async move {
                let mut r = tonic::Request::new(r);
                r.set_timeout(Duration::from_millis(50));
                c.count_tokens(r).await
            })
        })
        .collect();
    for g in gave_up {
        let e = g.await.unwrap().unwrap_err();
        assert!(is_deadline(&e), "{e:?}");
    }
    // their work stops at the next text (300 ms), not after all eight, and
    // the hog is past its share until then
    let e = hog.clone().count_tokens(count(1)).await.unwrap_err();
    assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
    assert!(e.message().starts_with("count_tokens slots: this caller holds 3 of 4, past its share of 1"), "{e:?}");
    other.clone().count_tokens(count(1)).await.expect("the other caller keeps its slot");
    enc.count_ms.store(0, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(700)).await;
    hog.clone().count_tokens(count(1)).await.expect("the abandoned work stopped between texts");
}

/// Work whose caller gave up still holds the caller's share until it stops:
/// the caller cannot start more meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_caller_keeps_its_share_until_its_abandoned_work_stops() {
    let enc = TestEncoder::new(0);
    let s = start(enc.clone(), Limits { max_concurrent_compress: 4, ..limits() }, HttpLimits::default()).await;
    let (hog, other) = (client_from("127.0.0.2", &s.grpc).await, client_from("127.0.0.3", &s.grpc).await);
    // the other client has come
    other.clone().compress(big_compress("other")).await.unwrap();
    enc.delay_ms.store(1500, Ordering::SeqCst);
    // three calls give up after 300 ms (their work has started on a loaded
    // machine too); it runs on to the encoder's next stop, 1.5 s in
    let gave_up: Vec<_> = (0..3)
        .map(|i| {
            let mut c = hog.clone();
            tokio::spawn(async move {
                let mut r = tonic::Request::new(big_compress(&format!("hog {i}")));
                r.set_timeout(Duration::from_millis(300));
                c.compress(r).await
            })
        })
        .collect();
    for g in gave_up {
        let e = g.await.unwrap().unwrap_err();
        assert!(is_deadline(&e), "{e:?}");
    }
    // that work still holds the hog's share: it may not take the last slot
    let e = hog.clone().compress(big_compress("hog 4")).await.unwrap_err();
    assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
    assert!(e.message().starts_with("compress slots: this caller holds 3 of 4"), "{}", e.message());
    // once it has stopped, the hog is served again
    enc.delay_ms.store(0, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(2500)).await;
    hog.clone().compress(big_compress("hog 5")).await.unwrap();
}

/// The finding: one client filled the shared bounds and everyone else was
/// refused. A caller (its identity, else its address) may use free room
/// past its share, but not the last places: another client from another
/// address is still served while the first is refused past its share.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_client_cannot_take_every_compress_slot_or_the_whole_embed_queue() {
    let enc = TestEncoder::new(0);
    let limits = Limits { max_concurrent_compress: 4, queue_size: 8, max_batch_tokens: 16, batch_texts: 1, ..limits() };
    let s = start(enc.clone(), limits, HttpLimits::default()).await;
    client(&s).await;
    let (hog, other) = (client_from("127.0.0.2", &s.grpc).await, client_from("127.0.0.3", &s.grpc).await);
    // the other client has come (a caller alone may use every place)
    other
        .clone()
        .count_tokens(pb::CountTokensRequest { texts: vec!["hi".into()], ..Default::default() })
        .await
        .unwrap();
    other.clone().embed(embed(&["hello"], pb::InputKind::Passage)).await.unwrap();
    other.clone().compress(big_compress("hello")).await.unwrap();
    enc.delay_ms.store(400, Ordering::SeqCst);
    // compress: 4 slots, a share of 1; the hog gets 3, the last is kept
    let held: Vec<_> = (0..3)
        .map(|i| {
            let mut c = hog.clone();
            tokio::spawn(async move { c.compress(big_compress(&format!("hog {i}"))).await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(150)).await;
    let e = hog.clone().compress(big_compress("hog 4")).await.unwrap_err();
    assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
    assert!(
        e.message().starts_with("compress slots: this caller holds 3 of 4, past its share of 1"),
        "{}",
        e.message()
    );
    // the hint is the measured hold time over the places held, and the
    // message says the same
    let hint = e.metadata().get("retry-after-ms").and_then(|v| v.to_str().ok()?.parse::<u64>().ok()).unwrap();
    assert!((1..=30_000).contains(&hint) && e.message().ends_with(&format!("retry after {hint} ms")), "{e:?}");
    let served = other.clone().compress(big_compress("other")).await;
    assert!(served.is_ok(), "the other client was refused: {served:?}");
    for h in held {
        h.await.unwrap().unwrap();
    }
    // the embed queue: 8 places, a share of 1
    let word = |i: usize| format!("text {i}");
    let queued: Vec<_> = (0..7)
        .map(|i| {
            let mut c = hog.clone();
            let t = word(i);
            tokio::spawn(async move { c.embed(embed(&[t.as_str()], pb::InputKind::Passage)).await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(150)).await;
    let e = hog.clone().embed(embed(&["one more"], pb::InputKind::Passage)).await.unwrap_err();
    assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
    assert!(e.message().starts_with("embed queue: this caller holds 7 of 8, past its share of 1"), "{}", e.message());
    enc.delay_ms.store(0, Ordering::SeqCst);
    let mut other = other;
    assert!(other.embed(embed(&["the other client"], pb::InputKind::Passage)).await.is_ok());
    for q in queued {
        q.await.unwrap().unwrap();
    }
}

/// The finding: a client-chosen session id showed whether it existed and
/// could be taken first. A chosen id lives in its caller's scope (identity,
/// else address): a second client choosing the same id opens its own
/// session under it, and neither reaches the other's; a generated id works
/// from anywhere with its token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chosen_session_id_is_the_callers_own_and_reveals_nothing_to_another() {
    let s = start(TestEncoder::new(0), limits(), HttpLimits::default()).await;
    client(&s).await;
    let (mut a, mut b) = (client_from("127.0.0.2", &s.grpc).await, client_from("127.0.0.3", &s.grpc).await);
    let open = |id: &str| pb::CompressRequest { session_id: id.into(), ..big_compress("sessions") };
    let ra = a.compress(open("deploy-42")).await.unwrap().into_inner();
    // b takes the same id: not refused, not told it exists; its own session
    let rb = b.compress(open("deploy-42")).await.unwrap().into_inner();
    assert_eq!((ra.session_id.as_str(), rb.session_id.as_str()), ("deploy-42", "deploy-42"));
    assert!(!ra.session_token.is_empty() && !rb.session_token.is_empty() && ra.session_token != rb.session_token);
    let more = |token: &str| pb::ContextRequest {
        session_id: "deploy-42".into(),
        session_token: token.into(),
        specific_question: "what else failed".into(),
        current_confidence: 0.2,
        ..Default::default()
    };
    assert!(a.request_context(more(&ra.session_token)).await.is_ok());
    assert!(b.request_context(more(&rb.session_token)).await.is_ok());
    // a's token from b's address reaches b's session, which it does not open
    let e = b.request_context(more(&ra.session_token)).await.unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
    let closed = b
        .close_session(pb::CloseSessionRequest {
            session_id: "deploy-42".into(),
            session_token: rb.session_token.clone(),
        })
        .await
        .unwrap();
    assert!(closed.into_inner().closed);
    assert!(a.request_context(more(&ra.session_token)).await.is_ok(), "b's close reached a's session");
    // a generated id is global: its token works from another address
    let g = a
        .open_session(pb::OpenSessionRequest { compress: Some(big_compress("generated")) })
        .await
        .unwrap()
        .into_inner();
    let mut more_g = more(&g.session_token);
    more_g.session_id = g.session_id.clone();
    assert!(b.request_context(more_g).await.is_ok(), "a generated id is reachable with its token");
}
