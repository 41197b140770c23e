-- wrk script for the idemgw benchmarks: POSTs a 1 KiB MCP tools/call body.
--   BENCH_MODE=read       fixed call of the read-class tool "search" (pass-through)
--   BENCH_MODE=replay     fixed call of the non_idempotent tool "write" (claimed once, then replayed)
--   BENCH_MODE=protected  "write" with unique arguments per request (thread id + counter + run id)
-- BENCH_RUN keeps the arguments of separate runs apart. At the end one line is printed:
--   BENCHJSON {"requests":..,"rps":..,"p50_us":..,"p99_us":..,"errors":..,"non2xx":..}
local mode = os.getenv("BENCH_MODE") or "read"
local run = os.getenv("BENCH_RUN") or tostring(os.time())
local BODY_SIZE = 1024

-- The body padded to exactly BODY_SIZE bytes with a "pad" argument.
local function body(id, tool, q)
  local head = '{"jsonrpc":"2.0","id":' .. id .. ',"method":"tools/call","params":{"name":"'
    .. tool .. '","arguments":{"q":"' .. q .. '","pad":"'
  local tail = '"}}}'
  local n = BODY_SIZE - #head - #tail
  return head .. string.rep("x", n > 0 and n or 0) .. tail
end

local headers = {
  ["Content-Type"] = "application/json",
  ["Accept"] = "application/json, text/event-stream",
}

local threads = {}
local counter = 0

function setup(thread)
  thread:set("tid", #threads + 1)
  table.insert(threads, thread)
end

function init(args)
  -- an explicit Host: wrk.format() does not always add it to a caller's header table
  headers["Host"] = wrk.host .. ":" .. wrk.port
  wrk.method = "POST"
  wrk.headers = headers
  if mode == "read" then
    wrk.body = body(1, "search", "fixed")
  elseif mode == "replay" then
    wrk.body = body(1, "write", "replay-" .. run)
  end
end

if mode == "protected" then
  function request()
    counter = counter + 1
    return wrk.format("POST", nil, headers, body(counter, "write", run .. "-" .. tid .. "-" .. counter))
  end
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'BENCHJSON {"requests":%d,"duration_s":%.3f,"rps":%.1f,"p50_us":%d,"p90_us":%d,"p99_us":%d,'
      .. '"max_us":%d,"errors":%d,"non2xx":%d}\n',
    summary.requests, summary.duration / 1e6, summary.requests / (summary.duration / 1e6),
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.max,
    e.connect + e.read + e.write + e.timeout, e.status))
end
