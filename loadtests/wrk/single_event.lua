-- POST one ~200-byte JSON event per request (Content-Type: application/json).
-- Usage: wrk -s loadtests/wrk/single_event.lua URL -- stop_after=S [rate=R] events=1
local dir = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
local events = dofile(dir .. "events.lua")

wrk.method = "POST"
wrk.body = events.event(1)
wrk.headers["Content-Type"] = "application/json"

dofile(dir .. "common.lua")
