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
from django.utils import timezone

from backplane.eventlog.canonical import canonical_json
from backplane.eventlog.chain import format_timestamp, stored_row_hash
from backplane.eventlog.errors import InvalidInput, NotFound
from backplane.eventlog.selectors import use_c_timestamp_loader
from backplane.integrity import merkle
from backplane.integrity.models import MerkleLeaf, SignedTreeHead

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
    """What is signed (API.md): RFC 8785 JSON of exactly these three fields as returned."""
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
    frontier = merkle.CompactRange.from_hex(head.tree_size, head.frontier) if head else merkle.CompactRange()
    start = frontier.size
    lines = []
    for offset, (position, event_hash) in enumerate(unsealed):
        frontier.append(merkle.event_leaf_hash(event_hash))  # also checks the hash is 64 hex digits
        lines.append(f"{start + offset}\t{position}\t{event_hash}\n")
    if lines:
        # COPY: the ORM's bulk_create cost more per leaf than hashing it.
        with connection.cursor() as cursor, connection.wrap_database_errors, cursor.copy(
            "COPY backplane_merkleleaf (leaf_index, event_id, event_hash) FROM STDIN"
        ) as copy:
            copy.write("".join(lines))
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


# --- reading: heads and proofs ---------------------------------------------------------------


def latest_head() -> SignedTreeHead:
    head = SignedTreeHead.objects.order_by("-tree_size").first()
    if head is None:
        raise NotFound("nothing has been sealed yet", {})
    return head


def head_of_size(tree_size: int) -> SignedTreeHead:
    head = SignedTreeHead.objects.filter(tree_size=tree_size).first()
    if head is None:
        raise NotFound(f"no signed tree head of size {tree_size}", {"tree_size": tree_size})
    return head


def _leaf_hashes(tree_size: int) -> list[bytes]:
    hashes = [
        merkle.event_leaf_hash(h)
        for h in MerkleLeaf.objects.filter(leaf_index__lt=tree_size).order_by("leaf_index")
        .values_list("event_hash", flat=True).iterator(chunk_size=20_000)
    ]
    if len(hashes) != tree_size:
        raise NotFound(f"the tree has fewer than {tree_size} leaves", {"tree_size": tree_size})
    return hashes


def inclusion_proof_for_event(*, position: int, tree_size: int | None) -> tuple[int, int, list[str]]:
    """(leaf_index, tree_size, audit path as hex) for an event, against a signed head."""
    leaf = MerkleLeaf.objects.filter(event_id=position).first()
    if leaf is None:
        raise NotFound("this event is not sealed yet", {"position": position})
    size = head_of_size(tree_size).tree_size if tree_size is not None else latest_head().tree_size
    if leaf.leaf_index >= size:
        raise InvalidInput("the event was sealed after that tree size", {"tree_size": f"must be > {leaf.leaf_index}"})
    proof = merkle.inclusion_proof(_leaf_hashes(size), leaf.leaf_index, size)
    return leaf.leaf_index, size, [p.hex() for p in proof]


def consistency_proof_between(*, first: int, second: int) -> list[str]:
    if not 0 < first <= second:
        raise InvalidInput("need 0 < first <= second", {"first": first, "second": second})
    head_of_size(first)
    head_of_size(second)
    return [p.hex() for p in merkle.consistency_proof(_leaf_hashes(second), first, second)]


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
