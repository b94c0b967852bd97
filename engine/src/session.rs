//! Sessions (paper §6.3): what a receiver already holds of one context, so
//! adaptive requests send only chunks it has not seen.
//!
//! * **Unguessable and bound to their creator.** A session opened without
//!   an id gets one from 128 random bits; every session gets a 128-bit
//!   secret token, returned once at open and required by every later use
//!   (adaptive requests, close, a follow-up compress). When the transport
//!   knows the caller (a TLS client certificate, a DID), the session is also
//!   bound to that identity.
//! * **Bounded.** A `moka` cache bounded by idle time and by bytes: each
//!   session weighs what it holds (its prepared context, counted in full for
//!   every session that holds it, so the bound is conservative), and at
//!   least `max_bytes / max_sessions`, so the count bound holds too.
//! * **Client-chosen ids are the caller's own.** A generated id (`s-` and
//!   32 hex digits) is global; an id the client chose lives in its scope
//!   (its identity, else its address: the service says), so a caller can
//!   neither take another's id first nor learn whether it exists.
//! * **A share per caller, and per network.** When the store is full and
//!   other callers hold sessions, a caller (its scope; an IPv6 address
//!   counts as its /64) holding more than a tenth of the sessions or of
//!   their bytes gives up its own least recently used session for a new one
//!   (as many as the new one needs), rather than the store evicting
//!   anyone's. The addresses of one IPv4 /24 hold [`NETWORK_SHARES`] tenths
//!   together while other networks hold sessions: past that, the network's
//!   largest holder gives up its least recently used, never another
//!   network's. A caller within its shares takes the room of a network
//!   past its shares, else of the largest holder at its own share; a
//!   caller alone may fill the store. Scopes of the
//!   form `ip:<address>` are addresses (the service's share keys).
//! * **Never silently gone.** An evicted, expired or closed session leaves a
//!   tombstone; its owner's next call says which of these happened.
//! * **One lock per session.** Concurrent requests on one session serialize
//!   on its own mutex (never a global one), so no chunk is sent twice.
//!
//! ```
//! use std::time::Duration;
//! use scd_engine::session::{SessionLimits, SessionStore};
//! let store: SessionStore<Vec<u32>> = SessionStore::new(SessionLimits {
//!     ttl: Duration::from_secs(60), max_sessions: 10, max_bytes: 1 << 20,
//! });
//! let grant = store.open(None, None, None, [0; 32], 100, vec![]).unwrap();
//! assert_eq!(grant.id.len(), 34); // "s-" + 128 bits in hex
//! assert!(store.get(&grant.id, &grant.token, None, None).is_ok());
//! assert!(store.get(&grant.id, "guessed", None, None).is_err());
//! // a chosen id is the scope's own: another scope opens its own under it
//! let mine = store.open(Some("deploy-42".into()), None, Some("ip:10.0.0.1"), [0; 32], 100, vec![]).unwrap();
//! let theirs = store.open(Some("deploy-42".into()), None, Some("ip:10.0.0.2"), [0; 32], 100, vec![]).unwrap();
//! assert!(store.get("deploy-42", &theirs.token, None, Some("ip:10.0.0.1")).is_err());
//! assert!(store.get("deploy-42", &mine.token, None, Some("ip:10.0.0.1")).is_ok());
//! ```

use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use moka::notification::RemovalCause;
use moka::policy::EvictionPolicy;
use moka::sync::Cache;
use rand::Rng;
use tracing::warn;

use crate::{Error, Param, Result};

/// Bounds on the sessions one engine holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionLimits {
    /// Lifetime after last use.
    pub ttl: Duration,
    /// Sessions held at once.
    pub max_sessions: usize,
    /// Bytes held by all sessions together.
    pub max_bytes: usize,
}

impl SessionLimits {
    /// What one session over `bytes` of state weighs against the bound:
    /// at least an equal share of the bytes, so the count bound holds too.
    pub fn weight(&self, bytes: usize) -> Result<u32> {
        let floor = self.max_bytes / self.max_sessions.max(1);
        let w = bytes.max(floor);
        if w > self.max_bytes {
            return Err(Error::invalid(
                "session",
                format!("the context needs {w} bytes of session memory, over the limit {}", self.max_bytes),
            ));
        }
        Ok(u32::try_from(w).unwrap_or(u32::MAX))
    }
}

impl Default for SessionLimits {
    fn default() -> Self {
        Self { ttl: Duration::from_secs(1800), max_sessions: 10_000, max_bytes: 1 << 30 }
    }
}

/// What a caller gets when it opens a session: the id and the secret token
/// every later use must present.
#[derive(Clone, PartialEq, Eq, serde::Serialize)]
pub struct SessionGrant {
    /// The session id.
    pub id: String,
    /// The secret (128 random bits, hex).
    pub token: String,
}

impl std::fmt::Debug for SessionGrant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionGrant").field("id", &self.id).field("token", &"<secret>").finish()
    }
}

/// Counters of the store.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SessionStats {
    /// Live sessions.
    pub live: u64,
    /// Bytes they weigh.
    pub bytes: u64,
    /// Sessions evicted to stay under the bounds.
    pub evicted: u64,
    /// Sessions expired after their idle time.
    pub expired: u64,
}

/// One live session: its identity checks and its state behind its own lock.
pub struct SessionEntry<S> {
    token: String,
    owner: Option<String>,
    context_key: [u8; 32],
    weight: u32,
    /// When it was last opened or read, on the store's [`SessionStore::clock`].
    used: Arc<AtomicU64>,
    state: Mutex<S>,
}

impl<S> SessionEntry<S> {
    /// Locks this session's state (poison is recovered: the state is a ledger).
    pub fn lock(&self) -> MutexGuard<'_, S> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The fingerprint of the context the session was opened on.
    pub fn context_key(&self) -> &[u8; 32] {
        &self.context_key
    }
}

#[derive(Default)]
struct Counters {
    evicted: AtomicU64,
    expired: AtomicU64,
    last_warn_s: AtomicU64,
}

/// The tombstone codes a store writes, and what the owner is told.
pub const GONE_CAUSES: [(&str, &str); 5] = [
    ("evicted", "evicted to keep sessions under the server's memory and count bounds"),
    ("expired", "expired after its idle time"),
    ("closed", "closed"),
    (
        "gave_way",
        "closed for a newer session of the same caller: when the server is full, a caller past a tenth of its sessions gives up its own least recently used",
    ),
    (
        "network_gave_way",
        "closed for a newer session from the same network: when the server is full, an IPv4 /24 past a fifth of the sessions gives up its own least recently used",
    ),
];

/// The message of tombstone `code` (an unknown code reads as evicted).
pub fn gone_cause(code: &str) -> &'static str {
    GONE_CAUSES.iter().find(|(c, _)| *c == code).map_or(GONE_CAUSES[0].1, |(_, m)| m)
}

/// Each scope's share of the sessions and of their bytes: `1 / SCOPE_PARTS`.
pub const SCOPE_PARTS: usize = 10;

/// The shares (of `1 / SCOPE_PARTS` each) the addresses of one IPv4 /24
/// hold together while other networks hold sessions.
pub const NETWORK_SHARES: usize = 2;

/// Whose share a scope draws on: an IPv6 address's /64 (one host or site
/// has a /64 of addresses), else the scope itself. Scopes of the form
/// `ip:<address>` are addresses; the service keys its other shares the
/// same way.
pub fn share_unit(scope: &str) -> String {
    match scope.strip_prefix("ip:").and_then(|a| a.parse::<IpAddr>().ok()) {
        Some(IpAddr::V6(v6)) => {
            let s = v6.segments();
            format!("ip:{:x}:{:x}:{:x}:{:x}::/64", s[0], s[1], s[2], s[3])
        }
        _ => scope.to_string(),
    }
}

/// The network a share unit ([`share_unit`]) belongs to: an IPv4
/// address's /24, as `net:a.b.c.0/24` (an IPv6 unit is its /64 already,
/// an identity is its own).
pub fn share_network(unit: &str) -> Option<String> {
    match unit.strip_prefix("ip:").and_then(|a| a.parse::<IpAddr>().ok()) {
        Some(IpAddr::V4(v4)) => {
            let o = v4.octets();
            Some(format!("net:{}.{}.{}.0/24", o[0], o[1], o[2]))
        }
        _ => None,
    }
}

use share_network as network;
use share_unit as unit;

/// A session a scope holds: its store key, its weight and its last use.
type Held = (String, u32, Arc<AtomicU64>);

/// One caller's share of a full store, and the size of the session it opens.
struct Share {
    /// Sessions per caller.
    n: u64,
    /// Bytes per caller.
    b: u64,
    /// The new session's weight.
    weight: u64,
}

impl Share {
    /// Whether holding `q` and the new session is past `parts` shares.
    fn past(&self, parts: u64, count: u64, bytes: u64) -> bool {
        count + 1 > self.n * parts || bytes + self.weight > self.b * parts
    }

    /// Whose session gives way for `me`'s new one, and the tombstone's
    /// code: `me` past its share; else the largest holder of `me`'s /24
    /// past the network's shares, while another network holds sessions;
    /// else the largest holder of the largest /24 past its shares; else the
    /// largest holder at its own share, when it holds more than `me`;
    /// else none.
    fn victim(&self, scopes: &HashMap<String, VecDeque<Held>>, me: &str) -> Option<(String, &'static str)> {
        let size = |q: &VecDeque<Held>| (q.len() as u64, q.iter().map(|(_, w, _)| u64::from(*w)).sum::<u64>());
        let (count, bytes) = scopes.get(me).map_or((0, 0), size);
        if self.past(1, count, bytes) && count > 0 {
            return Some((me.to_string(), "gave_way"));
        }
        let largest = |of: &dyn Fn(&str) -> bool| {
            scopes
                .iter()
                .filter(|(u, q)| of(u) && !q.is_empty())
                .max_by_key(|(_, q)| size(q))
                .map(|(u, q)| (u, size(q)))
        };
        let mut nets: HashMap<String, (u64, u64)> = HashMap::new();
        for (u, q) in scopes {
            if let Some(net) = network(u) {
                let (c, b) = size(q);
                let e = nets.entry(net).or_default();
                (e.0, e.1) = (e.0 + c, e.1 + b);
            }
        }
        let parts = NETWORK_SHARES as u64;
        let mine = network(me);
        // a network at its shares, held to them while another holds sessions
        let over = |net: &str, (c, b): (u64, u64)| {
            let others = scopes.keys().any(|u| network(u).as_deref() != Some(net));
            others
                && (if Some(net) == mine.as_deref() {
                    self.past(parts, c, b)
                } else {
                    c > self.n * parts || b > self.b * parts
                })
        };
        if let Some(net) = mine.as_deref().filter(|n| over(n, nets.get(*n).copied().unwrap_or_default())) {
            return largest(&|u: &str| network(u).as_deref() == Some(net))
                .map(|(u, _)| (u.clone(), "network_gave_way"));
        }
        if let Some((net, _)) = nets.iter().filter(|(n, t)| over(n, **t)).max_by_key(|(_, t)| **t) {
            return largest(&|u: &str| network(u).as_deref() == Some(net)).map(|(u, _)| (u.clone(), "evicted"));
        }
        let (u, (c, b)) = largest(&|u: &str| u != me)?;
        ((c >= self.n || b >= self.b) && c > count).then(|| (u.clone(), "evicted"))
    }
}

/// Sessions holding state `S`, bounded and bound to their creators.
pub struct SessionStore<S> {
    live: Cache<String, Arc<SessionEntry<S>>>,
    gone: Cache<String, &'static str>,
    counters: Arc<Counters>,
    limits: SessionLimits,
    /// Each scope's sessions (store keys, weights and last use), oldest
    /// first; ids no longer live are pruned when the scope opens one.
    scopes: Mutex<HashMap<String, VecDeque<Held>>>,
    /// Ticks once per open and per read: the order of last use.
    clock: AtomicU64,
}

impl<S> std::fmt::Debug for SessionStore<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionStore").field("limits", &self.limits).finish()
    }
}

pub(crate) fn random_hex() -> String {
    format!("{:032x}", rand::rng().random::<u128>())
}

/// Constant-time equality, so a token cannot be guessed byte by byte.
pub(crate) fn same_secret(a: &str, b: &str) -> bool {
    a.len() == b.len() && a.bytes().zip(b.bytes()).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn now_s() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// Checks a client-chosen session id.
pub fn check_session_id(id: &str) -> Result<()> {
    if id.is_empty() || id.len() > 256 || !id.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(Error::invalid(Param::SessionId, "must be 1 to 256 printable ASCII characters"));
    }
    Ok(())
}

/// The id of a session being opened: the caller's choice, checked, or a
/// fresh one of 128 random bits.
pub(crate) fn new_session_id(id: Option<String>) -> Result<String> {
    match id {
        Some(id) => {
            check_session_id(&id)?;
            if is_generated(&id) {
                // a generated id is global: a chosen one of its form would
                // leave the caller's scope and tell whether it exists
                return Err(Error::invalid(
                    Param::SessionId,
                    "the form s-<32 hex digits> is the server's own; choose another id or leave it out",
                ));
            }
            Ok(id)
        }
        None => Ok(format!("s-{}", random_hex())),
    }
}

/// Whether `id` has the form of a generated id: `s-` and 32 lower-case hex
/// digits (global; any other id is the choosing caller's own).
pub fn is_generated(id: &str) -> bool {
    id.len() == 34 && id.starts_with("s-") && id[2..].bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// The store's key of `id` in `scope`: a generated id as it is (128 random
/// bits, global), a chosen one within its scope.
pub(crate) fn key(id: &str, scope: Option<&str>) -> String {
    if is_generated(id) {
        id.to_string()
    } else {
        format!("{}\u{1f}{id}", scope.unwrap_or(""))
    }
}

impl<S: Send + Sync + 'static> SessionStore<S> {
    /// An empty store.
    pub fn new(limits: SessionLimits) -> Self {
        let counters = Arc::new(Counters::default());
        let gone: Cache<String, &'static str> =
            Cache::builder().max_capacity(100_000).time_to_live(limits.ttl.max(Duration::from_secs(3600))).build();
        let (c, g) = (counters.clone(), gone.clone());
        let live = Cache::builder()
            .max_capacity(limits.max_bytes as u64)
            .weigher(|_, e: &Arc<SessionEntry<S>>| e.weight)
            .time_to_idle(limits.ttl)
            .eviction_policy(EvictionPolicy::lru())
            .eviction_listener(move |id: Arc<String>, _, cause| {
                let why = match cause {
                    RemovalCause::Size => {
                        c.evicted.fetch_add(1, Ordering::Relaxed);
                        let now = now_s();
                        let last = c.last_warn_s.load(Ordering::Relaxed);
                        if now >= last + 10
                            && c.last_warn_s.compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed).is_ok()
                        {
                            warn!(
                                evicted_total = c.evicted.load(Ordering::Relaxed),
                                "sessions evicted to stay under the session memory/count bound"
                            );
                        }
                        gone_cause("evicted")
                    }
                    RemovalCause::Expired => {
                        c.expired.fetch_add(1, Ordering::Relaxed);
                        gone_cause("expired")
                    }
                    RemovalCause::Explicit if g.contains_key(id.as_str()) => return,
                    RemovalCause::Explicit => gone_cause("closed"),
                    RemovalCause::Replaced => return,
                };
                g.insert((*id).clone(), why);
            })
            .build();
        Self { live, gone, counters, limits, scopes: Mutex::new(HashMap::new()), clock: AtomicU64::new(0) }
    }

    /// The limits in force.
    pub fn limits(&self) -> &SessionLimits {
        &self.limits
    }

    /// What one session over `bytes` of state weighs against the bound.
    fn weight(&self, bytes: usize) -> Result<u32> {
        self.limits.weight(bytes)
    }

    /// Opens a session holding `state` (about `bytes` of memory) for the
    /// context fingerprinted by `context_key`. `id`: the caller's choice
    /// (within `scope`), or `None` for 128 random bits. An id already live
    /// in the scope is refused: continue it with [`SessionStore::get`].
    pub fn open(
        &self,
        id: Option<String>,
        caller: Option<String>,
        scope: Option<&str>,
        context_key: [u8; 32],
        bytes: usize,
        state: S,
    ) -> Result<SessionGrant> {
        let id = new_session_id(id)?;
        let token = random_hex();
        let entry = Arc::new(SessionEntry {
            token: token.clone(),
            owner: caller,
            context_key,
            weight: self.weight(bytes)?,
            used: Arc::new(AtomicU64::new(self.clock.fetch_add(1, Ordering::Relaxed))),
            state: Mutex::new(state),
        });
        let k = key(&id, scope);
        let (weight, used) = (entry.weight, entry.used.clone());
        if self.live.contains_key(&k) {
            return Err(Error::SessionForbidden { session_id: id });
        }
        if let Some(sc) = scope {
            self.give_way(sc, weight);
        }
        let fresh = self.live.entry(k.clone()).or_insert_with(|| entry).is_fresh();
        if !fresh {
            return Err(Error::SessionForbidden { session_id: id });
        }
        self.gone.invalidate(&k);
        if let Some(sc) = scope {
            let mut scopes = self.scopes.lock().unwrap_or_else(|p| p.into_inner());
            scopes.entry(unit(sc)).or_default().push_back((k, weight, used));
        }
        Ok(SessionGrant { id, token })
    }

    /// Makes room for a session of `weight` from `scope` when the store
    /// would otherwise evict (LRU, whoever's) to take it and another caller
    /// holds sessions: while the store stays full, the caller past its share
    /// (a tenth of the sessions or bytes) gives up its own least recently
    /// used session; else its /24 past [`NETWORK_SHARES`] tenths gives up
    /// its largest holder's, never another network's; else a /24 past its
    /// shares or the largest holder at its own share gives up one
    /// ([`Share::victim`]). Otherwise the store evicts.
    fn give_way(&self, scope: &str, weight: u32) {
        let (max_n, max_b) = (self.limits.max_sessions as u64, self.limits.max_bytes as u64);
        self.live.run_pending_tasks();
        let (mut n, mut w) = (self.live.entry_count(), self.live.weighted_size());
        let full = |n: u64, w: u64| n + 1 > max_n || w + u64::from(weight) > max_b;
        if !full(n, w) {
            return;
        }
        let me = unit(scope);
        let mut scopes = self.scopes.lock().unwrap_or_else(|p| p.into_inner());
        scopes.retain(|_, q| {
            q.retain(|(k, _, _)| self.live.contains_key(k));
            !q.is_empty()
        });
        if !scopes.keys().any(|other| *other != me) {
            return;
        }
        let share = Share {
            n: (max_n / SCOPE_PARTS as u64).max(1),
            b: (max_b / SCOPE_PARTS as u64).max(1),
            weight: u64::from(weight),
        };
        while full(n, w) {
            let Some((victim, cause)) = share.victim(&scopes, &me) else { break };
            let Some(q) = scopes.get_mut(&victim) else { break };
            let lru = q.iter().enumerate().min_by_key(|(_, (_, _, used))| used.load(Ordering::Relaxed)).map(|(i, _)| i);
            let Some((k, kw, _)) = lru.and_then(|i| q.remove(i)) else { break };
            if q.is_empty() {
                scopes.remove(&victim);
            }
            (n, w) = (n.saturating_sub(1), w.saturating_sub(u64::from(kw)));
            if cause == "evicted" {
                self.counters.evicted.fetch_add(1, Ordering::Relaxed);
            }
            self.gone.insert(k.clone(), gone_cause(cause));
            self.live.invalidate(&k);
        }
    }

    /// True when `id` names a live session in `scope` (whoever owns it).
    pub fn contains(&self, id: &str, scope: Option<&str>) -> bool {
        self.live.contains_key(&key(id, scope))
    }

    /// The live session `id`, if `token` (and `caller`, when the session has
    /// an owner) match. A missing session says whether it was evicted,
    /// expired or closed, when the store still remembers.
    pub fn get(
        &self,
        id: &str,
        token: &str,
        caller: Option<&str>,
        scope: Option<&str>,
    ) -> Result<Arc<SessionEntry<S>>> {
        if id.is_empty() {
            return Err(Error::invalid(Param::SessionId, "must not be empty"));
        }
        let k = key(id, scope);
        let Some(entry) = self.live.get(&k) else {
            return Err(match self.gone.get(&k) {
                Some(cause) => Error::SessionGone { session_id: id.to_string(), cause },
                None => Error::UnknownSession { session_id: id.to_string() },
            });
        };
        let owner_ok = entry.owner.as_deref().is_none_or(|o| caller == Some(o));
        if !same_secret(&entry.token, token) || !owner_ok {
            return Err(Error::SessionForbidden { session_id: id.to_string() });
        }
        entry.used.store(self.clock.fetch_add(1, Ordering::Relaxed), Ordering::Relaxed);
        Ok(entry)
    }

    /// Closes a session; `Ok(false)` when none is live under `id`.
    pub fn close(&self, id: &str, token: &str, caller: Option<&str>, scope: Option<&str>) -> Result<bool> {
        match self.get(id, token, caller, scope) {
            Ok(_) => {
                self.live.invalidate(&key(id, scope));
                Ok(true)
            }
            Err(Error::UnknownSession { .. } | Error::SessionGone { .. }) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Counters, after pending evictions are applied.
    pub fn stats(&self) -> SessionStats {
        self.live.run_pending_tasks();
        SessionStats {
            live: self.live.entry_count(),
            bytes: self.live.weighted_size(),
            evicted: self.counters.evicted.load(Ordering::Relaxed),
            expired: self.counters.expired.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store(max_sessions: usize, max_bytes: usize) -> SessionStore<u32> {
        SessionStore::new(SessionLimits { ttl: Duration::from_secs(60), max_sessions, max_bytes })
    }

    #[test]
    fn generated_ids_are_128_random_bits_and_distinct() {
        let s = store(100, 1 << 20);
        let a = s.open(None, None, None, [0; 32], 10, 0).unwrap();
        let b = s.open(None, None, None, [0; 32], 10, 0).unwrap();
        assert_ne!(a.id, b.id);
        assert_ne!(a.token, b.token);
        assert!(a.id.starts_with("s-") && a.id[2..].len() == 32 && u128::from_str_radix(&a.id[2..], 16).is_ok());
        assert!(!format!("{a:?}").contains(&a.token), "Debug hides the token");
    }

    #[test]
    fn a_busy_scope_gives_up_its_own_oldest_session_not_anothers() {
        let s = store(20, 1 << 20);
        let theirs: Vec<_> = (0..5).map(|i| s.open(None, None, Some("b"), [0; 32], 10, i).unwrap()).collect();
        let mine: Vec<_> = (0..30).map(|i| s.open(None, None, Some("a"), [0; 32], 10, i).unwrap()).collect();
        for g in &theirs {
            assert!(s.get(&g.id, &g.token, None, Some("b")).is_ok(), "another scope's session was evicted");
        }
        // the store is full at 20: a's oldest gave way, one per new session
        let live: Vec<usize> =
            (0..30).filter(|&i| s.get(&mine[i].id, &mine[i].token, None, Some("a")).is_ok()).collect();
        assert_eq!(live, (15..30).collect::<Vec<_>>());
        let e = s.get(&mine[0].id, &mine[0].token, None, Some("a")).err().unwrap();
        assert!(e.to_string().contains("a newer session of the same caller"), "{e}");
        // a caller alone fills the store; its own LRU evictions say so
        let alone = store(20, 1 << 20);
        let many: Vec<_> = (0..20).map(|i| alone.open(None, None, Some("a"), [0; 32], 10, i).unwrap()).collect();
        assert!(many.iter().all(|g| alone.get(&g.id, &g.token, None, Some("a")).is_ok()));
        // a chosen id of the generated form, and re-opening a live one, are refused
        let forged = format!("s-{}", "0".repeat(32));
        assert!(matches!(
            alone.open(Some(forged), None, Some("a"), [0; 32], 10, 0),
            Err(Error::InvalidArgument { .. })
        ));
        alone.open(Some("mine".into()), None, Some("a"), [0; 32], 10, 0).unwrap();
        let before = alone.stats().live;
        assert!(matches!(
            alone.open(Some("mine".into()), None, Some("a"), [0; 32], 10, 0),
            Err(Error::SessionForbidden { .. })
        ));
        assert_eq!(alone.stats().live, before, "a refused open closed a session");
    }

    #[test]
    fn ten_addresses_of_one_network_cannot_evict_another_networks_session() {
        let s = store(50, 1 << 20);
        let victim = s.open(None, None, Some("ip:10.0.1.1"), [0; 32], 10, 0).unwrap();
        let near = s.open(None, None, Some("ip:10.0.0.200"), [0; 32], 10, 0).unwrap();
        for i in 0..300 {
            s.open(None, None, Some(&format!("ip:10.0.0.{}", 2 + i % 10)), [0; 32], 10, 0).unwrap();
        }
        assert!(s.get(&victim.id, &victim.token, None, Some("ip:10.0.1.1")).is_ok(), "another /24's session went");
        assert!(s.get(&near.id, &near.token, None, Some("ip:10.0.0.200")).is_ok(), "the /24's smallest holder lost");
        // the other /24 takes its share from the one past its own
        let held: Vec<_> = (0..5).map(|i| s.open(None, None, Some("ip:10.0.1.1"), [0; 32], 10, i).unwrap()).collect();
        assert!(held.iter().all(|g| s.get(&g.id, &g.token, None, Some("ip:10.0.1.1")).is_ok()));
        // ten networks of one address each: each at its share, none takes the victim's
        let s = store(50, 1 << 20);
        let victim = s.open(None, None, Some("ip:10.0.1.1"), [0; 32], 10, 0).unwrap();
        for i in 0..300 {
            s.open(None, None, Some(&format!("ip:10.{}.0.1", 2 + i % 10)), [0; 32], 10, 0).unwrap();
        }
        let e = s.get(&victim.id, &victim.token, None, Some("ip:10.0.1.1"));
        assert!(e.is_ok(), "a caller within its share lost its session: {:?}", e.err());
        // an IPv6 /64 is one caller
        let s = store(50, 1 << 20);
        let victim = s.open(None, None, Some("ip:10.0.1.1"), [0; 32], 10, 0).unwrap();
        for i in 0..300 {
            s.open(None, None, Some(&format!("ip:2001:db8::{:x}", i + 1)), [0; 32], 10, 0).unwrap();
        }
        assert!(s.get(&victim.id, &victim.token, None, Some("ip:10.0.1.1")).is_ok());
        assert_eq!(unit("ip:2001:db8::7"), "ip:2001:db8:0:0::/64");
        assert_eq!(
            (network("ip:10.0.0.7"), network("ip:2001:db8:0:0::/64"), network("id:x")),
            (Some("net:10.0.0.0/24".to_string()), None, None)
        );
    }

    #[test]
    fn the_session_a_busy_scope_gives_up_is_its_least_recently_used() {
        let s = store(20, 1 << 20);
        let _theirs = s.open(None, None, Some("b"), [0; 32], 10, 0).unwrap();
        let mine: Vec<_> = (0..19).map(|i| s.open(None, None, Some("a"), [0; 32], 10, i).unwrap()).collect();
        // the oldest two are in use; the third oldest is the least recently used
        for g in &mine[..2] {
            s.get(&g.id, &g.token, None, Some("a")).unwrap();
        }
        s.open(None, None, Some("a"), [0; 32], 10, 99).unwrap();
        let gone: Vec<usize> =
            (0..19).filter(|&i| s.get(&mine[i].id, &mine[i].token, None, Some("a")).is_err()).collect();
        assert_eq!(gone, [2]);
    }

    #[test]
    fn token_and_owner_are_checked() {
        let s = store(100, 1 << 20);
        let g = s.open(Some("mine".into()), Some("alice".into()), None, [0; 32], 10, 7).unwrap();
        assert_eq!(*s.get("mine", &g.token, Some("alice"), None).unwrap().lock(), 7);
        for (token, caller) in [("x", Some("alice")), (g.token.as_str(), Some("bob")), (g.token.as_str(), None)] {
            let e = s.get("mine", token, caller, None).err().unwrap();
            assert!(matches!(e, Error::SessionForbidden { .. }), "{e}");
        }
        // an id already live cannot be taken over by opening it again
        assert!(matches!(s.open(Some("mine".into()), None, None, [1; 32], 10, 0), Err(Error::SessionForbidden { .. })));
        assert!(matches!(s.close("mine", "x", Some("alice"), None), Err(Error::SessionForbidden { .. })));
        assert!(s.close("mine", &g.token, Some("alice"), None).unwrap());
        let e = s.get("mine", &g.token, Some("alice"), None).err().unwrap();
        assert_eq!(e.to_string(), "session \"mine\" is gone: closed");
        assert!(matches!(s.get("", "", None, None), Err(Error::InvalidArgument { .. })));
        assert!(matches!(
            s.open(Some("bad id\n".into()), None, None, [0; 32], 1, 0),
            Err(Error::InvalidArgument { .. })
        ));
    }

    #[test]
    fn bounded_by_count_and_bytes_and_eviction_is_not_silent() {
        // 4 sessions at most by count (1000 / 4 = 250 bytes each at least)
        let s = store(4, 1000);
        let grants: Vec<_> = (0..6).map(|i| s.open(None, None, None, [0; 32], 10, i).unwrap()).collect();
        let st = s.stats();
        assert!(st.live <= 4 && st.bytes <= 1000, "{st:?}");
        assert!(st.evicted >= 2, "{st:?}");
        let first = s.get(&grants[0].id, &grants[0].token, None, None).err().unwrap();
        assert!(first.to_string().contains("evicted to keep sessions under"), "{first}");
        // by bytes: one session of 600 bytes leaves room for one of 250, not two
        let s = store(100, 1000);
        s.open(None, None, None, [0; 32], 600, 0).unwrap();
        s.open(None, None, None, [0; 32], 250, 0).unwrap();
        s.open(None, None, None, [0; 32], 250, 0).unwrap();
        assert!(s.stats().bytes <= 1000);
        let e = s.open(None, None, None, [0; 32], 5000, 0).err().unwrap();
        assert_eq!(e.to_string(), "session: the context needs 5000 bytes of session memory, over the limit 1000");
    }

    #[test]
    fn sessions_expire_after_idle_time() {
        let s =
            SessionStore::new(SessionLimits { ttl: Duration::from_millis(50), max_sessions: 10, max_bytes: 1 << 20 });
        let g = s.open(None, None, None, [0; 32], 10, 0u8).unwrap();
        std::thread::sleep(Duration::from_millis(120));
        assert!(s.get(&g.id, &g.token, None, None).is_err());
    }
}
