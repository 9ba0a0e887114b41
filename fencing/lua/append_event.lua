-- Append to a run's event stream, fenced by the epoch mirror.
-- KEYS[1] - epoch mirror key
-- KEYS[2] - event stream key
-- ARGV[1] - writer's epoch
-- ARGV[2] - approximate max length of the stream
-- ARGV[3..] - field, value pairs of the event
-- return the new entry id, or false if a newer epoch owns the run (the writer is fenced out)
-- A missing mirror (Redis lost its data) is raised to the writer's epoch: the database still fences.
local epoch_key = KEYS[1]
local stream_key = KEYS[2]
local epoch = tonumber(ARGV[1])
local maxlen = ARGV[2]

local current = tonumber(redis.call('GET', epoch_key) or '-1')
if current > epoch then
    return false
end
if current < epoch then
    redis.call('SET', epoch_key, epoch)
end
local fields = {}
for i = 3, #ARGV do
    fields[#fields + 1] = ARGV[i]
end
return redis.call('XADD', stream_key, 'MAXLEN', '~', maxlen, '*', unpack(fields))
