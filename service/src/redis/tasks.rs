//! A2A tasks and contexts in Redis (`scd serve --state`): every replica
//! started with the same store serves every task, and a subscriber on one
//! replica sees the updates another makes.
//!
//! This module knows strings, not A2A types: messages, artifacts and
//! statuses arrive as the JSON the A2A layer wrote and leave as it is.
//! Each operation is one Lua script, atomic on the server, enforcing the
//! bounds the in-memory store enforces (see `a2a::store`): a task count
//! and a byte sum, both global and per owner, tasks waiting for their
//! context and then terminal tasks giving way (the owner's oldest, or in a
//! full store the largest owner's), a waiting task's shorter idle time, a refusal
//! telling when the first task expires, and the idle time. Keys, under
//! `scd:v1:a2a:`:
//!
//! | key | holds |
//! |---|---|
//! | `t:<id>` | hash: context, state, timestamp, status message, updated (µs), order |
//! | `h:<id>`, `a:<id>` | lists: the history and the artifacts, as JSON |
//! | `exp` | sorted set: every live task by its last update (Redis `TIME`, ms) |
//! | `to`, `tc`, `tb` | hashes: each task's owner, context and bytes |
//! | `o:<owner>`, `ot:<owner>`, `ow:<owner>` | sorted sets: the owner's tasks, its terminal ones and its waiting ones, by order |
//! | `on`, `obz` | sorted sets: tasks and bytes per owner |
//! | `c:<len>:<owner><context>` | hash: the context's SCD session id and token |
//! | `cx`, `cs:<owner>`, `ocs` | contexts by last use, the owner's by last use, contexts per owner |
//! | `ctn`, `cb` | hashes: tasks per context, each context's bytes |
//! | `bytes`, `seq` | the byte sum (tasks and contexts), the order counter |
//! | `ev:<id>` | the Pub/Sub channel of a task's events |
//!
//! Bookkeeping hashes and sets hold one entry per live task, context or
//! owner; a script that meets an idle entry drops it, and a task's own
//! keys expire on their own a minute after its idle time.
//!
//! The store holds each context's SCD session token, as the in-memory
//! store does: Redis must be reachable only by the replicas
//! (`docs/deploy/`).

use std::sync::{Arc, Weak};
use std::time::Duration;

use redis::{Script, Value};
use scd_engine::shared::StoreError;

use super::Redis;

/// Every key's prefix: a new layout gets a new version.
const PREFIX: &str = "scd:v1:a2a:";

/// Shared by every script: the bounds, the clock, and the bookkeeping.
/// ARGV 1..9: prefix, idle ms, max tasks, max bytes, tasks per owner,
/// bytes per owner, a task's and a context's fixed bytes, the idle ms of a
/// task waiting for its context.
const PRELUDE: &str = r#"
local p = ARGV[1]
local ttl = tonumber(ARGV[2])
local max_n, max_b = tonumber(ARGV[3]), tonumber(ARGV[4])
local share_n, share_b = tonumber(ARGV[5]), tonumber(ARGV[6])
local TB, CB = tonumber(ARGV[7]), tonumber(ARGV[8])
local wttl = math.min(ttl, tonumber(ARGV[9]))
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local keep = ttl + 60000
local function ck(o, c) return 'c:' .. #o .. ':' .. o .. c end
local function split(k)
  local n, rest = string.match(k, '^c:(%d+):(.*)$')
  n = tonumber(n)
  return string.sub(rest, 1, n), string.sub(rest, n + 1)
end
local function zdec(z, m, by)
  if tonumber(redis.call('ZINCRBY', p .. z, -by, m)) <= 0 then redis.call('ZREM', p .. z, m) end
end
local function live(z, m)
  local s = redis.call('ZSCORE', p .. z, m)
  return s and now - tonumber(s) < ttl
end
local function drop_context(k)
  local o, c = split(k)
  local b = tonumber(redis.call('HGET', p .. 'cb', k) or '0')
  redis.call('HDEL', p .. 'cb', k)
  redis.call('DECRBY', p .. 'bytes', b)
  redis.call('DEL', p .. k)
  redis.call('ZREM', p .. 'cs:' .. o, c)
  redis.call('ZREM', p .. 'cx', k)
  zdec('ocs', o, 1)
end
local function drop_task(id)
  local o = redis.call('HGET', p .. 'to', id)
  local c = redis.call('HGET', p .. 'tc', id)
  local b = tonumber(redis.call('HGET', p .. 'tb', id) or '0')
  redis.call('HDEL', p .. 'to', id)
  redis.call('HDEL', p .. 'tc', id)
  redis.call('HDEL', p .. 'tb', id)
  redis.call('DEL', p .. 't:' .. id, p .. 'h:' .. id, p .. 'a:' .. id)
  redis.call('ZREM', p .. 'exp', id)
  redis.call('DECRBY', p .. 'bytes', b)
  if o then
    redis.call('ZREM', p .. 'o:' .. o, id)
    redis.call('ZREM', p .. 'ot:' .. o, id)
    redis.call('ZREM', p .. 'ow:' .. o, id)
    zdec('on', o, 1)
    zdec('obz', o, b)
    if c then
      local k = ck(o, c)
      if tonumber(redis.call('HINCRBY', p .. 'ctn', k, -1)) <= 0 then redis.call('HDEL', p .. 'ctn', k) end
    end
  end
end
local function sweep()
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', p .. 'exp', '-inf', now - ttl, 'LIMIT', 0, 64)) do drop_task(id) end
  for _, k in ipairs(redis.call('ZRANGEBYSCORE', p .. 'cx', '-inf', now - ttl, 'LIMIT', 0, 64)) do drop_context(k) end
end
-- every expired task, before a refusal: counts are of live tasks only
local function sweep_all()
  repeat
    local old = redis.call('ZRANGEBYSCORE', p .. 'exp', '-inf', now - ttl, 'LIMIT', 0, 256)
    for _, id in ipairs(old) do drop_task(id) end
  until #old == 0
end
-- the task of o that gives way first: its oldest waiting one, else its
-- oldest terminal one
local function oldest(o)
  return redis.call('ZRANGE', p .. 'ow:' .. o, 0, 0)[1] or redis.call('ZRANGE', p .. 'ot:' .. o, 0, 0)[1]
end
-- whether a task in state st with status message m waits for its context
local function waits(st, m) return st == 'TASK_STATE_WORKING' and m ~= '' end
-- a task touched now: a waiting one is stamped as if touched ttl - wttl
-- earlier, so that every reading of 'exp' sees it idle after wttl
local function stamp(id, o, q, w)
  if w then
    redis.call('ZADD', p .. 'exp', now - (ttl - wttl), id)
    redis.call('ZADD', p .. 'ow:' .. o, q, id)
  else
    redis.call('ZADD', p .. 'exp', now, id)
    redis.call('ZREM', p .. 'ow:' .. o, id)
  end
end
local function largest(z)
  for _, o in ipairs(redis.call('ZREVRANGE', p .. z, 0, -1)) do
    local v = oldest(o)
    if v then return v end
  end
  return nil
end
local function first_expiry(o)
  if o then
    local best = nil
    for _, id in ipairs(redis.call('ZRANGE', p .. 'o:' .. o, 0, -1)) do
      local s = tonumber(redis.call('ZSCORE', p .. 'exp', id) or now)
      if not best or s < best then best = s end
    end
    return best
  end
  local r = redis.call('ZRANGE', p .. 'exp', 0, 0, 'WITHSCORES')
  return r[2] and tonumber(r[2])
end
-- room for n more tasks and b more bytes of owner o: terminal tasks give
-- way, or the refusal {'full', own, unit, ms until a task expires}
local function room(o, n, b)
  local swept = false
  while true do
    local mn = tonumber(redis.call('ZSCORE', p .. 'on', o) or '0')
    local mb = tonumber(redis.call('ZSCORE', p .. 'obz', o) or '0')
    local victim, own, unit
    if mn + n > share_n then
      own, unit, victim = 1, 'tasks', oldest(o)
    elseif mb + b > share_b then
      own, unit, victim = 1, 'bytes', oldest(o)
    elseif redis.call('ZCARD', p .. 'exp') + n > max_n then
      own, unit, victim = 0, 'tasks', largest('on')
    elseif tonumber(redis.call('GET', p .. 'bytes') or '0') + b > max_b then
      own, unit, victim = 0, 'bytes', largest('obz')
    else
      return nil
    end
    if not swept then
      swept = true
      sweep_all()
    elseif victim then
      drop_task(victim)
    else
      local first = first_expiry(own == 1 and o or nil)
      local left = ttl
      if first then left = math.max(first + ttl - now, 0) end
      return {'full', own, unit, left}
    end
  end
end
local function oldest_idle(o)
  for _, c in ipairs(redis.call('ZRANGE', p .. 'cs:' .. o, 0, -1)) do
    local k = ck(o, c)
    if redis.call('HEXISTS', p .. 'ctn', k) == 0 then return k end
  end
  return nil
end
-- room for a new context of o: one of its contexts holding no task gives
-- way at its share, else one of the largest owner's in a full store
local function context_room(o)
  local v = nil
  if tonumber(redis.call('ZSCORE', p .. 'ocs', o) or '0') >= share_n then
    v = oldest_idle(o)
  elseif redis.call('ZCARD', p .. 'cx') >= max_n then
    for _, x in ipairs(redis.call('ZREVRANGE', p .. 'ocs', 0, -1)) do
      v = oldest_idle(x)
      if v then break end
    end
  end
  if v then drop_context(v) end
end
local function recount_context(k)
  local o, c = split(k)
  local s = redis.call('HMGET', p .. k, 'sid', 'tok')
  local b = CB + #o + #c + #(s[1] or '') + #(s[2] or '')
  local old = tonumber(redis.call('HGET', p .. 'cb', k) or '0')
  redis.call('HSET', p .. 'cb', k, b)
  redis.call('INCRBY', p .. 'bytes', b - old)
end
local function touch_context(o, c)
  local k = ck(o, c)
  redis.call('ZADD', p .. 'cx', now, k)
  redis.call('ZADD', p .. 'cs:' .. o, now, c)
  redis.call('PEXPIRE', p .. k, keep)
  redis.call('PEXPIRE', p .. 'cs:' .. o, keep)
end
local function keepalive(id, o)
  for _, k in ipairs({'t:' .. id, 'h:' .. id, 'a:' .. id, 'o:' .. o, 'ot:' .. o, 'ow:' .. o}) do
    redis.call('PEXPIRE', p .. k, keep)
  end
end
local function sum(list)
  local b = 0
  for _, s in ipairs(list) do b = b + #s + 16 end
  return b
end
local function recount(id, o)
  local f = redis.call('HMGET', p .. 't:' .. id, 'c', 'ts', 'm')
  local b = TB + 2 * #id + #f[1] + #o + #f[2] + #(f[3] or '')
    + sum(redis.call('LRANGE', p .. 'h:' .. id, 0, -1)) + sum(redis.call('LRANGE', p .. 'a:' .. id, 0, -1))
  local old = tonumber(redis.call('HGET', p .. 'tb', id) or '0')
  redis.call('HSET', p .. 'tb', id, b)
  redis.call('INCRBY', p .. 'bytes', b - old)
  redis.call('ZINCRBY', p .. 'obz', b - old, o)
end
local function terminal(id, o) return redis.call('ZSCORE', p .. 'ot:' .. o, id) ~= false end
local function set_state(id, o, st, ts, u, m, term)
  local q = redis.call('INCR', p .. 'seq')
  redis.call('HSET', p .. 't:' .. id, 'st', st, 'ts', ts, 'm', m, 'u', u, 'q', q)
  if m ~= '' then redis.call('RPUSH', p .. 'h:' .. id, m) end
  redis.call('ZADD', p .. 'o:' .. o, q, id)
  stamp(id, o, q, waits(st, m))
  if term == '1' then redis.call('ZADD', p .. 'ot:' .. o, q, id) end
  redis.call('PUBLISH', p .. 'ev:' .. id, 's' .. st .. '\n' .. ts .. '\n' .. m)
  keepalive(id, o)
end
-- the task: id, context, state, timestamp, status message, updated µs,
-- the last `hist` messages (all when negative), the artifacts when `arts`
local function read(id, hist, arts)
  local f = redis.call('HMGET', p .. 't:' .. id, 'c', 'st', 'ts', 'm', 'u')
  local h = {}
  if hist < 0 then
    h = redis.call('LRANGE', p .. 'h:' .. id, 0, -1)
  elseif hist > 0 then
    h = redis.call('LRANGE', p .. 'h:' .. id, -hist, -1)
  end
  local a = {}
  if arts then a = redis.call('LRANGE', p .. 'a:' .. id, 0, -1) end
  return {id, f[1] or '', f[2] or '', f[3] or '', f[4] or '', f[5] or '0', h, a}
end
local function mine(id, o) return live('exp', id) and redis.call('HGET', p .. 'to', id) == o end
"#;

/// ARGV 10..: owner, context, id, first message, state, timestamp, updated
/// µs, terminal ('1').
const CREATE: &str = r#"
sweep()
local o, c, id = ARGV[10], ARGV[11], ARGV[12]
-- the same create run twice (its reply lost) finds its task
if redis.call('HGET', p .. 'to', id) == o then return {'ok'} end
local k = ck(o, c)
-- an idle context not swept yet is gone, with its session
if redis.call('ZSCORE', p .. 'cx', k) and not live('cx', k) then drop_context(k) end
local new = not redis.call('ZSCORE', p .. 'cx', k)
local cb = 0
if new then cb = CB + #o + #c end
local r = room(o, 1, TB + 2 * #id + #c + #o + #ARGV[15] + #ARGV[13] + 16 + cb)
if r then return r end
if new then
  context_room(o)
  redis.call('ZINCRBY', p .. 'ocs', 1, o)
end
touch_context(o, c)
if new then recount_context(k) end
redis.call('HINCRBY', p .. 'ctn', k, 1)
local q = redis.call('INCR', p .. 'seq')
redis.call('HSET', p .. 't:' .. id, 'c', c, 'st', ARGV[14], 'ts', ARGV[15], 'm', '', 'u', ARGV[16], 'q', q)
redis.call('RPUSH', p .. 'h:' .. id, ARGV[13])
redis.call('HSET', p .. 'to', id, o)
redis.call('HSET', p .. 'tc', id, c)
redis.call('ZADD', p .. 'exp', now, id)
redis.call('ZADD', p .. 'o:' .. o, q, id)
redis.call('ZINCRBY', p .. 'on', 1, o)
if ARGV[17] == '1' then redis.call('ZADD', p .. 'ot:' .. o, q, id) end
recount(id, o)
keepalive(id, o)
return {'ok'}
"#;

/// ARGV 10..: owner, id, messages of history (-1: all), refuse a terminal
/// task ('1').
const GET: &str = r#"
local o, id = ARGV[10], ARGV[11]
if not mine(id, o) then return 'nf' end
if ARGV[13] == '1' and terminal(id, o) then
  return {'term', redis.call('HGET', p .. 't:' .. id, 'st')}
end
return {'ok', read(id, tonumber(ARGV[12]), true)}
"#;

/// ARGV 10..: owner, id, message, state, timestamp, updated µs, history
/// limit, terminal ('1'), operation id.
const CONTINUE: &str = r#"
sweep()
local o, id, msg = ARGV[10], ARGV[11], ARGV[12]
if not mine(id, o) then return 'nf' end
-- the same call run twice (its reply lost) finds its own write
if redis.call('HGET', p .. 't:' .. id, 'op') == ARGV[18] then return {'ok', read(id, -1, true)} end
local r = room(o, 0, #msg + 16)
if r then return r end
if not mine(id, o) then return 'nf' end
if terminal(id, o) then return {'term', redis.call('HGET', p .. 't:' .. id, 'st')} end
local n = redis.call('LLEN', p .. 'h:' .. id)
if n + 2 > tonumber(ARGV[16]) then return {'hist', n} end
redis.call('RPUSH', p .. 'h:' .. id, msg)
set_state(id, o, ARGV[13], ARGV[14], ARGV[15], '', ARGV[17])
redis.call('HSET', p .. 't:' .. id, 'op', ARGV[18])
local c = redis.call('HGET', p .. 'tc', id)
if live('cx', ck(o, c)) then touch_context(o, c) end
recount(id, o)
return {'ok', read(id, -1, true)}
"#;

/// ARGV 10..: id, state, timestamp, updated µs, status message ('' for
/// none), artifact ('' for none), terminal ('1'), owner ('' for any),
/// operation id.
const UPDATE: &str = r#"
local id = ARGV[10]
local o = redis.call('HGET', p .. 'to', id)
if not o or not live('exp', id) or (ARGV[17] ~= '' and ARGV[17] ~= o) then return 'nf' end
if redis.call('HGET', p .. 't:' .. id, 'op') == ARGV[18] then return {'ok', read(id, -1, true)} end
if terminal(id, o) then return {'term', redis.call('HGET', p .. 't:' .. id, 'st')} end
if ARGV[15] ~= '' then
  redis.call('RPUSH', p .. 'a:' .. id, ARGV[15])
  redis.call('PUBLISH', p .. 'ev:' .. id, 'a' .. ARGV[15])
end
set_state(id, o, ARGV[11], ARGV[12], ARGV[13], ARGV[14], ARGV[16])
redis.call('HSET', p .. 't:' .. id, 'op', ARGV[18])
recount(id, o)
return {'ok', read(id, -1, true)}
"#;

/// ARGV 10..: id, take the task back whole ('1') or return it to the
/// previous status: state, timestamp, status message; operation id.
const TAKE_BACK: &str = r#"
local id = ARGV[10]
local o = redis.call('HGET', p .. 'to', id)
if not o or not live('exp', id) or terminal(id, o) then return 0 end
if redis.call('HGET', p .. 't:' .. id, 'op') == ARGV[15] then return 0 end
if ARGV[11] == '1' then
  drop_task(id)
  return 1
end
redis.call('RPOP', p .. 'h:' .. id)
local q = redis.call('INCR', p .. 'seq')
redis.call('HSET', p .. 't:' .. id, 'st', ARGV[12], 'ts', ARGV[13], 'm', ARGV[14], 'q', q, 'op', ARGV[15])
redis.call('ZADD', p .. 'o:' .. o, q, id)
stamp(id, o, q, waits(ARGV[12], ARGV[14]))
keepalive(id, o)
redis.call('PUBLISH', p .. 'ev:' .. id, 's' .. ARGV[12] .. '\n' .. ARGV[13] .. '\n' .. ARGV[14])
recount(id, o)
return 1
"#;

/// ARGV 10..: owner, context: the context's session id and token ('' when
/// none), or 'none' when the context is not held.
const SESSION: &str = r#"
local k = ck(ARGV[10], ARGV[11])
if not live('cx', k) then return 'none' end
local s = redis.call('HMGET', p .. k, 'sid', 'tok')
return {s[1] or '', s[2] or ''}
"#;

/// ARGV 10..: owner, context, session id, token: the session it replaces,
/// or 'none' when the context is not held.
const SET_SESSION: &str = r#"
local k = ck(ARGV[10], ARGV[11])
if not live('cx', k) then return 'none' end
local s = redis.call('HMGET', p .. k, 'sid', 'tok')
redis.call('HSET', p .. k, 'sid', ARGV[12], 'tok', ARGV[13])
redis.call('PEXPIRE', p .. k, keep)
recount_context(k)
return {s[1] or '', s[2] or ''}
"#;

/// ARGV 10..: owner, context, session id: forgets that session (not a newer one).
const CLEAR_SESSION: &str = r#"
local k = ck(ARGV[10], ARGV[11])
if redis.call('HGET', p .. k, 'sid') ~= ARGV[12] then return 0 end
redis.call('HDEL', p .. k, 'sid', 'tok')
if live('cx', k) then recount_context(k) end
return 1
"#;

/// ARGV 10..: owner, context ('' for any), state ('' for any), updated
/// after ms ('' for any), offset, size, history, artifacts ('1'): the
/// count and the page, most recently updated first.
const LIST: &str = r#"
sweep()
local o, cf, sf, af = ARGV[10], ARGV[11], ARGV[12], ARGV[13]
local off, size, hist, arts = tonumber(ARGV[14]), tonumber(ARGV[15]), tonumber(ARGV[16]), ARGV[17] == '1'
local total, out = 0, {}
for _, id in ipairs(redis.call('ZREVRANGE', p .. 'o:' .. o, 0, -1)) do
  if live('exp', id) then
    local f = redis.call('HMGET', p .. 't:' .. id, 'c', 'st', 'u')
    if (cf == '' or f[1] == cf) and (sf == '' or f[2] == sf) and (af == '' or tonumber(f[3] or '0') > tonumber(af)) then
      total = total + 1
      if total > off and #out < size then out[#out + 1] = read(id, hist, arts) end
    end
  end
end
return {total, out}
"#;

/// Tasks held and the bytes counted.
const COUNT: &str = r#"
sweep()
return {redis.call('ZCARD', p .. 'exp'), tonumber(redis.call('GET', p .. 'bytes') or '0')}
"#;

/// The bounds a script enforces (the A2A store's limits).
#[derive(Debug, Clone, Copy)]
pub struct Bounds {
    /// Idle time of a task or context.
    pub ttl: Duration,
    /// Tasks, and contexts, held at once.
    pub max_tasks: usize,
    /// Bytes of tasks and contexts together.
    pub max_bytes: usize,
    /// Tasks (and contexts) of one owner.
    pub tasks_per_owner: usize,
    /// Bytes of one owner's tasks.
    pub bytes_per_owner: usize,
    /// What a task is counted as beside its strings.
    pub task_bytes: usize,
    /// What a context is counted as beside its strings.
    pub context_bytes: usize,
    /// Idle time of a task waiting for its context (at most `ttl`).
    pub waiting_ttl: Duration,
}

/// A task as held: its strings, the JSON as the A2A layer wrote it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawTask {
    /// The task id.
    pub id: String,
    /// Its context id.
    pub context_id: String,
    /// Its state's name.
    pub state: String,
    /// Its status timestamp.
    pub timestamp: String,
    /// Its status message (JSON), if any.
    pub message: Option<String>,
    /// When it was last updated, µs since the Unix epoch.
    pub updated_us: u64,
    /// Its history (JSON messages), or the part asked for.
    pub history: Vec<String>,
    /// Its artifacts (JSON), when asked for.
    pub artifacts: Vec<String>,
}

/// Why a script did not do what it was asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// No such task of this owner (or it expired).
    NotFound,
    /// The task is terminal, in this state.
    Terminal(String),
    /// The task's history holds this many messages.
    History(usize),
    /// The store, or the owner's share (`own`), is full of live tasks;
    /// `unit` is `tasks` or `bytes`; the first task expires in `retry_ms`.
    Full {
        /// The owner's share, not the whole store.
        own: bool,
        /// What is full.
        unit: &'static str,
        /// Milliseconds until the first task expires.
        retry_ms: u64,
    },
}

/// What an operation answers: done, or refused.
pub type Reply<T> = Result<T, Refusal>;

/// An event of a task, as published.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RawEvent {
    /// A new status: state, timestamp, message (JSON, '' for none).
    Status(String, String, String),
    /// A new artifact (JSON) of the task.
    Artifact(String),
}

/// What [`RedisTasks::listen`] hears.
#[derive(Debug)]
pub enum Heard<'a> {
    /// Subscribed (again): events may have been missed meanwhile, every
    /// stream should read its task again.
    Subscribed,
    /// The subscription broke (or stopped answering); resubscribing.
    Lost,
    /// A task's event.
    Event(&'a str, RawEvent),
}

/// Receives what [`RedisTasks::listen`] hears.
pub type Listener = dyn Fn(Heard<'_>) + Send + Sync;

/// Quiet seconds on the subscription before it is pinged: a connection
/// that died without a word (half-open) is noticed within twice this.
const PING_AFTER_S: u32 = 5;

/// A2A tasks and contexts in Redis (see the module docs).
pub struct RedisTasks {
    redis: Redis,
    create: Script,
    get: Script,
    continue_: Script,
    update: Script,
    take_back: Script,
    session: Script,
    set_session: Script,
    clear_session: Script,
    list: Script,
    count: Script,
}

impl std::fmt::Debug for RedisTasks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisTasks").field("store", &self.redis.name()).finish()
    }
}

fn script(body: &str) -> Script {
    Script::new(&format!("{PRELUDE}\n{body}"))
}

fn text(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => String::from_utf8(b.clone()).ok(),
        Value::SimpleString(s) => Some(s.clone()),
        Value::Okay => Some("OK".into()),
        _ => None,
    }
}

fn int(v: &Value) -> Option<u64> {
    match v {
        Value::Int(n) => u64::try_from(*n).ok(),
        v => text(v)?.parse().ok(),
    }
}

fn unexpected(what: &str) -> StoreError {
    StoreError(format!("unexpected reply to the A2A {what} script"))
}

fn texts(v: &Value) -> Option<Vec<String>> {
    match v {
        Value::Array(a) => a.iter().map(text).collect(),
        _ => None,
    }
}

fn raw_task(v: &Value) -> Option<RawTask> {
    let Value::Array(f) = v else { return None };
    let [id, c, st, ts, m, u, h, a] = f.as_slice() else { return None };
    let message = text(m)?;
    Some(RawTask {
        id: text(id)?,
        context_id: text(c)?,
        state: text(st)?,
        timestamp: text(ts)?,
        message: (!message.is_empty()).then_some(message),
        updated_us: int(u)?,
        history: texts(h)?,
        artifacts: texts(a)?,
    })
}

/// A refusal the scripts share, if `v` is one.
fn refusal(v: &Value) -> Option<Refusal> {
    if text(v).as_deref() == Some("nf") {
        return Some(Refusal::NotFound);
    }
    let Value::Array(f) = v else { return None };
    match (f.first().and_then(text).as_deref(), f.get(1)) {
        (Some("term"), Some(st)) => Some(Refusal::Terminal(text(st).unwrap_or_default())),
        (Some("hist"), Some(n)) => Some(Refusal::History(int(n)? as usize)),
        (Some("full"), Some(own)) => Some(Refusal::Full {
            own: int(own)? == 1,
            unit: if f.get(2).and_then(text).as_deref() == Some("bytes") { "bytes" } else { "tasks" },
            retry_ms: int(f.get(3)?)?,
        }),
        _ => None,
    }
}

/// `{'ok', task}` as the task, or a refusal.
fn task_reply(v: &Value, what: &str) -> Result<Reply<RawTask>, StoreError> {
    if let Some(r) = refusal(v) {
        return Ok(Err(r));
    }
    match v {
        Value::Array(f) if f.len() == 2 && text(&f[0]).as_deref() == Some("ok") => {
            raw_task(&f[1]).map(Ok).ok_or_else(|| unexpected(what))
        }
        _ => Err(unexpected(what)),
    }
}

/// A fresh id for one call: a script run twice (its reply lost, the call
/// retried on a new connection) finds it and does not apply twice.
fn op_id() -> String {
    format!("{:032x}", rand::random::<u128>())
}

fn flag(b: bool) -> &'static str {
    if b {
        "1"
    } else {
        "0"
    }
}

impl RedisTasks {
    /// Tasks at `url` (`--state`); nothing is connected until used.
    pub fn open(url: &str) -> Result<Self, super::UrlError> {
        Ok(Self {
            redis: Redis::open("--state", url, Duration::from_secs(2))?,
            create: script(CREATE),
            get: script(GET),
            continue_: script(CONTINUE),
            update: script(UPDATE),
            take_back: script(TAKE_BACK),
            session: script(SESSION),
            set_session: script(SET_SESSION),
            clear_session: script(CLEAR_SESSION),
            list: script(LIST),
            count: script(COUNT),
        })
    }

    /// The store's name (`redis://host:port/db`, no credentials).
    pub fn name(&self) -> &str {
        self.redis.name()
    }

    fn run(&self, s: &Script, b: &Bounds, args: &[&str]) -> Result<Value, StoreError> {
        let head = [
            b.ttl.as_millis().max(1).to_string(),
            b.max_tasks.to_string(),
            b.max_bytes.to_string(),
            b.tasks_per_owner.to_string(),
            b.bytes_per_owner.to_string(),
            b.task_bytes.to_string(),
            b.context_bytes.to_string(),
            b.waiting_ttl.as_millis().max(1).to_string(),
        ];
        self.redis.with(|c| {
            let mut inv = s.prepare_invoke();
            inv.arg(PREFIX);
            for a in &head {
                inv.arg(a.as_str());
            }
            for a in args {
                inv.arg(*a);
            }
            inv.invoke::<Value>(c)
        })
    }

    /// A new task `id` of `owner` in `context` holding `first`.
    #[allow(clippy::too_many_arguments)]
    pub fn create(
        &self,
        b: &Bounds,
        owner: &str,
        context: &str,
        id: &str,
        first: &str,
        state: &str,
        timestamp: &str,
        updated_us: u64,
        terminal: bool,
    ) -> Result<Reply<()>, StoreError> {
        let u = updated_us.to_string();
        let v = self.run(&self.create, b, &[owner, context, id, first, state, timestamp, &u, flag(terminal)])?;
        if let Some(r) = refusal(&v) {
            return Ok(Err(r));
        }
        match texts(&v).as_deref() {
            Some([ok]) if ok == "ok" => Ok(Ok(())),
            _ => Err(unexpected("create")),
        }
    }

    /// `owner`'s task `id` with its last `history` messages (all when
    /// `None`); with `live_only`, a terminal task is refused.
    pub fn get(
        &self,
        b: &Bounds,
        owner: &str,
        id: &str,
        history: Option<usize>,
        live_only: bool,
    ) -> Result<Reply<RawTask>, StoreError> {
        let h = history.map_or("-1".to_string(), |n| n.to_string());
        let v = self.run(&self.get, b, &[owner, id, &h, flag(live_only)])?;
        task_reply(&v, "get")
    }

    /// Adds `message` to `owner`'s live task `id`, which moves to `state`
    /// (published).
    #[allow(clippy::too_many_arguments)]
    pub fn continue_task(
        &self,
        b: &Bounds,
        owner: &str,
        id: &str,
        message: &str,
        state: &str,
        timestamp: &str,
        updated_us: u64,
        max_history: usize,
        terminal: bool,
    ) -> Result<Reply<RawTask>, StoreError> {
        let (u, max, op) = (updated_us.to_string(), max_history.to_string(), op_id());
        let v = self.run(&self.continue_, b, &[owner, id, message, state, timestamp, &u, &max, flag(terminal), &op])?;
        task_reply(&v, "continue")
    }

    /// Moves live task `id` (of `owner`, or of anyone when `None`) to
    /// `state`, with its status message and artifact (JSON, each
    /// published).
    #[allow(clippy::too_many_arguments)]
    pub fn update(
        &self,
        b: &Bounds,
        owner: Option<&str>,
        id: &str,
        state: &str,
        timestamp: &str,
        updated_us: u64,
        message: Option<&str>,
        artifact: Option<&str>,
        terminal: bool,
    ) -> Result<Reply<RawTask>, StoreError> {
        let (u, op) = (updated_us.to_string(), op_id());
        let args = [
            id,
            state,
            timestamp,
            &u,
            message.unwrap_or(""),
            artifact.unwrap_or(""),
            flag(terminal),
            owner.unwrap_or(""),
            &op,
        ];
        let v = self.run(&self.update, b, &args)?;
        task_reply(&v, "update")
    }

    /// Takes back live task `id` whole (`prev` `None`), or its last
    /// message, returning it to `prev`: state, timestamp and status
    /// message ('' for none).
    pub fn take_back(&self, b: &Bounds, id: &str, prev: Option<[&str; 3]>) -> Result<(), StoreError> {
        let op = op_id();
        let args = match prev {
            None => [id, "1", "", "", "", &op],
            Some([st, ts, m]) => [id, "0", st, ts, m, &op],
        };
        self.run(&self.take_back, b, &args).map(drop)
    }

    /// The SCD session (id, token) of `owner`'s context: `None` when the
    /// context is not held, empty strings when it holds none.
    pub fn session(&self, b: &Bounds, owner: &str, context: &str) -> Result<Option<(String, String)>, StoreError> {
        let v = self.run(&self.session, b, &[owner, context])?;
        pair(&v, "session")
    }

    /// Sets the SCD session of `owner`'s context, answering the one it
    /// replaces (as [`Self::session`]).
    pub fn set_session(
        &self,
        b: &Bounds,
        owner: &str,
        context: &str,
        id: &str,
        token: &str,
    ) -> Result<Option<(String, String)>, StoreError> {
        let v = self.run(&self.set_session, b, &[owner, context, id, token])?;
        pair(&v, "set_session")
    }

    /// Forgets session `id` of `owner`'s context (not a newer one).
    pub fn clear_session(&self, b: &Bounds, owner: &str, context: &str, id: &str) -> Result<(), StoreError> {
        self.run(&self.clear_session, b, &[owner, context, id]).map(drop)
    }

    /// How many of `owner`'s tasks match, and the page of them: `filter`
    /// is (context, state, updated after ms), each `None` for any.
    #[allow(clippy::too_many_arguments)]
    pub fn list(
        &self,
        b: &Bounds,
        owner: &str,
        filter: (Option<&str>, Option<&str>, Option<u64>),
        offset: usize,
        size: usize,
        history: usize,
        artifacts: bool,
    ) -> Result<(usize, Vec<RawTask>), StoreError> {
        let after = filter.2.map(|t| t.to_string()).unwrap_or_default();
        let (offset, size, history) = (offset.to_string(), size.to_string(), history.to_string());
        let args =
            [owner, filter.0.unwrap_or(""), filter.1.unwrap_or(""), &after, &offset, &size, &history, flag(artifacts)];
        let v = self.run(&self.list, b, &args)?;
        let Value::Array(f) = &v else { return Err(unexpected("list")) };
        match f.as_slice() {
            [n, Value::Array(tasks)] => {
                let tasks: Option<Vec<RawTask>> = tasks.iter().map(raw_task).collect();
                Ok((int(n).ok_or_else(|| unexpected("list"))? as usize, tasks.ok_or_else(|| unexpected("list"))?))
            }
            _ => Err(unexpected("list")),
        }
    }

    /// Tasks held and the bytes they (and the contexts) are counted as.
    pub fn count(&self, b: &Bounds) -> Result<(usize, usize), StoreError> {
        let v = self.run(&self.count, b, &[])?;
        match &v {
            Value::Array(f) if f.len() == 2 => match (int(&f[0]), int(&f[1])) {
                (Some(n), Some(bytes)) => Ok((n as usize, bytes as usize)),
                _ => Err(unexpected("count")),
            },
            _ => Err(unexpected("count")),
        }
    }

    /// Listens to every task's events on a thread of its own, handing each
    /// to `on`, with [`Heard::Subscribed`] each time the subscription is
    /// made and [`Heard::Lost`] when it breaks. A quiet subscription is
    /// pinged. The thread ends once `alive` can no longer be upgraded (its
    /// owner was dropped).
    pub fn listen<T: Send + Sync + 'static>(self: &Arc<Self>, alive: Weak<T>, on: Box<Listener>) {
        let me = Arc::downgrade(self);
        let pattern = format!("{PREFIX}ev:*");
        let spawned = std::thread::Builder::new().name("a2a-events".into()).spawn(move || {
            let mut down_logged = false;
            while alive.strong_count() > 0 {
                let Some(store) = me.upgrade() else { return };
                match store.redis.subscriber(Duration::from_secs(1)) {
                    Ok(mut con) => {
                        drop(store);
                        let mut ps = con.as_pubsub();
                        if ps.psubscribe(&pattern).is_err() {
                            std::thread::sleep(Duration::from_secs(1));
                            continue;
                        }
                        if down_logged {
                            tracing::info!("A2A events: subscribed to the store again");
                            down_logged = false;
                        }
                        on(Heard::Subscribed);
                        let mut quiet = 0;
                        while alive.strong_count() > 0 {
                            match ps.get_message() {
                                Ok(msg) => {
                                    quiet = 0;
                                    let Some(id) = msg.get_channel_name().strip_prefix(&pattern[..pattern.len() - 1])
                                    else {
                                        continue;
                                    };
                                    let payload: Vec<u8> = msg.get_payload().unwrap_or_default();
                                    let Some(event) = raw_event(&payload) else { continue };
                                    on(Heard::Event(id, event));
                                }
                                Err(e) if e.is_timeout() => {
                                    quiet += 1;
                                    // a pong resets the count; none within as long again is a dead connection
                                    if quiet == PING_AFTER_S && ps.ping::<Value>().is_err() || quiet >= 2 * PING_AFTER_S {
                                        tracing::warn!("A2A events: the store's subscription stopped answering; resubscribing");
                                        down_logged = true;
                                        on(Heard::Lost);
                                        break;
                                    }
                                }
                                Err(e) => {
                                    tracing::warn!(error = %e, "A2A events: the store's subscription broke; resubscribing");
                                    down_logged = true;
                                    on(Heard::Lost);
                                    break;
                                }
                            }
                        }
                    }
                    Err(e) => {
                        drop(store);
                        if !down_logged {
                            tracing::warn!(error = %e, "A2A events: cannot subscribe to the store yet; retrying every second");
                            down_logged = true;
                        }
                        std::thread::sleep(Duration::from_secs(1));
                    }
                }
            }
        });
        if let Err(e) = spawned {
            tracing::error!(error = %e, "A2A events: cannot start the listening thread; streams see no other replica's updates");
        }
    }
}

/// A published event: `s` state `\n` timestamp `\n` message, or `a`
/// artifact.
fn raw_event(payload: &[u8]) -> Option<RawEvent> {
    let text = std::str::from_utf8(payload).ok()?;
    if let Some(a) = text.strip_prefix('a') {
        return Some(RawEvent::Artifact(a.to_string()));
    }
    let mut f = text.strip_prefix('s')?.splitn(3, '\n');
    let (st, ts, m) = (f.next()?, f.next()?, f.next()?);
    Some(RawEvent::Status(st.to_string(), ts.to_string(), m.to_string()))
}

/// `{id, token}` (empty strings: none) or `'none'`.
fn pair(v: &Value, what: &str) -> Result<Option<(String, String)>, StoreError> {
    if text(v).as_deref() == Some("none") {
        return Ok(None);
    }
    match texts(v).as_deref() {
        Some([id, token]) => Ok(Some((id.clone(), token.clone()))),
        _ => Err(unexpected(what)),
    }
}
