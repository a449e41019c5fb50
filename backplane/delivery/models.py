"""Delivery's tables: webhook subscriptions, the outbox and dead letters (app ``backplane``)."""

from __future__ import annotations

import uuid

from django.contrib.postgres.fields import ArrayField
from django.core.validators import MaxValueValidator, MinValueValidator, RegexValidator
from django.db import models
from django.db.models import Q


class Ordering(models.TextChoices):
    """What a destination does with a key's later messages once one of them is dead-lettered
    (docs/delivery.md)."""

    # The key waits until a reviewer requeues or discards the dead letter: nothing of the key
    # ever arrives ahead of an earlier message.
    STRICT = "strict", "strict: a dead letter holds its key until it is decided"
    # The dead-lettered message leaves the sequence; the key's later messages go on, in order.
    BEST_EFFORT = "best_effort", "best effort: a dead letter leaves the sequence"


# A namespace's name, as the event log's ``NAME_VALIDATOR`` has it (delivery sits below the event
# log and does not import it).
NAMESPACE_VALIDATOR = RegexValidator(
    r"^[a-zA-Z0-9][a-zA-Z0-9._-]{0,99}$",
    "a namespace: letters, digits, '.', '_' and '-', starting with a letter or digit (at most 100)",
)


class WebhookSubscription(models.Model):
    """Administrators subscribe URLs to topics; each matching message gets its own outbox row.

    Each subscription is a delivery lane of its own (docs/delivery.md): its deadline, its
    concurrency, its retry schedule and its ordering. A retry field left empty takes the
    ``BACKPLANE_OUTBOX_*`` setting of the same name.
    """

    name = models.CharField(max_length=100, unique=True)
    topic_pattern = models.CharField(
        max_length=255,
        help_text="AMQP-style: words separated by '.', '*' matches one word, '#' zero or more.",
    )
    # Empty: every namespace's messages, and the backplane's own that concern none (alerts).
    namespaces = ArrayField(
        models.CharField(max_length=100, validators=[NAMESPACE_VALIDATOR]), default=list, blank=True,
        help_text="Only messages of these namespaces, comma-separated (empty: every namespace's, and the "
                  "backplane's own messages of no namespace, e.g. alerts).",
    )
    url = models.URLField(max_length=1000)
    secret = models.CharField(max_length=200, help_text="HMAC-SHA256 key for the Backplane-Signature header.")
    timeout_seconds = models.PositiveIntegerField(
        default=5, validators=[MinValueValidator(1), MaxValueValidator(300)],
        help_text="Deadline of one POST (connect, send, answer), in seconds.",
    )
    is_active = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)
    # Strict by default, like the broker: the product's own messages are state changes keyed by
    # task, and a receiver that applies them in arrival order would go back to an older state
    # if a later one overtook a dead-lettered earlier one. The hold is per key (one task's
    # messages to this URL), never the whole subscription.
    ordering = models.CharField(
        max_length=20, choices=Ordering.choices, default=Ordering.STRICT, db_default=Ordering.STRICT,
        help_text="strict: a dead-lettered message holds back the later messages of its key until a reviewer "
                  "requeues or discards it. best effort: it leaves the sequence and the others go on.",
    )
    max_concurrency = models.PositiveSmallIntegerField(
        default=2, db_default=2, validators=[MinValueValidator(1), MaxValueValidator(16)],
        help_text="POSTs in flight to this URL at once, per relay process.",
    )
    max_attempts = models.PositiveIntegerField(
        null=True, blank=True, validators=[MinValueValidator(1), MaxValueValidator(1000)],
        help_text="Attempts before a message becomes a dead letter (empty: BACKPLANE_OUTBOX_MAX_ATTEMPTS).",
    )
    retry_base_seconds = models.PositiveIntegerField(
        null=True, blank=True, validators=[MaxValueValidator(24 * 3600)],
        help_text="First retry delay; it doubles per attempt (empty: BACKPLANE_OUTBOX_BACKOFF_BASE_SECONDS).",
    )
    retry_max_delay_seconds = models.PositiveIntegerField(
        null=True, blank=True, validators=[MinValueValidator(1), MaxValueValidator(7 * 24 * 3600)],
        help_text="Longest delay between two attempts (empty: BACKPLANE_OUTBOX_BACKOFF_MAX_SECONDS).",
    )

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
    # Per-key order is kept within a scope (outbox.py, ``outbox_key_scope``): the namespace of an
    # agent's message, ``SERVER_KEY_SCOPE`` for the backplane's own. '' for a row written without
    # one: delivered before migration 0027, or by a process still running the code before it.
    key_scope = models.CharField(max_length=100, db_default="")
    payload = models.JSONField(default=dict)
    headers = models.JSONField(default=dict)
    task = models.ForeignKey("backplane.Task", null=True, blank=True, on_delete=models.PROTECT, related_name="outbox")
    event_position = models.BigIntegerField(null=True, blank=True)
    status = models.CharField(max_length=20, choices=OutboxStatus.choices, default=OutboxStatus.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField()
    last_error = models.TextField(blank=True, default="")
    # Every failed attempt, oldest first (the last ``FAILURES_KEPT``): {"attempt", "at", "error"}.
    failures = models.JSONField(default=list, blank=True)
    created_at = models.DateTimeField()
    delivered_at = models.DateTimeField(null=True, blank=True)
    # A relay's claim (relay.py): the row is being delivered by the relay holding ``claim_token``
    # until ``claimed_until``; past that, another relay may claim it again. Attempts are counted
    # when a row is claimed, so a relay that died mid-delivery counts as an attempt.
    claimed_until = models.DateTimeField(null=True, blank=True)
    claim_token = models.UUIDField(null=True, blank=True)
    # Dead-lettered under strict ordering and not yet decided: the later messages of its key
    # and destination wait (cleared when a reviewer requeues or discards it).
    holds_key = models.BooleanField(default=False, db_default=False)

    class Meta:
        indexes = [
            # The claim: a destination's due rows, oldest due first (``subscription`` is NULL for the broker).
            models.Index(fields=["subscription", "next_attempt_at", "id"], name="outbox_lane_due_idx",
                         condition=Q(status="pending")),
            # Per-key order: "is an earlier message for this key, scope and destination still
            # undelivered, or dead-lettered and holding its key?" (the same condition in relay.py's SQL).
            models.Index(
                fields=["key", "key_scope", "destination", "subscription", "id"],
                name="outbox_scoped_key_blocking_idx",
                condition=Q(status="pending") | Q(holds_key=True),
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


# Who may requeue or discard dead letters (declared on DeadLetter; the "Reviewers" group holds it).
REVIEW_PERMISSION = "backplane.review_deadletter"


class DeadLetter(models.Model):
    """Work automation gave up on, waiting for a person to requeue or discard it."""

    source = models.CharField(max_length=20, choices=DeadLetterSource.choices)
    reference = models.CharField(max_length=255, help_text="What failed: an outbox message id, a task id, ...")
    task = models.ForeignKey(
        "backplane.Task", null=True, blank=True, on_delete=models.PROTECT, related_name="dead_letters"
    )
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
    # The payload as it failed, kept when a reviewer requeues an edited one (``payload`` then
    # holds what was requeued).
    original_payload = models.JSONField(null=True, blank=True)
    # The failed attempts that led here, oldest first: {"attempt", "at", "error"} (outbox
    # messages; a task's own attempts are in its log).
    history = models.JSONField(default=list, blank=True)

    class Meta:
        permissions = [("review_deadletter", "Can requeue or discard dead letters")]
        indexes = [models.Index(fields=["status", "created_at"], name="deadletter_status_idx")]

    def __str__(self) -> str:
        return f"{self.source} {self.reference} ({self.status})"
