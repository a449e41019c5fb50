// The client's types are generated from the contract (docs/openapi.yaml): the committed module
// must be exactly what the contract generates today, and the request paths of calls.ts are
// checked against it by the compiler (`route(...)` takes only the contract's paths).
import assert from "node:assert/strict";
import { readFile } from "node:fs/promises";
import { test } from "node:test";
import { GENERATED, generateTypes } from "../../scripts/openapi-types.mjs";

test("src/generated/openapi.ts is what docs/openapi.yaml generates (else: npm run generate)", async () => {
  const text = await generateTypes();
  assert.ok(await readFile(GENERATED, "utf8") === text,
    "src/generated/openapi.ts differs from what docs/openapi.yaml generates: run `npm run generate`");
});

test("every path the client sends to is one of the contract's", async () => {
  const generated = await readFile(GENERATED, "utf8");
  const source = await readFile(new URL("../../src/calls.ts", import.meta.url), "utf8");
  const used = [...source.matchAll(/route\("(get|post)", "([^"]+)"/g)].map(([, method, path]) => ({ method, path }));
  assert.ok(used.length === 27, `${used.length} routes`);
  for (const { method, path } of used) {
    const block = generated.split(`\n    "${path}": {`)[1]?.split("\n    };")[0];
    assert.ok(block !== undefined, `${path} is not in the contract`);
    assert.match(block, new RegExp(`\\n        ${method}: operations\\[`), `${method.toUpperCase()} ${path} is not in the contract`);
  }
});
