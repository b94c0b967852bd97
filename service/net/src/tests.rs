//! The guard's unit tests.

use super::*;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use tokio::io::AsyncReadExt;
use tokio::net::{TcpListener, TcpStream};

fn limits(max: usize, per_peer: usize, reserve: usize) -> ConnLimits {
    ConnLimits {
        max_connections: max,
        max_per_peer: per_peer,
        reserve,
        idle_timeout: Duration::from_millis(400),
        first_call_timeout: Duration::from_millis(200),
        evict_min_idle: EVICT_MIN_IDLE,
    }
}

/// Serves `guard.incoming(listener)` by reading each stream to its end
/// (or error), as a connection driver would.
async fn drive(guard: &ConnGuard) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let mut incoming = Box::pin(guard.incoming(listener));
    tokio::spawn(async move {
        while let Some(Ok(mut s)) = futures_util::StreamExt::next(&mut incoming).await {
            tokio::spawn(async move {
                let mut buf = [0u8; 64];
                while let Ok(n) = s.read(&mut buf).await {
                    if n == 0 {
                        break;
                    }
                }
            });
        }
    });
    addr
}

/// The peer's view: `true` once the server has closed the socket.
async fn closed_within(s: &mut TcpStream, wait: Duration) -> bool {
    let mut buf = [0u8; 8];
    matches!(tokio::time::timeout(wait, s.read(&mut buf)).await, Ok(Ok(0) | Err(_)))
}

#[tokio::test]
async fn caps_close_connections_past_them_and_idle_ones_give_way() {
    let long = Duration::from_secs(30);
    let guard = ConnGuard::new(ConnLimits { idle_timeout: long, first_call_timeout: long, ..limits(3, 2, 1) });
    let addr = drive(&guard).await;
    let from = |ip: &str| {
        let s = tokio::net::TcpSocket::new_v4().unwrap();
        s.bind(format!("{ip}:0").parse().unwrap()).unwrap();
        s.connect(addr)
    };
    let mut a = TcpStream::connect(addr).await.unwrap();
    let b = TcpStream::connect(addr).await.unwrap();
    // a third from the same address is past the per-peer cap
    let mut c = TcpStream::connect(addr).await.unwrap();
    assert!(closed_within(&mut c, Duration::from_secs(2)).await, "the third from one peer must be closed");
    // other loopback addresses fill the listener: 3 normal + 1 reserve
    let mut d = from("127.0.0.2").await.unwrap();
    let mut e = from("127.0.0.3").await.unwrap();
    tokio::time::sleep(EVICT_MIN_IDLE + Duration::from_millis(50)).await;
    let s = guard.stats();
    assert_eq!((s.open, s.reserve_open, s.refused_peer, s.evicted), (4, 1, 1, 0));
    // full: the newcomer takes the place of the oldest silent one (a)
    let mut f = from("127.0.0.4").await.unwrap();
    assert!(closed_within(&mut a, Duration::from_secs(2)).await, "the oldest idle connection gives way");
    assert!(!closed_within(&mut f, Duration::from_millis(100)).await, "the newcomer is kept");
    for s in [&mut d, &mut e] {
        assert!(!closed_within(s, Duration::from_millis(20)).await);
    }
    let s = guard.stats();
    assert_eq!((s.open, s.evicted, s.refused_listener), (4, 1, 0));
    // a closed connection frees its slot for its peer
    drop(b);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut g = TcpStream::connect(addr).await.unwrap();
    assert!(!closed_within(&mut g, Duration::from_millis(100)).await);
    let s = guard.stats();
    assert_eq!((s.open, s.refused_peer, s.evicted), (4, 1, 1));
}

use super::call::is_health;
use super::table::peer_group;
use tokio::io::AsyncWriteExt;

#[tokio::test]
async fn silent_connections_are_closed_and_bytes_alone_do_not_keep_them() {
    let guard = ConnGuard::new(limits(8, 8, 0));
    let addr = drive(&guard).await;
    let mut silent = TcpStream::connect(addr).await.unwrap();
    let mut chatty = TcpStream::connect(addr).await.unwrap();
    let start = Instant::now();
    // bytes every 50 ms, but never a call
    let writer = tokio::spawn(async move {
        for _ in 0..20 {
            if chatty.write_all(b"x").await.is_err() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        chatty
    });
    assert!(closed_within(&mut silent, Duration::from_secs(2)).await);
    assert!(start.elapsed() >= Duration::from_millis(190), "closed before first_call_timeout");
    let mut chatty = writer.await.unwrap();
    assert!(closed_within(&mut chatty, Duration::from_millis(100)).await, "bytes without a call keep nothing open");
    tokio::time::sleep(Duration::from_millis(50)).await;
    let s = guard.stats();
    assert_eq!((s.closed_silent, s.open), (2, 0));
}

#[test]
fn the_per_peer_cap_counts_an_ipv6_64_as_one_peer() {
    let guard = ConnGuard::new(limits(16, 2, 0));
    let at = |a: &str| a.parse::<SocketAddr>().unwrap();
    let _a = guard.shared.admit(at("[2001:db8::1]:1000")).unwrap();
    let _b = guard.shared.admit(at("[2001:db8::ffff:2]:1000")).unwrap();
    assert_eq!(guard.shared.admit(at("[2001:db8::3:4:5:6]:7")).unwrap_err(), Event::PeerFull, "same /64");
    let _c = guard.shared.admit(at("[2001:db8:0:1::1]:1000")).expect("another /64 is another peer");
    // an IPv4-mapped address is its IPv4 address
    let _d = guard.shared.admit(at("10.0.0.1:1")).unwrap();
    let _e = guard.shared.admit(at("[::ffff:10.0.0.1]:2")).unwrap();
    assert_eq!(guard.shared.admit(at("10.0.0.1:3")).unwrap_err(), Event::PeerFull);
    assert_eq!(peer_group(at("[2001:db8::1]:1")), "2001:db8::".parse::<IpAddr>().unwrap());
}

#[tokio::test]
async fn a_normal_idle_connection_gives_way_before_a_reserve_one() {
    let guard = ConnGuard::new(limits(1, 8, 1));
    let at = |a: &str| a.parse::<SocketAddr>().unwrap();
    let normal = guard.shared.admit(at("10.0.0.1:1")).unwrap();
    let reserve = guard.shared.admit(at("10.0.0.2:1")).unwrap();
    assert!(!normal.reserve.load(Ordering::SeqCst) && reserve.reserve.load(Ordering::SeqCst));
    tokio::time::sleep(EVICT_MIN_IDLE + Duration::from_millis(50)).await;
    // the reserve one has been idle longer, yet the normal one gives way
    normal.last_change_ms.store(guard.shared.now_ms() - EVICT_MIN_IDLE.as_millis() as u64, Ordering::SeqCst);
    reserve.last_change_ms.store(0, Ordering::SeqCst);
    let newcomer = guard.shared.admit(at("10.0.0.3:1")).unwrap();
    assert!(normal.evicted.load(Ordering::SeqCst) && !reserve.evicted.load(Ordering::SeqCst));
    assert!(!newcomer.reserve.load(Ordering::SeqCst), "the newcomer may make any call");
}

#[test]
fn a_reserve_connection_may_check_health_but_not_watch_it() {
    assert!(is_health("/grpc.health.v1.Health/Check"));
    assert!(!is_health("/grpc.health.v1.Health/Watch"));
    assert!(!is_health("/scd.v1.Scd/Compress"));
}

#[test]
fn settings_out_of_range_are_refused_naming_the_field() {
    let ok = ConnLimits::default();
    ok.check().unwrap();
    let e = ConnLimits { max_per_peer: 0, ..ok }.check().unwrap_err();
    assert!(e.to_string().starts_with("max_per_peer: 0: must be 1 to"), "{e}");
    let e = ConnLimits { idle_timeout: Duration::ZERO, ..ok }.check().unwrap_err();
    assert!(e.to_string().starts_with("idle_timeout: 0 ms"), "{e}");
    let e = ConnLimits { max_connections: 0, ..ok }.check().unwrap_err();
    assert!(e.to_string().starts_with("max_connections: 0"), "{e}");
}
