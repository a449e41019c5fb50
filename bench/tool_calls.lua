-- wrk script: tool calls over HTTP. Each request dispatches a new call (a step and tool of its
-- own, on one of the tasks in TASKS, which take writes without a lease), or records the answer
-- to a call this thread dispatched.
-- Usage: BP_TOKEN=... TASKS=id1,id2,... wrk -t2 -c16 -d20s -s tool_calls.lua http://127.0.0.1:8000
local token = os.getenv("BP_TOKEN")
local sent = {["Authorization"] = "Bearer " .. token, ["Content-Type"] = "application/json"}
local tasks = {}
for id in string.gmatch(os.getenv("TASKS") or "", "[^,]+") do
  tasks[#tasks + 1] = id
end
local threads = {}
setup = function(thread)
  threads[#threads + 1] = thread
  thread:set("thread_number", #threads)  -- steps of different threads never meet
end
local n = 0
local dispatched = {}
-- A tool of this run's own: a second run's steps are new calls, not replays of the first's.
local tool = "bench.lookup-" .. os.time()
request = function()
  local key = table.remove(dispatched)
  if key then
    return wrk.format("POST", "/api/v1/tool-calls/" .. key .. "/result/", sent,
      '{"status":"succeeded","result":{"ok":true}}')
  end
  n = n + 1
  return wrk.format("POST", "/api/v1/tasks/" .. tasks[(n % #tasks) + 1] .. "/tool-calls/", sent,
    '{"step":' .. (n * 16 + thread_number) .. ',"tool":"' .. tool .. '","input":{"n":' .. n .. '}}')
end
-- Counted in each thread's own Lua state; done() (the main state) sums them.
bad = 0
response = function(status, headers, body)
  if status ~= 201 then
    bad = bad + 1
  elseif string.find(body, '"status":"dispatched"', 1, true) then
    dispatched[#dispatched + 1] = string.match(body, '"idempotency_key":"(%x+)"')
  end
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
