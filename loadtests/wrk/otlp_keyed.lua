-- POST one gzip'd OTLP/HTTP protobuf body read from a file, each time with a fresh
-- Idempotency-Key, as `comet ship` posts its requests (bench_forward.py's anchor).
-- Environment: BODY_FILE (the body, gzip'd).
-- Usage: BODY_FILE=... wrk -s loadtests/wrk/otlp_keyed.lua URL/v1/logs -- stop_after=S events=N accept=200
local dir = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"

local file = assert(io.open(assert(os.getenv("BODY_FILE"), "BODY_FILE is not set"), "rb"))
wrk.method = "POST"
wrk.body = file:read("*a")
file:close()
wrk.headers["Content-Type"] = "application/x-protobuf"
wrk.headers["Content-Encoding"] = "gzip"

dofile(dir .. "common.lua")

local sent = 0
local prefix = tostring(math.random(1, 1e9))

function request()
  sent = sent + 1
  local headers = {}
  for k, v in pairs(wrk.headers) do
    headers[k] = v
  end
  headers["Idempotency-Key"] = "bench/" .. prefix .. "/" .. sent
  return wrk.format(nil, nil, headers)
end
