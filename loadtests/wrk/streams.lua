-- POST one ~200-byte JSON event per request over many streams (bench_streams.py):
-- every stream gets exactly `each` events.
-- Usage: wrk -tT -dD -s loadtests/wrk/streams.lua URL -- streams=N each=E threads=T
--        [order=burst|round] [one=NAME] events=1   (N >= T; -d bounds the run)
-- Thread t posts to the streams t, t+T, t+2T... (named svc-00000, svc-00001...):
--   order=burst (default): a stream's events one after the other, then the next stream (a
--     written stream goes idle: what costs a handle then is an idle shard);
--   order=round: one event to each of the thread's streams, `each` times over.
-- one=NAME: the same requests all to stream NAME (the anchor: one stream, same count).
-- Its quota sent and answered, a thread prints WRKDONE (wrk runs until -d or SIGINT: the
-- caller sends SIGINT once every thread did); WRKJSON as common.lua's.
local dir = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
local events = dofile(dir .. "events.lua")

wrk.method = "POST"
wrk.body = events.event(1)
wrk.headers["Content-Type"] = "application/json"

dofile(dir .. "common.lua")

local next_id = 0
local common_setup, common_init, common_response = setup, init, response

function setup(thread)
  common_setup(thread)
  thread:set("thread_id", next_id)
  next_id = next_id + 1
end

local mine = {}          -- this thread's stream names
local each, quota, issued, built, answered, burst = 1, 0, 0, 0, 0, true

function init(args)
  common_init(args)
  local opt = {}
  for _, arg in ipairs(args) do
    local key, value = arg:match("^([%w_]+)=(.+)$")
    if key then opt[key] = value end
  end
  local streams, threads = tonumber(opt.streams), tonumber(opt.threads)
  each, burst = tonumber(opt.each), opt.order ~= "round"
  for s = thread_id, streams - 1, threads do
    mine[#mine + 1] = "/streams/" .. (opt.one or string.format("svc-%05d", s))
  end
  quota = #mine * each
end

function delay()
  if issued >= quota then
    return 3600 * 1000   -- parked: wrk ends when every thread has stopped, or at -d
  end
  issued = issued + 1
  return 0
end

function request()
  local j = built % quota   -- a reconnect rebuilds a request: never past the quota
  built = built + 1
  local k = burst and math.floor(j / each) or (j % #mine)
  return wrk.format(nil, mine[k + 1])
end

function response(status, headers, body)
  common_response(status, headers, body)
  answered = answered + 1
  if answered == quota then   -- wrk itself runs until -d: the caller sends SIGINT on this
    io.write("WRKDONE\n")
    io.flush()
  end
end
