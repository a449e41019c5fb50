/**
 * Replay an agent against a task's record, in a sandbox, and see where it drifts (docs/replay.md).
 *
 * {@link replay} forks a *sandbox* of the source task, claims it by its id, runs your agent
 * function on it with a {@link ReplaySession}, and asks the backplane where the sandbox's history
 * drifts from the source's. In a sandbox, tool calls and sub-agent hand-offs are answered by the
 * *server* from the source's record (never sent to a tool: `409 sandbox_refused` for a step with
 * no recorded answer, thrown as {@link SandboxRefused}); model calls, with `models: "recorded"`,
 * by the source's recorded `LLMCalled` for the same step (the model is never called), or with
 * `"live"` by the model. Either way the sandbox records its own `LLMCalled` with the prompt *it*
 * built, so a changed prompt is a divergence in the diff.
 */
import type { AgentClient } from "./agent.js";
import { BackplaneAPIError } from "./errors.js";
import type { Lease } from "./calls.js";
import { TaskSession, type ModelFunction, type SessionOptions } from "./session.js";
import type { ContextModelCall, DiffCounts, Divergence, JsonObject, RecoveryContext, ToolAnswer } from "./types.js";
import type { ModelAnswer } from "./usage.js";

export type Models = "recorded" | "live";

/**
 * A replay with `models: "recorded"` asked for a model call at a step the source never recorded
 * one for; recorded mode never calls a model (use `"live"`).
 */
export class ModelCallNotRecorded extends Error {
  readonly step: number;
  readonly sourceTaskId: string;

  constructor({ step, sourceTaskId }: { step: number; sourceTaskId: string }) {
    super(`task ${sourceTaskId} recorded no model call at step ${step}, and a replay with recorded models never calls the model`);
    this.name = "ModelCallNotRecorded";
    this.step = step;
    this.sourceTaskId = sourceTaskId;
  }
}

/**
 * What a replay found: the sandbox it ran in, the first event (and field) where its history
 * differs from the source's, the diff's counts (`same`, `changed`, `only_in_a`, `only_in_b`; a is
 * the source), and the error the agent function ended with, if any.
 */
export class ReplayResult {
  constructor(
    readonly sandboxTaskId: string,
    readonly firstDivergence: Divergence | null,
    readonly counts: DiffCounts,
    readonly error: unknown = null,
  ) {}

  /** Whether the replay did anything the source did not (or left out anything it did). */
  get drifted(): boolean {
    return this.firstDivergence !== null;
  }
}

/**
 * The session a replay hands the agent function: a {@link TaskSession} on the sandbox whose model
 * calls, in recorded mode, are answered from the source's `LLMCalled` events (`recordedModels`:
 * step → the source's context entry; null in live mode).
 */
export class ReplaySession extends TaskSession {
  readonly sourceTaskId: string;
  readonly recordedModels: Map<number, ContextModelCall> | null;

  constructor(client: AgentClient, lease: Lease, { sourceTaskId, recordedModels, ...options }: SessionOptions & {
    sourceTaskId: string; recordedModels: Map<number, ContextModelCall> | null;
  }) {
    super(client, lease, options);
    this.sourceTaskId = sourceTaskId;
    this.recordedModels = recordedModels;
  }

  protected override async askModel(step: number, model: string, prompt: unknown, call: ModelFunction
  ): Promise<[ModelAnswer, JsonObject]> {
    if (this.recordedModels === null) return [await call(prompt), {}];
    const recorded = this.recordedModels.get(step);
    if (recorded === undefined) throw new ModelCallNotRecorded({ step, sourceTaskId: this.sourceTaskId });
    // The recorded usage too, and a cost the provider reported (the server settles any other one
    // itself): a diff compares the answer as recorded. `recorded_from` says it was served, not
    // spent again (the diff leaves it out: it names another task).
    const answer: ModelAnswer = { output: recorded.output };
    if (recorded.usage != null) answer.usage = recorded.usage;
    const cost = recorded.cost;
    if (cost != null && cost.source === "provider") answer.cost = { amount: String(cost.amount), currency: String(cost.currency) };
    return [answer, { recorded_from: { task_id: recorded.task_id, seq: recorded.seq } }];
  }
}

/** The model calls of a recovery context by step (the first one of a step: the decision). */
export function recordedModelCalls(context: RecoveryContext): Map<number, ContextModelCall> {
  const byStep = new Map<number, ContextModelCall>();
  for (const entry of context.model_calls) {
    if (Number.isInteger(entry.step) && !byStep.has(entry.step)) byStep.set(entry.step, { ...entry });
  }
  return byStep;
}

export interface ReplayOptions {
  models?: Models;
  /** `[{step, tool, status, result}]`: edits of the record the sandbox is answered from. */
  toolAnswers?: ToolAnswer[];
  /** Replaces the source's input. */
  input?: JsonObject;
  /** The sandbox continues after this event of the source (1: the whole run is replayed). */
  atSeq?: number;
  reason?: string;
  leaseSeconds?: number;
}

/**
 * Run `agentFn` on a sandbox fork of `sourceTaskId` and report where it drifts.
 *
 * 1. The source's recorded model calls are read (recorded mode), then the sandbox is forked after
 *    the source's event `atSeq`, with `input` and `toolAnswers` if given.
 * 2. It is claimed by id (the client's agent must be allowed its kind) and `agentFn(session)` runs
 *    on it: the same function the agent runs in production.
 * 3. The diff of the source (a) and the sandbox (b) is read. An error from `agentFn` (a
 *    {@link SandboxRefused}, a {@link ModelCallNotRecorded}, a bug) is not thrown: it is the
 *    result's `error`.
 * 4. A sandbox the function left open is failed (not retryable) after the diff was read: a
 *    sandbox is never handed to another agent, so it would otherwise wait for ever.
 */
export async function replay(client: AgentClient, sourceTaskId: string, agentFn: (session: TaskSession) => unknown,
  { models = "recorded", toolAnswers, input, atSeq = 1, reason = "sandbox replay", leaseSeconds = 60 }: ReplayOptions = {}
): Promise<ReplayResult> {
  if (models !== "recorded" && models !== "live") throw new RangeError(`models must be "recorded" or "live", not ${String(models)}`);
  const recorded = models === "recorded" ? recordedModelCalls(await client.recoveryContext(sourceTaskId)) : null;
  const sandbox = await client.fork(sourceTaskId, { atSeq, reason, input, sandbox: true, toolAnswers });
  const sandboxId = sandbox.task_id;
  const lease = await client.claim(undefined, { taskId: sandboxId, leaseSeconds });
  if (lease === null) {
    throw new Error(`sandbox ${sandboxId} could not be claimed: the agent may not claim tasks of kind ${JSON.stringify(sandbox.kind)}`);
  }
  const session = new ReplaySession(client, lease, { sourceTaskId, recordedModels: recorded });
  return session.run(async () => {
    let error: unknown = null;
    try {
      await agentFn(session);
    } catch (caught) {
      error = caught; // whatever ended the replay is its result, not a crash of ours
    }
    const drift = await client.diff(sourceTaskId, sandboxId);
    if (session.ended === null && !session.lost) await close(session, error);
    return new ReplayResult(sandboxId, drift.first_divergence, { ...drift.counts }, error);
  });
}

async function close(session: TaskSession, error: unknown): Promise<void> {
  const why = error !== null ? `replay ended: ${String(error)}` : "replay ended without completing or failing the task";
  try {
    await session.fail(why.slice(0, 1000), { retryable: false });
  } catch (failure) {
    // Left as it is, the sandbox's lease runs out and the stall detector takes it back.
    if (!(failure instanceof BackplaneAPIError)) throw failure;
    process.emitWarning(`could not close sandbox ${session.taskId}: ${failure.message}`, "BackplaneReplay");
  }
}
