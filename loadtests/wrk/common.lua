-- Shared by the gateway benchmark's wrk scripts (single_event.lua, ndjson_100.lua).
--
-- A body script sets wrk.method, wrk.body and the Content-Type header, then
-- loads this file, which adds:
--   * status counting in response(): a request is accepted only if it got 202
--     (or the status given as accept=N: OTLP answers 200);
--   * a clean stop: after `stop_after` seconds (wall clock, per thread) delay()
--     parks every connection once its response is in, so that nothing is in
--     flight when wrk ends (run wrk with -d at least 1 s longer).  Every request
--     the server received has then been answered and counted;
--   * optional pacing: with `rate` (requests/s for this thread) delay() hands
--     out send times on a fixed schedule shared by the thread's connections
--     (no catching up: if no connection is free the schedule slips, and the
--     achieved rate, reported, falls below the target);
--   * done(): one line "WRKJSON {...}" with the totals, for the Python side:
--     requests (wrk's count of responses), duration_us, accepted_202, non_202 (and
--     by status), status_ge_400 (wrk's own status-error count: status > 399),
--     socket errors, window_s (first send to last response), latency in µs (p50, p90,
--     p99, p999 = p99.9, min, max, mean).
--
-- Arguments after "--" on the wrk command line: stop_after=SECONDS rate=REQ_PER_S
-- events=N (events per request, echoed back in the JSON) accept=STATUS.

local ffi = require("ffi")
ffi.cdef [[
typedef struct { long tv_sec; long tv_nsec; } bench_timespec;
int clock_gettime(int clk, bench_timespec *tp);
]]
local ts = ffi.new("bench_timespec")
local CLOCK_MONOTONIC = 1

local function now()
  ffi.C.clock_gettime(CLOCK_MONOTONIC, ts)
  return tonumber(ts.tv_sec) + tonumber(ts.tv_nsec) * 1e-9
end

local PARK_MS = 3600 * 1000

-- per-thread state (each wrk thread has its own Lua state)
started = 0
stop_at = math.huge
last_response = 0
accepted = 0          -- 202s
other = {}            -- status -> count, every status but 202
interval = 0          -- seconds between sends of this thread (0: as fast as possible)
events = 1
local accept = 202
local next_send = nil

local threads = {}

function setup(thread)
  table.insert(threads, thread)
end

function init(args)
  for _, arg in ipairs(args) do
    local key, value = arg:match("^([%w_]+)=(.+)$")
    if key == "stop_after" then
      stop_at = now() + tonumber(value)
    elseif key == "rate" and tonumber(value) > 0 then
      interval = 1 / tonumber(value)
    elseif key == "events" then
      events = tonumber(value)
    elseif key == "accept" then
      accept = tonumber(value)
    end
  end
  started = now()
end

function delay()
  local t = now()
  if t >= stop_at then
    return PARK_MS
  end
  if interval == 0 then
    return 0
  end
  if next_send == nil or next_send + interval < t then
    next_send = t                 -- behind schedule (or first call): no burst to catch up
  else
    next_send = next_send + interval
  end
  return math.floor((next_send - t) * 1000 + 0.5)
end

function response(status, headers, body)
  last_response = now()
  if status == accept then
    accepted = accepted + 1
  else
    other[status] = (other[status] or 0) + 1
  end
end

function done(summary, latency, requests)
  local acc, first, last = 0, math.huge, 0
  local statuses = {}
  local per_thread = {}
  for _, thread in ipairs(threads) do
    local a = thread:get("accepted")
    acc = acc + a
    first = math.min(first, thread:get("started"))
    last = math.max(last, thread:get("last_response"))
    table.insert(per_thread, tostring(a))
    for status, n in pairs(thread:get("other") or {}) do
      statuses[status] = (statuses[status] or 0) + n
    end
  end
  local other_parts, non202 = {}, 0
  for status, n in pairs(statuses) do
    non202 = non202 + n
    table.insert(other_parts, string.format('"%d":%d', status, n))
  end
  local e = summary.errors
  local ev = threads[1] and threads[1]:get("events") or 1
  io.write(string.format(
    'WRKJSON {"requests":%d,"duration_us":%d,"bytes":%d,"accepted_202":%d,"non_202":%d,' ..
    '"non_202_by_status":{%s},"status_ge_400":%d,' ..
    '"errors":{"connect":%d,"read":%d,"write":%d,"timeout":%d},' ..
    '"window_s":%.6f,"events_per_request":%d,"accepted_per_thread":[%s],' ..
    '"latency_us":{"p50":%d,"p90":%d,"p99":%d,"p999":%d,"min":%d,"max":%d,"mean":%.1f}}\n',
    summary.requests, summary.duration, summary.bytes, acc, non202,
    table.concat(other_parts, ","), e.status,
    e.connect, e.read, e.write, e.timeout,
    last > first and (last - first) or 0, ev, table.concat(per_thread, ","),
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency:percentile(99.9),
    latency.min, latency.max, latency.mean))
end

-- WRK_UNIQUE_HEADER=NAME in the environment: every request carries the header NAME
-- with a value of its own (Idempotency-Key: the keyed cases, each request stored;
-- X-Request-Id, which the gateway ignores: their baseline, as wrk builds each
-- request anew then).  Only then is request() defined: wrk builds each request
-- anew only when a script defines it.
local unique = os.getenv("WRK_UNIQUE_HEADER")
if unique and unique ~= "" then
  local sent = 0
  local prefix = string.format("%s-%d-", tostring({}):gsub("table: ", ""), os.time())
  function request()
    sent = sent + 1
    wrk.headers[unique] = prefix .. sent
    return wrk.format()
  end
end
