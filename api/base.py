"""What every API module shares: the base view, the error responses for the schema, request
helpers and the 201-or-replayed answer. The one public module the API's views build on."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from drf_spectacular.utils import OpenApiExample, OpenApiResponse
from rest_framework import serializers, status
from rest_framework.permissions import IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from api.authentication import Principal
from api.permissions import AgentOrViewer
from api.serializers import ErrorOut
from backplane.eventlog.errors import InvalidInput

REPLAY_HEADER = "Idempotent-Replay"


def _example(name: str, code: str, message: str, details: dict[str, Any] | None = None) -> OpenApiExample:
    return OpenApiExample(name, value={"error": {"code": code, "message": message, "details": details or {}}},
                          response_only=True)


# Each status's meaning in docs/api.md and what its body looks like; every 4xx and 5xx has an example.
ERROR_RESPONSES: dict[int, tuple[str, list[OpenApiExample]]] = {
    400: ("validation_error: malformed JSON (nested deeper than 64 levels, duplicate keys, NUL, lone surrogates, "
          "numbers outside a double), wrong types, unknown fields, a reserved event type. `details` maps fields "
          "(`events[0].payload`, `body` for the JSON itself) to messages.", [
              _example("a missing field", "validation_error", "invalid request", {"kind": "This field is required."}),
              _example("malformed JSON", "validation_error", "the body is not acceptable JSON",
                       {"body": "JSON parse error - duplicate object key 'kind'"}),
          ]),
    401: ("not_authenticated: no token, or a token that is unknown or inactive.", [
        _example("no token", "not_authenticated", "Authentication credentials were not provided."),
    ]),
    403: ("permission_denied: authenticated but not allowed (an agent reviewing dead letters, a staff session "
          "creating tasks).", [
        _example("not a reviewer", "permission_denied",
                 "reviewing dead letters needs a staff user with the review_deadletter permission"),
    ]),
    404: ("not_found: no such object in the caller's namespace (another namespace's task is 404 too), or no "
          "such route.", [
        _example("not found", "not_found", "task not found", {"task_id": "3f0c1f9e-8a0e-4a51-9d57-6c1f0f7f2a10"}),
    ]),
    405: ("method_not_allowed.", [_example("wrong method", "method_not_allowed", 'Method "DELETE" not allowed.')]),
    413: ("payload_too_large: the body is over the limit (default 256 KiB), declared or sent chunked.", [
        _example("too large", "payload_too_large", "request body is over the limit of 262144 bytes"),
    ]),
    415: ("unsupported_media_type: the body is not `application/json`.", [
        _example("not JSON", "unsupported_media_type", 'Unsupported media type "text/plain" in request.'),
    ]),
    422: ("idempotency_mismatch: a known idempotency key (or tool call step) reused with a different body.", [
        _example("key reused", "idempotency_mismatch", "idempotency key reused with a different body",
                 {"idempotency_key": "step-3"}),
    ]),
    429: ("rate_limited: over the per-token rate limit; wait `Retry-After` seconds.", [
        _example("rate limited", "rate_limited", "rate limit exceeded", {"retry_after": 1}),
    ]),
    502: ("tool_unavailable: the tool gave no usable answer; the call stays in flight, retry with the same key.", [
        _example("tool unavailable", "tool_unavailable", "the tool gave no usable answer", {"status_code": 503}),
    ]),
    503: ("circuit_open (the agent's or tool's breaker is open) or unavailable (the database is down); "
          "`Retry-After` says when to retry.", [
        _example("database down", "unavailable", "the database is unavailable; retry later"),
        _example("circuit open", "circuit_open", "circuit open for agent qualifier-1", {"retry_after": 30}),
    ]),
}

CONFLICT_EXAMPLES = {
    "seq_conflict": _example("seq_conflict", "seq_conflict", "expected_seq 3 but the task is at 5",
                             {"last_seq": 5, "expected_seq": 3}),
    "stale_lease": _example("stale_lease", "stale_lease", "lease epoch is not the task's current one",
                            {"lease_epoch": 3}),
    "task_closed": _example("task_closed", "task_closed", "task is completed", {"status": "completed"}),
    "task_exists": _example("task_exists", "task_exists",
                            "this task_id is not available for this task; create it under a new UUID",
                            {"task_id": "already taken; use a new UUID"}),
    "already_decided": _example("already decided", "already_decided", "this dead letter was already requeued"),
    "sandbox_refused": _example("sandbox_refused", "sandbox_refused",
                                "the record has no answer for email-send at step 6, and a sandbox never calls a tool",
                                {"step": 6, "tool": "email-send"}),
}
CONFLICT_EXAMPLES["budget_exceeded"] = _example(
    "budget_exceeded", "budget_exceeded", "the namespace budget of acme is spent: 250.10 of 250.00 USD today",
    {"budget_id": 3, "scope": "namespace", "key": "acme", "period": "day", "unit": "currency", "currency": "USD",
     "limit": "250.00", "spend": "250.10"})
CONFLICT_EXAMPLES["job_conflict"] = _example(
    "job_conflict", "job_conflict", "the selection hash is not this job's frozen list",
    {"status": "draft", "selection_hash": "9f2c4e0b7d1a3c5e8f6a2b4d0c1e3f5a7b9d2c4e6f8a0b1c3d5e7f9a2b4c6d8e"})
CONFLICT_EXAMPLES["pause_in_force"] = _example(
    "pause_in_force", "pause_in_force", "a pause is already in force for this scope",
    {"namespace": "acme", "kind": "lead-qualification", "pause_id": 4, "paused_by": "user:dana",
     "reason": "the CRM tool rejects every lookup"})
CONFLICT_EXAMPLES["task_cancelled"] = _example(
    "task_closed (cancelled)", "task_closed", "task was cancelled by user:dana: prompt v7 loops on step 3",
    {"status": "cancelled", "cancelled_by": "user:dana", "reason": "prompt v7 loops on step 3",
     "cancelled_at": "2026-12-02T01:40:00+00:00"})
# The conflicts of a write: the usual three, what a sandbox refuses (backplane/eventlog/forks.py)
# and a spent budget (recovery/budgets.py).
CONFLICT_EXAMPLES["approval_denied"] = _example(
    "approval_denied", "approval_denied", "people denied this call",
    {"approval_id": "5b0f5b8e-3d0c-4c7e-9a51-2f7f0c1d9e44", "status": "denied", "denied_by": "user:dana",
     "reason": "the invoice does not match the order"})
CONFLICT_EXAMPLES["approval_expired"] = _example(
    "approval_expired", "approval_expired", "the approval request ran out undecided",
    {"approval_id": "5b0f5b8e-3d0c-4c7e-9a51-2f7f0c1d9e44", "status": "expired"})
CONFLICT_EXAMPLES["subject_erased"] = _example(
    "subject_erased", "subject_erased", "data subject 'lead:8812' was erased; its data is no longer taken",
    {"input.email": "subject erased", "erased_at": "2026-12-07T09:12:00.000000Z"})
WRITE_CONFLICTS = ("seq_conflict", "stale_lease", "task_closed", "sandbox_refused", "budget_exceeded",
                   "subject_erased")
# A tool call's dispatch: the writes' conflicts, and the ends of an approval request that refuse it.
DISPATCH_CONFLICTS = (*WRITE_CONFLICTS, "approval_denied", "approval_expired")


def errors(*statuses: int, conflicts: tuple[str, ...] = ("seq_conflict", "stale_lease", "task_closed"),
           body: bool = False) -> dict[int, OpenApiResponse]:
    """The contract's error body for each listed status, plus the ones every route can give,
    each with a description and examples; ``body=True`` for routes that read a request body (415)."""
    common = {400, 401, 413, 429, 503} | ({415} if body else set())
    responses = {}
    for code in sorted(common | set(statuses)):
        if code == 409:
            # By code: two examples of one code (a task closed, a task cancelled) name it once.
            codes = dict.fromkeys(CONFLICT_EXAMPLES[name].value["error"]["code"] for name in conflicts)
            description = "Conflict: " + ", ".join(f"`{code}`" for code in codes) + "."
            examples = [CONFLICT_EXAMPLES[name] for name in conflicts]
        else:
            description, examples = ERROR_RESPONSES[code]
        responses[code] = OpenApiResponse(ErrorOut, description=description, examples=examples)
    return responses


@dataclass(frozen=True)
class Answer:
    """What an operation answers, before it is a DRF ``Response`` (``respond``) or an agent
    route's ``HttpResponse`` (api/routes.py). ``body`` None: no body."""

    body: Any
    status: int = status.HTTP_200_OK
    headers: dict[str, str] = field(default_factory=dict)


def json_bytes(body: Any) -> bytes:
    """A body as DRF's JSONRenderer writes it: compact, UTF-8, U+2028/U+2029 escaped for
    browsers. The agent routes render with it, on either stack (api/routes.py, api/agent_front.py)."""
    text = json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    return text.replace("\u2028", "\\u2028").replace("\u2029", "\\u2029").encode()


def respond(answer: Answer) -> Response:
    return Response(answer.body, status=answer.status, headers=answer.headers or None)


def written_or_replayed_answer(body: Any, *, replayed: bool) -> Answer:
    """201 for a new write; 200 with ``Idempotent-Replay: true`` when the request was already applied."""
    if replayed:
        return Answer(body, status.HTTP_200_OK, {REPLAY_HEADER: "true"})
    return Answer(body, status.HTTP_201_CREATED)


def written_or_replayed(body: Any, *, replayed: bool) -> Response:
    return respond(written_or_replayed_answer(body, replayed=replayed))


def principal_of(request: Request) -> Principal:
    principal: object = request.user  # DRF types it as a Django user; ours is always a Principal
    assert isinstance(principal, Principal)
    return principal


def validated(serializer_class: type[serializers.Serializer], data: Any) -> dict[str, Any]:
    serializer = serializer_class(data=data)
    serializer.is_valid(raise_exception=True)
    return dict(serializer.validated_data)


class ApiView(APIView):
    """A DRF view of the API. By default agents, and staff viewers (api/permissions.py); a view
    that writes, or that staff alone may call, declares its own ``permission_classes``."""

    permission_classes = [IsAuthenticated, AgentOrViewer]




# The largest integer a query parameter may be: PostgreSQL's bigint, which every one is compared with.
QUERY_INT_MAX = 2**63 - 1
_QUERY_INT = re.compile(r"-?[0-9]{1,19}")


def query_int(params: Mapping[str, str], name: str, *, default: int, minimum: int,
              maximum: int = QUERY_INT_MAX) -> int:
    """An integer query parameter (``request.query_params``, or ``request.GET`` on an agent route):
    ASCII digits with an optional minus, between ``minimum`` and ``maximum`` (at most a bigint)."""
    raw = params.get(name)
    if raw is None:
        return default
    if not _QUERY_INT.fullmatch(raw):
        raise InvalidInput(f"{name} must be an integer", {name: "must be an integer"})
    value = int(raw)
    if value < minimum or value > maximum:
        bound = f"between {minimum} and {maximum}"
        raise InvalidInput(f"{name} must be {bound}", {name: f"must be {bound}"})
    return value
