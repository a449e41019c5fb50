"""The agents' client for asyncio: :class:`AsyncAgentClient`, over :class:`httpx.AsyncClient`.

The same requests as :class:`~backplane_client.AgentClient`, declared once for both
(:mod:`backplane_client.methods`: each is a builder of :mod:`backplane_client.calls`, and here a
coroutine function), answers mapped with the same code, the same retry policy and the same
guarantees: an append gets its idempotency key and a new task its id once per call, before the
first attempt, so retries never write twice.

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
import time
from collections.abc import AsyncIterator
from typing import TypeVar

import httpx

from backplane_client import calls
from backplane_client.calls import APPROVAL_WAIT_SECONDS, JSON, Call, TaskId, replayed
from backplane_client.methods import Requests, http_settings
from backplane_client.retry import DEFAULT_RETRY, RetryPolicy, gave_up, log_retry

__all__ = ["AsyncAgentClient"]

T = TypeVar("T")
# (id of the client, whether its latest answer in this asyncio task was a replay). One variable
# for the module, as contextvars should be; the id keeps two clients in one task apart.
_LAST_REPLAYED: contextvars.ContextVar[tuple[int, bool]] = contextvars.ContextVar("last_replayed", default=(0, False))


class AsyncAgentClient(Requests):
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
        self._http = http_client or httpx.AsyncClient(**http_settings(base_url, token, timeout))

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
        # AgentClient.send's loop again, since sending and sleeping block there and are awaited
        # here; what to retry and how long to wait is decided once, in RetryPolicy.
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

    # --- composed of requests --------------------------------------------------------------
    # Written for each client, as a generator is either blocking or asynchronous.

    async def iter_events(self, task_id: TaskId, *, after_seq: int = 0, page_size: int = 1000) -> AsyncIterator[JSON]:
        """:meth:`AgentClient.iter_events`: ``async for event in bp.iter_events(task_id)``."""
        cursor: int | None = after_seq
        while cursor is not None:
            page = await self.events(task_id, after_seq=cursor, limit=page_size)
            for event in page["results"]:
                yield event
            cursor = page["next_after_seq"]

    async def wait_for_approval(self, approval_id: str, *, timeout: float = 3600.0) -> JSON:
        """:meth:`AgentClient.wait_for_approval`, awaited."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            request = await self.get_approval(approval_id, wait=max(0, min(APPROVAL_WAIT_SECONDS, int(left))))
            if request["status"] != "pending" or left <= 1:
                return request
