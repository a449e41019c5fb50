-- wrk script: claims and releases over HTTP. Each request claims a task of kind "bench-claim"
-- (300 pending, make bench creates them), or gives back a lease this thread won.
-- Usage: BP_TOKEN=... wrk -t2 -c16 -d20s -s claim_release.lua http://127.0.0.1:8000
local token = os.getenv("BP_TOKEN")
local sent = {["Authorization"] = "Bearer " .. token, ["Content-Type"] = "application/json"}
local held = {}
request = function()
  local lease = table.remove(held)
  if lease then
    return wrk.format("POST", "/api/v1/tasks/" .. lease.id .. "/release/", sent,
      '{"lease_epoch":' .. lease.epoch .. '}')
  end
  return wrk.format("POST", "/api/v1/leases/", sent, '{"kinds":["bench-claim"],"lease_seconds":60}')
end
-- Counted in each thread's own Lua state; done() (the main state) sums them.
bad = 0
local threads = {}
setup = function(thread)
  threads[#threads + 1] = thread
end
response = function(status, headers, body)
  if status ~= 200 then
    bad = bad + 1
  elseif string.find(body, '"recovered"', 1, true) then
    -- A claim's answer (a release's is the task alone): give the lease back next.
    local id = string.match(body, '"task_id":%s*"([^"]+)"')
    local epoch = string.match(body, '"lease_epoch":%s*(%d+)')
    held[#held + 1] = {id = id, epoch = epoch}
  end
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
