-- POST 100 ~200-byte JSON events per request as one JSON array (~20 KB,
-- Content-Type: application/json).
-- Usage: wrk -s loadtests/wrk/array_100.lua URL -- stop_after=S events=100
local dir = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
local events = dofile(dir .. "events.lua")

local items = {}
for i = 1, 100 do
  items[i] = events.event(i)
end

wrk.method = "POST"
wrk.body = "[" .. table.concat(items, ",") .. "]"
wrk.headers["Content-Type"] = "application/json"

dofile(dir .. "common.lua")
