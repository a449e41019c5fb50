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
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import connection, transaction
from django.utils import timezone

from backplane import merkle
from backplane.canonical import canonical_json
from backplane.chain import compute_hash, format_timestamp, hashed_fields
from backplane.errors import InvalidInput, NotFound
from backplane.models import MerkleLeaf, SignedTreeHead

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


_UNSEALED_SQL = """
SELECT e.position, e.hash FROM backplane_event e
WHERE NOT EXISTS (SELECT 1 FROM backplane_merkleleaf l WHERE l.event_id = e.position)
ORDER BY e.position
LIMIT %s
"""


def seal_new_events(*, batch_size: int = 10_000, now: datetime | None = None) -> SealStep:
    """Give the next committed, unsealed events leaf indices and sign the new head. One transaction."""
    with transaction.atomic(durable=True):
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_try_advisory_xact_lock(%s)", [SEALER_LOCK_KEY])
            (locked,) = cursor.fetchone()
            if not locked:
                return SealStep(sealed=0, tree_size=0, ran=False)
            cursor.execute(_UNSEALED_SQL, [batch_size])
            unsealed = cursor.fetchall()
        head = SignedTreeHead.objects.order_by("-tree_size").first()
        frontier = (
            merkle.CompactRange.from_hex(head.tree_size, head.frontier) if head else merkle.CompactRange()
        )
        if not unsealed and head is not None:
            return SealStep(sealed=0, tree_size=head.tree_size, ran=True)
        start = frontier.size
        leaves = []
        for offset, (position, event_hash) in enumerate(unsealed):
            frontier.append(merkle.event_leaf_hash(event_hash))
            leaves.append(MerkleLeaf(leaf_index=start + offset, event_id=position, event_hash=event_hash))
        MerkleLeaf.objects.bulk_create(leaves)
        key = signing_key()
        signed_at = format_timestamp(now or timezone.now())
        root_hash = frontier.root().hex()
        message = tree_head_message(tree_size=frontier.size, root_hash=root_hash, signed_at=signed_at)
        SignedTreeHead.objects.create(
            tree_size=frontier.size,
            root_hash=root_hash,
            signed_at=signed_at,
            signature=key.sign(message).hex(),
            public_key=public_key_hex(key),
            frontier=frontier.to_hex(),
        )
    return SealStep(sealed=len(leaves), tree_size=frontier.size, ran=True)


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

_HASHED_COLUMNS = (
    "task_id", "seq", "type", "payload", "agent", "idempotency_key", "lamport", "causation_id", "correlation_id",
    "trace_id", "recorded_at", "prev_hash",
)


@dataclass(frozen=True)
class SealVerification:
    valid: bool
    tree_size: int
    problem: str | None = None


def seal_verify_against_head(*, head: SignedTreeHead | None = None) -> SealVerification:
    """Recompute every sealed event's hash from its content, rebuild the root, compare it with
    the signed head, and check the signature. Detects edits even when the attacker recomputed
    the task's whole chain and the leaf table, since the head's signature cannot be redone."""
    head = head or latest_head()
    if not verify_tree_head(tree_size=head.tree_size, root_hash=head.root_hash, signed_at=head.signed_at,
                            signature=head.signature, public_key=head.public_key):
        return SealVerification(False, head.tree_size, "the tree head's signature does not verify")
    frontier = merkle.CompactRange()
    # One pass over the leaves joined with their events, in leaf order.
    rows = (
        MerkleLeaf.objects.filter(leaf_index__lt=head.tree_size).order_by("leaf_index")
        .values_list("leaf_index", *(f"event__{name}" for name in _HASHED_COLUMNS))
        .iterator(chunk_size=5000)
    )
    for expected, (leaf_index, *columns) in enumerate(rows):
        if leaf_index != expected:
            return SealVerification(False, head.tree_size, f"leaf {expected} is missing")
        fields = dict(zip(_HASHED_COLUMNS, columns, strict=True))
        fields["task_id"] = str(fields["task_id"])
        frontier.append(merkle.event_leaf_hash(compute_hash(hashed_fields(**fields))))
    if frontier.size != head.tree_size:
        return SealVerification(False, head.tree_size, f"only {frontier.size} of {head.tree_size} leaves exist")
    if frontier.root().hex() != head.root_hash:
        return SealVerification(False, head.tree_size, "the events no longer hash to the signed root")
    return SealVerification(True, head.tree_size)
