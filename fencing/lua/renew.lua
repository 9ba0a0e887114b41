-- Extend a lease this holder still owns (compare-and-pexpire).
-- KEYS[1] - lease key
-- ARGV[1] - holder token
-- ARGV[2] - ttl in ms
-- return 1 if extended, otherwise 0 (the lease is gone or someone else holds it)
local lease_key = KEYS[1]
local token = ARGV[1]
local ttl_ms = ARGV[2]

if redis.call('GET', lease_key) == token then
    redis.call('PEXPIRE', lease_key, ttl_ms)
    return 1
end
return 0
