-- Remove one run from the lease-deadline index if its deadline has passed (reapers race on this).
-- KEYS[1] - lease-deadline index (ZSET "<holder>|<run_id>" -> deadline ms)
-- ARGV[1] - index member
-- ARGV[2] - now in ms
-- return 1 if this caller removed an expired entry, otherwise 0
local index_key = KEYS[1]
local member = ARGV[1]
local now_ms = tonumber(ARGV[2])

local deadline = redis.call('ZSCORE', index_key, member)
if deadline and tonumber(deadline) <= now_ms then
    redis.call('ZREM', index_key, member)
    return 1
end
return 0
