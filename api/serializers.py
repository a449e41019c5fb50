"""Request and response shapes of API.md. Input serializers only check types and sizes;
the rules of the domain live in the services."""

from __future__ import annotations

import copy
from typing import Any

from django.core.validators import RegexValidator
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from backplane.eventlog.chain import event_as_api_dict, format_timestamp
from backplane.eventlog.event_types import CLIENT_TYPE_PATTERN, SERVER_ONLY_TYPES
from backplane.eventlog.models import Event, Task
from backplane.eventlog.selectors import TaskRow

# --- strict fields: JSON types are not coerced ("5" is not an integer, 1 is not a string) ---


class StrictIntegerField(serializers.IntegerField):
    def to_internal_value(self, data: Any) -> int:
        if isinstance(data, bool) or not isinstance(data, int):
            self.fail("invalid")
        return super().to_internal_value(data)


class StrictCharField(serializers.CharField):
    def to_internal_value(self, data: Any) -> str:
        if not isinstance(data, str):
            self.fail("invalid")
        return super().to_internal_value(data)


class StrictUUIDField(serializers.UUIDField):
    def to_internal_value(self, data: Any) -> Any:
        # DRF's field also takes an integer (``UUID(int=...)``): ``false`` would name a task.
        if not isinstance(data, str):
            self.fail("invalid", value=data)
        return super().to_internal_value(data)


class StrictBooleanField(serializers.BooleanField):
    def to_internal_value(self, data: Any) -> bool:
        if not isinstance(data, bool):
            self.fail("invalid")
        return bool(data)


@extend_schema_field({"type": "object", "additionalProperties": True})
class JSONObjectField(serializers.Field):
    default_error_messages = {"invalid": "Must be a JSON object."}

    def to_internal_value(self, data: Any) -> dict[str, Any]:
        if not isinstance(data, dict):
            self.fail("invalid")
        return data

    def to_representation(self, value: Any) -> Any:
        return value


class StrictSerializer(serializers.Serializer):
    """Refuses fields it does not know, so a client cannot believe it set seq, namespace or status."""

    def get_fields(self) -> dict[str, serializers.Field]:
        # DRF deep-copies the declared fields for every serializer it instantiates, which
        # re-runs every field's constructor. The declared fields are templates that are never
        # bound, and binding sets only the copy's own name and parent, so a shallow copy
        # serves. A nested list serializer's child is then shared between requests;
        # validating is stateless.
        return {name: copy.copy(field) for name, field in self._declared_fields.items()}

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, dict):
            unknown = sorted(set(data) - set(self.fields))
            if unknown:
                raise serializers.ValidationError({name: ["Unknown field."] for name in unknown})
        return super().to_internal_value(data)


def name_field(**kwargs: Any) -> StrictCharField:
    return StrictCharField(max_length=100, min_length=1, **kwargs)


# --- tasks ---------------------------------------------------------------------------------


class LeaseOut(serializers.Serializer):
    agent = serializers.CharField()
    epoch = serializers.IntegerField()
    expires_at = serializers.CharField(allow_null=True)


class ForkedFromOut(serializers.Serializer):
    task_id = serializers.UUIDField()
    at_seq = serializers.IntegerField()


class TaskOut(serializers.Serializer):
    """The Task object of API.md, with where a fork continues from (``forked_from``, null for a
    task that is no fork) and whether it is a sandbox."""

    task_id = serializers.UUIDField()
    namespace = serializers.CharField()
    kind = serializers.CharField()
    status = serializers.ChoiceField(
        choices=["pending", "running", "completed", "failed", "dead_lettered", "compensating", "compensated",
                 "cancelled"]
    )
    input = JSONObjectField()
    output = JSONObjectField(allow_null=True)
    error = serializers.CharField(allow_null=True)
    parent_task_id = serializers.UUIDField(allow_null=True)
    attempts = serializers.IntegerField()
    max_attempts = serializers.IntegerField()
    lease = LeaseOut(allow_null=True)
    last_seq = serializers.IntegerField()
    head_hash = serializers.CharField()
    created_at = serializers.CharField()
    updated_at = serializers.CharField()
    last_event_at = serializers.CharField(allow_null=True)
    forked_from = ForkedFromOut(allow_null=True)
    sandbox = serializers.BooleanField()

    def to_representation(self, task: Task) -> dict[str, Any]:
        return task_as_api_dict(task)


def optional_timestamp(value: Any) -> str | None:
    """RFC 3339 as the API prints times, or None."""
    return format_timestamp(value) if value is not None else None


def task_as_api_dict(task: Task | TaskRow) -> dict[str, Any]:
    lease = None
    if task.lease_holder is not None:
        lease = {
            "agent": task.lease_holder,
            "epoch": task.lease_epoch,
            "expires_at": optional_timestamp(task.lease_expires_at),
        }
    return {
        "task_id": str(task.pk),
        "namespace": task.namespace,
        "kind": task.kind,
        "status": task.status,
        "input": task.input,
        "output": task.output,
        "error": task.error,
        "parent_task_id": str(task.parent_id) if task.parent_id else None,
        "attempts": task.attempts,
        "max_attempts": task.max_attempts,
        "lease": lease,
        "last_seq": task.last_seq,
        "head_hash": task.head_hash,
        "created_at": optional_timestamp(task.created_at),
        "updated_at": optional_timestamp(task.updated_at),
        "last_event_at": optional_timestamp(task.last_event_at),
        "forked_from": (
            {"task_id": str(task.forked_from_id), "at_seq": task.forked_at_seq}
            if task.forked_from_id is not None else None
        ),
        "sandbox": task.sandbox,
    }


class TaskCreateIn(StrictSerializer):
    kind = name_field()
    input = JSONObjectField()
    task_id = StrictUUIDField(required=False)
    parent_task_id = StrictUUIDField(required=False, allow_null=True)
    max_attempts = StrictIntegerField(required=False, min_value=1, max_value=100)
    metadata = JSONObjectField(required=False)


class TaskListOut(serializers.Serializer):
    results = TaskOut(many=True)
    next = serializers.URLField(allow_null=True)


# --- events --------------------------------------------------------------------------------


class EventOut(serializers.Serializer):
    """The Event object of API.md; ``hash`` covers every field but itself and ``position``."""

    task_id = serializers.UUIDField()
    seq = serializers.IntegerField()
    position = serializers.IntegerField()
    type = serializers.CharField()
    payload = JSONObjectField()
    agent = serializers.CharField(allow_null=True)
    idempotency_key = serializers.CharField(allow_null=True)
    lamport = serializers.IntegerField()
    causation_id = serializers.CharField(allow_null=True)
    correlation_id = serializers.CharField(allow_null=True)
    trace_id = serializers.CharField(allow_null=True)
    recorded_at = serializers.CharField()
    prev_hash = serializers.CharField()
    hash = serializers.CharField()

    def to_representation(self, event: Event) -> dict[str, Any]:
        return event_as_api_dict(event)


class OutboxItemIn(StrictSerializer):
    """One message to publish with the event. Its headers are the server's (task, seq, event hash,
    agent, namespace): a client sets none."""

    # Reserved topics are refused in the service (eventlog/services.py), as reserved event types are.
    topic = StrictCharField(
        max_length=255, min_length=1,
        help_text="Routing key on the broker, matched by subscriptions' patterns. Topics beginning with "
                  "`backplane.` (in any case) belong to the server: 400 validation_error.",
    )
    payload = JSONObjectField()
    key = StrictCharField(
        max_length=255, min_length=1, required=False,
        help_text="Delivery order is kept per key within the writing agent's namespace (default: the task id).",
    )


class EventFieldsIn(StrictSerializer):
    """One event as a client writes it."""

    # The pattern is checked again, with the reserved names, in the service.
    type = StrictCharField(
        max_length=64, min_length=3, validators=[RegexValidator(CLIENT_TYPE_PATTERN)],
        help_text=(
            "PascalCase, matching ^[A-Z][A-Za-z0-9]{2,63}$. ReasoningStepCompleted needs an integer payload.step, "
            "TaskCompleted an object payload.output, TaskFailed a string payload.error and a boolean "
            "payload.retryable. Written only by the server, refused with 400 validation_error: "
            + ", ".join(sorted(SERVER_ONLY_TYPES)) + "."
        ),
    )
    payload = JSONObjectField(help_text="required (API.md); `{}` when the type needs nothing")
    idempotency_key = StrictCharField(max_length=255, min_length=1, required=False, allow_null=True)
    lamport = StrictIntegerField(required=False, min_value=0, max_value=2**62)
    causation_id = StrictCharField(max_length=255, required=False, allow_null=True)
    correlation_id = StrictCharField(max_length=255, required=False, allow_null=True)
    trace_id = StrictCharField(max_length=255, required=False, allow_null=True)
    outbox: serializers.ListSerializer[Any] = serializers.ListSerializer(
        child=OutboxItemIn(), required=False, max_length=1000)


class EventAppendIn(EventFieldsIn):
    expected_seq = StrictIntegerField(required=False, min_value=0)
    lease_epoch = StrictIntegerField(required=False, min_value=0)


class EventBatchIn(StrictSerializer):
    expected_seq = StrictIntegerField(required=False, min_value=0)
    lease_epoch = StrictIntegerField(required=False, min_value=0)
    events: serializers.ListSerializer[Any] = serializers.ListSerializer(
        child=EventFieldsIn(), allow_empty=False, max_length=1000)


class EventListOut(serializers.Serializer):
    results = EventOut(many=True)
    next_after_seq = serializers.IntegerField(allow_null=True)


class EventBatchOut(serializers.Serializer):
    results = EventOut(many=True)


class ChainVerifyOut(serializers.Serializer):
    valid = serializers.BooleanField()
    checked = serializers.IntegerField()
    head_hash = serializers.CharField()
    first_invalid_seq = serializers.IntegerField(allow_null=True)


class ErrorDetail(serializers.Serializer):
    code = serializers.CharField()
    message = serializers.CharField()
    details = serializers.DictField()


class ErrorOut(serializers.Serializer):
    error = ErrorDetail()
