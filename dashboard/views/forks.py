"""Forks and drift in the dashboard: fork a task after one of its events, compare two tasks'
histories side by side, and fork many tasks from just before their failure.

Every logged-in staff user may fork, in any namespace (staff sessions may over the API too); the
fork's log records who as ``user:<username>``, with ``by_staff``. Writes go through
``backplane.eventlog.forks``; a refusal (a sandbox forked into production, an event that is not
there) is shown on the page with the contract's message, and nothing is written.

Many at once is two steps, as for dead letters: a dry run (how many, a sample with the event
each fork continues after, the skipped ones and why), signed so that the confirmation forks
exactly what was shown and only once, then the confirmation, reported per task.
"""

from __future__ import annotations

import uuid
from collections import Counter
from typing import Any

from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse, QueryDict
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import path, reverse
from django.views.decorators.http import require_GET, require_POST

from backplane.eventlog import forks
from backplane.eventlog.errors import BackplaneError, NotFound, TaskExists
from backplane.eventlog.models import Task, user_actor
from backplane.eventlog.selectors import task_ids_matching
from dashboard import selectors
from dashboard.fork_forms import BulkForkConfirmForm, BulkForkForm, CompareForm, ForkForm, fork_bulk_token
from dashboard.forms import TaskFilterForm
from dashboard.views.common import int_param, staff_only
from dashboard.views.pages import render_task_page

NAV = "tasks"
# How many tasks of a dry run are listed, of those that will be forked and of those skipped.
SAMPLE_SIZE = 25


def forked_by(request: HttpRequest) -> str:
    """Who forked, as the API names a staff session (backplane/api/authentication.py)."""
    return user_actor(request.user)


def _user_id(request: HttpRequest) -> int:
    user_id = request.user.pk
    assert user_id is not None, "staff_only lets in signed-in users only"
    return int(user_id)


# --- one fork ------------------------------------------------------------------------------------


@require_POST
@staff_only
def task_fork(request: HttpRequest, task_id: uuid.UUID) -> HttpResponse:
    """"Fork from here": a new task continues this one's history after event ``at_seq``; on
    success, the fork's page."""
    task = get_object_or_404(Task, pk=task_id)
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
@staff_only
def task_compare(request: HttpRequest, task_id: uuid.UUID) -> HttpResponse:
    """The task page's "compare with task id" form: the diff of this task (a) with that one (b)."""
    task = get_object_or_404(Task, pk=task_id)
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
@staff_only
def task_diff(request: HttpRequest, task_id: uuid.UUID, other_id: uuid.UUID) -> HttpResponse:
    """Two histories side by side as ``tasks_drift`` aligns them (a is ``task_id``)."""
    expand = _expand_param(request)
    try:
        drift = selectors.drift_page(a_id=task_id, b_id=other_id, page=int_param(request, "page"), expand=expand)
    except NotFound:
        raise Http404("no such task") from None
    return render(request, "dashboard/forks/diff.html", {
        "drift": drift, "expand": f"{expand[0]}-{expand[1]}" if expand else "", "nav": NAV,
        "related": drift.b.forked_from_id == drift.a.pk or drift.a.forked_from_id == drift.b.pk,
    })


# --- many at once: fork from failure -------------------------------------------------------------


def _bulk_page(request: HttpRequest, context: dict[str, Any], status: int = 200) -> HttpResponse:
    return render(request, "dashboard/forks/bulk.html", {"nav": NAV, **context}, status=status)


@require_POST
@staff_only
def bulk_preview(request: HttpRequest) -> HttpResponse:
    """The dry run: nothing is forked here. Shows how many tasks, where each fork would continue
    (a sample), the skipped ones and why, and carries a signed confirmation of exactly these."""
    form = BulkForkForm(request.POST)
    if not form.is_valid():
        return _bulk_page(request, {"step": "invalid", "form": form, "query": request.POST.get("query", "")},
                          status=400)
    data = form.cleaned_data
    more = False
    if data["all_matching"]:
        filters_form = TaskFilterForm(QueryDict(data["query"]))
        if not filters_form.is_valid():
            form.add_error(None, "The list's filter is not valid; filter again.")
            return _bulk_page(request, {"step": "invalid", "form": form, "query": data["query"]}, status=400)
        ids, more = task_ids_matching(filters_form.filters(), limit=forks.BULK_MAX_ITEMS)
    else:
        ids = data["ids"]
    plan = forks.fork_from_failure_plan(ids)
    will_fork = [(item, item.at_seq) for item in plan if item.at_seq is not None]
    skipped = [item for item in plan if item.at_seq is None]
    sample = will_fork[:SAMPLE_SIZE]
    types = selectors.events_at((item.task.pk, at_seq) for item, at_seq in sample)
    token = fork_bulk_token(ids=[item.task.pk for item in plan], reason=data["reason"], user_id=_user_id(request))
    return _bulk_page(request, {
        "step": "preview", "requested": len(plan), "will_fork": len(will_fork), "skipped": len(skipped),
        "skip_reasons": Counter(item.skip_reason for item in skipped).most_common(),
        "sample": [{"item": item, "at_type": types.get((item.task.pk, at_seq), "")} for item, at_seq in sample],
        "skipped_sample": skipped[:SAMPLE_SIZE], "reason": data["reason"], "token": token, "more": more,
        "all_matching": data["all_matching"], "query": data["query"], "bulk_max": forks.BULK_MAX_ITEMS,
        "unknown": len(ids) - len(plan),
    })


@require_POST
@staff_only
def bulk_confirm(request: HttpRequest) -> HttpResponse:
    """Fork what the dry run showed, each task in its own transaction; report each."""
    form = BulkForkConfirmForm(request.POST, user_id=_user_id(request))
    if not form.is_valid():
        return _bulk_page(request, {"step": "invalid", "form": form, "query": request.POST.get("query", "")},
                          status=400)
    signed = form.cleaned_data["token"]
    results = forks.tasks_fork_from_failure(task_ids=signed["ids"], reason=signed["reason"],
                                            forked_by=forked_by(request), batch=signed["batch"])
    counts = Counter(result.outcome for result in results)
    kinds = dict(Task.objects.filter(pk__in=[r.task_id for r in results]).values_list("pk", "kind"))
    return _bulk_page(request, {
        "step": "result", "reason": signed["reason"], "query": request.POST.get("query", ""),
        "counts": {"done": counts["done"], "skipped": counts["skipped"], "failed": counts["failed"]},
        "results": [{"result": result, "kind": kinds.get(result.task_id, "")} for result in results],
    })


urlpatterns = [
    path("fork-from-failure/", bulk_preview, name="tasks-fork-bulk"),
    path("fork-from-failure/confirm/", bulk_confirm, name="tasks-fork-bulk-confirm"),
    path("<uuid:task_id>/fork/", task_fork, name="task-fork"),
    path("<uuid:task_id>/compare/", task_compare, name="task-compare"),
    path("<uuid:task_id>/diff/<uuid:other_id>/", task_diff, name="task-diff"),
]
