/**
 * The client's errors: the contract's error answers (one class per code), a lost lease, a
 * tool's refusal, a request that never got an answer.
 *
 * An error answer is `{"error": {"code", "message", "details"}}` (docs/api.md, "Errors"). It is
 * thrown as the class of its code, every one a {@link BackplaneAPIError}, so code that knows only
 * the base class keeps catching them all, and code that cares catches `SeqConflict`,
 * `IdempotencyMismatch` or `LeaseLost` by type.
 */

/** The codes of the contract's error table (docs/api.md), each with its class below. */
export const CONTRACT_ERROR_CODES = [
  "validation_error", "not_authenticated", "permission_denied", "not_found", "method_not_allowed",
  "seq_conflict", "stale_lease", "task_closed", "task_exists", "budget_exceeded", "pause_in_force",
  "already_decided", "approval_denied", "approval_expired", "subject_erased", "job_conflict",
  "sandbox_refused", "not_acceptable", "payload_too_large", "unsupported_media_type",
  "idempotency_mismatch", "rate_limited", "tool_unavailable", "circuit_open", "unavailable",
] as const;
export type ContractErrorCode = (typeof CONTRACT_ERROR_CODES)[number];

/** The codes that mean "this lease is no longer yours" when a heartbeat or write gets them. */
export const LEASE_LOST_CODES: ReadonlySet<string> = new Set(["stale_lease", "task_closed", "not_found"]);

export interface ErrorOptions {
  /** `Retry-After` in seconds (429 and 503 answers), or null. */
  retryAfter?: number | null;
  method?: string;
  url?: string;
  /** How many times the request was sent before this answer was accepted as final. */
  attempts?: number;
}

/**
 * The backplane answered with an error status. `code` is the contract's machine-readable code,
 * `details` its structured details. An answer not in the contract's shape (a proxy's HTML
 * page) gets the code `http_<status>` and the body's first characters as the message.
 */
export class BackplaneAPIError extends Error {
  readonly status: number;
  readonly code: string;
  readonly details: Record<string, unknown>;
  readonly retryAfter: number | null;
  readonly method: string | undefined;
  readonly url: string | undefined;
  readonly attempts: number;

  constructor(status: number, code: string, message: string, details: Record<string, unknown> = {},
    options: ErrorOptions = {}) {
    super(`${status} ${code}: ${message}`);
    this.name = new.target.name;
    this.status = status;
    this.code = code;
    this.details = details;
    this.retryAfter = options.retryAfter ?? null;
    this.method = options.method;
    this.url = options.url;
    this.attempts = options.attempts ?? 1;
  }

  /** The human words of the answer (the `Error`'s own message also names status and code). */
  get reason(): string {
    return this.message.slice(`${this.status} ${this.code}: `.length);
  }

  /** The error an answer stands for, as the class of its code. */
  static fromAnswer(status: number, statusText: string, body: string, options: ErrorOptions = {}): BackplaneAPIError {
    let code = `http_${status}`;
    let message = statusText || `HTTP ${status}`;
    let details: Record<string, unknown> = {};
    let parsed: unknown;
    try {
      parsed = JSON.parse(body);
    } catch {
      parsed = undefined;
    }
    const error = isObject(parsed) ? parsed.error : undefined;
    if (isObject(error)) {
      code = typeof error.code === "string" && error.code ? error.code : code;
      message = typeof error.message === "string" && error.message ? error.message : message;
      details = isObject(error.details) ? error.details : {};
    } else if (body) {
      message = body.slice(0, 200);
    }
    const Kind = errorClassOf(code);
    return new Kind(status, code, message, details, options);
  }
}

function isObject(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

/** `400 validation_error`: `details` maps each field at fault, by its path, to a message. */
export class ValidationError extends BackplaneAPIError {}
/** `401 not_authenticated`: no token, or a bad one. */
export class NotAuthenticated extends BackplaneAPIError {}
/** `403 permission_denied`: authenticated, not allowed (in production also plain HTTP: `details.url`). */
export class PermissionDenied extends BackplaneAPIError {}
/** `404 not_found`: no such object in the caller's namespace. */
export class NotFound extends BackplaneAPIError {}
/** `405 method_not_allowed`: a method the route does not take. */
export class MethodNotAllowed extends BackplaneAPIError {}
/** `406 not_acceptable`: an `Accept` header JSON does not satisfy. */
export class NotAcceptable extends BackplaneAPIError {}
/** `409 seq_conflict`: `expected_seq` is not the task's `last_seq` (`details.last_seq`). */
export class SeqConflict extends BackplaneAPIError {}
/** `409 task_exists`: an existing `task_id` with another kind or input. */
export class TaskExists extends BackplaneAPIError {}
/** `409 budget_exceeded`: a budget of the scope is spent (`details`: the budget and the spend). */
export class BudgetExceeded extends BackplaneAPIError {}
/** `409 pause_in_force`: a pause already holds that namespace or kind. */
export class PauseInForce extends BackplaneAPIError {}
/** `409 already_decided`: a decision made twice. */
export class AlreadyDecided extends BackplaneAPIError {}
/** `409 subject_erased`: a personal value for an erased data subject. */
export class SubjectErased extends BackplaneAPIError {}
/** `409 job_conflict`: a bulk job asked what its state does not allow. */
export class JobConflict extends BackplaneAPIError {}
/** `413 payload_too_large`: the body is over the server's limit. */
export class PayloadTooLarge extends BackplaneAPIError {}
/** `415 unsupported_media_type`: a body that is not `application/json` in UTF-8. */
export class UnsupportedMediaType extends BackplaneAPIError {}
/** `422 idempotency_mismatch`: a known idempotency key reused with another body (`details.seq` for an event). */
export class IdempotencyMismatch extends BackplaneAPIError {}
/** `429 rate_limited`: retried by the client, waiting out `retryAfter`, until its attempts run out. */
export class RateLimited extends BackplaneAPIError {}
/** `502 tool_unavailable`: the gateway's tool gave no usable answer; the call stays in flight, safe to repeat. */
export class ToolUnavailable extends BackplaneAPIError {}
/** `503 circuit_open`: this agent's (or the tool's) circuit is open; retried like any 503. */
export class CircuitOpen extends BackplaneAPIError {}
/** `503 unavailable`: the database is down; retried like any 503. */
export class Unavailable extends BackplaneAPIError {}

/**
 * The lease this work was done under is gone: it expired and was swept, another agent holds the
 * task now (`409 stale_lease`), or the task was closed ({@link TaskClosed}).
 *
 * A {@link TaskSession} also throws it *without sending anything* once its heartbeat has seen the
 * lease lost (`sent` is then false), and for a request it abandoned in flight when the lease was
 * lost meanwhile (`sent` true, its answer never awaited). Stop working on the task: whoever holds
 * it now resumes from the log.
 */
export class LeaseLost extends BackplaneAPIError {
  readonly sent: boolean;

  constructor(status: number, code: string, message: string, details: Record<string, unknown> = {},
    options: ErrorOptions & { sent?: boolean } = {}) {
    super(status, code, message, details, options);
    this.sent = options.sent ?? true;
  }

  /** What a session throws instead of sending a write it knows will be refused. */
  static beforeSending(taskId: string, cause: BackplaneAPIError | null, why: string): LeaseLost {
    return new LeaseLost(cause?.status ?? 409, cause?.code ?? "stale_lease", `task ${taskId}: ${why}; nothing was sent`,
      cause?.details ?? {}, { sent: false });
  }

  /** What a session throws for a request it stopped waiting for because the lease was lost. */
  static inFlight(taskId: string, cause: BackplaneAPIError | null): LeaseLost {
    return new LeaseLost(cause?.status ?? 409, cause?.code ?? "stale_lease",
      `task ${taskId}: the lease was lost while a request was in flight; its answer was not awaited`,
      cause?.details ?? {}, { sent: true });
  }
}

/** `409 task_closed`: the task is completed, failed, cancelled…; a cancellation's `details` say who and why. */
export class TaskClosed extends LeaseLost {}

/**
 * `409 sandbox_refused`: a sandbox (a replay against a task's record) was asked for what the
 * record cannot answer: a tool call or sub-agent with no recorded answer (`details`: `step`,
 * `tool` or `kind`, `source_task_id`), an `outbox` message. Nothing was written.
 */
export class SandboxRefused extends BackplaneAPIError {}
/** `409 approval_denied`: people denied this gated tool call (`details`: `approval_id`, `denied_by`, `reason`). */
export class ApprovalDenied extends BackplaneAPIError {}
/** `409 approval_expired`: the gated call's approval request ran out undecided; the call is not made. */
export class ApprovalExpired extends BackplaneAPIError {}

type ErrorClass = new (status: number, code: string, message: string, details?: Record<string, unknown>,
  options?: ErrorOptions) => BackplaneAPIError;

const CLASS_OF_CODE: Record<ContractErrorCode, ErrorClass> = {
  validation_error: ValidationError,
  not_authenticated: NotAuthenticated,
  permission_denied: PermissionDenied,
  not_found: NotFound,
  method_not_allowed: MethodNotAllowed,
  seq_conflict: SeqConflict,
  stale_lease: LeaseLost,
  task_closed: TaskClosed,
  task_exists: TaskExists,
  budget_exceeded: BudgetExceeded,
  pause_in_force: PauseInForce,
  already_decided: AlreadyDecided,
  approval_denied: ApprovalDenied,
  approval_expired: ApprovalExpired,
  subject_erased: SubjectErased,
  job_conflict: JobConflict,
  sandbox_refused: SandboxRefused,
  not_acceptable: NotAcceptable,
  payload_too_large: PayloadTooLarge,
  unsupported_media_type: UnsupportedMediaType,
  idempotency_mismatch: IdempotencyMismatch,
  rate_limited: RateLimited,
  tool_unavailable: ToolUnavailable,
  circuit_open: CircuitOpen,
  unavailable: Unavailable,
};

/** The class an answer with `code` is thrown as; {@link BackplaneAPIError} for a code the contract does not list. */
export function errorClassOf(code: string): ErrorClass {
  return Object.hasOwn(CLASS_OF_CODE, code) ? CLASS_OF_CODE[code as ContractErrorCode] : BackplaneAPIError;
}

/**
 * A gated tool call's approval is still pending and the caller asked not to wait (or waited its
 * timeout out): `answer` is the dispatch's `awaiting_approval` answer. Dispatching the same call
 * later finds the same request.
 */
export class AwaitingApproval extends Error {
  readonly answer: Record<string, unknown>;
  readonly approvalId: string;

  constructor(answer: Record<string, unknown>) {
    super(`tool call ${String(answer.idempotency_key)} awaits approval ${String(answer.approval_id)}`);
    this.name = "AwaitingApproval";
    this.answer = answer;
    this.approvalId = String(answer.approval_id);
  }
}

/**
 * Throw inside the function given to `TaskSession.callTool` when the tool answered with a refusal
 * that should be recorded as the call's `failed` outcome (so no later attempt repeats it). Any
 * other error records nothing: the call stays in flight.
 */
export class ToolCallFailed extends Error {
  readonly result: Record<string, unknown>;

  constructor(result: Record<string, unknown>, message?: string) {
    super(message ?? `tool call failed: ${JSON.stringify(result)}`);
    this.name = "ToolCallFailed";
    this.result = result;
  }
}

/** A `toolCall` block that had to make the call ended without an outcome. */
export class ToolOutcomeMissing extends Error {
  override name = "ToolOutcomeMissing";
}

/**
 * A request that got no answer after its last attempt (refused connection, reset, timeout): it
 * may or may not have been applied, and repeating the same call later is safe for the same
 * reasons as the automatic retries. `cause` is what fetch threw.
 */
export class TransportError extends Error {
  readonly method: string;
  readonly url: string;
  readonly attempts: number;

  constructor(method: string, url: string, attempts: number, cause: unknown) {
    super(`${method} ${url}: no answer after ${attempts} attempt(s): ${describe(cause)}`, { cause });
    this.name = "TransportError";
    this.method = method;
    this.url = url;
    this.attempts = attempts;
  }
}

function describe(cause: unknown): string {
  if (cause instanceof Error) {
    const inner = cause.cause instanceof Error ? ` (${cause.cause.message})` : "";
    return `${cause.message}${inner}`;
  }
  return String(cause);
}

/** `Retry-After` in seconds (the contract sends delta-seconds, never a date), or null. */
export function retryAfterOf(headers: Headers): number | null {
  const raw = headers.get("Retry-After");
  if (raw === null || raw.trim() === "") return null;
  const value = Number(raw);
  return Number.isFinite(value) && value >= 0 ? value : null;
}
