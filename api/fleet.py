"""Fleet operations over REST: cancel a task; pause and resume a namespace or a kind (staff)."""

from __future__ import annotations

import uuid
from typing import Any

from drf_spectacular.utils import OpenApiExample, OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.permissions import IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response

from api.authentication import Principal
from api.base import ApiView, errors, principal_of, validated
from api.bodies import (
    TaskOut,
    answer_ref,
)
from api.permissions import AgentOrViewerOperator, StaffViewerOperator
from api.serializers import (
    StrictBooleanField,
    StrictCharField,
    StrictSerializer,
    name_field,
    optional_timestamp,
    task_as_api_dict,
)
from recovery import fleet, selectors
from recovery.models import Pause

REASON_MAX_CHARS = 2000


class TaskCancelIn(StrictSerializer):
    reason = StrictCharField(min_length=1, max_length=REASON_MAX_CHARS)
    compensate = StrictBooleanField(required=False, help_text="also undo the task's side effects (its saga)")


class PauseIn(StrictSerializer):
    namespace = name_field()
    kind = name_field(required=False, help_text="leave out to pause every kind of the namespace")
    reason = StrictCharField(min_length=1, max_length=REASON_MAX_CHARS)


class PauseResumeIn(StrictSerializer):
    reason = StrictCharField(min_length=1, max_length=REASON_MAX_CHARS)


class PauseOut(serializers.Serializer):
    id = serializers.IntegerField()
    namespace = serializers.CharField()
    kind = serializers.CharField(allow_null=True, help_text="null: the whole namespace")
    reason = serializers.CharField()
    paused_by = serializers.CharField()
    paused_at = serializers.CharField()
    in_force = serializers.BooleanField()
    resumed_by = serializers.CharField(allow_null=True)
    resumed_at = serializers.CharField(allow_null=True)
    resume_reason = serializers.CharField(allow_null=True)


class PauseListOut(serializers.Serializer):
    in_force = PauseOut(many=True)
    recently_lifted = PauseOut(many=True, help_text=f"the last {selectors.RECENT_LIFTED} lifted, newest first")


def pause_as_api_dict(pause: Pause) -> dict[str, Any]:
    lifted = pause.resumed_at is not None
    return {"id": pause.pk, "namespace": pause.namespace, "kind": pause.kind or None, "reason": pause.reason,
            "paused_by": pause.paused_by, "paused_at": optional_timestamp(pause.paused_at), "in_force": not lifted,
            "resumed_by": pause.resumed_by if lifted else None, "resumed_at": optional_timestamp(pause.resumed_at),
            "resume_reason": pause.resume_reason if lifted else None}


def actor_of(principal: Principal) -> str:
    """Who the cancellation names: a staff user as ``user:<name>``, an agent as ``agent:<name>``."""
    return principal.name if principal.is_staff else f"agent:{principal.name}"


_PAUSE_EXAMPLE = {
    "id": 4, "namespace": "acme", "kind": "lead-qualification", "reason": "the CRM tool rejects every lookup",
    "paused_by": "user:dana", "paused_at": "2026-12-02T01:40:00.000000Z", "in_force": True, "resumed_by": None,
    "resumed_at": None, "resume_reason": None,
}


class TaskCancelView(ApiView):
    permission_classes = [IsAuthenticated, AgentOrViewerOperator]

    @extend_schema(
        operation_id="tasks_cancel",
        summary="Cancel a task: it is closed, its lease holder's next write is refused",
        description=(
            "Writes `TaskCancelled` (who, why, whether to compensate) into the task's log: the task becomes "
            "`cancelled`, a closed status, and loses its lease. Its holder's next append, tool call, heartbeat or "
            "release is `409 task_closed` whose details name the cancellation (`cancelled_by`, `reason`, "
            "`cancelled_at`), so a cooperative agent stops at its next step. `compensate: true` starts the task's "
            "saga as a terminal failure does: `compensating` while compensations are due, then `compensated`. A "
            "cancelled sub-task reports to its parent like a failed one (`SubAgentResultReceived` with status "
            "`cancelled`).\n\n"
            "Staff sessions cancel in any namespace; an agent cancels its own namespace's tasks (another "
            "namespace's task is `404`). A task that has already finished is `409 task_closed` naming its status, "
            "and its cancellation if it was cancelled."
        ),
        parameters=[OpenApiParameter("task_id", uuid.UUID, OpenApiParameter.PATH, description="the task's id")],
        request=TaskCancelIn,
        examples=[
            OpenApiExample("cancel", request_only=True, value={"reason": "prompt v7 loops on step 3"}),
            OpenApiExample("cancel and undo its side effects", request_only=True,
                           value={"reason": "charged the wrong card", "compensate": True}),
        ],
        responses={200: answer_ref(TaskOut),
                   **errors(404, 409, conflicts=("task_closed", "task_cancelled"), body=True)},
    )
    def post(self, request: Request, task_id: uuid.UUID) -> Response:
        principal = principal_of(request)
        data = validated(TaskCancelIn, request.data)
        task = fleet.task_cancel(namespace=principal.namespace, task_id=task_id, cancelled_by=actor_of(principal),
                                 reason=data["reason"], compensate=data.get("compensate", False))
        return Response(task_as_api_dict(task))


class PausesView(ApiView):
    permission_classes = [IsAuthenticated, StaffViewerOperator]

    @extend_schema(
        operation_id="pauses_list",
        summary="The pauses in force, and the recently lifted ones",
        description="Staff only. A pause in force holds back the pending work of its namespace (no `kind`) or of "
                    "one kind in it: claims pass over it; leases already held run on.",
        responses={200: PauseListOut, **errors(403)},
        examples=[OpenApiExample("one pause in force", response_only=True,
                                 value={"in_force": [_PAUSE_EXAMPLE], "recently_lifted": []})],
    )
    def get(self, request: Request) -> Response:
        return Response({"in_force": [pause_as_api_dict(p) for p in selectors.pauses_in_force()],
                         "recently_lifted": [pause_as_api_dict(p) for p in selectors.pauses_recently_lifted()]})

    @extend_schema(
        operation_id="pauses_set",
        summary="Pause a namespace, or one kind of it",
        description=(
            "Staff only; agents get `403`. From now on claims (`leases_claim`, with or without `task_id`) pass "
            "over the scope's pending tasks; running leases finish normally, and the task page says which pause "
            "holds a pending task back. One pause in force per scope: a second is `409 pause_in_force`, naming "
            "the first. Lift it with `pauses_resume`."
        ),
        request=PauseIn,
        examples=[
            OpenApiExample("pause a kind", request_only=True, value={
                "namespace": "acme", "kind": "lead-qualification", "reason": "the CRM tool rejects every lookup"}),
            OpenApiExample("pause a namespace", request_only=True,
                           value={"namespace": "acme", "reason": "a bad deploy is being rolled back"}),
            OpenApiExample("paused", response_only=True, value=_PAUSE_EXAMPLE),
        ],
        responses={201: PauseOut, **errors(403, 409, conflicts=("pause_in_force",), body=True)},
    )
    def post(self, request: Request) -> Response:
        by = principal_of(request).name
        data = validated(PauseIn, request.data)
        pause = fleet.pause_set(namespace=data["namespace"], kind=data.get("kind", ""), paused_by=by,
                                reason=data["reason"])
        return Response(pause_as_api_dict(pause), status=201)


class PauseResumeView(ApiView):
    permission_classes = [IsAuthenticated, StaffViewerOperator]

    @extend_schema(
        operation_id="pauses_resume",
        summary="Lift a pause: its work is claimed again",
        description="Staff only; recorded on the pause with who and why. A pause lifted before is "
                    "`409 already_decided`.",
        parameters=[OpenApiParameter("pause_id", int, OpenApiParameter.PATH, description="the pause's id")],
        request=PauseResumeIn,
        examples=[
            OpenApiExample("resume", request_only=True, value={"reason": "the CRM fix is deployed"}),
            OpenApiExample("lifted", response_only=True, value={
                **_PAUSE_EXAMPLE, "in_force": False, "resumed_by": "user:dana",
                "resumed_at": "2026-12-02T02:10:00.000000Z", "resume_reason": "the CRM fix is deployed"}),
        ],
        responses={200: PauseOut, **errors(403, 404, 409, conflicts=("already_decided",), body=True)},
    )
    def post(self, request: Request, pause_id: int) -> Response:
        by = principal_of(request).name
        data = validated(PauseResumeIn, request.data)
        pause = fleet.pause_lift(pause_id=pause_id, resumed_by=by, reason=data["reason"])
        return Response(pause_as_api_dict(pause))
