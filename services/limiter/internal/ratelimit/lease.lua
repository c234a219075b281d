-- lease.lua: a replica's lease of one rule's key. In one atomic call it
-- gives back what an earlier lease did not hand out (exactly those units,
-- where they still count), then takes up to `want` units for a new lease by
-- the rule's own algorithm, so that units are always taken before the
-- replica hands them out. Redis TIME is the clock; state keys and fields are
-- decide.lua's, read as state.lua (in front of both) reads them.
--
-- KEYS[1]   the rule's state key
-- ARGV[1-4] algorithm (as in decide.lua), limit, window in ms, burst
-- ARGV[5-9] give back: units (0: none), the earlier lease's top member index
--           (sliding log: members "<id>:1" .. "<id>:<top>" are still in the
--           log), the Redis ms it was taken at, its id, and (sliding log,
--           0: none) the Redis ms by which it handed out its last unit:
--           its members left, the units it handed out, are restamped so
--           that they stay in the log a window after that, not after the
--           lease's end
-- ARGV[10-14] take: units wanted (0: take nothing), the least worth taking
--           (the request's cost: fewer available means a denial), the
--           number of replicas sharing the key, the lease's ttl in ms, its id
--
-- Returns {taken, now_ms, valid_ms (how long the lease may hand out units),
-- remaining (left in Redis after the take), retry_after_ms (when taken is 0:
-- until `least` units could be taken; -1: never, least exceeds capacity),
-- reset_after_ms}.

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local key = KEYS[1]
local algo, limit, window, burst = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local give, top, at, oldid, used = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7]), ARGV[8], tonumber(ARGV[9])
local want, least, share, ttl, id = tonumber(ARGV[10]), tonumber(ARGV[11]), tonumber(ARGV[12]), tonumber(ARGV[13]), ARGV[14]

-- Another algorithm's state (the rule changed: state.lua, hread) takes no
-- give-back, which leaves it as it is: the give-back of a lease taken under
-- the old algorithm must not touch the new one's state. A take reads it as
-- none and replaces it.
if give > 0 then
  if algo == 4 then
    -- Not into a bucket last written under a smaller burst (a plan or rule
    -- change cut it since): the cut already dropped what the bucket held
    -- above the new burst, and these units, had they not been leased,
    -- would have gone with it. Into one written under a bigger burst (the
    -- plan was raised), up to that burst: capped at the lease's own, the
    -- give-back cut what the bucket held under the new plan.
    local tokens, b = hread(key, 4, 'tokens', 'b')
    tokens, b = tonumber(tokens), tonumber(b)
    if tokens and not (b and b < burst) then redis.call('HSET', key, 'tokens', min(max(burst, b or 0), tokens + give)) end
  elseif algo == 5 then
    local level = tonumber((hread(key, 5, 'level')))
    if level then redis.call('HSET', key, 'level', max(0, level - give)) end
  elseif algo == 1 then
    -- Only into the window the lease was taken in: a later one started afresh.
    local sw, sn = hread(key, 1, 'w', 'n')
    if tonumber(sw) == floor(at / window) then
      redis.call('HSET', key, 'n', max(0, tonumber(sn) - give))
    end
  elseif algo == 3 then
    -- The lease's window is `cur`, or `prev` once the next window began.
    local sw, cur, prev = hread(key, 3, 'w', 'cur', 'prev')
    local w = floor(at / window)
    if tonumber(sw) == w then
      redis.call('HSET', key, 'cur', max(0, tonumber(cur) - give))
    elseif tonumber(sw) == w + 1 then
      redis.call('HSET', key, 'prev', max(0, tonumber(prev) - give))
    end
  elseif algo == 2 then
    log_range('ZREM', key, nil, oldid, top - give + 1, top)
  end
end
if algo == 2 and used > 0 and top > give then
  log_range('ZADD', key, used, oldid, 1, top - give, 'XX')
end
if want == 0 then return {0, now, 0, 0, 0, 0} end

-- count is how many of avail units to take: none below least; else at most
-- want, and only a replica's share of what is left once little is left, so
-- the last units are not all held by one replica.
local function count(avail)
  if avail < least then return 0 end
  return min(want, avail, max(least, floor(avail / share)))
end

local taken, remaining, retry, reset = 0, 0, 0, 0
local ends = now + ttl

if algo == 4 then
  local rate = limit / window
  local tokens = bucket_tokens(key, rate, burst, now)
  taken = count(floor(tokens))
  tokens = tokens - taken
  if taken > 0 then
    replace(key)
    redis.call('HSET', key, 'a', 4, 'tokens', tokens, 'ts', now, 'b', burst)
    redis.call('PEXPIRE', key, ceil(burst / rate) + 1000)
  elseif least > burst then
    retry = -1
  else
    retry = ceil((least - tokens) / rate)
  end
  remaining = floor(tokens)
  reset = ceil((burst - tokens) / rate)

elseif algo == 5 then
  local rate = limit / window
  local level = bucket_level(key, rate, now)
  taken = count(floor(burst - level))
  level = level + taken
  if taken > 0 then
    replace(key)
    redis.call('HSET', key, 'a', 5, 'level', level, 'ts', now)
    redis.call('PEXPIRE', key, ceil(burst / rate) + 1000)
  elseif least > burst then
    retry = -1
  else
    retry = ceil((level + least - burst) / rate)
  end
  remaining = max(0, floor(burst - level))
  reset = ceil(level / rate)

elseif algo == 1 then
  -- A fixed-window lease ends with its window: its units count only there.
  local sw, sn = hread(key, 1, 'w', 'n')
  local w = current_window(sw, window, now)
  local n = 0
  if tonumber(sw) == w then n = tonumber(sn) or 0 end
  reset = (w + 1) * window - now
  ends = min(ends, (w + 1) * window)
  taken = count(limit - n)
  n = n + taken
  if taken > 0 then
    replace(key)
    redis.call('HSET', key, 'a', 1, 'w', w, 'n', n)
    redis.call('PEXPIRE', key, reset)
  elseif least > limit then
    retry = -1
  else
    retry = reset
  end
  remaining = max(0, limit - n)

elseif algo == 3 then
  -- Counted in this window's `cur`, so the lease ends with the window: a
  -- unit handed out later would weigh only as part of `prev`.
  local w, cur, prev, elapsed, est = counter_state(key, window, now)
  ends = min(ends, (w + 1) * window)
  -- One unit at a time (decide.lua), the k-th passes while est + k - 1 < limit.
  taken = count(max(0, ceil(limit - est)))
  cur = cur + taken
  est = est + taken
  if taken > 0 then
    replace(key)
    redis.call('HSET', key, 'a', 3, 'w', w, 'cur', cur, 'prev', prev)
    redis.call('PEXPIRE', key, 2 * window + 1000)
  else
    -- decide.lua's retry-after for a request of cost `least`.
    local room = limit - least + 1
    if room <= 0 then
      retry = -1
    else
      retry = counter_retry(est, room, cur, prev, elapsed, window)
    end
  end
  remaining = max(0, ceil(limit - est))
  if cur > 0 then
    reset = (w + 2) * window - now
  elseif prev > 0 then
    reset = (w + 1) * window - now
  end

elseif algo == 2 then
  -- A sliding-log lease stamps its members with the lease's end, the last
  -- instant one of its units can be handed out: every unit then stays in
  -- the log for at least a full window after its use, so the log stays
  -- exact over any window.
  local from = now - window
  local n = read(0, 'ZCOUNT', key, '(' .. from, '+inf')
  taken = count(limit - n)
  if taken > 0 then
    replace(key)
    redis.call('ZREMRANGEBYSCORE', key, '-inf', from)
    log_range('ZADD', key, ends, id, 1, taken)
    redis.call('PEXPIRE', key, max(redis.call('PTTL', key), ends - now + window + 1000))
  elseif least > limit then
    retry = -1
  else
    -- The oldest n + least - limit members must leave the window first.
    local e = read({}, 'ZRANGEBYSCORE', key, '(' .. from, '+inf', 'WITHSCORES', 'LIMIT', n + least - limit - 1, 1)
    retry = tonumber(e[2]) + window - now
  end
  remaining = max(0, limit - n - taken)
  reset = ends + window - now

else
  return redis.error_reply('unknown algorithm ' .. tostring(algo))
end

return {taken, now, ends - now, remaining, retry, reset}
