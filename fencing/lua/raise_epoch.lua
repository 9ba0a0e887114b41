-- Raise the Redis mirror of a run's epoch; it never goes down.
-- KEYS[1] - epoch mirror key
-- ARGV[1] - epoch just claimed in the database
-- return the mirror's value afterwards (higher than ARGV[1] means a newer claim exists)
local epoch_key = KEYS[1]
local epoch = tonumber(ARGV[1])

local current = tonumber(redis.call('GET', epoch_key) or '-1')
if current < epoch then
    redis.call('SET', epoch_key, epoch)
    return epoch
end
return current
