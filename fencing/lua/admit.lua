-- Admit a run or refuse it in one step: a global limit on runs waiting to start, a per-user limit on
-- unfinished runs. Admitting the same run id twice changes nothing.
-- A user slot follows its run's state: it is taken here, released when the run ends, and the sweeper
-- refreshes the slot of every run the database calls queued/running/waiting (and re-adds it after a
-- Redis wipe) and frees the slots of runs that ended or never existed. So the age prune below only
-- drops slots nobody has confirmed for the ttl (far longer than a sweep interval): leftovers, not
-- live runs. Every key but the broker's lists shares the {admission} hash tag.
-- KEYS[1] - admitted-not-sent ZSET (run_id -> admit ms), {admission} slot
-- KEYS[2] - the user's slots ZSET (run_id -> admit or last refresh ms), {admission} slot
-- KEYS[3] - slot owners HASH (run_id -> user_id): the sweeper's index of every slot, {admission} slot
-- KEYS[4..] - kombu lists of the queues new runs wait in (LLEN = messages not yet delivered)
-- ARGV[1] - run id
-- ARGV[2] - now in ms
-- ARGV[3] - global limit: undelivered messages + admitted-not-sent runs
-- ARGV[4] - per-user limit: admitted, unfinished runs
-- ARGV[5] - ttl of a user slot nobody refreshed, in ms
-- ARGV[6] - ttl of an admitted-not-sent entry in ms
-- ARGV[7] - backlog counted outside this script (a broker on another Redis), else 0
-- ARGV[8] - user id
-- return {1, 'admitted', runs waiting including this one, the user's runs including this one}
--     or {0, 'global', runs waiting, 0}
--     or {0, 'user', the user's runs, ms until the user's oldest slot is pruned}
local unsent_key = KEYS[1]
local user_key = KEYS[2]
local owners_key = KEYS[3]
local run_id = ARGV[1]
local now_ms = tonumber(ARGV[2])
local max_queued = tonumber(ARGV[3])
local max_per_user = tonumber(ARGV[4])
local slot_ttl_ms = tonumber(ARGV[5])
local unsent_ttl_ms = tonumber(ARGV[6])
local outside_backlog = tonumber(ARGV[7])
local user_id = ARGV[8]

redis.call('ZREMRANGEBYSCORE', unsent_key, '-inf', now_ms - unsent_ttl_ms)
local stale = redis.call('ZRANGEBYSCORE', user_key, '-inf', now_ms - slot_ttl_ms)
for _, stale_id in ipairs(stale) do
    redis.call('ZREM', user_key, stale_id)
    redis.call('HDEL', owners_key, stale_id)
end

local waiting = redis.call('ZCARD', unsent_key) + outside_backlog
for i = 4, #KEYS do
    waiting = waiting + redis.call('LLEN', KEYS[i])
end
local user_runs = redis.call('ZCARD', user_key)

if redis.call('ZSCORE', user_key, run_id) then
    return {1, 'admitted', waiting, user_runs}
end
if user_runs >= max_per_user then
    local oldest = redis.call('ZRANGE', user_key, 0, 0, 'WITHSCORES')
    return {0, 'user', user_runs, tonumber(oldest[2]) + slot_ttl_ms - now_ms}
end
if waiting >= max_queued then
    return {0, 'global', waiting, 0}
end
redis.call('ZADD', unsent_key, now_ms, run_id)
redis.call('ZADD', user_key, now_ms, run_id)
redis.call('HSET', owners_key, run_id, user_id)
-- An idle user's key goes with its last slot; the sweeper extends it while the user has live runs.
redis.call('PEXPIRE', user_key, slot_ttl_ms)
return {1, 'admitted', waiting + 1, user_runs + 1}
