//! Sessions in Redis ([`SharedState`]): every replica started with the
//! same `--state` serves every session.
//!
//! Each operation is one Lua script, so it is atomic on the server. The
//! keys, under the prefix `scd:v1:`:
//!
//! | key | holds |
//! |---|---|
//! | `s:<k>` | hash: `rec` (the record), `ver`, `ctx` (its context's digest) |
//! | `lru` | sorted set: every live session by last use (Redis `TIME`, ms) |
//! | `w`, `sc`, `cx` | hashes: each session's weight, caller scope and context digest |
//! | `seq` | the version counter (every open and commit takes the next) |
//! | `ctxn` | hash: sessions per context digest (a blob goes with its last session) |
//! | `bytes` | the weights' sum |
//! | `scope:<s>`, `scopes`, `scb` | per share unit (a caller; an IPv6 /64): its sessions by last use, their count and bytes |
//! | `un`, `nu:<n>`, `nets`, `nbz` | each unit's IPv4 /24, each /24's units, and per /24 the sessions' count and bytes |
//! | `gone:<k>` | a tombstone: why the session went (expires) |
//! | `ctx:<digest>` | a context's fields and embeddings (expires with its sessions' idle time) |
//! | `stat` | evicted and expired counts |
//!
//! Bounds hold in Redis as in memory: idle time (a session not used for
//! `ttl` is expired by the next script that meets it, and its keys expire
//! on their own a minute later), count and bytes (eviction of the least
//! recently used, after the shares: a tenth per caller and two tenths per
//! IPv4 /24, as `engine/src/session.rs` words them), tombstones for at least an
//! hour. A context blob is deleted with the last session on it (and
//! expires with their idle time); its bytes are counted in each session's
//! weight. The bookkeeping hashes and sets hold one small entry per live
//! session or scope.
//!
//! A script run twice (the reply lost, the call retried) is idempotent: an
//! open finds its own record, a commit finds its own write.

use std::time::Duration;

use redis::{Script, Value};
use scd_engine::session::{share_network, share_unit, SessionLimits, SessionStats, NETWORK_SHARES};
use scd_engine::shared::{hex, Committed, Loaded, Opened, SharedState, StoreError};
use sha2::{Digest, Sha256};

use super::Redis;

/// Every key's prefix: a new layout gets a new version.
const PREFIX: &str = "scd:v1:";

/// Shared by every script: the clock, dropping a session (with its
/// tombstone), the idle sweep and marking a session used.
const PRELUDE: &str = r#"
local p = ARGV[1]
local ttl = tonumber(ARGV[2])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local gone_ttl = math.max(ttl, 3600000)
local function drop(k, cause)
  local w = tonumber(redis.call('HGET', p .. 'w', k) or '0')
  local sc = redis.call('HGET', p .. 'sc', k)
  local cx = redis.call('HGET', p .. 'cx', k)
  redis.call('HDEL', p .. 'w', k)
  redis.call('HDEL', p .. 'sc', k)
  redis.call('HDEL', p .. 'cx', k)
  if cx and redis.call('HINCRBY', p .. 'ctxn', cx, -1) <= 0 then
    redis.call('HDEL', p .. 'ctxn', cx)
    redis.call('DEL', p .. 'ctx:' .. cx)
  end
  if w > 0 then redis.call('DECRBY', p .. 'bytes', w) end
  if sc then
    redis.call('ZREM', p .. 'scope:' .. sc, k)
    local net = redis.call('HGET', p .. 'un', sc)
    if net then
      if redis.call('HINCRBY', p .. 'nets', net, -1) <= 0 then redis.call('HDEL', p .. 'nets', net) end
      if redis.call('HINCRBY', p .. 'nbz', net, -w) <= 0 then redis.call('HDEL', p .. 'nbz', net) end
    end
    if redis.call('HINCRBY', p .. 'scopes', sc, -1) <= 0 then
      redis.call('HDEL', p .. 'scopes', sc)
      redis.call('HDEL', p .. 'un', sc)
      if net then redis.call('SREM', p .. 'nu:' .. net, sc) end
    end
    if redis.call('HINCRBY', p .. 'scb', sc, -w) <= 0 then redis.call('HDEL', p .. 'scb', sc) end
  end
  redis.call('ZREM', p .. 'lru', k)
  redis.call('DEL', p .. 's:' .. k)
  redis.call('SET', p .. 'gone:' .. k, cause, 'PX', gone_ttl)
  if cause == 'evicted' or cause == 'expired' then redis.call('HINCRBY', p .. 'stat', cause, 1) end
end
local function sweep()
  local old = redis.call('ZRANGEBYSCORE', p .. 'lru', '-inf', now - ttl, 'LIMIT', 0, 64)
  for _, k in ipairs(old) do drop(k, 'expired') end
end
local function touch(k)
  redis.call('ZADD', p .. 'lru', now, k)
  local sc = redis.call('HGET', p .. 'sc', k)
  if sc then redis.call('ZADD', p .. 'scope:' .. sc, now, k) end
  redis.call('PEXPIRE', p .. 's:' .. k, ttl + 60000)
  local ctx = redis.call('HGET', p .. 's:' .. k, 'ctx')
  if ctx then redis.call('PEXPIRE', p .. 'ctx:' .. ctx, ttl + 60000) end
end
"#;

/// ARGV 3..: key, share unit ('' for none), weight, record, context
/// digest, context blob ('' when the caller saw it stored), max sessions,
/// max bytes, the unit's network ('' for none), a network's shares.
const OPEN: &str = r#"
sweep()
local k, sc, w = ARGV[3], ARGV[4], tonumber(ARGV[5])
local net, net_parts = ARGV[11], tonumber(ARGV[12])
local score = redis.call('ZSCORE', p .. 'lru', k)
if redis.call('EXISTS', p .. 's:' .. k) == 1 and score and now - tonumber(score) <= ttl then
  -- the same open run twice (a retry after a lost reply) is that open
  if redis.call('HGET', p .. 's:' .. k, 'rec') == ARGV[6] then return 'fresh' end
  return 'taken'
end
if score or redis.call('EXISTS', p .. 's:' .. k) == 1 then drop(k, 'expired') end
local ctx = p .. 'ctx:' .. ARGV[7]
if ARGV[8] == '' and redis.call('EXISTS', ctx) == 0 then return 'need_context' end
local max_n, max_b = tonumber(ARGV[9]), tonumber(ARGV[10])
local n = redis.call('ZCARD', p .. 'lru')
local b = tonumber(redis.call('GET', p .. 'bytes') or '0')
local function full() return n + 1 > max_n or b + w > max_b end
local share_n, share_b = 0, 0
local function size(u)
  return tonumber(redis.call('HGET', p .. 'scopes', u) or '0'), tonumber(redis.call('HGET', p .. 'scb', u) or '0')
end
local function bigger(c, bb, bc, bbb) return c > bc or (c == bc and bb > bbb) end
local function past(parts, c, bb) return c + 1 > share_n * parts or bb + w > share_b * parts end
-- the largest holder (sessions, then bytes) among units us, but skip
local function largest(us, skip)
  local best, bc, bb = nil, 0, 0
  for _, u in ipairs(us) do
    if u ~= skip then
      local c, x = size(u)
      if c > 0 and bigger(c, x, bc, bb) then best, bc, bb = u, c, x end
    end
  end
  return best, bc, bb
end
-- a network at its shares, held to them while another network holds sessions
local function over(m, c, bb)
  if redis.call('HLEN', p .. 'scopes') <= redis.call('SCARD', p .. 'nu:' .. m) then return false end
  if m == net then return past(net_parts, c, bb) end
  return c > share_n * net_parts or bb > share_b * net_parts
end
-- whose session gives way, and the tombstone's code (engine/src/session.rs,
-- Share::victim): this unit past its share; else its /24 past the
-- network's shares; else the largest /24 past them; else the largest
-- holder at its own share, when it holds more than this unit
local function victim()
  local c, x = size(sc)
  if c > 0 and past(1, c, x) then return sc, 'gave_way' end
  if net ~= '' then
    local nc = tonumber(redis.call('HGET', p .. 'nets', net) or '0')
    if over(net, nc, tonumber(redis.call('HGET', p .. 'nbz', net) or '0')) then
      return largest(redis.call('SMEMBERS', p .. 'nu:' .. net)), 'network_gave_way'
    end
  end
  local worst, wc, wb = nil, 0, 0
  local all = redis.call('HGETALL', p .. 'nets')
  for i = 1, #all, 2 do
    local m, mc = all[i], tonumber(all[i + 1])
    local mb = tonumber(redis.call('HGET', p .. 'nbz', m) or '0')
    if over(m, mc, mb) and (not worst or bigger(mc, mb, wc, wb)) then worst, wc, wb = m, mc, mb end
  end
  if worst then return largest(redis.call('SMEMBERS', p .. 'nu:' .. worst)), 'evicted' end
  local units = {}
  local held = redis.call('HKEYS', p .. 'scopes')
  for _, u in ipairs(held) do units[#units + 1] = u end
  local u, uc, ub = largest(units, sc)
  if u and (uc >= share_n or ub >= share_b) and uc > c then return u, 'evicted' end
  return nil
end
local function take(z, cause)
  local lru = redis.call('ZRANGE', z, 0, 0)
  if #lru == 0 then return false end
  local kw = tonumber(redis.call('HGET', p .. 'w', lru[1]) or '0')
  drop(lru[1], cause)
  n = n - 1
  b = b - kw
  return kw
end
if full() and sc ~= '' then
  local mine = tonumber(redis.call('HGET', p .. 'scopes', sc) or '0')
  if redis.call('HLEN', p .. 'scopes') - ((mine > 0) and 1 or 0) > 0 then
    share_n = math.max(math.floor(max_n / 10), 1)
    share_b = math.max(math.floor(max_b / 10), 1)
    while full() do
      local u, cause = victim()
      if not u or not take(p .. 'scope:' .. u, cause) then break end
    end
  end
end
while full() do
  if not take(p .. 'lru', 'evicted') then break end
end
-- versions come from one counter: a session reopened under the same key
-- never matches a commit meant for the one before it
local ver = tostring(redis.call('INCR', p .. 'seq'))
redis.call('HSET', p .. 's:' .. k, 'rec', ARGV[6], 'ver', ver, 'prev', '', 'ctx', ARGV[7])
redis.call('HSET', p .. 'cx', k, ARGV[7])
redis.call('HINCRBY', p .. 'ctxn', ARGV[7], 1)
redis.call('HSET', p .. 'w', k, w)
redis.call('INCRBY', p .. 'bytes', w)
if sc ~= '' then
  redis.call('HSET', p .. 'sc', k, sc)
  redis.call('HINCRBY', p .. 'scopes', sc, 1)
  redis.call('HINCRBY', p .. 'scb', sc, w)
  if net ~= '' then
    redis.call('HSET', p .. 'un', sc, net)
    redis.call('SADD', p .. 'nu:' .. net, sc)
    redis.call('HINCRBY', p .. 'nets', net, 1)
    redis.call('HINCRBY', p .. 'nbz', net, w)
  end
end
redis.call('DEL', p .. 'gone:' .. k)
if ARGV[8] ~= '' and redis.call('EXISTS', ctx) == 0 then redis.call('SET', ctx, ARGV[8]) end
touch(k)
return 'fresh'
"#;

/// ARGV 3: key.
const LOAD: &str = r#"
local k = ARGV[3]
local score = redis.call('ZSCORE', p .. 'lru', k)
if not score then
  local g = redis.call('GET', p .. 'gone:' .. k)
  if g then return {'gone', g} end
  return {'unknown'}
end
if redis.call('EXISTS', p .. 's:' .. k) == 0 or now - tonumber(score) > ttl then
  drop(k, 'expired')
  return {'gone', 'expired'}
end
touch(k)
local r = redis.call('HMGET', p .. 's:' .. k, 'rec', 'ver')
return {'live', r[1], r[2]}
"#;

/// ARGV 3..: key, version, record.
const COMMIT: &str = r#"
local k = ARGV[3]
if redis.call('EXISTS', p .. 's:' .. k) == 0 then
  local g = redis.call('GET', p .. 'gone:' .. k)
  if g then return {'gone', g} end
  return {'gone'}
end
local cur = redis.call('HMGET', p .. 's:' .. k, 'ver', 'prev', 'rec')
if cur[1] ~= ARGV[4] then
  -- this very commit, run twice (a retry after a lost reply), is done
  if cur[2] == ARGV[4] and cur[3] == ARGV[5] then return {'done'} end
  return {'conflict'}
end
redis.call('HSET', p .. 's:' .. k, 'rec', ARGV[5], 'prev', ARGV[4], 'ver', tostring(redis.call('INCR', p .. 'seq')))
touch(k)
return {'done'}
"#;

/// ARGV 3: key.
const CLOSE: &str = r#"
local k = ARGV[3]
if redis.call('EXISTS', p .. 's:' .. k) == 0 then return 0 end
drop(k, 'closed')
return 1
"#;

const STATS: &str = r#"
sweep()
local s = redis.call('HMGET', p .. 'stat', 'evicted', 'expired')
return {redis.call('ZCARD', p .. 'lru'), tonumber(redis.call('GET', p .. 'bytes') or '0'),
        tonumber(s[1] or '0'), tonumber(s[2] or '0')}
"#;

/// Sessions in Redis.
#[derive(Debug)]
pub struct RedisSessions {
    redis: Redis,
    open: Script,
    load: Script,
    commit: Script,
    close: Script,
    stats: Script,
}

fn script(body: &str) -> Script {
    Script::new(&format!("{PRELUDE}{body}"))
}

fn ttl_ms(limits: &SessionLimits) -> u64 {
    u64::try_from(limits.ttl.as_millis()).unwrap_or(u64::MAX).max(1)
}

/// A scope as a key part: hashed, so any caller identity is a safe key.
fn scope_key(scope: &str) -> String {
    hex(&Sha256::digest(scope.as_bytes())[..16])
}

fn text(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => String::from_utf8(b.clone()).ok(),
        Value::SimpleString(s) => Some(s.clone()),
        Value::Int(i) => Some(i.to_string()),
        _ => None,
    }
}

fn unexpected(what: &str) -> StoreError {
    StoreError(format!("unexpected reply to {what}"))
}

impl RedisSessions {
    /// Sessions at `url` (`--state`); nothing is connected until used.
    pub fn open(url: &str) -> Result<Self, super::UrlError> {
        Ok(Self {
            redis: Redis::open("--state", url, Duration::from_secs(2))?,
            open: script(OPEN),
            load: script(LOAD),
            commit: script(COMMIT),
            close: script(CLOSE),
            stats: script(STATS),
        })
    }

    /// The store's name (`redis://host:port/db`).
    pub fn name_str(&self) -> &str {
        self.redis.name()
    }

    fn run(&self, s: &Script, limits: &SessionLimits, args: &[&[u8]]) -> Result<Value, StoreError> {
        self.redis.with(|c| {
            let mut inv = s.prepare_invoke();
            inv.arg(PREFIX).arg(ttl_ms(limits));
            for a in args {
                inv.arg(*a);
            }
            inv.invoke::<Value>(c)
        })
    }
}

impl SharedState for RedisSessions {
    fn name(&self) -> &str {
        self.redis.name()
    }

    fn open(
        &self,
        key: &str,
        scope: Option<&str>,
        weight: u64,
        record: &[u8],
        context: (&str, &[u8]),
        limits: &SessionLimits,
    ) -> Result<Opened, StoreError> {
        // shares are of units (an IPv6 /64 is one) and of IPv4 /24s, as in memory
        let unit = scope.map(share_unit);
        let net = unit.as_deref().and_then(share_network).map(|n| scope_key(&n)).unwrap_or_default();
        let scope = unit.as_deref().map(scope_key).unwrap_or_default();
        let (weight, max_n, max_b, parts) = (
            weight.to_string(),
            limits.max_sessions.to_string(),
            limits.max_bytes.to_string(),
            NETWORK_SHARES.to_string(),
        );
        // the blob only when the store lacks it: a context shared by many
        // sessions crosses the network once
        for blob in [&b""[..], context.1] {
            let args: [&[u8]; 10] = [
                key.as_bytes(),
                scope.as_bytes(),
                weight.as_bytes(),
                record,
                context.0.as_bytes(),
                blob,
                max_n.as_bytes(),
                max_b.as_bytes(),
                net.as_bytes(),
                parts.as_bytes(),
            ];
            match text(&self.run(&self.open, limits, &args)?).as_deref() {
                Some("fresh") => return Ok(Opened::Fresh),
                Some("taken") => return Ok(Opened::Taken),
                Some("need_context") => continue,
                _ => return Err(unexpected("open")),
            }
        }
        Err(unexpected("open with its context"))
    }

    fn load(&self, key: &str, limits: &SessionLimits) -> Result<Loaded, StoreError> {
        let Value::Array(v) = self.run(&self.load, limits, &[key.as_bytes()])? else {
            return Err(unexpected("load"));
        };
        match (v.first().and_then(text).as_deref(), v.get(1), v.get(2)) {
            (Some("live"), Some(Value::BulkString(rec)), Some(ver)) => Ok(Loaded::Live {
                record: rec.clone(),
                version: text(ver).and_then(|s| s.parse().ok()).ok_or_else(|| unexpected("load"))?,
            }),
            (Some("gone"), Some(code), _) => Ok(Loaded::Gone(text(code).unwrap_or_default())),
            (Some("unknown"), _, _) => Ok(Loaded::Unknown),
            _ => Err(unexpected("load")),
        }
    }

    fn commit(&self, key: &str, version: u64, record: &[u8], limits: &SessionLimits) -> Result<Committed, StoreError> {
        let version = version.to_string();
        let Value::Array(v) = self.run(&self.commit, limits, &[key.as_bytes(), version.as_bytes(), record])? else {
            return Err(unexpected("commit"));
        };
        match v.first().and_then(text).as_deref() {
            Some("done") => Ok(Committed::Done),
            Some("conflict") => Ok(Committed::Conflict),
            Some("gone") => Ok(Committed::Gone(v.get(1).and_then(text))),
            _ => Err(unexpected("commit")),
        }
    }

    fn close(&self, key: &str, limits: &SessionLimits) -> Result<bool, StoreError> {
        match self.run(&self.close, limits, &[key.as_bytes()])? {
            Value::Int(n) => Ok(n == 1),
            _ => Err(unexpected("close")),
        }
    }

    fn context(&self, digest: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let key = format!("{PREFIX}ctx:{digest}");
        self.redis.with(|c| redis::cmd("GET").arg(&key).query::<Option<Vec<u8>>>(c))
    }

    fn stats(&self, limits: &SessionLimits) -> Result<SessionStats, StoreError> {
        let Value::Array(v) = self.run(&self.stats, limits, &[])? else { return Err(unexpected("stats")) };
        let n = |i: usize| match v.get(i) {
            Some(Value::Int(x)) => u64::try_from(*x).unwrap_or(0),
            _ => 0,
        };
        Ok(SessionStats { live: n(0), bytes: n(1), evicted: n(2), expired: n(3) })
    }

    fn ping(&self) -> Result<(), StoreError> {
        self.redis.ping()
    }
}
