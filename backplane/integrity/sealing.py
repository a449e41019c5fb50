"""The sealer: committed events become leaves of one growing RFC 6962 Merkle tree, and each
run signs the new tree head with Ed25519.

A hash chain per task shows that a row changed, unless whoever changed it recomputed the
rest of the chain. A signed tree head cannot be recomputed without the signing key, so
recomputing every event's hash from its content and rebuilding the root exposes any edit
made after sealing (``seal_verify_against_head``).

Leaves are assigned in the order the sealer sees committed events. An event that commits
late (a lower position whose transaction ran long) is simply found by a later run and gets
a later index; the unique constraint on the event makes sealing it twice impossible.
Only one sealer runs at a time across the cluster (a transaction-level advisory lock).

With the leaves, a run stores the perfect subtrees they complete (``MerkleNode``, every
``MERKLE_TILE_HEIGHT``-th level), so that a proof reads O(log n) stored hashes
(``merkle.inclusion_plan`` / ``consistency_plan``, then ``fold_plan``) instead of every leaf.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import Error as DjangoDatabaseError
from django.db import connection, transaction
from django.db.backends.utils import CursorWrapper
from django.utils import timezone

from backplane.eventlog.canonical import canonical_json
from backplane.eventlog.chain import format_timestamp, stored_row_hash
from backplane.eventlog.errors import InvalidInput, NotFound
from backplane.eventlog.selectors import use_c_timestamp_loader
from backplane.integrity import merkle
from backplane.integrity.models import MERKLE_TILE_HEIGHT, SignedTreeHead

if TYPE_CHECKING:
    from backplane.delivery.models import DeadLetter

logger = logging.getLogger(__name__)

# pg_try_advisory_xact_lock key: "one sealer at a time" (an arbitrary, fixed number).
SEALER_LOCK_KEY = 0x5EA1_0001


# --- the signing key ---------------------------------------------------------------------


@lru_cache(maxsize=1)
def signing_key() -> Ed25519PrivateKey:
    """BACKPLANE_SIGNING_KEY (64 hex digits: the Ed25519 seed). In development and tests a key
    is generated into var/ with a warning; in production its absence stops the sealer."""
    seed_hex = settings.BACKPLANE_SIGNING_KEY
    if not seed_hex:
        if not settings.IS_LOCAL:
            raise ImproperlyConfigured("BACKPLANE_SIGNING_KEY must be set (64 hex digits, an Ed25519 seed)")
        path: Path = settings.VAR_DIR / "signing_key"
        if not path.exists():
            logger.warning("no BACKPLANE_SIGNING_KEY: generating a development signing key in %s", path)
            path.write_text(Ed25519PrivateKey.generate().private_bytes_raw().hex())
            path.chmod(0o600)
        seed_hex = path.read_text().strip()
    try:
        return Ed25519PrivateKey.from_private_bytes(bytes.fromhex(seed_hex))
    except ValueError as exc:
        raise ImproperlyConfigured(f"BACKPLANE_SIGNING_KEY is not a 32-byte hex seed: {exc}") from None


def require_signing_key() -> None:
    """Outside development and tests, raise ImproperlyConfigured unless a usable signing key is
    configured. The web process calls it as it starts (backplane/asgi.py) and a system check
    runs it (``manage.py migrate`` and ``check``), so a deployment without a key stops at once
    rather than running a sealer that fails every few seconds and an export that has nothing."""
    if not settings.IS_LOCAL:
        signing_key()


def public_key_hex(key: Ed25519PrivateKey | None = None) -> str:
    return (key or signing_key()).public_key().public_bytes(Encoding.Raw, PublicFormat.Raw).hex()


def tree_head_message(*, tree_size: int, root_hash: str, signed_at: str) -> bytes:
    """What is signed (docs/api.md): RFC 8785 JSON of exactly these three fields as returned."""
    return canonical_json({"tree_size": tree_size, "root_hash": root_hash, "signed_at": signed_at})


def verify_tree_head(*, tree_size: int, root_hash: str, signed_at: str, signature: str, public_key: str) -> bool:
    try:
        Ed25519PublicKey.from_public_bytes(bytes.fromhex(public_key)).verify(
            bytes.fromhex(signature), tree_head_message(tree_size=tree_size, root_hash=root_hash, signed_at=signed_at)
        )
    except Exception:  # noqa: BLE001 - any malformed or wrong signature is simply "not valid"
        return False
    return True


# --- sealing -------------------------------------------------------------------------------


@dataclass(frozen=True)
class SealStep:
    sealed: int
    tree_size: int
    ran: bool  # False when another sealer held the lock


# The unsealed events a run takes, in one statement (one snapshot), in two parts:
# - part 0, late commits: positions at or below the high-water mark (the largest position
#   sealed) that have no leaf. Only this part needs the anti-join, and only above the floor
#   (see _Horizon): below it nothing can still be unsealed.
# - part 1, new events: every position above the high-water mark, none of them sealed.
_UNSEALED_SQL = """
(SELECT 0 AS part, e.position, e.hash FROM backplane_event e
 WHERE e.position > %(floor)s AND e.position <= %(high)s
   AND NOT EXISTS (SELECT FROM backplane_merkleleaf l WHERE l.event_id = e.position)
 ORDER BY e.position LIMIT %(limit)s)
UNION ALL
(SELECT 1 AS part, e.position, e.hash FROM backplane_event e
 WHERE e.position > %(high)s
 ORDER BY e.position LIMIT %(limit)s)
"""

# Snapshot bounds as integers: xmin, the oldest transaction still running (every older one has
# committed or aborted), and xmax, the first transaction id not yet assigned.
_SNAPSHOT_XMIN = "pg_snapshot_xmin(pg_current_snapshot())::text::bigint"
_SNAPSHOT_XMAX = "pg_snapshot_xmax(pg_current_snapshot())::text::bigint"

# How long a process trusts what it learned before it scans every position again (below).
FULL_SCAN_INTERVAL_SECONDS = 3600.0


@dataclass
class _Horizon:
    """Where late commits can still appear, learned from this process's own sealer runs.

    Without it every run would look for late commits with an anti-join over every position
    sealed so far: O(events) a run. With it, only positions above ``floor``.

    Why positions at or below ``floor`` cannot be unsealed any more. Every writer of events
    holds its task's row lock (``lock_task``, or the task's INSERT) before it inserts, so its
    transaction has an id before it takes a position, and positions come from a sequence
    (the identity column's, cache 1) in the order they are taken. Take a run i that sealed
    up to position ``high_i`` and then saw ``xmax_i`` (every transaction that had an id when
    its candidates were read is below it). An event below ``high_i`` took its position
    before the event at ``high_i`` did, which committed before run i read, so its
    transaction's id is below ``xmax_i``. Once a later *complete* run k (one that sealed
    every committed event up to its own high-water mark; a run whose late part filled the
    batch is not) started when its snapshot's xmin was at least ``xmax_i``, all those
    transactions had ended before run k read: each such event was visible to run k and
    sealed by then, or was rolled back. So ``floor = high_i``.

    Facts are kept per process (a beat task runs in whichever worker process takes it; a
    new process starts from an anti-join over every position) and belong to one history of
    the tree: ``head`` is a signed head they were recorded against, checked at every run
    (a restored or re-created database drops them). ``expires`` forces that full scan again
    now and then, so even an event written against the rule above is sealed, only later.
    """

    head: tuple[int, str]
    floor: int = 0
    pending: list[tuple[int, int]] = field(default_factory=list)  # (xmax_i, high_i), not yet usable
    expires: float = field(default_factory=lambda: time.monotonic() + FULL_SCAN_INTERVAL_SECONDS)


_horizon: _Horizon | None = None
_horizon_lock = threading.Lock()
_PENDING_LIMIT = 1000  # dropping the oldest only keeps the floor lower, which is always safe


def _current_floor() -> int:
    """The floor to use now; forgets facts of another history, or too old."""
    global _horizon
    with _horizon_lock:
        horizon = _horizon
    if horizon is None:
        return 0
    if time.monotonic() > horizon.expires or not SignedTreeHead.objects.filter(
        tree_size=horizon.head[0], root_hash=horizon.head[1]
    ).exists():
        with _horizon_lock:
            if _horizon is horizon:
                _horizon = None
        return 0
    return horizon.floor


def _remember_run(*, head: SignedTreeHead | None, xmin: int, xmax: int, high: int, complete: bool) -> None:
    """Record a committed run: its (xmax, high-water) and, if complete, move the floor."""
    global _horizon
    if head is None:
        return
    with _horizon_lock:
        horizon = _horizon
        if horizon is None:
            horizon = _horizon = _Horizon(head=(head.tree_size, head.root_hash))
        elif head.tree_size >= horizon.head[0]:
            horizon.head = (head.tree_size, head.root_hash)
        horizon.pending.append((xmax, high))
        if complete:
            usable = [h for x, h in horizon.pending if x <= xmin]
            if usable:
                horizon.floor = max(horizon.floor, *usable)
                horizon.pending = [(x, h) for x, h in horizon.pending if x > xmin]
        del horizon.pending[:-_PENDING_LIMIT]


def seal_new_events(*, batch_size: int = 10_000, now: datetime | None = None) -> SealStep:
    """Give the next committed, unsealed events leaf indices and sign the new head. One transaction.

    Late commits (found at or below the high-water mark) come first, then new events in
    position order.
    """
    with transaction.atomic(durable=True):
        with connection.cursor() as cursor:
            # xmin is read before the candidates: an earlier bound is only more cautious.
            cursor.execute(f"SELECT pg_try_advisory_xact_lock(%s), {_SNAPSHOT_XMIN}", [SEALER_LOCK_KEY])
            locked, xmin = cursor.fetchone()
            if not locked:
                return SealStep(sealed=0, tree_size=0, ran=False)
            floor = _current_floor()
            # Read under the lock: leaves change only in sealer runs.
            cursor.execute("SELECT coalesce(max(event_id), 0) FROM backplane_merkleleaf")
            (high,) = cursor.fetchone()
            cursor.execute(_UNSEALED_SQL, {"floor": floor, "high": high, "limit": batch_size})
            candidates = cursor.fetchall()
            # Read after the candidates: a later bound is only more cautious.
            cursor.execute(f"SELECT {_SNAPSHOT_XMAX}")
            (xmax,) = cursor.fetchone()
        late = [(position, event_hash) for part, position, event_hash in candidates if part == 0]
        complete = len(late) < batch_size
        new = [(position, event_hash) for part, position, event_hash in candidates if part == 1]
        unsealed = (late + new)[:batch_size]
        head = SignedTreeHead.objects.order_by("-tree_size").first()
        if not unsealed and head is not None:
            # Nothing to seal, but a sealer of the previous release may have appended leaves
            # without nodes (an upgrade rolling out): proofs compute those from leaves till then.
            merkle_nodes_fill_missing(tree_size=head.tree_size)
            step = SealStep(sealed=0, tree_size=head.tree_size, ran=True)
        else:
            head = _append_leaves_and_sign(head, unsealed, now=now)
            step = SealStep(sealed=len(unsealed), tree_size=head.tree_size, ran=True)
    high = max([high, *(position for position, _ in unsealed)])
    _remember_run(head=head, xmin=xmin, xmax=xmax, high=high, complete=complete)
    return step


def _append_leaves_and_sign(
    head: SignedTreeHead | None, unsealed: list[tuple[int, str]], *, now: datetime | None
) -> SignedTreeHead:
    """Make ``unsealed`` (position, event hash) the next leaves after ``head``, store the perfect
    subtrees they complete, and sign the new head. Runs in the caller's transaction, under the lock."""
    frontier = merkle.CompactRange.from_hex(head.tree_size, head.frontier) if head else merkle.CompactRange()
    if head is not None:
        merkle_nodes_fill_missing(tree_size=head.tree_size)
    start = frontier.size
    lines = []
    leaf_hashes = []
    for offset, (position, event_hash) in enumerate(unsealed):
        leaf_hashes.append(merkle.event_leaf_hash(event_hash))  # also checks the hash is 64 hex digits
        lines.append(f"{start + offset}\t{position}\t{event_hash}\n")
    nodes = frontier.extend(leaf_hashes, level_multiple=MERKLE_TILE_HEIGHT)
    if lines:
        # COPY: the ORM's bulk_create cost more per leaf than hashing it.
        with connection.cursor() as cursor, connection.wrap_database_errors:
            with cursor.copy("COPY backplane_merkleleaf (leaf_index, event_id, event_hash) FROM STDIN") as copy:
                copy.write("".join(lines))
            _copy_nodes(cursor, nodes)
    key = signing_key()
    signed_at = format_timestamp(now or timezone.now())
    root_hash = frontier.root().hex()
    message = tree_head_message(tree_size=frontier.size, root_hash=root_hash, signed_at=signed_at)
    return SignedTreeHead.objects.create(
        tree_size=frontier.size,
        root_hash=root_hash,
        signed_at=signed_at,
        signature=key.sign(message).hex(),
        public_key=public_key_hex(key),
        frontier=frontier.to_hex(),
    )


def _copy_nodes(cursor: CursorWrapper, nodes: list[merkle.PerfectNode]) -> None:
    if nodes:
        # bytea in COPY's text format: \\x and hex digits (the backslash escaped).
        with cursor.copy("COPY backplane_merklenode (level, index, hash) FROM STDIN") as copy:
            copy.write("".join(f"{level}\t{index}\t\\\\x{node.hex()}\n" for level, index, node in nodes))


# Leaves per read while nodes are filled in: memory stays bounded whatever the tree's size.
_FILL_PAGE_SIZE = 50_000


def merkle_nodes_fill_missing(*, tree_size: int) -> int:
    """Store the perfect subtrees (``MerkleNode``) of the first ``tree_size`` leaves that have none
    yet; returns how many were written.

    The sealer writes nodes with the leaves that complete them, in one transaction, so the ones
    missing are always a tail: all of them before migration 0021 (whose backfill this is), or the
    leaves a sealer of the previous release appended while an upgrade rolled out (migrations run
    against a live product). Every sealer run checks, under the lock, in one index probe: no node
    of the lowest stored level past the last one means nothing is missing (each stored node ends
    at a leaf that also completes a node of that level). Otherwise the frontier is restored from
    the stored nodes before the gap and the leaves after it are read in pages, in leaf order.
    """
    with connection.cursor() as cursor:
        cursor.execute("SELECT max(index) FROM backplane_merklenode WHERE level = %s", [MERKLE_TILE_HEIGHT])
        (last,) = cursor.fetchone()
        start = 0 if last is None else (last + 1) << MERKLE_TILE_HEIGHT
        if tree_size - start < 1 << MERKLE_TILE_HEIGHT:
            return 0  # not one node of the lowest stored level could have been completed since
        frontier_plan = [[piece] for piece in merkle.perfect_pieces(0, start)]
        frontier = merkle.CompactRange.from_hashes(start, _fold_from_stored(frontier_plan, tree_size=start))
        written = 0
        while frontier.size < tree_size:
            page_end = min(frontier.size + _FILL_PAGE_SIZE, tree_size)
            cursor.execute(
                "SELECT leaf_index, event_hash FROM backplane_merkleleaf"
                " WHERE leaf_index >= %s AND leaf_index < %s ORDER BY leaf_index",
                [frontier.size, page_end],
            )
            rows = cursor.fetchall()
            if len(rows) != page_end - frontier.size:  # the primary key makes the indices distinct
                raise RuntimeError(f"the leaf table lacks leaves between {frontier.size} and {page_end}")
            nodes = frontier.extend([merkle.event_leaf_hash(h) for _, h in rows], level_multiple=MERKLE_TILE_HEIGHT)
            _copy_nodes(cursor, nodes)
            written += len(nodes)
    if written:
        logger.info("stored %d Merkle node(s) of leaves %d to %d", written, start, tree_size - 1)
    return written


# --- reading: heads and proofs ---------------------------------------------------------------


def _nothing_sealed_yet() -> NotFound:
    return NotFound("nothing has been sealed yet", {})


def _no_head_of_size(tree_size: int) -> NotFound:
    return NotFound(f"no signed tree head of size {tree_size}", {"tree_size": tree_size})


def latest_head() -> SignedTreeHead:
    head = SignedTreeHead.objects.order_by("-tree_size").first()
    if head is None:
        raise _nothing_sealed_yet()
    return head


def head_of_size(tree_size: int) -> SignedTreeHead:
    head = SignedTreeHead.objects.filter(tree_size=tree_size).first()
    if head is None:
        raise _no_head_of_size(tree_size)
    return head


# The stored hashes a proof needs, in one statement: index ranges of stored nodes, and of leaves
# (level 0, whose hash is taken from the event hash in Python, as the sealer takes it). Each range
# is a scan of a primary key; the arrays keep the statement's text the same for every proof.
_STORED_HASHES_SQL = """
SELECT n.level, n.index, n.hash, NULL::text
FROM unnest(%(levels)s::smallint[], %(node_los)s::bigint[], %(node_his)s::bigint[]) AS r(level, lo, hi)
JOIN backplane_merklenode n ON n.level = r.level AND n.index >= r.lo AND n.index < r.hi
UNION ALL
SELECT 0, l.leaf_index, NULL::bytea, l.event_hash
FROM unnest(%(leaf_los)s::bigint[], %(leaf_his)s::bigint[]) AS r(lo, hi)
JOIN backplane_merkleleaf l ON l.leaf_index >= r.lo AND l.leaf_index < r.hi
"""

_LEAVES_SQL = """
SELECT l.leaf_index, l.event_hash
FROM unnest(%(leaf_los)s::bigint[], %(leaf_his)s::bigint[]) AS r(lo, hi)
JOIN backplane_merkleleaf l ON l.leaf_index >= r.lo AND l.leaf_index < r.hi
"""


def _fewer_leaves(tree_size: int) -> NotFound:
    return NotFound(f"the tree has fewer than {tree_size} leaves", {"tree_size": tree_size})


def _stored_hashes(keys: list[merkle.NodeKey], *, tree_size: int) -> dict[merkle.NodeKey, bytes]:
    """The stored hashes ``keys`` name (level 0: leaf hashes), in one query. Ranges a tile apart
    or less are read as one: a few rows more, one index descent less."""
    ranges = merkle.stored_ranges(keys, gap=1 << MERKLE_TILE_HEIGHT)
    node_ranges = [(level, lo, hi) for level, runs in ranges.items() if level for lo, hi in runs]
    leaf_ranges = ranges.get(0, [])
    with connection.cursor() as cursor:
        cursor.execute(_STORED_HASHES_SQL, {
            "levels": [level for level, _, _ in node_ranges], "node_los": [lo for _, lo, _ in node_ranges],
            "node_his": [hi for _, _, hi in node_ranges],
            "leaf_los": [lo for lo, _ in leaf_ranges], "leaf_his": [hi for _, hi in leaf_ranges],
        })
        rows = cursor.fetchall()
    found = {(level, index): node if level else merkle.event_leaf_hash(event_hash)
             for level, index, node, event_hash in rows}
    missing = [key for key in keys if key not in found]
    if missing:
        found.update(_missing_nodes_from_leaves(missing, tree_size=tree_size))
    return found


def _missing_nodes_from_leaves(missing: list[merkle.NodeKey], *, tree_size: int) -> dict[merkle.NodeKey, bytes]:
    """Nodes not stored, computed from their leaves: only between an older release's sealer
    appending leaves and the next run of this one (``merkle_nodes_fill_missing``)."""
    if any(level == 0 for level, _ in missing):
        raise _fewer_leaves(tree_size)
    logger.warning("%d Merkle node(s) are not stored yet: computing them from their leaves", len(missing))
    spans = [(index << level, (index + 1) << level) for level, index in missing]
    with connection.cursor() as cursor:
        cursor.execute(_LEAVES_SQL, {"leaf_los": [lo for lo, _ in spans], "leaf_his": [hi for _, hi in spans]})
        leaves = dict(cursor.fetchall())
    computed = {}
    for key, (lo, hi) in zip(missing, spans, strict=True):
        if any(i not in leaves for i in range(lo, hi)):
            raise _fewer_leaves(tree_size)
        computed[key] = merkle.root_from_leaf_hashes([merkle.event_leaf_hash(leaves[i]) for i in range(lo, hi)])
    return computed


def _fold_from_stored(plan: list[list[merkle.NodeKey]], *, tree_size: int) -> list[bytes]:
    """The hashes a plan (``merkle.inclusion_plan`` and the like) describes, from the stored nodes."""
    if not plan:
        return []
    keys = merkle.stored_keys(plan, tile_height=MERKLE_TILE_HEIGHT)
    return merkle.fold_plan(plan, _stored_hashes(keys, tree_size=tree_size), tile_height=MERKLE_TILE_HEIGHT)


# An event's leaf index and a signed tree size (NULL: not sealed, no such head), in one round trip.
_LEAF_SQL = "SELECT l.leaf_index FROM backplane_merkleleaf l WHERE l.event_id = %(position)s"
_HEAD_OF_SIZE_SQL = "SELECT h.tree_size FROM backplane_signedtreehead h WHERE h.tree_size = %(tree_size)s"
_LATEST_HEAD_SQL = "SELECT max(h.tree_size) FROM backplane_signedtreehead h"


def inclusion_proof_for_event(*, position: int, tree_size: int | None) -> tuple[int, int, list[str]]:
    """(leaf_index, tree_size, audit path as hex) for an event, against a signed head (the latest
    by default). Two queries: the leaf and the head, then the O(log n) stored hashes of the path."""
    with connection.cursor() as cursor:
        head_sql = _LATEST_HEAD_SQL if tree_size is None else _HEAD_OF_SIZE_SQL
        cursor.execute(f"SELECT ({_LEAF_SQL}), ({head_sql})", {"position": position, "tree_size": tree_size})
        leaf_index, size = cursor.fetchone()
    if leaf_index is None:
        raise NotFound("this event is not sealed yet", {"position": position})
    if size is None:
        raise _nothing_sealed_yet() if tree_size is None else _no_head_of_size(tree_size)
    if leaf_index >= size:
        raise InvalidInput("the event was sealed after that tree size", {"tree_size": f"must be > {leaf_index}"})
    proof = _fold_from_stored(merkle.inclusion_plan(leaf_index, size), tree_size=size)
    return leaf_index, size, merkle.hashes_to_hex(proof)


def consistency_proof_between(*, first: int, second: int) -> list[str]:
    """The consistency proof between two signed tree sizes, as hex. Two queries: the heads, then
    the O(log n) stored hashes of the proof."""
    if not 0 < first <= second:
        raise InvalidInput("need 0 < first <= second", {"first": first, "second": second})
    signed = set(SignedTreeHead.objects.filter(tree_size__in=[first, second]).values_list("tree_size", flat=True))
    for size in (first, second):
        if size not in signed:
            raise _no_head_of_size(size)
    return merkle.hashes_to_hex(_fold_from_stored(merkle.consistency_plan(first, second), tree_size=second))


# --- verification against the signed head ----------------------------------------------------

# One page of sealed events in leaf order, with the columns their hash covers: a bounded range
# of leaf indices, each leaf joined to its event by primary key. (An open range with LIMIT let
# the planner, with statistics from before the leaves were written, sort every leaf left.) The
# join is outer: retention prunes exported events (recovery/retention.py), and the tree size the
# audit export covers, read in the same snapshot, tells a pruned event from a missing one.
_SEALED_EVENTS_PAGE_SQL = """
SELECT l.leaf_index, l.event_hash, (SELECT coalesce(max(s.tree_size), 0) FROM backplane_auditsegment s),
       e.position, e.task_id, e.seq, e.type, e.payload, e.agent, e.idempotency_key, e.lamport, e.causation_id,
       e.correlation_id, e.trace_id, e.recorded_at, e.prev_hash
FROM backplane_merkleleaf l LEFT JOIN backplane_event e ON e.position = l.event_id
WHERE l.leaf_index >= %s AND l.leaf_index < %s
ORDER BY l.leaf_index
"""
_SEALED_EVENTS_PAGE_SIZE = 5000


@dataclass(frozen=True)
class SealVerification:
    valid: bool
    tree_size: int
    problem: str | None = None
    pruned: int = 0  # leaves whose events were pruned after their export, taken at their sealed hash


def seal_verify_against_head(*, head: SignedTreeHead | None = None) -> SealVerification:
    """Recompute every sealed event's hash from its content, rebuild the root, compare it with
    the signed head, and check the signature. Detects edits even when the attacker recomputed
    the task's whole chain and the leaf table, since the head's signature cannot be redone."""
    head = head or latest_head()
    if not verify_tree_head(tree_size=head.tree_size, root_hash=head.root_hash, signed_at=head.signed_at,
                            signature=head.signature, public_key=head.public_key):
        return SealVerification(False, head.tree_size, "the tree head's signature does not verify")
    frontier = merkle.CompactRange()
    pruned = 0
    # One pass over the leaves joined with their events, in leaf order; plain SQL, as in
    # chain_verify_range, so that hashing and not the ORM sets the pace.
    with connection.cursor() as cursor:
        use_c_timestamp_loader(cursor)
        while frontier.size < head.tree_size:
            page_end = min(frontier.size + _SEALED_EVENTS_PAGE_SIZE, head.tree_size)
            cursor.execute(_SEALED_EVENTS_PAGE_SQL, [frontier.size, page_end])
            for (leaf_index, sealed_hash, exported, position, task_id, seq, type_, payload, agent, key, lamport,
                 causation, correlation, trace, recorded, link) in cursor.fetchall():
                if leaf_index != frontier.size:
                    return SealVerification(False, head.tree_size, f"leaf {frontier.size} is missing")
                if position is None:
                    # Pruned after its export (the export and the offline verifier vouch for it),
                    # or deleted by someone else: then it was never exported.
                    if leaf_index >= exported:
                        return SealVerification(False, head.tree_size,
                                                f"the event of leaf {leaf_index} is missing (it was not exported)")
                    frontier.append(merkle.event_leaf_hash(sealed_hash))
                    pruned += 1
                    continue
                frontier.append(merkle.event_leaf_hash(stored_row_hash(
                    (task_id, seq, type_, payload, agent, key, lamport, causation, correlation, trace, recorded, link)
                )))
            if frontier.size < page_end:  # a leaf is gone: in the middle, or all the rest
                cursor.execute(
                    "SELECT EXISTS (SELECT FROM backplane_merkleleaf l WHERE l.leaf_index > %s AND l.leaf_index < %s)",
                    [frontier.size, head.tree_size],
                )
                if cursor.fetchone()[0]:
                    return SealVerification(False, head.tree_size, f"leaf {frontier.size} is missing")
                break
    if frontier.size != head.tree_size:
        return SealVerification(False, head.tree_size, f"only {frontier.size} of {head.tree_size} leaves exist")
    if frontier.root().hex() != head.root_hash:
        return SealVerification(False, head.tree_size, "the events no longer hash to the signed root", pruned)
    return SealVerification(True, head.tree_size, pruned=pruned)


# --- a sealer that fails -----------------------------------------------------------------


def sealing_record_failure(*, error: BaseException) -> DeadLetter | None:
    """A sealer run raised: make it a dead letter people see, not only a log line.

    Beat runs the sealer every ``BACKPLANE_SEAL_SECONDS``, so a lasting failure (no signing key,
    a bad one) would repeat every few seconds: each distinct failure (its type and message) is
    one pending dead letter whose ``attempts`` grow. Its source is ``audit_export``: without new
    seals the audit export has nothing to export, and requeueing runs an export, which is
    harmless. The caller re-raises, so the duty records the failure too (/readyz, /metrics).
    Returns None when the database cannot take the record (then it is the failure).
    """
    from backplane.delivery.models import DeadLetterSource
    from backplane.delivery.services import dead_letter_record_repeating

    text = f"{type(error).__name__}: {error}"[:2000]
    try:
        dead_letter, created = dead_letter_record_repeating(
            source=DeadLetterSource.AUDIT_EXPORT, reference=f"sealer: {text}"[:255], payload={"stage": "sealing"},
            error=text, attempts=1,
        )
    except DjangoDatabaseError:
        logger.warning("the sealer failed (%s) and the failure could not be recorded", text, exc_info=True)
        return None
    if created:
        logger.error("the sealer failed, dead letter %d: %s", dead_letter.pk, text)
    return dead_letter
