"""The Approvals page: gated tool calls waiting for people, and their decisions; tasks waiting for
a signal, which an operator may send (docs/approvals.md)."""

from __future__ import annotations

import uuid
from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.template.loader import render_to_string
from django.urls import path
from django.views.decorators.http import require_GET, require_POST

from backplane.eventlog.models import user_actor
from dashboard.approval_forms import ApprovalDecisionForm, SignalPayloadForm
from dashboard.selectors.approvals import approvals_recently_decided, approvals_waiting, signals_waiting
from dashboard.views.common import across_namespaces, form_action, operators_only, viewers_only
from recovery import approvals, signals
from recovery.models import OPERATE_PERMISSION, ApprovalVerdict

NAV = "approvals"


@require_GET
@viewers_only
@across_namespaces
def approvals_page(request: HttpRequest) -> HttpResponse:
    """The waiting requests and the last decisions (``?partial=waiting``: the page script's read of
    the waiting ones, rendered by the same template)."""
    groups = set(request.user.groups.values_list("pk", flat=True))
    context = {"nav": NAV, "waiting": approvals_waiting(), "groups": groups, "signals": signals_waiting(),
               "may_send": request.user.has_perm(OPERATE_PERMISSION)}
    if request.GET.get("partial") == "waiting":
        return JsonResponse({"waiting": render_to_string("dashboard/approvals/_waiting.html", context,
                                                         request=request),
                             "signals": render_to_string("dashboard/approvals/_signals.html", context,
                                                         request=request)})
    return render(request, "dashboard/approvals/page.html", {**context, "decided": approvals_recently_decided()})


@require_POST
@viewers_only
@across_namespaces
def approval_approve(request: HttpRequest, approval_id: uuid.UUID) -> HttpResponse:
    return _decide(request, approval_id, ApprovalVerdict.APPROVE)


@require_POST
@viewers_only
@across_namespaces
def approval_deny(request: HttpRequest, approval_id: uuid.UUID) -> HttpResponse:
    return _decide(request, approval_id, ApprovalVerdict.DENY)


def _decide(request: HttpRequest, approval_id: uuid.UUID, verdict: str) -> HttpResponse:
    """One person's decision, with the same service and refusals as the API's (who may decide
    a request is the service's check: the group it asks, four eyes)."""
    def decide(data: dict[str, Any]) -> str:
        decided = approvals.approval_decide(approval_id=approval_id, user=request.user, verdict=verdict,
                                            reason=data["reason"])
        what = {"granted": "Granted", "denied": "Denied"}.get(decided.status, "Approval recorded; more are needed")
        return f"{what}: {decided.tool} at step {decided.step} of task {decided.task_id}."

    return form_action(request, ApprovalDecisionForm(request.POST), decide, refused="Not decided",
                       back=redirect("dashboard:approvals"))


@require_POST
@operators_only("send a task a signal")
@across_namespaces
def signal_send(request: HttpRequest, task_id: uuid.UUID, name: str) -> HttpResponse:
    """An operator sends a waiting task its signal, with the API's service and refusals; the
    payload is recorded in the task's chain as sent by this person."""
    def send(data: dict[str, Any]) -> str:
        signals.signal_send(namespace=None, task_id=task_id, name=name, payload=data["payload"],
                            sent_by=user_actor(request.user))
        return f"Sent: {name} to task {task_id}."

    return form_action(request, SignalPayloadForm(request.POST), send, refused="Not sent",
                       back=redirect("dashboard:approvals"))


urlpatterns = [
    path("", approvals_page, name="approvals"),
    path("<uuid:approval_id>/approve/", approval_approve, name="approval-approve"),
    path("<uuid:approval_id>/deny/", approval_deny, name="approval-deny"),
    path("signals/<uuid:task_id>/<slug:name>/", signal_send, name="signal-send"),
]
