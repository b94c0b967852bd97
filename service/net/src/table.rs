//! The shared state of one listener: its admitted connections, per
//! listener and per peer group, and the choice of which to evict.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::event::Event;
use crate::event::OnEvent;
use crate::limits::ConnLimits;

/// One admitted connection.
#[derive(Debug)]
pub(super) struct Conn {
    /// Calls in flight (response bodies not yet ended).
    pub(super) active: AtomicUsize,
    /// Milliseconds since the guard's epoch of the last call's start or end.
    pub(super) last_change_ms: AtomicU64,
    /// A call was ever made.
    pub(super) spoke: AtomicBool,
    /// In the health-check reserve (admitted there; moved to a normal slot
    /// when one is free at its next call).
    pub(super) reserve: AtomicBool,
    /// Chosen to make room: its stream closes at its next poll.
    pub(super) evicted: AtomicBool,
    /// Admission order (ties of idleness go to the older).
    pub(super) seq: u64,
    /// Wakes the stream's reader (to see `evicted`).
    pub(super) waker: Mutex<Option<std::task::Waker>>,
}

impl Conn {
    fn evict(&self) {
        self.evicted.store(true, Ordering::SeqCst);
        if let Some(w) = self.waker.lock().unwrap_or_else(|p| p.into_inner()).take() {
            w.wake();
        }
    }
}

#[derive(Default)]
pub(super) struct Table {
    pub(super) normal: usize,
    pub(super) reserve: usize,
    pub(super) per_peer: HashMap<IpAddr, usize>,
    pub(super) by_addr: HashMap<SocketAddr, Arc<Conn>>,
}

pub(super) struct Shared {
    pub(super) limits: ConnLimits,
    pub(super) epoch: Instant,
    pub(super) table: Mutex<Table>,
    pub(super) on_event: Option<OnEvent>,
    pub(super) accepted: AtomicU64,
    pub(super) refused_listener: AtomicU64,
    pub(super) refused_peer: AtomicU64,
    pub(super) closed_idle: AtomicU64,
    pub(super) closed_silent: AtomicU64,
    pub(super) reserve_calls_refused: AtomicU64,
    pub(super) evicted: AtomicU64,
}

impl Shared {
    pub(super) fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn event(&self, e: Event) {
        let counter = match e {
            Event::ListenerFull => &self.refused_listener,
            Event::PeerFull => &self.refused_peer,
            Event::Idle => &self.closed_idle,
            Event::NeverSpoke => &self.closed_silent,
            Event::ReserveCall => &self.reserve_calls_refused,
            Event::Evicted => &self.evicted,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        if let Some(f) = &self.on_event {
            f(e);
        }
    }

    /// Admits a connection from `peer`, or says why not.
    pub(super) fn admit(&self, peer: SocketAddr) -> std::result::Result<Arc<Conn>, Event> {
        let mut t = self.lock();
        let from_peer = t.per_peer.get(&peer_group(peer)).copied().unwrap_or(0);
        if from_peer >= self.limits.max_per_peer {
            return Err(Event::PeerFull);
        }
        let reserve = if t.normal < self.limits.max_connections {
            false
        } else if t.reserve < self.limits.reserve {
            true
        } else {
            // full: an idle connection gives way (its slot is counted free
            // now; its socket closes at its next poll)
            let victim = self.victim(&t).ok_or(Event::ListenerFull)?;
            let taken = t.by_addr.get(&victim).cloned().expect("victim is in the table");
            taken.evict();
            if taken.reserve.load(Ordering::SeqCst) {
                t.reserve -= 1;
            } else {
                t.normal -= 1;
            }
            drop(t);
            self.event(Event::Evicted);
            t = self.lock();
            taken.reserve.load(Ordering::SeqCst)
        };
        let conn = Arc::new(Conn {
            active: AtomicUsize::new(0),
            last_change_ms: AtomicU64::new(self.now_ms()),
            spoke: AtomicBool::new(false),
            reserve: AtomicBool::new(reserve),
            evicted: AtomicBool::new(false),
            seq: self.accepted.load(Ordering::Relaxed),
            waker: Mutex::new(None),
        });
        if reserve {
            t.reserve += 1;
        } else {
            t.normal += 1;
        }
        *t.per_peer.entry(peer_group(peer)).or_insert(0) += 1;
        t.by_addr.insert(peer, conn.clone());
        self.accepted.fetch_add(1, Ordering::Relaxed);
        Ok(conn)
    }

    /// The connection that gives way when the listener is full: no call in
    /// flight, idle at least `evict_min_idle`, never spoke before spoke,
    /// a normal one before a reserve one (the newcomer takes its kind of
    /// slot, so that it may make any call), then idle longest; not one
    /// already evicted.
    fn victim(&self, t: &Table) -> Option<SocketAddr> {
        let now = self.now_ms();
        let min = self.limits.evict_min_idle.as_millis() as u64;
        t.by_addr
            .iter()
            .filter(|(_, c)| !c.evicted.load(Ordering::SeqCst) && c.active.load(Ordering::SeqCst) == 0)
            .map(|(a, c)| {
                let idle = now.saturating_sub(c.last_change_ms.load(Ordering::SeqCst));
                let key =
                    (c.spoke.load(Ordering::SeqCst), c.reserve.load(Ordering::SeqCst), std::cmp::Reverse(idle), c.seq);
                (a, key, idle)
            })
            .filter(|&(_, _, idle)| idle >= min)
            .min_by_key(|&(_, key, _)| key)
            .map(|(a, _, _)| *a)
    }

    /// Moves a reserve connection to a normal slot if one is free; true
    /// when it now may make any call.
    pub(super) fn promote(&self, conn: &Conn) -> bool {
        let mut t = self.lock();
        if !conn.reserve.load(Ordering::SeqCst) {
            return true;
        }
        if t.normal >= self.limits.max_connections {
            return false;
        }
        conn.reserve.store(false, Ordering::SeqCst);
        t.reserve -= 1;
        t.normal += 1;
        true
    }

    pub(super) fn release(&self, peer: SocketAddr, conn: &Conn) {
        let mut t = self.lock();
        if conn.evicted.load(Ordering::SeqCst) {
            // its slot went to the connection that took its place
            Self::forget(&mut t, peer, conn);
            return;
        }
        if conn.reserve.load(Ordering::SeqCst) {
            t.reserve = t.reserve.saturating_sub(1);
        } else {
            t.normal = t.normal.saturating_sub(1);
        }
        Self::forget(&mut t, peer, conn);
    }

    /// Drops `conn` from the per-peer count and the address table.
    fn forget(t: &mut Table, peer: SocketAddr, conn: &Conn) {
        let group = peer_group(peer);
        if let Some(n) = t.per_peer.get_mut(&group) {
            *n -= 1;
            if *n == 0 {
                t.per_peer.remove(&group);
            }
        }
        // a new connection may reuse the address only after this one is gone
        if t.by_addr.get(&peer).is_some_and(|c| std::ptr::eq(Arc::as_ptr(c), conn)) {
            t.by_addr.remove(&peer);
        }
    }

    /// When `conn` is to be closed for idleness (`None`: a call is in
    /// flight), and which event that is.
    pub(super) fn idle_deadline(&self, conn: &Conn) -> Option<(Instant, Event)> {
        if conn.active.load(Ordering::SeqCst) > 0 {
            return None;
        }
        let (after, why) = if conn.spoke.load(Ordering::SeqCst) {
            (self.limits.idle_timeout, Event::Idle)
        } else {
            (self.limits.first_call_timeout, Event::NeverSpoke)
        };
        let since = Duration::from_millis(conn.last_change_ms.load(Ordering::SeqCst));
        Some((self.epoch + since + after, why))
    }

    /// The soonest a normal slot frees for sure: the earliest idle deadline
    /// of a normal connection with no call in flight (or one idle timeout
    /// when every one is busy).
    pub(super) fn retry_hint(&self) -> Duration {
        let t = self.lock();
        let now = Instant::now();
        t.by_addr
            .values()
            .filter(|c| !c.reserve.load(Ordering::SeqCst))
            .filter_map(|c| self.idle_deadline(c))
            .map(|(at, _)| at.saturating_duration_since(now))
            .min()
            .unwrap_or(self.limits.idle_timeout)
            .max(Duration::from_millis(1))
    }
}

/// Whom the per-peer cap counts a connection against: its IPv4 address, or
/// the /64 of its IPv6 one (one host or site holds a whole /64, so counting
/// each address would give it billions of caps).
pub(super) fn peer_group(peer: SocketAddr) -> IpAddr {
    match peer.ip().to_canonical() {
        IpAddr::V6(v6) => IpAddr::V6(std::net::Ipv6Addr::from(u128::from(v6) & !((1u128 << 64) - 1))),
        v4 => v4,
    }
}
