//! The Lua scripts of the A2A task store ([`super::RedisTasks`]): each
//! operation is one script, run atomically by Redis after the shared
//! [`PRELUDE`] (the bounds, the clock and the bookkeeping; the keys are in
//! the module docs of [`super`]).

/// Shared by every script: the bounds, the clock, and the bookkeeping.
/// ARGV 1..9: prefix, idle ms, max tasks, max bytes, tasks per owner,
/// bytes per owner, a task's and a context's fixed bytes, the idle ms of a
/// task waiting for its context.
pub(super) const PRELUDE: &str = r#"
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
-- oldest terminal one; never keep (the task being continued)
local function oldest(o, keep)
  for _, z in ipairs({'ow:', 'ot:'}) do
    for _, id in ipairs(redis.call('ZRANGE', p .. z .. o, 0, 1)) do
      if id ~= keep then return id end
    end
  end
  return nil
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
local function largest(z, keep)
  for _, o in ipairs(redis.call('ZREVRANGE', p .. z, 0, -1)) do
    local v = oldest(o, keep)
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
-- room for n more tasks and b more bytes of owner o: waiting and terminal
-- tasks (never keep) give way, or the refusal {'full', own, unit, ms until
-- a task expires}
local function room(o, n, b, keep)
  local swept = false
  while true do
    local mn = tonumber(redis.call('ZSCORE', p .. 'on', o) or '0')
    local mb = tonumber(redis.call('ZSCORE', p .. 'obz', o) or '0')
    local victim, own, unit
    if mn + n > share_n then
      own, unit, victim = 1, 'tasks', oldest(o, keep)
    elseif mb + b > share_b then
      own, unit, victim = 1, 'bytes', oldest(o, keep)
    elseif redis.call('ZCARD', p .. 'exp') + n > max_n then
      own, unit, victim = 0, 'tasks', largest('on', keep)
    elseif tonumber(redis.call('GET', p .. 'bytes') or '0') + b > max_b then
      own, unit, victim = 0, 'bytes', largest('obz', keep)
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
pub(super) const CREATE: &str = r#"
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
pub(super) const GET: &str = r#"
local o, id = ARGV[10], ARGV[11]
if not mine(id, o) then return 'nf' end
if ARGV[13] == '1' and terminal(id, o) then
  return {'term', redis.call('HGET', p .. 't:' .. id, 'st')}
end
return {'ok', read(id, tonumber(ARGV[12]), true)}
"#;

/// ARGV 10..: owner, id, message, state, timestamp, updated µs, history
/// limit, terminal ('1'), operation id.
pub(super) const CONTINUE: &str = r#"
sweep()
local o, id, msg = ARGV[10], ARGV[11], ARGV[12]
if not mine(id, o) then return 'nf' end
-- the same call run twice (its reply lost) finds its own write
if redis.call('HGET', p .. 't:' .. id, 'op') == ARGV[18] then return {'ok', read(id, -1, true)} end
local r = room(o, 0, #msg + 16, id)
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
pub(super) const UPDATE: &str = r#"
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
pub(super) const TAKE_BACK: &str = r#"
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
pub(super) const SESSION: &str = r#"
local k = ck(ARGV[10], ARGV[11])
if not live('cx', k) then return 'none' end
local s = redis.call('HMGET', p .. k, 'sid', 'tok')
return {s[1] or '', s[2] or ''}
"#;

/// ARGV 10..: owner, context, session id, token: the session it replaces,
/// or 'none' when the context is not held.
pub(super) const SET_SESSION: &str = r#"
local k = ck(ARGV[10], ARGV[11])
if not live('cx', k) then return 'none' end
local s = redis.call('HMGET', p .. k, 'sid', 'tok')
redis.call('HSET', p .. k, 'sid', ARGV[12], 'tok', ARGV[13])
redis.call('PEXPIRE', p .. k, keep)
recount_context(k)
return {s[1] or '', s[2] or ''}
"#;

/// ARGV 10..: owner, context, session id: forgets that session (not a newer one).
pub(super) const CLEAR_SESSION: &str = r#"
local k = ck(ARGV[10], ARGV[11])
if redis.call('HGET', p .. k, 'sid') ~= ARGV[12] then return 0 end
redis.call('HDEL', p .. k, 'sid', 'tok')
if live('cx', k) then recount_context(k) end
return 1
"#;

/// ARGV 10..: owner, context ('' for any), state ('' for any), updated
/// after ms ('' for any), offset, size, history, artifacts ('1'): the
/// count and the page, most recently updated first.
pub(super) const LIST: &str = r#"
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
pub(super) const COUNT: &str = r#"
sweep()
return {redis.call('ZCARD', p .. 'exp'), tonumber(redis.call('GET', p .. 'bytes') or '0')}
"#;
