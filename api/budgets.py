"""/api/v1/budgets/: what a namespace, an agent or a task tree may spend, set by staff."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from drf_spectacular.utils import OpenApiExample, OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.permissions import IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response

from api.base import ApiView, errors, principal_of, validated
from api.permissions import ApprovalDecider, StaffViewerOperator
from api.serializers import StrictCharField, StrictSerializer
from backplane.eventlog.chain import format_timestamp
from recovery import budgets, selectors
from recovery.models import (
    ApprovalStatus,
    ApprovalVerdict,
    Budget,
    BudgetAtLimit,
    BudgetPeriod,
    BudgetScope,
    BudgetUnit,
)


class BudgetIn(StrictSerializer):
    scope = serializers.ChoiceField(choices=BudgetScope.values)
    key = StrictCharField(max_length=320, min_length=1,
                          help_text="the namespace; `<namespace>/<agent>`; or a root task's id")
    period = serializers.ChoiceField(choices=BudgetPeriod.values)
    unit = serializers.ChoiceField(choices=BudgetUnit.values)
    currency = StrictCharField(max_length=3, required=False, help_text="with unit `currency`, e.g. USD")
    limit = serializers.DecimalField(max_digits=24, decimal_places=6, min_value=Decimal("0.000001"))
    at_limit = serializers.ChoiceField(choices=BudgetAtLimit.values, required=False, default=BudgetAtLimit.STOP,
                                       help_text="`stop` (default), or `ask`: ask `ask_group` whether to go on")
    ask_group = StrictCharField(max_length=150, required=False, help_text="with `at_limit` ask: a group's name")
    reason = StrictCharField(max_length=2000, min_length=1)


class ResumeIn(StrictSerializer):
    reason = StrictCharField(max_length=2000, min_length=1)


class BudgetAskOut(serializers.Serializer):
    status = serializers.ChoiceField(choices=ApprovalStatus.values)
    group = serializers.CharField()
    spend = serializers.CharField()
    asked_at = serializers.CharField()
    decided_by = serializers.CharField(allow_null=True)
    reason = serializers.CharField(allow_null=True)


class BudgetOut(serializers.Serializer):
    id = serializers.IntegerField()
    scope = serializers.ChoiceField(choices=BudgetScope.values)
    key = serializers.CharField()
    period = serializers.ChoiceField(choices=BudgetPeriod.values)
    unit = serializers.ChoiceField(choices=BudgetUnit.values)
    currency = serializers.CharField(allow_null=True)
    limit = serializers.CharField()
    spend = serializers.CharField()
    spent = serializers.BooleanField(help_text="true: leases, tool calls and model-call records are refused")
    at_limit = serializers.ChoiceField(choices=BudgetAtLimit.values)
    ask_group = serializers.CharField(allow_null=True)
    ask = BudgetAskOut(allow_null=True, help_text="this period's question to `ask_group`, once the limit was reached")


class BudgetListOut(serializers.Serializer):
    results = BudgetOut(many=True)


def budget_as_api_dict(state: selectors.BudgetState) -> dict[str, Any]:
    budget = state.budget
    ask = state.ask
    return {"id": budget.pk, "scope": budget.scope, "key": budget.key, "period": budget.period,
            "unit": budget.unit, "currency": budget.currency or None, "limit": str(budget.limit),
            "spend": str(state.spend), "spent": state.spent, "at_limit": budget.at_limit,
            "ask_group": budget.ask_group.name if budget.ask_group else None,
            "ask": None if ask is None else {
                "status": ask.status, "group": ask.group.name, "spend": format(ask.spend.normalize(), "f"),
                "asked_at": format_timestamp(ask.asked_at), "decided_by": ask.decided_by or None,
                "reason": ask.reason or None}}


class BudgetsView(ApiView):
    permission_classes = [IsAuthenticated, StaffViewerOperator]

    @extend_schema(
        operation_id="budgets_list",
        summary="Every budget with its spend this period",
        description="Staff only. Spend is read from the cost rollups, which always equal the sum of the events.",
        responses={200: BudgetListOut, **errors(403)},
    )
    def get(self, request: Request) -> Response:
        return Response({"results": [budget_as_api_dict(state) for state in selectors.budget_list()]})

    @extend_schema(
        operation_id="budgets_set",
        summary="Set a budget (create, raise or lower it)",
        description=(
            "Staff only; recorded as a decision with its reason. A namespace or agent budget is per UTC day, a "
            "task budget (key: a root task's id) is for the whole tree, sub-agents included. Reaching 80 % and "
            "95 % writes a `BudgetWarning` into the log of the task whose model call crossed, with an outbox "
            "message on `backplane.budgets`; reaching 100 % a `BudgetExceeded`, and from then on leases, new tool "
            "calls and model-call records of the scope are `409 budget_exceeded` until the limit is raised above "
            "the spend or the scope is resumed (`budgets_resume`). docs/costs.md says how far a scope can "
            "overshoot."
        ),
        request=BudgetIn,
        examples=[OpenApiExample("a namespace's day", request_only=True, value={
            "scope": "namespace", "key": "acme", "period": "day", "unit": "currency", "currency": "USD",
            "limit": "250.00", "reason": "the November plan"})],
        responses={200: BudgetOut, **errors(403, body=True)},
    )
    def post(self, request: Request) -> Response:
        by = principal_of(request).name
        data = validated(BudgetIn, request.data)
        budget = budgets.budget_set(scope=data["scope"], key=data["key"], period=data["period"], unit=data["unit"],
                                    limit=data["limit"], currency=data.get("currency", ""), decided_by=by,
                                    reason=data["reason"], at_limit=data["at_limit"],
                                    ask_group=data.get("ask_group"))
        return Response(budget_as_api_dict(selectors.budget_state(budget)))


class BudgetResumeView(ApiView):
    permission_classes = [IsAuthenticated, StaffViewerOperator]

    @extend_schema(
        operation_id="budgets_resume",
        summary="Let a spent scope go on for the rest of its period",
        description="Staff only; the limit stays as it is; recorded as a decision with its reason.",
        parameters=[OpenApiParameter("budget_id", int, OpenApiParameter.PATH, description="the budget's id")],
        request=ResumeIn,
        examples=[OpenApiExample("resume", request_only=True, value={"reason": "the launch needs the rest of today"})],
        responses={200: BudgetOut, **errors(403, 404, body=True)},
    )
    def post(self, request: Request, budget_id: int) -> Response:
        by = principal_of(request).name
        data = validated(ResumeIn, request.data)
        budget = budgets.budget_resume(budget_id=budget_id, decided_by=by, reason=data["reason"])
        return Response(budget_as_api_dict(selectors.budget_state(budget)))


def _ask_decision(verdict: str, operation_id: str, summary: str) -> type[ApiView]:
    class AskDecisionView(ApiView):
        permission_classes = [IsAuthenticated, ApprovalDecider]

        @extend_schema(
            operation_id=operation_id,
            summary=summary,
            description=(
                "A person signed in (a session; agents' tokens are `403`), a member of the group the spent budget "
                "asks, answers its question for this period with a reason: approving resumes the scope for the rest "
                "of the period (a `resume` decision), denying leaves it stopped (a `refuse` decision). Anyone else "
                "is `403`; a question answered already is `409 already_decided`; `404` when the budget asks "
                "nothing this period."
            ),
            parameters=[OpenApiParameter("budget_id", int, OpenApiParameter.PATH, description="the budget's id")],
            request=ResumeIn,
            examples=[OpenApiExample("answer", request_only=True, value={"reason": "the launch is worth it"})],
            responses={200: BudgetOut, **errors(403, 404, 409, conflicts=("already_decided",), body=True)},
        )
        def post(self, request: Request, budget_id: int) -> Response:
            data = validated(ResumeIn, request.data)
            budgets.budget_ask_decide(budget_id=budget_id, user=principal_of(request).user, verdict=verdict,
                                      reason=data["reason"])
            return Response(budget_as_api_dict(selectors.budget_state(
                Budget.objects.select_related("ask_group").get(pk=budget_id))))

    AskDecisionView.__name__ = AskDecisionView.__qualname__ = f"BudgetAsk{verdict.title()}View"
    return AskDecisionView


BudgetAskApproveView = _ask_decision(ApprovalVerdict.APPROVE, "budgets_ask_approve",
                                     "Let a spent budget's scope go on, as it asks")
BudgetAskDenyView = _ask_decision(ApprovalVerdict.DENY, "budgets_ask_deny", "Keep a spent budget's scope stopped")
