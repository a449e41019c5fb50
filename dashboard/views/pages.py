"""Part 1's pages (overview, tasks, a task) and the small JSON reads their scripts make to catch
up after a notice.

Thin: check who asks, read through the page's module of ``dashboard.selectors`` (or run one
service), render.
Every page is for logged-in staff: anonymous visitors go to the login page, other users get 403.

``replica_reads`` (backplane/runtime/replica.py) sends the reads of the lists and the overview to
the read replica when one is configured and current: they show the whole fleet, cost the most,
and a few seconds' lag does not mislead on them. A task's page and the other pages a staff
member lands on right after their own action (a fork, a decision, a job started) stay on the
primary, so they show that action. The other list pages opt in the same way (agents, outbox,
integrity, the dead-letter queue, the job list).
"""

from __future__ import annotations

import dataclasses
import uuid
from datetime import timedelta
from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, render
from django.template.loader import render_to_string
from django.utils import timezone
from django.views.decorators.http import require_GET, require_POST

from backplane.eventlog.chain import format_timestamp
from backplane.eventlog.models import Task, user_actor
from backplane.eventlog.selectors import TaskFilters
from backplane.integrity.verification import task_chain_verify_now
from backplane.privacy.models import OPEN_PERSONAL_DATA_PERMISSION
from backplane.privacy.sealing import personal_in_value
from backplane.runtime.duties import duties_state
from backplane.runtime.replica import replica_reads
from dashboard.access import may_review, namespace_of
from dashboard.fork_forms import CompareForm, ForkForm
from dashboard.forms import TaskFilterForm
from dashboard.selectors.overview import activity_per_minute, feed_events, overview_figures
from dashboard.selectors.personal import personal_for_people
from dashboard.selectors.spend import spend_today, task_spend
from dashboard.selectors.task_detail import (
    TIMELINE_MAX_EVENTS,
    EventRows,
    chain_state,
    event_rows,
    task_family,
    task_lineage,
    task_timeline,
)
from dashboard.selectors.tasks import BadCursor, task_page
from dashboard.text import spend_chart, timeline_json
from dashboard.views import searches
from dashboard.views.common import across_namespaces, int_param, operators_only, viewers_only
from recovery.selectors import pause_blocking, pauses_in_force, recovery_context

# --- overview ------------------------------------------------------------------------------------


def _overview_parts(request: HttpRequest) -> dict[str, Any]:
    figures = overview_figures()
    duties = duties_state()
    return {
        "figures": figures,
        "spend": spend_today(now=figures.now),
        "duties": duties,
        "duties_overdue": [duty for duty in duties if duty.overdue],
        "pauses": pauses_in_force(),
        "hour_ago": format_timestamp(figures.hour_ago),
        "minute_ago": format_timestamp(figures.now - timedelta(minutes=1)),
        **searches.overview_parts(),
    }


@require_GET
@viewers_only
@replica_reads
@across_namespaces
def overview(request: HttpRequest) -> HttpResponse:
    feed = feed_events()
    parts = _overview_parts(request)
    return render(
        request,
        "dashboard/overview.html",
        {
            **parts,
            "spend_chart": spend_chart(parts["spend"]),
            "feed": feed,
            "last_position": feed[0].position if feed else 0,
            "chart": activity_per_minute(hours=1),
            "nav": "overview",
        },
    )


@require_GET
@viewers_only
@replica_reads
@across_namespaces
def overview_live(request: HttpRequest) -> JsonResponse:
    """What an open overview needs after a notice: tiles, pinned searches, alerts, pauses, the
    feed after ``after_position``, the chart, and the cost panel (its figures and its charts' data)."""
    after = int_param(request, "after_position")
    hours = 24 if request.GET.get("hours") == "24" else 1
    feed = feed_events(after_position=after)
    parts = _overview_parts(request)
    return JsonResponse(
        {
            "tiles": render_to_string("dashboard/_tiles.html", parts, request=request),
            "duties": render_to_string("dashboard/_duties.html", parts, request=request),
            "saved_tiles": render_to_string("dashboard/_saved_tiles.html", parts, request=request),
            "alerts": render_to_string("dashboard/_alerts.html", parts, request=request),
            "pauses": render_to_string("dashboard/_pauses.html", parts, request=request),
            "feed": render_to_string("dashboard/_feed_rows.html", {"feed": feed}, request=request),
            "last_position": feed[0].position if feed else after,
            "chart": activity_per_minute(hours=hours),
            "spend": render_to_string("dashboard/_spend_today.html", parts, request=request),
            "spend_chart": spend_chart(parts["spend"]),
        }
    )


# --- tasks ---------------------------------------------------------------------------------------


@require_GET
@viewers_only
@replica_reads
def task_list(request: HttpRequest) -> HttpResponse:
    form = TaskFilterForm(request.GET)
    page = None
    error = None
    if form.is_valid():
        try:
            page = task_page(scoped_filters(request, form), cursor=request.GET.get("cursor") or None)
        except BadCursor:
            error = "That page link is not valid any more; showing the first page."
            page = task_page(scoped_filters(request, form))
    query = request.GET.copy()
    query.pop("cursor", None)
    query.pop("partial", None)
    query.pop("search", None)
    context = {"form": form, "page": page, "error": error, "query": query.urlencode(), "nav": "tasks",
               "may_review": may_review(request.user), "saved_search": searches.named_search(request.GET.get("search"))}
    if request.GET.get("partial") == "rows":
        return JsonResponse(
            {
                "rows": render_to_string("dashboard/_task_rows.html", context, request=request),
                "next_cursor": page.next_cursor if page else None,
            }
        )
    return render(request, "dashboard/tasks.html", context, status=200 if form.is_valid() else 400)


def scoped_filters(request: HttpRequest, form: TaskFilterForm) -> TaskFilters:
    """The list's filters; a user scoped to a namespace sees only that namespace's tasks."""
    filters = form.filters()
    scope = namespace_of(request.user)
    return filters if scope is None else dataclasses.replace(filters, namespace=scope)


def scoped_task(request: HttpRequest, task_id: uuid.UUID) -> Task:
    """The task, 404 when it is not in the namespace the user is scoped to (as in the API)."""
    scope = namespace_of(request.user)
    return get_object_or_404(Task, pk=task_id, **({} if scope is None else {"namespace": scope}))


def _task_parts(request: HttpRequest, task: Task, rows: EventRows, *,
                reader: str | None = None) -> dict[str, Any]:
    """What the page's parts show; the personal values of the task's output and of ``rows``' events
    as a person sees them (``shown_payload``), opened for ``reader`` (dashboard/selectors/personal.py)."""
    values = [task.output, *(e.payload for e in rows.events)]
    personal = personal_in_value(values)
    shown = personal_for_people(task.namespace, values, reader=reader, task_id=task.pk) if personal else values
    for event, payload in zip(rows.events, shown[1:], strict=True):
        setattr(event, "shown_payload", payload)  # noqa: B010 - for the template, not a field of the model
    return {
        "task": task,
        "output_shown": shown[0],
        "has_personal": personal or personal_in_value(task.input),
        "family": task_family(task),
        "chain": chain_state(task.pk),
        "spend": task_spend(task),
        "now": timezone.now(),
        "pause": pause_blocking(task),
    }


@require_GET
@viewers_only
def task_detail(request: HttpRequest, task_id: uuid.UUID) -> HttpResponse:
    return render_task_page(request, scoped_task(request, task_id))


def render_task_page(request: HttpRequest, task: Task, *, fork_form: ForkForm | None = None, fork_error: str = "",
                     status: int = 200) -> HttpResponse:
    """The task page; with ``fork_form`` (a fork that was refused) its fork dialog is open, showing
    what was sent and why it was refused. ``?fork_at=N`` opens it at event N. ``?personal=open``:
    a privacy officer sees the personal values in clear, and that read is recorded."""
    before_seq = int_param(request, "before_seq")
    rows = event_rows(task, before_seq=before_seq)
    personal_opened = request.GET.get("personal") == "open" and request.user.has_perm(OPEN_PERSONAL_DATA_PERMISSION)
    parts = _task_parts(request, task, rows, reader=user_actor(request.user) if personal_opened else None)
    fork_at = int_param(request, "fork_at")
    if fork_form is None:
        fork_form = ForkForm(initial={"at_seq": fork_at or task.last_seq, "sandbox": task.sandbox,
                                      "fork_id": uuid.uuid4()})
    fork_form.fields["at_seq"].widget.attrs.update(max=task.last_seq)
    return render(
        request,
        "dashboard/task_detail.html",
        {
            **parts,
            "rows": rows,
            "before_seq": before_seq,
            "last_shown_seq": rows.events[-1].seq if rows.events else 0,
            "timeline": timeline_json(task_timeline(task, now=parts["now"])),
            "timeline_max": TIMELINE_MAX_EVENTS,
            "lineage": task_lineage(task),
            "fork_form": fork_form,
            "fork_error": fork_error,
            "fork_open": fork_form.is_bound or fork_at is not None,
            "compare_form": CompareForm(auto_id="compare_%s"),
            "personal_opened": personal_opened,
            "nav": "tasks",
        },
        status=status,
    )


@require_GET
@viewers_only
def task_live(request: HttpRequest, task_id: uuid.UUID) -> JsonResponse:
    """What an open task page missed: the events after ``after_seq``, the header, the family
    and the timeline, rendered by the same templates as the page."""
    task = scoped_task(request, task_id)
    after = int_param(request, "after_seq") or 0
    rows = event_rows(task, after_seq=after)
    parts = _task_parts(request, task, rows)
    return JsonResponse(
        {
            "last_seq": rows.events[-1].seq if rows.events else after,
            "task_last_seq": task.last_seq,
            "rows": render_to_string("dashboard/_event_rows.html", {**parts, "rows": rows}, request=request),
            "header": render_to_string("dashboard/_task_header.html", parts, request=request),
            "family": render_to_string("dashboard/_task_family.html", parts, request=request),
            "timeline": timeline_json(task_timeline(task, now=parts["now"])),
            "chain": {"verified_seq": parts["chain"].verified_seq, "broken_seq": parts["chain"].broken_seq},
        }
    )


@require_GET
@viewers_only
def task_recovery_context(request: HttpRequest, task_id: uuid.UUID) -> HttpResponse:
    """The recovery context exactly as the next agent would receive it (docs/api.md), as a fragment."""
    task = scoped_task(request, task_id)
    context = personal_for_people(task.namespace, [recovery_context(namespace=None, task_id=task.pk)])[0]
    return render(request, "dashboard/_recovery_context.html", {"context": context})


@require_POST
@operators_only("Verifying a chain")
def task_verify(request: HttpRequest, task_id: uuid.UUID) -> JsonResponse:
    """"Verify chain now": the task's whole chain, recorded as an on-demand verification run."""
    run = task_chain_verify_now(task_id=scoped_task(request, task_id).pk, requested_by=request.user.get_username())
    chain = chain_state(task_id)
    return JsonResponse(
        {
            "valid": run.failures == 0,
            "verified_seq": chain.verified_seq,
            "broken_seq": chain.broken_seq,
            "problem": chain.problem,
            "checked_events": run.events_checked,
            "verified_at": format_timestamp(chain.verified_at) if chain.verified_at else None,
            "seconds": round((run.finished_at - run.started_at) / timedelta(seconds=1), 3) if run.finished_at else None,
        }
    )
