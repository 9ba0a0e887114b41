-- Release a lease, or turn it into a handoff value the next step's delivery may take.
-- KEYS[1] - lease key
-- ARGV[1] - holder token
-- ARGV[2] - handoff value ("" = delete the lease)
-- ARGV[3] - handoff ttl in ms (ignored when deleting)
-- return 1 if this holder owned the lease, otherwise 0 (nothing changed)
local lease_key = KEYS[1]
local token = ARGV[1]
local handoff = ARGV[2]
local ttl_ms = ARGV[3]

if redis.call('GET', lease_key) ~= token then
    return 0
end
if handoff == '' then
    redis.call('DEL', lease_key)
else
    redis.call('SET', lease_key, handoff, 'PX', ttl_ms)
end
return 1
