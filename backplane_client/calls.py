"""The contract's requests, built once, sent by either client (sans I/O).

Each function here turns a method's arguments into a :class:`Call`: the HTTP method, the path,
the JSON body, the query, and how to read a successful answer. It is also the declaration of
the client method of the same name: its signature and docstring are the method's
(:mod:`backplane_client.methods`), and the docstring speaks of the answer the method returns.
:class:`~backplane_client.AgentClient` and :class:`~backplane_client.AsyncAgentClient` only
send calls and map answers (the same :func:`check`), so the two clients cannot drift apart.

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
    """Create a task (``201``); with a known ``task_id`` and the same content, the existing one (``200``).

    Without ``task_id`` the client picks a uuid4, once, so a retry after a lost answer
    returns the task the first attempt created.
    """
    # The id is chosen here, not by the server: a retry after a lost 201 sends the same id
    # and gets the same task back (200) instead of creating a twin.
    body = {"kind": kind, "input": dict(input), "task_id": str(task_id or uuid.uuid4())} | _without_none(
        parent_task_id=_str_or_none(parent_task_id),
        max_attempts=max_attempts,
        metadata=dict(metadata) if metadata is not None else None,
    )
    return Call("POST", "/tasks/", _body, json=body)


def get_task(task_id: TaskId) -> Call[JSON]:
    """The Task object."""
    return Call("GET", f"/tasks/{task_id}/", _body)


def list_tasks(
    *, status: str | None = None, kind: str | None = None, limit: int | None = None, cursor: str | None = None
) -> Call[JSON]:
    """One page: ``{"results": [Task...], "next": url or None}``."""
    return Call("GET", "/tasks/", _body, params=_without_none(status=status, kind=kind, limit=limit, cursor=cursor))


def verify(task_id: TaskId) -> Call[JSON]:
    """The server's check of the task's hash chain: ``{"valid", "checked", "head_hash", "first_invalid_seq"}``."""
    return Call("GET", f"/tasks/{task_id}/verify/", _body)


def events(task_id: TaskId, *, after_seq: int = 0, limit: int | None = None) -> Call[JSON]:
    """One page of events in ``seq`` order: ``{"results": [Event...], "next_after_seq": n or None}``."""
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
    """Append one event and return it.

    With an ``idempotency_key`` already used for the same body, the original event comes
    back (:attr:`last_replayed` is then true). Without one, the client generates a key for
    this call (so its retries cannot append twice); pass your own stable key to make a
    repeat *across* calls or processes safe too. ``lease_epoch`` is required while the
    task is leased; ``expected_seq`` makes the append conditional on the task's ``last_seq``.
    """
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
    """Append several events, all or nothing; build each with :func:`event_draft`.

    Events without an ``idempotency_key`` get a generated one (once per call), so a retried
    batch is answered with the originals.
    """
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
    """Claim the oldest pending task of ``kinds`` (default: all this agent may claim), or ``None`` (204).

    With ``task_id``, claim that very task if it is pending and of a kind allowed (``None``
    otherwise): how a sandbox fork, which is never handed out by kind, is run.

    Not idempotent on the server: if an answer is lost and the claim retried, the retry
    may lease another task, and the first lease simply expires (the stall detector hands
    that task on, counting one attempt). Nothing is done twice; a task is only delayed.
    """

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
    """Extend the lease: ``{"expires_at"}``; ``409 stale_lease`` (:class:`LeaseLost`) once it is lost."""
    return Call("POST", f"/tasks/{task_id}/heartbeat/", _body, json={"lease_epoch": lease_epoch})


def release(task_id: TaskId, lease_epoch: int) -> Call[JSON]:
    """Give the task back to ``pending`` without counting an attempt; returns the Task."""
    return Call("POST", f"/tasks/{task_id}/release/", _body, json={"lease_epoch": lease_epoch})


def recovery_context(task_id: TaskId) -> Call[JSON]:
    """What a (new) holder needs to resume: completed steps, tool calls with results,
    in-flight calls with their original keys, sub-agents, and a ``resume_prompt``."""
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
    """Fork a task after its event ``at_seq``: a new ``pending`` task (the Task) whose history
    is the source's up to there, answered from the source's record (docs/replay.md).

    ``input`` replaces the source's; ``sandbox`` makes a replay that never reaches a tool
    (claim it with ``claim(task_id=...)``); ``tool_answers`` (``[{"step", "tool", "status",
    "result"}]``, sandboxes only) edits the record it answers from. Without ``task_id`` the
    client picks a uuid4, once, so a retry after a lost answer returns the same fork.
    """
    # As for create_task, the fork's id is chosen here: a retry after a lost 201 sends the same
    # id and gets the same fork back (200) instead of a second one.
    body = {"at_seq": at_seq, "reason": reason, "task_id": str(task_id or uuid.uuid4())} | _without_none(
        input=dict(input) if input is not None else None,
        sandbox=True if sandbox else None,
        tool_answers=[dict(answer) for answer in tool_answers] if tool_answers else None,
    )
    return Call("POST", f"/tasks/{source_task_id}/fork/", _body, json=body)


def diff(a: TaskId, b: TaskId) -> Call[JSON]:
    """Where the histories of tasks ``a`` and ``b`` drift apart: ``{"a", "b", "first_divergence",
    "counts"}`` (``first_divergence`` is None when they do the same thing)."""
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
    reason: str | None = None,
) -> Call[JSON]:
    """Record a tool call before making it (write before you act).

    The answer's ``status`` says what to do: ``dispatched`` (new: call the tool with
    ``Idempotency-Key: <effect_key>``), ``in_flight`` (dispatched earlier, never answered:
    call again with the same key), ``succeeded``/``failed`` (answered: use ``result``), or
    ``awaiting_approval`` (a tool policy asks people first: wait with :func:`get_approval`
    on ``approval_id``, then dispatch the same call again). ``reason`` is shown to them.
    ``effect_key`` equals ``idempotency_key`` except in a fork, for a step its source
    dispatched: the tool must then see the source's key, so the effect happens once.
    """
    body = {"step": step, "tool": tool, "input": dict(input)} | _without_none(
        lease_epoch=lease_epoch,
        compensation=dict(compensation) if compensation is not None else None,
        reason=reason,
    )
    return Call("POST", f"/tasks/{task_id}/tool-calls/", _body, json=body)


def record_tool_result(
    idempotency_key: str, status: str, result: Mapping[str, Any], *, lease_epoch: int | None = None
) -> Call[JSON]:
    """Record a tool's answer (``succeeded`` or ``failed``) before advancing; an identical repeat is a replay."""
    body = {"status": status, "result": dict(result)} | _without_none(lease_epoch=lease_epoch)
    return Call("POST", f"/tool-calls/{idempotency_key}/result/", _body, json=body)


def get_tool_call(idempotency_key: str) -> Call[JSON]:
    """The tool-call record (while within its TTL)."""
    return Call("GET", f"/tool-calls/{idempotency_key}/", _body)


def await_signal(task_id: TaskId, name: str, timeout_seconds: int, *, lease_epoch: int | None = None) -> Call[JSON]:
    """Wait durably for the signal ``name`` (at most ``timeout_seconds``): the signal as it
    stands, ``waiting`` (or ``received`` when it came first). Read it with :func:`get_signal`."""
    body = {"timeout_seconds": timeout_seconds} | _without_none(lease_epoch=lease_epoch)
    return Call("POST", f"/tasks/{task_id}/signals/{name}/wait/", _body, json=body)


def get_signal(task_id: TaskId, name: str, *, wait: int | None = None) -> Call[JSON]:
    """A task's signal: ``status`` ``waiting``, ``received`` (with ``payload``) or ``timed_out``;
    with ``wait`` (seconds, at most 30) the answer comes as soon as it changes."""
    return Call("GET", f"/tasks/{task_id}/signals/{name}/", _body, params=_without_none(wait=wait) or None)


def send_signal(task_id: TaskId, name: str, payload: Mapping[str, Any]) -> Call[JSON]:
    """Send a task the signal ``name`` with ``payload``; the same payload again is answered as sent."""
    return Call("POST", f"/tasks/{task_id}/signals/{name}/", _body, json={"payload": dict(payload)})


# --- personal data (docs/privacy.md) ---------------------------------------------------------------


def personal(subject: str, value: Any, *, lookup: bool = False) -> dict[str, Any]:
    """A value marked as personal data of ``subject``, to put anywhere in a request's JSON: the
    server seals it before anything hashes or stores it, and answers with its envelope. With
    ``lookup`` the value can be found again by :meth:`AgentClient.personal_lookup`."""
    inner: dict[str, Any] = {"subject": subject, "value": value}
    if lookup:
        inner["lookup"] = True
    return {"$personal": inner}


def personal_open(value: Any, *, task_id: TaskId | None = None) -> Call[Any]:
    """``value`` (any JSON the API answered: a payload, a task's input, a whole answer) with each
    envelope of the agent's namespace opened, or ``{"$personal": {"subject", "erased_at"}}`` where
    its subject was erased."""
    body: dict[str, Any] = {"value": value}
    if task_id is not None:
        body["task_id"] = str(task_id)
    return Call("POST", "/personal-data/open/", lambda response: response.json()["value"], json=body)


def personal_lookup(value: Any) -> Call[list[str]]:
    """The data subjects a value marked with ``lookup`` belongs to (exact match, by a keyed hash)."""
    return Call("POST", "/personal-data/lookup/", lambda response: list(response.json()["subjects"]),
                json={"value": value})


# The longest one read of an approval request waits on the server (its ``wait`` bound).
APPROVAL_WAIT_SECONDS = 30


def get_approval(approval_id: str, *, wait: int | None = None) -> Call[JSON]:
    """A gated tool call's approval request: ``status`` is ``pending``, ``granted``, ``denied``
    or ``expired``, with the arguments, their hash, the policy version and the decisions. With
    ``wait`` (seconds, at most 30) the answer comes as soon as it is decided."""
    return Call("GET", f"/approvals/{approval_id}/", _body, params=_without_none(wait=wait) or None)


def invoke(
    task_id: TaskId, tool: str, step: int, input: Mapping[str, Any], *, lease_epoch: int | None = None,
    reason: str | None = None,
) -> Call[JSON]:
    """Have the backplane call a registered tool for this step (the gateway):
    ``{"idempotency_key", "status", "result", "replayed"}``. An answer on record is returned
    without calling the tool again; ``503 circuit_open`` while the tool's breaker is open; a
    call a tool policy gates answers ``{"status": "awaiting_approval", "approval_id", …}`` until
    people approve it (``reason`` is shown to them)."""
    body = {"task_id": str(task_id), "step": step, "input": dict(input)} | _without_none(
        lease_epoch=lease_epoch, reason=reason)
    return Call("POST", f"/tools/{tool}/invoke/", _body, json=body)


def dispatch_subtask(
    task_id: TaskId, step: int, kind: str, input: Mapping[str, Any], *, lease_epoch: int | None = None
) -> Call[JSON]:
    """Hand work to a sub-agent: ``{"task": child Task, "dispatch_key"}``; a repeat for the
    same step and kind returns the same child."""
    body = {"step": step, "kind": kind, "input": dict(input)} | _without_none(lease_epoch=lease_epoch)
    return Call("POST", f"/tasks/{task_id}/subtasks/", _body, json=body)
