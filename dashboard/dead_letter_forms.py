"""The dead-letter pages' forms: the queue's filters, one decision on a dead letter, and a
decision on many (what to decide, on which, and the signed confirmation of a dry run)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

from django import forms
from django.conf import settings
from django.core import signing
from django.utils import timezone

from backplane.delivery.models import DeadLetterSource, DeadLetterStatus
from backplane.delivery.selectors import BULK_MAX, DeadLetterFilters
from dashboard.forms import ViewerDateTimeField

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


# --- many at once ------------------------------------------------------------------------------

BULK_ACTIONS = [("requeue", "Requeue"), ("discard", "Discard")]


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
        if any(pk <= 0 for pk in ids):
            raise forms.ValidationError("Dead letters are named by their numbers.")
        return list(dict.fromkeys(ids))


class BulkForm(forms.Form):
    """The queue's bulk bar: the checked dead letters, or every pending one matching the filter
    (``query``, the queue's filter as a query string), what to do and why."""

    action = forms.ChoiceField(choices=BULK_ACTIONS)
    reason = reason_field()
    ids = IdListField(required=False)
    all_matching = forms.BooleanField(required=False)
    query = forms.CharField(required=False, max_length=2000)

    def clean(self) -> dict[str, Any]:
        super().clean()
        data = self.cleaned_data
        if not data.get("all_matching") and not data.get("ids") and not self.errors:
            raise forms.ValidationError("Select some dead letters, or all matching the filter.")
        if len(data.get("ids") or []) > BULK_MAX:
            raise forms.ValidationError(f"At most {BULK_MAX} dead letters at once.")
        return data


BULK_SALT = "dashboard.dead_letters.bulk"
# A dry run's confirmation is good for this long; after that the reviewer looks again.
BULK_CONFIRM_MAX_AGE = timedelta(hours=1)


def bulk_token(*, ids: list[int], action: str, reason: str, user_id: int) -> str:
    """What the dry run showed, signed: the confirmation decides exactly that, for that user."""
    return signing.dumps({"ids": ids, "action": action, "reason": reason, "user": user_id}, salt=BULK_SALT,
                         compress=True)


class BulkConfirmForm(forms.Form):
    token = forms.CharField(max_length=20_000)

    def __init__(self, *args: Any, user_id: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.user_id = user_id

    def clean_token(self) -> dict[str, Any]:
        try:
            data = signing.loads(self.cleaned_data["token"], salt=BULK_SALT,
                                 max_age=BULK_CONFIRM_MAX_AGE)
        except signing.SignatureExpired:
            raise forms.ValidationError("This dry run is more than an hour old; run it again.") from None
        except signing.BadSignature:
            raise forms.ValidationError("This confirmation was not made by a dry run here.") from None
        if data.get("user") != self.user_id:
            raise forms.ValidationError("This dry run was made by someone else; run your own.")
        ids = data.get("ids")
        if not isinstance(ids, list) or not all(isinstance(pk, int) for pk in ids) or len(ids) > BULK_MAX:
            raise forms.ValidationError("This confirmation names no dead letters it may decide.")
        return data
