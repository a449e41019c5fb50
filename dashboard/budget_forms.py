"""The budgets page's forms: set a budget, resume a spent one.

They check what was typed (a choice, a number, a reason); what a budget may be (a task budget
is the tree's, a limit is positive, at most six places) is the service's to say, as it says it
to the API (recovery/budgets.py). Their messages are lower case without a full stop: the page
says them after "Not set: " or "Not resumed: "."""

from __future__ import annotations

from typing import Any

from django import forms

from dashboard.forms import RefusalForm
from recovery.models import BudgetPeriod, BudgetScope, BudgetUnit

REASON_REQUIRED = "a budget decision needs a reason"


def _choice(choices: list[tuple[str, str]], what: str) -> forms.ChoiceField:
    values = ", ".join(value for value, _ in choices)
    return forms.ChoiceField(choices=choices, error_messages={
        "required": f"choose the {what}", "invalid_choice": f"the {what} must be one of {values}"})


def _reason_field() -> forms.CharField:
    return forms.CharField(strip=True, error_messages={"required": REASON_REQUIRED})


class BudgetSetForm(RefusalForm):
    scope = _choice(BudgetScope.choices, "scope")
    key = forms.CharField(max_length=320, strip=True,
                          error_messages={"required": "a budget needs a key: a namespace, namespace/agent or a "
                                                      "root task id"})
    period = _choice(BudgetPeriod.choices, "period")
    unit = _choice(BudgetUnit.choices, "unit")
    currency = forms.CharField(required=False, max_length=3, strip=True)
    limit = forms.DecimalField(error_messages={"required": "the limit must be a number",
                                               "invalid": "the limit must be a number"})
    reason = _reason_field()

    def clean(self) -> dict[str, Any]:
        super().clean()
        data = self.cleaned_data
        # The page always sends its currency box; only a currency budget has a currency.
        data["currency"] = (data.get("currency") or "").upper() if data.get("unit") == BudgetUnit.CURRENCY else ""
        return data


class BudgetResumeForm(RefusalForm):
    reason = _reason_field()
