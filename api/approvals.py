"""/api/v1/approvals/: gated tool calls waiting for people (docs/approvals.md).

An agent reads its request (``approvals_read``, an agent route: ``?wait=`` seconds holds the answer
until it is decided, on the HTTP front without a thread or a database connection while it waits,
api/agent_front.py); staff list them; a person approves or denies one."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

from drf_spectacular.utils import OpenApiExample, OpenApiParameter, extend_schema
from rest_framework import status
from rest_framework.permissions import IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response

from api.base import Answer, ApiView, errors, principal_of, query_int, validated
from api.bodies import ApprovalListOut, ApprovalOut, answer_ref
from api.permissions import ApprovalDecider
from api.routes import AgentRoute, Operation
from api.serializers import StrictCharField, StrictSerializer, optional_timestamp
from backplane.eventlog.errors import InvalidInput
from recovery import approvals, selectors
from recovery.models import ApprovalRequest, ApprovalStatus, ApprovalVerdict

# The longest an agent's read of its request waits for the decision, in seconds.
WAIT_MAX_SECONDS = 30


def awaiting_answer(request: ApprovalRequest) -> Answer:
    """What a gated dispatch answers while its request is pending (either stack, the gateway too)."""
    return Answer({
        "status": "awaiting_approval", "approval_id": str(request.pk), "idempotency_key": request.idempotency_key,
        "argument_sha256": request.argument_sha256, "policy_id": request.policy_id,
        "policy_version": request.policy.version, "group": request.group.name,
        "approvals_required": request.policy.approvals_required, "expires_at": optional_timestamp(request.expires_at),
    }, status.HTTP_202_ACCEPTED)


def approval_as_api_dict(request: ApprovalRequest) -> dict[str, Any]:
    return {
        "approval_id": str(request.pk), "task_id": str(request.task_id), "step": request.step, "tool": request.tool,
        "idempotency_key": request.idempotency_key, "input": request.input,
        "argument_sha256": request.argument_sha256, "reason": request.reason, "requested_by": request.requested_by,
        "requested_at": optional_timestamp(request.requested_at), "policy_id": request.policy_id,
        "policy_version": request.policy.version, "status": request.status,
        "approvals_required": request.policy.approvals_required, "group": request.group.name,
        "escalated": request.escalated, "expires_at": optional_timestamp(request.expires_at),
        "decided_at": optional_timestamp(request.decided_at),
        "decisions": [{"by": d.decided_by, "verdict": d.verdict, "reason": d.reason, "at": optional_timestamp(d.at)}
                      for d in sorted(request.decisions.all(), key=lambda d: (d.at, d.pk))],
    }


def read_wait_seconds(query: Mapping[str, str]) -> int:
    return query_int(query, "wait", default=0, minimum=0, maximum=WAIT_MAX_SECONDS)


def approval_read(principal: Any, query: Mapping[str, str], *, approval_id: uuid.UUID) -> Answer:
    """On Django's stack (a staff session) the answer is given at once; ``wait`` is checked and
    honoured by the HTTP front, which serves agents."""
    read_wait_seconds(query)
    return Answer(approval_as_api_dict(selectors.approval_visible(namespace=principal.namespace,
                                                                  approval_id=approval_id)))


approval_detail_route = AgentRoute(
    "ApprovalDetailView",
    get=Operation(approval_read, dict(
        operation_id="approvals_read",
        summary="One approval request, waiting for its decision if asked to",
        description=(
            "A gated tool call's request (`tasks_tool_calls_dispatch` answered `202 awaiting_approval`), for a "
            "task of the caller's namespace: its arguments and their canonical hash, the policy version, the "
            "group asked, the decisions so far and its `status`: `pending`, `granted` (dispatch the call again, "
            "with the same arguments: it is made), `denied` or `expired` (the dispatch is then `409 "
            "approval_denied` or `409 approval_expired`). With `wait` (seconds, at most 30) an agent's request "
            "is answered as soon as the status changes, or after `wait` seconds with the request as it is; the "
            "wait holds no thread and no database connection. Staff get the answer at once."
        ),
        parameters=[
            OpenApiParameter("approval_id", uuid.UUID, OpenApiParameter.PATH, description="the request's id"),
            OpenApiParameter("wait", int, OpenApiParameter.QUERY, required=False,
                             description=f"seconds to wait for a decision, 0 to {WAIT_MAX_SECONDS}; default 0"),
        ],
        responses={200: answer_ref(ApprovalOut), **errors(404)},
    )),
)


class DecisionIn(StrictSerializer):
    reason = StrictCharField(max_length=2000, min_length=1)


class ApprovalsView(ApiView):
    permission_classes = [IsAuthenticated, ApprovalDecider]

    @extend_schema(
        operation_id="approvals_list",
        summary="Approval requests, the longest waiting first",
        description="Staff only: the pending ones by default, or those of `status`; a staff user scoped to a "
                    "namespace sees its requests only.",
        parameters=[OpenApiParameter("status", str, OpenApiParameter.QUERY, required=False,
                                     enum=[*ApprovalStatus.values, "all"], description="default `pending`")],
        responses={200: answer_ref(ApprovalListOut), **errors(403)},
    )
    def get(self, request: Request) -> Response:
        wanted = request.query_params.get("status", ApprovalStatus.PENDING)
        if wanted not in (*ApprovalStatus.values, "all"):
            raise InvalidInput("unknown status", {"status": f"one of {', '.join(ApprovalStatus.values)}, all"})
        requests = selectors.approvals_list(status=None if wanted == "all" else wanted,
                                            namespace=principal_of(request).namespace)
        return Response({"results": [approval_as_api_dict(r) for r in requests]})


def _decide(verdict: str, operation_id: str, summary: str) -> type[ApiView]:
    class DecideView(ApiView):
        permission_classes = [IsAuthenticated, ApprovalDecider]

        @extend_schema(
            operation_id=operation_id,
            summary=summary,
            description=(
                "A person signed in (a session; agents' tokens are `403`), a member of the group the request asks "
                "now, decides once, with a reason; where the policy asks for four eyes, not the person the "
                "requesting agent acts for (`403`). A denial ends the request; the approvals the policy requires "
                "grant it. Either end is written into the task's chain (`ApprovalDenied`, `ApprovalGranted`: who, "
                "why, the arguments' hash and the policy version) with a message on `backplane.approvals`. A "
                "request already decided or past its time is `409 already_decided`."
            ),
            parameters=[OpenApiParameter("approval_id", uuid.UUID, OpenApiParameter.PATH,
                                         description="the request's id")],
            request=DecisionIn,
            examples=[OpenApiExample("decision", request_only=True,
                                     value={"reason": "checked the invoice against the order"})],
            responses={200: answer_ref(ApprovalOut), **errors(403, 404, 409, conflicts=("already_decided",),
                                                              body=True)},
        )
        def post(self, request: Request, approval_id: uuid.UUID) -> Response:
            principal = principal_of(request)
            data = validated(DecisionIn, request.data)
            approvals.approval_decide(approval_id=approval_id, user=principal.user, verdict=verdict,
                                      reason=data["reason"], namespace=principal.namespace)
            return Response(approval_as_api_dict(selectors.approval_visible(namespace=principal.namespace,
                                                                            approval_id=approval_id)))

    DecideView.__name__ = DecideView.__qualname__ = f"Approval{verdict.title()}View"
    return DecideView


ApprovalApproveView = _decide(ApprovalVerdict.APPROVE, "approvals_approve", "Approve a gated tool call")
ApprovalDenyView = _decide(ApprovalVerdict.DENY, "approvals_deny", "Deny a gated tool call")

