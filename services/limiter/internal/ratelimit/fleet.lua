-- One replica's heartbeat into its fleet, and the fleet's live size.
-- KEYS[1]: the fleet's sorted set (member: replica id, score: when its
--          entry expires, in Redis TIME ms)
-- ARGV:    the replica's id, the entry's ttl in ms, "beat" or "leave"
-- Returns the number of live replicas after this one's beat (0 after the
-- last one left).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if ARGV[3] == 'leave' then
  redis.call('ZREM', KEYS[1], ARGV[1])
else
  redis.call('ZADD', KEYS[1], now + ttl, ARGV[1])
end
local n = redis.call('ZCARD', KEYS[1])
if n > 0 then
  redis.call('PEXPIRE', KEYS[1], ttl)
end
return n
