"""The agents-and-tools page (with each agent's model spend of the last 24 h) and the outbox
page; reviewers may reset a circuit breaker."""

from __future__ import annotations

from collections.abc import Callable

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_GET, require_POST

from backplane.eventlog.models import Agent, user_actor
from backplane.runtime.replica import replica_reads
from dashboard.access import may_review
from dashboard.selectors.outbox import cdc_relay_state, delivery_lag_per_minute, outbox_health
from dashboard.selectors.spend import agent_spend
from dashboard.views.common import across_namespaces, reviewers_only, viewers_only
from recovery import selectors as recovery
from recovery.breakers import breaker_reset
from recovery.gateway import tool_breaker_reset
from recovery.models import Tool


@require_GET
@viewers_only
@replica_reads
@across_namespaces
def agents_page(request: HttpRequest) -> HttpResponse:
    agents = recovery.agents_overview()
    spend = agent_spend()
    return render(
        request,
        "dashboard/fleet/agents.html",
        {"nav": "agents", "agents": [(row, spend.of(row.agent.namespace, row.agent.name)) for row in agents],
         "spend_others": spend.others(row.agent for row in agents),
         "tools": recovery.tools_overview(), "may_review": may_review(request.user),
         "max_agents": recovery.FLEET_MAX_AGENTS},
    )


def _close_breaker(request: HttpRequest, label: str, close: Callable[..., object], pk: int) -> HttpResponse:
    reason = (request.POST.get("reason") or "").strip()
    if not reason:
        messages.error(request, "Give a reason: it is recorded with the reset.")
    else:
        close(pk, decided_by=user_actor(request.user), reason=reason)
        messages.success(request, f"The breaker of {label} is closed.")
    return redirect("dashboard:agents")


@require_POST
@reviewers_only("Closing a circuit breaker")
@across_namespaces
def agent_breaker_reset(request: HttpRequest, agent_id: int) -> HttpResponse:
    agent = get_object_or_404(Agent, pk=agent_id)
    return _close_breaker(request, str(agent), lambda pk, **kw: breaker_reset(agent_id=pk, **kw), agent.pk)


@require_POST
@reviewers_only("Closing a circuit breaker")
@across_namespaces
def tool_breaker_reset_view(request: HttpRequest, tool_id: int) -> HttpResponse:
    tool = get_object_or_404(Tool, pk=tool_id)
    return _close_breaker(request, f"tool {tool.name}", lambda pk, **kw: tool_breaker_reset(tool_id=pk, **kw),
                          tool.pk)


@require_GET
@viewers_only
@replica_reads
@across_namespaces
def outbox_page(request: HttpRequest) -> HttpResponse:
    return render(
        request,
        "dashboard/fleet/outbox.html",
        {"nav": "outbox", "health": outbox_health(), "lag": delivery_lag_per_minute(), "cdc": cdc_relay_state()},
    )
