/**
 * The Agent Backplane's TypeScript client (docs/sdk-typescript.md): Node 18+, no dependencies.
 *
 * - {@link AgentClient}: one method per request of the REST contract, with safe retries ({@link RetryPolicy});
 * - {@link TaskSession}: a claimed task with a heartbeat, writes fenced by the lease epoch, and
 *   steps, model calls, tool calls ({@link ToolCall}) and sub-agents that an earlier attempt's
 *   work is never redone for;
 * - {@link replay}: an agent function run again in a sandbox of a past task, and where it drifts;
 * - {@link canonicalJson} / {@link promptSha256}: RFC 8785 and the prompt hash `LLMCalled` names;
 * - {@link verifyChain}, {@link verifyInclusion}, {@link verifyConsistency}, {@link verifyTreeHead},
 *   {@link checkProofBundle}: what the server gives out, checked with node:crypto alone;
 * - {@link usageFromOpenAI} / {@link usageFromAnthropic} / {@link modelCost}: what a model call used and cost;
 * - the errors: one {@link BackplaneAPIError} subclass per code of the contract, {@link LeaseLost},
 *   {@link SandboxRefused}, {@link ToolCallFailed}, {@link ModelCallNotRecorded}, {@link AwaitingApproval}, …
 */
export { AgentClient } from "./agent.js";
export type { AgentClientOptions, SendOptions, Sender } from "./agent.js";
export {
  API_PREFIX, APPROVAL_WAIT_SECONDS, REPLAY_HEADER, eventDraft, newIdempotencyKey, personal,
} from "./calls.js";
export type {
  Answer, AppendOptions, Call, ClaimOptions, CreateTaskOptions, DispatchOptions, Dispatched, EventDraft, EventFields,
  ForkOptions, Invoked, Lease,
} from "./calls.js";
export * as calls from "./calls.js";
export { CanonicalizationError, canonicalJson, promptSha256 } from "./canonical.js";
export {
  AlreadyDecided, ApprovalDenied, ApprovalExpired, AwaitingApproval, BackplaneAPIError, BudgetExceeded, CircuitOpen,
  CONTRACT_ERROR_CODES, IdempotencyMismatch, JobConflict, LEASE_LOST_CODES, LeaseLost, MethodNotAllowed, NotAcceptable,
  NotAuthenticated, NotFound, PauseInForce, PayloadTooLarge, PermissionDenied, RateLimited, SandboxRefused, SeqConflict,
  SubjectErased, TaskClosed, TaskExists, ToolCallFailed, ToolOutcomeMissing, ToolUnavailable, TransportError, Unavailable,
  UnsupportedMediaType, ValidationError, errorClassOf, retryAfterOf,
} from "./errors.js";
export type { ContractErrorCode, ErrorOptions } from "./errors.js";
export {
  EMPTY_ROOT, GENESIS_PREV_HASH, PROOF_BUNDLE_FORMAT, ProofBundleInvalid, checkProofBundle, eventHash, eventLeafHash,
  merkleLeafHash, merkleNodeHash, merkleRoot, treeHeadMessage, verifyChain, verifyConsistency, verifyInclusion,
  verifyTreeHead,
} from "./integrity.js";
export type { ChainVerdict, HashedEvent, ProofBundle, ProofBundleChecked, ProofBundleStep, TreeHead } from "./integrity.js";
export { DEFAULT_RETRY, HONOURED_RETRY_AFTER, RETRY_STATUSES, RetryPolicy } from "./retry.js";
export type { RetryOptions } from "./retry.js";
export { ModelCallNotRecorded, ReplayResult, ReplaySession, recordedModelCalls, replay } from "./sandbox.js";
export type { Models, ReplayOptions } from "./sandbox.js";
export {
  MIN_HEARTBEAT_INTERVAL_MS, PROMPT_RECORD_LIMIT, TaskSession, ToolCall, heartbeatIntervalFor, llmCalledPayload,
} from "./session.js";
export type { ApprovalOptions, ModelFunction, SessionOptions, ToolCallOptions, ToolFunction } from "./session.js";
export type * from "./types.js";
export { USAGE_KEYS, modelCost, usageFromAnthropic, usageFromOpenAI } from "./usage.js";
export type { Cost, ModelAnswer, Usage } from "./usage.js";
