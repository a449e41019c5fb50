/**
 * The contract's objects, named as the guides name them, from the types generated out of
 * docs/openapi.yaml (src/generated/openapi.ts; the offline suite fails when it is stale).
 */
import type { components, paths } from "./generated/openapi.js";

type Schemas = components["schemas"];

export type Task = Schemas["TaskOut"];
export type TaskStatus = Schemas["TaskOutStatusEnum"];
export type TaskList = Schemas["TaskListOut"];
export type Event = Schemas["EventOut"];
export type EventList = Schemas["EventListOut"];
export type LeaseAnswer = Schemas["LeaseClaimOut"];
export type Heartbeat = Schemas["HeartbeatOut"];
export type ChainVerification = Schemas["ChainVerifyOut"];
export type ToolCallDispatch = Schemas["ToolCallDispatchOut"];
export type ToolCallRecord = Schemas["ToolCallOut"];
export type ToolInvocation = Schemas["ToolInvokeOut"];
export type AwaitingApprovalAnswer = Schemas["AwaitingApprovalOut"];
export type Approval = Schemas["ApprovalOut"];
export type Signal = Schemas["SignalOut"];
export type Subtask = Schemas["SubtaskOut"];
export type TaskDiff = Schemas["TaskDiffOut"];
export type Divergence = Schemas["DivergenceOut"];
export type DiffCounts = Schemas["DiffCountsOut"];
export type OutboxItem = Schemas["OutboxItemInRequest"];
export type ToolAnswer = Schemas["ToolAnswerInRequest"];
export type ErrorAnswer = Schemas["ErrorOut"];
export type SignedTreeHead = Schemas["SignedTreeHeadOut"];
export type InclusionProof = Schemas["InclusionProofOut"];
export type ConsistencyProof = Schemas["ConsistencyProofOut"];

/** Any JSON object, as the contract's `input`, `payload`, `output` and `result` are. */
export type JsonObject = Record<string, unknown>;

export type HttpMethod = "get" | "post";
/** The contract's paths that answer `method`. */
export type PathOf<M extends HttpMethod> = {
  [P in keyof paths]: paths[P] extends { [K in M]: infer Operation } ? ([Operation] extends [never | undefined] ? never : P) : never
}[keyof paths];

/**
 * `GET /api/v1/tasks/{id}/recovery-context/`: what a (new) holder needs to resume. The contract
 * describes it in words only (docs/api.md, "Leases"); this is its shape as the server builds it
 * (recovery/selectors.py). Each entry names the task whose log holds it (`task_id`: a fork's
 * history includes its source's events up to the fork point).
 */
export interface RecoveryContext {
  task_id: string;
  attempt: number;
  recovery_point_seq: number;
  forked_from: { task_id: string; at_seq: number; sandbox: boolean } | null;
  completed_steps: { seq: number; task_id: string; step: number; payload: JsonObject }[];
  tool_calls: ContextToolCall[];
  in_flight_tool_calls: ContextToolCall[];
  subtasks: ContextSubtask[];
  model_calls: ContextModelCall[];
  last_reasoning: { seq: number; task_id: string; step: number; payload: JsonObject } | null;
  resume_prompt: string;
}

export interface ContextToolCall {
  idempotency_key: string;
  task_id: string;
  step: number;
  tool: string;
  input: JsonObject;
  status: "in_flight" | "succeeded" | "failed";
  result: JsonObject | null;
  dispatched_seq: number;
  dispatched_at: string;
  result_seq: number | null;
}

export interface ContextSubtask {
  child_task_id: string;
  dispatch_key: string | null;
  step: number | null;
  kind: string | null;
  status: string;
  output: JsonObject | null;
  error: string | null;
}

export interface ContextModelCall {
  seq: number;
  task_id: string;
  step: number;
  model: string;
  provider: string | null;
  prompt_sha256: string;
  output: unknown;
  usage: Record<string, number> | null;
  cost: Record<string, unknown> | null;
}
