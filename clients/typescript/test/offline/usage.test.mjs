// The usage adapters and modelCost, against the same answers tests/client/test_usage_adapters.py reads.
import assert from "node:assert/strict";
import { test } from "node:test";
import { USAGE_KEYS, llmCalledPayload, modelCost, promptSha256, usageFromAnthropic, usageFromOpenAI } from "../../dist/index.js";

test("OpenAI chat totals are kept and the details become their parts", () => {
  const answer = { usage: { prompt_tokens: 1200, completion_tokens: 300, total_tokens: 1500,
    prompt_tokens_details: { cached_tokens: 1000 }, completion_tokens_details: { reasoning_tokens: 200 } } };
  assert.deepEqual(usageFromOpenAI(answer), { input_tokens: 1200, output_tokens: 300, cache_read_input_tokens: 1000,
    reasoning_output_tokens: 200 });
});

test("OpenAI Responses usage, and its usage object passed alone", () => {
  const usage = { input_tokens: 50, output_tokens: 7, input_tokens_details: { cached_tokens: 0 },
    output_tokens_details: { reasoning_tokens: 0 }, total_tokens: 57 };
  const expected = { input_tokens: 50, output_tokens: 7, cache_read_input_tokens: 0, reasoning_output_tokens: 0 };
  assert.deepEqual(usageFromOpenAI({ usage }), expected);
  assert.deepEqual(usageFromOpenAI(usage), expected);
});

test("Anthropic's input total is its three input counts added up", () => {
  const answer = { usage: { input_tokens: 20, output_tokens: 90, cache_read_input_tokens: 1000, cache_creation_input_tokens: 300 } };
  assert.deepEqual(usageFromAnthropic(answer), { input_tokens: 1320, output_tokens: 90, cache_read_input_tokens: 1000,
    cache_creation_input_tokens: 300 });
});

test("a streamed Anthropic message_delta has no input total", () => {
  assert.deepEqual(usageFromAnthropic({ usage: { output_tokens: 12, cache_read_input_tokens: 5 } }),
    { output_tokens: 12, cache_read_input_tokens: 5 });
});

test("answers without usage give {}, and every key is one of ours", () => {
  assert.deepEqual(usageFromOpenAI({ usage: null }), {});
  assert.deepEqual(usageFromAnthropic({ usage: undefined }), {});
  const keys = Object.keys(usageFromOpenAI({ prompt_tokens: 1, completion_tokens: 2 }));
  assert.ok(keys.every((key) => USAGE_KEYS.includes(key)));
});

test("a count that is no token count is refused, naming the field", () => {
  assert.throws(() => usageFromOpenAI({ usage: { prompt_tokens: -1 } }), /OpenAI usage prompt_tokens is -1/);
  assert.throws(() => usageFromAnthropic({ usage: { output_tokens: 1.5 } }), RangeError);
  assert.throws(() => usageFromAnthropic({ usage: { input_tokens: "3" } }), RangeError);
});

test("modelCost writes a plain decimal string", () => {
  assert.deepEqual(modelCost("1E-7"), { amount: "0.0000001", currency: "USD" });
  assert.deepEqual(modelCost(0.1, "EUR"), { amount: "0.1", currency: "EUR" });
  assert.deepEqual(modelCost("1.50"), { amount: "1.50", currency: "USD" });
  assert.deepEqual(modelCost(12), { amount: "12", currency: "USD" });
  assert.deepEqual(modelCost("2.5e3"), { amount: "2500", currency: "USD" });
  assert.deepEqual(modelCost(3n), { amount: "3", currency: "USD" });
  assert.deepEqual(modelCost("-0"), { amount: "0", currency: "USD" });
  assert.deepEqual(modelCost("0.000420"), { amount: "0.000420", currency: "USD" });
  for (const bad of ["-1", "abc", "", Infinity, NaN, "1e", true]) assert.throws(() => modelCost(bad), RangeError, String(bad));
});

test("an LLMCalled payload names the prompt by its hash and keeps a small prompt", () => {
  const prompt = [{ role: "user", content: "Score Globex" }];
  const payload = llmCalledPayload({ step: 3, model: "m", prompt, output: { score: 7 }, usage: { input_tokens: 1 },
    provider: "openai", cost: modelCost("0.01") });
  assert.deepEqual(payload, { step: 3, model: "m", prompt_sha256: promptSha256(prompt), output: { score: 7 }, prompt,
    usage: { input_tokens: 1 }, provider: "openai", cost: { amount: "0.01", currency: "USD" } });
  const big = "x".repeat(64 * 1024);
  assert.ok(!("prompt" in llmCalledPayload({ step: 1, model: "m", prompt: big, output: null })));
  assert.throws(() => llmCalledPayload({ step: 1, model: "m", prompt: "p", output: 1, usage: 5 }), TypeError);
});
