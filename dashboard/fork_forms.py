"""The forms of forks and drift: fork a task after one of its events, compare it with another
task, and fork many from failure (which tasks and why: a draft bulk job)."""

from __future__ import annotations

import uuid
from typing import Any

from django import forms

from dashboard.forms import BulkSelectionForm

# The same bound as the API's (api/forks.py, which the dashboard does not import).
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


class ForkJobForm(BulkSelectionForm):
    """The task list's bulk bar: the checked tasks, or every task matching the list's filter,
    and why: a draft fork-from-failure job."""

    nothing_selected = "Select some tasks, or all matching the filter."

    reason = fork_reason_field("e.g. the CRM is back; retry from before the failure")
    ids = TaskIdListField(required=False)
