"""The agents-and-tools page and the outbox page; reviewers may reset a circuit breaker."""

from __future__ import annotations

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_GET, require_POST

from backplane.eventlog.models import Agent
from dashboard import selectors
from dashboard.views.common import staff_only
from recovery import selectors as recovery
from recovery.breakers import breaker_reset
from recovery.gateway import tool_breaker_reset
from recovery.models import Tool

REVIEW_PERMISSION = "backplane.review_deadletter"


def may_review(request: HttpRequest) -> bool:
    return request.user.has_perm(REVIEW_PERMISSION)


@require_GET
@staff_only
def agents_page(request: HttpRequest) -> HttpResponse:
    return render(
        request,
        "dashboard/fleet/agents.html",
        {"nav": "agents", "agents": recovery.agents_overview(), "tools": recovery.tools_overview(),
         "may_review": may_review(request), "max_agents": recovery.FLEET_MAX_AGENTS},
    )


def _reason(request: HttpRequest) -> str | None:
    reason = (request.POST.get("reason") or "").strip()
    if not reason:
        messages.error(request, "Give a reason: it is recorded with the reset.")
        return None
    return reason


@require_POST
@staff_only
def agent_breaker_reset(request: HttpRequest, agent_id: int) -> HttpResponse:
    if not may_review(request):
        return render(request, "dashboard/forbidden.html", status=403)
    agent = get_object_or_404(Agent, pk=agent_id)
    reason = _reason(request)
    if reason is not None:
        breaker_reset(agent_id=agent.pk, decided_by=f"user:{request.user.get_username()}", reason=reason)
        messages.success(request, f"The breaker of {agent} is closed.")
    return redirect("dashboard:agents")


@require_POST
@staff_only
def tool_breaker_reset_view(request: HttpRequest, tool_id: int) -> HttpResponse:
    if not may_review(request):
        return render(request, "dashboard/forbidden.html", status=403)
    tool = get_object_or_404(Tool, pk=tool_id)
    reason = _reason(request)
    if reason is not None:
        tool_breaker_reset(tool_id=tool.pk, decided_by=f"user:{request.user.get_username()}", reason=reason)
        messages.success(request, f"The breaker of tool {tool.name} is closed.")
    return redirect("dashboard:agents")


@require_GET
@staff_only
def outbox_page(request: HttpRequest) -> HttpResponse:
    return render(
        request,
        "dashboard/fleet/outbox.html",
        {"nav": "outbox", "health": selectors.outbox_health(), "lag": selectors.delivery_lag_per_minute()},
    )
