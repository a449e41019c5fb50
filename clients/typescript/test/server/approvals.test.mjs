// Approvals against a real backplane: BACKPLANE_GATED_TOOL is gated by a tool policy of the
// agent's namespace for every call. A person decides each request as the tool input's `verdict`
// says: tests/e2e/test_typescript_client.py runs a member of the policy's approver group beside
// this suite, deciding through the approvals service as the dashboard does. Nothing is skipped.
import assert from "node:assert/strict";
import { test } from "node:test";
import { ApprovalDenied, AwaitingApproval } from "../../dist/index.js";
import { agentClient, required } from "./environment.mjs";

const KIND = required("BACKPLANE_KIND");
const GATED_TOOL = required("BACKPLANE_GATED_TOOL");
const bp = agentClient();

async function claimed(input) {
  const task = await bp.createTask(KIND, input);
  const session = await bp.claimSession(undefined, { taskId: task.task_id, leaseSeconds: 30 });
  assert.ok(session !== null, `task ${task.task_id} could not be claimed`);
  return session;
}

const types = async (taskId) => {
  const seen = [];
  for await (const event of bp.iterEvents(taskId)) seen.push(event.type);
  return seen;
};

test("a gated call not waited for throws AwaitingApproval; once granted the same call is made once", async () => {
  const input = { to: "ada@example.com", verdict: "approve" };
  const session = await claimed(input);
  const sent = [];
  const send = async (effectKey, body) => {
    sent.push(effectKey);
    return { message_id: `m-${sent.length}`, to: body.to };
  };
  await session.run(async () => {
    const waiting = await session.callTool(1, GATED_TOOL, input, send, { wait: false, reason: "a first e-mail to Ada" })
      .then(() => assert.fail("a gated call was made without approval"), (error) => error);
    assert.ok(waiting instanceof AwaitingApproval, String(waiting));
    assert.equal(waiting.answer.status, "awaiting_approval");
    assert.deepEqual(sent, []);

    const decided = await bp.waitForApproval(waiting.approvalId, { timeoutMs: 30_000 });
    assert.deepEqual([decided.approval_id, decided.status, decided.tool, decided.reason, decided.input],
      [waiting.approvalId, "granted", GATED_TOOL, "a first e-mail to Ada", input]);
    assert.equal(decided.decisions.length, 1);

    const call = await session.callTool(1, GATED_TOOL, input, send, { wait: false });
    assert.deepEqual([call.status, call.needed, call.result], ["succeeded", true, { message_id: "m-1", to: "ada@example.com" }]);
    const again = await session.callTool(1, GATED_TOOL, input, send, { wait: false });
    assert.deepEqual([again.status, again.replayed, again.result], ["succeeded", true, call.result]);
    assert.equal(sent.length, 1);
    await session.complete({ sent: call.result });
  });
  assert.deepEqual(await types(session.taskId), ["TaskStarted", "TaskClaimed", "ApprovalRequested", "ApprovalGranted",
    "ToolCallDispatched", "ToolCallResultReceived", "TaskCompleted"]);
  assert.equal((await bp.verify(session.taskId)).valid, true);
});

test("a gated call waited for throws ApprovalDenied once a person denies it, and the tool is never called", async () => {
  const input = { to: "bob@example.com", verdict: "deny" };
  const session = await claimed(input);
  await session.run(async () => {
    await assert.rejects(
      session.callTool(1, GATED_TOOL, input, () => assert.fail("a denied call was made"), { reason: "an e-mail to Bob" }),
      (error) => error instanceof ApprovalDenied && error.status === 409 && error.code === "approval_denied");
    // The same call again is refused from the record, without asking anyone a second time.
    await assert.rejects(session.callTool(1, GATED_TOOL, input, () => assert.fail("called")), ApprovalDenied);
    await session.fail("the e-mail to Bob was denied", { retryable: false });
  });
  const seen = await types(session.taskId);
  assert.deepEqual(seen, ["TaskStarted", "TaskClaimed", "ApprovalRequested", "ApprovalDenied", "TaskFailed"]);
  assert.equal((await bp.getTask(session.taskId)).status, "failed");
});
