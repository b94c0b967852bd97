//! The listeners against idle, silent and greedy sockets: the metrics
//! HTTP listener's idle timeout and connection limit, and the gRPC
//! listener's per-peer cap, its reserve for health checks and the silent
//! socket that gives way to a new client. In-process servers over the test
//! encoder of [`crate::serving`].

use std::time::{Duration, Instant};

use scd_service::grpc::pb;
use scd_service::grpc::pb::scd_client::ScdClient;
use scd_service::http::HttpLimits;
use tokio::io::AsyncReadExt;
use tonic::transport::Channel;
use tonic::Code;

use crate::closed_within;
use crate::inproc::Options;
use crate::serving::{client, client_from, embed, limits, metric, scrape, socket_from, start, TestEncoder, SERVING};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn idle_http_connections_are_closed_and_metrics_still_answer() {
    // all 200 from one address: within its share here (the share has its own test)
    let http = HttpLimits { max_per_peer: 256, header_timeout: Duration::from_millis(500), ..HttpLimits::default() };
    let s = start(TestEncoder::new(0), limits(), http).await;
    let mut c = client(&s).await;
    c.embed(embed(&["a"], pb::InputKind::Query)).await.unwrap();
    let mut idle = Vec::new();
    for _ in 0..200 {
        idle.push(tokio::net::TcpStream::connect(s.http).await.unwrap());
    }
    let t = Instant::now();
    let m = scrape(&s).await;
    let answered = t.elapsed();
    assert!(m.contains("scd_requests_total"), "{m}");
    assert!(t.elapsed() < Duration::from_secs(1), "/metrics took {:?} beside 200 idle connections", t.elapsed());
    // gRPC is unaffected
    c.embed(embed(&["b"], pb::InputKind::Query)).await.unwrap();
    // every idle connection is closed by the server after the header timeout
    for mut sock in idle {
        let mut buf = [0u8; 64];
        let n = tokio::time::timeout(Duration::from_secs(3), sock.read(&mut buf))
            .await
            .expect("server closed the idle connection")
            .unwrap_or(0);
        assert!(n == 0 || String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 408"), "{n} bytes");
    }
    assert!(t.elapsed() < Duration::from_secs(4));
    eprintln!("/metrics answered in {answered:?} beside 200 idle connections; all 200 closed {:?} after", t.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_connections_over_the_limit_are_closed_and_counted() {
    // no probe reserve here (the reserve has its own test)
    let http = HttpLimits { max_connections: 4, reserve: 0, ..HttpLimits::default() };
    let s = start(TestEncoder::new(0), limits(), http).await;
    let _ = client(&s).await;
    let mut held = Vec::new();
    for _ in 0..4 {
        held.push(tokio::net::TcpStream::connect(s.http).await.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut extra = tokio::net::TcpStream::connect(s.http).await.unwrap();
    let mut buf = [0u8; 16];
    let n = tokio::time::timeout(Duration::from_secs(2), extra.read(&mut buf)).await.expect("closed at once");
    assert!(matches!(n, Ok(0) | Err(_)), "{n:?}");
    drop(held);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let m = scrape(&s).await;
    assert_eq!(metric(&m, "scd_rejected_total", &[("kind", "http_connections")]), 1.0, "{m}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn idle_grpc_sockets_are_capped_per_peer_closed_and_new_clients_still_served() {
    let connections = scd_net::ConnLimits {
        max_connections: 64,
        max_per_peer: 8,
        reserve: 2,
        idle_timeout: Duration::from_millis(800),
        first_call_timeout: Duration::from_millis(400),
        ..scd_net::ConnLimits::default()
    };
    let s = crate::inproc::start(Options { encoder: TestEncoder::new(0), connections, ..Default::default() });
    let mut c = client(&s).await;
    c.embed(embed(&["a"], pb::InputKind::Query)).await.unwrap();
    // one peer opens 40 sockets and never speaks: 7 fit beside its client
    let mut idle = Vec::new();
    for _ in 0..40 {
        idle.push(socket_from("127.0.0.1", &s.grpc).await);
    }
    let mut shut_at_once = 0;
    for sock in &mut idle {
        if closed_within(sock, Duration::from_millis(150)).await {
            shut_at_once += 1;
        }
    }
    assert!(shut_at_once >= 32, "{shut_at_once} of 40 closed at the per-peer cap");
    // another peer is served meanwhile
    let mut other = client_from("127.0.0.2", &s.grpc).await;
    other.embed(embed(&["b"], pb::InputKind::Query)).await.unwrap();
    // the silent ones are closed after the first-call timeout
    for sock in &mut idle {
        assert!(closed_within(sock, Duration::from_secs(3)).await, "a silent socket was kept");
    }
    // and the first peer is served again, by its old channel too
    c.embed(embed(&["c"], pb::InputKind::Query)).await.unwrap();
    let mut again = client_from("127.0.0.1", &s.grpc).await;
    again.embed(embed(&["d"], pb::InputKind::Query)).await.unwrap();
    let m = scrape(&s).await;
    let per_peer = metric(&m, "scd_rejected_total", &[("kind", "grpc_connections_per_peer")]);
    let silent = metric(&m, "scd_rejected_total", &[("kind", "grpc_silent_closed")]);
    // every one of the 40 was closed, at the cap or for its silence; 7 fit
    // only if the readiness probe's connection (same peer) was gone when
    // they came: on a loaded machine its close can lag, and then 34 are
    // capped and 6 time out (seen in a CI run)
    assert!(
        per_peer >= 33.0 - 1.0 && silent >= 7.0 - 1.0 && per_peer + silent >= 40.0,
        "per-peer {per_peer}, silent {silent}\n{m}"
    );
}

/// A health `Watch` on a connection of its own: a call in flight that
/// holds the connection (it cannot give way to a newcomer).
async fn watching(addr: &str) -> (Channel, tonic::Streaming<tonic_health::pb::HealthCheckResponse>) {
    let ch = Channel::from_shared(addr.to_string()).unwrap().connect().await.unwrap();
    let mut stream = tonic_health::pb::health_client::HealthClient::new(ch.clone())
        .watch(tonic_health::pb::HealthCheckRequest { service: "scd.v1.Scd".into() })
        .await
        .unwrap()
        .into_inner();
    let first = stream.message().await.unwrap().unwrap();
    assert_eq!(first.status, SERVING);
    (ch, stream)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_full_grpc_listener_keeps_a_reserve_for_health_checks_and_closes_past_it() {
    let connections = scd_net::ConnLimits {
        max_connections: 4,
        max_per_peer: 100,
        reserve: 1,
        idle_timeout: Duration::from_secs(30),
        first_call_timeout: Duration::from_secs(30),
        // nothing is idle long enough to give way in this test
        evict_min_idle: Duration::from_secs(30),
    };
    let s = crate::inproc::start(Options { encoder: TestEncoder::new(0), connections, ..Default::default() });
    crate::inproc::wait_serving(&s).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    // four clients hold every normal slot with calls in flight
    let mut held = Vec::new();
    for _ in 0..4 {
        held.push(watching(&s.grpc).await);
    }
    // the reserve connection checks health, but may neither watch it (a
    // stream would hold the slot) nor compute
    let ch = Channel::from_shared(s.grpc.clone()).unwrap().connect().await.unwrap();
    let mut health = tonic_health::pb::health_client::HealthClient::new(ch.clone());
    let check = tonic_health::pb::HealthCheckRequest { service: "scd.v1.Scd".into() };
    assert_eq!(health.check(check.clone()).await.unwrap().into_inner().status, SERVING);
    let refused = health.watch(check).await.unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    let e = ScdClient::new(ch.clone()).embed(embed(&["x"], pb::InputKind::Query)).await.unwrap_err();
    assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
    assert!(e.message().contains("kept for health checks") && e.message().contains("retry after"), "{}", e.message());
    let hint: u64 = e.metadata().get("retry-after-ms").unwrap().to_str().unwrap().parse().unwrap();
    assert!((1..=30_000).contains(&hint), "retry-after-ms {hint}");
    // past the reserve, with no connection idle long enough to give way:
    // closed at once
    let mut extra = socket_from("127.0.0.1", &s.grpc).await;
    assert!(closed_within(&mut extra, Duration::from_secs(2)).await);
    // a slot freed serves calls again: the reserve connection moves into it
    // (a client keeps its connection, so it must not stay refused)
    held.pop();
    tokio::time::sleep(Duration::from_millis(100)).await;
    ScdClient::new(ch).embed(embed(&["y"], pb::InputKind::Query)).await.unwrap();
    let m = scrape(&s).await;
    assert_eq!(metric(&m, "scd_rejected_total", &[("kind", "grpc_connections")]), 1.0, "{m}");
    assert_eq!(metric(&m, "scd_rejected_total", &[("kind", "grpc_reserve_call")]), 2.0, "{m}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_listener_full_of_silent_sockets_still_serves_a_new_client_at_once() {
    let connections = scd_net::ConnLimits {
        max_connections: 16,
        max_per_peer: 16,
        reserve: 2,
        idle_timeout: Duration::from_secs(30),
        first_call_timeout: Duration::from_secs(30),
        ..scd_net::ConnLimits::default()
    };
    let s = crate::inproc::start(Options { encoder: TestEncoder::new(0), connections, ..Default::default() });
    crate::inproc::wait_serving(&s).await;
    // 18 peers' worth of silent sockets fill the listener and its reserve
    let mut silent = Vec::new();
    for i in 0..18 {
        silent.push(socket_from(&format!("127.0.1.{}", i + 1), &s.grpc).await);
    }
    tokio::time::sleep(scd_net::EVICT_MIN_IDLE + Duration::from_millis(50)).await;
    // a real client takes the place of one of them, without waiting 30 s
    let t = Instant::now();
    let mut c = client_from("127.0.0.2", &s.grpc).await;
    c.embed(embed(&["served"], pb::InputKind::Query)).await.unwrap();
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    let mut closed = 0;
    for sock in &mut silent {
        closed += usize::from(closed_within(sock, Duration::from_millis(50)).await);
    }
    assert!(closed >= 1, "no silent socket gave way");
    // a silent one gave way to the client, or (when the accept loop ran
    // late under load and the client came first) the last silent one was
    // refused: either way one socket fewer, and the client was served
    let m = scrape(&s).await;
    let gave_way = metric(&m, "scd_rejected_total", &[("kind", "grpc_idle_evicted")])
        + metric(&m, "scd_rejected_total", &[("kind", "grpc_connections")]);
    assert!(gave_way >= 1.0, "{m}");
}
