-- wrk script: new tool-call dispatches over HTTP, nothing else (bench/http_bench.py's "gated
-- dispatch" rows). Each request dispatches a new call of TOOL (a step of its own, on one of the
-- tasks in TASKS, which take writes without a lease) with input {"amount": AMOUNT, "n": n}, and
-- expects EXPECT (201: made; 202: waiting for people's approval).
-- Usage: BP_TOKEN=... TASKS=id1,... TOOL=bench.pay AMOUNT=10 EXPECT=201 [FIRST_STEP=0] wrk -t2 -c16 -d20s -s dispatch.lua URL
local token = os.getenv("BP_TOKEN")
local sent = {["Authorization"] = "Bearer " .. token, ["Content-Type"] = "application/json"}
local tasks = {}
for id in string.gmatch(os.getenv("TASKS") or "", "[^,]+") do
  tasks[#tasks + 1] = id
end
local tool = os.getenv("TOOL")
local amount = os.getenv("AMOUNT") or "10"
local expect = tonumber(os.getenv("EXPECT") or "201")
-- A later run of the same tool starts its steps past the earlier one's: new calls, not replays.
local first_step = tonumber(os.getenv("FIRST_STEP") or "0")
local threads = {}
setup = function(thread)
  threads[#threads + 1] = thread
  thread:set("thread_number", #threads)  -- steps of different threads never meet
end
local n = 0
request = function()
  n = n + 1
  return wrk.format("POST", "/api/v1/tasks/" .. tasks[(n % #tasks) + 1] .. "/tool-calls/", sent,
    '{"step":' .. (first_step + n * 16 + thread_number) .. ',"tool":"' .. tool .. '","input":{"amount":' .. amount
    .. ',"n":' .. n .. '},"reason":"bench"}')
end
bad = 0
response = function(status, headers, body)
  if status ~= expect then
    bad = bad + 1
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
