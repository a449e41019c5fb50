"""What the demo's outside world remembers: its tools' ledger and what its agents went through.

These tables belong to the demo's stand-in for the outside world (a CRM, a mail provider, a
payment processor), not to the product: the crash report compares them with the product's log.
The ledger is the ground truth for "no side effect twice": a row is written the first time a
tool acts on an ``Idempotency-Key``; a repeat of the key is answered from the row and counted
in ``replays``; ``subject`` is the business identity of the effect (task and step), so an agent
that called again under a *new* key would show up as two rows with one subject.
"""

from __future__ import annotations

from django.db import models


class LedgerEntry(models.Model):
    tool = models.CharField(max_length=100)
    idempotency_key = models.CharField(max_length=255)
    subject = models.CharField(max_length=255, help_text="What the effect was about: 'task_id:step'.")
    task_id = models.UUIDField(null=True, blank=True)
    input = models.JSONField(default=dict)
    status_code = models.PositiveSmallIntegerField()
    response = models.JSONField(default=dict)
    created_at = models.DateTimeField()
    replays = models.PositiveIntegerField(default=0)
    last_replay_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            # The tool's own idempotency: one effect per key, whoever asks and however often.
            models.UniqueConstraint(fields=["tool", "idempotency_key"], name="demo_ledger_one_effect_per_key"),
        ]
        indexes = [
            models.Index(fields=["subject"], name="demo_ledger_subject_idx"),
            models.Index(fields=["created_at"], name="demo_ledger_created_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.tool} {self.subject} ({self.status_code})"


class ObservationKind(models.TextChoices):
    CRASH = "crash", "crash injected"
    PROXY_REPLAY = "proxy_replay", "the proxy answered instead of the tool"
    TOOL_RETRY = "tool_retry", "transient tool failure, retried with the same key"
    BREAKER_WAIT = "breaker_wait", "a circuit was open; the agent waited"


class Observation(models.Model):
    """One thing an agent process reported about itself (crashes are reported just before the
    SIGKILL: a crashed process cannot report afterwards)."""

    kind = models.CharField(max_length=20, choices=ObservationKind.choices)
    task_id = models.UUIDField()
    agent = models.CharField(max_length=100)
    zone = models.PositiveSmallIntegerField(null=True, blank=True)
    step = models.PositiveIntegerField(null=True, blank=True)
    tool = models.CharField(max_length=100, blank=True, default="")
    lease_epoch = models.PositiveIntegerField(null=True, blank=True)
    at = models.DateTimeField()

    class Meta:
        indexes = [
            models.Index(fields=["kind", "at"], name="demo_observation_kind_at_idx"),
            models.Index(fields=["task_id"], name="demo_observation_task_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.task_id} zone {self.zone}"
