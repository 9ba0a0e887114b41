-- Fire an armed fault point at most as many times as it was armed (tests and chaos only).
-- KEYS[1] - faults hash (point -> remaining hits)
-- KEYS[2] - fault hits list
-- ARGV[1] - point name
-- ARGV[2] - description of the hit ("point run_id pid")
-- return 1 if the point fires now, otherwise 0
local faults_key = KEYS[1]
local hits_key = KEYS[2]
local point = ARGV[1]
local hit = ARGV[2]

local remaining = tonumber(redis.call('HGET', faults_key, point) or '0')
if remaining > 0 then
    redis.call('HINCRBY', faults_key, point, -1)
    redis.call('RPUSH', hits_key, hit)
    return 1
end
return 0
