-- Drop a lease whose holder is known dead: only if its value still names that process.
-- KEYS[1] - lease key
-- ARGV[1] - holder prefix ("host:pid:" of a dead pool child, or "<process token>/")
-- return the released lease value, or false if the lease is gone or held by someone else
local lease_key = KEYS[1]
local prefix = ARGV[1]

local current = redis.call('GET', lease_key)
if current and string.sub(current, 1, #prefix) == prefix then
    redis.call('DEL', lease_key)
    return current
end
return false
