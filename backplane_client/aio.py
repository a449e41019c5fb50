"""The agents' client for asyncio: :class:`AsyncAgentClient`, over :class:`httpx.AsyncClient`.

The same requests as :class:`~backplane_client.AgentClient` (both send the calls built by
:mod:`backplane_client.calls` and map answers with the same code), the same retry policy and
the same guarantees: an append gets its idempotency key and a new task its id once per call,
before the first attempt, so retries never write twice. See the sync client's methods for
what each request does; the docstrings here only point at them.

    async with AsyncAgentClient("http://backplane:8000", token) as bp:
        lease = await bp.claim(["research"], lease_seconds=30)
        if lease is not None:
            context = await bp.recovery_context(lease.task_id)
            await bp.append(lease.task_id, "TaskCompleted", {"output": {}}, lease_epoch=lease.lease_epoch)

There is no async session: heartbeat with ``asyncio.create_task`` around :meth:`heartbeat`
if a lease must outlive a third of its length.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any, TypeVar

import httpx

from backplane_client import calls
from backplane_client.calls import JSON, Call, Lease, TaskId, replayed
from backplane_client.retry import DEFAULT_RETRY, RetryPolicy, gave_up, log_retry

__all__ = ["AsyncAgentClient"]

T = TypeVar("T")
# (id of the client, whether its latest answer in this asyncio task was a replay). One variable
# for the module, as contextvars should be; the id keeps two clients in one task apart.
_LAST_REPLAYED: contextvars.ContextVar[tuple[int, bool]] = contextvars.ContextVar("last_replayed", default=(0, False))


class AsyncAgentClient:
    """An agent's asynchronous connection to the backplane; arguments as :class:`AgentClient`'s.

    :attr:`last_replayed` is kept per asyncio task (a context variable), so concurrent
    coroutines sharing one client each see their own latest answer.
    """

    def __init__(
        self,
        base_url: str,
        token: str,
        *,
        timeout: float = 10.0,
        retry: RetryPolicy = DEFAULT_RETRY,
        http_client: httpx.AsyncClient | None = None,
    ) -> None:
        self.retry = retry
        self._owns_client = http_client is None
        self._http = http_client or httpx.AsyncClient(
            base_url=base_url.rstrip("/"),
            headers={"Authorization": f"Bearer {token}", "Accept": "application/json"},
            timeout=timeout,
        )

    @property
    def last_replayed(self) -> bool:
        """Whether this asyncio task's latest answer carried ``Idempotent-Replay: true``."""
        client, replay = _LAST_REPLAYED.get()
        return replay and client == id(self)

    async def aclose(self) -> None:
        if self._owns_client:
            await self._http.aclose()

    async def __aenter__(self) -> AsyncAgentClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def send(self, call: Call[T], *, retry: RetryPolicy | None = None) -> T:
        """As :meth:`AgentClient.send`: the same loop, with ``await`` where that one blocks."""
        policy = retry or self.retry
        attempt = 0
        while True:
            attempt += 1
            try:
                response = await self._http.request(call.method, call.url, json=call.json, params=call.params)
            except httpx.TransportError as error:
                delay = policy.delay_after_error(attempt, error)
                if delay is None:
                    raise gave_up(error, attempt)
                log_retry(call, attempt, delay, repr(error))
            else:
                delay = policy.delay_after_answer(attempt, response)
                if delay is None:
                    calls.check(response, attempts=attempt)
                    _LAST_REPLAYED.set((id(self), replayed(response)))
                    return call.read(response)
                log_retry(call, attempt, delay, f"answered {response.status_code}")
            await asyncio.sleep(delay)

    # --- tasks and events ------------------------------------------------------------------

    async def create_task(
        self,
        kind: str,
        input: Mapping[str, Any],
        *,
        task_id: TaskId | None = None,
        parent_task_id: TaskId | None = None,
        max_attempts: int | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> JSON:
        """:meth:`AgentClient.create_task`."""
        return await self.send(calls.create_task(kind, input, task_id=task_id, parent_task_id=parent_task_id,
                                                 max_attempts=max_attempts, metadata=metadata))

    async def get_task(self, task_id: TaskId) -> JSON:
        """:meth:`AgentClient.get_task`."""
        return await self.send(calls.get_task(task_id))

    async def list_tasks(
        self, *, status: str | None = None, kind: str | None = None, limit: int | None = None,
        cursor: str | None = None,
    ) -> JSON:
        """:meth:`AgentClient.list_tasks`."""
        return await self.send(calls.list_tasks(status=status, kind=kind, limit=limit, cursor=cursor))

    async def verify(self, task_id: TaskId) -> JSON:
        """:meth:`AgentClient.verify`."""
        return await self.send(calls.verify(task_id))

    async def events(self, task_id: TaskId, *, after_seq: int = 0, limit: int | None = None) -> JSON:
        """:meth:`AgentClient.events`."""
        return await self.send(calls.events(task_id, after_seq=after_seq, limit=limit))

    async def iter_events(self, task_id: TaskId, *, after_seq: int = 0, page_size: int = 1000) -> AsyncIterator[JSON]:
        """:meth:`AgentClient.iter_events`: ``async for event in bp.iter_events(task_id)``."""
        cursor: int | None = after_seq
        while cursor is not None:
            page = await self.events(task_id, after_seq=cursor, limit=page_size)
            for event in page["results"]:
                yield event
            cursor = page["next_after_seq"]

    async def append(
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
        """:meth:`AgentClient.append` (a key is generated once per call when none is given)."""
        return await self.send(calls.append(
            task_id, type, payload, idempotency_key=idempotency_key, lease_epoch=lease_epoch,
            expected_seq=expected_seq, lamport=lamport, causation_id=causation_id,
            correlation_id=correlation_id, trace_id=trace_id, outbox=outbox,
        ))

    async def append_batch(
        self,
        task_id: TaskId,
        events: Sequence[Mapping[str, Any]],
        *,
        lease_epoch: int | None = None,
        expected_seq: int | None = None,
    ) -> list[JSON]:
        """:meth:`AgentClient.append_batch`."""
        return await self.send(calls.append_batch(task_id, events, lease_epoch=lease_epoch,
                                                  expected_seq=expected_seq))

    # --- leases and recovery ---------------------------------------------------------------

    async def claim(
        self, kinds: Sequence[str] | None = None, *, lease_seconds: int | None = None, task_id: TaskId | None = None
    ) -> Lease | None:
        """:meth:`AgentClient.claim` (not idempotent on the server: see there)."""
        return await self.send(calls.claim(kinds, lease_seconds=lease_seconds, task_id=task_id))

    async def heartbeat(self, task_id: TaskId, lease_epoch: int) -> JSON:
        """:meth:`AgentClient.heartbeat`."""
        return await self.send(calls.heartbeat(task_id, lease_epoch))

    async def release(self, task_id: TaskId, lease_epoch: int) -> JSON:
        """:meth:`AgentClient.release`."""
        return await self.send(calls.release(task_id, lease_epoch))

    async def recovery_context(self, task_id: TaskId) -> JSON:
        """:meth:`AgentClient.recovery_context`."""
        return await self.send(calls.recovery_context(task_id))

    # --- forks and drift -------------------------------------------------------------------

    async def fork(
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
        """:meth:`AgentClient.fork` (the fork's id is picked once per call when none is given)."""
        return await self.send(calls.fork(source_task_id, at_seq=at_seq, reason=reason, input=input,
                                          task_id=task_id, sandbox=sandbox, tool_answers=tool_answers))

    async def diff(self, a: TaskId, b: TaskId) -> JSON:
        """:meth:`AgentClient.diff`."""
        return await self.send(calls.diff(a, b))

    # --- tool calls and sub-agents ---------------------------------------------------------

    async def dispatch_tool_call(
        self,
        task_id: TaskId,
        step: int,
        tool: str,
        input: Mapping[str, Any],
        *,
        lease_epoch: int | None = None,
        compensation: Mapping[str, Any] | None = None,
    ) -> JSON:
        """:meth:`AgentClient.dispatch_tool_call`."""
        return await self.send(calls.dispatch_tool_call(task_id, step, tool, input, lease_epoch=lease_epoch,
                                                        compensation=compensation))

    async def record_tool_result(
        self, idempotency_key: str, status: str, result: Mapping[str, Any], *, lease_epoch: int | None = None
    ) -> JSON:
        """:meth:`AgentClient.record_tool_result`."""
        return await self.send(calls.record_tool_result(idempotency_key, status, result, lease_epoch=lease_epoch))

    async def get_tool_call(self, idempotency_key: str) -> JSON:
        """:meth:`AgentClient.get_tool_call`."""
        return await self.send(calls.get_tool_call(idempotency_key))

    async def invoke(
        self, task_id: TaskId, tool: str, step: int, input: Mapping[str, Any], *, lease_epoch: int | None = None
    ) -> JSON:
        """:meth:`AgentClient.invoke`."""
        return await self.send(calls.invoke(task_id, tool, step, input, lease_epoch=lease_epoch))

    async def dispatch_subtask(
        self, task_id: TaskId, step: int, kind: str, input: Mapping[str, Any], *, lease_epoch: int | None = None
    ) -> JSON:
        """:meth:`AgentClient.dispatch_subtask`."""
        return await self.send(calls.dispatch_subtask(task_id, step, kind, input, lease_epoch=lease_epoch))
