"""Dead-letter review: the queue, one dead letter, and decisions on one or many.

Every logged-in staff user may look. Only reviewers (the ``backplane.review_deadletter``
permission, held by the "Reviewers" group, or a superuser) see the decision controls, and
every view that decides checks it again, whatever the page showed: anyone else gets 403 and
nothing changes. Decisions go through ``recovery.dead_letters`` (the API and the admin use the
same services), which record who, when and why, write the decision into the task's log, and
decide each dead letter once: a decision that lost a race is told who won.

Many at once is a bulk job (recovery/bulk.py), the one way to act in bulk: the queue's bulk bar
makes a draft job, whose page shows the dry run (the frozen list, what will happen to each) and
starts exactly that list; the worker decides it in chunks and records a result per item.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse, QueryDict
from django.shortcuts import redirect, render
from django.template.loader import render_to_string
from django.urls import path
from django.views.decorators.http import require_GET, require_POST

from backplane.delivery import selectors as delivery
from backplane.delivery.models import DeadLetter, DeadLetterSource, DeadLetterStatus
from backplane.eventlog import event_types as et
from backplane.eventlog.errors import AlreadyDecided, BackplaneError, InvalidInput, NotFound
from backplane.eventlog.models import TaskStatus, user_actor
from backplane.runtime.replica import replica_reads
from dashboard.access import may_review
from dashboard.dead_letter_forms import (
    DeadLetterFilterForm,
    DeadLetterJobForm,
    DiscardForm,
    EditRequeueForm,
    RequeueForm,
    job_filter_of,
)
from dashboard.selectors.task_detail import EVENT_PAGE_SIZE
from dashboard.templatetags.dashboard import pretty_json
from dashboard.views.common import across_namespaces, json_error, reviewers_only, viewers_only, wants_json
from recovery import bulk, dead_letters

PAGE_SIZE = 50
NAV = "dead-letters"

# How a task's attempts ended and what was decided before, from its log (the detail page).
TASK_LOG_TYPES = (et.TASK_CLAIMED, et.TASK_STALLED, et.TASK_FAILED, et.TASK_DEAD_LETTERED, et.DEAD_LETTER_REQUEUED,
                  et.DEAD_LETTER_DISCARDED)


# --- who decides ---------------------------------------------------------------------------------


def decided_by(request: HttpRequest) -> str:
    return user_actor(request.user)


# --- the queue -----------------------------------------------------------------------------------


@require_GET
@viewers_only
@replica_reads
@across_namespaces
def queue(request: HttpRequest) -> HttpResponse:
    """Pending first, oldest first; filters; keyset pages; the first page follows new ones live
    (``?partial=rows`` is its script's read, rendered by the same row template)."""
    form = DeadLetterFilterForm(request.GET)
    page = None
    error = None
    if form.is_valid():
        filters = form.filters()
        try:
            page = delivery.dead_letter_queue_page(filters, cursor=request.GET.get("cursor") or None, limit=PAGE_SIZE)
        except delivery.BadDeadLetterCursor:
            error = "That page link is not valid any more; showing the first page."
            page = delivery.dead_letter_queue_page(filters, limit=PAGE_SIZE)
    query = request.GET.copy()
    query.pop("cursor", None)
    query.pop("partial", None)
    context = {"form": form, "page": page, "error": error, "query": query.urlencode(), "nav": NAV,
               "reviewer": may_review(request.user), "bulk_max": settings.BACKPLANE_BULK_MAX_ITEMS}
    if request.GET.get("partial") == "rows":
        return JsonResponse(
            {
                "rows": render_to_string("dashboard/dead_letters/_rows.html", context, request=request),
                "next_cursor": page.next_cursor if page else None,
            },
            status=200 if form.is_valid() else 400,
        )
    return render(request, "dashboard/dead_letters/queue.html", context, status=200 if form.is_valid() else 400)


# --- one dead letter -----------------------------------------------------------------------------


def _dead_letter(dead_letter_id: int) -> DeadLetter:
    item = delivery.dead_letter_for_review(dead_letter_id)
    if item is None:
        raise Http404("no such dead letter")
    return item


def _task_log(item: DeadLetter) -> list[dict[str, Any]]:
    """The task's log entries with a link to each on the task page (its page of events)."""
    if item.task is None:
        return []
    latest_page_from = item.task.last_seq - EVENT_PAGE_SIZE + 1
    entries = []
    for entry in delivery.dead_letter_task_log(item, types=TASK_LOG_TYPES):
        page = "" if entry.seq >= latest_page_from else f"?before_seq={entry.seq + 1}"
        entries.append({"entry": entry, "href": f"/tasks/{item.task_id}/{page}#seq-{entry.seq}"})
    return entries


def _requeue_warning(item: DeadLetter) -> str:
    """Why requeueing this one would be refused, when the page can tell in advance."""
    if item.source == DeadLetterSource.TASK and item.task is not None and item.task.status != TaskStatus.DEAD_LETTERED:
        return f"The task is {item.task.status} now, no longer dead-lettered: requeueing it will be refused."
    if item.source == DeadLetterSource.OUTBOX and item.outbox_message_id is None:
        return "The outbox message was pruned: requeueing will be refused; discard it."
    if item.source == DeadLetterSource.TOOL_CALL:
        return "Tool-call dead letters cannot be requeued; discard it."
    return ""


def _render_detail(request: HttpRequest, item: DeadLetter, *, bound: dict[str, Any] | None = None,
                   status: int = 200) -> HttpResponse:
    reviewer = may_review(request.user)
    pending = item.status == DeadLetterStatus.PENDING
    editable = dead_letters.may_edit_payload(item)
    forms = {
        "requeue_form": RequeueForm(auto_id="requeue_%s"),
        "edit_form": EditRequeueForm(auto_id="edit_%s", initial={"payload": pretty_json(item.payload)}),
        "discard_form": DiscardForm(auto_id="discard_%s"),
        **(bound or {}),
    }
    context = {
        "item": item,
        "nav": NAV,
        "reviewer": reviewer,
        "pending": pending,
        "editable": editable,
        "is_task": item.source == DeadLetterSource.TASK,
        "effect": dead_letters.requeue_effect(item),
        "warning": _requeue_warning(item) if pending else "",
        "task_log": _task_log(item),
        "task_log_max": delivery.TASK_LOG_ENTRIES_SHOWN,
        "editor_data": {"payload": item.payload, "original": item.original_payload},
        **forms,
    }
    return render(request, "dashboard/dead_letters/detail.html", context, status=status)


@require_GET
@viewers_only
@across_namespaces
def detail(request: HttpRequest, dead_letter_id: int) -> HttpResponse:
    return _render_detail(request, _dead_letter(dead_letter_id))


def _decided_answer(request: HttpRequest, item: DeadLetter, done: str) -> HttpResponse:
    if wants_json(request):
        return JsonResponse({"id": item.pk, "status": item.status, "decided_by": item.decided_by,
                             "reason": item.reason})
    messages.success(request, done)
    return redirect("dashboard:dead-letter", dead_letter_id=item.pk)


def _lost_race(request: HttpRequest, dead_letter_id: int, exc: AlreadyDecided) -> HttpResponse:
    text = (f"Already decided by {exc.details.get('decided_by') or 'someone'} "
            f"({exc.details.get('status')}); your decision changed nothing.")
    if wants_json(request):
        return json_error(409, "already_decided", text, exc.details)
    messages.error(request, text)
    return redirect("dashboard:dead-letter", dead_letter_id=dead_letter_id)


def _refused(request: HttpRequest, item: DeadLetter, form: Any, name: str, exc: InvalidInput,
             field: str | None = None) -> HttpResponse:
    if wants_json(request):
        return json_error(400, "validation_error", exc.message, exc.details)
    form.add_error(field, f"Refused, nothing changed: {exc.message}.")
    return _render_detail(request, item, bound={name: form}, status=400)


def _invalid(request: HttpRequest, item: DeadLetter, form: Any, name: str) -> HttpResponse:
    if wants_json(request):
        return json_error(400, "validation_error", "the decision is not valid",
                          {field: [str(e) for e in errors] for field, errors in form.errors.items()})
    return _render_detail(request, item, bound={name: form}, status=400)


@require_POST
@reviewers_only("Deciding dead letters")
@across_namespaces
def requeue(request: HttpRequest, dead_letter_id: int) -> HttpResponse:
    """Requeue as is, or (with ``payload``) edit and requeue; the original payload stays on record."""
    item = _dead_letter(dead_letter_id)
    edited = "payload" in request.POST
    if edited and not dead_letters.may_edit_payload(item):
        # Only a message's payload can be edited; the page offers no editor for the others.
        refused = RequeueForm({"reason": request.POST.get("reason", "")}, auto_id="requeue_%s")
        refused.is_valid()
        return _refused(request, item, refused, "requeue_form", InvalidInput(
            f"a {'task' if item.source == DeadLetterSource.TASK else item.source} is requeued as it is; "
            "its payload cannot be edited"))
    name = "edit_form" if edited else "requeue_form"
    form: RequeueForm | EditRequeueForm = (
        EditRequeueForm(request.POST, auto_id="edit_%s") if edited else RequeueForm(request.POST, auto_id="requeue_%s")
    )
    if not form.is_valid():
        return _invalid(request, item, form, name)
    try:
        decided = dead_letters.dead_letter_requeue(
            dead_letter_id=item.pk, decided_by=decided_by(request), reason=form.cleaned_data["reason"],
            payload=form.cleaned_data.get("payload"),
        )
    except AlreadyDecided as exc:
        return _lost_race(request, item.pk, exc)
    except NotFound:
        return redirect("dashboard:dead-letters")
    except InvalidInput as exc:
        return _refused(request, item, form, name, exc, "payload" if edited and "payload" in exc.details else None)
    what = "with the edited payload (the original stays on record)" if edited else "as it was"
    return _decided_answer(request, decided, f"Dead letter #{decided.pk} requeued {what}. "
                                             f"{dead_letters.requeue_effect(decided)}")


@require_POST
@reviewers_only("Deciding dead letters")
@across_namespaces
def discard(request: HttpRequest, dead_letter_id: int) -> HttpResponse:
    item = _dead_letter(dead_letter_id)
    form = DiscardForm(request.POST, auto_id="discard_%s")
    if not form.is_valid():
        return _invalid(request, item, form, "discard_form")
    compensate = bool(form.cleaned_data.get("compensate"))
    try:
        decided = dead_letters.dead_letter_discard(
            dead_letter_id=item.pk, decided_by=decided_by(request), reason=form.cleaned_data["reason"],
            compensate=compensate,
        )
    except AlreadyDecided as exc:
        return _lost_race(request, item.pk, exc)
    except NotFound:
        return redirect("dashboard:dead-letters")
    except InvalidInput as exc:
        return _refused(request, item, form, "discard_form", exc, "compensate" if "compensate" in exc.details else None)
    saga = " The task failed for good and its compensations were started." if compensate else ""
    return _decided_answer(request, decided, f"Dead letter #{decided.pk} discarded.{saga}")


# --- many at once: a draft job ------------------------------------------------------------------


def _not_planned(request: HttpRequest, form: DeadLetterJobForm, query: str, *, status: int,
                 message: str = "") -> HttpResponse:
    if wants_json(request):
        details = {field: [str(e) for e in errors] for field, errors in form.errors.items()}
        return json_error(status, "validation_error", message or "the bulk decision is not valid", details)
    return render(request, "dashboard/dead_letters/bulk.html",
                  {"nav": NAV, "form": form, "query": query, "message": message}, status=status)


@require_POST
@reviewers_only("Deciding dead letters")
@across_namespaces
def bulk_job_draft(request: HttpRequest) -> HttpResponse:
    """The bulk bar makes a draft job (``bulk_job_plan``: the dry run, which freezes the checked
    dead letters or every pending one matching the filter) and shows its page, where a
    reviewer starts exactly that list. Nothing is decided here."""
    form = DeadLetterJobForm(request.POST)
    query = request.POST.get("query", "")
    if not form.is_valid():
        return _not_planned(request, form, query, status=400)
    data = form.cleaned_data
    selection: dict[str, Any]
    if data["all_matching"]:
        filters_form = DeadLetterFilterForm(QueryDict(data["query"]))
        if not filters_form.is_valid():
            return _not_planned(request, form, query, status=400,
                                message="The queue's filter is not valid; filter again.")
        filters = filters_form.filters()
        if not filters.wants(DeadLetterStatus.PENDING):
            return _not_planned(request, form, query, status=400,
                                message="The queue's filter shows no pending dead letters: there is nothing to decide.")
        selection = {"filter": job_filter_of(filters)}
    else:
        selection = {"ids": data["ids"]}
    try:
        job = bulk.bulk_job_plan(action=data["action"], selection=selection, reason=data["reason"],
                                 created_by=decided_by(request))
    except BackplaneError as exc:
        return _not_planned(request, form, query, status=exc.status, message=f"Nothing was planned: {exc.message}.")
    return redirect("dashboard:job", job_id=job.pk)


urlpatterns = [
    path("", queue, name="dead-letters"),
    path("<int:dead_letter_id>/", detail, name="dead-letter"),
    path("<int:dead_letter_id>/requeue/", requeue, name="dead-letter-requeue"),
    path("<int:dead_letter_id>/discard/", discard, name="dead-letter-discard"),
    path("bulk/", bulk_job_draft, name="dead-letters-bulk"),
]
