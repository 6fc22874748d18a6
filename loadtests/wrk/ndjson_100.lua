-- POST 100 ~200-byte JSON events per request as NDJSON (one per line, ~20 KB,
-- Content-Type: application/x-ndjson).
-- Usage: wrk -s loadtests/wrk/ndjson_100.lua URL -- stop_after=S events=100
local dir = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
local events = dofile(dir .. "events.lua")

local lines = {}
for i = 1, 100 do
  lines[i] = events.event(i)
end

wrk.method = "POST"
wrk.body = table.concat(lines, "\n") .. "\n"
wrk.headers["Content-Type"] = "application/x-ndjson"

dofile(dir .. "common.lua")
