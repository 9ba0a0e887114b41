-- Remove one run from the lease-deadline index if its deadline has passed and its lease is gone
-- (reapers race on this).
-- KEYS[1] - lease-deadline index (ZSET run_id -> deadline ms)
-- KEYS[2] - the run's lease key
-- ARGV[1] - run id
-- ARGV[2] - now in ms
-- return 1 if this caller removed an expired entry, otherwise 0
--
-- A deadline is computed by the client before the server sets the lease's PX, so a lease can outlive
-- its index entry by the latency of that pipeline. Such a lease is still live: its entry moves to the
-- lease's real expiry instead of leaving the index (which would hide it from every reaper).
local index_key = KEYS[1]
local lease_key = KEYS[2]
local run_id = ARGV[1]
local now_ms = tonumber(ARGV[2])

local deadline = redis.call('ZSCORE', index_key, run_id)
if not deadline or tonumber(deadline) > now_ms then
    return 0
end
local ttl = redis.call('PTTL', lease_key)
if ttl > 0 then
    redis.call('ZADD', index_key, now_ms + ttl, run_id)
    return 0
end
redis.call('ZREM', index_key, run_id)
return 1
