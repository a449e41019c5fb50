"""The contract's requests, built once, sent by either client (sans I/O).

Each function here turns a method's arguments into a :class:`Call`: the HTTP method, the path,
the JSON body, the query, and how to read a successful answer. :class:`~backplane_client.AgentClient`
and :class:`~backplane_client.AsyncAgentClient` only send calls and map answers (the same
:func:`check`), so the two clients cannot drift apart.

A call is built exactly once per method call, and everything random is decided here: the
idempotency key of an append, the id of a new task. The retry loop then re-sends the very same
call, which is what makes a retry after a lost answer land on the original write.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import httpx

from backplane_client.errors import BackplaneAPIError

__all__ = ["API_PREFIX", "REPLAY_HEADER", "Call", "Lease", "event_draft", "new_idempotency_key"]

API_PREFIX = "/api/v1"
REPLAY_HEADER = "Idempotent-Replay"

TaskId = str | uuid.UUID
JSON = dict[str, Any]
T = TypeVar("T")


@dataclass(frozen=True)
class Lease:
    """A claimed task: ``POST /leases/``'s answer. Send ``lease_epoch`` with every write.

    ``lease_seconds`` is the length asked for in the claim, when the caller gave one; a
    session uses it to pace its heartbeats (else it measures ``expires_at`` against now).
    """

    task: JSON
    lease_epoch: int
    expires_at: str
    recovered: bool
    lease_seconds: int | None = None

    @property
    def task_id(self) -> str:
        return str(self.task["task_id"])


@dataclass(frozen=True)
class Call(Generic[T]):
    """One request of the contract and the reader of its successful answer."""

    method: str
    path: str
    read: Callable[[httpx.Response], T] = field(repr=False)
    json: Any = None
    params: dict[str, Any] | None = None

    @property
    def url(self) -> str:
        return API_PREFIX + self.path


def new_idempotency_key() -> str:
    """A fresh key for a write the caller did not key: random, so it can never collide with
    another write's, and generated once per call so every retry of that call carries it."""
    return uuid.uuid4().hex


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


def check(response: httpx.Response, *, attempts: int = 1) -> httpx.Response:
    """The answer if it is a success; the contract's error as :class:`BackplaneAPIError` otherwise."""
    if response.status_code >= 400:
        raise BackplaneAPIError.from_response(response, attempts=attempts)
    return response


def replayed(response: httpx.Response) -> bool:
    """Whether the answer says nothing new was written (``Idempotent-Replay: true``)."""
    return response.headers.get(REPLAY_HEADER, "").lower() == "true"


def _without_none(**fields: Any) -> JSON:
    return {name: value for name, value in fields.items() if value is not None}


def _body(response: httpx.Response) -> JSON:
    data: JSON = response.json()
    return data


def _results(response: httpx.Response) -> list[JSON]:
    results: list[JSON] = response.json()["results"]
    return results


def _str_or_none(value: TaskId | None) -> str | None:
    return str(value) if value is not None else None


# --- tasks and events ------------------------------------------------------------------------


def create_task(
    kind: str,
    input: Mapping[str, Any],
    *,
    task_id: TaskId | None = None,
    parent_task_id: TaskId | None = None,
    max_attempts: int | None = None,
    metadata: Mapping[str, Any] | None = None,
) -> Call[JSON]:
    # The id is chosen here, not by the server: a retry after a lost 201 sends the same id
    # and gets the same task back (200) instead of creating a twin.
    body = {"kind": kind, "input": dict(input), "task_id": str(task_id or uuid.uuid4())} | _without_none(
        parent_task_id=_str_or_none(parent_task_id),
        max_attempts=max_attempts,
        metadata=dict(metadata) if metadata is not None else None,
    )
    return Call("POST", "/tasks/", _body, json=body)


def get_task(task_id: TaskId) -> Call[JSON]:
    return Call("GET", f"/tasks/{task_id}/", _body)


def list_tasks(
    *, status: str | None = None, kind: str | None = None, limit: int | None = None, cursor: str | None = None
) -> Call[JSON]:
    return Call("GET", "/tasks/", _body, params=_without_none(status=status, kind=kind, limit=limit, cursor=cursor))


def verify(task_id: TaskId) -> Call[JSON]:
    return Call("GET", f"/tasks/{task_id}/verify/", _body)


def events(task_id: TaskId, *, after_seq: int = 0, limit: int | None = None) -> Call[JSON]:
    return Call("GET", f"/tasks/{task_id}/events/", _body, params=_without_none(after_seq=after_seq, limit=limit))


def append(
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
) -> Call[JSON]:
    body = event_draft(
        type,
        payload,
        idempotency_key=idempotency_key if idempotency_key is not None else new_idempotency_key(),
        lamport=lamport,
        causation_id=causation_id,
        correlation_id=correlation_id,
        trace_id=trace_id,
        outbox=outbox,
    ) | _without_none(lease_epoch=lease_epoch, expected_seq=expected_seq)
    return Call("POST", f"/tasks/{task_id}/events/", _body, json=body)


def append_batch(
    task_id: TaskId,
    events: Sequence[Mapping[str, Any]],
    *,
    lease_epoch: int | None = None,
    expected_seq: int | None = None,
) -> Call[list[JSON]]:
    # Every event needs a key for the batch to be replayable: the server answers a repeat
    # with the originals only when all of its events are already recorded under their keys.
    keyed = [dict(event) if event.get("idempotency_key") is not None
             else dict(event) | {"idempotency_key": new_idempotency_key()} for event in events]
    body = {"events": keyed} | _without_none(lease_epoch=lease_epoch, expected_seq=expected_seq)
    return Call("POST", f"/tasks/{task_id}/events/batch/", _results, json=body)


# --- leases and recovery ---------------------------------------------------------------------


def claim(
    kinds: Sequence[str] | None = None, *, lease_seconds: int | None = None, task_id: TaskId | None = None
) -> Call[Lease | None]:
    def read(response: httpx.Response) -> Lease | None:
        if response.status_code == 204:
            return None
        data = response.json()
        return Lease(task=data["task"], lease_epoch=data["lease_epoch"], expires_at=data["expires_at"],
                     recovered=data["recovered"], lease_seconds=lease_seconds)

    body = _without_none(kinds=list(kinds) if kinds is not None else None, lease_seconds=lease_seconds,
                         task_id=_str_or_none(task_id))
    return Call("POST", "/leases/", read, json=body)


def heartbeat(task_id: TaskId, lease_epoch: int) -> Call[JSON]:
    return Call("POST", f"/tasks/{task_id}/heartbeat/", _body, json={"lease_epoch": lease_epoch})


def release(task_id: TaskId, lease_epoch: int) -> Call[JSON]:
    return Call("POST", f"/tasks/{task_id}/release/", _body, json={"lease_epoch": lease_epoch})


def recovery_context(task_id: TaskId) -> Call[JSON]:
    return Call("GET", f"/tasks/{task_id}/recovery-context/", _body)


# --- forks and drift ------------------------------------------------------------------------


def fork(
    source_task_id: TaskId,
    *,
    at_seq: int,
    reason: str,
    input: Mapping[str, Any] | None = None,
    task_id: TaskId | None = None,
    sandbox: bool = False,
    tool_answers: Sequence[Mapping[str, Any]] | None = None,
) -> Call[JSON]:
    # As for create_task, the fork's id is chosen here: a retry after a lost 201 sends the same
    # id and gets the same fork back (200) instead of a second one.
    body = {"at_seq": at_seq, "reason": reason, "task_id": str(task_id or uuid.uuid4())} | _without_none(
        input=dict(input) if input is not None else None,
        sandbox=True if sandbox else None,
        tool_answers=[dict(answer) for answer in tool_answers] if tool_answers else None,
    )
    return Call("POST", f"/tasks/{source_task_id}/fork/", _body, json=body)


def diff(a: TaskId, b: TaskId) -> Call[JSON]:
    return Call("GET", f"/tasks/{a}/diff/{b}/", _body)


# --- tool calls and sub-agents ---------------------------------------------------------------


def dispatch_tool_call(
    task_id: TaskId,
    step: int,
    tool: str,
    input: Mapping[str, Any],
    *,
    lease_epoch: int | None = None,
    compensation: Mapping[str, Any] | None = None,
) -> Call[JSON]:
    body = {"step": step, "tool": tool, "input": dict(input)} | _without_none(
        lease_epoch=lease_epoch,
        compensation=dict(compensation) if compensation is not None else None,
    )
    return Call("POST", f"/tasks/{task_id}/tool-calls/", _body, json=body)


def record_tool_result(
    idempotency_key: str, status: str, result: Mapping[str, Any], *, lease_epoch: int | None = None
) -> Call[JSON]:
    body = {"status": status, "result": dict(result)} | _without_none(lease_epoch=lease_epoch)
    return Call("POST", f"/tool-calls/{idempotency_key}/result/", _body, json=body)


def get_tool_call(idempotency_key: str) -> Call[JSON]:
    return Call("GET", f"/tool-calls/{idempotency_key}/", _body)


def invoke(
    task_id: TaskId, tool: str, step: int, input: Mapping[str, Any], *, lease_epoch: int | None = None
) -> Call[JSON]:
    body = {"task_id": str(task_id), "step": step, "input": dict(input)} | _without_none(lease_epoch=lease_epoch)
    return Call("POST", f"/tools/{tool}/invoke/", _body, json=body)


def dispatch_subtask(
    task_id: TaskId, step: int, kind: str, input: Mapping[str, Any], *, lease_epoch: int | None = None
) -> Call[JSON]:
    body = {"step": step, "kind": kind, "input": dict(input)} | _without_none(lease_epoch=lease_epoch)
    return Call("POST", f"/tasks/{task_id}/subtasks/", _body, json=body)
