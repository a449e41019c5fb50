"""The offline verifier: ``python -m backplane.integrity.audit verify PATH_OR_S3_URL --public-key KEY``
(and ``check-proof BUNDLE --public-key KEY`` for one event's inclusion proof, ``proof.py``).

It needs no database and no Django settings: it imports the standard library, ``cryptography``,
``backplane.eventlog.canonical`` (rfc8785), the pure hashing of ``backplane.eventlog.chain``,
``backplane.integrity.merkle`` and, for ``s3://`` locations, boto3. Trust comes only from the
public key(s) given on the command line, never from a key found in the export.

Segments are checked in order from 1, stopping at the first problem:

1. the manifest parses, is signed by a trusted key, says it is this segment, chains to the
   previous manifest's SHA-256 and continues the leaf range where the previous one ended;
2. its embedded signed tree head is signed by a trusted key and has the manifest's size and root;
3. the segment file's SHA-256 is the manifest's;
4. line by line: each event's hash, recomputed from its content, is its stored ``hash``; its
   task's chain continues (seq one more than that task's previous event, in this segment or an
   earlier one, and ``prev_hash`` its hash; a task's first event is seq 1 on the genesis hash);
5. the recomputed hashes, as leaves appended to the tree of all earlier segments, give the
   signed root: an edit whose author recomputed the whole chain still fails here;
6. every tool call dispatched under an approval (``ToolCallDispatched`` naming an
   ``approval_id``) follows that approval's ``ApprovalGranted`` in its task's chain, for the same
   step and tool, and its input's canonical SHA-256 is the approved ``argument_sha256``
   (docs/approvals.md). ``--approvals`` lists each such call with its approvers and the hashes of
   its request, grant and dispatch events.

``verify-events FILE`` checks events read from the event log's Kafka stream (backplane/integrity/
stream.py), one JSON object a line: every task's chain, as in step 4; repeats (the stream is at
least once) must equal what was read before.

A successful run prints a summary and exits 0; a problem exits 1 with a message naming the
segment (and line); a usage error (bad key, unreadable location) exits 2.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeGuard

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat, load_pem_public_key

from backplane.eventlog import event_types as et
from backplane.eventlog.canonical import canonical_sha256
from backplane.eventlog.chain import GENESIS_HASH
from backplane.integrity import merkle
from backplane.integrity.audit import manifest as fmt
from backplane.integrity.audit.proof import ProofProblem, check_proof_bundle
from backplane.integrity.audit.storage import Store, open_location
from backplane.integrity.independent_hash import NotCanonicalizable, api_event_hash

_HEX = frozenset("0123456789abcdef")


class VerificationProblem(Exception):
    """The first thing in the export that does not verify; the message names where."""


@dataclass
class Summary:
    location: str
    segments: int = 0
    events: int = 0
    tasks: int = 0
    tree_size: int = 0
    root_hash: str = merkle.EMPTY_ROOT.hex()
    signed_at: str = ""
    notes: list[str] = field(default_factory=list)
    gated: GatedCalls = field(default_factory=lambda: GatedCalls())

    def __str__(self) -> str:
        lines = [
            f"OK {self.location}: {self.segments} segment(s), {self.events} event(s), {self.tasks} task(s)",
            f"tree size {self.tree_size}, root {self.root_hash}, signed at {self.signed_at}",
            self.gated.summary(),
        ]
        return "\n".join(lines + [f"note: {note}" for note in self.notes])


def _is_hex(value: object, length: int) -> bool:
    return isinstance(value, str) and len(value) == length and _HEX.issuperset(value)


def _is_count(value: object) -> TypeGuard[int]:
    return type(value) is int and value >= 0


def _signature_valid(public_key_hex: str, signature_hex: object, message: bytes) -> bool:
    if not _is_hex(signature_hex, 128):
        return False
    try:
        Ed25519PublicKey.from_public_bytes(bytes.fromhex(public_key_hex)).verify(
            bytes.fromhex(str(signature_hex)), message
        )
    except (InvalidSignature, ValueError):
        return False
    return True


@dataclass
class GatedCall:
    """A tool call made under an approval, as its chain proves it."""

    task_id: str
    step: object
    tool: object
    approval_id: str
    argument_sha256: str
    policy: str
    approved_by: list[str]
    requested_hash: str | None
    granted_hash: str
    dispatched_hash: str

    def __str__(self) -> str:
        return (f"gated call: task {self.task_id} step {self.step} {self.tool}: approval {self.approval_id} "
                f"(policy {self.policy}) by {', '.join(self.approved_by) or 'nobody'}; arguments sha256 "
                f"{self.argument_sha256}; events requested {self.requested_hash or '(before this export)'}, "
                f"granted {self.granted_hash}, dispatched {self.dispatched_hash}")


@dataclass
class GatedCalls:
    """Step 6: the approvals granted so far, by task and approval id, and the gated calls checked."""

    requested: dict[tuple[str, str], str] = field(default_factory=dict)
    granted: dict[tuple[str, str], tuple[dict[str, Any], str]] = field(default_factory=dict)
    calls: list[GatedCall] = field(default_factory=list)

    def see(self, event: dict[str, Any], recomputed: str, *, at: str) -> None:
        payload = event.get("payload")
        if not isinstance(payload, dict):
            return
        task_id, approval_id = str(event["task_id"]), payload.get("approval_id")
        if not isinstance(approval_id, str):
            return
        if event.get("type") == et.APPROVAL_REQUESTED:
            self.requested[task_id, approval_id] = recomputed
        elif event.get("type") == et.APPROVAL_GRANTED:
            self.granted[task_id, approval_id] = (payload, recomputed)
        elif event.get("type") == et.TOOL_CALL_DISPATCHED:
            self._check_call(event, payload, recomputed, task_id=task_id, approval_id=approval_id, at=at)

    def _check_call(self, event: dict[str, Any], payload: dict[str, Any], recomputed: str, *, task_id: str,
                    approval_id: str, at: str) -> None:
        where = f"{at}: task {task_id} seq {event['seq']}: the tool call dispatched under approval {approval_id}"
        found = self.granted.get((task_id, approval_id))
        if found is None:
            raise VerificationProblem(f"{where} has no ApprovalGranted before it in its chain")
        grant, granted_hash = found
        if (grant.get("step"), grant.get("tool")) != (payload.get("step"), payload.get("tool")):
            raise VerificationProblem(f"{where} is not the step and tool that were approved")
        try:
            digest = canonical_sha256(payload.get("input"))
        except (TypeError, ValueError) as exc:
            raise VerificationProblem(f"{where}: its input cannot be canonicalised ({exc})") from None
        if digest != grant.get("argument_sha256"):
            raise VerificationProblem(f"{where} was made with arguments whose SHA-256 is {digest}, not the approved "
                                      f"{grant.get('argument_sha256')}")
        approvals = grant.get("approved_by")
        approvers = [str(a.get("by")) for a in approvals if isinstance(a, dict)] if isinstance(approvals, list) else []
        self.calls.append(GatedCall(
            task_id=task_id, step=payload.get("step"), tool=payload.get("tool"), approval_id=approval_id,
            argument_sha256=digest, policy=f"#{grant.get('policy_id')} v{grant.get('policy_version')}",
            approved_by=approvers, requested_hash=self.requested.get((task_id, approval_id)),
            granted_hash=granted_hash, dispatched_hash=recomputed))

    def summary(self) -> str:
        return (f"{len(self.calls)} gated tool call(s), each made after its approval and with the arguments "
                "approved")


@dataclass
class _State:
    """What the segments so far have established."""

    frontier: merkle.CompactRange = field(default_factory=merkle.CompactRange)
    previous_manifest_sha256: str = fmt.FIRST_PREVIOUS_MANIFEST_SHA256
    chains: dict[str, tuple[int, str]] = field(default_factory=dict)  # task id -> (last seq, its hash)
    gated: GatedCalls = field(default_factory=GatedCalls)


def _check_manifest(number: int, raw: bytes, state: _State, trusted: Collection[str]) -> dict[str, Any]:
    where = f"segment {number} ({fmt.manifest_name(number)})"
    try:
        manifest = json.loads(raw)
    except ValueError as exc:
        raise VerificationProblem(f"{where}: the manifest is not valid JSON ({exc})") from None
    if not isinstance(manifest, dict):
        raise VerificationProblem(f"{where}: the manifest is not a JSON object")
    if manifest.get("format") != fmt.FORMAT:
        raise VerificationProblem(f"{where}: unknown manifest format {manifest.get('format')!r}")
    # 1. Signature first: nothing else in the manifest means anything until a trusted key vouches for it.
    signer = manifest.get("public_key")
    if not isinstance(signer, str) or signer not in trusted:
        raise VerificationProblem(f"{where}: the manifest is signed by {signer!r}, which is not a trusted public key")
    if not _signature_valid(signer, manifest.get("signature"), fmt.manifest_message(manifest)):
        raise VerificationProblem(f"{where}: the manifest's signature does not verify")
    if manifest.get("segment") != number:
        raise VerificationProblem(f"{where}: the manifest is that of segment {manifest.get('segment')!r}")
    if manifest.get("previous_manifest_sha256") != state.previous_manifest_sha256:
        raise VerificationProblem(
            f"{where}: previous_manifest_sha256 is {manifest.get('previous_manifest_sha256')!r}, but the previous "
            f"manifest's SHA-256 is {state.previous_manifest_sha256}: the manifest chain is broken"
        )
    first, last, size, events = (manifest.get(k) for k in ("first_leaf", "last_leaf", "tree_size", "events"))
    if not (_is_count(first) and _is_count(last) and _is_count(size) and _is_count(events)):
        raise VerificationProblem(f"{where}: first_leaf, last_leaf, tree_size and events must be counts")
    if first != state.frontier.size or last != size - 1 or size <= first or events != size - first:
        raise VerificationProblem(
            f"{where}: the range [{first}, {last}] (tree size {size}, {events} events) does not continue the "
            f"previous segment, which ended at tree size {state.frontier.size}"
        )
    if manifest.get("segment_file") != fmt.segment_name(number):
        raise VerificationProblem(f"{where}: segment_file is {manifest.get('segment_file')!r}")
    if not _is_hex(manifest.get("segment_sha256"), 64) or not _is_hex(manifest.get("root_hash"), 64):
        raise VerificationProblem(f"{where}: segment_sha256 and root_hash must be 64 lowercase hex digits")
    # 2. The sealer's signed head is what the events must hash to.
    head = manifest.get("signed_tree_head")
    if not isinstance(head, dict):
        raise VerificationProblem(f"{where}: no signed_tree_head")
    if head.get("tree_size") != size or head.get("root_hash") != manifest["root_hash"]:
        raise VerificationProblem(f"{where}: the signed tree head is not the manifest's tree size and root")
    if not isinstance(head.get("public_key"), str) or head["public_key"] not in trusted:
        raise VerificationProblem(f"{where}: the tree head is signed by {head.get('public_key')!r}, not a trusted key")
    signed_at = head.get("signed_at")
    if not isinstance(signed_at, str) or not _signature_valid(
        head["public_key"], head.get("signature"),
        fmt.tree_head_message(tree_size=size, root_hash=manifest["root_hash"], signed_at=signed_at),
    ):
        raise VerificationProblem(f"{where}: the signed tree head's signature does not verify")
    return manifest


def _recomputed_hash(event: object, at: str) -> tuple[str, int, str]:
    """The event's task id, seq and hash recomputed from its content, which must be its stored one."""
    if not isinstance(event, dict):
        raise VerificationProblem(f"{at}: not a JSON object")
    task_id, seq, prev_hash, stored = (event.get(k) for k in ("task_id", "seq", "prev_hash", "hash"))
    if not isinstance(task_id, str) or type(seq) is not int or not isinstance(prev_hash, str):
        raise VerificationProblem(f"{at}: not an event (task_id, seq and prev_hash are required)")
    try:
        recomputed = api_event_hash(event)
    except NotCanonicalizable as exc:
        raise VerificationProblem(f"{at}: task {task_id} seq {seq} cannot be canonicalised ({exc})") from None
    if recomputed != stored:
        raise VerificationProblem(
            f"{at}: task {task_id} seq {seq}: the hash recomputed from its content is {recomputed}, "
            f"not the stored {stored!r}"
        )
    return task_id, seq, recomputed


def check_chain_link(event: object, chains: dict[str, tuple[int, str]], *, at: str) -> str:
    """Check one event (the API's form) as the next link of its task's chain in ``chains`` (task
    id -> last seq and its hash; a task's first event is seq 1 on the genesis hash), record it
    there and return its recomputed hash. Raises ``VerificationProblem`` naming ``at``."""
    task_id, seq, recomputed = _recomputed_hash(event, at)
    assert isinstance(event, dict)
    last_seq, last_hash = chains.get(task_id, (0, GENESIS_HASH))
    if seq != last_seq + 1:
        raise VerificationProblem(f"{at}: task {task_id} has seq {seq} where seq {last_seq + 1} was expected")
    if event["prev_hash"] != last_hash:
        raise VerificationProblem(
            f"{at}: task {task_id} seq {seq}: prev_hash does not link to "
            + (f"seq {last_seq}'s hash" if last_seq else "the genesis hash")
        )
    chains[task_id] = (seq, recomputed)
    return recomputed


@dataclass
class EventsSummary:
    source: str
    events: int = 0
    tasks: int = 0
    repeats: int = 0
    gated: GatedCalls = field(default_factory=lambda: GatedCalls())

    def __str__(self) -> str:
        return (f"OK {self.source}: {self.events} event(s) of {self.tasks} task(s), each task's chain whole from "
                f"seq 1; {self.repeats} repeat(s) of an event already read, dropped\n{self.gated.summary()}")


def verify_event_lines(lines: Iterable[bytes], *, source: str) -> EventsSummary:
    """Check events read from a stream (the event log's Kafka topics, one event per line as the
    API renders it): every task's chain, from seq 1, in the order its events come. A stream
    delivers at least once: an event read again must be exactly the one read before, and is
    then dropped. The signed tree heads are not in a stream; ``verify`` checks an export's."""
    chains: dict[str, tuple[int, str]] = {}
    seen: dict[tuple[str, int], str] = {}
    summary = EventsSummary(source=source)
    for line_number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        at = f"{source} line {line_number}"
        try:
            event = json.loads(line)
        except ValueError as exc:
            raise VerificationProblem(f"{at}: not valid JSON ({exc})") from None
        task_id, seq, recomputed = _recomputed_hash(event, at)
        if (task_id, seq) in seen:
            if seen[(task_id, seq)] != recomputed:
                raise VerificationProblem(f"{at}: task {task_id} seq {seq} was read before with another content")
            summary.repeats += 1
            continue
        seen[(task_id, seq)] = check_chain_link(event, chains, at=at)
        summary.gated.see(event, seen[(task_id, seq)], at=at)
        summary.events += 1
    summary.tasks = len(chains)
    return summary


def _check_events(number: int, data: bytes, manifest: dict[str, Any], state: _State) -> int:
    where = f"segment {number} ({fmt.segment_name(number)})"
    if data and not data.endswith(b"\n"):
        raise VerificationProblem(f"{where}: the file does not end with a newline (truncated?)")
    lines = data.split(b"\n")[:-1] if data else []
    for line_number, line in enumerate(lines, start=1):
        at = f"{where} line {line_number}"
        try:
            event = json.loads(line)
        except ValueError as exc:
            raise VerificationProblem(f"{at}: not valid JSON ({exc})") from None
        recomputed = check_chain_link(event, state.chains, at=at)
        state.gated.see(event, recomputed, at=at)
        # The leaf is built from the recomputed hash, never the stored one.
        state.frontier.append(merkle.event_leaf_hash(recomputed))
    if len(lines) != manifest["events"]:
        raise VerificationProblem(
            f"{where}: {len(lines)} event line(s), but the manifest's range holds {manifest['events']}"
        )
    # 5. Everything up to here chains; only the signed root shows a recomputed history.
    if state.frontier.root().hex() != manifest["root_hash"]:
        raise VerificationProblem(
            f"{where}: the events' recomputed hashes do not give the signed tree head's root at tree size "
            f"{manifest['tree_size']}: events were changed after they were sealed"
        )
    return len(lines)


def verify_export(store: Store, *, public_keys: Collection[str]) -> Summary:
    """Check every segment at ``store`` against the trusted Ed25519 keys (hex). Raises
    ``VerificationProblem`` at the first problem; ``OSError`` if the location cannot be read."""
    summary = Summary(location=store.url)
    names = store.names()
    numbers = sorted(n for n in map(fmt.manifest_number, names) if n is not None)
    if not numbers:
        raise VerificationProblem(f"no audit segment manifests at {store.url}")
    for expected, number in enumerate(numbers, start=1):
        if number != expected:
            raise VerificationProblem(f"segment {expected} is missing: there is no {fmt.manifest_name(expected)}")
    state = _State()
    for number in numbers:
        raw = store.read(fmt.manifest_name(number))
        if raw is None:
            raise VerificationProblem(f"segment {number}: {fmt.manifest_name(number)} disappeared while reading")
        manifest = _check_manifest(number, raw, state, public_keys)
        # 3. The file must be byte for byte what the signed manifest describes.
        data = store.read(fmt.segment_name(number))
        if data is None:
            raise VerificationProblem(f"segment {number}: {fmt.segment_name(number)} is missing")
        actual = hashlib.sha256(data).hexdigest()
        if actual != manifest["segment_sha256"]:
            raise VerificationProblem(
                f"segment {number} ({fmt.segment_name(number)}): its SHA-256 is {actual}, "
                f"the manifest says {manifest['segment_sha256']}: the file was changed"
            )
        summary.events += _check_events(number, data, manifest, state)
        state.previous_manifest_sha256 = hashlib.sha256(raw).hexdigest()
        summary.segments += 1
        summary.signed_at = manifest["signed_tree_head"]["signed_at"]
    summary.tasks = len(state.chains)
    summary.gated = state.gated
    summary.tree_size = state.frontier.size
    summary.root_hash = state.frontier.root().hex()
    unfinished = [n for n in map(fmt.segment_number, names) if n is not None and n > numbers[-1]]
    if unfinished:
        summary.notes.append(
            f"{', '.join(map(fmt.segment_name, unfinished))} has no manifest yet (an export in progress or "
            "interrupted); not verified"
        )
    summary.notes.append(
        "an export can only be checked as far as it goes: compare the tree size and root with the latest "
        "signed tree head (GET /api/v1/seals/latest/) to see that nothing was cut off the end"
    )
    return summary


# --- the command line ----------------------------------------------------------------------------


def parse_public_key(value: str) -> str:
    """64 hex digits, or a file holding them or a PEM Ed25519 public key; returns lowercase hex."""
    text = value.strip()
    if not _is_hex(text.lower(), 64):
        path = Path(value)
        if not path.is_file():
            raise ValueError(f"{value!r} is neither 64 hex digits nor a readable key file")
        text = path.read_text().strip()
        if text.startswith("-----BEGIN"):
            key = load_pem_public_key(text.encode())
            if not isinstance(key, Ed25519PublicKey):
                raise ValueError(f"{value}: not an Ed25519 public key")
            return key.public_bytes(Encoding.Raw, PublicFormat.Raw).hex()
    text = text.lower()
    if not _is_hex(text, 64):
        raise ValueError(f"{value!r}: an Ed25519 public key is 64 hex digits (32 bytes)")
    Ed25519PublicKey.from_public_bytes(bytes.fromhex(text))
    return text


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m backplane.integrity.audit", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    verify = commands.add_parser("verify", help="verify an audit export with no database")
    verify.add_argument("location", help="a directory, file:// URL or s3://bucket/prefix")
    verify.add_argument(
        "--public-key", action="append", required=True, metavar="HEX_OR_FILE",
        help="a trusted Ed25519 public key (64 hex digits, or a file with them or a PEM key); repeat for old keys",
    )
    verify.add_argument("--approvals", action="store_true",
                        help="list each gated tool call with its approval and the hashes of its events")
    verify.add_argument(
        "--endpoint-url", default=None,
        help="S3-compatible endpoint (default: AWS, or the AWS_ENDPOINT_URL environment variable)",
    )
    events = commands.add_parser("verify-events", help="verify events read from the event log's Kafka stream")
    events.add_argument("path", help="a file of events, one JSON object a line (- for standard input)")
    events.add_argument("--approvals", action="store_true",
                        help="list each gated tool call with its approval and the hashes of its events")
    check = commands.add_parser("check-proof", help="check one event's inclusion-proof bundle (from the dashboard)")
    check.add_argument("bundle", help="the downloaded JSON file")
    check.add_argument("--public-key", action="append", required=True, metavar="HEX_OR_FILE",
                       help="a trusted Ed25519 public key; repeat for old keys")
    return parser


def check_proof_main(args: argparse.Namespace) -> int:
    try:
        keys = {parse_public_key(value) for value in args.public_key}
        bundle = json.loads(Path(args.bundle).read_text())
    except (ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        print(check_proof_bundle(bundle, public_keys=keys))
    except ProofProblem as exc:
        print(f"FAILED {args.bundle}: {exc}", file=sys.stderr)
        return 1
    return 0


def verify_events_main(args: argparse.Namespace) -> int:
    try:
        data = sys.stdin.buffer.read() if args.path == "-" else Path(args.path).read_bytes()
    except OSError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    source = "standard input" if args.path == "-" else args.path
    try:
        summary = verify_event_lines(data.split(b"\n"), source=source)
    except VerificationProblem as exc:
        print(f"FAILED {exc}", file=sys.stderr)
        return 1
    print(summary)
    if args.approvals:
        print("\n".join(map(str, summary.gated.calls)))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "check-proof":
        return check_proof_main(args)
    if args.command == "verify-events":
        return verify_events_main(args)
    try:
        keys = {parse_public_key(value) for value in args.public_key}
        store = open_location(args.location, endpoint_url=args.endpoint_url)
    except (ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        summary = verify_export(store, public_keys=keys)
    except VerificationProblem as exc:
        print(f"FAILED {store.url}: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"error: cannot read {store.url}: {exc}", file=sys.stderr)
        return 2
    print(summary)
    if args.approvals:
        print("\n".join(map(str, summary.gated.calls)))
    return 0
