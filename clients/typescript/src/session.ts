/**
 * A claimed task as an agent works on it: heartbeats, fenced writes, resumable steps.
 *
 * A {@link TaskSession} keeps the three rules of working under a lease:
 *
 * 1. *Stay alive*: a heartbeat loop renews the lease every third of it, and stops for good the
 *    moment the server says the lease is gone (`409 stale_lease`/`task_closed`, `404`).
 * 2. *Write only while holding*: every write carries the lease epoch; once the lease is known
 *    lost the session refuses writes itself ({@link LeaseLost}, nothing sent), and a request of
 *    the session still in flight is abandoned (its `signal` aborts). A replaced holder must
 *    stop: the new holder is already resuming from the log.
 * 3. *Never do a step twice*: the recovery context (read once, cached) says which reasoning
 *    steps, model calls, tool calls and sub-agents have answers; `reason`, `resume`,
 *    `modelCall`, `toolCall`/`callTool` and `subtask` use it, and the contract's stable keys make
 *    even a blind repeat harmless.
 *
 * A session writes nothing when it closes, not even after an error: an agent that failed in the
 * middle leaves its lease to expire, so the stall detector counts the attempt (a release would
 * not, and a crashing bug would loop forever). Call `fail` or `release` to end sooner.
 */
import { createHash } from "node:crypto";
import { setTimeout as sleep } from "node:timers/promises";
import * as calls from "./calls.js";
import type { Call, Dispatched, Invoked, Lease } from "./calls.js";
import { canonicalJson } from "./canonical.js";
import {
  AwaitingApproval, BackplaneAPIError, IdempotencyMismatch, LEASE_LOST_CODES, LeaseLost, ToolCallFailed,
  ToolOutcomeMissing,
} from "./errors.js";
import { RetryPolicy } from "./retry.js";
import type { Sender } from "./agent.js";
import type { Cost, ModelAnswer, Usage } from "./usage.js";
import type { ContextModelCall, ContextSubtask, Event, JsonObject, RecoveryContext, Task } from "./types.js";

export const MIN_HEARTBEAT_INTERVAL_MS = 200;
const DEFAULT_LEASE_SECONDS = 30; // the contract's default, for a lease whose deadline cannot be read
const ANSWERED = new Set(["succeeded", "failed"]);
const NEEDS_CALLING = new Set(["dispatched", "in_flight"]);
const AWAITING_APPROVAL = "awaiting_approval";
const TERMINAL_SUBTASK = new Set(["completed", "failed", "dead_lettered", "compensated"]);
/** A prompt whose canonical JSON is longer than this is recorded by its hash only. */
export const PROMPT_RECORD_LIMIT = 64 * 1024;

/** What `callTool` runs when the call needs making: send `effectKey` as the tool's `Idempotency-Key`. */
export type ToolFunction = (effectKey: string, input: JsonObject, options: { signal: AbortSignal }) =>
  JsonObject | Promise<JsonObject>;
/** What `modelCall` runs when the step has no recorded answer. */
export type ModelFunction = (prompt: unknown) => ModelAnswer | Promise<ModelAnswer>;

export interface SessionOptions {
  /** Default: a third of the lease. */
  heartbeatIntervalMs?: number;
}

export interface ApprovalOptions {
  /** Shown to the people a tool policy asks. */
  reason?: string;
  /** Wait for their decision (default); false throws {@link AwaitingApproval} at once. */
  wait?: boolean;
  approvalTimeoutMs?: number;
}

export interface ToolCallOptions extends ApprovalOptions {
  compensation?: { tool: string; input: JsonObject };
}

/**
 * An `LLMCalled` payload: the model, the prompt's hash (SHA-256 of its RFC 8785 canonical JSON)
 * and the prompt itself unless that is over {@link PROMPT_RECORD_LIMIT} bytes, the output, and
 * `usage`, `step`, `provider` and `cost`. Only the types are checked here; the keys and their
 * sums are the server's to check (one rule, one place).
 */
export function llmCalledPayload({ step, model, prompt, output, usage, provider, cost }: {
  step: number; model: string; prompt: unknown; output: unknown; usage?: Usage | null; provider?: string | null;
  cost?: Cost | null;
}): JsonObject {
  if (usage != null && (typeof usage !== "object" || Array.isArray(usage))) {
    throw new TypeError(`usage must be an object of token counts, not ${typeof usage}: pass usageFromOpenAI(response) `
      + "or usageFromAnthropic(response)");
  }
  if (cost != null && (typeof cost !== "object" || Array.isArray(cost))) {
    throw new TypeError(`cost must be {amount: "<decimal>", currency: "USD"}, not ${typeof cost}: pass modelCost(amount)`);
  }
  const canonical = canonicalJson(prompt);
  const payload: JsonObject = { step, model, prompt_sha256: createHash("sha256").update(canonical).digest("hex"), output };
  if (canonical.length <= PROMPT_RECORD_LIMIT) payload.prompt = prompt;
  if (usage != null) payload.usage = { ...usage };
  if (provider != null) payload.provider = provider;
  if (cost != null) payload.cost = { ...cost };
  return payload;
}

/**
 * A third of the lease in ms: two heartbeats may fail before it runs out. The lease's length is
 * the one asked for in the claim when known; otherwise `expires_at` minus now (off by the clock
 * skew between agent and server).
 */
export function heartbeatIntervalFor(lease: Lease, now: number = Date.now()): number {
  let seconds: number;
  if (lease.leaseSeconds !== null) {
    seconds = lease.leaseSeconds;
  } else {
    const expiresAt = Date.parse(lease.expiresAt);
    seconds = Number.isNaN(expiresAt) ? DEFAULT_LEASE_SECONDS : (expiresAt - now) / 1000;
  }
  return Math.max(MIN_HEARTBEAT_INTERVAL_MS, (seconds * 1000) / 3);
}

/**
 * One tool call of a session, as the idempotency proxy answered its dispatch.
 *
 * `needed` is true when the tool must be called now (`dispatched`, or `in_flight`: dispatched by
 * an earlier attempt that never recorded an answer). Call it with `Idempotency-Key: effectKey`
 * and set the outcome with {@link succeeded} or {@link failed}. When `needed` is false the proxy
 * already had the answer: `status` is `succeeded` or `failed` and `result` holds it.
 *
 * `key` is the call's own idempotency key; `effectKey` the key the tool must see. They are
 * equal but in a fork, for a step its source dispatched and never heard back from.
 */
export class ToolCall {
  readonly step: number;
  readonly tool: string;
  readonly input: JsonObject;
  readonly key: string;
  readonly effectKey: string;
  readonly replayed: boolean;
  readonly needed: boolean;
  status: string;
  result: JsonObject | null;
  #outcome: "succeeded" | "failed" | null = null;

  constructor({ step, tool, input, answer }: { step: number; tool: string; input: JsonObject; answer: JsonObject }) {
    this.step = step;
    this.tool = tool;
    this.input = input;
    this.key = String(answer.idempotency_key);
    // Older servers answer without it; their key is the effect's.
    this.effectKey = typeof answer.effect_key === "string" && answer.effect_key ? answer.effect_key : this.key;
    this.status = String(answer.status);
    this.replayed = Boolean(answer.replayed);
    this.needed = NEEDS_CALLING.has(this.status);
    this.result = this.needed ? null : (answer.result as JsonObject | null | undefined) ?? null;
  }

  /** Whether an answer is on record (`succeeded` or `failed`). */
  get answered(): boolean {
    return ANSWERED.has(this.status);
  }

  /** The tool answered: record `result` as the call's success when the block ends. */
  succeeded(result: JsonObject): void {
    this.#setOutcome("succeeded", result);
  }

  /** The tool refused for good: record `result` as a failure, so no later attempt repeats it. */
  failed(result: JsonObject): void {
    this.#setOutcome("failed", result);
  }

  #setOutcome(status: "succeeded" | "failed", result: JsonObject): void {
    if (!this.needed || this.answered) {
      throw new Error(`tool call ${this.key} already has its answer (${this.status}); nothing to record`);
    }
    this.#outcome = status;
    this.result = result;
  }

  /** What to record: the status and result set in the block (`result` alone: success). */
  outcome(): ["succeeded" | "failed", JsonObject] {
    if (this.result === null) {
      throw new ToolOutcomeMissing(`tool call ${JSON.stringify(this.tool)} at step ${this.step} needed making but the `
        + "block set no outcome: call call.succeeded(result) or call.failed(result), or assign call.result");
    }
    return [this.#outcome ?? "succeeded", this.result];
  }

  /** Take the answer as the proxy recorded it (a repeat gets the first one recorded). */
  recorded(record: { status: string; result: JsonObject | null }): void {
    this.status = record.status;
    this.result = record.result;
  }
}

/** Work on one claimed task under its lease; the module's comment says why. */
export class TaskSession {
  readonly client: Sender;
  readonly lease: Lease;
  readonly taskId: string;
  readonly leaseEpoch: number;
  readonly task: Task;
  readonly input: JsonObject;
  readonly recovered: boolean;
  readonly heartbeatIntervalMs: number;
  /** The lease's deadline as the latest heartbeat answered it. */
  expiresAt: string;
  /** Heartbeats the server accepted so far. */
  heartbeats = 0;
  #context: RecoveryContext | null = null;
  // What this session itself recorded, so its own steps count as done without a re-read.
  readonly #stepsDone = new Set<number>();
  readonly #stepPayloads = new Map<number, JsonObject>();
  readonly #answers = new Map<string, { status: string; result: JsonObject | null; idempotency_key: string }>();
  readonly #modelCalls = new Map<number, JsonObject>();
  // Aborted when the lease is known lost: the session's requests in flight are abandoned.
  readonly #lease = new AbortController();
  #lostError: BackplaneAPIError | null = null;
  #ended: "completed" | "failed" | "released" | null = null;
  // Stops the heartbeat loop (close, the end of the task, a lost lease).
  readonly #stop = new AbortController();
  #loop: Promise<void> | null = null;
  // complete/fail/release wait for a heartbeat in flight, and no heartbeat starts once they
  // began: a heartbeat racing the final write would be refused and mark a finished session lost.
  #beat: Promise<unknown> | null = null;
  #ending = false;

  constructor(client: Sender, lease: Lease, options: SessionOptions = {}) {
    this.client = client;
    this.lease = lease;
    this.taskId = lease.taskId;
    this.leaseEpoch = lease.leaseEpoch;
    this.task = lease.task;
    this.input = { ...(lease.task.input ?? {}) };
    this.recovered = lease.recovered;
    this.expiresAt = lease.expiresAt;
    this.heartbeatIntervalMs = Math.max(MIN_HEARTBEAT_INTERVAL_MS, options.heartbeatIntervalMs ?? heartbeatIntervalFor(lease));
  }

  // --- the lease -------------------------------------------------------------------------

  /** Whether the lease is known to be gone (refused heartbeat or write). */
  get lost(): boolean {
    return this.#lease.signal.aborted;
  }

  /** The answer that showed the lease lost, if it is. */
  get lostError(): BackplaneAPIError | null {
    return this.#lostError;
  }

  /** How this session ended the task (`completed`, `failed` or `released`), or null. */
  get ended(): string | null {
    return this.#ended;
  }

  /** Aborts when the lease is lost: pass it to your own requests (a tool's) to stop them too. */
  get signal(): AbortSignal {
    return this.#lease.signal;
  }

  /** Start heartbeating. */
  start(): this {
    if (this.#loop === null && !this.#stop.signal.aborted) this.#loop = this.#heartbeatLoop();
    return this;
  }

  /** Stop heartbeating, waiting for a heartbeat in flight. Sends nothing. */
  async close(): Promise<void> {
    this.#stop.abort();
    await this.#loop;
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.close();
  }

  /** Heartbeat while `work(this)` runs, then close (whatever it ended with): the session's `with` block. */
  async run<T>(work: (session: this) => Promise<T> | T): Promise<T> {
    this.start();
    try {
      return await work(this);
    } finally {
      await this.close();
    }
  }

  async #heartbeatLoop(): Promise<void> {
    // Short, fast retries inside one beat; the loop itself is the long-term retry.
    const policy = new RetryPolicy({ attempts: 3, baseDelayMs: Math.min(200, this.heartbeatIntervalMs / 4),
      maxDelayMs: this.heartbeatIntervalMs / 2 });
    const stop = this.#stop.signal;
    for (;;) {
      try {
        await sleep(this.heartbeatIntervalMs, undefined, { signal: stop });
      } catch {
        return; // stopped
      }
      if (this.#ending) return;
      this.#beat = this.client.send(calls.heartbeat(this.taskId, this.leaseEpoch), { retry: policy, signal: stop });
      try {
        const answer = (await this.#beat) as { expires_at: string };
        this.expiresAt = answer.expires_at;
        this.heartbeats += 1;
      } catch (error) {
        if (stop.aborted) return;
        if (error instanceof BackplaneAPIError && (LEASE_LOST_CODES.has(error.code) || error.status === 404)) {
          this.#markLost(error);
          return;
        }
        process.emitWarning(`heartbeat for task ${this.taskId} failed: ${String(error)}`, "BackplaneHeartbeat");
      } finally {
        this.#beat = null;
      }
    }
  }

  #markLost(error: BackplaneAPIError): void {
    if (this.#lease.signal.aborted) return;
    this.#lostError = error;
    this.#stop.abort();
    this.#lease.abort(LeaseLost.inFlight(this.taskId, error));
  }

  #checkHeld(): void {
    if (this.lost) throw LeaseLost.beforeSending(this.taskId, this.#lostError, "the lease was lost");
    if (this.#ended !== null) throw LeaseLost.beforeSending(this.taskId, null, `this session already ${this.#ended} the task`);
  }

  /** Send a call of this session: abandoned when the lease is lost meanwhile. */
  #send<T>(call: Call<T>): Promise<T> {
    return this.client.send(call, { signal: this.#lease.signal });
  }

  /** Send a write under the lease; a refusal as stale marks the session lost. */
  async #write<T>(call: Call<T>): Promise<T> {
    this.#checkHeld();
    try {
      return await this.#send(call);
    } catch (error) {
      if (error instanceof LeaseLost) this.#markLost(error);
      throw error;
    }
  }

  async #end<T>(how: "completed" | "failed" | "released", call: Call<T>): Promise<T> {
    this.#ending = true;
    await this.#beat?.catch(() => undefined);
    try {
      const answer = await this.#write(call);
      this.#ended = how;
      return answer;
    } finally {
      this.#stop.abort();
      if (this.#ended === null) this.#ending = false;
    }
  }

  // --- what is already done ---------------------------------------------------------------

  /** The recovery context (`GET /tasks/{id}/recovery-context/`), read on first use and kept. */
  async context(): Promise<RecoveryContext> {
    if (this.#context === null) this.#context = await this.#send(calls.recoveryContext(this.taskId));
    return this.#context;
  }

  /** Read the recovery context again (after other agents or sub-agents wrote to the task). */
  async refreshContext(): Promise<RecoveryContext> {
    this.#context = null;
    return this.context();
  }

  /** Which attempt at the task this is (1 for the first holder), from the context once read, else the task. */
  get attempt(): number {
    return this.#context !== null ? this.#context.attempt : (this.task.attempts ?? 0) + 1;
  }

  /** Whether reasoning step `step` is in the log. */
  async stepDone(step: number): Promise<boolean> {
    return this.#stepsDone.has(step) || (await this.context()).completed_steps.some((s) => s.step === step);
  }

  /** The recorded answer of the call of `tool` at `step` (`{status, result, idempotency_key}`), or null. */
  async toolResult(step: number, tool: string): Promise<{ status: string; result: JsonObject | null; idempotency_key: string } | null> {
    const own = this.#answers.get(`${step}\u0000${tool}`);
    if (own !== undefined) return { ...own };
    const call = (await this.context()).tool_calls.find((c) => c.step === step && c.tool === tool && ANSWERED.has(c.status));
    return call === undefined ? null : { status: call.status, result: call.result, idempotency_key: call.idempotency_key };
  }

  /** The context's entry for the sub-agent dispatched at `step` for `kind`, or null. */
  async subtaskOf(step: number, kind: string): Promise<ContextSubtask | null> {
    const entry = (await this.context()).subtasks.find((s) => s.step === step && s.kind === kind);
    return entry === undefined ? null : { ...entry };
  }

  // --- writes ---------------------------------------------------------------------------

  /**
   * Append one event under the lease. Without a key the client generates one, so only this
   * call's retries are deduplicated: pass a key derived from the task and step to make a repeat
   * by a later attempt harmless too.
   */
  append(type: string, payload: JsonObject = {}, options: calls.EventFields & { expectedSeq?: number } = {}): Promise<Event> {
    return this.#write(calls.append(this.taskId, type, payload, { ...options, leaseEpoch: this.leaseEpoch }));
  }

  /**
   * Log reasoning step `step` (`ReasoningStepCompleted`, keyed `{task_id}:reasoning:{step}`).
   * Returns null, sending nothing, when the step is already in the log: a model asked again
   * after a crash rarely says the same words, and the log keeps the first answer.
   */
  async reason(step: number, payload: JsonObject): Promise<Event | null> {
    if ("step" in payload && payload.step !== step) {
      throw new RangeError(`payload says step ${JSON.stringify(payload.step)}, the call says ${step}`);
    }
    if (await this.stepDone(step)) return null;
    const event = await this.append("ReasoningStepCompleted", { ...payload, step }, { idempotencyKey: this.#reasoningKey(step) });
    this.#stepsDone.add(step);
    return event;
  }

  /** The payload of reasoning step `step` as the log holds it, or null. */
  async recordedStep(step: number): Promise<JsonObject | null> {
    const own = this.#stepPayloads.get(step);
    if (own !== undefined) return { ...own };
    const entry = (await this.context()).completed_steps.find((s) => s.step === step);
    return entry === undefined ? null : { ...entry.payload };
  }

  /**
   * Reasoning step `step`, decided once across every attempt: when an earlier attempt recorded
   * it, its payload comes back and `think` is not called; otherwise `think()` decides and the
   * decision is logged and returned.
   */
  async resume(step: number, think: () => JsonObject | Promise<JsonObject>): Promise<JsonObject> {
    const known = await this.recordedStep(step);
    if (known !== null) return known;
    const payload: JsonObject = { ...(await think()), step };
    if ((await this.reason(step, payload)) === null) {
      // Recorded meanwhile (the context was older than the log): the log's answer stands.
      await this.refreshContext();
      return (await this.recordedStep(step)) ?? payload;
    }
    this.#stepPayloads.set(step, payload);
    return { ...payload };
  }

  /** The model call the history holds for `step` (the context's `model_calls` entry), or null; the first of several. */
  async recordedModelCall(step: number): Promise<ContextModelCall | null> {
    const own = this.#modelCalls.get(step);
    if (own !== undefined) return { ...own } as unknown as ContextModelCall;
    const entry = (await this.context()).model_calls.find((m) => m.step === step);
    return entry === undefined ? null : { ...entry };
  }

  /**
   * The model's output for `step`, decided once across every attempt at the task. When the
   * history (a fork's includes its source's) has a model call at this step, its recorded output
   * comes back and `call` is not run. Otherwise `call(prompt)` returns a {@link ModelAnswer}
   * (`usageFromOpenAI`/`usageFromAnthropic` read `usage` off a provider's answer), it is recorded
   * by {@link recordModelCall} and the output that stands returned.
   */
  async modelCall(step: number, model: string, prompt: unknown, call: ModelFunction,
    { provider }: { provider?: string } = {}): Promise<unknown> {
    const known = await this.recordedModelCall(step);
    if (known !== null) return known.output;
    const [answer, provenance] = await this.askModel(step, model, prompt, call);
    if (typeof answer !== "object" || answer === null || !("output" in answer)) {
      throw new TypeError(`the model call at step ${step} must return {output: ..., usage: {...}}, not `
        + JSON.stringify(answer)?.slice(0, 200));
    }
    const payload = llmCalledPayload({ step, model, prompt, output: answer.output, usage: answer.usage, provider,
      cost: answer.cost });
    const event = await this.#recordLLMCalled(step, { ...payload, ...provenance });
    return event.payload.output;
  }

  /**
   * Record a model call the agent made itself as `LLMCalled` (keyed `{task_id}:llm:{step}`) and
   * return the event as the log holds it; its `payload.cost` is the cost as the server settled it.
   * A step is recorded once per task: another payload for a recorded step writes nothing and the
   * earlier event comes back. Ask {@link recordedModelCall} first, as {@link modelCall} does.
   */
  recordModelCall(step: number, model: string, prompt: unknown, output: unknown,
    options: { usage?: Usage; provider?: string; cost?: Cost } = {}): Promise<Event> {
    return this.#recordLLMCalled(step, llmCalledPayload({ step, model, prompt, output, ...options }));
  }

  async #recordLLMCalled(step: number, payload: JsonObject): Promise<Event> {
    const key = `${this.taskId}:llm:${step}`;
    let event: Event;
    try {
      event = await this.append("LLMCalled", payload, { idempotencyKey: key });
    } catch (error) {
      const seq = error instanceof IdempotencyMismatch ? error.details.seq : undefined;
      if (typeof seq !== "number") throw error;
      // Recorded meanwhile with another answer: the log's answer stands. The refusal names its seq.
      [event] = (await this.#send(calls.events(this.taskId, { afterSeq: seq - 1, limit: 1 }))).results;
      if (event?.idempotency_key !== key) throw error;
    }
    const recorded = event.payload;
    this.#modelCalls.set(step, { seq: event.seq, task_id: this.taskId, step, model: recorded.model,
      prompt_sha256: recorded.prompt_sha256, output: recorded.output, usage: recorded.usage ?? null });
    return event;
  }

  /**
   * The answer for a step the history has no model call for, and what its `LLMCalled` adds about
   * where it came from (a replay answering from a record says so).
   */
  protected async askModel(step: number, model: string, prompt: unknown, call: ModelFunction): Promise<[ModelAnswer, JsonObject]> {
    return [await call(prompt), {}];
  }

  /** The recovery context's `resume_prompt`: where the task stands, for the model. */
  async resumePrompt(): Promise<string> {
    return (await this.context()).resume_prompt;
  }

  #reasoningKey(step: number): string {
    return `${this.taskId}:reasoning:${step}`;
  }

  /**
   * Make a tool call at most once across attempts: record it, make it if needed, record the answer.
   *
   * Dispatches the call to the idempotency proxy and runs `block(call)`. Inside, if
   * `call.needed`, call the tool with `Idempotency-Key: call.effectKey` and set the outcome.
   * When the block returns, the outcome is recorded; `call.status` and `call.result` then hold
   * the recorded answer (a `failed` one does not throw). An error in the block records nothing:
   * the call stays in flight, and a later attempt makes it again with the same key.
   *
   * A call a tool policy gates waits first, with `wait`, for people's decision: granted, it is
   * made as above; denied or expired throws {@link ApprovalDenied} or `ApprovalExpired`. Without
   * `wait`, or once `approvalTimeoutMs` is spent, it throws {@link AwaitingApproval}.
   */
  async toolCall(step: number, tool: string, input: JsonObject, block: (call: ToolCall) => unknown | Promise<unknown>,
    options: ToolCallOptions = {}): Promise<ToolCall> {
    const answer = await this.#dispatchApproved<Dispatched>(() => this.#write(calls.dispatchToolCall(this.taskId, step, tool, input,
      { leaseEpoch: this.leaseEpoch, compensation: options.compensation, reason: options.reason })), options);
    const call = new ToolCall({ step, tool, input, answer: answer as JsonObject });
    await block(call);
    if (call.needed) {
      const [status, result] = call.outcome();
      call.recorded(await this.#write(calls.recordToolResult(call.key, status, result, { leaseEpoch: this.leaseEpoch })));
    }
    this.#answers.set(`${step}\u0000${tool}`, { status: call.status, result: call.result, idempotency_key: call.key });
    return call;
  }

  /**
   * {@link toolCall} as a function: `fn(effectKey, input, {signal})` runs only when the call
   * needs making; send the key as the tool's `Idempotency-Key`. Its return value is recorded as
   * the success; {@link ToolCallFailed} thrown in `fn` as the failure; any other error propagates
   * and records nothing.
   */
  callTool(step: number, tool: string, input: JsonObject, fn: ToolFunction, options: ToolCallOptions = {}): Promise<ToolCall> {
    return this.toolCall(step, tool, input, async (call) => {
      if (!call.needed) return;
      try {
        call.succeeded(await fn(call.effectKey, { ...input }, { signal: this.signal }));
      } catch (error) {
        if (!(error instanceof ToolCallFailed)) throw error;
        call.failed(error.result);
      }
    }, options);
  }

  /**
   * Have the backplane's gateway call the registered `tool` for `step`: `{idempotency_key,
   * status, result, replayed}`; an answered call is not repeated. Gated calls wait as in {@link toolCall}.
   */
  async invoke(step: number, tool: string, input: JsonObject, options: ApprovalOptions = {}) {
    const answer = await this.#dispatchApproved<Invoked>(() => this.#write(calls.invoke(this.taskId, tool, step, input,
      { leaseEpoch: this.leaseEpoch, reason: options.reason })), options);
    const invoked = answer as Exclude<Invoked, { status: "awaiting_approval" }>;
    if (ANSWERED.has(invoked.status)) {
      this.#answers.set(`${step}\u0000${tool}`, { status: invoked.status, result: invoked.result,
        idempotency_key: invoked.idempotency_key });
    }
    return invoked;
  }

  /**
   * Wait durably for the signal `name` and return its payload. The wait is in the task's log,
   * so the next attempt after a crash waits for the same signal (or finds it). Throws an
   * Error named `TimeoutError` when its time runs out.
   */
  async waitForSignal(name: string, { timeoutMs = 3_600_000 }: { timeoutMs?: number } = {}): Promise<JsonObject> {
    await this.#write(calls.awaitSignal(this.taskId, name, Math.max(1, Math.floor(timeoutMs / 1000)), { leaseEpoch: this.leaseEpoch }));
    for (;;) {
      this.#checkHeld();
      const signal = await this.#send(calls.getSignal(this.taskId, name, { wait: calls.APPROVAL_WAIT_SECONDS }));
      if (signal.status === "received") return signal.payload ?? {};
      if (signal.status === "timed_out") throw timeoutError(`task ${this.taskId}: no signal ${JSON.stringify(name)} came in time`);
    }
  }

  /**
   * `dispatch()`'s answer once it is no longer `awaiting_approval`: the request is read with
   * `wait` until it is decided, then the same dispatch is sent again, which makes the call or
   * throws the refusal.
   */
  async #dispatchApproved<T extends { status: string }>(dispatch: () => Promise<T>,
    { wait = true, approvalTimeoutMs = 3_600_000 }: ApprovalOptions): Promise<T> {
    let answer = await dispatch();
    const deadline = Date.now() + approvalTimeoutMs;
    while (answer.status === AWAITING_APPROVAL) {
      const left = deadline - Date.now();
      if (!wait || left <= 0) throw new AwaitingApproval(answer as unknown as JsonObject);
      this.#checkHeld();
      const approvalId = String((answer as unknown as { approval_id: string }).approval_id);
      const request = await this.#send(calls.getApproval(approvalId,
        { wait: Math.max(1, Math.min(calls.APPROVAL_WAIT_SECONDS, Math.floor(left / 1000))) }));
      if (request.status !== "pending") answer = await dispatch();
    }
    return answer;
  }

  /** Hand `input` to a sub-agent of `kind`: the child Task; a repeat for the same step and kind returns the same child. */
  async subtask(step: number, kind: string, input: JsonObject): Promise<Task> {
    const answer = await this.#write(calls.dispatchSubtask(this.taskId, step, kind, input, { leaseEpoch: this.leaseEpoch }));
    this.#context = null; // the dispatch is in the log now; the next read must see it
    return answer.task;
  }

  /**
   * Wait until the child's result is in this task's log and return its context entry. The
   * heartbeat keeps the lease meanwhile. Throws an Error named `TimeoutError` after `timeoutMs`,
   * and {@link LeaseLost} as soon as the lease is lost.
   */
  async waitForSubtask(childTaskId: string, { timeoutMs = 60_000, pollMs = 200 }: { timeoutMs?: number; pollMs?: number } = {}
  ): Promise<ContextSubtask> {
    const deadline = Date.now() + timeoutMs;
    let entry: ContextSubtask | undefined;
    for (;;) {
      this.#checkHeld();
      // The child's row is cheap to read; the recovery context replays this task's log. Once the
      // child has left pending/running its result is in this log (written in the child's
      // finishing transaction), so the context is read then, and only then.
      const child = await this.#send(calls.getTask(childTaskId));
      if (child.status !== "pending" && child.status !== "running") {
        entry = (await this.refreshContext()).subtasks.find((s) => s.child_task_id === childTaskId);
        if (entry !== undefined && TERMINAL_SUBTASK.has(entry.status)) return { ...entry };
      }
      const remaining = deadline - Date.now();
      if (remaining <= 0) {
        throw timeoutError(`sub-agent task ${childTaskId} of task ${this.taskId} still ${entry?.status ?? "not dispatched"} `
          + `after ${timeoutMs} ms`);
      }
      try {
        await sleep(Math.min(pollMs, remaining), undefined, { signal: this.#lease.signal });
      } catch {
        this.#checkHeld();
      }
    }
  }

  // --- the end --------------------------------------------------------------------------

  /**
   * Complete the task (`TaskCompleted`, keyed `{task_id}:completed`) and return that event.
   * `reasoning` (a payload with an integer `step`) is logged as a final `ReasoningStepCompleted`
   * in the same batch, all or nothing, unless that step is already in the log. Stops the heartbeat.
   */
  async complete(output: JsonObject, { reasoning }: { reasoning?: JsonObject } = {}): Promise<Event> {
    const drafts: calls.EventDraft[] = [];
    if (reasoning !== undefined) {
      const step = reasoning.step;
      if (typeof step !== "number" || !Number.isInteger(step)) throw new RangeError("reasoning needs an integer 'step'");
      if (!(await this.stepDone(step))) {
        drafts.push(calls.eventDraft("ReasoningStepCompleted", reasoning, { idempotencyKey: this.#reasoningKey(step) }));
      }
    }
    drafts.push(calls.eventDraft("TaskCompleted", { output }, { idempotencyKey: `${this.taskId}:completed` }));
    const written = await this.#end("completed", calls.appendBatch(this.taskId, drafts, { leaseEpoch: this.leaseEpoch }));
    return written[written.length - 1];
  }

  /**
   * Give up this attempt (`TaskFailed`, keyed `{task_id}:failed:{attempt}`). `retryable` with
   * attempts left puts the task back to `pending` (counted); otherwise it fails for good.
   */
  fail(error: string, { retryable }: { retryable: boolean }): Promise<Event> {
    return this.#end("failed", calls.append(this.taskId, "TaskFailed", { error, retryable },
      { idempotencyKey: `${this.taskId}:failed:${this.attempt}`, leaseEpoch: this.leaseEpoch }));
  }

  /** Hand the task back to `pending` without counting an attempt (shutting down, say); returns the Task. */
  release(): Promise<Task> {
    return this.#end("released", calls.release(this.taskId, this.leaseEpoch));
  }
}

function timeoutError(message: string): Error {
  const error = new Error(message);
  error.name = "TimeoutError";
  return error;
}
