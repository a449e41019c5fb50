/**
 * When to send a request again, and how long to wait first.
 *
 * A retry is only safe if sending the same request twice cannot do the work twice. The client
 * makes every write it retries safe before the first attempt (docs/sdk-typescript.md has the
 * table): `append`/`appendBatch` give each event an idempotency key, once per call; `createTask`
 * and `fork` pick the new task's id on the client, once; tool calls, sub-agents, heartbeat,
 * release and invoke are keyed by the contract itself. `claim` is the exception: the server
 * cannot tell a repeated claim from a new one, so a retried claim whose answer was lost may
 * lease a second task; the first lease then expires and the stall detector hands it on.
 *
 * This module decides; the client only sends and sleeps.
 */

/** Answers that say "not now" rather than "no": rate limited, unavailable, an open circuit. */
export const RETRY_STATUSES: ReadonlySet<number> = new Set([429, 503]);
/**
 * A `Retry-After` up to this many seconds is waited out in full, even past `maxDelayMs`:
 * retrying earlier would only be refused again. A longer one is capped.
 */
export const HONOURED_RETRY_AFTER = 60;

/** Error codes of requests Node could not even form: they would fail the same way again. */
const NOT_SENDABLE = new Set(["ERR_INVALID_URL", "ERR_INVALID_ARG_TYPE", "ERR_INVALID_ARG_VALUE",
  "UND_ERR_INVALID_ARG", "UND_ERR_NOT_SUPPORTED"]);

export interface RetryOptions {
  /** How often a request is sent in all, the first time included (at least 1). */
  attempts?: number;
  baseDelayMs?: number;
  maxDelayMs?: number;
  jitter?: boolean;
}

/**
 * How often to send a request and how to back off. Between attempts the wait is "full jitter"
 * exponential backoff: uniform in `[0, min(maxDelayMs, baseDelayMs * 2 ** (attempt - 1))]`, so
 * agents that failed together do not all come back in the same instant; without `jitter`, the
 * upper bound itself. A 429 or 503 with `Retry-After` waits that long instead.
 */
export class RetryPolicy {
  readonly attempts: number;
  readonly baseDelayMs: number;
  readonly maxDelayMs: number;
  readonly jitter: boolean;

  constructor({ attempts = 6, baseDelayMs = 200, maxDelayMs = 10_000, jitter = true }: RetryOptions = {}) {
    if (!Number.isInteger(attempts) || attempts < 1) {
      throw new RangeError("attempts counts the first request too: it must be a whole number of at least 1");
    }
    if (!(baseDelayMs >= 0) || !(maxDelayMs >= 0)) throw new RangeError("delays must not be negative");
    this.attempts = attempts;
    this.baseDelayMs = baseDelayMs;
    this.maxDelayMs = maxDelayMs;
    this.jitter = jitter;
    Object.freeze(this);
  }

  /** Send every request once; errors reach the caller at once. */
  static none(): RetryPolicy {
    return new RetryPolicy({ attempts: 1 });
  }

  /** The wait in ms after failed attempt number `attempt` (1-based). */
  backoff(attempt: number): number {
    const ceiling = Math.min(this.maxDelayMs, this.baseDelayMs * 2 ** Math.min(attempt - 1, 62));
    return this.jitter ? Math.random() * ceiling : ceiling;
  }

  /** Ms to wait before sending again after an answer with `status`, or null: the answer is final. */
  delayAfterAnswer(attempt: number, status: number, retryAfter: number | null): number | null {
    if (!RETRY_STATUSES.has(status) || attempt >= this.attempts) return null;
    if (retryAfter === null) return this.backoff(attempt);
    if (retryAfter <= HONOURED_RETRY_AFTER) {
      // A little jitter on top, never below: the server said "not before".
      return retryAfter * 1000 + (this.jitter ? Math.random() * this.baseDelayMs : 0);
    }
    return Math.min(retryAfter * 1000, this.maxDelayMs);
  }

  /**
   * Ms to wait before sending again after no answer came, or null: give up. Refused
   * connections, resets, timeouts and a server that closed the connection are retried; a
   * request that could not be formed (a malformed URL or header) is not.
   */
  delayAfterError(attempt: number, error: unknown): number | null {
    if (attempt >= this.attempts || !sendable(error)) return null;
    return this.backoff(attempt);
  }
}

function sendable(error: unknown): boolean {
  for (let at: unknown = error, depth = 0; at instanceof Error && depth < 4; at = at.cause, depth += 1) {
    const code = (at as { code?: unknown }).code;
    if (typeof code === "string" && NOT_SENDABLE.has(code)) return false;
    if (at.message === "Failed to parse URL" || at.message.startsWith("Invalid URL")) return false;
  }
  return true;
}

export const DEFAULT_RETRY = new RetryPolicy();
