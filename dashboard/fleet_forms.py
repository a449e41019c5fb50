"""The forms of fleet operations: cancel a task, pause work, resume it.

They check what was typed (strings without U+0000, within bounds; a reason); what may be
paused or cancelled is the service's to say, as it says it to the API (recovery/fleet.py). A
refusal is one line the page says after "Not paused: " and the like."""

from __future__ import annotations

from django import forms

from dashboard.forms import RefusalForm

REASON_REQUIRED = "a reason is required"  # recovery/fleet.py's words to the API


def _reason_field() -> forms.CharField:
    return forms.CharField(max_length=1000, strip=True, error_messages={"required": REASON_REQUIRED})


class TaskCancelForm(RefusalForm):
    reason = _reason_field()
    compensate = forms.BooleanField(required=False)


class PauseSetForm(RefusalForm):
    # Blank or malformed names are the service's to refuse, in the API's words.
    namespace = forms.CharField(required=False, max_length=100, strip=True)
    kind = forms.CharField(required=False, max_length=100, strip=True)
    reason = _reason_field()


class PauseResumeForm(RefusalForm):
    reason = _reason_field()
