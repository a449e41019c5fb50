"""Tasks and events. Each view validates, calls one service or selector, shapes the answer."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

from django.http import QueryDict
from drf_spectacular.utils import OpenApiExample, OpenApiParameter, extend_schema
from rest_framework.request import Request
from rest_framework.response import Response

from api.authentication import Principal
from api.base import (
    WRITE_CONFLICTS,
    Answer,
    ApiView,
    errors,
    principal_of,
    query_int,
    written_or_replayed_answer,
)
from api.bodies import (
    EventAppendIn,
    EventBatchIn,
    EventBatchOut,
    EventListOut,
    EventOut,
    TaskCreateIn,
    TaskListOut,
    TaskOut,
    answer_ref,
)
from api.routes import AgentRoute, Operation
from api.serializers import (
    ChainVerifyOut,
    task_as_api_dict,
)
from backplane.eventlog import lineage, selectors, services
from backplane.eventlog.chain import event_as_api_dict
from backplane.eventlog.errors import InvalidInput
from backplane.eventlog.event_types import SERVER_ONLY_TYPES
from backplane.eventlog.models import TaskStatus
from backplane.eventlog.writer import EventDraft, OutboxDraft
from backplane.integrity import verification
from backplane.runtime.replica import replica_reads


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


# --- the agent routes' operations (api/routes.py) ---------------------------------------------


def task_read(principal: Principal, query: Mapping[str, str], *, task_id: uuid.UUID) -> Answer:
    return Answer(task_as_api_dict(selectors.task_row_visible(namespace=principal.namespace, task_id=task_id)))


def events_page(principal: Principal, query: Mapping[str, str], *, task_id: uuid.UUID) -> Answer:
    page = selectors.event_page_visible(
        namespace=principal.namespace,
        task_id=task_id,
        after_seq=query_int(query, "after_seq", default=0, minimum=0),
        limit=query_int(query, "limit", default=100, minimum=1, maximum=1000),
    )
    return Answer({"results": [event_as_api_dict(e) for e in page.events], "next_after_seq": page.next_after_seq})


def event_append(principal: Principal, data: dict[str, Any], *, task_id: uuid.UUID) -> Answer:
    outcome = services.event_append(
        namespace=principal.namespace,
        task_id=task_id,
        draft=draft_from(data),
        agent=principal.name,
        expected_seq=data.get("expected_seq"),
        lease_epoch=data.get("lease_epoch"),
        kinds=principal.kinds,
    )
    return written_or_replayed_answer(event_as_api_dict(outcome.events[0]), replayed=outcome.replayed)


def event_append_batch(principal: Principal, data: dict[str, Any], *, task_id: uuid.UUID) -> Answer:
    outcome = services.event_append_batch(
        namespace=principal.namespace,
        task_id=task_id,
        drafts=[draft_from(item) for item in data["events"]],
        agent=principal.name,
        expected_seq=data.get("expected_seq"),
        lease_epoch=data.get("lease_epoch"),
        kinds=principal.kinds,
    )
    body = {"results": [event_as_api_dict(e) for e in outcome.events]}
    return written_or_replayed_answer(body, replayed=outcome.replayed)


# A list (and search) of a whole namespace may come from the read replica, at most
# BACKPLANE_REPLICA_MAX_LAG_SECONDS behind. An agent's read of its own task or events after a
# write goes through the other agent routes, which read the primary only.
@replica_reads
def task_list(principal: Principal, query: QueryDict, *, url: str) -> Answer:
    filters = task_list_filters(principal, query)
    return task_list_answer(selectors.task_list(**filters), query, url=url)


def task_list_filters(principal: Principal, query: QueryDict) -> dict[str, Any]:
    """The list's query checked, as ``selectors.task_list`` and ``task_page_query`` take it."""
    status_filter = query.get("status")
    if status_filter is not None and status_filter not in TaskStatus.values:
        raise InvalidInput("unknown status", {"status": f"one of {', '.join(TaskStatus.values)}"})
    return {"namespace": principal.namespace, "status": status_filter, "kind": query.get("kind") or None,
            "limit": query_int(query, "limit", default=100, minimum=1, maximum=1000),
            "cursor": query.get("cursor") or None}


def task_list_answer(page: selectors.TaskPage, query: QueryDict, *, url: str) -> Answer:
    """A page of the list, on either stack, with the link to the next (``url``: the list's, absolute)."""
    next_url = None
    if page.next_cursor:
        following = query.copy()
        following["cursor"] = page.next_cursor
        next_url = f"{url}?{following.urlencode()}"
    return Answer({"results": [task_as_api_dict(t) for t in page.tasks], "next": next_url})


def task_create(principal: Principal, data: dict[str, Any]) -> Answer:
    assert principal.namespace is not None  # an agent's (agents_only)
    outcome = services.task_create(
        namespace=principal.namespace,
        kind=data["kind"],
        input=data["input"],
        agent=principal.name,
        task_id=data.get("task_id"),
        parent_task_id=data.get("parent_task_id"),
        max_attempts=data.get("max_attempts"),
        metadata=data.get("metadata"),
        kinds=principal.kinds,
    )
    return written_or_replayed_answer(task_as_api_dict(outcome.task), replayed=not outcome.created)


# Anyone lists; only agents create (a task is created in the creating agent's namespace).
tasks_route = AgentRoute(
    "TasksView",
    get=Operation(task_list, dict(
        operation_id="tasks_list",
        summary="List tasks of the caller's namespace, oldest first",
        description=(
            "The caller's namespace only (staff sessions see every namespace). Keyset pagination: follow `next` "
            "until it is null; a page never repeats or skips a task created meanwhile."
        ),
        parameters=[
            OpenApiParameter("status", str, enum=[s.value for s in TaskStatus],
                             description="only tasks in this status"),
            OpenApiParameter("kind", str, description="only tasks of this kind"),
            OpenApiParameter("limit", int, description="1-1000, default 100"),
            OpenApiParameter("cursor", str, description="the `next` link's cursor"),
        ],
        responses={200: answer_ref(TaskListOut), **errors()},
    ), with_url=True),
    post=Operation(task_create, dict(
        operation_id="tasks_create",
        summary="Create a task (idempotent on task_id)",
        description=(
            "Creates a `pending` task in the caller's namespace with event 1 `TaskStarted`. Send your own "
            "`task_id` (a random UUID, e.g. uuid4) to make the create safe to retry: the same `task_id` with the "
            "same `kind` and `input` again is `200` with the same Task and `Idempotent-Replay: true`, and writes "
            "nothing.\n\n"
            "Task ids are global UUIDs, unique across namespaces. A `task_id` that is already used, with other "
            "content in your namespace or with any content in another one, is `409 task_exists` with one and the "
            "same message and details in every case: the answer never says whether the id is used elsewhere, "
            "by whom, or with what content, and an identical create from another namespace is not a replay of "
            "that namespace's task. Pick a new UUID and create again. (An unused id cannot answer like a used "
            "one: the id is the task's key.)\n\n"
            "`parent_task_id` must name a task of your namespace; `max_attempts` defaults to the server's "
            "setting (3); `metadata` is stored with `TaskStarted` and not interpreted."
        ),
        request=TaskCreateIn,
        examples=[
            OpenApiExample("a task", request_only=True, value={
                "task_id": "3f0c1f9e-8a0e-4a51-9d57-6c1f0f7f2a10", "kind": "lead-qualification",
                "input": {"lead": "alice@example.com"}, "max_attempts": 3, "metadata": {"source": "crm"}}),
            OpenApiExample("a child task", request_only=True, value={
                "kind": "research", "input": {"company": "Acme"},
                "parent_task_id": "3f0c1f9e-8a0e-4a51-9d57-6c1f0f7f2a10"}),
        ],
        responses={201: answer_ref(TaskOut), 200: answer_ref(TaskOut),
                   **errors(403, 409, conflicts=("task_exists",), body=True)},
    ), agents_only=True),
)


task_detail_route = AgentRoute(
    "TaskDetailView",
    get=Operation(task_read, dict(
        operation_id="tasks_retrieve",
        summary="One task",
        description="The task's current state, the projection of its event log. Another namespace's task is 404.",
        responses={200: answer_ref(TaskOut), **errors(404)},
    )),
)


task_events_route = AgentRoute(
    "TaskEventsView",
    get=Operation(events_page, dict(
        operation_id="tasks_events_list",
        summary="A task's events in seq order",
        description=(
            "Events with `seq` greater than `after_seq`, oldest first. Page on with `after_seq` = "
            "`next_after_seq` until it is null. Each event's `hash` can be checked as docs/api.md describes."
        ),
        parameters=[
            OpenApiParameter("after_seq", int, description="only events after this seq; default 0"),
            OpenApiParameter("limit", int, description="1-1000, default 100"),
        ],
        responses={200: answer_ref(EventListOut), **errors(404)},
    )),
    post=Operation(event_append, dict(
        operation_id="tasks_events_append",
        summary="Append one event",
        description=(
            "Appends one event to the task's log and answers it with its `seq`, `position` and `hash`.\n\n"
            "**Types a client sends.** `ReasoningStepCompleted` (payload needs an integer `step`); "
            "`TaskCompleted` (payload needs `output`, an object) finishes the task: `completed`, lease released; "
            "`TaskFailed` (payload needs `error`, a string, and `retryable`, a boolean) fails the attempt: with "
            "`retryable: true` and attempts left the task goes back to `pending`, otherwise it is `failed` (then "
            "`compensating` if compensations are due); and your own PascalCase types matching "
            "`^[A-Z][A-Za-z0-9]{2,63}$`. `payload` is required on every event, `{}` when the type needs nothing.\n\n"
            "**Reserved**, written only by the server; sending one is `400 validation_error`: "
            + ", ".join(f"`{name}`" for name in sorted(SERVER_ONLY_TYPES)) + ".\n\n"
            "`lease_epoch` is required while the task is leased (`409 stale_lease` otherwise or when it is not "
            "the current one); `expected_seq` makes the write conditional (`409 seq_conflict` with "
            "`details.last_seq`); a completed, failed, dead-lettered or compensated task is `409 task_closed`. "
            "The same `idempotency_key` and body again is `200` with the original event and "
            "`Idempotent-Replay: true`; the key with another body is `422 idempotency_mismatch`. `outbox` "
            "messages (at most 1000) are committed with the event and delivered after it."
        ),
        request=EventAppendIn,
        examples=[
            OpenApiExample("a reasoning step", request_only=True, value={
                "type": "ReasoningStepCompleted", "payload": {"step": 3, "thought": "the lead is a fit"},
                "idempotency_key": "step-3", "lease_epoch": 4}),
            OpenApiExample("finish the task: TaskCompleted with output", request_only=True, value={
                "type": "TaskCompleted", "payload": {"output": {"score": 0.92, "qualified": True}},
                "idempotency_key": "done", "lease_epoch": 4}),
            OpenApiExample("fail the attempt: TaskFailed with error and retryable", request_only=True, value={
                "type": "TaskFailed", "payload": {"error": "CRM timed out", "retryable": True},
                "idempotency_key": "failed-1", "lease_epoch": 4}),
            OpenApiExample("your own type, with an outbox message", request_only=True, value={
                "type": "LeadScored", "payload": {"score": 0.92}, "expected_seq": 5, "lease_epoch": 4,
                "outbox": [{"topic": "leads.scored", "payload": {"score": 0.92}, "key": "alice@example.com"}]}),
        ],
        responses={201: answer_ref(EventOut), 200: answer_ref(EventOut),
                   **errors(403, 404, 409, 422, conflicts=WRITE_CONFLICTS, body=True)},
    ), agents_only=True),
)


task_events_batch_route = AgentRoute(
    "TaskEventsBatchView",
    post=Operation(event_append_batch, dict(
        operation_id="tasks_events_batch_append",
        summary="Append several events, all or nothing",
        description=(
            "Up to 1000 events, each as in the single append (`type` and `payload` required, the same client "
            "types, the same reserved ones refused), written in one transaction: all of them or none. "
            "`expected_seq` and `lease_epoch` apply to the batch. The same batch again (the same idempotency keys "
            "and bodies) is `200` with the original events and `Idempotent-Replay: true`. Errors name the event: "
            "`details` keys like `events[2].payload`."
        ),
        request=EventBatchIn,
        examples=[
            OpenApiExample("steps, then completion", request_only=True, value={
                "expected_seq": 1, "lease_epoch": 4, "events": [
                    {"type": "ReasoningStepCompleted", "payload": {"step": 1}, "idempotency_key": "step-1"},
                    {"type": "TaskCompleted", "payload": {"output": {"score": 0.92}}, "idempotency_key": "done"},
                ]}),
        ],
        responses={201: answer_ref(EventBatchOut), 200: answer_ref(EventBatchOut),
                   **errors(403, 404, 409, 422, conflicts=WRITE_CONFLICTS, body=True)},
    ), agents_only=True),
)


class TaskVerifyView(ApiView):
    @extend_schema(
        operation_id="tasks_verify",
        summary="Check the task's hash chain",
        description=(
            "Recomputes every event's hash (RFC 8785 canonical JSON, SHA-256, each covering the one before) and "
            "reports whether the chain holds, how many events were checked and the first seq that does not. "
            "For a fork, its `TaskForked` (seq 2) must also name the hash its source's event at `at_seq` has."
        ),
        responses={200: ChainVerifyOut, **errors(404)},
    )
    def get(self, request: Request, task_id: uuid.UUID) -> Response:
        task = selectors.task_visible(namespace=principal_of(request).namespace, task_id=task_id)
        # Hashed by integrity's own RFC 8785 implementation, not the writer's: a check that
        # shared the writer's code would agree with any mistake the writer makes.
        result = verification.chain_check(task=task)
        valid, first_invalid = result.valid, result.first_invalid_seq
        if valid and not lineage.fork_provenance_holds(task):
            # A fork's chain covers its TaskForked (seq 2), which must name its source's event.
            valid, first_invalid = False, 2
        return Response({"valid": valid, "checked": result.checked, "head_hash": result.head_hash,
                         "first_invalid_seq": first_invalid})

