-- Decide "the lease is gone and nobody rescued this run yet" in one step.
-- KEYS[1] - lease key
-- KEYS[2] - rescue marker key
-- ARGV[1] - how long the marker blocks another rescue, in ms
-- ARGV[2] - who rescues (recorded in the marker)
-- return {1, 0} if the caller must send a wake-up, {0, 0} if the lease is alive, or {2, ms} if a rescue
-- is already out: its marker blocks another for ms more (the caller keeps the run watched until then)
local lease_key = KEYS[1]
local marker_key = KEYS[2]
local grace_ms = ARGV[1]
local rescuer = ARGV[2]

if redis.call('EXISTS', lease_key) == 1 then
    return {0, 0}
end
if redis.call('SET', marker_key, rescuer, 'NX', 'PX', grace_ms) then
    return {1, 0}
end
return {2, math.max(redis.call('PTTL', marker_key), 0)}
