"""Recovery's errors: what its parts refuse (budgets, bulk jobs, breakers, the tool gateway,
pauses). Each carries the contract's code and HTTP status (docs/api.md, "Errors"), as the event
log's own errors do (backplane/eventlog/errors.py), whose base class they share."""

from __future__ import annotations

from typing import Any

from backplane.eventlog.errors import BackplaneError


class BudgetExceeded(BackplaneError):
    """A budget of the scope is spent (recovery/budgets.py): no more leases, tool calls or
    model-call records there until a person raises or resumes it."""

    status = 409
    code = "budget_exceeded"


class JobConflict(BackplaneError):
    """A bulk job asked to do what its state does not allow (started twice, resumed while
    running), or started with a selection hash that is not its frozen list's (recovery/bulk.py)."""

    status = 409
    code = "job_conflict"


class CircuitOpen(BackplaneError):
    """A circuit breaker (an agent's or a tool's) is open; try again after ``retry_after`` seconds."""

    status = 503
    code = "circuit_open"

    def __init__(self, message: str, *, retry_after: int, details: dict[str, Any] | None = None) -> None:
        super().__init__(message, details)
        self.retry_after = retry_after


class RateLimited(BackplaneError):
    status = 429
    code = "rate_limited"

    def __init__(self, message: str, *, retry_after: int, details: dict[str, Any] | None = None) -> None:
        super().__init__(message, details)
        self.retry_after = retry_after


class ToolUnavailable(BackplaneError):
    """A tool did not answer usably (transport error, timeout, 5xx); its call stays in flight."""

    status = 502
    code = "tool_unavailable"


class PauseInForce(BackplaneError):
    """A pause already holds this scope back (recovery/fleet.py): lift it before pausing again."""

    status = 409
    code = "pause_in_force"


class ApprovalDenied(BackplaneError):
    """The tool call's approval request was denied (recovery/approvals.py): this call with these
    arguments is not made; the details say who denied it and why."""

    status = 409
    code = "approval_denied"


class ApprovalExpired(BackplaneError):
    """The tool call's approval request ran out undecided and its policy denies on expiry."""

    status = 409
    code = "approval_expired"


class NotAnApprover(BackplaneError):
    """A person who may not decide this approval request: not in the group asked now, or the
    person the requesting agent acts for where the policy asks for four eyes."""

    status = 403
    code = "permission_denied"


class ApprovalPending(Exception):
    """Not an error: a gated call's dispatch committed (or found) its approval request, and the
    call waits for people's decision. The API answers it ``202 awaiting_approval``."""

    def __init__(self, request: Any) -> None:
        super().__init__(f"approval {request.pk} pending")
        self.request = request
