"""The budgets page: every budget's spend against its limit, and people's decisions on them."""

from __future__ import annotations

from decimal import Decimal, InvalidOperation

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import path
from django.views.decorators.http import require_GET, require_POST

from backplane.eventlog.costs import decimal_text
from backplane.eventlog.errors import BackplaneError
from backplane.eventlog.models import user_actor
from dashboard.views.common import across_namespaces, operators_only, viewers_only
from recovery import budgets
from recovery.models import Budget, BudgetDecision, BudgetPeriod, BudgetScope, BudgetUnit

NAV = "budgets"
RECENT_DECISIONS = 20


@require_GET
@viewers_only
@across_namespaces
def budgets_page(request: HttpRequest) -> HttpResponse:
    states = [budgets.budget_state(budget) for budget in Budget.objects.order_by("scope", "key", "pk")]
    rows = [{"state": state, "share": min(100, int(state.spend * 100 / state.budget.limit)),
             "spend": decimal_text(state.spend), "limit": decimal_text(state.budget.limit)} for state in states]
    decisions = BudgetDecision.objects.select_related("budget").order_by("-at")[:RECENT_DECISIONS]
    return render(request, "dashboard/budgets.html", {
        "nav": NAV, "rows": rows, "decisions": decisions, "scopes": BudgetScope.choices,
        "periods": BudgetPeriod.choices, "units": BudgetUnit.choices,
    })


@require_POST
@operators_only("Setting a budget")
@across_namespaces
def budget_set_view(request: HttpRequest) -> HttpResponse:
    """Set a budget from the page's form: the same service, and the same refusals, as the API."""
    form = request.POST
    try:
        limit = Decimal(form.get("limit", ""))
    except InvalidOperation:
        messages.error(request, "Not set: the limit must be a number.")
        return redirect("dashboard:budgets")
    try:
        budget = budgets.budget_set(scope=form.get("scope", ""), key=form.get("key", "").strip(),
                                    period=form.get("period", ""), unit=form.get("unit", ""), limit=limit,
                                    currency=form.get("currency", "").strip().upper()
                                    if form.get("unit") == BudgetUnit.CURRENCY else "",
                                    decided_by=user_actor(request.user), reason=form.get("reason", ""))
    except BackplaneError as exc:
        messages.error(request, f"Not set: {exc.message}.")
        return redirect("dashboard:budgets")
    messages.success(request, f"Budget set: {budget}.")
    return redirect("dashboard:budgets")


@require_POST
@operators_only("Resuming a budget")
@across_namespaces
def budget_resume_view(request: HttpRequest, budget_id: int) -> HttpResponse:
    try:
        budget = budgets.budget_resume(budget_id=budget_id, decided_by=user_actor(request.user),
                                       reason=request.POST.get("reason", ""))
    except BackplaneError as exc:
        messages.error(request, f"Not resumed: {exc.message}.")
        return redirect("dashboard:budgets")
    messages.success(request, f"Resumed for the rest of its period: {budget}.")
    return redirect("dashboard:budgets")


urlpatterns = [
    path("", budgets_page, name="budgets"),
    path("set/", budget_set_view, name="budget-set"),
    path("<int:budget_id>/resume/", budget_resume_view, name="budget-resume"),
]
