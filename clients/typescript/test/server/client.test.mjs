// The TypeScript client against a real backplane: BACKPLANE_URL and BACKPLANE_TOKEN (an agent
// allowed BACKPLANE_KIND and BACKPLANE_CHILD_KIND), BACKPLANE_TOOL (a tool registered for the
// agent's namespace, for the gateway). tests/e2e/test_typescript_client.py runs it against the
// product's own processes. A missing variable fails the suite; nothing here is skipped.
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { createServer } from "node:http";
import { after, before, test } from "node:test";
import {
  AgentClient, IdempotencyMismatch, LeaseLost, NotAuthenticated, NotFound, RetryPolicy, SandboxRefused, SeqConflict,
  TaskClosed, ToolCallFailed, ValidationError, modelCost, promptSha256, replay, usageFromAnthropic,
} from "../../dist/index.js";
import { agentClient, required } from "./environment.mjs";

const URL_ = required("BACKPLANE_URL");
const KIND = required("BACKPLANE_KIND");
const CHILD_KIND = required("BACKPLANE_CHILD_KIND");
const TOOL = required("BACKPLANE_TOOL");
const bp = agentClient();

// The agent's own tool (the proxy records the call; the agent makes it): acts once per key.
let tool;
let toolUrl;
const effects = new Map();
before(async () => {
  tool = createServer((request, response) => {
    let body = "";
    request.on("data", (chunk) => { body += chunk; }).on("end", () => {
      const key = request.headers["idempotency-key"];
      if (JSON.parse(body).to === "nobody") {
        response.writeHead(422, { "Content-Type": "application/json" }).end('{"error": "no such mailbox"}');
        return;
      }
      if (!effects.has(key)) effects.set(key, { message_id: randomUUID() });
      response.writeHead(200, { "Content-Type": "application/json" }).end(JSON.stringify(effects.get(key)));
    });
  });
  await new Promise((resolve) => tool.listen(0, "127.0.0.1", resolve));
  toolUrl = `http://127.0.0.1:${tool.address().port}`;
});
after(() => tool.close());

async function claimed(input = { to: "ada@example.com" }) {
  const task = await bp.createTask(KIND, input);
  const session = await bp.claimSession(undefined, { taskId: task.task_id, leaseSeconds: 30 });
  assert.ok(session !== null, `task ${task.task_id} could not be claimed`);
  return session;
}

const send = async (effectKey, input) => {
  const answer = await fetch(toolUrl, { method: "POST", body: JSON.stringify(input),
    headers: { "Content-Type": "application/json", "Idempotency-Key": effectKey } });
  if (answer.status === 422) throw new ToolCallFailed(await answer.json());
  return answer.json();
};

test("a session works a task through and the chain verifies", async () => {
  const session = await claimed();
  await session.run(async () => {
    assert.equal(session.attempt, 1);
    assert.ok(await session.reason(1, { decision: "send" }));
    assert.equal(await session.reason(1, { decision: "send again" }), null); // already in the log: nothing sent
    let asked = 0;
    const ask = () => {
      asked += 1;
      return { output: { subject: "Hello" }, usage: usageFromAnthropic({ usage: { input_tokens: 10, output_tokens: 5,
        cache_read_input_tokens: 90 } }), cost: modelCost("0.0004") };
    };
    const prompt = [{ role: "user", content: "Write to Ada" }];
    assert.deepEqual(await session.modelCall(2, "claude-test", prompt, ask, { provider: "anthropic" }), { subject: "Hello" });
    assert.deepEqual(await session.modelCall(2, "claude-test", prompt, ask, { provider: "anthropic" }), { subject: "Hello" });
    assert.equal(asked, 1);
    const recorded = await session.recordedModelCall(2);
    assert.equal(recorded.prompt_sha256, promptSha256(prompt));
    assert.deepEqual(recorded.usage, { input_tokens: 100, output_tokens: 5, cache_read_input_tokens: 90 });

    const call = await session.callTool(3, "send-email", { to: "ada@example.com" }, send);
    assert.deepEqual([call.status, call.needed, call.replayed], ["succeeded", true, false]);
    assert.deepEqual(effects.get(call.effectKey), call.result);
    const again = await session.callTool(3, "send-email", { to: "ada@example.com" }, () => assert.fail("called twice"));
    assert.deepEqual([again.status, again.needed, again.replayed, again.result], ["succeeded", false, true, call.result]);

    const refused = await session.callTool(4, "send-email", { to: "nobody" }, send);
    assert.deepEqual([refused.status, refused.result], ["failed", { error: "no such mailbox" }]);

    const invoked = await session.invoke(5, TOOL, { to: "ada@example.com" }, { reason: "step 5" });
    assert.deepEqual([invoked.status, invoked.replayed], ["succeeded", false]);
    assert.deepEqual((await session.invoke(5, TOOL, { to: "ada@example.com" })).replayed, true);
    assert.deepEqual(await session.toolResult(5, TOOL), { status: "succeeded", result: invoked.result,
      idempotency_key: invoked.idempotency_key });

    const done = await session.complete({ sent: call.result }, { reasoning: { step: 6, summary: "sent" } });
    assert.equal(done.type, "TaskCompleted");
    assert.equal(session.ended, "completed");
    await assert.rejects(session.reason(7, {}), (error) => error instanceof LeaseLost && error.sent === false);
  });
  const task = await bp.getTask(session.taskId);
  assert.equal(task.status, "completed");
  assert.deepEqual(await bp.verify(session.taskId), { valid: true, checked: task.last_seq, head_hash: task.head_hash,
    first_invalid_seq: null });
  const types = [];
  for await (const event of bp.iterEvents(session.taskId, { pageSize: 3 })) types.push(event.type);
  assert.deepEqual(types, ["TaskStarted", "TaskClaimed", "ReasoningStepCompleted", "LLMCalled", "ToolCallDispatched",
    "ToolCallResultReceived", "ToolCallDispatched", "ToolCallResultReceived", "ToolCallDispatched", "ToolCallResultReceived",
    "ReasoningStepCompleted", "TaskCompleted"]);
});

test("a repeat with the same key is answered with the original; another body is refused", async () => {
  const session = await claimed();
  await session.run(async () => {
    const first = await session.append("Noted", { n: 1 }, { idempotencyKey: `${session.taskId}:note` });
    assert.equal(bp.lastReplayed, false);
    const repeat = await session.append("Noted", { n: 1 }, { idempotencyKey: `${session.taskId}:note` });
    assert.equal(bp.lastReplayed, true);
    assert.equal(repeat.seq, first.seq);
    await assert.rejects(session.append("Noted", { n: 2 }, { idempotencyKey: `${session.taskId}:note` }), IdempotencyMismatch);
    await session.release();
  });
});

test("the contract's refusals come back as their classes", async () => {
  await assert.rejects(bp.getTask(randomUUID()), NotFound);
  await assert.rejects(new AgentClient(URL_, "not-a-token", { retry: RetryPolicy.none() }).getTask(randomUUID()), NotAuthenticated);
  const session = await claimed();
  await session.run(async () => {
    await assert.rejects(session.append("Noted", {}, { expectedSeq: 1 }), (error) =>
      error instanceof SeqConflict && error.details.last_seq === 2);
    await assert.rejects(session.append("not a type", {}), ValidationError);
    await assert.rejects(bp.append(session.taskId, "Noted", {}, { leaseEpoch: session.leaseEpoch + 1 }), (error) =>
      error instanceof LeaseLost && error.code === "stale_lease");
    await session.complete({});
  });
  await assert.rejects(bp.append(session.taskId, "Noted", {}), TaskClosed);
});

test("a sub-agent's result comes back into its parent's log", async () => {
  const parent = await claimed();
  await parent.run(async () => {
    const child = await parent.subtask(1, CHILD_KIND, { company: "Globex" });
    assert.equal((await parent.subtask(1, CHILD_KIND, { company: "Globex" })).task_id, child.task_id);
    const worker = await bp.claimSession([CHILD_KIND], { taskId: child.task_id, leaseSeconds: 30 });
    await worker.run(() => worker.complete({ score: 7 }));
    const result = await parent.waitForSubtask(child.task_id, { timeoutMs: 20_000 });
    assert.deepEqual([result.status, result.output], ["completed", { score: 7 }]);
    assert.equal((await parent.subtaskOf(1, CHILD_KIND)).child_task_id, child.task_id);
    await parent.complete({ child: result.output });
  });
});

test("a sandbox replay answers from the record and reports where it drifts", async () => {
  const agent = (template) => async (session) => {
    const prompt = [{ role: "user", content: template }];
    const draft = await session.modelCall(1, "gpt-test", prompt, () => assert.fail("a recorded replay asked the model"));
    const call = await session.callTool(2, "send-email", { to: "ada@example.com" }, send);
    return session.complete({ draft, sent: call.result });
  };
  const source = await claimed();
  await source.run(async () => {
    await source.modelCall(1, "gpt-test", [{ role: "user", content: "Write to Ada" }], () => ({ output: "Hi Ada" }));
    const call = await source.callTool(2, "send-email", { to: "ada@example.com" }, send);
    await source.complete({ draft: "Hi Ada", sent: call.result });
  });
  const before = effects.size;
  const same = await replay(bp, source.taskId, agent("Write to Ada"));
  assert.equal(same.error, null);
  assert.deepEqual([same.drifted, same.firstDivergence, same.counts.changed], [false, null, 0]);
  const changed = await replay(bp, source.taskId, agent("Write to Ada, briefly"));
  assert.deepEqual([changed.firstDivergence.kind, changed.firstDivergence.path, changed.firstDivergence.a.type],
    ["changed", "$.payload.prompt[0].content", "LLMCalled"]);
  const unknown = await replay(bp, source.taskId, async (session) => {
    await session.callTool(9, "send-email", { to: "ada@example.com" }, send);
  });
  assert.ok(unknown.error instanceof SandboxRefused, String(unknown.error));
  assert.equal(effects.size, before, "a replay reached the tool");
  assert.equal((await bp.getTask(unknown.sandboxTaskId)).status, "failed");
});
