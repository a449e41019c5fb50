// What the server suites share: the environment tests/e2e/test_typescript_client.py sets for them
// (a missing variable fails the suite, nothing is skipped) and the agent's client, which retries
// quickly: the server is local, and a test must not wait out production's backoff.
import assert from "node:assert/strict";
import { AgentClient, RetryPolicy } from "../../dist/index.js";

export function required(name) {
  const value = process.env[name];
  assert.ok(value, `${name} is not set: test:server runs against a real backplane (tests/e2e/test_typescript_client.py)`);
  return value;
}

export function agentClient() {
  return new AgentClient(required("BACKPLANE_URL"), required("BACKPLANE_TOKEN"),
    { retry: new RetryPolicy({ attempts: 4, baseDelayMs: 50 }) });
}
