// The retry policy's arithmetic, and the client's loop against a tiny local HTTP server that
// refuses first and answers later: every attempt carries the very same body (the same
// idempotency key, the same new task id), and only "not now" answers are retried.
import assert from "node:assert/strict";
import { createServer } from "node:http";
import { after, before, beforeEach, test } from "node:test";
import { AgentClient, HONOURED_RETRY_AFTER, RetryPolicy, TransportError, calls } from "../../dist/index.js";

test("backoff is full jitter under an exponential ceiling", () => {
  const fixed = new RetryPolicy({ baseDelayMs: 100, maxDelayMs: 1000, jitter: false });
  assert.deepEqual([1, 2, 3, 4, 5, 6].map((n) => fixed.backoff(n)), [100, 200, 400, 800, 1000, 1000]);
  const jittered = new RetryPolicy({ baseDelayMs: 100, maxDelayMs: 1000 });
  for (let n = 0; n < 200; n += 1) {
    const wait = jittered.backoff(3);
    assert.ok(wait >= 0 && wait <= 400, String(wait));
  }
  assert.equal(fixed.backoff(10_000), 1000);
});

test("only 429 and 503 are retried, and never past the last attempt", () => {
  const policy = new RetryPolicy({ attempts: 3, baseDelayMs: 100, jitter: false });
  assert.equal(policy.delayAfterAnswer(1, 503, null), 100);
  assert.equal(policy.delayAfterAnswer(2, 429, null), 200);
  assert.equal(policy.delayAfterAnswer(3, 503, null), null);
  for (const status of [400, 404, 409, 422, 500, 502]) assert.equal(policy.delayAfterAnswer(1, status, null), null);
});

test("Retry-After is waited out in full up to the honoured bound, then capped", () => {
  const policy = new RetryPolicy({ maxDelayMs: 5000, jitter: false });
  assert.equal(policy.delayAfterAnswer(1, 429, 30), 30_000);
  assert.equal(policy.delayAfterAnswer(1, 429, HONOURED_RETRY_AFTER), 60_000);
  assert.equal(policy.delayAfterAnswer(1, 429, HONOURED_RETRY_AFTER + 1), 5000);
  const jittered = new RetryPolicy({ baseDelayMs: 200 });
  const wait = jittered.delayAfterAnswer(1, 503, 1);
  assert.ok(wait >= 1000 && wait <= 1200, String(wait));
});

test("a request that could not be formed is not retried; no answer is", () => {
  const policy = new RetryPolicy({ attempts: 3, jitter: false });
  assert.equal(policy.delayAfterError(1, new TypeError("Failed to parse URL")), null);
  const refused = Object.assign(new TypeError("fetch failed"), { cause: Object.assign(new Error("connect ECONNREFUSED"), { code: "ECONNREFUSED" }) });
  assert.equal(policy.delayAfterError(1, refused), 200);
  assert.equal(policy.delayAfterError(3, refused), null);
});

test("a policy is at least one attempt, and none() is exactly one", () => {
  assert.throws(() => new RetryPolicy({ attempts: 0 }), RangeError);
  assert.throws(() => new RetryPolicy({ baseDelayMs: -1 }), RangeError);
  assert.equal(RetryPolicy.none().attempts, 1);
});

let server;
let base;
let plan; // answers to give, in order: [status, body, headers]
let seen; // the bodies received
before(async () => {
  server = createServer((request, response) => {
    let body = "";
    request.on("data", (chunk) => { body += chunk; }).on("end", () => {
      seen.push({ url: request.url, body: body ? JSON.parse(body) : null, authorization: request.headers.authorization });
      const [status, answer, headers = {}] = plan.shift() ?? [500, { error: { code: "unexpected", message: "no plan", details: {} } }];
      response.writeHead(status, { "Content-Type": "application/json", ...headers }).end(JSON.stringify(answer));
    });
  });
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  base = `http://127.0.0.1:${server.address().port}`;
});
after(() => server.close());
beforeEach(() => { plan = []; seen = []; });

const fast = new RetryPolicy({ attempts: 4, baseDelayMs: 5, maxDelayMs: 20 });
const unavailable = [503, { error: { code: "unavailable", message: "database down", details: {} } }, { "Retry-After": "0" }];

test("an append retried after 503s is sent with the same idempotency key every time", async () => {
  const event = { seq: 2, type: "Noted" };
  plan = [unavailable, [429, { error: { code: "rate_limited", message: "slow down", details: {} } }], [201, event]];
  const client = new AgentClient(base, "secret", { retry: fast });
  assert.deepEqual(await client.append("t-1", "Noted", { a: 1 }), event);
  assert.equal(seen.length, 3);
  const keys = new Set(seen.map((request) => request.body.idempotency_key));
  assert.equal(keys.size, 1);
  assert.match([...keys][0], /^[0-9a-f]{32}$/);
  assert.ok(seen.every((request) => request.url === "/api/v1/tasks/t-1/events/" && request.authorization === "Bearer secret"));
});

test("a new task keeps the id the client chose across retries", async () => {
  plan = [unavailable, [201, { task_id: "x" }]];
  await new AgentClient(base, "t", { retry: fast }).createTask("k", { a: 1 });
  assert.equal(seen.length, 2);
  assert.equal(seen[0].body.task_id, seen[1].body.task_id);
  assert.match(seen[0].body.task_id, /^[0-9a-f-]{36}$/);
});

test("two calls get two keys: a key protects one call's retries", async () => {
  plan = [[201, {}], [201, {}]];
  const client = new AgentClient(base, "t", { retry: fast });
  await client.append("t-1", "Noted");
  await client.append("t-1", "Noted");
  assert.notEqual(seen[0].body.idempotency_key, seen[1].body.idempotency_key);
});

test("Idempotent-Replay is read into lastReplayed", async () => {
  plan = [[200, { seq: 2 }, { "Idempotent-Replay": "true" }], [201, { seq: 3 }]];
  const client = new AgentClient(base, "t", { retry: fast });
  await client.append("t-1", "Noted", {}, { idempotencyKey: "k" });
  assert.equal(client.lastReplayed, true);
  await client.append("t-1", "Noted", {}, { idempotencyKey: "k2" });
  assert.equal(client.lastReplayed, false);
});

test("a claim's 204 is null, and its lease is read", async () => {
  plan = [[204, ""], [200, { task: { task_id: "t-9" }, lease_epoch: 4, expires_at: "2030-01-01T00:00:00Z", recovered: true }]];
  const client = new AgentClient(base, "t", { retry: fast });
  assert.equal(await client.claim(["k"]), null);
  const lease = await client.claim(["k"], { leaseSeconds: 9 });
  assert.deepEqual([lease.taskId, lease.leaseEpoch, lease.recovered, lease.leaseSeconds], ["t-9", 4, true, 9]);
});

test("the answer that stays 503 reaches the caller after the last attempt", async () => {
  plan = [unavailable, unavailable, unavailable, unavailable];
  const error = await new AgentClient(base, "t", { retry: fast }).getTask("t-1").catch((e) => e);
  assert.deepEqual([error.constructor.name, error.attempts, seen.length], ["Unavailable", 4, 4]);
});

test("no answer at all is retried, then thrown as a TransportError saying how often", async () => {
  const closed = createServer();
  await new Promise((resolve) => closed.listen(0, "127.0.0.1", resolve));
  const port = closed.address().port;
  await new Promise((resolve) => closed.close(resolve));
  const error = await new AgentClient(`http://127.0.0.1:${port}`, "t", { retry: fast }).getTask("t").catch((e) => e);
  assert.ok(error instanceof TransportError, String(error));
  assert.equal(error.attempts, 4);
});

test("a hung request times out, and the caller's signal abandons it at once", async () => {
  const hung = createServer(() => {}); // never answers
  await new Promise((resolve) => hung.listen(0, "127.0.0.1", resolve));
  const url = `http://127.0.0.1:${hung.address().port}`;
  try {
    const timedOut = await new AgentClient(url, "t", { retry: RetryPolicy.none(), timeoutMs: 100 }).getTask("t").catch((e) => e);
    assert.ok(timedOut instanceof TransportError, String(timedOut));
    const controller = new AbortController();
    const reason = new Error("the lease was lost");
    setTimeout(() => controller.abort(reason), 50);
    const started = Date.now();
    const abandoned = await new AgentClient(url, "t", { retry: fast, timeoutMs: 10_000 })
      .send(calls.getTask("t"), { signal: controller.signal }).catch((e) => e);
    assert.equal(abandoned, reason);
    assert.ok(Date.now() - started < 2000);
  } finally {
    hung.closeAllConnections();
    hung.close();
  }
});

test("an approval read that waits on the server gets that long on top of the timeout", () => {
  assert.equal(calls.getApproval("a-1", { wait: 30 }).waits, 30);
  assert.equal(calls.getSignal("t", "go", { wait: 5 }).waits, 5);
});
