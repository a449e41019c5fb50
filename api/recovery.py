"""Leases, the tool-call proxy and sub-agent hand-off over REST (docs/api.md)."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

from django.conf import settings
from drf_spectacular.utils import OpenApiExample, OpenApiParameter, OpenApiResponse
from rest_framework import status

from api.approvals import awaiting_answer
from api.authentication import Principal
from api.base import (
    DISPATCH_CONFLICTS,
    REPLAY_HEADER,
    WRITE_CONFLICTS,
    Answer,
    errors,
    written_or_replayed_answer,
)
from api.bodies import (
    AwaitingApprovalOut,
    HeartbeatOut,
    LeaseClaimIn,
    LeaseClaimOut,
    LeaseEpochIn,
    SubtaskIn,
    SubtaskOut,
    TaskOut,
    ToolCallDispatchIn,
    ToolCallDispatchOut,
    ToolCallOut,
    ToolCallResultIn,
    ToolInvokeIn,
    ToolInvokeOut,
    answer_ref,
)
from api.privacy import reader_of
from api.routes import AgentRoute, Operation
from api.serializers import (
    optional_timestamp,
    task_as_api_dict,
)
from backplane.eventlog.chain import format_timestamp
from backplane.eventlog.models import Task
from recovery import gateway, leases, selectors, subtasks, tool_calls
from recovery.errors import ApprovalPending
from recovery.models import ToolCall, ToolCallStatus

# --- answers -------------------------------------------------------------------------------


def _public_status(call: ToolCall) -> str:
    # Stored as "dispatched"; the contract calls an unanswered replayed call "in_flight".
    return "in_flight" if call.status == ToolCallStatus.DISPATCHED else call.status


def tool_call_as_api_dict(call: ToolCall) -> dict[str, Any]:
    return {
        "idempotency_key": call.idempotency_key,
        "effect_key": call.effect_key,
        "task_id": str(call.task_id),
        "step": call.step,
        "tool": call.tool,
        "input": call.input,
        "compensation": call.compensation,
        "status": _public_status(call),
        "result": call.result,
        "dispatched_at": optional_timestamp(call.dispatched_at),
        "completed_at": optional_timestamp(call.completed_at),
        "expires_at": optional_timestamp(call.expires_at),
    }


# --- the agent routes' operations (api/routes.py) ---------------------------------------------


def lease_claim(principal: Principal, data: dict[str, Any]) -> Answer:
    assert principal.agent is not None  # agents_only
    claim = leases.lease_claim(
        agent=principal.agent,
        kinds=data.get("kinds"),
        lease_seconds=data.get("lease_seconds", settings.BACKPLANE_LEASE_SECONDS),
        task_id=data.get("task_id"),
    )
    return claim_answer(claim)


def claim_answer(claim: leases.Claim | None) -> Answer:
    """What a claim answers, on either stack (an agent's is made on the event loop, api/agent_front.py)."""
    if claim is None:
        return Answer(None, status.HTTP_204_NO_CONTENT)
    return Answer({
        "task": task_as_api_dict(claim.task),
        "lease_epoch": claim.lease_epoch,
        "expires_at": format_timestamp(claim.expires_at),
        "recovered": claim.recovered,
    })


def lease_heartbeat(principal: Principal, data: dict[str, Any], *, task_id: uuid.UUID) -> Answer:
    task = leases.lease_heartbeat(namespace=principal.namespace, task_id=task_id, lease_epoch=data["lease_epoch"],
                                  agent=principal.name)
    return heartbeat_answer(task)


def heartbeat_answer(task: Task) -> Answer:
    """What a heartbeat answers, on either stack (an agent's is made on the event loop, api/agent_front.py)."""
    return Answer({"expires_at": optional_timestamp(task.lease_expires_at)})


def tool_call_dispatch(principal: Principal, data: dict[str, Any], *, task_id: uuid.UUID) -> Answer:
    try:
        outcome = tool_calls.tool_call_dispatch(
            namespace=principal.namespace,
            task_id=task_id,
            step=data["step"],
            tool=data["tool"],
            input=data["input"],
            agent=principal.name,
            lease_epoch=data.get("lease_epoch"),
            compensation=dict(data["compensation"]) if data.get("compensation") else None,
            kinds=principal.kinds,
            reason=data.get("reason", ""),
        )
    except ApprovalPending as pending:
        return awaiting_answer(pending.request)
    return dispatch_answer(outcome)


def dispatch_answer(outcome: tool_calls.ToolCallOutcome) -> Answer:
    """What a dispatch answers, on either stack (an agent's new call is made on the event loop)."""
    call = outcome.call
    if not outcome.replayed:
        return Answer({
            "idempotency_key": call.idempotency_key,
            "effect_key": call.effect_key,
            "status": "dispatched",
            "dispatched_at": optional_timestamp(call.dispatched_at),
            "replayed": False,
        }, status.HTTP_201_CREATED)
    if call.status == ToolCallStatus.DISPATCHED:
        body = {
            "idempotency_key": call.idempotency_key,
            "effect_key": call.effect_key,
            "status": "in_flight",
            "dispatched_at": optional_timestamp(call.dispatched_at),
            "replayed": True,
        }
    else:
        body = {"idempotency_key": call.idempotency_key, "effect_key": call.effect_key, "status": call.status,
                "result": call.result, "replayed": True}
    return Answer(body, status.HTTP_200_OK, {REPLAY_HEADER: "true"})


def tool_call_result(principal: Principal, data: dict[str, Any], *, key: str) -> Answer:
    outcome = tool_calls.tool_call_record_result(
        namespace=principal.namespace,
        key=key,
        status=data["status"],
        result=data["result"],
        agent=principal.name,
        lease_epoch=data.get("lease_epoch"),
        cost=data.get("cost"),
        kinds=principal.kinds,
    )
    return result_answer(outcome)


def result_answer(outcome: tool_calls.ToolCallOutcome) -> Answer:
    """What recording a tool's answer answers, on either stack."""
    body = {**tool_call_as_api_dict(outcome.call), "replayed": outcome.replayed}
    return written_or_replayed_answer(body, replayed=outcome.replayed)


# --- leases --------------------------------------------------------------------------------


leases_route = AgentRoute(
    "LeasesView",
    post=Operation(lease_claim, dict(
        operation_id="leases_claim",
        summary="Claim the oldest pending task of some kinds under a lease",
        description=(
            "Agents only. Takes the oldest `pending` task of the given kinds (default: every kind the agent may "
            "claim) in the agent's namespace, leases it for `lease_seconds` (default 30, 1-3600) and writes "
            "`TaskClaimed`. Send the returned `lease_epoch` with every write to the task, heartbeat before "
            "`expires_at`, and finish with `TaskCompleted` or `TaskFailed` (see the append operation). "
            "`recovered` is true when an earlier attempt stalled or failed: read `recovery-context` first. "
            "`204` with no body when nothing is pending.\n\n"
            "With `task_id`, claims that very task if it is `pending` and of a kind the agent may claim (`204` "
            "otherwise): how a sandbox replay runs its sandbox fork, which is never handed out by kind."
        ),
        request=LeaseClaimIn,
        examples=[OpenApiExample("claim", request_only=True, value={"kinds": ["lead-qualification"],
                                                                    "lease_seconds": 60})],
        responses={200: answer_ref(LeaseClaimOut), 204: OpenApiResponse(description="nothing pending"),
                   **errors(403, 409, conflicts=("budget_exceeded",), body=True)},
    ), agents_only=True),
)


heartbeat_route = AgentRoute(
    "HeartbeatView",
    post=Operation(lease_heartbeat, dict(
        operation_id="tasks_heartbeat",
        summary="Extend the lease",
        description=(
            "Moves the live lease's deadline on by its length (no event is written). A heartbeat that "
            "arrives after `expires_at` is `409 stale_lease` even if the stall detector has not swept the "
            "task yet: so is every write sent with that lease's epoch. Heartbeat at a third of the lease "
            "or more often, and claim again after a 409."
        ),
        request=LeaseEpochIn,
        examples=[OpenApiExample("heartbeat", request_only=True, value={"lease_epoch": 4})],
        responses={200: answer_ref(HeartbeatOut), **errors(403, 404, 409, conflicts=("stale_lease",), body=True)},
    ), agents_only=True),
)


def lease_release(principal: Principal, data: dict[str, Any], *, task_id: uuid.UUID) -> Answer:
    task = leases.lease_release(namespace=principal.namespace, task_id=task_id, lease_epoch=data["lease_epoch"],
                                agent=principal.name)
    return Answer(task_as_api_dict(task))


release_route = AgentRoute(
    "ReleaseView",
    post=Operation(lease_release, dict(
        operation_id="tasks_release",
        summary="Give the task back to pending without counting an attempt",
        description=(
            "Ends the caller's lease: the task is `pending` again for any agent, `attempts` unchanged. "
            "`409 stale_lease` when `lease_epoch` is not the current lease."
        ),
        request=LeaseEpochIn,
        examples=[OpenApiExample("release", request_only=True, value={"lease_epoch": 4})],
        responses={200: answer_ref(TaskOut), **errors(403, 404, 409, conflicts=("stale_lease",), body=True)},
    ), agents_only=True),
)


# --- tool calls ----------------------------------------------------------------------------


tool_calls_route = AgentRoute(
    "ToolCallDispatchView",
    post=Operation(tool_call_dispatch, dict(
        operation_id="tasks_tool_calls_dispatch",
        summary="Record a tool call before making it; a repeat answers from the record",
        description=(
            "The idempotency proxy. The key is sha256(\"{task_id}:{step}:{tool}\") in lowercase hex, computed "
            "here. First time: `201` with `status: dispatched` and a `ToolCallDispatched` event; make the call "
            "with the key as its `Idempotency-Key`, then record the answer with `tool_calls_result`. Again for "
            "the same step and tool: `200`, `replayed: true`, with `status` `succeeded` or `failed` and the "
            "`result`, or `in_flight` when no answer was recorded. The same key with other `input` is "
            "`422 idempotency_mismatch`. `compensation` names the tool call that undoes this one if the task "
            "fails for good.\n\n"
            "`effect_key` is the key to send the tool as its `Idempotency-Key`. It equals `idempotency_key`, "
            "except in a fork (`tasks_fork`) for a step its source dispatched before the fork point: there the "
            "call is answered from the source's record (`200`, `replayed: true`), or, when the source never "
            "recorded an answer, is `in_flight` under the source's `effect_key`, so the tool sees the same key "
            "and acts once across the source and its forks. A sandbox fork answers only from the record: a "
            "call with no recorded answer is `409 sandbox_refused`, and nothing is written.\n\n"
            "A call a tool policy gates (docs/approvals.md) is not made yet: `202` with `status: "
            "awaiting_approval` and its approval request (`ApprovalRequested` in the task's log; `reason` is "
            "shown to the people asked). The same dispatch again answers the same request until it is decided "
            "(`approvals_read` waits for that); once granted it is made as above, with the same arguments only "
            "(other arguments for the step are `422 idempotency_mismatch`); denied or expired, it is `409 "
            "approval_denied` or `409 approval_expired`."
        ),
        request=ToolCallDispatchIn,
        examples=[OpenApiExample("dispatch", request_only=True, value={
            "step": 3, "tool": "crm.lookup", "input": {"email": "alice@example.com"}, "lease_epoch": 4,
            "compensation": {"tool": "crm.forget", "input": {"email": "alice@example.com"}}})],
        responses={201: answer_ref(ToolCallDispatchOut), 200: answer_ref(ToolCallDispatchOut),
                   202: answer_ref(AwaitingApprovalOut),
                   **errors(403, 404, 409, 422, conflicts=DISPATCH_CONFLICTS, body=True)},
    ), agents_only=True),
)


tool_call_result_route = AgentRoute(
    "ToolCallResultView",
    post=Operation(tool_call_result, dict(
        operation_id="tool_calls_result",
        summary="Record a tool call's answer once",
        description=(
            "Records the answer of a dispatched call and writes `ToolCallResultReceived` to the task: `201`. "
            "The identical answer again is `200` (`replayed: true`); a different answer for an answered key is "
            "`422 idempotency_mismatch`. The key is the one `tasks_tool_calls_dispatch` returned."
        ),
        parameters=[OpenApiParameter("key", str, OpenApiParameter.PATH,
                                     description="the tool call's idempotency key, 64 lowercase hex digits")],
        request=ToolCallResultIn,
        examples=[OpenApiExample("succeeded", request_only=True, value={
            "status": "succeeded", "result": {"company": "Acme", "employees": 120}, "lease_epoch": 4})],
        responses={201: answer_ref(ToolCallOut), 200: answer_ref(ToolCallOut), **errors(403, 404, 409, 422, body=True)},
    ), agents_only=True),
)


def tool_call_read(principal: Principal, query: Mapping[str, str], *, key: str) -> Answer:
    return Answer(tool_call_as_api_dict(selectors.tool_call_visible(namespace=principal.namespace, key=key)))


tool_call_detail_route = AgentRoute(
    "ToolCallDetailView",
    get=Operation(tool_call_read, dict(
        operation_id="tool_calls_retrieve",
        summary="One tool call record",
        description="The record behind an idempotency key, for a task of the caller's namespace.",
        parameters=[OpenApiParameter("key", str, OpenApiParameter.PATH,
                                     description="the tool call's idempotency key, 64 lowercase hex digits")],
        responses={200: answer_ref(ToolCallOut), **errors(404)},
    )),
)


# --- sub-agents ----------------------------------------------------------------------------


def subtask_dispatch(principal: Principal, data: dict[str, Any], *, task_id: uuid.UUID) -> Answer:
    outcome = subtasks.subtask_dispatch(
        namespace=principal.namespace,
        parent_task_id=task_id,
        step=data["step"],
        kind=data["kind"],
        input=data["input"],
        agent=principal.name,
        lease_epoch=data.get("lease_epoch"),
        kinds=principal.kinds,
    )
    return subtask_answer(outcome)


def subtask_answer(outcome: subtasks.SubtaskOutcome) -> Answer:
    """What a hand-off answers, on either stack (an agent's new one is made on the event loop)."""
    body = {"task": task_as_api_dict(outcome.child), "dispatch_key": outcome.dispatch_key}
    return written_or_replayed_answer(body, replayed=not outcome.created)


subtasks_route = AgentRoute(
    "SubtasksView",
    post=Operation(subtask_dispatch, dict(
        operation_id="tasks_subtasks_dispatch",
        summary="Hand work to a sub-agent: a child task and SubAgentDispatched in the parent",
        description=(
            "Creates a child task of `kind` in the parent's namespace and writes `SubAgentDispatched` into the "
            "parent's log, in one transaction. The same step and kind again is `200` with the same child. "
            "Claiming the child writes `SubAgentAccepted` into the parent; the child's end writes "
            "`SubAgentResultReceived` there.\n\n"
            "In a fork, a step whose hand-off the source made before the fork point gets the source's child, "
            "never a second one: a finished child's result is written into the fork's log at once; an "
            "unfinished one is adopted, and its result is written into the fork too when it ends. A sandbox "
            "gets recorded children only (`409 sandbox_refused` for a hand-off with no finished child on "
            "record)."
        ),
        request=SubtaskIn,
        examples=[OpenApiExample("delegate", request_only=True, value={
            "step": 4, "kind": "research", "input": {"company": "Acme"}, "lease_epoch": 4})],
        responses={201: answer_ref(SubtaskOut), 200: answer_ref(SubtaskOut),
                   **errors(403, 404, 409, 422, conflicts=WRITE_CONFLICTS, body=True)},
    ), agents_only=True),
)


def recovery_context(principal: Principal, query: Mapping[str, str], *, task_id: uuid.UUID) -> Answer:
    # An agent resumes the work with its namespace's personal values opened (a token acting for a
    # person: that person's read, recorded); staff see them sealed.
    return Answer(selectors.recovery_context(namespace=principal.namespace, task_id=task_id,
                                             personal_opened=principal.agent is not None,
                                             reader=reader_of(principal)))


recovery_context_route = AgentRoute(
    "RecoveryContextView",
    get=Operation(recovery_context, dict(
        operation_id="tasks_recovery_context",
        summary="What a recovering agent needs to resume (built from the event log)",
        description=(
            "For an agent that claimed a task with `recovered: true`: the attempt, the seq to resume from, the "
            "completed steps, tool calls (answered and still in flight), sub-tasks, the last reasoning step and "
            "a prompt that says where to pick up. Built from the event log only."
        ),
        responses={200: OpenApiResponse(description="recovery context"), **errors(404)},
    )),
)


# --- the tool gateway ----------------------------------------------------------------------


def tool_invoke(principal: Principal, data: dict[str, Any], *, name: str) -> Answer:
    try:
        outcome = gateway.tool_invoke(
            namespace=principal.namespace,
            task_id=data["task_id"],
            step=data["step"],
            tool_name=name,
            input=data["input"],
            agent=principal.name,
            lease_epoch=data.get("lease_epoch"),
            kinds=principal.kinds,
            reason=data.get("reason", ""),
        )
    except ApprovalPending as pending:
        return awaiting_answer(pending.request)
    call = outcome.call
    body = {"idempotency_key": call.idempotency_key, "status": call.status, "result": call.result,
            "replayed": outcome.replayed}
    return Answer(body, status.HTTP_200_OK, {REPLAY_HEADER: "true"} if outcome.replayed else {})


tool_invoke_route = AgentRoute(
    "ToolInvokeView",
    post=Operation(tool_invoke, dict(
        operation_id="tools_invoke",
        summary="The backplane calls a registered tool with an Idempotency-Key, or answers from the record",
        description=(
            "The key is the tool call's: sha256(\"{task_id}:{step}:{name}\"). `ToolCallDispatched` is committed "
            "before the tool is called and `ToolCallResultReceived` when it answers; the answer is kept for the "
            "tool's TTL and a repeat gets it with `replayed: true` without calling the tool. A 2xx answer is "
            "`succeeded` (a body that is not a JSON object comes as `{\"value\": ...}`), a 4xx refusal is "
            "`failed` with `{\"status_code\", \"body\"}`. No usable answer (transport error, timeout, 5xx, 408, "
            "429) is `502 tool_unavailable`: the call stays in flight and a retry sends the same key. "
            "`503 circuit_open` while the tool's breaker is open and `429 rate_limited` beyond its per-minute "
            "limit, both with `Retry-After`, without calling the tool. A call a tool policy gates is `202 "
            "awaiting_approval` until people approve it, as `tasks_tool_calls_dispatch` says (docs/approvals.md); "
            "once granted, the same invoke calls the tool."
        ),
        parameters=[OpenApiParameter("name", str, OpenApiParameter.PATH, description="the registered tool's name")],
        request=ToolInvokeIn,
        examples=[OpenApiExample("invoke", request_only=True, value={
            "task_id": "3f0c1f9e-8a0e-4a51-9d57-6c1f0f7f2a10", "step": 3, "input": {"email": "alice@example.com"},
            "lease_epoch": 4})],
        responses={200: answer_ref(ToolInvokeOut), 202: answer_ref(AwaitingApprovalOut),
                   **errors(403, 404, 409, 422, 502, conflicts=DISPATCH_CONFLICTS, body=True)},
    ), agents_only=True),
)
