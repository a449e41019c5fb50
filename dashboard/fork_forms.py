"""The forms of forks and drift: fork a task after one of its events, compare it with another
task, and fork many from failure (which tasks, why, and the signed confirmation of a dry run)."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

from django import forms
from django.core import signing

from backplane.eventlog.forks import BULK_MAX_ITEMS

# The same bound as the API's (backplane/api/forks.py, which the dashboard does not import).
REASON_MAX_CHARS = 1000
REASON_REQUIRED = "Write a reason: it is recorded in the fork's log with your name."


def fork_reason_field(example: str) -> forms.CharField:
    return forms.CharField(max_length=REASON_MAX_CHARS, strip=True,
                           error_messages={"required": REASON_REQUIRED},
                           widget=forms.TextInput(attrs={"placeholder": example, "autocomplete": "off"}))


class ForkForm(forms.Form):
    """"Fork from here" on a task page. ``fork_id`` is drawn when the page is rendered, so the
    same form sent twice (a double click, a resent request) makes one fork."""

    at_seq = forms.IntegerField(min_value=1, max_value=2**31 - 1, label="After event",
                                error_messages={"required": "Choose the event the fork continues after."})
    reason = fork_reason_field("e.g. retry the mail with the fixed template")
    sandbox = forms.BooleanField(required=False, label="Sandbox")
    fork_id = forms.UUIDField(widget=forms.HiddenInput)


class CompareForm(forms.Form):
    other = forms.UUIDField(label="Task id", error_messages={"invalid": "enter a task id (a UUID).",
                                                             "required": "enter a task id (a UUID)."},
                            widget=forms.TextInput(attrs={"placeholder": "another task's id", "size": 20,
                                                          "autocomplete": "off"}))


class TaskIdListField(forms.Field):
    """Checked tasks' ids (checkboxes named ``ids``), in the order given, each once."""

    widget = forms.MultipleHiddenInput

    def to_python(self, value: Any) -> list[uuid.UUID]:
        if not value:
            return []
        try:
            ids = [uuid.UUID(str(item)) for item in value]
        except ValueError:
            raise forms.ValidationError("Tasks are named by their ids (UUIDs).") from None
        return list(dict.fromkeys(ids))


class BulkForkForm(forms.Form):
    """The task list's bulk bar: the checked tasks, or every task matching the list's filter
    (``query``, the filter as a query string), and why."""

    reason = fork_reason_field("e.g. the CRM is back; retry from before the failure")
    ids = TaskIdListField(required=False)
    all_matching = forms.BooleanField(required=False)
    query = forms.CharField(required=False, max_length=2000)

    def clean(self) -> dict[str, Any]:
        super().clean()
        data = self.cleaned_data
        if not data.get("all_matching") and not data.get("ids") and not self.errors:
            raise forms.ValidationError("Select some tasks, or all matching the filter.")
        if len(data.get("ids") or []) > BULK_MAX_ITEMS:
            raise forms.ValidationError(f"At most {BULK_MAX_ITEMS} tasks at once.")
        return data


BULK_SALT = "dashboard.forks.bulk"
# A dry run's confirmation is good for this long; after that the operator looks again.
BULK_CONFIRM_MAX_AGE = timedelta(hours=1)


def fork_bulk_token(*, ids: list[uuid.UUID], reason: str, user_id: int) -> str:
    """What the dry run showed, signed: the confirmation forks exactly those tasks, for that
    user, once. ``batch`` names this dry run: the service derives each fork's id from it, so
    the same confirmation sent again finds its forks instead of making more."""
    return signing.dumps({"ids": [task_id.hex for task_id in ids], "reason": reason, "user": user_id,
                          "batch": uuid.uuid4().hex}, salt=BULK_SALT, compress=True)


class BulkForkConfirmForm(forms.Form):
    # 1,000 ids are about 24,000 characters signed.
    token = forms.CharField(max_length=80_000)

    def __init__(self, *args: Any, user_id: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.user_id = user_id

    def clean_token(self) -> dict[str, Any]:
        try:
            data = signing.loads(self.cleaned_data["token"], salt=BULK_SALT, max_age=BULK_CONFIRM_MAX_AGE)
        except signing.SignatureExpired:
            raise forms.ValidationError("This dry run is more than an hour old; run it again.") from None
        except signing.BadSignature:
            raise forms.ValidationError("This confirmation was not made by a dry run here.") from None
        if data.get("user") != self.user_id:
            raise forms.ValidationError("This dry run was made by someone else; run your own.")
        ids = data.get("ids")
        if not isinstance(ids, list) or len(ids) > BULK_MAX_ITEMS or not isinstance(data.get("batch"), str):
            raise forms.ValidationError("This confirmation names no tasks it may fork.")
        try:
            data["ids"] = [uuid.UUID(hex=task_id) for task_id in ids]
        except (AttributeError, TypeError, ValueError):
            raise forms.ValidationError("This confirmation names no tasks it may fork.") from None
        return dict(data)
