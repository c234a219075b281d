-- decide.lua: one atomic decision over one or more rules whose keys share a
-- hash slot (a cluster refuses a script whose keys span slots). The engine
-- runs it in two forms: one request per call (decide_one), or a batch of
-- independent requests whose keys live on one node (decide_batch.lua).
--
-- One request, as decide_one passes it:
-- KEYS[i]   the state key of rule i
-- ARGV[1]   clock override in Unix ms, or "" to use Redis TIME. Only the test
--           and demo engine sets it; the service never does.
-- ARGV[2]   "check": decide, and write every rule's new state only if every
--           enforced rule allows (nothing is consumed otherwise);
--           "peek": decide without writing anything;
--           "refund": give back what a "check" with the same ARGV consumed;
--           ARGV[1] is then that check's clock (its returned now_ms), so
--           units consumed in a window that has since rolled over are not
--           credited to the new one.
-- ARGV[3]   request id: sliding-log members are "<id>:<n>", so a refund can
--           remove exactly them.
-- then, per rule i, 6 values from ARGV[4 + (i-1)*6]:
--           algorithm (1 fixed window, 2 sliding log, 3 sliding window
--           counter, 4 token bucket, 5 leaky bucket), limit, window in ms,
--           burst (bucket capacity), cost, flags (1 = leaky queue mode,
--           2 = shadow: reported, never denies, 4 = check only: decided at
--           its cost, but never written, so it consumes nothing).
--
-- Appends to out {all_allowed, now_ms, then per rule: allowed, remaining,
-- reset_after_ms, retry_after_ms (-1: never, cost exceeds capacity), delay_ms},
-- or returns an error message. redis_now, when not nil, is Redis TIME already
-- read by this script call (a batch reads it once).
-- Every key written gets a TTL in the same script: no key outlives its use.
-- The state of each algorithm is read by state.lua's functions, which the
-- engine puts in front of this script.

local function redis_time()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- decide runs one request: its keys are K[kb+1 .. kb+n], its arguments
-- A[ab+1 ..] laid out as ARGV above.
local function decide(K, kb, n, A, ab, out, redis_now)
  local now
  if A[ab + 1] ~= '' then
    now = tonumber(A[ab + 1])
  else
    now = redis_now or redis_time()
  end
  local mode = A[ab + 2]
  local reqid = A[ab + 3]
  local base = #out

  local function rule(i)
    local b = ab + 3 + (i - 1) * 6
    return tonumber(A[b + 1]), tonumber(A[b + 2]), tonumber(A[b + 3]),
      tonumber(A[b + 4]), tonumber(A[b + 5]), tonumber(A[b + 6])
  end

  if mode == 'refund' then
    for i = 1, n do
      local key = K[kb + i]
      local algo, limit, window, burst, cost = rule(i)
      if cost == 0 then
        -- Nothing to give back: the rule consumed nothing (a shadow rule
        -- that would have denied; the engine passes its cost as 0).
      elseif algo == 4 then
        local tokens = tonumber((hread(key, 4, 'tokens')))
        if tokens then redis.call('HSET', key, 'tokens', min(burst, tokens + cost)) end
      elseif algo == 5 then
        local level = tonumber((hread(key, 5, 'level')))
        if level then redis.call('HSET', key, 'level', max(0, level - cost)) end
      elseif algo == 1 or algo == 3 then
        -- The units were counted in window w (the check's clock): take them
        -- from that window's count wherever it is now, from nothing if it
        -- has left the state.
        local w = floor(now / window)
        local sw, field = tonumber((hread(key, algo, 'w'))), nil
        if sw == w then
          field = (algo == 1) and 'n' or 'cur'
        elseif sw == w + 1 and algo == 3 then
          field = 'prev'
        end
        if field then
          local n = tonumber(redis.call('HGET', key, field))
          if n then redis.call('HSET', key, field, max(0, n - cost)) end
        end
      elseif algo == 2 then
        log_range('ZREM', key, nil, reqid, 1, cost)
      end
    end
    out[base + 1] = 1
    out[base + 2] = now
    return nil
  end

  out[base + 1] = 1
  out[base + 2] = now
  -- The state each rule would write: {key, ttl ms, then HSET's field-value
  -- pairs, or false, the log's window start and the cost for a sliding log}.
  -- Data, not closures: a closure per rule cost ~10% of the script's time.
  local writes = {}
  local all = true

  for i = 1, n do
    local key = K[kb + i]
    local algo, limit, window, burst, cost, flags = rule(i)
    local allowed, remaining, reset, retry, delay = 0, 0, 0, 0, 0

    if algo == 4 then
      -- Token bucket: {tokens, ts, b}; refills at limit/window, holds at
      -- most burst (b: the burst it was written under, which a lease's
      -- give-back reads). min(burst, ...) also clamps a bucket whose plan
      -- shrank.
      local rate = limit / window
      local tokens = bucket_tokens(key, rate, burst, now)
      if tokens >= cost then
        allowed = 1
        tokens = tokens - cost
      elseif cost > burst then
        retry = -1
      else
        retry = ceil((cost - tokens) / rate)
      end
      remaining = floor(tokens)
      reset = ceil((burst - tokens) / rate)
      writes[#writes + 1] = {key, ceil(burst / rate) + 1000, 'a', 4, 'tokens', tokens, 'ts', now, 'b', burst}

    elseif algo == 1 then
      -- Fixed window: {w, n}, the count of calendar window w.
      local sw, sn = hread(key, 1, 'w', 'n')
      local w = current_window(sw, window, now)
      local n = 0
      if tonumber(sw) == w then n = tonumber(sn) or 0 end
      reset = (w + 1) * window - now
      if n + cost <= limit then
        allowed = 1
        n = n + cost
      elseif cost > limit then
        retry = -1
      else
        retry = reset
      end
      remaining = max(0, limit - n)
      writes[#writes + 1] = {key, reset, 'a', 1, 'w', w, 'n', n}
      -- Nothing counted (a look at a fresh window): already full.
      if n == 0 then reset = 0 end

    elseif algo == 3 then
      -- Sliding window counter: {w, cur, prev}; the estimate is
      -- prev x (share of the previous window still inside the last `window` ms)
      -- + cur, and a request passes while the estimate is below the limit.
      local w, cur, prev, elapsed, est = counter_state(key, window, now)
      local room = limit - cost + 1 -- passes while est < room
      if est < room then
        allowed = 1
        cur = cur + cost
        est = est + cost
      elseif room <= 0 then
        retry = -1
      else
        retry = counter_retry(est, room, cur, prev, elapsed, window)
      end
      remaining = max(0, ceil(limit - est))
      if cur > 0 then
        reset = (w + 2) * window - now
      elseif prev > 0 then
        reset = (w + 1) * window - now
      end
      writes[#writes + 1] = {key, 2 * window + 1000, 'a', 3, 'w', w, 'cur', cur, 'prev', prev}

    elseif algo == 2 then
      -- Sliding log: a sorted set of request timestamps; exact, and its memory
      -- grows with the limit (one member per request in the window).
      local from = now - window
      local n = read(0, 'ZCOUNT', key, '(' .. from, '+inf')
      if n + cost <= limit then
        allowed = 1
        n = n + cost
        if cost > 0 then
          reset = window -- this request's entry is the newest
        elseif n > 0 then
          -- A look adds nothing: full again once the newest entry leaves
          -- (an empty log is full: 0).
          local last = read({}, 'ZREVRANGEBYSCORE', key, '+inf', '(' .. from, 'WITHSCORES', 'LIMIT', 0, 1)
          if last[2] then reset = tonumber(last[2]) + window - now end
        end
      elseif cost > limit then
        retry = -1
      else
        -- The oldest n + cost - limit entries must leave the window first.
        local e = read({}, 'ZRANGEBYSCORE', key, '(' .. from, '+inf', 'WITHSCORES', 'LIMIT', n + cost - limit - 1, 1)
        retry = tonumber(e[2]) + window - now
      end
      if allowed == 0 then
        local last = read({}, 'ZREVRANGEBYSCORE', key, '+inf', '(' .. from, 'WITHSCORES', 'LIMIT', 0, 1)
        if last[2] then reset = tonumber(last[2]) + window - now end
      end
      remaining = max(0, limit - n)
      writes[#writes + 1] = {key, window + 1000, false, from, cost}

    elseif algo == 5 then
      -- Leaky bucket: {level, ts}; drains at limit/window, holds at most
      -- burst. As a meter it admits or rejects; in queue mode an admitted
      -- request also learns how long to wait for what is ahead of it.
      local rate = limit / window
      local level = bucket_level(key, rate, now)
      if level + cost <= burst then
        allowed = 1
        if flags % 2 == 1 then delay = ceil(level / rate) end
        level = level + cost
      elseif cost > burst then
        retry = -1
      else
        retry = ceil((level + cost - burst) / rate)
      end
      remaining = max(0, floor(burst - level))
      reset = ceil(level / rate)
      writes[#writes + 1] = {key, ceil(burst / rate) + 1000, 'a', 5, 'level', level, 'ts', now}

    else
      return 'unknown algorithm ' .. tostring(algo)
    end

    -- A shadow rule is reported but never denies; if it would deny, it keeps
    -- its state untouched.
    if allowed == 0 then
      writes[#writes] = nil
      if flags % 4 < 2 then all = false end
    elseif flags >= 4 then
      -- A check-only rule: whether its cost would pass, nothing taken.
      writes[#writes] = nil
    end
    out[#out + 1] = allowed
    out[#out + 1] = remaining
    out[#out + 1] = reset
    out[#out + 1] = retry
    out[#out + 1] = delay
  end

  if not all then
    out[base + 1] = 0
  elseif mode == 'check' then
    for _, w in ipairs(writes) do
      replace(w[1])
      if w[3] then
        redis.call('HSET', w[1], unpack(w, 3))
      else -- sliding log: drop what left the window, add this request
        redis.call('ZREMRANGEBYSCORE', w[1], '-inf', w[4])
        log_range('ZADD', w[1], now, reqid, 1, w[5])
      end
      redis.call('PEXPIRE', w[1], w[2])
    end
  end
  return nil
end
