"""Which event types exist, who may write them, and what their payloads must hold."""

from __future__ import annotations

import re
from typing import Any

from backplane.eventlog.errors import InvalidInput

TASK_STARTED = "TaskStarted"
TASK_CLAIMED = "TaskClaimed"
TASK_COMPLETED = "TaskCompleted"
TASK_FAILED = "TaskFailed"
REASONING_STEP_COMPLETED = "ReasoningStepCompleted"
TOOL_CALL_DISPATCHED = "ToolCallDispatched"
TOOL_CALL_RESULT_RECEIVED = "ToolCallResultReceived"
SUB_AGENT_DISPATCHED = "SubAgentDispatched"
SUB_AGENT_ACCEPTED = "SubAgentAccepted"
SUB_AGENT_RESULT_RECEIVED = "SubAgentResultReceived"
TASK_STALLED = "TaskStalled"
TASK_DEAD_LETTERED = "TaskDeadLettered"
DEAD_LETTER_REQUEUED = "DeadLetterRequeued"
DEAD_LETTER_DISCARDED = "DeadLetterDiscarded"
COMPENSATION_REQUESTED = "CompensationRequested"
COMPENSATION_COMPLETED = "CompensationCompleted"
# A holder gave its lease back (no attempt counted); the task is pending again.
LEASE_RELEASED = "LeaseReleased"
# A task that failed for good has compensations due: it is compensating until the last one.
COMPENSATION_STARTED = "CompensationStarted"
# Every due compensation ran (or a reviewer discarded it): the saga is over.
TASK_COMPENSATED = "TaskCompensated"
# An operator decided a task row is right where its log falls short (histories written before
# every transition was an event): the log records the row's values, who decided and why.
PROJECTION_RECONCILED = "ProjectionReconciled"

# Written only by the backplane itself; a client sending one gets 400 (API.md).
SERVER_ONLY_TYPES = frozenset(
    {
        TASK_STARTED,
        TASK_CLAIMED,
        TOOL_CALL_DISPATCHED,
        TOOL_CALL_RESULT_RECEIVED,
        SUB_AGENT_DISPATCHED,
        SUB_AGENT_ACCEPTED,
        SUB_AGENT_RESULT_RECEIVED,
        TASK_STALLED,
        TASK_DEAD_LETTERED,
        DEAD_LETTER_REQUEUED,
        DEAD_LETTER_DISCARDED,
        COMPENSATION_REQUESTED,
        COMPENSATION_COMPLETED,
        LEASE_RELEASED,
        COMPENSATION_STARTED,
        TASK_COMPENSATED,
        PROJECTION_RECONCILED,
    }
)

CLIENT_TYPE_PATTERN = re.compile(r"^[A-Z][A-Za-z0-9]{2,63}$")


def _require(payload: dict[str, Any], field: str, kind: type, description: str) -> None:
    value = payload.get(field)
    # bool is a subclass of int in Python; a step must not be ``true``.
    valid = field in payload and isinstance(value, kind) and (kind is bool or not isinstance(value, bool))
    if not valid:
        raise InvalidInput(f"payload.{field} must be {description}", {f"payload.{field}": f"required: {description}"})


def validate_client_event(event_type: str, payload: dict[str, Any]) -> None:
    """Reject reserved or malformed types and payloads that break a known type's rules."""
    if event_type in SERVER_ONLY_TYPES:
        raise InvalidInput(
            f"{event_type} is written only by the backplane",
            {"type": f"'{event_type}' is reserved for the server"},
        )
    if not CLIENT_TYPE_PATTERN.match(event_type):
        raise InvalidInput(
            "event type must be PascalCase, 3 to 64 letters or digits",
            {"type": "must match ^[A-Z][A-Za-z0-9]{2,63}$"},
        )
    if event_type == REASONING_STEP_COMPLETED:
        _require(payload, "step", int, "an integer")
    elif event_type == TASK_COMPLETED:
        _require(payload, "output", dict, "an object")
    elif event_type == TASK_FAILED:
        _require(payload, "error", str, "a string")
        _require(payload, "retryable", bool, "a boolean")
