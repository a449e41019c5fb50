"""Cancel a task and pause work from the dashboard: the same services, and refusals, as the API.

Thin: check the form (dashboard/fleet_forms.py), call one service in recovery/fleet.py, say what happened, redirect."""

from __future__ import annotations

import uuid

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import path
from django.views.decorators.http import require_GET, require_POST

from backplane.eventlog.errors import BackplaneError
from backplane.eventlog.models import user_actor
from dashboard.access import namespace_of
from dashboard.fleet_forms import PauseResumeForm, PauseSetForm, TaskCancelForm
from dashboard.views.common import across_namespaces, operators_only, viewers_only
from recovery import fleet
from recovery.selectors import pauses_in_force, pauses_recently_lifted

NAV = "pauses"


@require_POST
@operators_only("Cancelling a task")
def task_cancel_view(request: HttpRequest, task_id: uuid.UUID) -> HttpResponse:
    form = TaskCancelForm(request.POST)
    if not form.is_valid():
        messages.error(request, f"Not cancelled: {form.refusal()}.")
        return redirect("dashboard:task", task_id=task_id)
    try:
        task = fleet.task_cancel(namespace=namespace_of(request.user), task_id=task_id,
                                 cancelled_by=user_actor(request.user), reason=form.cleaned_data["reason"],
                                 compensate=form.cleaned_data["compensate"])
    except BackplaneError as exc:
        messages.error(request, f"Not cancelled: {exc.message}.")
        return redirect("dashboard:task", task_id=task_id)
    if task.status == "compensating":
        messages.success(request, "Cancelled; its side effects are being undone (compensating).")
    else:
        messages.success(request, "Cancelled: its lease holder's next write is refused.")
    return redirect("dashboard:task", task_id=task_id)


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
    form = PauseSetForm(request.POST)
    if not form.is_valid():
        messages.error(request, f"Not paused: {form.refusal()}.")
        return redirect("dashboard:pauses")
    data = form.cleaned_data
    try:
        pause = fleet.pause_set(namespace=data["namespace"], kind=data["kind"], paused_by=user_actor(request.user),
                                reason=data["reason"])
    except BackplaneError as exc:
        messages.error(request, f"Not paused: {exc.message}.")
        return redirect("dashboard:pauses")
    scope = f"kind {pause.kind} of {pause.namespace}" if pause.kind else f"all of {pause.namespace}"
    messages.success(request, f"Paused {scope}: claims pass over it until it is resumed.")
    return redirect("dashboard:pauses")


@require_POST
@operators_only("Resuming work")
@across_namespaces
def pause_resume_view(request: HttpRequest, pause_id: int) -> HttpResponse:
    form = PauseResumeForm(request.POST)
    if not form.is_valid():
        messages.error(request, f"Not resumed: {form.refusal()}.")
        return redirect("dashboard:pauses")
    try:
        pause = fleet.pause_lift(pause_id=pause_id, resumed_by=user_actor(request.user),
                                 reason=form.cleaned_data["reason"])
    except BackplaneError as exc:
        messages.error(request, f"Not resumed: {exc.message}.")
        return redirect("dashboard:pauses")
    messages.success(request, f"Resumed: {pause.namespace}/{pause.kind or '*'} is claimed again.")
    return redirect("dashboard:pauses")


urlpatterns = [
    path("", pauses_page, name="pauses"),
    path("set/", pause_set_view, name="pause-set"),
    path("<int:pause_id>/resume/", pause_resume_view, name="pause-resume"),
]
