/**
 * What a model call used and cost, in the shape an `LLMCalled` event records it.
 *
 * The `usage` keys mirror OpenTelemetry GenAI's `gen_ai.usage.*` attributes, flattened; every key
 * is optional and counts tokens as a non-negative integer. Totals *include* their parts:
 * `cache_read_input_tokens + cache_creation_input_tokens <= input_tokens` and
 * `reasoning_output_tokens <= output_tokens` (the server refuses anything else). Providers
 * disagree on this, and the adapters here are the one place the rule is applied:
 *
 * - {@link usageFromOpenAI} (Chat Completions and Responses): OpenAI's prompt/input tokens
 *   already include the cached ones and its completion/output tokens the reasoning ones, so the
 *   totals are taken as they are and the details become the parts.
 * - {@link usageFromAnthropic} (Messages): Anthropic's `input_tokens` *excludes* the tokens read
 *   from and written to the cache, so ours is the sum of the three. No reasoning count.
 *
 * A provider-reported price goes beside the usage as `cost` ({@link modelCost}); without one the
 * server prices the call from its price table.
 */

export const USAGE_KEYS = ["input_tokens", "output_tokens", "cache_read_input_tokens", "cache_creation_input_tokens",
  "reasoning_output_tokens"] as const;

/** The `usage` of an `LLMCalled`. */
export type Usage = Partial<Record<(typeof USAGE_KEYS)[number], number>>;

/** A price the provider reported for the call: `{"amount": "0.00042", "currency": "USD"}`. */
export interface Cost {
  amount: string;
  currency: string;
}

/** What a model function given to `TaskSession.modelCall` returns. */
export interface ModelAnswer {
  output: unknown;
  usage?: Usage;
  cost?: Cost;
}

type Source = Record<string, unknown>;

/** The usage object of a response; a response without a `usage` field is taken to be one. */
function usageOf(response: unknown): Source | null {
  if (response === null || response === undefined) return null;
  if (typeof response !== "object") throw new TypeError(`a provider's answer is an object, not ${typeof response}`);
  const source = response as Source;
  if (!("usage" in source)) return source;
  const usage = source.usage;
  return usage === null || usage === undefined ? null : (usage as Source);
}

/** The token count at `path`, null when any step of the path is missing or null. */
function count(source: Source, provider: string, ...path: string[]): number | null {
  let value: unknown = source;
  for (const name of path) {
    if (value === null || value === undefined || typeof value !== "object") return null;
    value = (value as Source)[name];
  }
  if (value === null || value === undefined) return null;
  if (typeof value !== "number" || !Number.isInteger(value) || value < 0) {
    throw new RangeError(`${provider} usage ${path.join(".")} is ${JSON.stringify(value)}, not a token count`);
  }
  return value;
}

function present(counts: Record<string, number | null>): Usage {
  return Object.fromEntries(Object.entries(counts).filter(([, value]) => value !== null)) as Usage;
}

/**
 * Our usage from an OpenAI Chat Completions or Responses answer (or its `usage`): the keys the
 * answer reports, zeros included; `{}` when it reports none. Totals are kept as reported and
 * the details recorded as parts, never added on; `total_tokens` is left out.
 */
export function usageFromOpenAI(response: unknown): Usage {
  const usage = usageOf(response);
  if (usage === null) return {};
  const p = "OpenAI";
  return present({
    input_tokens: count(usage, p, "input_tokens") ?? count(usage, p, "prompt_tokens"),
    output_tokens: count(usage, p, "output_tokens") ?? count(usage, p, "completion_tokens"),
    cache_read_input_tokens: count(usage, p, "input_tokens_details", "cached_tokens")
      ?? count(usage, p, "prompt_tokens_details", "cached_tokens"),
    reasoning_output_tokens: count(usage, p, "output_tokens_details", "reasoning_tokens")
      ?? count(usage, p, "completion_tokens_details", "reasoning_tokens"),
  });
}

/**
 * Our usage from an Anthropic Messages answer (or its `usage`): the keys the answer reports,
 * zeros included; `{}` when it reports none. Anthropic's `input_tokens` excludes the cache
 * counts, so ours is the three added up; without `input_tokens` (a streamed `message_delta`)
 * the total is unknown and left out.
 */
export function usageFromAnthropic(response: unknown): Usage {
  const usage = usageOf(response);
  if (usage === null) return {};
  const p = "Anthropic";
  const uncached = count(usage, p, "input_tokens");
  const cacheRead = count(usage, p, "cache_read_input_tokens");
  const cacheCreation = count(usage, p, "cache_creation_input_tokens");
  return present({
    input_tokens: uncached === null ? null : uncached + (cacheRead ?? 0) + (cacheCreation ?? 0),
    output_tokens: count(usage, p, "output_tokens"),
    cache_read_input_tokens: cacheRead,
    cache_creation_input_tokens: cacheCreation,
  });
}

const DECIMAL = /^([+-]?)(\d*)(?:\.(\d*))?(?:[eE]([+-]?\d+))?$/;

/**
 * A provider-reported price as `LLMCalled` records it: the amount as a plain decimal string
 * (`"1E-7"` becomes `"0.0000001"`; a number is read as it prints, `0.1` is `"0.1"`) and the ISO
 * 4217 currency. Throws RangeError for a negative, infinite or unreadable amount.
 */
export function modelCost(amount: string | number | bigint, currency = "USD"): Cost {
  if (typeof amount === "number" && !Number.isFinite(amount)) throw new RangeError(`cost amount ${amount} is not finite`);
  if (typeof amount !== "string" && typeof amount !== "number" && typeof amount !== "bigint") {
    throw new RangeError(`cost amount ${String(amount)} is not a number`);
  }
  const text = String(amount).trim();
  const match = DECIMAL.exec(text);
  if (match === null || (match[2] === "" && (match[3] ?? "") === "")) {
    throw new RangeError(`cost amount ${JSON.stringify(amount)} is not a decimal number`);
  }
  const [, sign, whole, fraction = "", exponent = "0"] = match;
  // The value is digits × 10^-scale, and keeps its scale as Python's Decimal does ("1.50").
  const digits = `${whole}${fraction}`.replace(/^0+/, "");
  const scale = fraction.length - Number(exponent);
  if (digits === "") return { amount: scale > 0 ? `0.${"0".repeat(scale)}` : "0", currency }; // "-0" is "0"
  if (sign === "-") throw new RangeError(`cost amount ${JSON.stringify(amount)} must be a finite, non-negative number`);
  let plain: string;
  if (scale <= 0) {
    plain = digits + "0".repeat(-scale);
  } else if (scale >= digits.length) {
    plain = `0.${"0".repeat(scale - digits.length)}${digits}`;
  } else {
    plain = `${digits.slice(0, digits.length - scale)}.${digits.slice(digits.length - scale)}`;
  }
  return { amount: plain, currency };
}
