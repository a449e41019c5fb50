// A TypeScript-client agent process for tests/e2e/test_typescript_client.py: claims one task of
// AGENT_KIND and runs outreach.mjs's work on it. AGENT_CRASH_AFTER (a test hook, nothing else)
// SIGKILLs the process right after the tool answered ("tool-answered": before the answer is
// recorded) or right after the answer was recorded ("tool-recorded"). One JSON line per event.
import { setTimeout as sleep } from "node:timers/promises";
import { AgentClient, LeaseLost, RetryPolicy } from "../../dist/index.js";
import { work } from "./outreach.mjs";

const env = (name) => {
  const value = process.env[name];
  if (!value) throw new Error(`${name} is not set`);
  return value;
};
const report = (event, fields = {}) => console.log(JSON.stringify({ event, ...fields }));
const crashAfter = process.env.AGENT_CRASH_AFTER ?? "";
const crash = (after) => async () => {
  if (crashAfter !== after) return;
  report("test-crash", { after });
  process.kill(process.pid, "SIGKILL"); // as abrupt as a crash: no cleanup, the lease is left to expire
  await sleep(10_000);
};

const bp = new AgentClient(env("BACKPLANE_URL"), env("BACKPLANE_TOKEN"),
  { retry: new RetryPolicy({ attempts: 5, baseDelayMs: 50, maxDelayMs: 1000 }) });
const leaseSeconds = Number(process.env.AGENT_LEASE_SECONDS ?? "30");
const deadline = Date.now() + Number(process.env.AGENT_CLAIM_TIMEOUT_SECONDS ?? "30") * 1000;
let session = null;
while (session === null) {
  session = await bp.claimSession([env("AGENT_KIND")], { leaseSeconds });
  if (session === null) {
    if (Date.now() > deadline) throw new Error("nothing to claim");
    await sleep(100);
  }
}
report("claimed", { task_id: session.taskId, recovered: session.recovered, attempt: session.attempt });
try {
  await session.run(async () => {
    if (session.recovered) {
      const context = await session.context();
      report("context", { attempt: context.attempt, completed_steps: context.completed_steps.map((s) => s.step),
        in_flight: context.in_flight_tool_calls.map((c) => c.step) });
    }
    const end = await work(session, { toolUrl: env("TOOL_URL"), report,
      hooks: { afterToolAnswered: crash("tool-answered"), afterToolRecorded: crash("tool-recorded") } });
    report(end.type === "TaskCompleted" ? "completed" : "failed", { task_id: session.taskId });
  });
} catch (error) {
  if (!(error instanceof LeaseLost)) throw error;
  report("lease-lost", { task_id: session.taskId, code: error.code });
}
