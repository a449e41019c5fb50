-- wrk script: single-event appends over HTTP as append.lua, each with one outbox message (a topic
-- of the agent's own, the relay publishes it after commit).
-- Usage: BP_TOKEN=... TASKS=id1,id2,... wrk -t2 -c16 -d20s -s append_outbox.lua http://127.0.0.1:8000
local token = os.getenv("BP_TOKEN")
local tasks = {}
for id in string.gmatch(os.getenv("TASKS") or "", "[^,]+") do tasks[#tasks + 1] = id end
local n = 0
request = function()
  n = n + 1
  local id = tasks[(n % #tasks) + 1]
  local body = '{"type":"Noted","payload":{"i":' .. n .. ',"note":"load"},"outbox":[{"topic":"bench.noted","payload":{"i":' .. n .. '}}]}'
  return wrk.format("POST", "/api/v1/tasks/" .. id .. "/events/",
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
