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
from collections.abc import Iterator, Sequence
from typing import TypeVar

import httpx

from backplane_client import calls
from backplane_client.calls import APPROVAL_WAIT_SECONDS, JSON, Call, Lease, TaskId, event_draft, replayed
from backplane_client.errors import BackplaneAPIError, LeaseLost, ToolCallFailed
from backplane_client.methods import Requests, http_settings
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


class AgentClient(Requests):
    """An agent's connection to the backplane, authenticated with its bearer token.

    ``base_url`` is the server's root (``http://host:8000``); the client adds ``/api/v1``.
    ``retry`` says how often a request is sent before an error reaches the caller
    (:meth:`RetryPolicy.none` to send once). Pass ``http_client`` to bring your own
    :class:`httpx.Client` (transport, proxies, TLS); its base URL and auth header are then the
    caller's business, and the retry policy still applies.

    One client may serve several threads (a session's heartbeat thread shares it); httpx's
    client is thread-safe and :attr:`last_replayed` is kept per thread.

    Its request methods (``create_task`` to ``dispatch_subtask``) are the builders of
    :mod:`backplane_client.calls`, sent by :meth:`send` (:class:`~backplane_client.methods.Requests`).
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
        self._http = http_client or httpx.Client(**http_settings(base_url, token, timeout))
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
        # AsyncAgentClient.send is this loop again because sleeping and sending block here and
        # are awaited there; what to retry and how long to wait is decided once, in RetryPolicy.
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

    # --- composed of requests --------------------------------------------------------------

    def iter_events(self, task_id: TaskId, *, after_seq: int = 0, page_size: int = 1000) -> Iterator[JSON]:
        """Every event after ``after_seq``, following the pages."""
        cursor: int | None = after_seq
        while cursor is not None:
            page = self.events(task_id, after_seq=cursor, limit=page_size)
            yield from page["results"]
            cursor = page["next_after_seq"]

    def wait_for_approval(self, approval_id: str, *, timeout: float = 3600.0) -> JSON:
        """The approval request once decided (``status`` ``granted``, ``denied`` or ``expired``),
        or as it is after ``timeout`` seconds; each read waits on the server (docs/approvals.md).
        Then dispatch the same call again: granted, it is made; otherwise that is refused."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            request = self.get_approval(approval_id, wait=max(0, min(APPROVAL_WAIT_SECONDS, int(left))))
            if request["status"] != "pending" or left <= 1:
                return request
