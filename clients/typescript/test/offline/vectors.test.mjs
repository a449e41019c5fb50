// The shared vectors (vectors/README.md): RFC 8785 input/output pairs and numbers, and the
// product's idempotency keys. The server and the Python client read the same files;
// a divergence here fails this suite.
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { readFileSync, readdirSync } from "node:fs";
import { test } from "node:test";
import { CanonicalizationError, canonicalJson, promptSha256 } from "../../dist/index.js";

const VECTORS = new URL("../../../../vectors/", import.meta.url);
const read = (name) => readFileSync(new URL(name, VECTORS));
const readJson = (name) => JSON.parse(read(name).toString("utf8"));

const pairs = readdirSync(new URL("rfc8785/", VECTORS)).filter((name) => name.endsWith(".input.json"))
  .map((name) => name.slice(0, -".input.json".length)).filter((name) => !name.endsWith("-sorting"));

test("every RFC 8785 input/output pair is there to test", () => {
  assert.deepEqual(pairs.sort(), ["arrays", "french", "rfc8785-sec3.2.2", "structures", "unicode", "values", "weird"]);
});

for (const name of pairs) {
  test(`it writes ${name} byte for byte as RFC 8785 does`, () => {
    const input = JSON.parse(read(`rfc8785/${name}.input.json`).toString("utf8"));
    assert.equal(Buffer.from(canonicalJson(input)).toString("utf8"), read(`rfc8785/${name}.output.json`).toString("utf8"));
  });
}

test("it sorts properties by UTF-16 code units (RFC 8785 §3.2.3)", () => {
  const input = readJson("rfc8785/rfc8785-sec3.2.3-sorting.input.json");
  const order = readJson("rfc8785/rfc8785-sec3.2.3-sorting.expected-values-order.json");
  // Read off the text: a parsed object would list its integer-like key ("1") first.
  const text = Buffer.from(canonicalJson(input)).toString("utf8");
  assert.deepEqual([...text.matchAll(/:("(?:[^"\\]|\\.)*")/g)].map(([, value]) => JSON.parse(value)), order);
});

const numbers = readJson("rfc8785/numbers.json");
for (const row of [...numbers.rows, ...numbers.extra_samples]) {
  test(`number ${row.ieee_hex} is ${row.expected ?? "refused"}`, () => {
    const value = Buffer.from(row.ieee_hex.padStart(16, "0"), "hex").readDoubleBE(0);
    if (row.expected === null) {
      assert.ok(row.error);
      assert.throws(() => canonicalJson(value), CanonicalizationError);
    } else {
      assert.equal(Buffer.from(canonicalJson(value)).toString("utf8"), row.expected);
    }
  });
}

test("it refuses what has no canonical form", () => {
  for (const value of [NaN, Infinity, "\ud800", { a: "x\udc00" }, [undefined], () => 1, Symbol("s")]) {
    assert.throws(() => canonicalJson(value), CanonicalizationError, String(value));
  }
});

test("an integer beyond 2**53 is the double it denotes, as the server writes it", () => {
  assert.equal(Buffer.from(canonicalJson({ n: 2n ** 64n })).toString(), '{"n":18446744073709552000}');
  assert.equal(Buffer.from(canonicalJson(9007199254740993n)).toString(), "9007199254740992");
});

test("a prompt's hash is SHA-256 of its canonical JSON, a string with its quotes", () => {
  assert.equal(promptSha256("hi"), createHash("sha256").update('"hi"').digest("hex"));
  assert.equal(promptSha256([{ role: "user", content: "x", b: 1 }]),
    createHash("sha256").update('[{"b":1,"content":"x","role":"user"}]').digest("hex"));
});

// The chains and tree heads of product.json are integrity.test.mjs's (src/integrity.ts).
const product = readJson("product.json");

for (const vector of product.idempotency_keys) {
  test(`the tool call key of ${vector.tool} at step ${vector.step}`, () => {
    const key = createHash("sha256").update(`${vector.task_id}:${vector.step}:${vector.tool}`).digest("hex");
    assert.equal(key, vector.idempotency_key);
  });
}
