"""The event log: agents, the task projection and the append-only events."""

from __future__ import annotations

import hashlib
import hmac
import uuid

from django.conf import settings
from django.contrib.postgres.fields import ArrayField
from django.core.validators import RegexValidator
from django.db import models
from django.db.models import Q

from backplane.chain import GENESIS_HASH

NAME_VALIDATOR = RegexValidator(
    r"^[a-zA-Z0-9][a-zA-Z0-9._-]{0,99}$",
    "letters, digits, '.', '_' and '-', starting with a letter or digit (at most 100)",
)


def hash_token(token: str) -> str:
    """Agent tokens are 256-bit random strings, so a plain SHA-256 is a sufficient at-rest hash."""
    return hashlib.sha256(token.encode()).hexdigest()


class Agent(models.Model):
    name = models.CharField(max_length=100, validators=[NAME_VALIDATOR])
    namespace = models.CharField(max_length=100, validators=[NAME_VALIDATOR], db_index=True)
    kinds = ArrayField(
        models.CharField(max_length=100),
        default=list,
        blank=True,
        help_text="Task kinds this agent may claim; empty means every kind.",
    )
    token_hash = models.CharField(max_length=64, unique=True, editable=False)
    # A token may act for a staff user (e.g. a dead-letter reviewer bot).
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="agents"
    )
    is_active = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)
    # Circuit breaker (backplane/breakers.py): consecutive failures open it, claims are refused
    # while open, a cool-down half-opens it for one trial claim, a success closes it.
    breaker_state = models.CharField(
        max_length=10, choices=[("closed", "closed"), ("open", "open"), ("half_open", "half open")], default="closed"
    )
    consecutive_failures = models.PositiveIntegerField(default=0)
    breaker_opened_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["namespace", "name"], name="agent_unique_name_per_namespace"),
        ]

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"

    def token_matches(self, token: str) -> bool:
        return hmac.compare_digest(self.token_hash, hash_token(token))

    def may_claim(self, kind: str) -> bool:
        return not self.kinds or kind in self.kinds


class BreakerTransition(models.Model):
    """Every change of an agent's circuit breaker, for the people who watch the fleet."""

    agent = models.ForeignKey(Agent, on_delete=models.CASCADE, related_name="breaker_transitions")
    from_state = models.CharField(max_length=10)
    to_state = models.CharField(max_length=10)
    reason = models.CharField(max_length=255)
    task_id = models.UUIDField(null=True, blank=True)
    decided_by = models.CharField(max_length=150, blank=True, default="")
    at = models.DateTimeField()

    class Meta:
        indexes = [models.Index(fields=["agent", "-at"], name="breaker_transition_agent_idx")]

    def __str__(self) -> str:
        return f"{self.agent}: {self.from_state} -> {self.to_state} ({self.reason})"


class TaskStatus(models.TextChoices):
    PENDING = "pending"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    DEAD_LETTERED = "dead_lettered"
    COMPENSATING = "compensating"
    COMPENSATED = "compensated"


# No event may be appended once a task is in one of these.
CLOSED_STATUSES = frozenset(
    {TaskStatus.COMPLETED, TaskStatus.FAILED, TaskStatus.DEAD_LETTERED, TaskStatus.COMPENSATED}
)


class Task(models.Model):
    """The projection of a task's events, updated in the same transaction as every append."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    namespace = models.CharField(max_length=100)
    kind = models.CharField(max_length=100)
    status = models.CharField(max_length=20, choices=TaskStatus.choices, default=TaskStatus.PENDING)
    input = models.JSONField(default=dict)
    output = models.JSONField(null=True, blank=True)
    error = models.TextField(null=True, blank=True)
    metadata = models.JSONField(default=dict, blank=True)
    parent = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.PROTECT, related_name="children"
    )
    attempts = models.PositiveIntegerField(default=0)
    max_attempts = models.PositiveIntegerField(default=3)
    # The fencing token: every new lease increments it, and a write carrying an older one is refused.
    lease_holder = models.CharField(max_length=100, null=True, blank=True)
    lease_epoch = models.PositiveBigIntegerField(default=0)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    lease_seconds = models.PositiveIntegerField(default=30)
    # Set on sub-agent tasks: the parent's dispatch, so a repeated dispatch finds the same child.
    dispatch_key = models.CharField(max_length=64, null=True, blank=True, unique=True)
    last_seq = models.PositiveIntegerField(default=0)
    head_hash = models.CharField(max_length=64, default=GENESIS_HASH)
    lamport = models.PositiveBigIntegerField(default=0)
    created_by = models.CharField(max_length=100, null=True, blank=True)
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()
    last_event_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [
            # Claims: oldest pending task of some kinds in a namespace.
            models.Index(
                fields=["namespace", "kind", "created_at"],
                name="task_pending_claim_idx",
                condition=Q(status="pending"),
            ),
            models.Index(fields=["namespace", "status", "created_at"], name="task_ns_status_idx"),
            # The stall detector scans leases that have run out.
            models.Index(
                fields=["lease_expires_at"],
                name="task_lease_expiry_idx",
                condition=Q(lease_holder__isnull=False),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.id} ({self.status})"

    @property
    def is_closed(self) -> bool:
        return self.status in CLOSED_STATUSES

    @property
    def is_leased(self) -> bool:
        return self.lease_holder is not None


class Event(models.Model):
    """One immutable entry of a task's log. Database triggers reject UPDATE, DELETE and TRUNCATE."""

    position = models.BigAutoField(primary_key=True)
    task = models.ForeignKey(Task, on_delete=models.PROTECT, related_name="events", db_index=False)
    seq = models.PositiveIntegerField()
    type = models.CharField(max_length=64)
    payload = models.JSONField(default=dict)
    agent = models.CharField(max_length=100, null=True, blank=True)
    idempotency_key = models.CharField(max_length=255, null=True, blank=True)
    # Digest of what the client sent under idempotency_key, so a reuse with another body is caught.
    request_digest = models.CharField(max_length=64, null=True, blank=True)
    lamport = models.PositiveBigIntegerField()
    causation_id = models.CharField(max_length=255, null=True, blank=True)
    correlation_id = models.CharField(max_length=255, null=True, blank=True)
    trace_id = models.CharField(max_length=255, null=True, blank=True)
    recorded_at = models.DateTimeField()
    prev_hash = models.CharField(max_length=64)
    hash = models.CharField(max_length=64)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["task", "seq"], name="event_unique_seq_per_task"),
            models.UniqueConstraint(
                fields=["task", "idempotency_key"],
                name="event_unique_idempotency_key_per_task",
                condition=Q(idempotency_key__isnull=False),
            ),
            models.CheckConstraint(condition=Q(seq__gte=1), name="event_seq_positive"),
        ]
        indexes = [models.Index(fields=["type"], name="event_type_idx")]

    def __str__(self) -> str:
        return f"{self.task_id}#{self.seq} {self.type}"


class WebhookSubscription(models.Model):
    """Administrators subscribe URLs to topics; each matching message gets its own outbox row."""

    name = models.CharField(max_length=100, unique=True)
    topic_pattern = models.CharField(
        max_length=255,
        help_text="AMQP-style: words separated by '.', '*' matches one word, '#' zero or more.",
    )
    url = models.URLField(max_length=1000)
    secret = models.CharField(max_length=200, help_text="HMAC-SHA256 key for the Backplane-Signature header.")
    timeout_seconds = models.PositiveIntegerField(default=5)
    is_active = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"{self.name} ({self.topic_pattern} -> {self.url})"


class OutboxStatus(models.TextChoices):
    PENDING = "pending"
    DELIVERED = "delivered"
    DEAD = "dead"


class OutboxDestination(models.TextChoices):
    BROKER = "broker"
    WEBHOOK = "webhook"


class OutboxMessage(models.Model):
    """A message committed in the same transaction as the change that causes it.

    The relay delivers it at least once; ``message_id`` is stable across attempts so
    consumers can drop duplicates. One row per destination.
    """

    id = models.BigAutoField(primary_key=True)
    message_id = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    destination = models.CharField(max_length=20, choices=OutboxDestination.choices, default=OutboxDestination.BROKER)
    subscription = models.ForeignKey(
        WebhookSubscription, null=True, blank=True, on_delete=models.PROTECT, related_name="messages"
    )
    topic = models.CharField(max_length=255)
    key = models.CharField(max_length=255)
    payload = models.JSONField(default=dict)
    headers = models.JSONField(default=dict)
    task = models.ForeignKey(Task, null=True, blank=True, on_delete=models.PROTECT, related_name="outbox")
    event_position = models.BigIntegerField(null=True, blank=True)
    status = models.CharField(max_length=20, choices=OutboxStatus.choices, default=OutboxStatus.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField()
    last_error = models.TextField(blank=True, default="")
    created_at = models.DateTimeField()
    delivered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [
            models.Index(fields=["next_attempt_at", "id"], name="outbox_due_idx", condition=Q(status="pending")),
            # Per-key order: "is an earlier message for this key and destination still undelivered?"
            models.Index(
                fields=["key", "destination", "subscription", "id"],
                name="outbox_key_order_idx",
                condition=Q(status="pending"),
            ),
            models.Index(fields=["delivered_at"], name="outbox_delivered_idx", condition=Q(status="delivered")),
        ]

    def __str__(self) -> str:
        return f"{self.topic} {self.message_id} ({self.status})"


class DeadLetterSource(models.TextChoices):
    OUTBOX = "outbox"
    TASK = "task"
    TOOL_CALL = "tool_call"
    COMPENSATION = "compensation"
    AUDIT_EXPORT = "audit_export"


class DeadLetterStatus(models.TextChoices):
    PENDING = "pending"
    REQUEUED = "requeued"
    DISCARDED = "discarded"


class DeadLetter(models.Model):
    """Work automation gave up on, waiting for a person to requeue or discard it."""

    source = models.CharField(max_length=20, choices=DeadLetterSource.choices)
    reference = models.CharField(max_length=255, help_text="What failed: an outbox message id, a task id, ...")
    task = models.ForeignKey(Task, null=True, blank=True, on_delete=models.PROTECT, related_name="dead_letters")
    outbox_message = models.ForeignKey(
        OutboxMessage, null=True, blank=True, on_delete=models.SET_NULL, related_name="dead_letters"
    )
    topic = models.CharField(max_length=255, blank=True, default="")
    payload = models.JSONField(default=dict)
    error = models.TextField(blank=True, default="")
    attempts = models.PositiveIntegerField(default=0)
    status = models.CharField(max_length=20, choices=DeadLetterStatus.choices, default=DeadLetterStatus.PENDING)
    created_at = models.DateTimeField()
    decided_by = models.CharField(max_length=150, null=True, blank=True)
    decided_at = models.DateTimeField(null=True, blank=True)
    reason = models.TextField(blank=True, default="")

    class Meta:
        permissions = [("review_deadletter", "Can requeue or discard dead letters")]
        indexes = [models.Index(fields=["status", "created_at"], name="deadletter_status_idx")]

    def __str__(self) -> str:
        return f"{self.source} {self.reference} ({self.status})"


# --- Integrity: periodic chain verification (backplane/integrity.py) ----------------------------


class VerificationMode(models.TextChoices):
    INCREMENTAL = "incremental"
    FULL = "full"


class VerificationRun(models.Model):
    """One pass of the chain verifier. ``finished_at`` stays empty if the run died part-way."""

    mode = models.CharField(max_length=20, choices=VerificationMode.choices)
    started_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)
    tasks_checked = models.PositiveIntegerField(default=0)
    events_checked = models.PositiveBigIntegerField(default=0)
    failures = models.PositiveIntegerField(default=0, help_text="Tasks whose chain was found broken.")

    class Meta:
        indexes = [models.Index(fields=["mode", "-finished_at"], name="verification_run_mode_idx")]

    def __str__(self) -> str:
        return f"{self.mode} run {self.pk} at {self.started_at:%Y-%m-%d %H:%M:%S}"


class VerifiedHead(models.Model):
    """How far a task's chain has been verified: the next incremental run continues from here.

    ``verified_hash`` also pins the verified history: if the event at ``verified_seq`` no
    longer carries it, something before it was rewritten.
    """

    task = models.OneToOneField(Task, on_delete=models.CASCADE, related_name="verified_head")
    verified_seq = models.PositiveIntegerField(default=0)
    verified_hash = models.CharField(max_length=64, default=GENESIS_HASH)
    verified_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"{self.task_id} verified through seq {self.verified_seq}"


class IntegrityAlert(models.Model):
    """A broken chain found by a verification run, waiting for a person to acknowledge it.

    Raised once per break (task, first bad seq): later runs that find the same break count
    it in their ``failures`` but do not raise it again, acknowledged or not.
    """

    run = models.ForeignKey(VerificationRun, on_delete=models.PROTECT, related_name="alerts")
    task = models.ForeignKey(Task, on_delete=models.PROTECT, related_name="integrity_alerts")
    first_invalid_seq = models.PositiveIntegerField()
    problem = models.TextField()
    created_at = models.DateTimeField()
    acknowledged_by = models.CharField(max_length=150, null=True, blank=True)
    acknowledged_at = models.DateTimeField(null=True, blank=True)
    note = models.TextField(blank=True, default="")

    class Meta:
        permissions = [("acknowledge_integrityalert", "Can acknowledge integrity alerts")]
        constraints = [
            models.UniqueConstraint(fields=["task", "first_invalid_seq"], name="integrity_alert_one_per_break"),
        ]
        indexes = [
            models.Index(
                fields=["created_at"], name="integrity_alert_open_idx", condition=Q(acknowledged_at__isnull=True)
            ),
        ]

    def __str__(self) -> str:
        state = "acknowledged" if self.acknowledged_at else "open"
        return f"{self.task_id} broken at seq {self.first_invalid_seq} ({state})"


class MerkleLeaf(models.Model):
    """An event's place in the sealed Merkle tree (backplane/sealing.py). Append-only, like events."""

    leaf_index = models.BigIntegerField(primary_key=True)
    event = models.OneToOneField(Event, on_delete=models.PROTECT, related_name="leaf", db_column="event_id")
    # The event's hash as it was when sealed; verification recomputes it from the event's content.
    event_hash = models.CharField(max_length=64)

    def __str__(self) -> str:
        return f"leaf {self.leaf_index} = event {self.event_id}"


class SignedTreeHead(models.Model):
    """A signed checkpoint of the tree: size, root, time, Ed25519 signature (API.md, Integrity)."""

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
    """A sealed range exported by backplane/audit/export.py: leaves [first_leaf, tree_size) as JSON
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
