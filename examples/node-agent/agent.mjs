// An agent for the backplane in plain JavaScript: Node 18+, its own fetch, no dependencies.
// It uses only the public REST contract (docs/api.md), which any language can speak.
//
// It claims tasks of one kind and does three steps for each, every one safe to repeat:
//   1. ReasoningStepCompleted step 1: the decision to call the tool;
//   2. step 2, the tool call through the backplane's proxy: the backplane calls the registered
//      tool with an Idempotency-Key and records the answer; a repeat gets the recorded answer.
//      A call a tool policy gates waits for people's approval first (docs/approvals.md): the
//      agent reads its request, waiting on the server, and invokes again once it is decided;
//      a denied or expired call fails the task;
//   3. ReasoningStepCompleted step 3, then TaskCompleted with the tool's answer as the output.
// A heartbeat renews the lease meanwhile. After a crash the next holder's claim says
// `recovered: true`; it reads the recovery context and skips the steps the log already has.
// Progress goes to stdout as one JSON line per event; a fatal error to stderr, exit code 1.

import { setTimeout as sleep } from "node:timers/promises";

const config = {
  url: required("BACKPLANE_URL").replace(/\/+$/, ""),
  token: required("BACKPLANE_TOKEN"),
  kind: process.env.AGENT_KIND || "outreach",
  tool: process.env.AGENT_TOOL || "send-email",
  leaseSeconds: positiveInteger("AGENT_LEASE_SECONDS", 30),
  maxTasks: positiveInteger("AGENT_MAX_TASKS", Infinity), // unset: work until stopped
  // Test hook, nothing else: "tool-call" kills this process right after the tool answered,
  // before the next step is recorded (tests/e2e/test_node_agent.py).
  testCrashAfter: process.env.AGENT_CRASH_AFTER || "",
};

const ATTEMPTS = 6; // per request, as the Python SDK's default
const REQUEST_TIMEOUT_MS = 40_000; // a hung connection counts as a network error
const APPROVAL_WAIT_SECONDS = 30; // one read of an approval request waits this long on the server
const IDLE_MS = { first: 250, max: 5_000 }; // polling while nothing is pending

class ApiError extends Error {
  constructor(status, error) {
    super(`${status} ${error.code}: ${error.message}`);
    Object.assign(this, { status, code: error.code, details: error.details });
  }
}

// 409 stale_lease: another holder has the task now (or the lease ran out); 409 task_closed:
// the task ended or was cancelled. Either way nothing more may be written for it: stop at once.
const isLeaseLost = (err) => err instanceof ApiError && err.status === 409 &&
  (err.code === "stale_lease" || err.code === "task_closed");

// Every request is retried on network errors, 429 and 503 (waiting out Retry-After), because
// the server recognises a repeat of each of them: appends carry an idempotency_key (a repeat
// returns the original event), the proxy keys a tool call by task, step and tool (a repeat is
// answered from the record, or re-sent to the tool under the same key), a heartbeat only extends
// the current lease, reads change nothing, and every write names its lease_epoch, so a holder
// that lost its lease while retrying is refused, never applied. The claim is the one repeat the
// server cannot tell from a new claim: if its answer is lost, the retry may lease a second task
// and leave the first unheartbeated; that lease runs out and the stall detector hands it on.
// Any other error answer (4xx, 5xx) is thrown with the contract's error code.
async function api(method, path, body, signal) {
  for (let attempt = 1; ; attempt += 1) {
    let response;
    try {
      response = await fetch(config.url + path, {
        method,
        headers: { Authorization: `Bearer ${config.token}`, "Content-Type": "application/json" },
        body: body === undefined ? undefined : JSON.stringify(body),
        signal: withTimeout(signal),
      });
    } catch (err) {
      if (signal?.aborted || attempt >= ATTEMPTS) throw err;
      await sleep(backoff(attempt), undefined, { signal });
      continue;
    }
    if ((response.status === 429 || response.status === 503) && attempt < ATTEMPTS) {
      const retryAfter = Number(response.headers.get("Retry-After"));
      await response.arrayBuffer(); // read the answer, so the connection can be reused
      const wait = retryAfter > 0 ? Math.min(retryAfter, 60) * 1000 + Math.random() * 250 : backoff(attempt);
      await sleep(wait, undefined, { signal });
      continue;
    }
    if (response.status === 204) return null;
    const text = await response.text();
    let data;
    try {
      data = JSON.parse(text);
    } catch {
      data = { error: { code: "not_json", message: text.slice(0, 200) } }; // e.g. a proxy's HTML page
    }
    if (!response.ok) throw new ApiError(response.status, data.error ?? { code: "unknown", message: text });
    return data;
  }
}

// Full jitter: a random wait up to 200 ms · 2^(attempt−1), capped at 10 s.
const backoff = (attempt) => Math.random() * Math.min(10_000, 200 * 2 ** (attempt - 1));

// The caller's signal (the lease) and a per-request timeout; AbortSignal.any needs Node 20.
function withTimeout(signal) {
  const controller = new AbortController();
  const timer = setTimeout(() => controller.abort(new Error("request timed out")), REQUEST_TIMEOUT_MS);
  timer.unref();
  signal?.addEventListener("abort", () => controller.abort(signal.reason), { once: true });
  return controller.signal;
}

function log(event, fields = {}) {
  console.log(JSON.stringify({ event, ...fields }));
}

// Renews the lease at a third of its length, so two renewals in a row may fail before it ends.
// A renewal that fails otherwise is tried again at the next tick: if the lease does run out,
// the server refuses this holder's writes (409 stale_lease) and the work stops there.
async function keepLeaseAlive(taskId, epoch, lease) {
  while (!lease.signal.aborted) {
    try {
      await sleep((config.leaseSeconds * 1000) / 3, undefined, { signal: lease.signal });
      await api("POST", `/api/v1/tasks/${taskId}/heartbeat/`, { lease_epoch: epoch }, lease.signal);
    } catch (err) {
      if (lease.signal.aborted) return;
      if (isLeaseLost(err)) lease.abort(err); // stops the work's request in flight too
      else log("heartbeat-failed", { task_id: taskId, error: err.message });
    }
  }
}

async function runTask(claim, signal) {
  const task = claim.task;
  const taskId = task.task_id;
  const epoch = claim.lease_epoch;
  const post = (path, body) => api("POST", path, body, signal);
  // Keys derived from the task and the step make a later attempt's repeat harmless too.
  const append = (type, payload, key) =>
    post(`/api/v1/tasks/${taskId}/events/`, { type, payload, idempotency_key: `${taskId}:${key}`, lease_epoch: epoch });

  let done = new Set();
  if (claim.recovered) {
    const context = await api("GET", `/api/v1/tasks/${taskId}/recovery-context/`, undefined, signal);
    done = new Set(context.completed_steps.map((step) => step.step));
    log("context", { task_id: taskId, attempt: context.attempt, completed_steps: [...done] });
  }
  const reason = async (step, payload) => {
    if (done.has(step)) return log("skip-step", { task_id: taskId, step });
    await append("ReasoningStepCompleted", { step, ...payload }, `reasoning:${step}`);
    log("step-done", { task_id: taskId, step });
  };

  await reason(1, { decision: `call ${config.tool}` });

  // Not skipped on recovery: if an earlier attempt got an answer, the proxy returns it from the
  // record (replayed: true) and the tool is not called again.
  const invoke = () => post(`/api/v1/tools/${encodeURIComponent(config.tool)}/invoke/`,
    { task_id: taskId, step: 2, input: task.input, lease_epoch: epoch, reason: `step 2 of ${task.kind}` });
  let call = await invoke();
  while (call.status === "awaiting_approval") { // the same request again after a crash, never a second one
    log("awaiting-approval", { task_id: taskId, approval_id: call.approval_id, group: call.group });
    const request = await api("GET", `/api/v1/approvals/${call.approval_id}/?wait=${APPROVAL_WAIT_SECONDS}`,
      undefined, signal);
    if (request.status === "pending") continue;
    log("approval-decided", { task_id: taskId, approval_id: call.approval_id, status: request.status });
    try {
      call = await invoke(); // granted: the tool is called now; otherwise the refusal says why
    } catch (err) {
      if (!(err instanceof ApiError && (err.code === "approval_denied" || err.code === "approval_expired"))) throw err;
      await append("TaskFailed", { error: `${config.tool}: ${err.message}`, retryable: false }, "failed");
      return log("refused", { task_id: taskId, code: err.code, details: err.details });
    }
  }
  log("tool-answered", { task_id: taskId, key: call.idempotency_key, status: call.status, replayed: call.replayed });
  if (config.testCrashAfter === "tool-call") {
    log("test-crash", { task_id: taskId, after: "tool-call" });
    process.kill(process.pid, "SIGKILL"); // as abrupt as a crash: no cleanup, the lease is left to expire
  }

  if (call.status === "failed") { // the tool refused (a 4xx answer): asking again will not help
    await append("TaskFailed", { error: `${config.tool} refused the call`, retryable: false }, "failed");
    return log("failed", { task_id: taskId, result: call.result });
  }
  await reason(3, { summary: `${config.tool} answered` });
  await append("TaskCompleted", { output: { tool_result: call.result } }, "completed");
  log("completed", { task_id: taskId });
}

async function main() {
  let idle = IDLE_MS.first;
  for (let finished = 0; finished < config.maxTasks;) {
    const claim = await api("POST", "/api/v1/leases/", { kinds: [config.kind], lease_seconds: config.leaseSeconds });
    if (claim === null) { // 204: nothing pending; poll again, waiting longer each time
      await sleep(idle * (0.5 + Math.random() / 2));
      idle = Math.min(idle * 2, IDLE_MS.max);
      continue;
    }
    idle = IDLE_MS.first;
    log("claimed", { task_id: claim.task.task_id, lease_epoch: claim.lease_epoch, recovered: claim.recovered });
    const lease = new AbortController();
    const heartbeat = keepLeaseAlive(claim.task.task_id, claim.lease_epoch, lease);
    try {
      await runTask(claim, lease.signal);
    } catch (err) {
      const lost = isLeaseLost(err) ? err : lease.signal.reason;
      // Any other error ends the process with the lease held: it runs out, and the stall
      // detector hands the task on with one attempt counted (too many, and it is dead-lettered).
      if (!isLeaseLost(lost)) throw err;
      log("lease-lost", { task_id: claim.task.task_id, code: lost.code }); // the next holder carries on
    } finally {
      lease.abort(new Error("done with this task"));
      await heartbeat;
    }
    finished += 1;
  }
}

function required(name) {
  const value = process.env[name];
  if (!value) fail(`${name} is not set`);
  return value;
}

function positiveInteger(name, fallback) {
  const raw = process.env[name];
  if (raw === undefined || raw === "") return fallback;
  const value = Number(raw);
  if (!Number.isInteger(value) || value < 1) fail(`${name} must be a whole number of at least 1, not ${raw}`);
  return value;
}

function fail(message) {
  console.error(JSON.stringify({ event: "fatal", message }));
  process.exit(1);
}

main().catch((err) => {
  if (err instanceof ApiError) {
    console.error(JSON.stringify({ event: "fatal", status: err.status, code: err.code, message: err.message, details: err.details }));
  } else {
    console.error(JSON.stringify({ event: "fatal", message: String(err?.stack ?? err) }));
  }
  process.exit(1);
});
