// Personal data against a real backplane (docs/privacy.md): a value marked with `personal()` is
// sealed by the server before anything hashes or stores it, opened again for the agent's
// namespace by `personalOpen`, and found by `personalLookup` when marked `lookup`. The server
// needs its key-encryption key (BACKPLANE_KEK_FILE; tests/e2e/test_typescript_client.py runs it).
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { test } from "node:test";
import { ValidationError, eventHash, personal, verifyChain } from "../../dist/index.js";
import { agentClient, required } from "./environment.mjs";

const KIND = required("BACKPLANE_KIND");
const bp = agentClient();

const isSealed = (value, subject) => {
  const envelope = value?.$personal;
  return envelope !== undefined && envelope.subject === subject && typeof envelope.sealed === "string"
    && envelope.sealed.length > 0 && !("value" in envelope) && Object.keys(value).length === 1;
};

test("a marked value is sealed in the log, opened for the namespace and found by lookup", async () => {
  const subject = `lead:${randomUUID()}`;
  const email = `${randomUUID()}@example.com`;
  const task = await bp.createTask(KIND, { lead: personal(subject, { name: "Ada", email }) });
  assert.ok(isSealed(task.input.lead, subject), JSON.stringify(task.input));
  const session = await bp.claimSession(undefined, { taskId: task.task_id, leaseSeconds: 30 });
  await session.run(async () => {
    const noted = await session.append("Noted", { email: personal(subject, email, { lookup: true }), plain: "kept" });
    assert.ok(isSealed(noted.payload.email, subject), JSON.stringify(noted.payload));
    assert.equal(noted.payload.plain, "kept");
    assert.ok(!JSON.stringify(noted).includes(email), "the value itself came back in the event");
    // The hash covers the envelope, so the chain verifies without the key.
    assert.equal(eventHash(noted), noted.hash);

    assert.deepEqual(await bp.personalOpen(noted.payload, { taskId: session.taskId }), { email, plain: "kept" });
    assert.deepEqual(await bp.personalOpen({ lead: task.input.lead, n: 1 }), { lead: { name: "Ada", email }, n: 1 });
    // An envelope sent back as it was read is kept as it is, not sealed again.
    const again = await session.append("Noted", { email: noted.payload.email });
    assert.deepEqual(again.payload.email, noted.payload.email);

    assert.deepEqual(await bp.personalLookup(email), [subject]);
    assert.deepEqual(await bp.personalLookup("Ada"), []); // the name was not marked for lookup
    assert.deepEqual(await bp.personalLookup(`${randomUUID()}@example.com`), []);
    await session.complete({});
  });
  const events = [];
  for await (const event of bp.iterEvents(task.task_id)) events.push(event);
  assert.deepEqual(verifyChain(events), { valid: true, firstInvalidSeq: null });
  assert.ok(!JSON.stringify(events).includes(email));
});

test("a marker the server cannot take is refused as a validation error naming the path", async () => {
  await assert.rejects(bp.createTask(KIND, { lead: { $personal: { value: "no subject" } } }), (error) =>
    error instanceof ValidationError && JSON.stringify(error.details).includes("lead"));
  await assert.rejects(bp.createTask(KIND, { lead: { $personal: { subject: "lead:1", value: "x" }, extra: 1 } }), ValidationError);
});
