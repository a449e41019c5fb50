"""Domain errors. Each carries the contract's code and HTTP status (docs/api.md, "Errors")."""

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
    """A token limited to kinds writing a task of another kind (docs/api.md, Conventions)."""

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



class AlreadyDecided(BackplaneError):
    status = 409
    code = "already_decided"


class SubjectErased(BackplaneError):
    """A new personal value for an erased data subject, or a second erasure (backplane/privacy)."""

    status = 409
    code = "subject_erased"
