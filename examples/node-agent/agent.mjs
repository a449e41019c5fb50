// An agent for the backplane in JavaScript, on the TypeScript client (clients/typescript): Node 18+,
// no other dependency. Build the client first: `npm ci` in clients/typescript (its `prepare` builds dist/).
//
// It claims tasks of one kind and does three steps for each, every one safe to repeat:
//   1. ReasoningStepCompleted step 1: the decision to call the tool;
//   2. step 2, the tool call through the backplane's gateway: the backplane calls the registered
//      tool with an Idempotency-Key and records the answer; a repeat gets the recorded answer.
//      A call a tool policy gates waits for people's approval first (docs/approvals.md): the
//      agent reads its request, waiting on the server, and invokes again once it is decided;
//      a denied or expired call fails the task;
//   3. ReasoningStepCompleted step 3 and TaskCompleted (one batch) with the tool's answer as the output.
// The session heartbeats meanwhile; a lost lease (stale or cancelled) abandons the request in
// flight and stops the work on that task. After a crash the next holder's claim says
// `recovered: true`; the session reads the recovery context and skips the steps the log has.
// Progress goes to stdout as one JSON line per event; a fatal error to stderr, exit code 1.

import { setTimeout as sleep } from "node:timers/promises";
import {
  AgentClient, ApprovalDenied, ApprovalExpired, AwaitingApproval, BackplaneAPIError, LeaseLost,
} from "../../clients/typescript/dist/index.js";

const config = {
  url: required("BACKPLANE_URL"),
  token: required("BACKPLANE_TOKEN"),
  kind: process.env.AGENT_KIND || "outreach",
  tool: process.env.AGENT_TOOL || "send-email",
  leaseSeconds: positiveInteger("AGENT_LEASE_SECONDS", 30),
  maxTasks: positiveInteger("AGENT_MAX_TASKS", Infinity), // unset: work until stopped
  // Test hook, nothing else: "tool-call" kills this process right after the tool answered,
  // before the next step is recorded (tests/e2e/test_node_agent.py).
  testCrashAfter: process.env.AGENT_CRASH_AFTER || "",
};

const IDLE_MS = { first: 250, max: 5_000 }; // polling while nothing is pending

// Every request is retried on network errors, 429 and 503 (the client's RetryPolicy), because
// the server recognises a repeat of each of them; the claim is the one it cannot tell from a new
// claim (clients/typescript's RetryPolicy explains why that only delays a task).
// A hung connection counts as a network error after 40 s.
const bp = new AgentClient(config.url, config.token, { timeoutMs: 40_000 });

function log(event, fields = {}) {
  console.log(JSON.stringify({ event, ...fields }));
}

async function runTask(session) {
  const { taskId, task } = session;
  if (session.recovered) {
    const context = await session.context();
    log("context", { task_id: taskId, attempt: context.attempt, completed_steps: context.completed_steps.map((s) => s.step) });
  }
  const reason = async (step, payload) => {
    if ((await session.reason(step, payload)) === null) return log("skip-step", { task_id: taskId, step });
    log("step-done", { task_id: taskId, step });
  };

  await reason(1, { decision: `call ${config.tool}` });

  // Not skipped on recovery: if an earlier attempt got an answer, the gateway returns it from the
  // record (replayed: true) and the tool is not called again.
  let call;
  for (;;) {
    try {
      call = await session.invoke(2, config.tool, task.input, { reason: `step 2 of ${task.kind}`, wait: false });
      break;
    } catch (err) {
      if (err instanceof ApprovalDenied || err instanceof ApprovalExpired) {
        await session.fail(`${config.tool}: ${err.reason}`, { retryable: false });
        return log("refused", { task_id: taskId, code: err.code, details: err.details });
      }
      if (!(err instanceof AwaitingApproval)) throw err;
      // The same request again after a crash, never a second one.
      log("awaiting-approval", { task_id: taskId, approval_id: err.approvalId, group: err.answer.group });
      const request = await bp.waitForApproval(err.approvalId, { signal: session.signal });
      log("approval-decided", { task_id: taskId, approval_id: err.approvalId, status: request.status });
      // Granted: the tool is called now; otherwise the refusal says why.
    }
  }
  log("tool-answered", { task_id: taskId, key: call.idempotency_key, status: call.status, replayed: call.replayed });
  if (config.testCrashAfter === "tool-call") {
    log("test-crash", { task_id: taskId, after: "tool-call" });
    process.kill(process.pid, "SIGKILL"); // as abrupt as a crash: no cleanup, the lease is left to expire
    await sleep(10_000);
  }

  if (call.status === "failed") { // the tool refused (a 4xx answer): asking again will not help
    await session.fail(`${config.tool} refused the call`, { retryable: false });
    return log("failed", { task_id: taskId, result: call.result });
  }
  await session.complete({ tool_result: call.result }, { reasoning: { step: 3, summary: `${config.tool} answered` } });
  log("step-done", { task_id: taskId, step: 3 });
  log("completed", { task_id: taskId });
}

async function main() {
  let idle = IDLE_MS.first;
  for (let finished = 0; finished < config.maxTasks;) {
    const session = await bp.claimSession([config.kind], { leaseSeconds: config.leaseSeconds });
    if (session === null) { // 204: nothing pending; poll again, waiting longer each time
      await sleep(idle * (0.5 + Math.random() / 2));
      idle = Math.min(idle * 2, IDLE_MS.max);
      continue;
    }
    idle = IDLE_MS.first;
    log("claimed", { task_id: session.taskId, lease_epoch: session.leaseEpoch, recovered: session.recovered });
    try {
      await session.run(runTask);
    } catch (err) {
      // Any other error ends the process with the lease held: it runs out, and the stall
      // detector hands the task on with one attempt counted (too many, and it is dead-lettered).
      if (!(err instanceof LeaseLost)) throw err;
      log("lease-lost", { task_id: session.taskId, code: err.code }); // the next holder carries on
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
  if (err instanceof BackplaneAPIError) {
    console.error(JSON.stringify({ event: "fatal", status: err.status, code: err.code, message: err.reason, details: err.details }));
  } else {
    console.error(JSON.stringify({ event: "fatal", message: String(err?.stack ?? err) }));
  }
  process.exit(1);
});
