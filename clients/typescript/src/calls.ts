/**
 * The contract's requests, built once per method call (sans I/O).
 *
 * Each function turns a method's arguments into a {@link Call}: the HTTP method, the path (checked
 * at compile time against the contract's paths in src/generated/openapi.ts), the JSON body, the
 * query, and how to read a successful answer. {@link AgentClient} only sends calls and maps
 * answers, and a {@link TaskSession} builds the same calls, so the two cannot drift apart.
 *
 * Everything random is decided here, once: the idempotency key of an append, the id of a new
 * task or fork. The retry loop re-sends the very same call, which is what makes a retry after a
 * lost answer land on the original write.
 */
import { randomUUID } from "node:crypto";
import type { HttpMethod, PathOf } from "./types.js";
import type {
  Approval, ChainVerification, ConsistencyProof, Event, EventList, Heartbeat, InclusionProof, JsonObject, OutboxItem,
  RecoveryContext, Signal, SignedTreeHead, Subtask, Task, TaskDiff, TaskList, ToolAnswer, ToolCallDispatch, ToolCallRecord,
  ToolInvocation, AwaitingApprovalAnswer,
} from "./types.js";

export const API_PREFIX = "/api/v1";
export const REPLAY_HEADER = "Idempotent-Replay";
/** The longest one read of an approval request or a signal waits on the server. */
export const APPROVAL_WAIT_SECONDS = 30;

/** A successful answer as the reader of a call sees it. */
export interface Answer {
  status: number;
  headers: Headers;
  body: unknown;
}

/** One request of the contract and the reader of its successful answer. */
export interface Call<T> {
  method: "GET" | "POST";
  /** The path after `/api/v1`, ids filled in. */
  path: string;
  body?: unknown;
  query?: Record<string, string | number>;
  /** Seconds the server may hold the answer back (a read that waits): added to the request's timeout. */
  waits?: number;
  read: (answer: Answer) => T;
}

/** A claimed task: `POST /leases/`'s answer. Send `leaseEpoch` with every write. */
export interface Lease {
  task: Task;
  taskId: string;
  leaseEpoch: number;
  expiresAt: string;
  recovered: boolean;
  /** The length asked for in the claim, when the caller gave one (paces a session's heartbeats). */
  leaseSeconds: number | null;
}

/** A tool call's dispatch or invoke answer while a tool policy waits for people. */
export type Dispatched = ToolCallDispatch | AwaitingApprovalAnswer;
export type Invoked = ToolInvocation | AwaitingApprovalAnswer;

/** An event as the append endpoints take it. */
export interface EventDraft {
  type: string;
  payload: JsonObject;
  idempotency_key?: string;
  lamport?: number;
  causation_id?: string;
  correlation_id?: string;
  trace_id?: string;
  outbox?: OutboxItem[];
}

export interface EventFields {
  idempotencyKey?: string;
  lamport?: number;
  causationId?: string;
  correlationId?: string;
  traceId?: string;
  outbox?: OutboxItem[];
}

/**
 * `template` is one of the contract's paths (the compiler checks it against the generated
 * types, with the method); `ids` fill its `{placeholders}` in order, URL-encoded.
 */
function route<M extends HttpMethod>(method: M, template: PathOf<M>, ...ids: (string | number)[]): string {
  let index = 0;
  const filled = (template as string).replace(/\{[^}]+\}/g, () => encodeURIComponent(String(ids[index++])));
  if (index !== ids.length) throw new Error(`${method} ${template}: ${ids.length} ids for ${index} placeholders`);
  return filled.slice(API_PREFIX.length);
}

/** A fresh key for a write the caller did not key, generated once per call so every retry carries it. */
export function newIdempotencyKey(): string {
  return randomUUID().replaceAll("-", "");
}

/** The fields of an object whose value is not undefined, so an option left out is not sent. */
function defined<T extends Record<string, unknown>>(fields: T): Partial<T> {
  return Object.fromEntries(Object.entries(fields).filter(([, value]) => value !== undefined)) as Partial<T>;
}

/** One event as the append endpoints take it; options left undefined are left out. */
export function eventDraft(type: string, payload: JsonObject = {}, fields: EventFields = {}): EventDraft {
  return {
    type,
    payload,
    ...defined({
      idempotency_key: fields.idempotencyKey,
      lamport: fields.lamport,
      causation_id: fields.causationId,
      correlation_id: fields.correlationId,
      trace_id: fields.traceId,
      outbox: fields.outbox,
    }),
  };
}

/**
 * A value marked as personal data of `subject`, to put anywhere in a request's JSON: the server
 * seals it before anything hashes or stores it. With `lookup` it can be found again by
 * `AgentClient.personalLookup`.
 */
export function personal(subject: string, value: unknown, { lookup = false }: { lookup?: boolean } = {}): JsonObject {
  return { $personal: lookup ? { subject, value, lookup: true } : { subject, value } };
}

const json = <T>(answer: Answer): T => answer.body as T;

// --- tasks and events ------------------------------------------------------------------------

export interface CreateTaskOptions {
  taskId?: string;
  parentTaskId?: string;
  maxAttempts?: number;
  metadata?: JsonObject;
}

/** Create a task (`201`); the same `taskId` with the same content returns the existing one (`200`).
 * Without `taskId` the client picks a uuid4, once, so a retry after a lost answer finds the task
 * the first attempt created instead of creating a twin. */
export function createTask(kind: string, input: JsonObject, options: CreateTaskOptions = {}): Call<Task> {
  const body = { kind, input, task_id: options.taskId ?? randomUUID(),
    ...defined({ parent_task_id: options.parentTaskId, max_attempts: options.maxAttempts, metadata: options.metadata }) };
  return { method: "POST", path: route("post", "/api/v1/tasks/"), body, read: json<Task> };
}

export function getTask(taskId: string): Call<Task> {
  return { method: "GET", path: route("get", "/api/v1/tasks/{task_id}/", taskId), read: json<Task> };
}

export function listTasks(options: { status?: string; kind?: string; limit?: number; cursor?: string } = {}): Call<TaskList> {
  return { method: "GET", path: route("get", "/api/v1/tasks/"), query: defined(options) as Record<string, string | number>,
    read: json<TaskList> };
}

/** The server's check of the task's hash chain. */
export function verify(taskId: string): Call<ChainVerification> {
  return { method: "GET", path: route("get", "/api/v1/tasks/{task_id}/verify/", taskId), read: json<ChainVerification> };
}

export function events(taskId: string, options: { afterSeq?: number; limit?: number } = {}): Call<EventList> {
  return { method: "GET", path: route("get", "/api/v1/tasks/{task_id}/events/", taskId),
    query: defined({ after_seq: options.afterSeq ?? 0, limit: options.limit }) as Record<string, number>,
    read: json<EventList> };
}

export interface AppendOptions extends EventFields {
  leaseEpoch?: number;
  expectedSeq?: number;
}

/**
 * Append one event. Without `idempotencyKey` the client generates one for this call, so its
 * retries cannot append twice; pass a stable key (from the task and the step) to make a repeat
 * by a later attempt harmless too. The same key and body again answer with the original event.
 */
export function append(taskId: string, type: string, payload: JsonObject = {}, options: AppendOptions = {}): Call<Event> {
  const body = { ...eventDraft(type, payload, { ...options, idempotencyKey: options.idempotencyKey ?? newIdempotencyKey() }),
    ...defined({ lease_epoch: options.leaseEpoch, expected_seq: options.expectedSeq }) };
  return { method: "POST", path: route("post", "/api/v1/tasks/{task_id}/events/", taskId), body, read: json<Event> };
}

/** Append several events, all or nothing (build each with {@link eventDraft}); events without a key get one, once per call. */
export function appendBatch(taskId: string, drafts: EventDraft[], options: { leaseEpoch?: number; expectedSeq?: number } = {}
): Call<Event[]> {
  // Every event needs a key for the batch to be replayable: the server answers a repeat with the
  // originals only when all of its events are already recorded under their keys.
  const keyed = drafts.map((draft) => draft.idempotency_key === undefined ? { ...draft, idempotency_key: newIdempotencyKey() } : draft);
  const body = { events: keyed, ...defined({ lease_epoch: options.leaseEpoch, expected_seq: options.expectedSeq }) };
  return { method: "POST", path: route("post", "/api/v1/tasks/{task_id}/events/batch/", taskId), body,
    read: (answer) => (answer.body as { results: Event[] }).results };
}

// --- leases and recovery ---------------------------------------------------------------------

export interface ClaimOptions {
  leaseSeconds?: number;
  /** Claim that very task if it is pending and of a kind allowed (how a sandbox fork is run). */
  taskId?: string;
}

/**
 * Claim the oldest pending task of `kinds` (default: all this agent may claim), or null (204).
 * Not idempotent on the server: a retried claim whose answer was lost may lease another task,
 * and the first lease simply expires (the stall detector hands it on). Nothing is done twice.
 */
export function claim(kinds?: string[], options: ClaimOptions = {}): Call<Lease | null> {
  const body = defined({ kinds, lease_seconds: options.leaseSeconds, task_id: options.taskId });
  return {
    method: "POST", path: route("post", "/api/v1/leases/"), body,
    read: (answer) => {
      if (answer.status === 204) return null;
      const data = answer.body as { task: Task; lease_epoch: number; expires_at: string; recovered: boolean };
      return { task: data.task, taskId: data.task.task_id, leaseEpoch: data.lease_epoch, expiresAt: data.expires_at,
        recovered: data.recovered, leaseSeconds: options.leaseSeconds ?? null };
    },
  };
}

/** Extend the lease: `{expires_at}`; `409 stale_lease` ({@link LeaseLost}) once it is lost. */
export function heartbeat(taskId: string, leaseEpoch: number): Call<Heartbeat> {
  return { method: "POST", path: route("post", "/api/v1/tasks/{task_id}/heartbeat/", taskId),
    body: { lease_epoch: leaseEpoch }, read: json<Heartbeat> };
}

/** Give the task back to `pending` without counting an attempt; returns the Task. */
export function release(taskId: string, leaseEpoch: number): Call<Task> {
  return { method: "POST", path: route("post", "/api/v1/tasks/{task_id}/release/", taskId),
    body: { lease_epoch: leaseEpoch }, read: json<Task> };
}

export function recoveryContext(taskId: string): Call<RecoveryContext> {
  return { method: "GET", path: route("get", "/api/v1/tasks/{task_id}/recovery-context/", taskId),
    read: json<RecoveryContext> };
}

// --- forks and drift ------------------------------------------------------------------------

export interface ForkOptions {
  atSeq: number;
  reason: string;
  input?: JsonObject;
  taskId?: string;
  sandbox?: boolean;
  toolAnswers?: ToolAnswer[];
}

/**
 * Fork a task after its event `atSeq` (docs/replay.md): a new pending task whose history is the
 * source's up to there. `sandbox` makes a replay that never reaches a tool; `toolAnswers` edits
 * a sandbox's record. Without `taskId` the client picks one, once, so a retry finds the same fork.
 */
export function fork(sourceTaskId: string, options: ForkOptions): Call<Task> {
  const body = { at_seq: options.atSeq, reason: options.reason, task_id: options.taskId ?? randomUUID(),
    ...defined({ input: options.input, sandbox: options.sandbox ? true : undefined,
      tool_answers: options.toolAnswers && options.toolAnswers.length > 0 ? options.toolAnswers : undefined }) };
  return { method: "POST", path: route("post", "/api/v1/tasks/{task_id}/fork/", sourceTaskId), body, read: json<Task> };
}

/** Where the histories of tasks `a` and `b` drift apart (`first_divergence` null when they do the same). */
export function diff(a: string, b: string): Call<TaskDiff> {
  return { method: "GET", path: route("get", "/api/v1/tasks/{task_id}/diff/{other_id}/", a, b), read: json<TaskDiff> };
}

// --- tool calls and sub-agents ---------------------------------------------------------------

export interface DispatchOptions {
  leaseEpoch?: number;
  compensation?: { tool: string; input: JsonObject };
  /** Why the call is made; shown to the people a tool policy asks. */
  reason?: string;
}

/**
 * Record a tool call before making it (write before you act). The answer's `status` says what
 * to do: `dispatched` (call the tool with `Idempotency-Key: <effect_key>`), `in_flight` (dispatched
 * earlier, never answered: call again with the same key), `succeeded`/`failed` (use `result`), or
 * `awaiting_approval` (wait with {@link getApproval}, then dispatch the same call again).
 */
export function dispatchToolCall(taskId: string, step: number, tool: string, input: JsonObject,
  options: DispatchOptions = {}): Call<Dispatched> {
  const body = { step, tool, input, ...defined({ lease_epoch: options.leaseEpoch, compensation: options.compensation,
    reason: options.reason }) };
  return { method: "POST", path: route("post", "/api/v1/tasks/{task_id}/tool-calls/", taskId), body, read: json<Dispatched> };
}

/** Record a tool's answer (`succeeded` or `failed`) before advancing; an identical repeat is a replay. */
export function recordToolResult(idempotencyKey: string, status: "succeeded" | "failed", result: JsonObject,
  options: { leaseEpoch?: number } = {}): Call<ToolCallRecord> {
  return { method: "POST", path: route("post", "/api/v1/tool-calls/{key}/result/", idempotencyKey),
    body: { status, result, ...defined({ lease_epoch: options.leaseEpoch }) }, read: json<ToolCallRecord> };
}

export function getToolCall(idempotencyKey: string): Call<ToolCallRecord> {
  return { method: "GET", path: route("get", "/api/v1/tool-calls/{key}/", idempotencyKey), read: json<ToolCallRecord> };
}

/** A gated call's approval request; with `wait` (seconds, at most 30) the answer comes as soon as it is decided. */
export function getApproval(approvalId: string, options: { wait?: number } = {}): Call<Approval> {
  return { method: "GET", path: route("get", "/api/v1/approvals/{approval_id}/", approvalId),
    query: defined({ wait: options.wait }) as Record<string, number>, waits: options.wait, read: json<Approval> };
}

/** Wait durably for the signal `name` (at most `timeoutSeconds`); read it with {@link getSignal}. */
export function awaitSignal(taskId: string, name: string, timeoutSeconds: number, options: { leaseEpoch?: number } = {}
): Call<Signal> {
  return { method: "POST", path: route("post", "/api/v1/tasks/{task_id}/signals/{name}/wait/", taskId, name),
    body: { timeout_seconds: timeoutSeconds, ...defined({ lease_epoch: options.leaseEpoch }) }, read: json<Signal> };
}

export function getSignal(taskId: string, name: string, options: { wait?: number } = {}): Call<Signal> {
  return { method: "GET", path: route("get", "/api/v1/tasks/{task_id}/signals/{name}/", taskId, name),
    query: defined({ wait: options.wait }) as Record<string, number>, waits: options.wait, read: json<Signal> };
}

export function sendSignal(taskId: string, name: string, payload: JsonObject): Call<Signal> {
  return { method: "POST", path: route("post", "/api/v1/tasks/{task_id}/signals/{name}/", taskId, name),
    body: { payload }, read: json<Signal> };
}

/** `value` with each personal-data envelope of the agent's namespace opened (or shown erased). */
export function personalOpen(value: unknown, options: { taskId?: string } = {}): Call<unknown> {
  return { method: "POST", path: route("post", "/api/v1/personal-data/open/"),
    body: { value, ...defined({ task_id: options.taskId }) }, read: (answer) => (answer.body as { value: unknown }).value };
}

/** The data subjects a value marked with `lookup` belongs to. */
export function personalLookup(value: unknown): Call<string[]> {
  return { method: "POST", path: route("post", "/api/v1/personal-data/lookup/"), body: { value },
    read: (answer) => [...(answer.body as { subjects: string[] }).subjects] };
}

/**
 * Have the backplane call a registered tool for this step (the gateway). An answer on record is
 * returned without calling the tool again; `503 circuit_open` while its breaker is open; a gated
 * call answers `awaiting_approval` until people decide.
 */
export function invoke(taskId: string, tool: string, step: number, input: JsonObject,
  options: { leaseEpoch?: number; reason?: string } = {}): Call<Invoked> {
  return { method: "POST", path: route("post", "/api/v1/tools/{name}/invoke/", tool),
    body: { task_id: taskId, step, input, ...defined({ lease_epoch: options.leaseEpoch, reason: options.reason }) },
    read: json<Invoked> };
}

/** Hand work to a sub-agent: `{task, dispatch_key}`; a repeat for the same step and kind returns the same child. */
export function dispatchSubtask(taskId: string, step: number, kind: string, input: JsonObject,
  options: { leaseEpoch?: number } = {}): Call<Subtask> {
  return { method: "POST", path: route("post", "/api/v1/tasks/{task_id}/subtasks/", taskId),
    body: { step, kind, input, ...defined({ lease_epoch: options.leaseEpoch }) }, read: json<Subtask> };
}

// --- integrity (check the answers with integrity.ts) -------------------------------------------

/** The latest signed tree head; `404` before the first seal. Its `public_key` is the server's word:
 * verify the signature with a key you trust ({@link verifyTreeHead}). */
export function latestTreeHead(): Call<SignedTreeHead> {
  return { method: "GET", path: route("get", "/api/v1/seals/latest/"), read: json<SignedTreeHead> };
}

/** The audit path of the event at `position` (an event of the agent's namespace) in the signed tree
 * of `treeSize` leaves (default the latest); `404` for an event not sealed in it yet. */
export function inclusionProof(position: number, options: { treeSize?: number } = {}): Call<InclusionProof> {
  return { method: "GET", path: route("get", "/api/v1/events/{position}/proof/", position),
    query: defined({ tree_size: options.treeSize }) as Record<string, number>, read: json<InclusionProof> };
}

/** The proof that the signed tree of `first` leaves is a prefix of the signed tree of `second`. */
export function consistencyProof(first: number, second: number): Call<ConsistencyProof> {
  return { method: "GET", path: route("get", "/api/v1/seals/consistency/"), query: { first, second },
    read: json<ConsistencyProof> };
}
