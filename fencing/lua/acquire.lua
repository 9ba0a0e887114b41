-- Take a run's lease.
-- KEYS[1] - lease key
-- KEYS[2] - rescue marker key (same {run_id} slot)
-- ARGV[1] - holder token
-- ARGV[2] - ttl in ms
-- ARGV[3] - handoff value this delivery may take over ("" = none)
-- return 1 if taken while free, 2 if taken from the handoff, 3 if refused because another delivery of
-- this same process holds it (the token's part before '/': a duplicate wake-up), otherwise 0
-- Taking the lease answers any rescue that was out for this run, so the marker goes: if this holder
-- dies too, its own rescue must not wait for the old marker to expire.
local lease_key = KEYS[1]
local marker_key = KEYS[2]
local token = ARGV[1]
local ttl_ms = ARGV[2]
local handoff = ARGV[3]

local current = redis.call('GET', lease_key)
if current == false or (handoff ~= '' and current == handoff) then
    redis.call('SET', lease_key, token, 'PX', ttl_ms)
    redis.call('DEL', marker_key)
    if current == false then
        return 1
    end
    return 2
end
local process = string.match(token, '^[^/]*')
if string.sub(current, 1, #process + 1) == process .. '/' then
    return 3
end
return 0
