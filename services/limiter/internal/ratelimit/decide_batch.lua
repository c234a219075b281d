-- decide_batch.lua: independent requests whose keys live on this node,
-- decided in one call, one after another, at one Redis TIME. CheckMany
-- (batch.go) sends the requests of one call bound for the same node this
-- way: one script call per batch instead of one per request.
--
-- KEYS[1]   the first request's first key: it routes the call to the node.
--           The other keys are arguments (a cluster refuses declared keys
--           of several slots; the script's allow-cross-slot-keys flag lets
--           it reach undeclared keys of any slot this node serves).
-- ARGV[1]   the number of requests; then per request: its rule count n,
--           its n keys, then its 3 + 6n arguments as decide.lua's ARGV.
--
-- Returns the requests' replies one after another, 2 + 5n values each. A
-- request with a key this node does not serve (a slot that moved away, or
-- a key already moved out of a migrating slot) is not decided: its reply is
-- all_allowed = -1 and zeros, and the engine sends it again on its own.
-- Such a key fails on its first read, before the request writes anything.
-- (So does any other error of a request's decision.) The engine never runs
-- a batch with ASKING on an importing node, where a key still on the
-- source would read as absent instead of failing.
local out = {}
local now
local p = 2
for _ = 1, tonumber(ARGV[1]) do
  local n = tonumber(ARGV[p])
  if ARGV[p + n + 1] == '' and not now then now = redis_time() end
  local base = #out
  local ok, err = pcall(decide, ARGV, p, n, ARGV, p + n, out, now)
  if not ok or err then
    for j = base + 1, #out do out[j] = nil end
    out[base + 1] = -1
    for j = base + 2, base + 2 + 5 * n do out[j] = 0 end
  end
  p = p + n + 1 + 3 + 6 * n
end
return out
