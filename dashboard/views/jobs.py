"""The jobs pages: bulk jobs (recovery/bulk.py) listed, dry run from the task list's filter,
watched live (a JSON poll) and decided (start, pause, resume, abort, retry the failed items).

Anyone on the dashboard sees the jobs; creating and deciding is for reviewers, checked here on
every POST whatever the page showed."""

from __future__ import annotations

from typing import Any

from django import forms
from django.http import HttpRequest, HttpResponse, JsonResponse, QueryDict
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import path
from django.utils import timezone
from django.views.decorators.http import require_GET, require_POST

from backplane.eventlog.errors import BackplaneError
from backplane.eventlog.models import user_actor
from backplane.runtime.replica import replica_reads
from dashboard.access import may_review
from dashboard.forms import TaskFilterForm
from dashboard.views.common import across_namespaces, int_param, reviewers_only, viewers_only
from recovery import bulk, selectors
from recovery.models import BulkAction, BulkItemStatus, BulkJob, BulkJobStatus

NAV = "jobs"
ITEMS_PER_STATUS = 50
TASK_ACTIONS = [(BulkAction.RETRY, "Retry: failed tasks back to pending, dead-lettered ones requeued"),
                (BulkAction.FORK_FROM_FAILURE, "Fork from failure: a new task from just before the failure"),
                (BulkAction.CANCEL, "Cancel: every open task cancelled")]
WHAT = "Bulk jobs"


class JobDryRunForm(forms.Form):
    action = forms.ChoiceField(choices=TASK_ACTIONS)
    reason = forms.CharField(max_length=2000, strip=True,
                             widget=forms.TextInput(attrs={"placeholder": "why (recorded with your name)",
                                                           "size": 50}))
    rate_per_second = forms.IntegerField(min_value=0, max_value=bulk.MAX_RATE_PER_SECOND, initial=200,
                                         help_text="items a second at most; 0: no limit")
    chunk_size = forms.IntegerField(min_value=1, max_value=bulk.MAX_CHUNK_SIZE, initial=200,
                                    help_text="items per transaction")
    compensate = forms.BooleanField(required=False, help_text="cancel only: run the tasks' compensations")
    query = forms.CharField(required=False, widget=forms.HiddenInput)


def _filter_of(query: str) -> tuple[TaskFilterForm, dict[str, Any] | None]:
    filters_form = TaskFilterForm(QueryDict(query))
    return filters_form, filters_form.filters().as_json() if filters_form.is_valid() else None


def job_progress(job: BulkJob) -> dict[str, Any]:
    """What the job page shows live: counts, share settled, items a second since it started."""
    settled = job.done + job.skipped + job.failed
    rate = None
    if job.started_at is not None and settled:
        # The average since the start (a pause counts as time): what the job has kept up.
        seconds = max(((job.finished_at or timezone.now()) - job.started_at).total_seconds(), 0.001)
        rate = round(settled / seconds, 1)
    return {"id": job.pk, "status": job.status, "total": job.total, "done": job.done, "skipped": job.skipped,
            "failed": job.failed, "pending": job.total - settled,
            "percent": round(100 * settled / job.total, 1) if job.total else 0.0, "rate": rate}


@require_GET
@viewers_only
@replica_reads
@across_namespaces
def job_list(request: HttpRequest) -> HttpResponse:
    jobs, next_cursor = selectors.bulk_jobs_recent(limit=50, before_id=int_param(request, "cursor") or None)
    return render(request, "dashboard/jobs.html", {"nav": NAV, "jobs": [(job, job_progress(job)) for job in jobs],
                                                   "next_cursor": next_cursor})


def _new_page(request: HttpRequest, form: JobDryRunForm, *, status: int = 200,
              error: str | None = None) -> HttpResponse:
    query = form.data.get("query", "") if form.is_bound else form.initial.get("query", "")
    filters_form, selection = _filter_of(query)
    return render(request, "dashboard/jobs_new.html", {
        "nav": NAV, "form": form, "query": query, "filter": selection, "filters_form": filters_form, "error": error,
        "may_review": may_review(request.user)}, status=status)


@viewers_only
@across_namespaces
def job_new(request: HttpRequest) -> HttpResponse:
    """GET: the dry-run form over the task list's filter (``?query=``). POST: the dry run."""
    if request.method != "POST":
        return _new_page(request, JobDryRunForm(initial={"query": request.GET.get("query", ""),
                                                         "rate_per_second": 200, "chunk_size": 200}))
    return _job_dry_run(request)


@reviewers_only(WHAT)
def _job_dry_run(request: HttpRequest) -> HttpResponse:
    form = JobDryRunForm(request.POST)
    if not form.is_valid():
        return _new_page(request, form, status=400)
    data = form.cleaned_data
    _, selection = _filter_of(data["query"])
    if selection is None:
        return _new_page(request, form, status=400, error="The list's filter is not valid; filter again.")
    options = {"compensate": True} if data["action"] == BulkAction.CANCEL and data["compensate"] else {}
    try:
        job = bulk.bulk_job_plan(action=data["action"], selection={"filter": selection}, reason=data["reason"],
                                 created_by=user_actor(request.user), options=options,
                                 rate_per_second=data["rate_per_second"], chunk_size=data["chunk_size"])
    except BackplaneError as exc:
        return _new_page(request, form, status=exc.status, error=exc.message)
    return redirect("dashboard:job", job_id=job.pk)


@require_GET
@viewers_only
@across_namespaces
def job_detail(request: HttpRequest, job_id: int) -> HttpResponse:
    job = get_object_or_404(BulkJob, pk=job_id)
    by_status = []
    for status in (BulkItemStatus.FAILED, BulkItemStatus.SKIPPED, BulkItemStatus.DONE, BulkItemStatus.PENDING):
        items, more = selectors.bulk_job_items_page(job, status=status, after_index=-1, limit=ITEMS_PER_STATUS)
        by_status.append({"status": status, "items": items, "more": more is not None,
                          "count": getattr(job, status, None) if status != BulkItemStatus.PENDING
                          else job.total - job.done - job.skipped - job.failed})
    return render(request, "dashboard/jobs_detail.html", {
        "nav": NAV, "job": job, "progress": job_progress(job), "by_status": by_status,
        "decisions": job.decisions.order_by("at", "pk"), "retries": job.retries.order_by("pk"),
        "planned": selectors.bulk_job_planned_counts(job) if job.status == BulkJobStatus.DRAFT else [],
        "may_review": may_review(request.user), "is_task_action": job.action in bulk.TASK_ACTIONS,
        "running": job.status == BulkJobStatus.RUNNING})


@require_GET
@viewers_only
@across_namespaces
def job_progress_json(request: HttpRequest, job_id: int) -> JsonResponse:
    return JsonResponse(job_progress(get_object_or_404(BulkJob, pk=job_id)))


def _decision(request: HttpRequest, job_id: int, decide: Any) -> HttpResponse:
    try:
        job = decide(job_id=job_id, decided_by=user_actor(request.user), reason=request.POST.get("reason", ""))
    except BackplaneError as exc:
        job = get_object_or_404(BulkJob, pk=job_id)
        return render(request, "dashboard/jobs_detail.html", {
            "nav": NAV, "job": job, "progress": job_progress(job), "by_status": [], "error": exc.message,
            "decisions": job.decisions.order_by("at", "pk"), "retries": job.retries.order_by("pk"),
            "may_review": True, "running": job.status == BulkJobStatus.RUNNING}, status=exc.status)
    return redirect("dashboard:job", job_id=job.pk)


@require_POST
@reviewers_only(WHAT)
@across_namespaces
def job_start(request: HttpRequest, job_id: int) -> HttpResponse:
    def start(*, job_id: int, decided_by: str, reason: str) -> BulkJob:
        return bulk.bulk_job_start(job_id=job_id, selection_hash=request.POST.get("selection_hash", ""),
                                   decided_by=decided_by, reason=reason)

    return _decision(request, job_id, start)


@require_POST
@reviewers_only(WHAT)
@across_namespaces
def job_pause(request: HttpRequest, job_id: int) -> HttpResponse:
    return _decision(request, job_id, bulk.bulk_job_pause)


@require_POST
@reviewers_only(WHAT)
@across_namespaces
def job_resume(request: HttpRequest, job_id: int) -> HttpResponse:
    return _decision(request, job_id, bulk.bulk_job_resume)


@require_POST
@reviewers_only(WHAT)
@across_namespaces
def job_abort(request: HttpRequest, job_id: int) -> HttpResponse:
    return _decision(request, job_id, bulk.bulk_job_abort)


@require_POST
@reviewers_only(WHAT)
@across_namespaces
def job_retry_failed(request: HttpRequest, job_id: int) -> HttpResponse:
    return _decision(request, job_id, bulk.bulk_job_retry_failed)


urlpatterns = [
    path("", job_list, name="jobs"),
    path("new/", job_new, name="job-new"),
    path("<int:job_id>/", job_detail, name="job"),
    path("<int:job_id>/progress/", job_progress_json, name="job-progress"),
    path("<int:job_id>/start/", job_start, name="job-start"),
    path("<int:job_id>/pause/", job_pause, name="job-pause"),
    path("<int:job_id>/resume/", job_resume, name="job-resume"),
    path("<int:job_id>/abort/", job_abort, name="job-abort"),
    path("<int:job_id>/retry-failed/", job_retry_failed, name="job-retry-failed"),
]
