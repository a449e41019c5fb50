"""/api/v1/jobs/: bulk actions as durable jobs (recovery/bulk.py), for reviewers.

A POST is the dry run: the selection is frozen into the job's items and nothing is done until
the job is started with the hash of that list. The dashboard's job pages and the admin show
the same jobs."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import OpenApiExample, OpenApiParameter, extend_schema
from rest_framework import serializers, status
from rest_framework.permissions import IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response

from api.base import ApiView, errors, principal_of, query_int, validated
from api.permissions import Reviewer
from api.serializers import (
    JSONObjectField,
    StrictCharField,
    StrictIntegerField,
    StrictSerializer,
    optional_timestamp,
)
from backplane.eventlog.chain import format_timestamp
from backplane.runtime.replica import replica_reads
from recovery import bulk, selectors
from recovery.models import BulkAction, BulkItemStatus, BulkJob, BulkJobItem, BulkJobStatus

ITEM_STATUSES = BulkItemStatus.values
JOB_ID = OpenApiParameter("job_id", int, OpenApiParameter.PATH, description="the job's id")
JOB_HASH = "4f1c0e9a7b3d5c2e8a6f0b1d3c5e7a9b2d4f6e8a0c1b3d5f7e9a2c4b6d8f0e1a"


class JobCreateIn(StrictSerializer):
    action = serializers.ChoiceField(choices=BulkAction.values)
    filter = JSONObjectField(required=False, help_text=(
        "Task actions: the task list's filter (`q`, `status`, `kind`, `namespace`, `agent`, `created_after`, "
        "`created_before`, `updated_after`, `updated_before`, `stalled_since`, `recovered_since`, "
        "`replayed_since`, `recovering`, `sandboxes`). Dead-letter actions: `source`, `topic`, `kind`, `error`, "
        "`created_after`, `created_before` over pending dead letters. Give `filter` or `ids`, not both."))
    ids = serializers.ListField(child=serializers.JSONField(), required=False, max_length=200_000,
                                help_text="task ids (UUIDs) or dead-letter ids (integers), in the order to act")
    reason = StrictCharField(max_length=2000, min_length=1)
    options = JSONObjectField(required=False, help_text="`compensate` (boolean) for cancel and dead_letter_discard")
    rate_per_second = StrictIntegerField(required=False, default=200, min_value=0, max_value=bulk.MAX_RATE_PER_SECOND,
                                         help_text="items a second at most; 0: no limit")
    chunk_size = StrictIntegerField(required=False, default=200, min_value=1, max_value=bulk.MAX_CHUNK_SIZE,
                                    help_text="items per transaction")


class JobStartIn(StrictSerializer):
    selection_hash = StrictCharField(max_length=64, min_length=1,
                                     help_text="the dry run's `selection_hash`: the list you saw is the list run")
    reason = StrictCharField(max_length=2000, required=False, default="")


class JobDecisionIn(StrictSerializer):
    reason = StrictCharField(max_length=2000, min_length=1)


class JobItemOut(serializers.Serializer):
    index = serializers.IntegerField()
    target = serializers.CharField(help_text="a task's id or a dead letter's id")
    planned = serializers.CharField(help_text="what the dry run said will happen")
    status = serializers.ChoiceField(choices=ITEM_STATUSES)
    detail = serializers.CharField(help_text="what happened, or why it was skipped or failed")
    finished_at = serializers.CharField(allow_null=True)


class JobDecisionOut(serializers.Serializer):
    action = serializers.CharField()
    decided_by = serializers.CharField()
    reason = serializers.CharField()
    at = serializers.CharField()


class JobOut(serializers.Serializer):
    id = serializers.IntegerField()
    action = serializers.ChoiceField(choices=BulkAction.values)
    status = serializers.ChoiceField(choices=BulkJobStatus.values)
    selection = JSONObjectField()
    selection_hash = serializers.CharField()
    options = JSONObjectField()
    reason = serializers.CharField()
    created_by = serializers.CharField()
    created_at = serializers.CharField()
    retry_of = serializers.IntegerField(allow_null=True)
    total = serializers.IntegerField()
    done = serializers.IntegerField()
    skipped = serializers.IntegerField()
    failed = serializers.IntegerField()
    pending = serializers.IntegerField()
    rate_per_second = serializers.IntegerField()
    chunk_size = serializers.IntegerField()
    started_at = serializers.CharField(allow_null=True)
    finished_at = serializers.CharField(allow_null=True)
    decisions = JobDecisionOut(many=True)
    sample = JobItemOut(many=True, required=False, help_text="the dry run's answer: the first 20 items")


class JobListOut(serializers.Serializer):
    results = JobOut(many=True)
    next = serializers.URLField(allow_null=True)


class JobItemListOut(serializers.Serializer):
    results = JobItemOut(many=True)
    next = serializers.URLField(allow_null=True)


def job_item_as_api_dict(item: BulkJobItem) -> dict[str, Any]:
    return {"index": item.index, "target": item.target, "planned": item.planned, "status": item.status,
            "detail": item.detail, "finished_at": optional_timestamp(item.finished_at)}


def job_as_api_dict(job: BulkJob, *, sample: bool = False) -> dict[str, Any]:
    answer: dict[str, Any] = {
        "id": job.pk, "action": job.action, "status": job.status, "selection": job.selection,
        "selection_hash": job.selection_hash, "options": job.options, "reason": job.reason,
        "created_by": job.created_by, "created_at": format_timestamp(job.created_at), "retry_of": job.retry_of_id,
        "total": job.total, "done": job.done, "skipped": job.skipped, "failed": job.failed,
        "pending": job.total - job.done - job.skipped - job.failed,
        "rate_per_second": job.rate_per_second, "chunk_size": job.chunk_size,
        "started_at": optional_timestamp(job.started_at), "finished_at": optional_timestamp(job.finished_at),
        # Sorted here, not by the query: the jobs list prefetches every job's decisions in one.
        "decisions": [{"action": d.action, "decided_by": d.decided_by, "reason": d.reason,
                       "at": format_timestamp(d.at)}
                      for d in sorted(job.decisions.all(), key=lambda decision: (decision.at, decision.pk))],
    }
    if sample:
        items, _ = selectors.bulk_job_items_page(job, status=None, after_index=-1, limit=bulk.SAMPLE_SIZE)
        answer["sample"] = [job_item_as_api_dict(item) for item in items]
    return answer


def _next_url(request: Request, cursor: int | None) -> str | None:
    if cursor is None:
        return None
    query = request.query_params.copy()
    query["cursor"] = str(cursor)
    return request.build_absolute_uri(f"{request.path}?{query.urlencode()}")


REVIEWERS = ("Reviewers only (staff with the `review_deadletter` permission, by session or a token bound to that "
             "user); others get 403 and nothing changes. ")
JOB_EXAMPLE = {
    "id": 7, "action": "retry", "status": "draft", "selection": {"filter": {"status": "failed", "kind": "enrich"}},
    "selection_hash": JOB_HASH, "options": {}, "reason": "deploy 412 failed them; fixed in 413",
    "created_by": "rita", "created_at": "2026-12-02T09:14:03.120000Z", "retry_of": None, "total": 3000,
    "done": 0, "skipped": 0, "failed": 0, "pending": 3000, "rate_per_second": 200, "chunk_size": 200,
    "started_at": None, "finished_at": None,
    "decisions": [{"action": "create", "decided_by": "rita", "reason": "deploy 412 failed them; fixed in 413",
                   "at": "2026-12-02T09:14:03.120000Z"}],
    "sample": [{"index": 0, "target": "3f0c1f9e-8a0e-4a51-9d57-6c1f0f7f2a10", "planned": "retry",
                "status": "pending", "detail": "", "finished_at": None}],
}


class JobsView(ApiView):
    permission_classes = [IsAuthenticated, Reviewer]

    @extend_schema(
        operation_id="jobs_list",
        summary="Bulk jobs, newest first",
        description=REVIEWERS + "Every job with its counts and decisions; follow `next` to page.",
        parameters=[OpenApiParameter("limit", int, description="1-200, default 50"),
                    OpenApiParameter("cursor", int, description="the `next` link's cursor")],
        responses={200: JobListOut, **errors(403)},
    )
    # The list may come from the read replica (backplane/runtime/replica.py); a job's own page
    # and its decisions read the primary, so a reviewer sees the job they just started.
    @replica_reads
    def get(self, request: Request) -> Response:
        cursor = query_int(request.query_params, "cursor", default=0, minimum=0)
        jobs, next_cursor = selectors.bulk_jobs_recent(
            limit=query_int(request.query_params, "limit", default=50, minimum=1, maximum=200),
            before_id=cursor or None, with_decisions=True)
        return Response({"results": [job_as_api_dict(job) for job in jobs], "next": _next_url(request, next_cursor)})

    @extend_schema(
        operation_id="jobs_create",
        summary="Dry run a bulk action: freeze the selection into a draft job",
        description=REVIEWERS + (
            "The selection (a `filter` or `ids`) is frozen into the job's list: its `total`, its `selection_hash` "
            "(SHA-256 of the targets in order, one a line) and a `sample` of the first 20 items, each with what "
            "will happen to it (`planned`). Nothing is done until `POST /jobs/{id}/start/` names that hash. "
            "Actions: `cancel`, `retry` (a failed task gets `TaskRetried`, a dead-lettered one has its dead letter "
            "requeued), `fork_from_failure`, `dead_letter_requeue`, `dead_letter_discard`. An empty selection, a "
            "filter that matches nothing or more than `BACKPLANE_BULK_MAX_ITEMS` items is 400 and writes nothing."),
        request=JobCreateIn,
        examples=[
            OpenApiExample("retry by filter", request_only=True, value={
                "action": "retry", "filter": {"status": "failed", "kind": "enrich"},
                "reason": "deploy 412 failed them; fixed in 413", "rate_per_second": 200}),
            OpenApiExample("cancel by ids", request_only=True, value={
                "action": "cancel", "ids": ["3f0c1f9e-8a0e-4a51-9d57-6c1f0f7f2a10"], "reason": "prompt v7 loops",
                "options": {"compensate": True}}),
            OpenApiExample("the draft job", response_only=True, status_codes=["201"], value=JOB_EXAMPLE),
        ],
        responses={201: JobOut, **errors(403, body=True)},
    )
    def post(self, request: Request) -> Response:
        created_by = principal_of(request).name
        data = validated(JobCreateIn, request.data)
        selection: dict[str, Any] = {name: data[name] for name in ("filter", "ids") if name in data}
        job = bulk.bulk_job_plan(action=data["action"], selection=selection, reason=data["reason"],
                                 created_by=created_by, options=data.get("options"),
                                 rate_per_second=data["rate_per_second"], chunk_size=data["chunk_size"])
        return Response(job_as_api_dict(job, sample=True), status=status.HTTP_201_CREATED)


class JobDetailView(ApiView):
    permission_classes = [IsAuthenticated, Reviewer]

    @extend_schema(
        operation_id="jobs_get",
        summary="A bulk job: its status, counts and decisions",
        description=REVIEWERS + "`pending` is what is left; the items themselves are at `/jobs/{id}/items/`.",
        parameters=[JOB_ID],
        examples=[OpenApiExample("a running job", response_only=True, status_codes=["200"],
                                 value={**JOB_EXAMPLE, "status": "running", "done": 1200, "pending": 1800})],
        responses={200: JobOut, **errors(403, 404)},
    )
    def get(self, request: Request, job_id: int) -> Response:
        return Response(job_as_api_dict(selectors.bulk_job_get(job_id)))


class JobItemsView(ApiView):
    permission_classes = [IsAuthenticated, Reviewer]

    @extend_schema(
        operation_id="jobs_items",
        summary="A bulk job's items and their results",
        description=REVIEWERS + ("The frozen list in order, each item with what was planned and what happened "
                                 "(`done`, `skipped` and why, `failed` and the error); follow `next` to page."),
        parameters=[JOB_ID,
                    OpenApiParameter("status", str, enum=ITEM_STATUSES, description="only items in this status"),
                    OpenApiParameter("limit", int, description="1-1000, default 100"),
                    OpenApiParameter("cursor", int, description="the `next` link's cursor")],
        responses={200: JobItemListOut, **errors(403, 404)},
    )
    def get(self, request: Request, job_id: int) -> Response:
        job = selectors.bulk_job_get(job_id)
        items, next_cursor = selectors.bulk_job_items_page(
            job, status=request.query_params.get("status"),
            after_index=query_int(request.query_params, "cursor", default=-1, minimum=-1),
            limit=query_int(request.query_params, "limit", default=100, minimum=1, maximum=1000))
        return Response({"results": [job_item_as_api_dict(item) for item in items],
                         "next": _next_url(request, next_cursor)})


def _decision_schema(operation: str, summary: str, description: str, example: dict[str, Any],
                     request: type[serializers.Serializer] = JobDecisionIn, created: bool = False) -> Any:
    code = 201 if created else 200
    return extend_schema(
        operation_id=f"jobs_{operation}", summary=summary, description=REVIEWERS + description,
        parameters=[JOB_ID], request=request,
        examples=[OpenApiExample(operation, request_only=True, value=example)],
        responses={code: JobOut, **errors(403, 404, 409, conflicts=("job_conflict",), body=True)},
    )


class JobStartView(ApiView):
    permission_classes = [IsAuthenticated, Reviewer]

    @_decision_schema("start", "Start a draft job", (
        "Draft -> running: the worker executes the frozen list in chunks at the job's rate. `selection_hash` must "
        "be the dry run's; otherwise, or when the job is not a draft (started twice), `409 job_conflict` with "
        "the job's status and hash."), {"selection_hash": JOB_HASH}, request=JobStartIn)
    def post(self, request: Request, job_id: int) -> Response:
        decided_by = principal_of(request).name
        data = validated(JobStartIn, request.data)
        job = bulk.bulk_job_start(job_id=job_id, selection_hash=data["selection_hash"], decided_by=decided_by,
                                  reason=data["reason"])
        return Response(job_as_api_dict(job))


class JobPauseView(ApiView):
    permission_classes = [IsAuthenticated, Reviewer]

    @_decision_schema("pause", "Pause a running job", (
        "Running -> paused, with who and why: the chunk in flight finishes and no other starts. Any other state "
        "is `409 job_conflict`."), {"reason": "checking the first results"})
    def post(self, request: Request, job_id: int) -> Response:
        decided_by = principal_of(request).name
        data = validated(JobDecisionIn, request.data)
        return Response(job_as_api_dict(bulk.bulk_job_pause(job_id=job_id, decided_by=decided_by,
                                                            reason=data["reason"])))


class JobResumeView(ApiView):
    permission_classes = [IsAuthenticated, Reviewer]

    @_decision_schema("resume", "Resume a paused job", (
        "Paused -> running, at the first pending item. Any other state is `409 job_conflict`."),
        {"reason": "results look right"})
    def post(self, request: Request, job_id: int) -> Response:
        decided_by = principal_of(request).name
        data = validated(JobDecisionIn, request.data)
        return Response(job_as_api_dict(bulk.bulk_job_resume(job_id=job_id, decided_by=decided_by,
                                                             reason=data["reason"])))


class JobAbortView(ApiView):
    permission_classes = [IsAuthenticated, Reviewer]

    @_decision_schema("abort", "Abort a job for good", (
        "A draft, running or paused job stops for good: the chunk in flight finishes, pending items stay "
        "pending. A finished or aborted job is `409 job_conflict`."), {"reason": "wrong filter"})
    def post(self, request: Request, job_id: int) -> Response:
        decided_by = principal_of(request).name
        data = validated(JobDecisionIn, request.data)
        return Response(job_as_api_dict(bulk.bulk_job_abort(job_id=job_id, decided_by=decided_by,
                                                            reason=data["reason"])))


class JobRetryFailedView(ApiView):
    permission_classes = [IsAuthenticated, Reviewer]

    @_decision_schema("retry_failed", "A new draft job over a job's failed items", (
        "Dry runs the same action over the items that failed, in their order, as a new draft job "
        "(`retry_of` names this one) to start like any other. No failed item is 400."),
        {"reason": "the CRM is back"}, created=True)
    def post(self, request: Request, job_id: int) -> Response:
        decided_by = principal_of(request).name
        data = validated(JobDecisionIn, request.data)
        job = bulk.bulk_job_retry_failed(job_id=job_id, decided_by=decided_by, reason=data["reason"])
        return Response(job_as_api_dict(job, sample=True), status=status.HTTP_201_CREATED)
