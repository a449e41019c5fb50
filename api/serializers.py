"""The staff routes' request shapes (DRF serializers: types and sizes; the rules of the domain
live in the services), the answers' builders (``task_as_api_dict``) and the error's shape. The
agent routes' bodies and answers are declared in api/bodies.py."""

from __future__ import annotations

import copy
from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from backplane.eventlog.chain import format_timestamp
from backplane.eventlog.models import Task
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


# --- events --------------------------------------------------------------------------------


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
