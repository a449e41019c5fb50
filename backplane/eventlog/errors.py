"""Domain errors. Each carries the contract's code and HTTP status (API.md, "Errors")."""

from __future__ import annotations

from typing import Any


class BackplaneError(Exception):
    status = 400
    code = "validation_error"
    # Seconds for a Retry-After header (503 and 429 answers); None: no header.
    retry_after: int | None = None

    def __init__(self, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.details = details or {}


class InvalidInput(BackplaneError):
    status = 400
    code = "validation_error"


class NotFound(BackplaneError):
    status = 404
    code = "not_found"


class KindRefused(BackplaneError):
    """A token limited to kinds writing a task of another kind (API.md, Conventions)."""

    status = 403
    code = "permission_denied"


class SeqConflict(BackplaneError):
    status = 409
    code = "seq_conflict"


class StaleLease(BackplaneError):
    status = 409
    code = "stale_lease"


class TaskClosed(BackplaneError):
    status = 409
    code = "task_closed"


class TaskExists(BackplaneError):
    status = 409
    code = "task_exists"


class IdempotencyMismatch(BackplaneError):
    status = 422
    code = "idempotency_mismatch"


class SandboxRefused(BackplaneError):
    """What a sandbox never does: call an external tool, send a message, become production."""

    status = 409
    code = "sandbox_refused"


class BudgetExceeded(BackplaneError):
    """A budget of the scope is spent (recovery/budgets.py): no more leases, tool calls or
    model-call records there until a person raises or resumes it."""

    status = 409
    code = "budget_exceeded"


class AlreadyDecided(BackplaneError):
    status = 409
    code = "already_decided"


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
