-- Append to a run's event stream, fenced by the epoch mirror.
-- KEYS[1] - epoch mirror key
-- KEYS[2] - event stream key
-- ARGV[1] - writer's epoch
-- ARGV[2] - approximate max length of the stream
-- ARGV[3..] - field, value pairs of the event (Event.fields: eid, type, step, epoch, data)
-- return the new entry id, or false if a newer epoch owns the run (the writer is fenced out)
-- A missing mirror (Redis lost its data) is raised to the writer's epoch: the database still fences.
-- An event that repeats the stream's newest entry (the same event id under the same epoch) is that
-- entry: its id is returned and nothing is appended. Two writers can say one event under one epoch: a
-- holder whose final event was delayed (a Redis failover) and the rescue that found the run ended and
-- repaired the stream meanwhile; whichever comes second adds no copy.
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
local eid
for i = 3, #ARGV do
    fields[#fields + 1] = ARGV[i]
    if ARGV[i - 1] == 'eid' and i % 2 == 0 then eid = ARGV[i] end
end
if eid then
    local newest = redis.call('XREVRANGE', stream_key, '+', '-', 'COUNT', 1)[1]
    if newest then
        local seen, newest_eid, newest_epoch = newest[2], nil, nil
        for i = 1, #seen - 1, 2 do
            if seen[i] == 'eid' then newest_eid = seen[i + 1] elseif seen[i] == 'epoch' then newest_epoch = seen[i + 1] end
        end
        if newest_eid == eid and tonumber(newest_epoch) == epoch then
            return newest[1]
        end
    end
end
return redis.call('XADD', stream_key, 'MAXLEN', '~', maxlen, '*', unpack(fields))
