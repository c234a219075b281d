-- decide_one.lua: one request per call, KEYS and ARGV as decide.lua says.
local out = {}
local err = decide(KEYS, 0, #KEYS, ARGV, 0, out, nil)
if err then return redis.error_reply(err) end
return out
