-- state.lua: how an algorithm's state in Redis reads at `now` (Unix ms),
-- and when a sliding window counter has room again. The engine puts this
-- in front of decide.lua and lease.lua, so a decision and a lease read the
-- same state the same way.

local ceil, floor, max, min = math.ceil, math.floor, math.max, math.min

-- A rule's state key keeps its name when the rule's algorithm changes, so it
-- may still hold the old algorithm's state, of another Redis type (a sliding
-- log is a sorted set, every other algorithm's state a hash). read runs a
-- command on key and answers `none` if the key holds the other type, which
-- then reads as no state: the new algorithm starts afresh, as it does over
-- another algorithm's hash fields. replace deletes such a key before the
-- first write to it. Any other error is raised as redis.call raises it.
local retyped = {}

local function read(none, cmd, key, ...)
  local r = redis.pcall(cmd, key, ...)
  if type(r) == 'table' and r.err then
    if string.sub(r.err, 1, 9) ~= 'WRONGTYPE' then error(r) end
    retyped[key] = true
    return none
  end
  return r
end

local function replace(key)
  if retyped[key] then
    redis.call('DEL', key)
    retyped[key] = nil
  end
end

-- Token bucket {tokens, ts}: the tokens at now, refilled at rate per ms up
-- to burst (which also clamps a bucket whose plan shrank).
local function bucket_tokens(key, rate, burst, now)
  local s = read({}, 'HMGET', key, 'tokens', 'ts')
  local tokens = tonumber(s[1]) or burst
  local ts = tonumber(s[2]) or now
  if ts > now then ts = now end
  return min(burst, tokens + (now - ts) * rate)
end

-- Leaky bucket {level, ts}: the level at now, drained at rate per ms.
local function bucket_level(key, rate, now)
  local s = read({}, 'HMGET', key, 'level', 'ts')
  local level = tonumber(s[1]) or 0
  local ts = tonumber(s[2]) or now
  if ts > now then ts = now end
  return max(0, level - (now - ts) * rate)
end

-- Sliding window counter {w, cur, prev}: the current window's index, its
-- count, the previous window's, the ms elapsed in the current window, and
-- the estimate prev x (share of the previous window still inside the last
-- `window` ms) + cur.
local function counter_state(key, window, now)
  local w = floor(now / window)
  local s = read({}, 'HMGET', key, 'w', 'cur', 'prev')
  local sw = tonumber(s[1])
  local cur, prev = 0, 0
  if sw == w then
    cur, prev = tonumber(s[2]) or 0, tonumber(s[3]) or 0
  elseif sw == w - 1 then
    prev = tonumber(s[2]) or 0
  end
  local elapsed = now - w * window
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

