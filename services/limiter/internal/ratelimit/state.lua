-- state.lua: how an algorithm's state in Redis reads at `now` (Unix ms),
-- and when a sliding window counter has room again. The engine puts this
-- in front of decide.lua and lease.lua, so a decision and a lease read the
-- same state the same way.

local ceil, floor, max, min = math.ceil, math.floor, math.max, math.min

-- A rule's state key keeps its name when the rule's algorithm changes, so it
-- may still hold an earlier algorithm's state: a sliding log's sorted set
-- where a hash is expected or the other way round, or another algorithm's
-- hash, whose fields may share names with this one's (`ts`, `w`). Such
-- state reads as none, so the new algorithm starts afresh, and the key is
-- marked: replace deletes it before the first write, stale fields with it.
-- Every hash state carries its algorithm in field `a` (hashes written
-- before it existed have none and are taken as the rule's own).
local retyped = {}

-- read runs a reading command on key and answers `none` if the key holds
-- the other Redis type. Any other error is raised as redis.call raises it.
local function read(none, cmd, key, ...)
  local r = redis.pcall(cmd, key, ...)
  if type(r) == 'table' and r.err then
    if string.sub(r.err, 1, 9) ~= 'WRONGTYPE' then error(r) end
    retyped[key] = true
    return none
  end
  return r
end

-- hread returns the named fields of algorithm algo's hash state at key
-- (false where absent), or nothing if the key holds another algorithm's.
local function hread(key, algo, ...)
  local s = read(nil, 'HMGET', key, 'a', ...)
  if not s then return end
  local a = tonumber(s[1])
  if a and a ~= algo then
    retyped[key] = true
    return
  end
  return unpack(s, 2, select('#', ...) + 1)
end

local function replace(key)
  if retyped[key] then
    redis.call('DEL', key)
    retyped[key] = nil
  end
end

-- log_range adds (cmd ZADD, at score) or removes (ZREM, score nil) the
-- sliding log members "<prefix>:<first>" .. "<prefix>:<last>", 500 to a
-- command: a call per member cost twice the time of the whole insert.
-- With flag (ZADD's 'XX'), it only rescores members still there, on a key
-- that may hold another type.
local function log_range(cmd, key, score, prefix, first, last, flag)
  for j = first, last, 500 do
    local args = {}
    for k = j, min(last, j + 499) do
      if score then args[#args + 1] = score end
      args[#args + 1] = prefix .. ':' .. k
    end
    if flag then
      read(0, cmd, key, flag, unpack(args))
    elseif score then
      redis.call(cmd, key, unpack(args))
    else
      read(0, cmd, key, unpack(args))
    end
  end
end

-- Token bucket {tokens, ts, b}: the tokens at now, refilled at rate per ms up
-- to burst (which also clamps a bucket whose plan shrank).
local function bucket_tokens(key, rate, burst, now)
  local t, ts = hread(key, 4, 'tokens', 'ts')
  local tokens = tonumber(t) or burst
  ts = tonumber(ts) or now
  if ts > now then ts = now end
  return min(burst, tokens + (now - ts) * rate)
end

-- Leaky bucket {level, ts}: the level at now, drained at rate per ms.
local function bucket_level(key, rate, now)
  local l, ts = hread(key, 5, 'level', 'ts')
  local level = tonumber(l) or 0
  ts = tonumber(ts) or now
  if ts > now then ts = now end
  return max(0, level - (now - ts) * rate)
end

-- current_window is the index of the window now falls in, or the stored
-- window sw when that is later: Redis TIME steps back when a slot fails
-- over to a node whose clock is behind (or NTP steps it), and a window
-- already counted in must not start afresh, which would admit its limit
-- again within milliseconds. The buckets hold the same way (ts > now).
local function current_window(sw, window, now)
  local w = floor(now / window)
  sw = tonumber(sw)
  if sw and sw > w then return sw end
  return w
end

-- Sliding window counter {w, cur, prev}: the current window's index, its
-- count, the previous window's, the ms elapsed in the current window, and
-- the estimate prev x (share of the previous window still inside the last
-- `window` ms) + cur.
local function counter_state(key, window, now)
  local sw, c, p = hread(key, 3, 'w', 'cur', 'prev')
  local w = current_window(sw, window, now)
  sw = tonumber(sw)
  local cur, prev = 0, 0
  if sw == w then
    cur, prev = tonumber(c) or 0, tonumber(p) or 0
  elseif sw == w - 1 then
    prev = tonumber(c) or 0
  end
  local elapsed = max(0, now - w * window)
  return w, cur, prev, elapsed, prev * (1 - elapsed / window) + cur
end

-- counter_retry is the ms until a sliding window counter's estimate falls
-- below room (room > 0, est >= room).
local function counter_retry(est, room, cur, prev, elapsed, window)
  local t = -1
  if prev > 0 then
    -- The estimate falls by prev/window per ms until this window ends.
    local dt = floor((est - room) * window / prev) + 1
    if elapsed + dt < window then t = dt end
  end
  if t < 0 then
    -- Next window: prev' = cur, cur' = 0, so est' = cur x (1 - e'/window).
    local left = window - elapsed
    if cur < room then
      t = left
    else
      t = left + floor(window * (1 - room / cur)) + 1
    end
  end
  return t
end

