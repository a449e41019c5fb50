// The integrity routes against a real backplane, checked with src/integrity.ts. Before this suite
// runs, tests/e2e/test_typescript_client.py creates BACKPLANE_SEALED_TASK in the agent's namespace
// and seals twice (what the sealer in Celery beat does): BACKPLANE_EARLIER_TREE_HEAD is the first
// signed head, as an auditor would have kept it, and the latest head is a larger tree. The
// signing key's public half, BACKPLANE_PUBLIC_KEY, is the trust: never the key a head names.
import assert from "node:assert/strict";
import { test } from "node:test";
import {
  NotFound, ProofBundleInvalid, checkProofBundle, eventLeafHash, verifyChain, verifyConsistency, verifyInclusion, verifyTreeHead,
} from "../../dist/index.js";
import { agentClient, required } from "./environment.mjs";

const KIND = required("BACKPLANE_KIND");
const SEALED_TASK = required("BACKPLANE_SEALED_TASK");
const PUBLIC_KEY = required("BACKPLANE_PUBLIC_KEY");
const EARLIER = JSON.parse(required("BACKPLANE_EARLIER_TREE_HEAD"));
const bp = agentClient();

async function eventsOf(taskId) {
  const events = [];
  for await (const event of bp.iterEvents(taskId)) events.push(event);
  return events;
}

test("the latest tree head is signed by the trusted key and extends the earlier one", async () => {
  const head = await bp.latestTreeHead();
  assert.equal(head.public_key, PUBLIC_KEY);
  assert.equal(verifyTreeHead(head, PUBLIC_KEY), true);
  assert.equal(verifyTreeHead({ ...head, tree_size: head.tree_size - 1 }, PUBLIC_KEY), false);
  assert.equal(verifyTreeHead(EARLIER, PUBLIC_KEY), true);
  assert.ok(EARLIER.tree_size < head.tree_size, `${EARLIER.tree_size} < ${head.tree_size}`);

  const consistency = await bp.consistencyProof(EARLIER.tree_size, head.tree_size);
  assert.deepEqual([consistency.first, consistency.second], [EARLIER.tree_size, head.tree_size]);
  assert.equal(verifyConsistency(EARLIER.tree_size, head.tree_size, EARLIER.root_hash, head.root_hash, consistency.proof), true);
  assert.equal(verifyConsistency(EARLIER.tree_size, head.tree_size, head.root_hash, head.root_hash, consistency.proof), false);
  const same = await bp.consistencyProof(head.tree_size, head.tree_size);
  assert.equal(verifyConsistency(head.tree_size, head.tree_size, head.root_hash, head.root_hash, same.proof), true);
  await assert.rejects(bp.consistencyProof(EARLIER.tree_size, head.tree_size + 1), NotFound); // no head of that size
});

test("every event of the sealed task is in both signed trees, and its proof bundle checks out", async () => {
  const head = await bp.latestTreeHead();
  const events = await eventsOf(SEALED_TASK);
  assert.ok(events.length >= 2, `${events.length} events`);
  assert.deepEqual(verifyChain(events), { valid: true, firstInvalidSeq: null });
  for (const event of events) {
    for (const tree of [head, EARLIER]) {
      const proof = await bp.inclusionProof(event.position, { treeSize: tree.tree_size });
      assert.equal(proof.tree_size, tree.tree_size);
      assert.equal(verifyInclusion(eventLeafHash(event.hash), proof.leaf_index, proof.tree_size, proof.audit_path,
        tree.root_hash), true, `${event.seq} in the tree of ${tree.tree_size}`);
    }
  }
  const latest = await bp.inclusionProof(events[0].position);
  assert.equal(latest.tree_size, head.tree_size);

  const bundle = await bp.proofBundle(events.at(-1));
  assert.deepEqual(checkProofBundle(bundle, [PUBLIC_KEY]), { taskId: SEALED_TASK, seq: events.at(-1).seq,
    eventHash: events.at(-1).hash, leafIndex: bundle.leaf_index, treeSize: head.tree_size, signedAt: head.signed_at,
    publicKey: PUBLIC_KEY });
  const changed = { ...bundle, event: { ...bundle.event, payload: { ...bundle.event.payload, changed: true } } };
  assert.throws(() => checkProofBundle(changed, [PUBLIC_KEY]), (error) => error instanceof ProofBundleInvalid
    && error.step === "event_hash");
  const moved = { ...bundle, leaf_index: bundle.leaf_index + 1 };
  assert.throws(() => checkProofBundle(moved, [PUBLIC_KEY]), (error) => error.step === "audit_path");
});

test("an event written after the last seal has no proof yet", async () => {
  const task = await bp.createTask(KIND, { note: "after the seal" });
  const [started] = await eventsOf(task.task_id);
  await assert.rejects(bp.inclusionProof(started.position), NotFound);
});
