//! Per-caller shares of a bound the callers share (the compress slots, the
//! embed queue), so that one client cannot take all of it.
//!
//! Work-conserving: a caller may use more than its share while there is
//! room, and all of it while no other caller has come for [`RECENT`]; but
//! while others do, a caller past its share cannot take the last `share`
//! free places, which stay for them. A caller is its verified identity
//! (mTLS, DID), else its IP address, else `local` (an in-process call):
//! see [`key`]. An IPv6 caller's share is its /64's (one host or site has a
//! /64 of addresses, as the connection guard counts them), and the IPv4
//! callers of one /24 share a second bound on top of their own: together
//! they are held to [`NET_SHARES`] shares by the same rule, so that ten
//! addresses of one network are not ten callers to the others.
//!
//! A refused caller is told when to retry by [`Pace`]: the measured time a
//! place is held, spread over the places in use.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The retry hint before any place was measured.
pub const UNMEASURED_MS: u64 = 100;

/// How long the places of one bound are held, as a moving mean (each new
/// time weighs an eighth), for true retry hints.
#[derive(Debug, Default)]
pub struct Pace {
    /// The mean in microseconds; 0 before the first.
    mean_us: AtomicU64,
}

impl Pace {
    /// Counts one place held for `d`.
    pub fn record(&self, d: Duration) {
        let us = d.as_micros().clamp(1, u128::from(u64::MAX)) as u64;
        // a lost update under a race only skips one sample
        let old = self.mean_us.load(Ordering::Relaxed);
        let new = if old == 0 { us } else { old - old / 8 + us / 8 };
        self.mean_us.store(new.max(1), Ordering::Relaxed);
    }

    /// Milliseconds until one of `busy` places in use likely frees: the mean
    /// time a place is held over `busy + 1` (places at random points of
    /// their work), within 1 ms..=30 s; [`UNMEASURED_MS`] before anything
    /// was measured.
    pub fn retry_ms(&self, busy: usize) -> u64 {
        match self.mean_us.load(Ordering::Relaxed) {
            0 => UNMEASURED_MS,
            us => (us / 1000 / (busy as u64 + 1)).clamp(1, 30_000),
        }
    }
}

/// How long a caller counts as present after it last took a place.
pub const RECENT: Duration = Duration::from_secs(30);

/// Whose share a call draws on: the verified identity, else the peer's IP
/// address without its port, else `local`.
pub fn key(caller: Option<&str>, peer: Option<&str>) -> String {
    match (caller, peer) {
        (Some(c), _) => format!("id:{c}"),
        (None, Some(p)) => {
            p.parse::<SocketAddr>().map_or_else(|_| format!("ip:{p}"), |a| format!("ip:{}", a.ip().to_canonical()))
        }
        (None, None) => "local".into(),
    }
}

/// The shares one IPv4 /24 holds together, its callers all counted.
pub const NET_SHARES: usize = 2;

/// Whose share a caller key ([`key`]) draws on, and the network a share
/// unit belongs to: the session store's rule, one for every share.
pub(crate) use scd_engine::session::{share_network as network, share_unit as unit};

/// A shared bound of `capacity` places and each caller's `share` of it.
#[derive(Debug)]
pub struct Shares {
    capacity: usize,
    share: usize,
    held: Mutex<Held>,
}

#[derive(Debug, Default)]
struct Held {
    total: usize,
    by_caller: HashMap<String, usize>,
    /// Places held per IPv4 /24 ([`network`]).
    by_network: HashMap<String, usize>,
    /// When each caller last took a place (pruned past [`RECENT`]; at most
    /// one entry per caller seen in that time).
    seen: HashMap<String, Instant>,
}

/// A refused take: what the caller holds and its share.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PastShare {
    /// Places the caller holds.
    pub held: usize,
    /// Its share.
    pub share: usize,
    /// The bound's places.
    pub capacity: usize,
    /// Whether the caller's network (its IPv4 /24) is past its share
    /// ([`NET_SHARES`]), not the caller alone: `held` and `share` are the
    /// network's.
    pub network: bool,
}

impl Shares {
    /// `capacity` places, each caller's share `capacity / parts` (at least 1).
    pub fn new(capacity: usize, parts: usize) -> Arc<Self> {
        let share = (capacity / parts.max(1)).max(1);
        Arc::new(Self { capacity, share, held: Mutex::new(Held::default()) })
    }

    /// Each caller's share.
    pub fn share(&self) -> usize {
        self.share
    }

    /// One place for `caller`, held until the guard drops; refused when the
    /// caller is at its share, no more than `share` places are free, and
    /// another caller came within [`RECENT`].
    pub fn take(self: &Arc<Self>, caller: &str) -> Result<ShareGuard, PastShare> {
        self.take_at(caller, Instant::now())
    }

    fn take_at(self: &Arc<Self>, caller: &str, now: Instant) -> Result<ShareGuard, PastShare> {
        let caller = unit(caller);
        let net = network(&caller);
        let mut h = self.held.lock().unwrap_or_else(|e| e.into_inner());
        if h.seen.len() > 64 {
            h.seen.retain(|_, t| now.saturating_duration_since(*t) < RECENT);
        }
        let recent = |k: &str, t: &Instant| now.saturating_duration_since(*t) < RECENT && k != caller;
        let others = h.seen.iter().any(|(k, t)| recent(k, t));
        let free = self.capacity.saturating_sub(h.total);
        let mine = h.by_caller.get(&caller).copied().unwrap_or(0);
        if others && mine >= self.share && free <= self.share {
            return Err(PastShare { held: mine, share: self.share, capacity: self.capacity, network: false });
        }
        if let Some(n) = &net {
            let outside = h.seen.iter().any(|(k, t)| recent(k, t) && network(k).as_ref() != Some(n));
            let ours = h.by_network.get(n).copied().unwrap_or(0);
            let share = self.share * NET_SHARES;
            if outside && ours >= share && free <= self.share {
                return Err(PastShare { held: ours, share, capacity: self.capacity, network: true });
            }
            *h.by_network.entry(n.clone()).or_default() += 1;
        }
        h.seen.insert(caller.clone(), now);
        h.total += 1;
        *h.by_caller.entry(caller.clone()).or_default() += 1;
        Ok(ShareGuard { shares: self.clone(), caller, network: net })
    }
}

/// A place held in a [`Shares`]; given back on drop.
#[derive(Debug)]
pub struct ShareGuard {
    shares: Arc<Shares>,
    caller: String,
    network: Option<String>,
}

impl Drop for ShareGuard {
    fn drop(&mut self) {
        let mut h = self.shares.held.lock().unwrap_or_else(|e| e.into_inner());
        h.total = h.total.saturating_sub(1);
        if let Some(n) = h.by_caller.get_mut(&self.caller) {
            *n -= 1;
            if *n == 0 {
                h.by_caller.remove(&self.caller);
            }
        }
        if let Some(net) = &self.network {
            if let Some(n) = h.by_network.get_mut(net) {
                *n -= 1;
                if *n == 0 {
                    h.by_network.remove(net);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_caller_alone_may_use_every_place() {
        let s = Shares::new(2, 4);
        let _all: Vec<_> = (0..2).map(|_| s.take("a").unwrap()).collect();
        // another caller long ago does not count
        let t = Instant::now();
        let s = Shares::new(2, 4);
        drop(s.take_at("b", t).unwrap());
        let _all: Vec<_> = (0..2).map(|_| s.take_at("a", t + RECENT).unwrap()).collect();
    }

    #[test]
    fn one_caller_uses_the_room_but_leaves_a_share_for_the_others() {
        let s = Shares::new(8, 4);
        assert_eq!(s.share(), 2);
        drop(s.take("b").unwrap());
        let mut a: Vec<_> = (0..6).map(|_| s.take("a").unwrap()).collect();
        assert_eq!(s.take("a").unwrap_err(), PastShare { held: 6, share: 2, capacity: 8, network: false });
        let b: Vec<_> = (0..2).map(|_| s.take("b").unwrap()).collect();
        assert!(s.take("b").is_err(), "b is at its share and nothing is free");
        a.truncate(3);
        // three free: b, past its share, may take one but not the last two
        let b3 = s.take("b").unwrap();
        assert!(s.take("b").is_err());
        let c: Vec<_> = (0..2).map(|_| s.take("c").expect("a caller within its share always may")).collect();
        drop((b3, c));
        drop((a, b));
    }

    #[test]
    fn the_retry_hint_is_the_measured_hold_time_spread_over_the_places_in_use() {
        let p = Pace::default();
        assert_eq!(p.retry_ms(4), UNMEASURED_MS);
        p.record(Duration::from_millis(400));
        assert_eq!(p.retry_ms(3), 100);
        assert_eq!(p.retry_ms(0), 400);
        // a moving mean: one fast call moves it an eighth of the way
        p.record(Duration::from_millis(0));
        assert_eq!(p.retry_ms(0), 350);
        for _ in 0..100 {
            p.record(Duration::from_secs(600));
        }
        assert_eq!(p.retry_ms(0), 30_000, "at most 30 s");
        let fast = Pace::default();
        fast.record(Duration::from_micros(10));
        assert_eq!(fast.retry_ms(8), 1, "at least 1 ms");
    }

    #[test]
    fn keys_are_the_identity_else_the_address_without_its_port() {
        assert_eq!(key(Some("did:key:z6Mk"), Some("10.0.0.1:4000")), "id:did:key:z6Mk");
        assert_eq!(key(None, Some("10.0.0.1:4000")), key(None, Some("10.0.0.1:5000")));
        assert_eq!(key(None, Some("[::ffff:10.0.0.1]:1")), "ip:10.0.0.1");
        assert_eq!(key(None, None), "local");
    }

    #[test]
    fn an_ipv6_caller_is_its_slash_64() {
        let s = Shares::new(8, 4);
        drop(s.take("ip:10.9.9.9").unwrap());
        let p = |i: u16| format!("ip:2001:db8:1:2::{i:x}");
        let mut held: Vec<_> = (1..=6).map(|i| s.take(&p(i)).expect("one /64 may use the room")).collect();
        assert_eq!(
            s.take(&p(7)).unwrap_err(),
            PastShare { held: 6, share: 2, capacity: 8, network: false },
            "another address of the same /64 is the same caller"
        );
        held.push(s.take("ip:2001:db8:1:3::1").expect("another /64 is another caller"));
    }

    #[test]
    fn the_addresses_of_one_slash_24_share_a_bound_on_top_of_their_own() {
        let s = Shares::new(16, 8);
        assert_eq!(s.share(), 2);
        drop(s.take("ip:10.0.1.1").unwrap());
        // ten addresses of 10.0.0.0/24, each within its own share
        let mut held = Vec::new();
        let mut refused = None;
        for i in 0..10 {
            for _ in 0..2 {
                match s.take(&format!("ip:10.0.0.{}", i + 1)) {
                    Ok(g) => held.push(g),
                    Err(p) => refused = refused.or(Some(p)),
                }
            }
        }
        assert_eq!(held.len(), 14, "the /24 leaves a share free for the others");
        assert_eq!(refused, Some(PastShare { held: 14, share: 4, capacity: 16, network: true }));
        let other: Vec<_> = (0..2).map(|_| s.take("ip:10.0.1.1").expect("another /24 finds its share")).collect();
        drop((held, other));
        // alone (no other network came), one /24 uses all of it
        let t = Instant::now() + RECENT + RECENT;
        let all: Vec<_> = (0..16).map(|i| s.take_at(&format!("ip:10.0.0.{}", i % 10 + 1), t).unwrap()).collect();
        assert_eq!(all.len(), 16);
    }

    #[test]
    fn units_and_networks() {
        assert_eq!(unit("ip:2001:db8::1"), "ip:2001:db8:0:0::/64");
        assert_eq!(unit("ip:10.0.0.1"), "ip:10.0.0.1");
        assert_eq!(unit("id:did:key:z"), "id:did:key:z");
        assert_eq!(network("ip:10.0.0.1").as_deref(), Some("net:10.0.0.0/24"));
        assert_eq!(network("ip:2001:db8:0:0::/64"), None);
        assert_eq!(network("local"), None);
    }
}
