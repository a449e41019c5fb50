"""Records of the recovery side: tool calls made through the idempotency proxy."""

from __future__ import annotations

from django.db import models
from django.db.models import Q

from backplane.models import Task


class ToolCallStatus(models.TextChoices):
    DISPATCHED = "dispatched"
    SUCCEEDED = "succeeded"
    FAILED = "failed"


class ToolCall(models.Model):
    """One tool call, keyed by sha256("{task_id}:{step}:{tool}").

    Written before the agent acts (write before you act) and answered once; a repeat of
    the key is answered from here instead of calling the tool again. Kept until
    ``expires_at`` (the TTL), then purged.
    """

    idempotency_key = models.CharField(max_length=64, primary_key=True)
    task = models.ForeignKey(Task, on_delete=models.CASCADE, related_name="tool_calls")
    step = models.PositiveIntegerField()
    tool = models.CharField(max_length=200)
    input = models.JSONField(default=dict)
    compensation = models.JSONField(null=True, blank=True)
    status = models.CharField(max_length=20, choices=ToolCallStatus.choices, default=ToolCallStatus.DISPATCHED)
    result = models.JSONField(null=True, blank=True)
    dispatched_by = models.CharField(max_length=100, null=True, blank=True)
    dispatched_at = models.DateTimeField()
    completed_at = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField()

    class Meta:
        indexes = [
            models.Index(fields=["expires_at"], name="toolcall_expiry_idx"),
            models.Index(fields=["task", "step"], name="toolcall_task_step_idx"),
            models.Index(
                fields=["dispatched_at"], name="toolcall_in_flight_idx", condition=Q(status="dispatched")
            ),
        ]

    def __str__(self) -> str:
        return f"{self.tool} step {self.step} of {self.task_id} ({self.status})"
