"""The agents' client for the backplane's REST contract (``/api/v1/``), and its task sessions.

Django-free: it needs :mod:`httpx` and :mod:`rfc8785`. docs/sdk.md is the guide; this is the short version.

A typical agent loop, with a session that heartbeats in the background, resumes from the
recovery context after a crash, and records every tool call before and after making it::

    from backplane_client import AgentClient, ToolCallFailed

    with AgentClient("http://backplane:8000", token) as bp:
        while True:
            session = bp.claim_session(["outreach"], lease_seconds=30)
            if session is None:
                time.sleep(1)
                continue
            with session:
                plan = session.input
                session.reason(1, {"decision": "send the quote"})     # skipped if already logged

                def send(key: str, body: dict) -> dict:
                    answer = httpx.post(plan["url"], json=body, headers={"Idempotency-Key": key})
                    if answer.status_code == 422:
                        raise ToolCallFailed(answer.json())             # a refusal is an outcome
                    answer.raise_for_status()                           # anything else: retry later
                    return answer.json()

                call = session.call_tool(2, "send-email", plan["email"], send)   # runs only if needed
                session.complete({"email": call.result}, reasoning={"step": 3, "summary": "sent"})

Why a session: every write carries the lease epoch, so a holder that was presumed dead and
replaced is refused (``409 stale_lease``, raised as :class:`LeaseLost`); once the heartbeat
has seen the lease lost, the session refuses writes itself, before sending anything.

Retries: every request is retried on 429, 503 and transport errors, with full-jitter
exponential backoff (:class:`~backplane_client.retry.RetryPolicy`). The client makes its
writes safe to retry before the first attempt — an append gets an idempotency key, a new task
gets its id, both chosen once per call — so a lost answer never turns into a double write.
``claim`` is the exception (docs/sdk.md, "What is safe to retry").

Errors:

- an answer with an error status raises :class:`BackplaneAPIError` (``409 stale_lease`` as its
  subclass :class:`LeaseLost`), carrying the contract's ``{"error": {"code", "message",
  "details"}}`` and, for 429/503, ``Retry-After``; after retries, ``attempts`` says how many;
- a request that never got an answer, after the last attempt, raises the
  :class:`httpx.TransportError` unchanged: it may or may not have been applied, and repeating
  the same call later is safe for the same reasons as the automatic retries.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, TypeVar

import httpx

from backplane_client import calls
from backplane_client.calls import JSON, Call, Lease, TaskId, event_draft, replayed
from backplane_client.errors import BackplaneAPIError, LeaseLost, ToolCallFailed
from backplane_client.retry import DEFAULT_RETRY, RetryPolicy, gave_up, log_retry
from backplane_client.session import TaskSession, ToolCall

__all__ = [
    "AgentClient",
    "BackplaneAPIError",
    "Lease",
    "LeaseLost",
    "RetryPolicy",
    "TaskSession",
    "ToolCall",
    "ToolCallFailed",
    "event_draft",
]

T = TypeVar("T")


class AgentClient:
    """An agent's connection to the backplane, authenticated with its bearer token.

    ``base_url`` is the server's root (``http://host:8000``); the client adds ``/api/v1``.
    ``retry`` says how often a request is sent before an error reaches the caller
    (:meth:`RetryPolicy.none` to send once). Pass ``http_client`` to bring your own
    :class:`httpx.Client` (transport, proxies, TLS); its base URL and auth header are then the
    caller's business, and the retry policy still applies.

    One client may serve several threads (a session's heartbeat thread shares it); httpx's
    client is thread-safe and :attr:`last_replayed` is kept per thread.
    """

    def __init__(
        self,
        base_url: str,
        token: str,
        *,
        timeout: float = 10.0,
        retry: RetryPolicy = DEFAULT_RETRY,
        http_client: httpx.Client | None = None,
    ) -> None:
        self.retry = retry
        self._owns_client = http_client is None
        self._http = http_client or httpx.Client(
            base_url=base_url.rstrip("/"),
            headers={"Authorization": f"Bearer {token}", "Accept": "application/json"},
            timeout=timeout,
        )
        self._local = threading.local()

    @property
    def last_replayed(self) -> bool:
        """Whether this thread's latest answer carried ``Idempotent-Replay: true`` (nothing new written)."""
        return bool(getattr(self._local, "replayed", False))

    # --- plumbing ------------------------------------------------------------------------

    def close(self) -> None:
        if self._owns_client:
            self._http.close()

    def __enter__(self) -> AgentClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def send(self, call: Call[T], *, retry: RetryPolicy | None = None) -> T:
        """Send one request of the contract (built by :mod:`backplane_client.calls`), retrying
        as ``retry`` (default: the client's policy) allows, and read its answer."""
        policy = retry or self.retry
        attempt = 0
        while True:
            attempt += 1
            try:
                response = self._http.request(call.method, call.url, json=call.json, params=call.params)
            except httpx.TransportError as error:
                delay = policy.delay_after_error(attempt, error)
                if delay is None:
                    raise gave_up(error, attempt)
                log_retry(call, attempt, delay, repr(error))
            else:
                delay = policy.delay_after_answer(attempt, response)
                if delay is None:
                    calls.check(response, attempts=attempt)
                    self._local.replayed = replayed(response)
                    return call.read(response)
                log_retry(call, attempt, delay, f"answered {response.status_code}")
            time.sleep(delay)

    # --- sessions ------------------------------------------------------------------------

    def session(self, lease: Lease, *, heartbeat_interval: float | None = None) -> TaskSession:
        """Work on a claimed task: use it as a context manager (``with bp.session(lease) as s:``),
        which heartbeats in a background thread until the block ends (see :class:`TaskSession`)."""
        return TaskSession(self, lease, heartbeat_interval=heartbeat_interval)

    def claim_session(
        self,
        kinds: Sequence[str] | None = None,
        *,
        lease_seconds: int | None = None,
        heartbeat_interval: float | None = None,
        task_id: TaskId | None = None,
    ) -> TaskSession | None:
        """:meth:`claim` and :meth:`session` in one: a session on the claimed task, or None."""
        lease = self.claim(kinds, lease_seconds=lease_seconds, task_id=task_id)
        return None if lease is None else self.session(lease, heartbeat_interval=heartbeat_interval)

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
        """Create a task (``201``); with a known ``task_id`` and the same content, the existing one (``200``).

        Without ``task_id`` the client picks a uuid4, once, so a retry after a lost answer
        returns the task the first attempt created.
        """
        return self.send(calls.create_task(kind, input, task_id=task_id, parent_task_id=parent_task_id,
                                           max_attempts=max_attempts, metadata=metadata))

    def get_task(self, task_id: TaskId) -> JSON:
        """The Task object."""
        return self.send(calls.get_task(task_id))

    def list_tasks(
        self,
        *,
        status: str | None = None,
        kind: str | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> JSON:
        """One page: ``{"results": [Task...], "next": url or None}``."""
        return self.send(calls.list_tasks(status=status, kind=kind, limit=limit, cursor=cursor))

    def verify(self, task_id: TaskId) -> JSON:
        """The server's check of the task's hash chain: ``{"valid", "checked", "head_hash", "first_invalid_seq"}``."""
        return self.send(calls.verify(task_id))

    # --- events --------------------------------------------------------------------------

    def events(self, task_id: TaskId, *, after_seq: int = 0, limit: int | None = None) -> JSON:
        """One page of events in ``seq`` order: ``{"results": [Event...], "next_after_seq": n or None}``."""
        return self.send(calls.events(task_id, after_seq=after_seq, limit=limit))

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
        back (:attr:`last_replayed` is then true). Without one, the client generates a key for
        this call (so its retries cannot append twice); pass your own stable key to make a
        repeat *across* calls or processes safe too. ``lease_epoch`` is required while the
        task is leased; ``expected_seq`` makes the append conditional on the task's ``last_seq``.
        """
        return self.send(calls.append(
            task_id, type, payload, idempotency_key=idempotency_key, lease_epoch=lease_epoch,
            expected_seq=expected_seq, lamport=lamport, causation_id=causation_id,
            correlation_id=correlation_id, trace_id=trace_id, outbox=outbox,
        ))

    def append_batch(
        self,
        task_id: TaskId,
        events: Sequence[Mapping[str, Any]],
        *,
        lease_epoch: int | None = None,
        expected_seq: int | None = None,
    ) -> list[JSON]:
        """Append several events, all or nothing; build each with :func:`event_draft`.

        Events without an ``idempotency_key`` get a generated one (once per call), so a retried
        batch is answered with the originals.
        """
        return self.send(calls.append_batch(task_id, events, lease_epoch=lease_epoch, expected_seq=expected_seq))

    # --- leases and recovery -------------------------------------------------------------

    def claim(
        self, kinds: Sequence[str] | None = None, *, lease_seconds: int | None = None, task_id: TaskId | None = None
    ) -> Lease | None:
        """Claim the oldest pending task of ``kinds`` (default: all this agent may claim), or ``None`` (204).

        With ``task_id``, claim that very task if it is pending and of a kind allowed (``None``
        otherwise): how a sandbox fork, which is never handed out by kind, is run.

        Not idempotent on the server: if an answer is lost and the claim retried, the retry
        may lease another task, and the first lease simply expires (the stall detector hands
        that task on, counting one attempt). Nothing is done twice; a task is only delayed.
        """
        return self.send(calls.claim(kinds, lease_seconds=lease_seconds, task_id=task_id))

    def heartbeat(self, task_id: TaskId, lease_epoch: int) -> JSON:
        """Extend the lease: ``{"expires_at"}``; ``409 stale_lease`` (:class:`LeaseLost`) once it is lost."""
        return self.send(calls.heartbeat(task_id, lease_epoch))

    def release(self, task_id: TaskId, lease_epoch: int) -> JSON:
        """Give the task back to ``pending`` without counting an attempt; returns the Task."""
        return self.send(calls.release(task_id, lease_epoch))

    def recovery_context(self, task_id: TaskId) -> JSON:
        """What a (new) holder needs to resume: completed steps, tool calls with results,
        in-flight calls with their original keys, sub-agents, and a ``resume_prompt``."""
        return self.send(calls.recovery_context(task_id))

    # --- forks and drift -----------------------------------------------------------------

    def fork(
        self,
        source_task_id: TaskId,
        *,
        at_seq: int,
        reason: str,
        input: Mapping[str, Any] | None = None,
        task_id: TaskId | None = None,
        sandbox: bool = False,
        tool_answers: Sequence[Mapping[str, Any]] | None = None,
    ) -> JSON:
        """Fork a task after its event ``at_seq``: a new ``pending`` task (the Task) whose history
        is the source's up to there, answered from the source's record (docs/replay.md).

        ``input`` replaces the source's; ``sandbox`` makes a replay that never reaches a tool
        (claim it with ``claim(task_id=...)``); ``tool_answers`` (``[{"step", "tool", "status",
        "result"}]``, sandboxes only) edits the record it answers from. Without ``task_id`` the
        client picks a uuid4, once, so a retry after a lost answer returns the same fork.
        """
        return self.send(calls.fork(source_task_id, at_seq=at_seq, reason=reason, input=input, task_id=task_id,
                                    sandbox=sandbox, tool_answers=tool_answers))

    def diff(self, a: TaskId, b: TaskId) -> JSON:
        """Where the histories of tasks ``a`` and ``b`` drift apart: ``{"a", "b", "first_divergence",
        "counts"}`` (``first_divergence`` is None when they do the same thing)."""
        return self.send(calls.diff(a, b))

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
        ``Idempotency-Key: <effect_key>``), ``in_flight`` (dispatched earlier, never answered:
        call again with the same key), ``succeeded``/``failed`` (answered: use ``result``).
        ``effect_key`` equals ``idempotency_key`` except in a fork, for a step its source
        dispatched: the tool must then see the source's key, so the effect happens once.
        """
        return self.send(calls.dispatch_tool_call(task_id, step, tool, input, lease_epoch=lease_epoch,
                                                  compensation=compensation))

    def record_tool_result(
        self,
        idempotency_key: str,
        status: str,
        result: Mapping[str, Any],
        *,
        lease_epoch: int | None = None,
    ) -> JSON:
        """Record a tool's answer (``succeeded`` or ``failed``) before advancing; an identical repeat is a replay."""
        return self.send(calls.record_tool_result(idempotency_key, status, result, lease_epoch=lease_epoch))

    def get_tool_call(self, idempotency_key: str) -> JSON:
        """The tool-call record (while within its TTL)."""
        return self.send(calls.get_tool_call(idempotency_key))

    def invoke(
        self,
        task_id: TaskId,
        tool: str,
        step: int,
        input: Mapping[str, Any],
        *,
        lease_epoch: int | None = None,
    ) -> JSON:
        """Have the backplane call a registered tool for this step (the gateway):
        ``{"idempotency_key", "status", "result", "replayed"}``. An answer on record is returned
        without calling the tool again; ``503 circuit_open`` while the tool's breaker is open."""
        return self.send(calls.invoke(task_id, tool, step, input, lease_epoch=lease_epoch))

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
        return self.send(calls.dispatch_subtask(task_id, step, kind, input, lease_epoch=lease_epoch))
