-- POST one body read from a file, again and again (bench_otlp.py writes the files).
-- Environment: BODY_FILE (the body), BODY_TYPE (its Content-Type).
-- Usage: BODY_FILE=... BODY_TYPE=... wrk -s loadtests/wrk/file_body.lua URL -- stop_after=S events=N accept=200
local dir = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"

local file = assert(io.open(assert(os.getenv("BODY_FILE"), "BODY_FILE is not set"), "rb"))
wrk.method = "POST"
wrk.body = file:read("*a")
file:close()
wrk.headers["Content-Type"] = assert(os.getenv("BODY_TYPE"), "BODY_TYPE is not set")

dofile(dir .. "common.lua")
