"""Forks and drift over REST: fork a task at any event, compare two tasks' histories."""

from __future__ import annotations

import uuid
from typing import Any

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiExample, OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from api.authentication import Principal
from api.base import Answer, ApiView, errors, principal_of, written_or_replayed_answer
from api.bodies import (
    TaskForkIn,
    TaskOut,
    answer_ref,
)
from api.permissions import AgentOrViewerOperator
from api.routes import AgentRoute, Operation
from api.serializers import (
    StrictUUIDField,
    task_as_api_dict,
)
from backplane.eventlog import forks, lineage


class DiffSideOut(serializers.Serializer):
    task_id = StrictUUIDField()
    seq = serializers.IntegerField()
    type = serializers.CharField()


class DivergenceOut(serializers.Serializer):
    kind = serializers.ChoiceField(choices=["changed", "only_in_a", "only_in_b"])
    path = serializers.CharField(allow_null=True)
    a = DiffSideOut(allow_null=True)
    b = DiffSideOut(allow_null=True)
    a_value = serializers.JSONField(allow_null=True)
    b_value = serializers.JSONField(allow_null=True)


class DiffCountsOut(serializers.Serializer):
    same = serializers.IntegerField()
    changed = serializers.IntegerField()
    only_in_a = serializers.IntegerField()
    only_in_b = serializers.IntegerField()


class TaskDiffOut(serializers.Serializer):
    a = StrictUUIDField()
    b = StrictUUIDField()
    first_divergence = DivergenceOut(allow_null=True)
    counts = DiffCountsOut()


def task_fork(principal: Principal, data: dict[str, Any], *, task_id: uuid.UUID) -> Answer:
    outcome = forks.task_fork(
        namespace=principal.namespace,
        source_task_id=task_id,
        at_seq=data["at_seq"],
        reason=data["reason"],
        forked_by=principal.name,
        by_staff=principal.is_staff,
        input=data.get("input"),
        task_id=data.get("task_id"),
        sandbox=data.get("sandbox", False),
        tool_answers=[forks.ToolAnswer(**answer) for answer in data.get("tool_answers", [])],
    )
    return written_or_replayed_answer(task_as_api_dict(outcome.task), replayed=not outcome.created)


# Agents fork in their namespace; staff operators fork too (a staff action).
task_fork_route = AgentRoute(
    "TaskForkView",
    permission=AgentOrViewerOperator,
    post=Operation(task_fork, dict(
        operation_id="tasks_fork",
        summary="Fork a task at any event: a new task that continues its history from there",
        description=(
            "Creates a `pending` task of the source's namespace and kind whose log opens with `TaskStarted` "
            "(the source's `input`, or the replacement given) and `TaskForked`, naming the source, `at_seq` and "
            "the hash of the source's event there. The source's events up to `at_seq` are the fork's history: "
            "its recovery context presents them as confirmed, and the tool-call proxy answers the fork's calls "
            "of those steps from the source's record (one side effect across a source and all its forks). The "
            "source is never written. Closed sources (failed, dead-lettered) fork like any other; forks of forks "
            "work.\n\n"
            "`sandbox: true` makes a fork for replaying an agent against the record: tool calls and sub-agents "
            "are answered only from the source's record (`tool_answers` edits that record for the replay), it "
            "sends no message, fleet agents never claim it (claim it with `task_id` on `leases_claim`), and it "
            "can only be forked into another sandbox (`409 sandbox_refused`).\n\n"
            "Idempotent on `task_id` like a create: the same fork again is `200` with the same task; that id "
            "for anything else is `409 task_exists`. `at_seq` outside 1..`last_seq` is `400`; another "
            "namespace's task is `404`. Agents fork within their namespace; staff sessions in any."
        ),
        request=TaskForkIn,
        examples=[
            OpenApiExample("fork a failed task before the step that went wrong", request_only=True, value={
                "at_seq": 9, "reason": "retry the mail with the fixed template",
                "task_id": "6b1c9a7e-3f1d-4c36-9d0e-2a5c8b7d4e11"}),
            OpenApiExample("a sandbox to replay the agent, one tool answer edited", request_only=True, value={
                "at_seq": 1, "reason": "replay with the new prompt", "sandbox": True,
                "tool_answers": [{"step": 2, "tool": "crm-lookup", "status": "succeeded",
                                  "result": {"employees": 12}}]}),
        ],
        responses={201: answer_ref(TaskOut), 200: answer_ref(TaskOut),
                   **errors(404, 409, conflicts=("task_exists", "sandbox_refused"), body=True)},
    )),
)


class TaskDiffView(ApiView):
    @extend_schema(
        operation_id="tasks_diff",
        summary="Where two tasks' histories drift apart",
        description=(
            "Compares the histories of two tasks of the caller's namespace (a source and its fork, two attempts, "
            "two replays), each read through its sources as its recovery context is. Events are aligned by type "
            "and step (and tool or sub-agent kind) and compared on type and payload, leaving out what differs "
            "between any two runs by construction (keys, lease epochs and deadlines, agent names, task ids) and "
            "the forks' `TaskForked` markers. `first_divergence` is the first aligned pair that differs: the "
            "event on each side (null on the side that has none), the JSON path of the first differing field "
            "and the two values there; `counts` sums the aligned pairs by kind."
        ),
        parameters=[OpenApiParameter("other_id", OpenApiTypes.UUID, OpenApiParameter.PATH,
                                     description="the task compared with `task_id` (b; `task_id` is a)")],
        responses={200: TaskDiffOut, **errors(404)},
    )
    def get(self, request: Request, task_id: uuid.UUID, other_id: uuid.UUID) -> Response:
        drift = lineage.tasks_diff(namespace=principal_of(request).namespace, a_id=task_id, b_id=other_id)
        return Response({"a": str(task_id), "b": str(other_id), **drift})
