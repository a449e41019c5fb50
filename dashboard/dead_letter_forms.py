"""The dead-letter pages' forms: the queue's filters, one decision on a dead letter, and a
decision on many (what to decide, on which, and why: a draft bulk job)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

from django import forms
from django.conf import settings
from django.utils import timezone

from backplane.delivery.models import DeadLetterSource, DeadLetterStatus
from backplane.delivery.selectors import DeadLetterFilters
from dashboard.forms import BulkSelectionForm, ViewerDateTimeField
from recovery.models import BulkAction

STATUS_CHOICES = [
    ("", "any status"),
    (DeadLetterStatus.PENDING, "pending"),
    ("decided", "decided (requeued or discarded)"),
    (DeadLetterStatus.REQUEUED, "requeued"),
    (DeadLetterStatus.DISCARDED, "discarded"),
]
SOURCE_CHOICES = [("", "any source"), *DeadLetterSource.choices]
AGE_UNITS = {"minutes": timedelta(minutes=1), "hours": timedelta(hours=1), "days": timedelta(days=1)}


class DeadLetterFilterForm(forms.Form):
    error = forms.CharField(required=False, max_length=200, strip=True,
                            widget=forms.TextInput(attrs={"placeholder": "words of the error, any case",
                                                          "type": "search"}))
    status = forms.ChoiceField(required=False, choices=STATUS_CHOICES)
    source = forms.ChoiceField(required=False, choices=SOURCE_CHOICES)
    topic = forms.CharField(required=False, max_length=255, strip=True,
                            widget=forms.TextInput(attrs={"placeholder": "part of the topic"}))
    kind = forms.CharField(required=False, max_length=100, strip=True, label="Task kind",
                           widget=forms.TextInput(attrs={"placeholder": "exact task kind"}))
    older_than = forms.IntegerField(required=False, min_value=1, max_value=100_000,
                                    widget=forms.NumberInput(attrs={"placeholder": "N"}))
    older_unit = forms.ChoiceField(required=False, choices=[(unit, unit) for unit in AGE_UNITS], initial="minutes")
    created_after = ViewerDateTimeField(required=False, widget=forms.DateTimeInput(attrs={"type": "datetime-local"}))
    created_before = ViewerDateTimeField(required=False, widget=forms.DateTimeInput(attrs={"type": "datetime-local"}))
    tz = forms.IntegerField(required=False, min_value=-14 * 60, max_value=14 * 60, widget=forms.HiddenInput)

    def clean(self) -> dict[str, Any]:
        super().clean()
        data = self.cleaned_data
        offset = timedelta(minutes=data.get("tz") or 0)
        for name in ("created_after", "created_before"):
            value = data.get(name)
            if isinstance(value, datetime) and value.tzinfo is None:
                data[name] = (value + offset).replace(tzinfo=UTC)
        return data

    def filters(self, *, now: datetime | None = None) -> DeadLetterFilters:
        data = self.cleaned_data
        before = data.get("created_before")
        if data.get("older_than"):
            # "Older than N units" is a created-before bound; with both, the earlier one holds.
            cutoff = (now or timezone.now()) - data["older_than"] * AGE_UNITS[data.get("older_unit") or "minutes"]
            before = cutoff if before is None else min(before, cutoff)
        return DeadLetterFilters(
            status=data.get("status") or "",
            source=data.get("source") or "",
            topic=data.get("topic") or "",
            kind=data.get("kind") or "",
            error=data.get("error") or "",
            created_after=data.get("created_after"),
            created_before=before,
        )


# --- one decision ------------------------------------------------------------------------------

REASON_HELP = "Why: it is recorded with your name on the dead letter and in the task's log."


def reason_field(example: str = "e.g. broker is back; downstream fixed") -> forms.CharField:
    return forms.CharField(max_length=2000, strip=True, help_text=REASON_HELP,
                           error_messages={"required": "Write a reason: it is recorded with the decision."},
                           widget=forms.TextInput(attrs={"placeholder": example}))


class RequeueForm(forms.Form):
    reason = reason_field()


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")


class EditRequeueForm(forms.Form):
    """Requeue with an edited payload: a JSON object (checked here whatever the page checked)."""

    payload = forms.CharField(strip=False, widget=forms.Textarea(attrs={"rows": 16, "spellcheck": "false"}),
                              error_messages={"required": "The edited payload is empty."})
    reason = reason_field("e.g. fixed the malformed field the consumer rejected")

    def clean_payload(self) -> dict[str, Any]:
        text = self.cleaned_data["payload"]
        if len(text.encode()) > settings.BACKPLANE_PAYLOAD_LIMIT_BYTES:
            raise forms.ValidationError(f"The payload is larger than {settings.BACKPLANE_PAYLOAD_LIMIT_BYTES} bytes.")
        try:
            value = json.loads(text, parse_constant=_refuse_constant)
        except ValueError as exc:
            if not isinstance(exc, json.JSONDecodeError):
                raise forms.ValidationError(f"Not valid JSON: {exc}.") from None
            where = f"line {exc.lineno}, column {exc.colno}"
            raise forms.ValidationError(f"Not valid JSON: {exc.msg} at {where}.") from None
        if not isinstance(value, dict):
            raise forms.ValidationError("The payload must be a JSON object ({…}).")
        return value


class DiscardForm(forms.Form):
    reason = reason_field("e.g. duplicate; the lead was withdrawn")
    compensate = forms.BooleanField(required=False, label="Compensate: fail the task for good and undo the side "
                                                          "effects its succeeded tool calls declared")


# --- many at once: a draft job -------------------------------------------------------------------

# The queue's bulk bar offers these; each is a bulk job's action (recovery/bulk.py).
BULK_JOB_ACTIONS = [(BulkAction.DEAD_LETTER_REQUEUE, "Requeue"), (BulkAction.DEAD_LETTER_DISCARD, "Discard")]


class IdListField(forms.Field):
    """Checked dead letters' ids (checkboxes named ``ids``), in the order given, each once."""

    widget = forms.MultipleHiddenInput

    def to_python(self, value: Any) -> list[int]:
        if not value:
            return []
        try:
            ids = [int(item) for item in value]
        except (TypeError, ValueError):
            raise forms.ValidationError("Dead letters are named by their numbers.") from None
        if any(pk <= 0 or pk >= 2**63 for pk in ids):
            raise forms.ValidationError("Dead letters are named by their numbers.")
        return list(dict.fromkeys(ids))


class DeadLetterJobForm(BulkSelectionForm):
    """The queue's bulk bar: the checked dead letters, or every pending one matching the filter,
    what to do and why."""

    nothing_selected = "Select some dead letters, or all matching the filter."

    action = forms.ChoiceField(choices=BULK_JOB_ACTIONS)
    reason = reason_field()
    ids = IdListField(required=False)


def job_filter_of(filters: DeadLetterFilters) -> dict[str, str]:
    """The queue's filter as a bulk job's dead-letter filter (the job takes pending ones only,
    so the status is not part of it; times as RFC 3339)."""
    values: dict[str, str] = {}
    for name in ("source", "topic", "kind", "error"):
        if getattr(filters, name):
            values[name] = getattr(filters, name)
    for name in ("created_after", "created_before"):
        moment = getattr(filters, name)
        if moment is not None:
            values[name] = moment.isoformat()
    return values
