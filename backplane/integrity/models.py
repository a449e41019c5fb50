"""Integrity's tables: verification runs and alerts, the sealed Merkle tree, audit segments
(app ``backplane``)."""

from __future__ import annotations

from django.db import models
from django.db.models import Q

from backplane.eventlog.chain import GENESIS_HASH


class VerificationMode(models.TextChoices):
    INCREMENTAL = "incremental"
    FULL = "full"
    # One task's whole chain, asked for by a person ("verify chain now" on the dashboard).
    ON_DEMAND = "on_demand"


class VerificationRun(models.Model):
    """One pass of the chain verifier. ``finished_at`` stays empty if the run died part-way."""

    mode = models.CharField(max_length=20, choices=VerificationMode.choices)
    started_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)
    tasks_checked = models.PositiveIntegerField(default=0)
    events_checked = models.PositiveBigIntegerField(default=0)
    failures = models.PositiveIntegerField(
        default=0, help_text="Tasks whose chain was found broken or whose row differs from its log."
    )
    # How many tasks there were when the run started (its progress is tasks_checked of these),
    # and who asked for it when a person did (the dashboard's "verify all now").
    tasks_total = models.PositiveIntegerField(null=True, blank=True)
    requested_by = models.CharField(max_length=150, blank=True, default="")

    class Meta:
        indexes = [models.Index(fields=["mode", "-finished_at"], name="verification_run_mode_idx")]

    def __str__(self) -> str:
        return f"{self.mode} run {self.pk} at {self.started_at:%Y-%m-%d %H:%M:%S}"


class VerifiedHead(models.Model):
    """How far a task's chain has been verified: the next incremental run continues from here.

    ``verified_hash`` also pins the verified history: if the event at ``verified_seq`` no
    longer carries it, something before it was rewritten. ``projection`` is the reducer's fold
    of the log through ``verified_seq`` (``reducer.task_state_as_json``), the checkpoint the
    next run folds the new events onto; empty for heads verified before it was kept.
    """

    task = models.OneToOneField("backplane.Task", on_delete=models.CASCADE, related_name="verified_head")
    verified_seq = models.PositiveIntegerField(default=0)
    verified_hash = models.CharField(max_length=64, default=GENESIS_HASH)
    projection = models.JSONField(null=True, blank=True)
    verified_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"{self.task_id} verified through seq {self.verified_seq}"


class IntegrityAlertKind(models.TextChoices):
    # The hash chain is broken at ``first_invalid_seq``.
    CHAIN = "chain"
    # The chain holds, but the task row is not what its log replays to through
    # ``first_invalid_seq`` (the row's ``last_seq`` when it was checked).
    PROJECTION = "projection"


class IntegrityAlert(models.Model):
    """A broken chain, or a task row that differs from its log, found by a verification run and
    waiting for a person to acknowledge it.

    Raised once per finding (task, kind, seq): later runs that find the same one count it in
    their ``failures`` but do not raise it again, acknowledged or not.
    """

    run = models.ForeignKey(VerificationRun, on_delete=models.PROTECT, related_name="alerts")
    task = models.ForeignKey("backplane.Task", on_delete=models.PROTECT, related_name="integrity_alerts")
    kind = models.CharField(max_length=20, choices=IntegrityAlertKind.choices, default=IntegrityAlertKind.CHAIN)
    first_invalid_seq = models.PositiveIntegerField()
    problem = models.TextField()
    created_at = models.DateTimeField()
    acknowledged_by = models.CharField(max_length=150, null=True, blank=True)
    acknowledged_at = models.DateTimeField(null=True, blank=True)
    note = models.TextField(blank=True, default="")

    class Meta:
        permissions = [("acknowledge_integrityalert", "Can acknowledge integrity alerts")]
        constraints = [
            models.UniqueConstraint(
                fields=["task", "kind", "first_invalid_seq"], name="integrity_alert_one_per_finding"
            ),
        ]
        indexes = [
            models.Index(
                fields=["created_at"], name="integrity_alert_open_idx", condition=Q(acknowledged_at__isnull=True)
            ),
        ]

    def __str__(self) -> str:
        state = "acknowledged" if self.acknowledged_at else "open"
        if self.kind == IntegrityAlertKind.PROJECTION:
            return f"{self.task_id} row differs from its log at seq {self.first_invalid_seq} ({state})"
        return f"{self.task_id} broken at seq {self.first_invalid_seq} ({state})"


class MerkleLeaf(models.Model):
    """An event's place in the sealed Merkle tree (backplane/integrity/sealing.py). Append-only, like events.

    A leaf outlives its event: retention (recovery/retention.py) may delete a finished task's
    events once their leaves are exported (below the last ``AuditSegment.tree_size``), so
    ``event_id`` is a plain unique column with no foreign key. Proofs and tree heads read only
    ``event_hash``; the seal checks take a leaf whose event is gone and that was exported as
    covered by the export (the offline verifier checks it there), and report any other.
    """

    leaf_index = models.BigIntegerField(primary_key=True)
    event = models.OneToOneField("backplane.Event", on_delete=models.DO_NOTHING, db_constraint=False,
                                 related_name="leaf", db_column="event_id")
    # The event's hash as it was when sealed; verification recomputes it from the event's content.
    event_hash = models.CharField(max_length=64)

    def __str__(self) -> str:
        return f"leaf {self.leaf_index} = event {self.event_id}"


class EventStreamCursor(models.Model):
    """How far the sealed log has been streamed to Kafka (backplane/integrity/stream.py): the
    next leaf to publish, and the lease of the run publishing from it. One row."""

    name = models.CharField(max_length=20, primary_key=True)
    next_leaf = models.BigIntegerField(default=0)
    claimed_until = models.DateTimeField(null=True, blank=True)
    claim_token = models.UUIDField(null=True, blank=True)
    advanced_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.name}: next leaf {self.next_leaf}"


# The stored levels of MerkleNode: multiples of this (level 0 is the leaf table). A perfect subtree
# at any level is then folded from at most 2**(MERKLE_TILE_HEIGHT - 1) stored hashes. Changing it
# means rewriting the table (a migration like 0021's backfill).
MERKLE_TILE_HEIGHT = 4


class MerkleNode(models.Model):
    """A complete (perfect) subtree of the sealed Merkle tree: the hash of the 2**level leaves from
    leaf ``index * 2**level``. Append-only, written by the sealer with the leaves that complete it.

    Only levels that are multiples of ``MERKLE_TILE_HEIGHT`` are kept (4, 8, 12, ...; the leaves
    are level 0), about one row per 15 leaves, and proofs read O(log n) of them
    (``merkle.inclusion_plan`` and ``fold_plan``) instead of rebuilding the tree from every leaf.
    Like leaves, nodes outlive the events that retention prunes.
    """

    pk = models.CompositePrimaryKey("level", "index")
    level = models.PositiveSmallIntegerField()
    index = models.BigIntegerField()
    hash = models.BinaryField()  # the 32 raw bytes

    def __str__(self) -> str:
        return f"node {self.level}/{self.index} = {bytes(self.hash).hex()[:12]}"


class SignedTreeHead(models.Model):
    """A signed checkpoint of the tree: size, root, time, Ed25519 signature (docs/api.md, Integrity)."""

    tree_size = models.BigIntegerField(primary_key=True)
    root_hash = models.CharField(max_length=64)
    # Kept as the exact string that was signed, so the signature verifies byte for byte.
    signed_at = models.CharField(max_length=40)
    signature = models.CharField(max_length=128)
    public_key = models.CharField(max_length=64)
    # The compact range (perfect-subtree roots) the next run continues from.
    frontier = models.JSONField(default=list)

    def __str__(self) -> str:
        return f"tree head {self.tree_size} {self.root_hash[:12]}"


class AuditSegment(models.Model):
    """A sealed range exported by backplane/integrity/audit/export.py: leaves [first_leaf, tree_size) as JSON
    Lines plus a signed manifest chained to the previous one. A row exists only once both objects
    were written, so the next export continues after the last row (and finds any object a crash
    left behind unrecorded). Append-only, like the tree heads it ends at."""

    number = models.PositiveIntegerField(primary_key=True)
    first_leaf = models.BigIntegerField()
    # One past the last leaf: the size of the signed tree head the segment ends at.
    tree_size = models.BigIntegerField(unique=True)
    root_hash = models.CharField(max_length=64)
    segment_sha256 = models.CharField(max_length=64)
    manifest_sha256 = models.CharField(max_length=64, unique=True)
    destination = models.CharField(max_length=1000, help_text="file:///directory or s3://bucket/prefix")
    exported_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"audit segment {self.number}: leaves {self.first_leaf}-{self.last_leaf}"

    @property
    def last_leaf(self) -> int:
        return self.tree_size - 1
