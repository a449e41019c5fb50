"""Tasks and events. Each view validates, calls one service or selector, shapes the answer."""

from __future__ import annotations

import uuid
from typing import Any

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.exceptions import PermissionDenied
from rest_framework.request import Request
from rest_framework.response import Response

from backplane.api.base import ApiView, errors, principal_of, query_int, validated, written_or_replayed
from backplane.api.serializers import (
    ChainVerifyOut,
    EventAppendIn,
    EventBatchIn,
    EventBatchOut,
    EventListOut,
    EventOut,
    TaskCreateIn,
    TaskListOut,
    TaskOut,
    event_as_api_dict,
    task_as_api_dict,
)
from backplane.eventlog import selectors, services
from backplane.eventlog.errors import InvalidInput
from backplane.eventlog.models import TaskStatus
from backplane.eventlog.writer import EventDraft, OutboxDraft


def draft_from(data: dict[str, Any]) -> EventDraft:
    return EventDraft(
        type=data["type"],
        payload=data["payload"],
        idempotency_key=data.get("idempotency_key"),
        lamport=data.get("lamport"),
        causation_id=data.get("causation_id"),
        correlation_id=data.get("correlation_id"),
        trace_id=data.get("trace_id"),
        outbox=tuple(
            OutboxDraft(topic=item["topic"], payload=item["payload"], key=item.get("key"))
            for item in data.get("outbox", [])
        ),
    )


class TasksView(ApiView):
    @extend_schema(
        operation_id="tasks_list",
        summary="List tasks of the caller's namespace, oldest first",
        parameters=[
            OpenApiParameter("status", str, enum=[s.value for s in TaskStatus]),
            OpenApiParameter("kind", str),
            OpenApiParameter("limit", int, description="1-1000, default 100"),
            OpenApiParameter("cursor", str, description="the `next` link's cursor"),
        ],
        responses={200: TaskListOut, **errors()},
    )
    def get(self, request: Request) -> Response:
        status_filter = request.query_params.get("status")
        if status_filter is not None and status_filter not in TaskStatus.values:
            raise InvalidInput("unknown status", {"status": f"one of {', '.join(TaskStatus.values)}"})
        page = selectors.task_list(
            namespace=principal_of(request).namespace,
            status=status_filter,
            kind=request.query_params.get("kind") or None,
            limit=query_int(request, "limit", default=100, minimum=1, maximum=1000),
            cursor=request.query_params.get("cursor") or None,
        )
        next_url = None
        if page.next_cursor:
            query = request.query_params.copy()
            query["cursor"] = page.next_cursor
            next_url = request.build_absolute_uri(f"{request.path}?{query.urlencode()}")
        return Response({"results": [task_as_api_dict(t) for t in page.tasks], "next": next_url})

    @extend_schema(
        operation_id="tasks_create",
        summary="Create a task (idempotent on task_id)",
        request=TaskCreateIn,
        responses={201: TaskOut, 200: TaskOut, **errors(403, 409)},
    )
    def post(self, request: Request) -> Response:
        principal = principal_of(request)
        data = validated(TaskCreateIn, request.data)
        if principal.namespace is None:
            raise PermissionDenied("tasks are created by agents; staff sessions have no namespace to create them in")
        outcome = services.task_create(
            namespace=principal.namespace,
            kind=data["kind"],
            input=data["input"],
            agent=principal.name,
            task_id=data.get("task_id"),
            parent_task_id=data.get("parent_task_id"),
            max_attempts=data.get("max_attempts"),
            metadata=data.get("metadata"),
        )
        return written_or_replayed(task_as_api_dict(outcome.task), replayed=not outcome.created)


class TaskDetailView(ApiView):
    @extend_schema(operation_id="tasks_retrieve", responses={200: TaskOut, **errors(404)})
    def get(self, request: Request, task_id: uuid.UUID) -> Response:
        task = selectors.task_visible(namespace=principal_of(request).namespace, task_id=task_id)
        return Response(task_as_api_dict(task))


class TaskEventsView(ApiView):
    @extend_schema(
        operation_id="tasks_events_list",
        summary="A task's events in seq order",
        parameters=[
            OpenApiParameter("after_seq", int, description="default 0"),
            OpenApiParameter("limit", int, description="1-1000, default 100"),
        ],
        responses={200: EventListOut, **errors(404)},
    )
    def get(self, request: Request, task_id: uuid.UUID) -> Response:
        task = selectors.task_visible(namespace=principal_of(request).namespace, task_id=task_id)
        page = selectors.event_list(
            task=task,
            after_seq=query_int(request, "after_seq", default=0, minimum=0),
            limit=query_int(request, "limit", default=100, minimum=1, maximum=1000),
        )
        return Response({"results": [event_as_api_dict(e) for e in page.events], "next_after_seq": page.next_after_seq})

    @extend_schema(
        operation_id="tasks_events_append",
        summary="Append one event",
        request=EventAppendIn,
        responses={201: EventOut, 200: EventOut, **errors(404, 409, 422)},
    )
    def post(self, request: Request, task_id: uuid.UUID) -> Response:
        principal = principal_of(request)
        data = validated(EventAppendIn, request.data)
        outcome = services.event_append(
            namespace=principal.namespace,
            task_id=task_id,
            draft=draft_from(data),
            agent=principal.name,
            expected_seq=data.get("expected_seq"),
            lease_epoch=data.get("lease_epoch"),
        )
        body = event_as_api_dict(outcome.events[0])
        return written_or_replayed(body, replayed=outcome.replayed)


class TaskEventsBatchView(ApiView):
    @extend_schema(
        operation_id="tasks_events_batch_append",
        summary="Append several events, all or nothing",
        request=EventBatchIn,
        responses={201: EventBatchOut, 200: EventBatchOut, **errors(404, 409, 422)},
    )
    def post(self, request: Request, task_id: uuid.UUID) -> Response:
        principal = principal_of(request)
        data = validated(EventBatchIn, request.data)
        outcome = services.event_append_batch(
            namespace=principal.namespace,
            task_id=task_id,
            drafts=[draft_from(item) for item in data["events"]],
            agent=principal.name,
            expected_seq=data.get("expected_seq"),
            lease_epoch=data.get("lease_epoch"),
        )
        body = {"results": [event_as_api_dict(e) for e in outcome.events]}
        return written_or_replayed(body, replayed=outcome.replayed)


class TaskVerifyView(ApiView):
    @extend_schema(operation_id="tasks_verify", responses={200: ChainVerifyOut, **errors(404)})
    def get(self, request: Request, task_id: uuid.UUID) -> Response:
        task = selectors.task_visible(namespace=principal_of(request).namespace, task_id=task_id)
        result = selectors.chain_verify(task=task)
        return Response(
            {
                "valid": result.valid,
                "checked": result.checked,
                "head_hash": result.head_hash,
                "first_invalid_seq": result.first_invalid_seq,
            }
        )

