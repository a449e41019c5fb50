-- wrk script: bench/ingress_apps.py's append, one random task of 100,000 per request
-- (the tasks of pgbench_schema.sql, as pgbench_append.sql picks them).
-- Usage: BENCH_TOKEN=... wrk -t2 -c16 -d15s -s ingress_append.lua http://127.0.0.1:8700
local token = os.getenv("BENCH_TOKEN")
local n = 0
request = function()
  n = n + 1
  local id = math.random(1, 100000)
  local body = '{"type":"step.completed","payload":{"i":' .. n .. ',"note":"load"},"idempotency_key":"k-' .. n .. '"}'
  return wrk.format("POST", "/tasks/" .. id .. "/events/",
    {["Authorization"] = "Bearer " .. token, ["Content-Type"] = "application/json"}, body)
end
-- Counted in each thread's own Lua state; done() (the main state) sums them.
bad = 0
local threads = {}
setup = function(thread)
  threads[#threads + 1] = thread
end
response = function(status, headers, body)
  if status ~= 201 then bad = bad + 1 end
end
done = function(summary, latency, requests)
  local bad = 0
  for _, thread in ipairs(threads) do
    bad = bad + thread:get("bad")
  end
  io.write(string.format("p50_ms=%.1f p99_ms=%.1f rps=%.0f non201=%d\n",
    latency:percentile(50) / 1000, latency:percentile(99) / 1000,
    summary.requests / (summary.duration / 1e6), bad))
end
