-- Take a run's lease.
-- KEYS[1] - lease key
-- ARGV[1] - holder token
-- ARGV[2] - ttl in ms
-- ARGV[3] - handoff value this delivery may take over ("" = none)
-- return 1 if taken, otherwise 0
local lease_key = KEYS[1]
local token = ARGV[1]
local ttl_ms = ARGV[2]
local handoff = ARGV[3]

local current = redis.call('GET', lease_key)
if current == false or (handoff ~= '' and current == handoff) then
    redis.call('SET', lease_key, token, 'PX', ttl_ms)
    return 1
end
return 0
