"""The Approvals page's form: a decision's reason. Whether this person may decide this request
is the service's to say (recovery/approvals.py), as it says it to the API."""

from __future__ import annotations

from django import forms

from dashboard.forms import RefusalForm


class ApprovalDecisionForm(RefusalForm):
    reason = forms.CharField(max_length=2000, strip=True,
                             error_messages={"required": "a decision needs a reason",
                                             "max_length": "a reason of at most 2,000 characters"})
