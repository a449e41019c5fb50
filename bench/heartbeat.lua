-- wrk script: heartbeats over HTTP, each connection thread round robin over leases it holds.
-- Usage: BP_TOKEN=... LEASES=id1:epoch1,id2:epoch2,... wrk -t2 -c16 -d20s -s heartbeat.lua http://127.0.0.1:8000
local token = os.getenv("BP_TOKEN")
local leases = {}
for id, epoch in string.gmatch(os.getenv("LEASES") or "", "([^,:]+):(%d+)") do
  leases[#leases + 1] = {id = id, epoch = epoch}
end
local n = 0
request = function()
  n = n + 1
  local lease = leases[(n % #leases) + 1]
  return wrk.format("POST", "/api/v1/tasks/" .. lease.id .. "/heartbeat/",
    {["Authorization"] = "Bearer " .. token, ["Content-Type"] = "application/json"},
    '{"lease_epoch":' .. lease.epoch .. '}')
end
-- Counted in each thread's own Lua state; done() (the main state) sums them.
bad = 0
local threads = {}
setup = function(thread)
  threads[#threads + 1] = thread
end
response = function(status, headers, body)
  if status ~= 200 then bad = bad + 1 end
end
done = function(summary, latency, requests)
  local bad = 0
  for _, thread in ipairs(threads) do
    bad = bad + thread:get("bad")
  end
  io.write(string.format("p50_ms=%.1f p99_ms=%.1f rps=%.0f non200=%d\n",
    latency:percentile(50) / 1000, latency:percentile(99) / 1000,
    summary.requests / (summary.duration / 1e6), bad))
end
