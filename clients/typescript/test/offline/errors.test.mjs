// Every code of the contract's error table (docs/api.md, "Errors") is thrown as its own class,
// read off real HTTP answers of a tiny local server (node:http): the answers' shape is the
// contract's, nothing else of the backplane is imitated.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { createServer } from "node:http";
import { after, before, test } from "node:test";
import {
  AgentClient, BackplaneAPIError, CONTRACT_ERROR_CODES, IdempotencyMismatch, LeaseLost, RetryPolicy, SandboxRefused,
  SeqConflict, TaskClosed, ValidationError, errorClassOf,
} from "../../dist/index.js";

const API = readFileSync(new URL("../../../../docs/api.md", import.meta.url), "utf8");
// The table's rows: "| 409 | `seq_conflict` | ..." (503 lists two codes in one row).
const TABLE = [...API.matchAll(/^\| (\d{3}) \| (`[a-z_]+`(?: \/ `[a-z_]+`)*) \|/gm)]
  .flatMap(([, status, codes]) => [...codes.matchAll(/`([a-z_]+)`/g)].map(([, code]) => ({ status: Number(status), code })));

test("the contract's error table is read whole", () => {
  assert.ok(TABLE.length >= 25, `only ${TABLE.length} rows read from docs/api.md`);
});

test("the client knows every code of the contract's error table, and no other", () => {
  assert.deepEqual([...CONTRACT_ERROR_CODES].sort(), TABLE.map((row) => row.code).sort());
});

test("each code has a class of its own, every one a BackplaneAPIError", () => {
  const classes = TABLE.map(({ code }) => errorClassOf(code));
  for (const [index, Kind] of classes.entries()) {
    assert.ok(Kind.prototype instanceof BackplaneAPIError, TABLE[index].code);
  }
  assert.equal(new Set(classes).size, classes.length);
  assert.equal(errorClassOf("stale_lease"), LeaseLost);
  assert.ok(TaskClosed.prototype instanceof LeaseLost);
  assert.equal(errorClassOf("something_new"), BackplaneAPIError);
});

let server;
let base;
before(async () => {
  // Answers /status/code/ with the contract's error shape; /html/ with a proxy's HTML page.
  server = createServer((request, response) => {
    const [, kind, status, code] = request.url.split("/").filter(Boolean).slice(1);
    request.resume();
    if (kind === "html") {
      response.writeHead(502, { "Content-Type": "text/html" }).end("<html><body>Bad gateway</body></html>");
      return;
    }
    const body = { error: { code, message: `about ${code}`, details: { last_seq: 7 } } };
    response.writeHead(Number(status), { "Content-Type": "application/json", "Retry-After": "0" }).end(JSON.stringify(body));
  });
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  base = `http://127.0.0.1:${server.address().port}`;
});
after(() => server.close());

const once = () => new AgentClient(base, "t", { retry: RetryPolicy.none() });
const call = (path) => ({ method: "GET", path, read: (answer) => answer.body });

test("an error answer is thrown as its code's class, with the contract's fields", async () => {
  for (const { status, code } of TABLE) {
    const error = await once().send(call(`/answer/${status}/${code}/`)).then(() => null, (thrown) => thrown);
    assert.ok(error instanceof errorClassOf(code), `${status} ${code}: ${error}`);
    assert.deepEqual([error.status, error.code, error.reason, error.details, error.attempts],
      [status, code, `about ${code}`, { last_seq: 7 }, 1]);
    assert.equal(error.method, "GET");
    assert.ok(error.url.endsWith(`/api/v1/answer/${status}/${code}/`));
  }
});

test("the classes that matter most are caught by type", async () => {
  const classOf = async (status, code) => (await once().send(call(`/answer/${status}/${code}/`)).catch((e) => e)).constructor;
  assert.equal(await classOf(409, "seq_conflict"), SeqConflict);
  assert.equal(await classOf(422, "idempotency_mismatch"), IdempotencyMismatch);
  assert.equal(await classOf(409, "sandbox_refused"), SandboxRefused);
  assert.equal(await classOf(400, "validation_error"), ValidationError);
});

test("an answer outside the contract's shape is http_<status> with the body's first characters", async () => {
  const error = await once().send(call("/html/502/x/")).catch((e) => e);
  assert.ok(error instanceof BackplaneAPIError && !(error instanceof LeaseLost));
  assert.equal(error.code, "http_502");
  assert.equal(error.reason, "<html><body>Bad gateway</body></html>");
});

test("a 429 that stays refused reaches the caller as RateLimited with its Retry-After", async () => {
  const client = new AgentClient(base, "t", { retry: new RetryPolicy({ attempts: 3, baseDelayMs: 1, jitter: false }) });
  const error = await client.send(call("/answer/429/rate_limited/")).catch((e) => e);
  assert.equal(error.constructor.name, "RateLimited");
  assert.deepEqual([error.attempts, error.retryAfter], [3, 0]);
});
