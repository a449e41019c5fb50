// src/integrity.ts against the shared vectors (vectors/README.md): RFC 6962 / RFC 9162 trees,
// hashers and proofs, transparency-dev/merkle's probes (every one marked wantErr rejected), the
// product's chains and signed tree heads, its Merkle tree of events and its proof bundles. The
// server, the Python verifier and the Go verifier read the same files; a divergence fails here.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { test } from "node:test";
import {
  EMPTY_ROOT, ProofBundleInvalid, checkProofBundle, eventHash, eventLeafHash, merkleLeafHash, merkleNodeHash, merkleRoot,
  treeHeadMessage, verifyChain, verifyConsistency, verifyInclusion, verifyTreeHead,
} from "../../dist/index.js";

const VECTORS = new URL("../../../../vectors/", import.meta.url);
const readJson = (name) => JSON.parse(readFileSync(new URL(name, VECTORS), "utf8"));

const rfc6962 = readJson("rfc6962.json");
const probes = readJson("rfc6962_probes.json");
const product = readJson("product.json");
const merkle = readJson("merkle.json");

// A hash with one bit flipped: what a tampered proof element or root looks like.
const flipped = (hex) => (parseInt(hex[0], 16) ^ 1).toString(16) + hex.slice(1);

// --- RFC 6962 / RFC 9162 (rfc6962.json) --------------------------------------------------------

test("the RFC 6962 vectors are all there to test", () => {
  assert.deepEqual([rfc6962.leaves_hex.length, rfc6962.leaf_hashes.length, Object.keys(rfc6962.roots).length,
    rfc6962.inclusion.length, rfc6962.consistency.length, rfc6962.hasher.length], [8, 8, 9, 7, 5, 7]);
});

for (const [index, vector] of rfc6962.hasher.entries()) {
  test(`hasher vector ${index} (${vector.kind}) is ${vector.expected.slice(0, 16)}…`, () => {
    const hash = { empty_tree: () => EMPTY_ROOT, leaf: () => merkleLeafHash(vector.data_hex),
      node: () => merkleNodeHash(vector.left_hex, vector.right_hex) }[vector.kind];
    assert.ok(hash, `unknown hasher kind ${vector.kind}`);
    assert.equal(hash(), vector.expected);
  });
}

test("the 8 leaves hash to the published leaf hashes", () => {
  assert.deepEqual(rfc6962.leaves_hex.map(merkleLeafHash), rfc6962.leaf_hashes);
});

test("every complete subtree hashes to the published node hash", () => {
  let checked = 0;
  for (const [level, hashes] of rfc6962.node_hashes_by_level.levels.entries()) {
    for (const [index, expected] of hashes.entries()) {
      const width = 2 ** level;
      assert.equal(merkleRoot(rfc6962.leaf_hashes.slice(index * width, (index + 1) * width)), expected, `${level}/${index}`);
      checked += 1;
    }
  }
  assert.equal(checked, 15); // 8 + 4 + 2 + 1
});

test("the root of the first n leaves is the published root, n from 0 to 8", () => {
  for (const [n, root] of Object.entries(rfc6962.roots)) {
    assert.equal(merkleRoot(rfc6962.leaf_hashes.slice(0, Number(n))), root, `n = ${n}`);
  }
  assert.equal(rfc6962.roots["0"], EMPTY_ROOT);
});

for (const vector of rfc6962.inclusion) {
  test(`RFC 6962 inclusion of leaf ${vector.leaf_index} in the tree of ${vector.tree_size}`, () => {
    assert.equal(merkleLeafHash(vector.leaf_hex), vector.leaf_hash);
    assert.equal(vector.root, rfc6962.roots[String(vector.tree_size)]);
    assert.equal(verifyInclusion(vector.leaf_hash, vector.leaf_index, vector.tree_size, vector.path, vector.root), true);
    assert.equal(verifyInclusion(vector.leaf_hash, vector.leaf_index, vector.tree_size, vector.path, flipped(vector.root)), false);
  });
}

for (const vector of rfc6962.consistency) {
  test(`RFC 6962 consistency from ${vector.first} to ${vector.second}`, () => {
    const { first, second, first_root: firstRoot, second_root: secondRoot, proof } = vector;
    assert.equal(verifyConsistency(first, second, firstRoot, secondRoot, proof), true);
    assert.equal(verifyConsistency(first, second, firstRoot, flipped(secondRoot), proof), false);
    assert.equal(verifyConsistency(first, second, flipped(firstRoot), secondRoot, proof), false);
  });
}

test("a leaf of a real CT log is included in its tree of 3,630,887", () => {
  const vector = rfc6962.ct_log_inclusion;
  assert.equal(merkleLeafHash(vector.leaf_input_hex), vector.leaf_hash);
  assert.equal(verifyInclusion(vector.leaf_hash, vector.leaf_index, vector.tree_size, vector.path, vector.root), true);
  assert.equal(verifyInclusion(vector.leaf_hash, vector.leaf_index + 1, vector.tree_size, vector.path, vector.root), false);
});

// --- transparency-dev/merkle's probes (rfc6962_probes.json) ---------------------------------------

test("every published probe is there to test, the accepted and the rejected", () => {
  const count = (list, wantErr) => list.filter((probe) => probe.wantErr === wantErr).length;
  assert.deepEqual([probes.inclusion.length, probes.consistency.length], [98, 98]);
  assert.deepEqual([count(probes.inclusion, false), count(probes.consistency, false)], [6, 6]);
});

for (const probe of probes.inclusion) {
  test(`inclusion probe ${probe.file} (${probe.desc}) is ${probe.wantErr ? "rejected" : "accepted"}`, () => {
    assert.equal(verifyInclusion(probe.leafHash, probe.leafIdx, probe.treeSize, probe.proof ?? [], probe.root), !probe.wantErr);
  });
}

for (const probe of probes.consistency) {
  test(`consistency probe ${probe.file} (${probe.desc}) is ${probe.wantErr ? "rejected" : "accepted"}`, () => {
    assert.equal(verifyConsistency(probe.size1, probe.size2, probe.root1, probe.root2, probe.proof ?? []), !probe.wantErr);
  });
}

test("malformed sizes and proofs are rejected, never thrown", () => {
  const [leaf] = rfc6962.leaf_hashes;
  const root = rfc6962.roots["1"];
  for (const [index, size] of [[-1, 1], [0, 0], [1, 1], [0.5, 1], [0, 2 ** 53], ["0", 1], [0n, 1]]) {
    assert.equal(verifyInclusion(leaf, index, size, [], root), false, `${index} of ${size}`);
  }
  assert.equal(verifyInclusion(leaf, 0, 1, [], root.toUpperCase()), false);
  assert.equal(verifyInclusion(leaf, 0, 1, null, root), false);
  assert.equal(verifyConsistency(1, 1, root, root, null), false);
  assert.equal(verifyConsistency(1, 1, root, root, [root]), false);
  assert.equal(verifyConsistency(1, 1, "abc", "abc", []), false); // not whole bytes
  // The same bytes spelt in capitals are no hash of the API's: refused, not thrown.
  const inclusion = rfc6962.inclusion.find((vector) => vector.path.length > 0);
  const upper = [inclusion.path[0].toUpperCase(), ...inclusion.path.slice(1)];
  assert.equal(verifyInclusion(inclusion.leaf_hash, inclusion.leaf_index, inclusion.tree_size, upper, inclusion.root), false);
  const consistency = rfc6962.consistency.find((vector) => vector.proof.length > 0);
  assert.equal(verifyConsistency(consistency.first, consistency.second, consistency.first_root, consistency.second_root,
    [consistency.proof[0].toUpperCase(), ...consistency.proof.slice(1)]), false);
});

// --- the product's chains and tree heads (product.json) ----------------------------------------

test("the product's vectors hold a valid chain and three broken ones, and three tree heads", () => {
  assert.deepEqual(product.chains.map((chain) => chain.first_invalid_seq), [null, 2, 3, 3]);
  assert.deepEqual(product.tree_heads.map((head) => head.valid), [true, false, false]);
});

test("each event of the valid chain hashes to its hash, position and hash left out", () => {
  const [valid] = product.chains;
  for (const event of valid.events) {
    assert.equal(eventHash(event), event.hash);
    assert.equal(eventHash({ ...event, position: event.position + 1, hash: "" }), event.hash);
  }
});

for (const chain of product.chains) {
  test(`chain "${chain.name}": the first invalid seq is ${chain.first_invalid_seq}`, () => {
    assert.equal(chain.first_invalid_seq === null, chain.valid);
    assert.deepEqual(verifyChain(chain.events), { valid: chain.valid, firstInvalidSeq: chain.first_invalid_seq });
  });
}

test("a chain that does not start at seq 1 on 64 zeros, or has a gap, is broken where it breaks", () => {
  const [valid] = product.chains;
  assert.deepEqual(verifyChain(valid.events.slice(1)), { valid: false, firstInvalidSeq: 2 });
  assert.deepEqual(verifyChain([]), { valid: true, firstInvalidSeq: null });
  const renumbered = valid.events.map((event, index) => (index === 1 ? { ...event, seq: 3 } : event));
  assert.deepEqual(verifyChain(renumbered), { valid: false, firstInvalidSeq: 3 });
  // Hashes and links rewritten to match: only the seq rule sees the gap.
  const rechained = [];
  for (const [index, event] of valid.events.entries()) {
    const seq = index === 0 ? 1 : index + 2;
    const linked = { ...event, seq, prev_hash: index === 0 ? "0".repeat(64) : rechained[index - 1].hash };
    rechained.push({ ...linked, hash: eventHash(linked) });
  }
  assert.deepEqual(verifyChain(rechained), { valid: false, firstInvalidSeq: 3 });
  assert.deepEqual(verifyChain(rechained.slice(0, 1)), { valid: true, firstInvalidSeq: null });
});

for (const head of product.tree_heads) {
  test(`tree head "${head.name}" ${head.valid ? "verifies" : "is refused"}`, () => {
    if (head.message !== undefined) assert.equal(Buffer.from(treeHeadMessage(head)).toString("utf8"), head.message);
    assert.equal(verifyTreeHead(head, head.public_key), head.valid);
  });
}

test("a tree head verifies only with its own key, and its fields exactly as signed", () => {
  const [head] = product.tree_heads;
  assert.equal(verifyTreeHead(head, merkle.public_key), true); // the same seed signs both files
  assert.equal(verifyTreeHead(head, flipped(head.public_key)), false);
  assert.equal(verifyTreeHead({ ...head, tree_size: head.tree_size + 1 }, head.public_key), false);
  assert.equal(verifyTreeHead({ ...head, signed_at: head.signed_at.replace(".000000Z", "Z") }, head.public_key), false);
  assert.equal(verifyTreeHead({ ...head, signature: head.signature.toUpperCase() }, head.public_key), false);
  assert.equal(verifyTreeHead(head, "not a key"), false);
});

// --- the product's Merkle tree of events and its proof bundles (merkle.json) -------------------

test("the product's tree is all there to test", () => {
  assert.deepEqual([merkle.event_hashes.length, Object.keys(merkle.roots).length, merkle.inclusion.length,
    merkle.consistency.length, merkle.proof_bundles.length], [11, 12, 66, 66, 7]);
  assert.deepEqual(merkle.event_hashes.slice(0, 3), product.chains[0].events.map((event) => event.hash));
});

test("an event's leaf hash is SHA-256(0x00 ‖ the 32 bytes of its hash)", () => {
  assert.deepEqual(merkle.event_hashes.map(eventLeafHash), merkle.leaf_hashes);
  assert.throws(() => eventLeafHash(merkle.event_hashes[0].toUpperCase()), TypeError);
  assert.throws(() => eventLeafHash(merkle.event_hashes[0].slice(2)), TypeError);
});

test("the root of the first n events is the product's root, n from 0 to 11", () => {
  for (let n = 0; n <= 11; n += 1) assert.equal(merkleRoot(merkle.leaf_hashes.slice(0, n)), merkle.roots[String(n)], `n = ${n}`);
});

for (const vector of merkle.inclusion) {
  test(`the product's inclusion of leaf ${vector.leaf_index} in the tree of ${vector.tree_size}`, () => {
    const { leaf_index: index, tree_size: size, path } = vector;
    const root = merkle.roots[String(size)];
    assert.equal(verifyInclusion(merkle.leaf_hashes[index], index, size, path, root), true);
    // Another leaf at that index, or the path of a tree one larger or smaller, proves nothing.
    assert.equal(verifyInclusion(merkle.leaf_hashes[(index + 1) % 11], index, size, path, root), false);
    if (size > 1) assert.equal(verifyInclusion(merkle.leaf_hashes[index], index, size, path, merkle.roots[String(size - 1)]), false);
    for (let i = 0; i < path.length; i += 1) {
      const tampered = path.map((hash, j) => (j === i ? flipped(hash) : hash));
      assert.equal(verifyInclusion(merkle.leaf_hashes[index], index, size, tampered, root), false, `path[${i}] changed`);
    }
  });
}

for (const vector of merkle.consistency) {
  test(`the product's consistency from ${vector.first} to ${vector.second}`, () => {
    const { first, second, proof } = vector;
    const [firstRoot, secondRoot] = [merkle.roots[String(first)], merkle.roots[String(second)]];
    assert.equal(verifyConsistency(first, second, firstRoot, secondRoot, proof), true);
    assert.equal(verifyConsistency(first, second, firstRoot, EMPTY_ROOT, proof), false);
    if (proof.length > 0) {
      assert.equal(verifyConsistency(first, second, firstRoot, secondRoot, proof.slice(1)), false);
      assert.equal(verifyConsistency(first, second, firstRoot, secondRoot, [...proof.slice(0, -1), flipped(proof.at(-1))]), false);
    }
  });
}

const [validBundle] = merkle.proof_bundles;

for (const { name, valid, fails, bundle } of merkle.proof_bundles) {
  test(`proof bundle "${name}" ${valid ? "checks out" : `fails at ${fails}`}`, () => {
    if (valid) {
      assert.deepEqual(checkProofBundle(bundle, [merkle.public_key]), {
        taskId: bundle.event.task_id, seq: bundle.event.seq, eventHash: bundle.event.hash, leafIndex: bundle.leaf_index,
        treeSize: bundle.tree_size, signedAt: bundle.tree_head.signed_at, publicKey: merkle.public_key });
    } else {
      assert.throws(() => checkProofBundle(bundle, [merkle.public_key]),
        (error) => error instanceof ProofBundleInvalid && error.step === fails, `expected a failure at ${fails}`);
    }
  });
}

test("a bundle is trusted by the keys given, never by the key it names itself", () => {
  const other = flipped(merkle.public_key);
  assert.throws(() => checkProofBundle(validBundle.bundle, [other]), (error) => error.step === "signature");
  assert.throws(() => checkProofBundle(validBundle.bundle, []), (error) => error.step === "signature");
  assert.equal(checkProofBundle(validBundle.bundle, [other, merkle.public_key]).publicKey, merkle.public_key);
});

test("what is no bundle fails at its format", () => {
  const { bundle } = validBundle;
  for (const broken of [null, "x", {}, { ...bundle, format: "backplane-inclusion-proof/2" }, { ...bundle, tree_head: undefined },
    { ...bundle, event: [] }]) {
    assert.throws(() => checkProofBundle(broken, [merkle.public_key]),
      (error) => error instanceof ProofBundleInvalid && error.step === "format", JSON.stringify(broken));
  }
  assert.throws(() => checkProofBundle({ ...bundle, tree_size: 10 }, [merkle.public_key]), (error) => error.step === "audit_path");
});
