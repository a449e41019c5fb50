"""The SDK's exceptions: the contract's error answers, a lost lease, a tool's refusal.

Django-free and import-light (httpx only for the type of the answer an error is built from).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import httpx

__all__ = ["BackplaneAPIError", "LeaseLost", "SandboxRefused", "ToolCallFailed", "ToolOutcomeMissing"]

#: The codes that mean "this lease is no longer yours" when a heartbeat or write gets them.
LEASE_LOST_CODES = frozenset({"stale_lease", "task_closed", "not_found"})


class BackplaneAPIError(Exception):
    """The backplane answered with an error status.

    ``code`` is the contract's machine-readable code (``seq_conflict``, ``stale_lease``,
    ``task_closed``, ``idempotency_mismatch``, ...); ``details`` its structured details.
    An answer that is not in the contract's shape (a proxy's HTML page, say) gets the code
    ``http_<status>`` and the body's first characters as the message. ``attempts`` says how
    many times the request was sent before this answer was accepted as final.
    """

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        details: Mapping[str, Any] | None = None,
        *,
        retry_after: float | None = None,
        method: str | None = None,
        url: str | None = None,
        attempts: int = 1,
    ) -> None:
        self.status = status
        self.code = code
        self.message = message
        self.details: dict[str, Any] = dict(details or {})
        self.retry_after = retry_after
        self.method = method
        self.url = url
        self.attempts = attempts
        super().__init__(f"{status} {code}: {message}")

    @classmethod
    def from_response(cls, response: httpx.Response, *, attempts: int = 1) -> BackplaneAPIError:
        """Build the error from an answer's status, headers and (contract-shaped) body.

        ``409 stale_lease`` comes back as :class:`LeaseLost` and ``409 sandbox_refused`` as
        :class:`SandboxRefused` (subclasses), so code that only knows :class:`BackplaneAPIError`
        keeps catching them.
        """
        code, message, details = f"http_{response.status_code}", response.reason_phrase, {}
        try:
            body = response.json()
        except ValueError:
            body = None
        error = body.get("error") if isinstance(body, dict) else None
        if isinstance(error, dict):
            code = str(error.get("code") or code)
            message = str(error.get("message") or message)
            raw_details = error.get("details")
            details = raw_details if isinstance(raw_details, dict) else {}
        elif response.text:
            message = response.text[:200]
        kind = _SUBCLASS_OF_CODE.get(code, BackplaneAPIError)
        return kind(
            response.status_code,
            code,
            message,
            details,
            retry_after=retry_after_of(response),
            method=response.request.method,
            url=str(response.request.url),
            attempts=attempts,
        )


class LeaseLost(BackplaneAPIError):
    """The lease this work was done under is gone: it expired and was swept, another agent
    holds the task now, or the task was closed.

    Raised for a ``409 stale_lease`` or ``409 task_closed`` answer (a cancelled task's details
    say who cancelled it and why), and by :class:`~backplane_client.TaskSession`
    *without sending anything* once its heartbeat has seen the lease lost (``sent`` is then
    false, and ``status``/``code`` are those of the heartbeat's answer). Stop working on the
    task: whoever holds it now resumes from the log.
    """

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        details: Mapping[str, Any] | None = None,
        *,
        retry_after: float | None = None,
        method: str | None = None,
        url: str | None = None,
        attempts: int = 1,
        sent: bool = True,
    ) -> None:
        super().__init__(status, code, message, details, retry_after=retry_after, method=method, url=url,
                         attempts=attempts)
        self.sent = sent

    @classmethod
    def before_sending(cls, task_id: str, cause: BackplaneAPIError | None, why: str) -> LeaseLost:
        """The error a session raises instead of sending a write it knows will be refused."""
        status, code = (cause.status, cause.code) if cause is not None else (409, "stale_lease")
        return cls(status, code, f"task {task_id}: {why}; nothing was sent", sent=False)


class SandboxRefused(BackplaneAPIError):
    """``409 sandbox_refused``: a sandbox (a replay of a task against its record) was asked for
    something the record cannot answer, and a sandbox never reaches the outside world.

    A tool call or sub-agent hand-off at a step the source never recorded an answer for (the
    message names the step and the tool or kind; ``details`` carries ``step``, ``tool`` or
    ``kind``, and ``source_task_id``), an ``outbox`` message, or forking a sandbox into a task
    that is not one. Nothing was written. In a replay (:func:`backplane_client.replay`) it ends
    the agent function, and the result's ``error`` holds it.
    """


class ApprovalDenied(BackplaneAPIError):
    """``409 approval_denied``: people denied this gated tool call (``details``: ``approval_id``,
    ``denied_by``, ``reason``); it is not made. Decide what the task does instead, or fail it so
    its compensations run."""


class ApprovalExpired(BackplaneAPIError):
    """``409 approval_expired``: the gated call's approval request ran out undecided and its
    policy denies on expiry; the call is not made."""


class AwaitingApproval(Exception):
    """A gated tool call's approval is still pending and the caller asked not to wait (or waited
    its ``approval_timeout`` out): ``answer`` is the dispatch's ``awaiting_approval`` answer.
    Dispatching the same call later finds the same request."""

    def __init__(self, answer: Mapping[str, Any]) -> None:
        self.answer: dict[str, Any] = dict(answer)
        self.approval_id: str = str(answer["approval_id"])
        super().__init__(f"tool call {answer.get('idempotency_key')} awaits approval {self.approval_id}")


class ToolCallFailed(Exception):
    """Raise inside the function given to :meth:`TaskSession.call_tool` when the tool answered
    with a refusal that should be recorded as the call's ``failed`` outcome (so no later attempt
    repeats it). Any other exception records nothing: the call stays in flight."""

    def __init__(self, result: Mapping[str, Any], message: str | None = None) -> None:
        self.result: dict[str, Any] = dict(result)
        super().__init__(message or f"tool call failed: {self.result}")


class ToolOutcomeMissing(RuntimeError):
    """A ``tool_call`` block that had to run the tool ended without an outcome: set
    ``call.result`` or call ``succeeded()``/``failed()`` before leaving the block."""


_SUBCLASS_OF_CODE: dict[str, type[BackplaneAPIError]] = {
    "stale_lease": LeaseLost,
    # A closed task takes no more work: cancelled under the lease, or already finished.
    "task_closed": LeaseLost,
    "sandbox_refused": SandboxRefused,
    "approval_denied": ApprovalDenied,
    "approval_expired": ApprovalExpired,
}


def retry_after_of(response: httpx.Response) -> float | None:
    """``Retry-After`` in seconds (the contract sends delta-seconds, never a date), or None."""
    raw = response.headers.get("Retry-After")
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        return None
    return value if value >= 0 else None
