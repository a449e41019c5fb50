"""The budgets page: every budget's spend against its limit, and people's decisions on them."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import path
from django.views.decorators.http import require_GET, require_POST

from backplane.eventlog.costs import decimal_text
from backplane.eventlog.models import user_actor
from dashboard.budget_forms import BudgetResumeForm, BudgetSetForm
from dashboard.views.common import across_namespaces, form_action, operators_only, viewers_only
from recovery import budgets
from recovery.models import ApprovalVerdict, BudgetPeriod, BudgetScope, BudgetUnit
from recovery.selectors import budget_decisions_recent, budget_list

NAV = "budgets"
RECENT_DECISIONS = 20


@require_GET
@viewers_only
@across_namespaces
def budgets_page(request: HttpRequest) -> HttpResponse:
    rows = [{"state": state, "share": min(100, int(state.spend * 100 / state.budget.limit)),
             "spend": decimal_text(state.spend), "limit": decimal_text(state.budget.limit)} for state in budget_list()]
    return render(request, "dashboard/budgets.html", {
        "nav": NAV, "rows": rows, "decisions": budget_decisions_recent(limit=RECENT_DECISIONS),
        "groups": set(request.user.groups.values_list("pk", flat=True)),
        "scopes": BudgetScope.choices, "periods": BudgetPeriod.choices, "units": BudgetUnit.choices,
    })


@require_POST
@operators_only("Setting a budget")
@across_namespaces
def budget_set_view(request: HttpRequest) -> HttpResponse:
    """Set a budget from the page's form: the same service, and the same refusals, as the API.
    A refusal is said on the page the browser comes back to; nothing is written."""
    def set_budget(data: dict[str, Any]) -> str:
        budget = budgets.budget_set(scope=data["scope"], key=data["key"], period=data["period"], unit=data["unit"],
                                    limit=data["limit"], currency=data["currency"],
                                    decided_by=user_actor(request.user), reason=data["reason"])
        return f"Budget set: {budget}."

    return form_action(request, BudgetSetForm(request.POST), set_budget, refused="Not set",
                       back=redirect("dashboard:budgets"))


@require_POST
@operators_only("Resuming a budget")
@across_namespaces
def budget_resume_view(request: HttpRequest, budget_id: int) -> HttpResponse:
    def resume(data: dict[str, Any]) -> str:
        budget = budgets.budget_resume(budget_id=budget_id, decided_by=user_actor(request.user), reason=data["reason"])
        return f"Resumed for the rest of its period: {budget}."

    return form_action(request, BudgetResumeForm(request.POST), resume, refused="Not resumed",
                       back=redirect("dashboard:budgets"))


@require_POST
@viewers_only
@across_namespaces
def budget_ask_approve(request: HttpRequest, budget_id: int) -> HttpResponse:
    return _answer_ask(request, budget_id, ApprovalVerdict.APPROVE)


@require_POST
@viewers_only
@across_namespaces
def budget_ask_deny(request: HttpRequest, budget_id: int) -> HttpResponse:
    return _answer_ask(request, budget_id, ApprovalVerdict.DENY)


def _answer_ask(request: HttpRequest, budget_id: int, verdict: str) -> HttpResponse:
    """A spent budget's question answered by a member of its group (the service's check)."""
    def answer(data: dict[str, Any]) -> str:
        ask = budgets.budget_ask_decide(budget_id=budget_id, user=request.user, verdict=verdict, reason=data["reason"])
        done = "goes on for the rest of its period" if ask.status == "granted" else "stays stopped"
        return f"{ask.budget}: {done}."

    return form_action(request, BudgetResumeForm(request.POST), answer, refused="Not answered",
                       back=redirect("dashboard:budgets"))


urlpatterns = [
    path("", budgets_page, name="budgets"),
    path("set/", budget_set_view, name="budget-set"),
    path("<int:budget_id>/resume/", budget_resume_view, name="budget-resume"),
    path("<int:budget_id>/ask/approve/", budget_ask_approve, name="budget-ask-approve"),
    path("<int:budget_id>/ask/deny/", budget_ask_deny, name="budget-ask-deny"),
]
