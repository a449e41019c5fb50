/**
 * Checks of what the backplane gives out, with node:crypto alone (docs/api.md, "Integrity"):
 * an event's hash, a task's hash chain, RFC 6962 / RFC 9162 inclusion and consistency proofs,
 * a signed tree head, and the inclusion-proof bundle the dashboard's *Download proof* gives.
 *
 * Every hash is lowercase hex, as the API spells it, in and out: a leaf or node hash is 64 hex
 * digits; the Merkle hashers take any even-length hex (RFC 6962's children need not be 32 bytes).
 * The verifiers answer false for anything malformed (a hash that is not 64 lowercase hex digits,
 * a size that is not a safe non-negative integer) rather than throw: a proof that cannot be read
 * proves nothing. The suite holds this module to vectors/ (rfc6962.json, rfc6962_probes.json,
 * product.json, merkle.json), as the server's, the Python verifier's and the Go verifier's are.
 */
import { createHash, createPublicKey, verify as verifySignature } from "node:crypto";
import { CanonicalizationError, canonicalJson } from "./canonical.js";

/** The first event's `prev_hash`. */
export const GENESIS_PREV_HASH = "0".repeat(64);
/** The root of the empty tree: SHA-256 of nothing. */
export const EMPTY_ROOT = createHash("sha256").digest("hex");
/** The `format` of an inclusion-proof bundle (backplane/integrity/audit/proof.py). */
export const PROOF_BUNDLE_FORMAT = "backplane-inclusion-proof/1";

const HASH = /^[0-9a-f]{64}$/;
const HEX = /^(?:[0-9a-f]{2})*$/;
const SIGNATURE = /^[0-9a-f]{128}$/;
// An Ed25519 SubjectPublicKeyInfo (RFC 8410) is this DER header and the 32 raw key bytes.
const ED25519_SPKI_PREFIX = Buffer.from("302a300506032b6570032100", "hex");
const LEAF_PREFIX = Buffer.of(0x00);
const NODE_PREFIX = Buffer.of(0x01);

const isHash = (value: unknown): value is string => typeof value === "string" && HASH.test(value);
const isSize = (value: unknown): value is number => typeof value === "number" && Number.isSafeInteger(value) && value >= 0;

function hexBytes(text: string, what: string): Buffer {
  if (typeof text !== "string" || !HEX.test(text)) throw new TypeError(`${what} must be lowercase hex of whole bytes`);
  return Buffer.from(text, "hex");
}

function sha256(...parts: Uint8Array[]): string {
  const hash = createHash("sha256");
  for (const part of parts) hash.update(part);
  return hash.digest("hex");
}

// --- events and chains -------------------------------------------------------------------------

/** The fields of an event its hash covers; `hash` and `position` are left out of it. */
export interface HashedEvent {
  seq: number;
  prev_hash: string;
  hash: string;
  [field: string]: unknown;
}

/** SHA-256 (lowercase hex) of the RFC 8785 canonical JSON of the event as the API shows it,
 * without `hash` and `position`. Throws {@link CanonicalizationError} for a value with no JSON form. */
export function eventHash(event: object): string {
  const { hash: _hash, position: _position, ...hashed } = event as Record<string, unknown>;
  return sha256(canonicalJson(hashed));
}

export interface ChainVerdict {
  valid: boolean;
  /** The seq of the first event that breaks the chain, or null when it holds. */
  firstInvalidSeq: number | null;
}

/**
 * A task's events, in order from seq 1, against the chain rule: seq 1 follows 64 zeros, each
 * event's seq is one more than the last, its `prev_hash` the last event's `hash`, and its `hash`
 * what its content hashes to. A removed event shows as the next one's wrong seq (or prev_hash);
 * an event whose hash was recomputed after a change, as the next one's prev_hash.
 */
export function verifyChain(events: Iterable<HashedEvent>): ChainVerdict {
  let previous = GENESIS_PREV_HASH;
  let expectedSeq = 1;
  for (const event of events) {
    let recomputed: string | null;
    try {
      recomputed = eventHash(event);
    } catch (error) {
      if (!(error instanceof CanonicalizationError)) throw error;
      recomputed = null; // no canonical form: no hash can be its hash
    }
    if (event.seq !== expectedSeq || event.prev_hash !== previous || recomputed !== event.hash) {
      return { valid: false, firstInvalidSeq: typeof event.seq === "number" ? event.seq : expectedSeq };
    }
    previous = event.hash;
    expectedSeq += 1;
  }
  return { valid: true, firstInvalidSeq: null };
}

// --- RFC 6962 hashing ------------------------------------------------------------------------

/** SHA-256(0x00 ‖ data): the leaf hash of `dataHex`'s bytes. */
export function merkleLeafHash(dataHex: string): string {
  return sha256(LEAF_PREFIX, hexBytes(dataHex, "leaf data"));
}

/** SHA-256(0x01 ‖ left ‖ right), the children taken as raw bytes whatever their length. */
export function merkleNodeHash(leftHex: string, rightHex: string): string {
  return sha256(NODE_PREFIX, hexBytes(leftHex, "left child"), hexBytes(rightHex, "right child"));
}

/** An event's leaf hash: its hex `hash` as 32 raw bytes, hashed as a leaf. */
export function eventLeafHash(hexHash: string): string {
  if (!isHash(hexHash)) throw new TypeError(`an event hash is 64 lowercase hex digits, not ${JSON.stringify(hexHash)}`);
  return merkleLeafHash(hexHash);
}

/**
 * MTH (RFC 6962 §2.1) over the leaf hashes, in order. Pairing level by level and carrying an
 * unpaired last node up unchanged builds exactly the tree that splits at the largest power of
 * two below n: every left part of a split is perfect, so only the right border has an odd node.
 */
export function merkleRoot(leafHashes: readonly string[]): string {
  let level = leafHashes.map((leaf, index) => {
    if (!isHash(leaf)) throw new TypeError(`leaf hash ${index} is not 64 lowercase hex digits`);
    return leaf;
  });
  if (level.length === 0) return EMPTY_ROOT;
  while (level.length > 1) {
    const upper: string[] = [];
    for (let i = 0; i + 1 < level.length; i += 2) upper.push(merkleNodeHash(level[i], level[i + 1]));
    if (level.length % 2 === 1) upper.push(level[level.length - 1]);
    level = upper;
  }
  return level[0];
}

// --- RFC 9162 verification ---------------------------------------------------------------------
// Sizes are BigInts inside: the shifts below would wrap at 2**31 on JavaScript numbers.

const isOdd = (n: bigint) => (n & 1n) === 1n;

/**
 * RFC 9162 §2.1.3.2: does `proof` (hashes from the leaf upward) show `leafHash` at `index` (from
 * 0) in the tree of `treeSize` leaves whose root is `root`?
 */
export function verifyInclusion(leafHash: string, index: number, treeSize: number, proof: readonly string[],
  root: string): boolean {
  if (!isSize(index) || !isSize(treeSize) || index >= treeSize) return false; // 1. leaf_index < tree_size
  if (!isHash(leafHash) || !isHash(root) || !Array.isArray(proof) || !proof.every(isHash)) return false;
  let fn = BigInt(index); // 2.
  let sn = BigInt(treeSize) - 1n;
  let r = leafHash; // 3.
  for (const p of proof) { // 4.
    if (sn === 0n) return false; // a. a path longer than the tree is high
    if (isOdd(fn) || fn === sn) { // b. p is a left sibling
      r = merkleNodeHash(p, r);
      if (!isOdd(fn)) { // the last node of its level: climb to where it is a right child again
        while (!isOdd(fn) && fn !== 0n) {
          fn >>= 1n;
          sn >>= 1n;
        }
      }
    } else {
      r = merkleNodeHash(r, p); // p is a right sibling
    }
    fn >>= 1n; // c.
    sn >>= 1n;
  }
  return sn === 0n && r === root; // 5. a path shorter than the tree is high leaves sn above 0
}

/**
 * RFC 9162 §2.1.4.2: does `proof` show the tree of `first` leaves with root `firstRoot` is a prefix
 * of the tree of `second` leaves with root `secondRoot`? Requires 0 < first ≤ second: a proof
 * from the empty tree proves nothing and is refused, even to another empty tree (as
 * transparency-dev/merkle refuses it). For first == second the proof is empty and the roots are
 * compared as they are, whatever their length; the caller checks them against signed heads.
 */
export function verifyConsistency(first: number, second: number, firstRoot: string, secondRoot: string,
  proof: readonly string[]): boolean {
  if (!isSize(first) || !isSize(second) || first === 0 || first > second || !Array.isArray(proof)) return false;
  if (typeof firstRoot !== "string" || typeof secondRoot !== "string" || !HEX.test(firstRoot) || !HEX.test(secondRoot)) {
    return false;
  }
  if (first === second) return proof.length === 0 && firstRoot === secondRoot;
  if (!isHash(firstRoot) || !isHash(secondRoot) || !proof.every(isHash)) return false;
  if (proof.length === 0) return false; // 1.
  const path = [...proof];
  // 2. For a power of two the old tree is a node of the new one: its root starts the path.
  if ((BigInt(first) & (BigInt(first) - 1n)) === 0n) path.unshift(firstRoot);
  let fn = BigInt(first) - 1n; // 3.
  let sn = BigInt(second) - 1n;
  while (isOdd(fn)) { // 4.
    fn >>= 1n;
    sn >>= 1n;
  }
  let fr = path[0]; // 5.
  let sr = path[0];
  for (const c of path.slice(1)) { // 6.
    if (sn === 0n) return false; // a.
    if (isOdd(fn) || fn === sn) { // b.
      fr = merkleNodeHash(c, fr);
      sr = merkleNodeHash(c, sr);
      if (!isOdd(fn)) {
        while (!isOdd(fn) && fn !== 0n) {
          fn >>= 1n;
          sn >>= 1n;
        }
      }
    } else {
      sr = merkleNodeHash(sr, c);
    }
    fn >>= 1n; // c.
    sn >>= 1n;
  }
  return fr === firstRoot && sr === secondRoot && sn === 0n; // 7.
}

// --- signed tree heads -------------------------------------------------------------------------

/** A signed tree head as `GET /seals/latest/` gives it (`public_key` is the server's word, not trust). */
export interface TreeHead {
  tree_size: number;
  root_hash: string;
  signed_at: string;
  signature: string;
  public_key?: string;
}

/** What a tree head's signature covers: RFC 8785 of exactly `{tree_size, root_hash, signed_at}`. */
export function treeHeadMessage(head: Pick<TreeHead, "tree_size" | "root_hash" | "signed_at">): Uint8Array {
  return canonicalJson({ tree_size: head.tree_size, root_hash: head.root_hash, signed_at: head.signed_at });
}

/**
 * Whether `head.signature` is the Ed25519 signature by `publicKeyHex` (32 raw bytes as lowercase
 * hex, a key you trust) of {@link treeHeadMessage}. A malformed key, signature or head is false.
 */
export function verifyTreeHead(head: TreeHead, publicKeyHex: string): boolean {
  if (head === null || typeof head !== "object" || !isHash(publicKeyHex)) return false;
  if (typeof head.signature !== "string" || !SIGNATURE.test(head.signature)) return false;
  let message: Uint8Array;
  try {
    message = treeHeadMessage(head);
  } catch (error) {
    if (error instanceof CanonicalizationError) return false;
    throw error;
  }
  const key = createPublicKey({ key: Buffer.concat([ED25519_SPKI_PREFIX, Buffer.from(publicKeyHex, "hex")]),
    format: "der", type: "spki" });
  return verifySignature(null, message, key, Buffer.from(head.signature, "hex"));
}

// --- inclusion-proof bundles -------------------------------------------------------------------

/** The file the dashboard's *Download proof* gives (and {@link AgentClient.proofBundle} builds). */
export interface ProofBundle {
  format: typeof PROOF_BUNDLE_FORMAT;
  event: HashedEvent;
  leaf_index: number;
  tree_size: number;
  audit_path: string[];
  tree_head: TreeHead;
}

/** The check of a bundle that failed: `format` (not a bundle), `event_hash` (the content does
 * not hash to its `hash`), `audit_path` (no path from that leaf to the head's root) or `signature`. */
export type ProofBundleStep = "format" | "event_hash" | "audit_path" | "signature";

/** A proof bundle that does not check out; `step` names the check that failed. */
export class ProofBundleInvalid extends Error {
  override name = "ProofBundleInvalid";
  readonly step: ProofBundleStep;

  constructor(step: ProofBundleStep, message: string) {
    super(message);
    this.step = step;
  }
}

/** What a bundle that checks out proves, and which trusted key signed its head. */
export interface ProofBundleChecked {
  taskId: string;
  seq: number;
  eventHash: string;
  leafIndex: number;
  treeSize: number;
  signedAt: string;
  publicKey: string;
}

/**
 * The offline check of an inclusion-proof bundle, as backplane/integrity/audit/proof.py makes it
 * (`python -m backplane.integrity.audit check-proof`), in its order:
 *
 * 1. the event's hash, recomputed from its content, is its `hash`;
 * 2. that hash as a leaf, with the audit path, leads to the root of the head (of the same size);
 * 3. the head is signed by one of `publicKeys` (lowercase hex; never the bundle's own `public_key`).
 *
 * Throws {@link ProofBundleInvalid} naming the first check that fails.
 */
export function checkProofBundle(bundle: unknown, publicKeys: Iterable<string>): ProofBundleChecked {
  if (bundle === null || typeof bundle !== "object" || (bundle as { format?: unknown }).format !== PROOF_BUNDLE_FORMAT) {
    throw new ProofBundleInvalid("format", `not a ${PROOF_BUNDLE_FORMAT} file`);
  }
  const { event, tree_head: head, leaf_index: index, tree_size: size, audit_path: path } = bundle as Record<string, unknown>;
  for (const [name, value] of Object.entries({ event, tree_head: head, leaf_index: index, tree_size: size, audit_path: path })) {
    if (value === undefined) throw new ProofBundleInvalid("format", `the bundle lacks ${name}`);
  }
  if (event === null || typeof event !== "object" || Array.isArray(event)) {
    throw new ProofBundleInvalid("format", "the bundle's event is not an object");
  }
  if (head === null || typeof head !== "object" || Array.isArray(head)) {
    throw new ProofBundleInvalid("format", "the bundle lacks a tree_head object");
  }
  const recorded = (event as { hash?: unknown }).hash;
  let recomputed: string;
  try {
    recomputed = eventHash(event);
  } catch (error) {
    if (!(error instanceof CanonicalizationError)) throw error;
    throw new ProofBundleInvalid("event_hash", `the event cannot be canonicalised: ${error.message}`);
  }
  if (recomputed !== recorded) {
    throw new ProofBundleInvalid("event_hash",
      `the event's content hashes to ${recomputed}, not its recorded hash ${String(recorded)}`);
  }
  const treeHead = head as TreeHead;
  if (size !== treeHead.tree_size) {
    throw new ProofBundleInvalid("audit_path",
      `the proof is for tree size ${String(size)} but the head is of size ${String(treeHead.tree_size)}`);
  }
  if (!verifyInclusion(eventLeafHash(recomputed), index as number, size as number, path as string[], treeHead.root_hash)) {
    throw new ProofBundleInvalid("audit_path",
      `the audit path does not lead from leaf ${String(index)} to the root ${String(treeHead.root_hash)}`);
  }
  const signer = [...publicKeys].find((key) => verifyTreeHead(treeHead, key));
  if (signer === undefined) throw new ProofBundleInvalid("signature", "the tree head is not signed by a trusted key");
  const { task_id: taskId, seq } = event as { task_id: string; seq: number };
  return { taskId, seq, eventHash: recomputed, leafIndex: index as number, treeSize: size as number,
    signedAt: treeHead.signed_at, publicKey: signer };
}
