-- Give a user's admission slot back: the run ended (or never came to exist). Idempotent.
-- KEYS[1] - the user's slots (ZSET run_id -> expiry ms)
-- KEYS[2] - the admitted runs whose first wake-up is not out yet (ZSET run_id -> admit ms)
-- KEYS[3] - the slot owners (HASH run_id -> user_id)
-- ARGV[1] - run id
-- return 1 if a slot was freed, 0 if the run held none
local run_id = ARGV[1]
local freed = redis.call('ZREM', KEYS[1], run_id)
redis.call('ZREM', KEYS[2], run_id)
redis.call('HDEL', KEYS[3], run_id)
return freed
