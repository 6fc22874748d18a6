-- The benchmark's event: a JSON object of exactly EVENT_BYTES bytes (one line).
local M = { EVENT_BYTES = 200 }

function M.event(seq)
  local head = string.format(
    '{"ts":%d,"level":"info","service":"edge-gateway","host":"web-%03d",' ..
    '"method":"POST","path":"/api/v1/orders/%08d","status":202,"ms":%.3f,"user":"u-%06d","pad":"',
    1700000000000 + seq, seq % 1000, seq, (seq % 997) / 7, seq % 1000000)
  local pad = M.EVENT_BYTES - #head - 2
  assert(pad >= 0, "event head longer than EVENT_BYTES")
  return head .. string.rep("x", pad) .. '"}'
end

return M
