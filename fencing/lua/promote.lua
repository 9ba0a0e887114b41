-- Anti-starvation: move the oldest waiting large run to the front of the normal queue, only while
-- both queues have messages (an empty normal queue lets workers reach the large queue anyway).
-- KEYS[1] - kombu list of the large queue (kombu LPUSHes and workers BRPOP: the oldest is at the right)
-- KEYS[2] - kombu list of the normal queue
-- ARGV[1] - none: the script takes no arguments
-- return the moved message (kombu's JSON envelope), or false if either queue was empty
local large_key = KEYS[1]
local normal_key = KEYS[2]

if redis.call('LLEN', large_key) == 0 or redis.call('LLEN', normal_key) == 0 then
    return false
end
-- RIGHT RIGHT: taken from the oldest end, put at the end the next BRPOP takes.
return redis.call('LMOVE', large_key, normal_key, 'RIGHT', 'RIGHT')
