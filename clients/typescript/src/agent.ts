/**
 * An agent's client for the backplane's REST contract (`/api/v1/`): one method per request,
 * retried safely ({@link RetryPolicy}), and the task sessions built on them.
 *
 * Node 18+ and nothing else: global `fetch`, `node:crypto`, an `AbortSignal` per request for
 * its timeout. docs/sdk-typescript.md is the guide.
 */
import { setTimeout as sleep } from "node:timers/promises";
import * as calls from "./calls.js";
import type { Call, ClaimOptions, CreateTaskOptions, DispatchOptions, EventDraft, AppendOptions, ForkOptions, Lease } from "./calls.js";
import { BackplaneAPIError, TransportError, retryAfterOf } from "./errors.js";
import { PROOF_BUNDLE_FORMAT, type ProofBundle } from "./integrity.js";
import { DEFAULT_RETRY, RetryPolicy } from "./retry.js";
import { TaskSession, type SessionOptions } from "./session.js";
import type { Approval, Event, JsonObject } from "./types.js";

export interface AgentClientOptions {
  /** Per request, each attempt: a hung connection counts as no answer (default 10 s). */
  timeoutMs?: number;
  /** How often a request is sent before an error reaches the caller (`RetryPolicy.none()` to send once). */
  retry?: RetryPolicy;
  /** Your own fetch (a proxy agent, instrumentation); the global one by default. */
  fetch?: typeof fetch;
  /** Headers sent with every request (a `traceparent`, say), besides the token. */
  headers?: Record<string, string>;
}

export interface SendOptions {
  /** This call's policy instead of the client's. */
  retry?: RetryPolicy;
  /** Abandons the request (and its retries) when aborted: its reason is thrown. */
  signal?: AbortSignal;
}

/** What a {@link TaskSession} needs from its client. */
export interface Sender {
  send<T>(call: Call<T>, options?: SendOptions): Promise<T>;
}

/**
 * An agent's connection to the backplane, authenticated with its bearer token. `baseUrl` is the
 * server's root (`http://host:8000`); the client adds `/api/v1`.
 *
 * Retries: every request is retried on 429, 503 and no answer, with full-jitter backoff. Writes
 * are made safe to retry before the first attempt (an append's key, a new task's id, chosen once
 * per call), so a lost answer never turns into a double write. `claim` is the exception.
 *
 * Errors: an error answer throws the {@link BackplaneAPIError} subclass of its code (`409
 * stale_lease` as {@link LeaseLost}); no answer after the last attempt throws {@link TransportError}.
 */
export class AgentClient implements Sender {
  readonly baseUrl: string;
  readonly retry: RetryPolicy;
  readonly timeoutMs: number;
  /** Whether the latest write's answer carried `Idempotent-Replay: true` (nothing new written). */
  lastReplayed = false;
  readonly #headers: Record<string, string>;
  readonly #fetch: typeof fetch;

  constructor(baseUrl: string, token: string, options: AgentClientOptions = {}) {
    this.baseUrl = baseUrl.replace(/\/+$/, "");
    this.retry = options.retry ?? DEFAULT_RETRY;
    this.timeoutMs = options.timeoutMs ?? 10_000;
    this.#fetch = options.fetch ?? globalThis.fetch;
    this.#headers = { ...options.headers, Authorization: `Bearer ${token}`, Accept: "application/json" };
  }

  /**
   * Send one request of the contract (built by the functions of calls.ts), retrying as the policy
   * allows, and read its answer. A caller's `signal` abandons it at once, retries included.
   */
  async send<T>(call: Call<T>, options: SendOptions = {}): Promise<T> {
    const policy = options.retry ?? this.retry;
    const url = this.#url(call);
    const body = call.body === undefined ? undefined : JSON.stringify(call.body);
    const headers = body === undefined ? this.#headers : { ...this.#headers, "Content-Type": "application/json" };
    for (let attempt = 1; ; attempt += 1) {
      options.signal?.throwIfAborted();
      let delay: number | null;
      let response: Response;
      let text: string;
      try {
        // A read that waits on the server (an approval, a signal) gets that long on top.
        const signal = this.#deadline(this.timeoutMs + (call.waits ?? 0) * 1000, options.signal);
        response = await this.#fetch(url, { method: call.method, headers, body, signal });
        text = await response.text(); // read whole, so the connection can be reused
      } catch (error) {
        if (options.signal?.aborted) throw options.signal.reason;
        delay = policy.delayAfterError(attempt, error);
        if (delay === null) throw new TransportError(call.method, url, attempt, error);
        await sleep(delay, undefined, { signal: options.signal });
        continue;
      }
      const retryAfter = retryAfterOf(response.headers);
      delay = policy.delayAfterAnswer(attempt, response.status, retryAfter);
      if (delay === null) {
        if (response.status >= 400) {
          throw BackplaneAPIError.fromAnswer(response.status, response.statusText, text,
            { retryAfter, method: call.method, url, attempts: attempt });
        }
        if (call.method === "POST" && !call.path.endsWith("/heartbeat/")) {
          // Heartbeats run beside the work: they must not overwrite what the work's write said.
          this.lastReplayed = response.headers.get(calls.REPLAY_HEADER)?.toLowerCase() === "true";
        }
        return call.read({ status: response.status, headers: response.headers, body: text === "" ? null : JSON.parse(text) });
      }
      await sleep(delay, undefined, { signal: options.signal });
    }
  }

  #url(call: Call<unknown>): string {
    const query = call.query && Object.keys(call.query).length > 0
      ? `?${new URLSearchParams(Object.entries(call.query).map(([k, v]): [string, string] => [k, String(v)]))}` : "";
    return `${this.baseUrl}${calls.API_PREFIX}${call.path}${query}`;
  }

  /** The request's own timeout, and the caller's signal; `AbortSignal.any` is Node 20's, so joined by hand. */
  #deadline(timeoutMs: number, signal: AbortSignal | undefined): AbortSignal {
    const timeout = AbortSignal.timeout(timeoutMs);
    if (signal === undefined) return timeout;
    const both = new AbortController();
    const abort = (source: AbortSignal) => () => both.abort(source.reason);
    if (signal.aborted) both.abort(signal.reason);
    signal.addEventListener("abort", abort(signal), { once: true });
    timeout.addEventListener("abort", abort(timeout), { once: true });
    return both.signal;
  }

  // --- requests (calls.ts declares each) -------------------------------------------------------

  createTask(kind: string, input: JsonObject, options?: CreateTaskOptions) { return this.send(calls.createTask(kind, input, options)); }
  getTask(taskId: string) { return this.send(calls.getTask(taskId)); }
  listTasks(options?: Parameters<typeof calls.listTasks>[0]) { return this.send(calls.listTasks(options)); }
  verify(taskId: string) { return this.send(calls.verify(taskId)); }
  events(taskId: string, options?: { afterSeq?: number; limit?: number }) { return this.send(calls.events(taskId, options)); }
  append(taskId: string, type: string, payload?: JsonObject, options?: AppendOptions) {
    return this.send(calls.append(taskId, type, payload, options));
  }
  appendBatch(taskId: string, drafts: EventDraft[], options?: { leaseEpoch?: number; expectedSeq?: number }) {
    return this.send(calls.appendBatch(taskId, drafts, options));
  }
  claim(kinds?: string[], options?: ClaimOptions) { return this.send(calls.claim(kinds, options)); }
  heartbeat(taskId: string, leaseEpoch: number) { return this.send(calls.heartbeat(taskId, leaseEpoch)); }
  release(taskId: string, leaseEpoch: number) { return this.send(calls.release(taskId, leaseEpoch)); }
  recoveryContext(taskId: string) { return this.send(calls.recoveryContext(taskId)); }
  fork(sourceTaskId: string, options: ForkOptions) { return this.send(calls.fork(sourceTaskId, options)); }
  diff(a: string, b: string) { return this.send(calls.diff(a, b)); }
  dispatchToolCall(taskId: string, step: number, tool: string, input: JsonObject, options?: DispatchOptions) {
    return this.send(calls.dispatchToolCall(taskId, step, tool, input, options));
  }
  recordToolResult(key: string, status: "succeeded" | "failed", result: JsonObject, options?: { leaseEpoch?: number }) {
    return this.send(calls.recordToolResult(key, status, result, options));
  }
  getToolCall(key: string) { return this.send(calls.getToolCall(key)); }
  getApproval(approvalId: string, options?: { wait?: number }) { return this.send(calls.getApproval(approvalId, options)); }
  awaitSignal(taskId: string, name: string, timeoutSeconds: number, options?: { leaseEpoch?: number }) {
    return this.send(calls.awaitSignal(taskId, name, timeoutSeconds, options));
  }
  getSignal(taskId: string, name: string, options?: { wait?: number }) { return this.send(calls.getSignal(taskId, name, options)); }
  sendSignal(taskId: string, name: string, payload: JsonObject) { return this.send(calls.sendSignal(taskId, name, payload)); }
  personalOpen(value: unknown, options?: { taskId?: string }) { return this.send(calls.personalOpen(value, options)); }
  personalLookup(value: unknown) { return this.send(calls.personalLookup(value)); }
  invoke(taskId: string, tool: string, step: number, input: JsonObject, options?: { leaseEpoch?: number; reason?: string }) {
    return this.send(calls.invoke(taskId, tool, step, input, options));
  }
  dispatchSubtask(taskId: string, step: number, kind: string, input: JsonObject, options?: { leaseEpoch?: number }) {
    return this.send(calls.dispatchSubtask(taskId, step, kind, input, options));
  }
  latestTreeHead() { return this.send(calls.latestTreeHead()); }
  inclusionProof(position: number, options?: { treeSize?: number }) { return this.send(calls.inclusionProof(position, options)); }
  consistencyProof(first: number, second: number) { return this.send(calls.consistencyProof(first, second)); }

  // --- sessions ------------------------------------------------------------------------------

  /** Work on a claimed task (see {@link TaskSession}); `run(fn)` or `start()`/`close()` heartbeat meanwhile. */
  session(lease: Lease, options?: SessionOptions): TaskSession {
    return new TaskSession(this, lease, options);
  }

  /** {@link claim} and {@link session} in one: a session on the claimed task, or null. */
  async claimSession(kinds?: string[], options: ClaimOptions & SessionOptions = {}): Promise<TaskSession | null> {
    const lease = await this.claim(kinds, { leaseSeconds: options.leaseSeconds, taskId: options.taskId });
    return lease === null ? null : this.session(lease, { heartbeatIntervalMs: options.heartbeatIntervalMs });
  }

  // --- composed of requests --------------------------------------------------------------------

  /** Every event after `afterSeq`, following the pages. */
  async *iterEvents(taskId: string, { afterSeq = 0, pageSize = 1000 }: { afterSeq?: number; pageSize?: number } = {}
  ): AsyncGenerator<Event> {
    for (let cursor: number | null = afterSeq; cursor !== null;) {
      const page = await this.events(taskId, { afterSeq: cursor, limit: pageSize });
      yield* page.results;
      cursor = page.next_after_seq;
    }
  }

  /**
   * The inclusion-proof bundle of `event` (as the API shows it) in the latest signed tree: the
   * file the dashboard's *Download proof* gives, to check with {@link checkProofBundle} against
   * a key you trust. The proof is asked for the head's own size, so a seal in between cannot
   * pair a path with another tree's head.
   */
  async proofBundle(event: Event): Promise<ProofBundle> {
    const head = await this.latestTreeHead();
    const proof = await this.inclusionProof(event.position, { treeSize: head.tree_size });
    return { format: PROOF_BUNDLE_FORMAT, event, leaf_index: proof.leaf_index, tree_size: proof.tree_size,
      audit_path: proof.audit_path, tree_head: head };
  }

  /**
   * The approval request once decided (`granted`, `denied` or `expired`), or as it is after
   * `timeoutMs`; each read waits on the server. Then dispatch the same call again.
   */
  async waitForApproval(approvalId: string, { timeoutMs = 3_600_000, signal }: { timeoutMs?: number; signal?: AbortSignal } = {}
  ): Promise<Approval> {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const left = deadline - Date.now();
      const wait = Math.max(0, Math.min(calls.APPROVAL_WAIT_SECONDS, Math.floor(left / 1000)));
      const request = await this.send(calls.getApproval(approvalId, { wait }), { signal });
      if (request.status !== "pending" || left <= 1000) return request;
    }
  }
}
