"""Cancel a task and pause work from the dashboard: the same services, and refusals, as the API.

Thin: check the form (dashboard/fleet_forms.py), call one service in recovery/fleet.py, say what happened, redirect."""

from __future__ import annotations

import uuid
from typing import Any

from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import path
from django.views.decorators.http import require_GET, require_POST

from backplane.eventlog.models import user_actor
from dashboard.access import namespace_of
from dashboard.fleet_forms import PauseResumeForm, PauseSetForm, TaskCancelForm
from dashboard.views.common import across_namespaces, form_action, operators_only, viewers_only
from recovery import fleet
from recovery.selectors import pauses_in_force, pauses_recently_lifted

NAV = "pauses"


@require_POST
@operators_only("Cancelling a task")
def task_cancel_view(request: HttpRequest, task_id: uuid.UUID) -> HttpResponse:
    def cancel(data: dict[str, Any]) -> str:
        task = fleet.task_cancel(namespace=namespace_of(request.user), task_id=task_id,
                                 cancelled_by=user_actor(request.user), reason=data["reason"],
                                 compensate=data["compensate"])
        if task.status == "compensating":
            return "Cancelled; its side effects are being undone (compensating)."
        return "Cancelled: its lease holder's next write is refused."

    return form_action(request, TaskCancelForm(request.POST), cancel, refused="Not cancelled",
                       back=redirect("dashboard:task", task_id=task_id))


@require_GET
@viewers_only
@across_namespaces
def pauses_page(request: HttpRequest) -> HttpResponse:
    return render(request, "dashboard/pauses.html", {
        "nav": NAV, "in_force": pauses_in_force(), "lifted": pauses_recently_lifted(),
        "namespace": request.GET.get("namespace", ""), "kind": request.GET.get("kind", ""),
    })


@require_POST
@operators_only("Pausing work")
@across_namespaces
def pause_set_view(request: HttpRequest) -> HttpResponse:
    def pause(data: dict[str, Any]) -> str:
        made = fleet.pause_set(namespace=data["namespace"], kind=data["kind"], paused_by=user_actor(request.user),
                               reason=data["reason"])
        scope = f"kind {made.kind} of {made.namespace}" if made.kind else f"all of {made.namespace}"
        return f"Paused {scope}: claims pass over it until it is resumed."

    return form_action(request, PauseSetForm(request.POST), pause, refused="Not paused",
                       back=redirect("dashboard:pauses"))


@require_POST
@operators_only("Resuming work")
@across_namespaces
def pause_resume_view(request: HttpRequest, pause_id: int) -> HttpResponse:
    def resume(data: dict[str, Any]) -> str:
        lifted = fleet.pause_lift(pause_id=pause_id, resumed_by=user_actor(request.user), reason=data["reason"])
        return f"Resumed: {lifted.namespace}/{lifted.kind or '*'} is claimed again."

    return form_action(request, PauseResumeForm(request.POST), resume, refused="Not resumed",
                       back=redirect("dashboard:pauses"))


urlpatterns = [
    path("", pauses_page, name="pauses"),
    path("set/", pause_set_view, name="pause-set"),
    path("<int:pause_id>/resume/", pause_resume_view, name="pause-resume"),
]
