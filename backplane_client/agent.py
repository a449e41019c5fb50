"""A small HTTP client for agents, over the backplane's REST contract (``/api/v1/``, API.md).

Django-free: it needs only :mod:`httpx`. Every method is one request; nothing is retried
behind the caller's back, because whether a retry is safe is the agent's decision (the
contract makes the usual ones safe: idempotency keys on appends, stable tool-call keys,
idempotent sub-agent dispatch).

Errors:

- an answer with an error status raises :class:`BackplaneAPIError`, carrying the contract's
  ``{"error": {"code", "message", "details"}}`` and, for 429/503, ``Retry-After``;
- a request that never got an answer (refused, timed out, reset) raises
  :class:`httpx.TransportError` unchanged: the request may or may not have been applied,
  so repeat it with the same idempotency key or stable step.

Typical loop::

    with AgentClient("http://backplane:8000", token) as bp:
        lease = bp.claim(kinds=["lead-qualification"])
        if lease is not None:
            context = bp.recovery_context(lease.task_id)
            ...
            bp.append(lease.task_id, "TaskCompleted", {"output": {...}}, lease_epoch=lease.lease_epoch)
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

__all__ = ["AgentClient", "BackplaneAPIError", "Lease", "event_draft"]

API_PREFIX = "/api/v1"
REPLAY_HEADER = "Idempotent-Replay"

TaskId = str | uuid.UUID
JSON = dict[str, Any]


class BackplaneAPIError(Exception):
    """The backplane answered with an error status.

    ``code`` is the contract's machine-readable code (``seq_conflict``, ``stale_lease``,
    ``task_closed``, ``idempotency_mismatch``, ...); ``details`` its structured details.
    An answer that is not in the contract's shape (a proxy's HTML page, say) gets the code
    ``http_<status>`` and the body's first characters as the message.
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
    ) -> None:
        self.status = status
        self.code = code
        self.message = message
        self.details: dict[str, Any] = dict(details or {})
        self.retry_after = retry_after
        self.method = method
        self.url = url
        super().__init__(f"{status} {code}: {message}")

    @classmethod
    def from_response(cls, response: httpx.Response) -> BackplaneAPIError:
        """Build the error from an answer's status, headers and (contract-shaped) body."""
        code, message, details = f"http_{response.status_code}", response.reason_phrase, {}
        try:
            body = response.json()
        except ValueError:
            body = None
        error = body.get("error") if isinstance(body, dict) else None
        if isinstance(error, dict):
            code = str(error.get("code") or code)
            message = str(error.get("message") or message)
            details = error.get("details") if isinstance(error.get("details"), dict) else {}
        elif response.text:
            message = response.text[:200]
        retry_after: float | None = None
        raw = response.headers.get("Retry-After")
        if raw is not None:
            try:
                retry_after = float(raw)
            except ValueError:
                retry_after = None
        return cls(
            response.status_code,
            code,
            message,
            details,
            retry_after=retry_after,
            method=response.request.method,
            url=str(response.request.url),
        )


@dataclass(frozen=True)
class Lease:
    """A claimed task: ``POST /leases/``'s answer. Send ``lease_epoch`` with every write."""

    task: JSON
    lease_epoch: int
    expires_at: str
    recovered: bool

    @property
    def task_id(self) -> str:
        return str(self.task["task_id"])


def event_draft(
    type: str,
    payload: Mapping[str, Any] | None = None,
    *,
    idempotency_key: str | None = None,
    lamport: int | None = None,
    causation_id: str | None = None,
    correlation_id: str | None = None,
    trace_id: str | None = None,
    outbox: Sequence[Mapping[str, Any]] | None = None,
) -> JSON:
    """One event as the append endpoints take it; optional fields are left out when ``None``."""
    body: JSON = {"type": type, "payload": dict(payload or {})}
    optional = {
        "idempotency_key": idempotency_key,
        "lamport": lamport,
        "causation_id": causation_id,
        "correlation_id": correlation_id,
        "trace_id": trace_id,
        "outbox": [dict(item) for item in outbox] if outbox is not None else None,
    }
    body.update({name: value for name, value in optional.items() if value is not None})
    return body


def _without_none(**fields: Any) -> JSON:
    return {name: value for name, value in fields.items() if value is not None}


class AgentClient:
    """An agent's connection to the backplane, authenticated with its bearer token.

    ``base_url`` is the server's root (``http://host:8000``); the client adds ``/api/v1``.
    Pass ``http_client`` to bring your own :class:`httpx.Client` (transport, proxies, TLS);
    its base URL and auth header are then the caller's business. Share one client between
    threads only if you ignore :attr:`last_replayed`, which describes the latest answer.
    """

    def __init__(
        self,
        base_url: str,
        token: str,
        *,
        timeout: float = 10.0,
        http_client: httpx.Client | None = None,
    ) -> None:
        self._owns_client = http_client is None
        self._http = http_client or httpx.Client(
            base_url=base_url.rstrip("/"),
            headers={"Authorization": f"Bearer {token}", "Accept": "application/json"},
            timeout=timeout,
        )
        #: Whether the latest answer carried ``Idempotent-Replay: true`` (nothing new written).
        self.last_replayed = False

    # --- plumbing ------------------------------------------------------------------------

    def close(self) -> None:
        if self._owns_client:
            self._http.close()

    def __enter__(self) -> AgentClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: Mapping[str, Any] | None = None,
    ) -> httpx.Response:
        response = self._http.request(method, API_PREFIX + path, json=json, params=params)
        if response.status_code >= 400:
            raise BackplaneAPIError.from_response(response)
        self.last_replayed = response.headers.get(REPLAY_HEADER, "").lower() == "true"
        return response

    def _json(self, method: str, path: str, **kwargs: Any) -> Any:
        return self._request(method, path, **kwargs).json()

    # --- tasks ---------------------------------------------------------------------------

    def create_task(
        self,
        kind: str,
        input: Mapping[str, Any],
        *,
        task_id: TaskId | None = None,
        parent_task_id: TaskId | None = None,
        max_attempts: int | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> JSON:
        """Create a task (``201``); with a known ``task_id`` and the same content, the existing one (``200``)."""
        body = {"kind": kind, "input": dict(input)} | _without_none(
            task_id=str(task_id) if task_id is not None else None,
            parent_task_id=str(parent_task_id) if parent_task_id is not None else None,
            max_attempts=max_attempts,
            metadata=dict(metadata) if metadata is not None else None,
        )
        return self._json("POST", "/tasks/", json=body)

    def get_task(self, task_id: TaskId) -> JSON:
        """The Task object."""
        return self._json("GET", f"/tasks/{task_id}/")

    def list_tasks(
        self,
        *,
        status: str | None = None,
        kind: str | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> JSON:
        """One page: ``{"results": [Task...], "next": url or None}``."""
        params = _without_none(status=status, kind=kind, limit=limit, cursor=cursor)
        return self._json("GET", "/tasks/", params=params)

    def verify(self, task_id: TaskId) -> JSON:
        """The server's check of the task's hash chain: ``{"valid", "checked", "head_hash", "first_invalid_seq"}``."""
        return self._json("GET", f"/tasks/{task_id}/verify/")

    # --- events --------------------------------------------------------------------------

    def events(self, task_id: TaskId, *, after_seq: int = 0, limit: int | None = None) -> JSON:
        """One page of events in ``seq`` order: ``{"results": [Event...], "next_after_seq": n or None}``."""
        params = _without_none(after_seq=after_seq, limit=limit)
        return self._json("GET", f"/tasks/{task_id}/events/", params=params)

    def iter_events(self, task_id: TaskId, *, after_seq: int = 0, page_size: int = 1000) -> Iterator[JSON]:
        """Every event after ``after_seq``, following the pages."""
        cursor: int | None = after_seq
        while cursor is not None:
            page = self.events(task_id, after_seq=cursor, limit=page_size)
            yield from page["results"]
            cursor = page["next_after_seq"]

    def append(
        self,
        task_id: TaskId,
        type: str,
        payload: Mapping[str, Any] | None = None,
        *,
        idempotency_key: str | None = None,
        lease_epoch: int | None = None,
        expected_seq: int | None = None,
        lamport: int | None = None,
        causation_id: str | None = None,
        correlation_id: str | None = None,
        trace_id: str | None = None,
        outbox: Sequence[Mapping[str, Any]] | None = None,
    ) -> JSON:
        """Append one event and return it.

        With an ``idempotency_key`` already used for the same body, the original event comes
        back (:attr:`last_replayed` is then true). ``lease_epoch`` is required while the task
        is leased; ``expected_seq`` makes the append conditional on the task's ``last_seq``.
        """
        body = event_draft(
            type,
            payload,
            idempotency_key=idempotency_key,
            lamport=lamport,
            causation_id=causation_id,
            correlation_id=correlation_id,
            trace_id=trace_id,
            outbox=outbox,
        ) | _without_none(lease_epoch=lease_epoch, expected_seq=expected_seq)
        return self._json("POST", f"/tasks/{task_id}/events/", json=body)

    def append_batch(
        self,
        task_id: TaskId,
        events: Sequence[Mapping[str, Any]],
        *,
        lease_epoch: int | None = None,
        expected_seq: int | None = None,
    ) -> list[JSON]:
        """Append several events, all or nothing; build each with :func:`event_draft`."""
        body = {"events": [dict(event) for event in events]} | _without_none(
            lease_epoch=lease_epoch, expected_seq=expected_seq
        )
        return self._json("POST", f"/tasks/{task_id}/events/batch/", json=body)["results"]

    # --- leases and recovery -------------------------------------------------------------

    def claim(self, kinds: Sequence[str] | None = None, *, lease_seconds: int | None = None) -> Lease | None:
        """Claim the oldest pending task of ``kinds`` (default: all this agent may claim), or ``None`` (204)."""
        body = _without_none(kinds=list(kinds) if kinds is not None else None, lease_seconds=lease_seconds)
        response = self._request("POST", "/leases/", json=body)
        if response.status_code == 204:
            return None
        data = response.json()
        return Lease(
            task=data["task"],
            lease_epoch=data["lease_epoch"],
            expires_at=data["expires_at"],
            recovered=data["recovered"],
        )

    def heartbeat(self, task_id: TaskId, lease_epoch: int) -> JSON:
        """Extend the lease: ``{"expires_at"}``; ``409 stale_lease`` once it is lost."""
        return self._json("POST", f"/tasks/{task_id}/heartbeat/", json={"lease_epoch": lease_epoch})

    def release(self, task_id: TaskId, lease_epoch: int) -> JSON:
        """Give the task back to ``pending`` without counting an attempt; returns the Task."""
        return self._json("POST", f"/tasks/{task_id}/release/", json={"lease_epoch": lease_epoch})

    def recovery_context(self, task_id: TaskId) -> JSON:
        """What a (new) holder needs to resume: completed steps, tool calls with results,
        in-flight calls with their original keys, sub-agents, and a ``resume_prompt``."""
        return self._json("GET", f"/tasks/{task_id}/recovery-context/")

    # --- tool calls ----------------------------------------------------------------------

    def dispatch_tool_call(
        self,
        task_id: TaskId,
        step: int,
        tool: str,
        input: Mapping[str, Any],
        *,
        lease_epoch: int | None = None,
        compensation: Mapping[str, Any] | None = None,
    ) -> JSON:
        """Record a tool call before making it (write before you act).

        The answer's ``status`` says what to do: ``dispatched`` (new: call the tool with
        ``Idempotency-Key: <idempotency_key>``), ``in_flight`` (dispatched earlier, never
        answered: call again with the same key), ``succeeded``/``failed`` (answered: use ``result``).
        """
        body = {"step": step, "tool": tool, "input": dict(input)} | _without_none(
            lease_epoch=lease_epoch,
            compensation=dict(compensation) if compensation is not None else None,
        )
        return self._json("POST", f"/tasks/{task_id}/tool-calls/", json=body)

    def record_tool_result(
        self,
        idempotency_key: str,
        status: str,
        result: Mapping[str, Any],
        *,
        lease_epoch: int | None = None,
    ) -> JSON:
        """Record a tool's answer (``succeeded`` or ``failed``) before advancing; an identical repeat is a replay."""
        body = {"status": status, "result": dict(result)} | _without_none(lease_epoch=lease_epoch)
        return self._json("POST", f"/tool-calls/{idempotency_key}/result/", json=body)

    def get_tool_call(self, idempotency_key: str) -> JSON:
        """The tool-call record (while within its TTL)."""
        return self._json("GET", f"/tool-calls/{idempotency_key}/")

    # --- sub-agents ----------------------------------------------------------------------

    def dispatch_subtask(
        self,
        task_id: TaskId,
        step: int,
        kind: str,
        input: Mapping[str, Any],
        *,
        lease_epoch: int | None = None,
    ) -> JSON:
        """Hand work to a sub-agent: ``{"task": child Task, "dispatch_key"}``; a repeat for the
        same step and kind returns the same child."""
        body = {"step": step, "kind": kind, "input": dict(input)} | _without_none(lease_epoch=lease_epoch)
        return self._json("POST", f"/tasks/{task_id}/subtasks/", json=body)
