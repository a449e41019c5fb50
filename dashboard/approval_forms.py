"""The Approvals page's forms: a decision's reason, and a signal's payload. Whether this person
may decide this request is the service's to say (recovery/approvals.py), as it says it to the API."""

from __future__ import annotations

import json
from typing import Any

from django import forms

from dashboard.forms import RefusalForm


class ApprovalDecisionForm(RefusalForm):
    reason = forms.CharField(max_length=2000, strip=True,
                             error_messages={"required": "a decision needs a reason",
                                             "max_length": "a reason of at most 2,000 characters"})


class SignalPayloadForm(RefusalForm):
    """The payload an operator sends a waiting task: a JSON object, as the API takes it."""

    payload = forms.CharField(max_length=20000, strip=True,
                              error_messages={"required": "a signal needs a payload (a JSON object; {} for none)",
                                              "max_length": "a payload of at most 20,000 characters"})

    def clean_payload(self) -> dict[str, Any]:
        try:
            value = json.loads(self.cleaned_data["payload"])
        except ValueError:
            raise forms.ValidationError("the payload is not JSON") from None
        if not isinstance(value, dict):
            raise forms.ValidationError("the payload must be a JSON object")
        return value
