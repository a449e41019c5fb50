/**
 * RFC 8785 canonical JSON (JCS) and the prompt hash an `LLMCalled` event names its prompt by.
 *
 * JCS is ECMAScript's own JSON made deterministic: numbers as `Number.prototype.toString` writes
 * them (so a `bigint` or an integer beyond 2**53 - 1 is the double it denotes, as the server,
 * PostgreSQL's JSONB and the Python client make of it), strings as `JSON.stringify` escapes them,
 * object keys sorted by UTF-16 code units. The suite holds it to vectors/rfc8785/ and to the
 * product's chains (vectors/product.json), like the server's and the Python client's.
 */
import { createHash } from "node:crypto";

export class CanonicalizationError extends Error {
  override name = "CanonicalizationError";
}

/** The RFC 8785 canonical UTF-8 bytes of `value` (objects, arrays, strings, numbers, booleans, null). */
export function canonicalJson(value: unknown): Uint8Array {
  return Buffer.from(serialize(value, "$"), "utf8");
}

/** Lowercase hex SHA-256 of the prompt's canonical JSON: `LLMCalled`'s `prompt_sha256`. A string
 * prompt hashes as its JSON string (with the quotes). */
export function promptSha256(prompt: unknown): string {
  return createHash("sha256").update(canonicalJson(prompt)).digest("hex");
}

// A lone surrogate has no UTF-8 form: JCS (and the server) refuse it rather than guess.
const LONE_SURROGATE = /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/;

function serialize(value: unknown, where: string): string {
  if (value === null) return "null";
  switch (typeof value) {
    case "boolean":
      return value ? "true" : "false";
    case "number":
      if (!Number.isFinite(value)) throw new CanonicalizationError(`${where}: ${value} has no JSON form`);
      return String(value); // ECMAScript's Number-to-String is JCS's; -0 is written "0"
    case "bigint": {
      const double = Number(value);
      if (!Number.isFinite(double)) throw new CanonicalizationError(`${where}: ${value} is outside the range of a double`);
      return String(double);
    }
    case "string":
      if (LONE_SURROGATE.test(value)) throw new CanonicalizationError(`${where}: a lone surrogate has no UTF-8 form`);
      return JSON.stringify(value);
    case "object":
      break;
    default:
      throw new CanonicalizationError(`${where}: a ${typeof value} has no JSON form`);
  }
  const withJson = value as { toJSON?: () => unknown };
  if (typeof withJson.toJSON === "function") return serialize(withJson.toJSON(), where);
  if (Array.isArray(value)) {
    return `[${value.map((item, index) => serialize(item, `${where}[${index}]`)).join(",")}]`;
  }
  // Sorted by UTF-16 code units, which is what the default string comparison of sort() does.
  // A property whose value is undefined is left out, as JSON.stringify leaves it out of a request.
  const entries = Object.keys(value as object).sort()
    .filter((key) => (value as Record<string, unknown>)[key] !== undefined)
    .map((key) => `${serialize(key, where)}:${serialize((value as Record<string, unknown>)[key], `${where}.${key}`)}`);
  return `{${entries.join(",")}}`;
}
