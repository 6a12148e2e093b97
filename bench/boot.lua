-- One pod boot per connection turn, as the vLLM plugin does it: POST the lookup, then GET
-- the artifact it names, then (REPORT_BODY set) POST the pod's report of the install.
-- Paths and bodies come from the environment (bench/boot_storm.py).
-- STATIC=1: lookup and artifact are GETs of files (the static servers serve the same bodies).
-- BOOTS_PER_S (optional): offered rate for the whole run; each thread sends its share of the
-- requests on a fixed schedule (2 or 3 requests a boot) instead of as fast as replies come back.
local ffi = require("ffi")
ffi.cdef[[
typedef struct { long tv_sec; long tv_nsec; } bench_timespec;
int clock_gettime(int clk_id, bench_timespec *tp);
]]
local clock = ffi.new("bench_timespec")
local function now_ms()
  ffi.C.clock_gettime(1, clock) -- CLOCK_MONOTONIC
  return tonumber(clock.tv_sec) * 1000 + tonumber(clock.tv_nsec) / 1e6
end
local boots_per_s = tonumber(os.getenv("BOOTS_PER_S") or "")
local threads = tonumber(os.getenv("WRK_THREADS") or "1")
local next_slot = nil
local lookup_path = os.getenv("LOOKUP_PATH")
local artifact_path = os.getenv("ARTIFACT_PATH")
local body = os.getenv("LOOKUP_BODY")
local static = os.getenv("STATIC") == "1"
local report_body = os.getenv("REPORT_BODY") or ""
local per_boot = report_body ~= "" and 3 or 2
local counter = 0
local statuses = {}

function setup(thread)
  table.insert(statuses, thread)
end

function init(args)
  codes = {}
end

if boots_per_s then
  -- wrk calls delay() before each request: the milliseconds until this thread's next slot.
  delay = function()
    local interval = 1000 * threads / (per_boot * boots_per_s)
    local t = now_ms()
    if next_slot == nil or next_slot < t then
      next_slot = t
    end
    local wait = next_slot - t
    next_slot = next_slot + interval
    return math.floor(wait)
  end
end

request = function()
  counter = counter + 1
  local step = counter % per_boot
  if per_boot == 3 and step == 0 then
    return wrk.format("POST", "/v1/reports", {["Content-Type"] = "application/json"}, report_body)
  end
  if step == 1 then
    if static then
      return wrk.format("GET", lookup_path)
    end
    return wrk.format("POST", lookup_path, {["Content-Type"] = "application/json"}, body)
  end
  return wrk.format("GET", artifact_path)
end

response = function(status, headers, body)
  codes[status] = (codes[status] or 0) + 1
end

done = function(summary, latency, requests)
  local merged = {}
  for _, thread in ipairs(statuses) do
    local c = thread:get("codes")
    for status, n in pairs(c) do
      merged[status] = (merged[status] or 0) + n
    end
  end
  local parts = {}
  for status, n in pairs(merged) do
    table.insert(parts, string.format('"%d": %d', status, n))
  end
  io.write(string.format('BENCH {"requests": %d, "duration_us": %d, "p50_us": %d, "p90_us": %d, "p99_us": %d, "p999_us": %d, "max_us": %d, ' ..
    '"connect_errors": %d, "read_errors": %d, "write_errors": %d, "timeouts": %d, "statuses": {%s}}\n',
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(90),
    latency:percentile(99), latency:percentile(99.9), latency.max,
    summary.errors.connect, summary.errors.read, summary.errors.write, summary.errors.timeout,
    table.concat(parts, ", ")))
end
