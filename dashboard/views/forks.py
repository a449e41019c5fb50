"""Forks and drift in the dashboard: fork a task after one of its events, compare two tasks'
histories side by side, and fork many tasks from just before their failure.

Operators fork (staff with ``recovery.operate_backplane``; over the API too), in any namespace or
the one they are scoped to; the fork's log records who as ``user:<username>``, with ``by_staff``. Writes go through
``backplane.eventlog.forks``; a refusal (a sandbox forked into production, an event that is not
there) is shown on the page with the contract's message, and nothing is written.

Many at once is a bulk job (recovery/bulk.py), the one way to act in bulk, and so for reviewers
only (staff with ``backplane.review_deadletter``): the task list's bulk bar makes a draft job,
whose page shows the dry run and starts exactly that list; the worker forks it in chunks.
"""

from __future__ import annotations

import uuid
from typing import Any

from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse, QueryDict
from django.shortcuts import redirect, render
from django.urls import path, reverse
from django.views.decorators.http import require_GET, require_POST

from backplane.eventlog import forks
from backplane.eventlog.errors import BackplaneError, NotFound, TaskExists
from backplane.eventlog.models import Task, user_actor
from dashboard.fork_forms import CompareForm, ForkForm, ForkJobForm
from dashboard.forms import TaskFilterForm
from dashboard.selectors.diff import drift_page
from dashboard.views.common import across_namespaces, int_param, operators_only, reviewers_only, viewers_only
from dashboard.views.pages import render_task_page, scoped_task
from recovery import bulk
from recovery.models import BulkAction

NAV = "tasks"


def forked_by(request: HttpRequest) -> str:
    """Who forked, as the API names a staff session (api/authentication.py)."""
    return user_actor(request.user)


# --- one fork ------------------------------------------------------------------------------------


@require_POST
@operators_only("Forking a task")
def task_fork(request: HttpRequest, task_id: uuid.UUID) -> HttpResponse:
    """"Fork from here": a new task continues this one's history after event ``at_seq``; on
    success, the fork's page."""
    task = scoped_task(request, task_id)
    form = ForkForm(request.POST)
    if not form.is_valid():
        return render_task_page(request, task, fork_form=form, status=400)
    data = form.cleaned_data
    try:
        outcome = forks.task_fork(
            namespace=None, source_task_id=task.pk, at_seq=data["at_seq"], reason=data["reason"],
            forked_by=forked_by(request), by_staff=True, task_id=data["fork_id"], sandbox=data["sandbox"],
        )
    except TaskExists:
        # This form's id made another fork already (sent, then changed and sent again after
        # going back): it gets a new id, and the person decides again.
        renewed = request.POST.copy()
        renewed["fork_id"] = str(uuid.uuid4())
        form = ForkForm(renewed)
        form.is_valid()
        return render_task_page(
            request, task, fork_form=form, status=409,
            fork_error="This form already made another fork, so nothing was written. Check the values and "
                       "fork again to make a new one.")
    except BackplaneError as exc:
        return render_task_page(request, task, fork_form=form, status=exc.status,
                                fork_error=f"Refused, nothing was written: {exc.message}.")
    fork = outcome.task
    what = "sandbox" if fork.sandbox else "fork"
    if outcome.created:
        messages.success(request, f"New {what} of {task.kind} {str(task.pk)[:8]}, after its event {data['at_seq']}.")
    else:
        messages.info(request, f"This {what} was made already by the same form; here it is.")
    return redirect("dashboard:task", task_id=fork.pk)


@require_GET
@viewers_only
def task_compare(request: HttpRequest, task_id: uuid.UUID) -> HttpResponse:
    """The task page's "compare with task id" form: the diff of this task (a) with that one (b)."""
    task = scoped_task(request, task_id)
    form = CompareForm(request.GET, auto_id="compare_%s")
    if not form.is_valid():
        messages.error(request, "Not compared: " + " ".join(str(error) for error in form.errors.get("other", [])))
        return redirect("dashboard:task", task_id=task.pk)
    other = form.cleaned_data["other"]
    if not Task.objects.filter(pk=other).exists():
        messages.error(request, f"Not compared: no task has the id {other}.")
        return redirect("dashboard:task", task_id=task.pk)
    return redirect(reverse("dashboard:task-diff", args=[task.pk, other]) + "#first-divergence")


# --- the diff ------------------------------------------------------------------------------------


def _expand_param(request: HttpRequest) -> tuple[int, int] | None:
    """``?expand=START-END``: the folded same events to show, pairs START..END-1."""
    raw = request.GET.get("expand", "")
    start, _, end = raw.partition("-")
    if not (start.isdigit() and end.isdigit()) or int(end) <= int(start):
        return None
    return int(start), int(end)


@require_GET
@viewers_only
def task_diff(request: HttpRequest, task_id: uuid.UUID, other_id: uuid.UUID) -> HttpResponse:
    """Two histories side by side as ``tasks_drift`` aligns them (a is ``task_id``)."""
    expand = _expand_param(request)
    try:
        drift = drift_page(a_id=scoped_task(request, task_id).pk, b_id=scoped_task(request, other_id).pk,
                                     page=int_param(request, "page"), expand=expand)
    except NotFound:
        raise Http404("no such task") from None
    return render(request, "dashboard/forks/diff.html", {
        "drift": drift, "expand": f"{expand[0]}-{expand[1]}" if expand else "", "nav": NAV,
        "related": drift.b.forked_from_id == drift.a.pk or drift.a.forked_from_id == drift.b.pk,
    })


# --- many at once: fork from failure, as a job -----------------------------------------------------


@require_POST
@reviewers_only("Bulk forks")
@across_namespaces
def fork_from_failure_job(request: HttpRequest) -> HttpResponse:
    """The task list's bulk bar makes a draft fork-from-failure job (``bulk_job_plan``: the dry
    run, which freezes the checked tasks or every task matching the filter, each with where
    its fork will continue or why it is skipped) and shows its page, where a reviewer starts
    exactly that list. Nothing is forked here."""
    form = ForkJobForm(request.POST)
    query = request.POST.get("query", "")
    if not form.is_valid():
        return _not_planned(request, form, query)
    data = form.cleaned_data
    selection: dict[str, Any]
    if data["all_matching"]:
        filters_form = TaskFilterForm(QueryDict(data["query"]))
        if not filters_form.is_valid():
            return _not_planned(request, form, query, message="The list's filter is not valid; filter again.")
        selection = {"filter": filters_form.filters().as_json()}
    else:
        selection = {"ids": [str(task_id) for task_id in data["ids"]]}
    try:
        job = bulk.bulk_job_plan(action=BulkAction.FORK_FROM_FAILURE, selection=selection, reason=data["reason"],
                                 created_by=forked_by(request))
    except BackplaneError as exc:
        return _not_planned(request, form, query, status=exc.status, message=f"Nothing was planned: {exc.message}.")
    return redirect("dashboard:job", job_id=job.pk)


def _not_planned(request: HttpRequest, form: ForkJobForm, query: str, *, status: int = 400,
                 message: str = "") -> HttpResponse:
    return render(request, "dashboard/forks/bulk.html", {"nav": NAV, "form": form, "query": query,
                                                        "message": message}, status=status)


urlpatterns = [
    path("fork-from-failure/", fork_from_failure_job, name="tasks-fork-bulk"),
    path("<uuid:task_id>/fork/", task_fork, name="task-fork"),
    path("<uuid:task_id>/compare/", task_compare, name="task-compare"),
    path("<uuid:task_id>/diff/<uuid:other_id>/", task_diff, name="task-diff"),
]
