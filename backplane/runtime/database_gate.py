"""Fail fast while the database is down.

Without it, with the database gone, every request would wait for the connection pool's timeout
(10 s) before its 503, ``/readyz`` included, so a probe with a shorter timeout would see a timeout
instead of an answer. The gate keeps one process-wide fact, "the database was unreachable a moment ago",
and answers from it:

- A request that fails to reach the database (``OperationalError`` / ``InterfaceError``, the
  pool's timeout included) marks the gate down; that request answers 503 as before.
- While the gate is down, requests answer 503 at once, without touching the pool. At most one
  of them every ``PROBE_INTERVAL`` seconds probes with a connection of its own (not from the
  pool, which is what is broken), bounded by ``PROBE_TIMEOUT``; a probe that connects opens
  the gate again.
- ``/readyz`` always probes that way, so it answers within a second whatever the pool is doing.
- When a probe finds the database back, Django's pool is renewed: the connections it held from
  before the outage are dead, and psycopg_pool, finding them one by one on requests' checks,
  sleeps out its backoff between two failed checks, past the pool's timeout, so the first
  request after the outage would be a 503 though the database is up. (The HTTP front renews the
  event loop's pool itself: api/agent_front.py.)

The probe runs in a thread of its own so a database host that does not even refuse the
connection (libpq's connect timeout cannot go below 2 s) still costs a caller at most
``PROBE_TIMEOUT``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

import psycopg
import psycopg_pool
from django.db import InterfaceError, OperationalError, connection, connections
from django.http import HttpRequest, HttpResponse, JsonResponse

logger = logging.getLogger(__name__)

PROBE_TIMEOUT = 0.8
PROBE_INTERVAL = 0.5
RETRY_AFTER_SECONDS = 2


# SQLSTATEs that mean "no usable server" rather than "this statement failed": connection
# exceptions (class 08), and the server shutting down or not accepting connections yet.
_UNREACHABLE_SQLSTATES = ("08", "57P01", "57P02", "57P03")


def is_connection_failure(exc: BaseException) -> bool:
    """A Django database error that says the database cannot be reached (not that a query failed)."""
    if isinstance(exc, InterfaceError):
        return True
    if not isinstance(exc, OperationalError):
        return False
    cause = exc.__cause__
    if isinstance(cause, psycopg_pool.PoolTimeout):
        return True
    if isinstance(cause, psycopg.OperationalError):
        sqlstate = cause.sqlstate
        return sqlstate is None or sqlstate.startswith(_UNREACHABLE_SQLSTATES)
    return cause is None


def thread_connection_broken() -> bool:
    """Whether this thread's Django connection is one psycopg found broken. An error raised on
    it then means the database was lost, whatever psycopg called it: a connection lost in the
    middle of the protocol surfaces as another error, e.g. the ``InternalError`` "received 2
    results from command 'BEGIN'" when PgBouncer's server connection dies under a transaction."""
    raw = connection.connection
    return raw is not None and bool(raw.broken)


def _connect_once() -> None:
    params = connection.get_connection_params()
    params["connect_timeout"] = max(2, int(params.get("connect_timeout") or 2))
    with psycopg.connect(**params, autocommit=True) as probe:
        probe.execute("SELECT 1")


def _renew_pool() -> None:
    """Replace the idle connections of Django's pool (a process without one has none)."""
    pool = getattr(connections["default"], "pool", None)  # the PostgreSQL backend's, None when off
    if pool is not None:
        pool.drain()


class DatabaseGate:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._down_since: float | None = None
        self._last_probe_at = 0.0
        self.last_error = ""
        self._prober = ThreadPoolExecutor(max_workers=1, thread_name_prefix="db-probe")
        self._pending: Future[None] | None = None

    @property
    def is_marked_down(self) -> bool:
        return self._down_since is not None

    def mark_down(self, error: BaseException | str) -> None:
        with self._lock:
            if self._down_since is None:
                logger.warning("database unreachable, answering 503 until it is back: %s", error)
                self._down_since = time.monotonic()
                self._last_probe_at = time.monotonic()
            self.last_error = str(error)[:300] or error.__class__.__name__

    def mark_up(self) -> None:
        with self._lock:
            down_since, self._down_since = self._down_since, None
        if down_since is not None:
            logger.warning("database reachable again after %.1fs", time.monotonic() - down_since)
            _renew_pool()

    def probe(self) -> str | None:
        """Connect once, outside the pool, within ``PROBE_TIMEOUT``: None when the database
        answered, else what went wrong. Updates the gate either way."""
        with self._lock:
            # A probe still hanging from before is not started twice; its caller gave up on it.
            if self._pending is None or self._pending.done():
                self._pending = self._prober.submit(_connect_once)
            pending = self._pending
        try:
            pending.result(timeout=PROBE_TIMEOUT)
        except FutureTimeout:
            problem = f"no answer within {PROBE_TIMEOUT}s"
        except psycopg.Error as exc:
            problem = f"{exc.__class__.__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
        else:
            self.mark_up()
            return None
        self.mark_down(problem)
        return problem

    def should_refuse(self) -> bool:
        """True while the database is known to be down; probes again at most every PROBE_INTERVAL."""
        if self._down_since is None:
            return False
        with self._lock:
            due = time.monotonic() - self._last_probe_at >= PROBE_INTERVAL
            if due:
                self._last_probe_at = time.monotonic()
        if not due:
            return True
        return self.probe() is not None


gate = DatabaseGate()

_PASS_THROUGH = ("/healthz", "/readyz", "/static/")


def unavailable_body() -> dict[str, Any]:
    """The 503's body while the gate is down (here, and on the agent routes on the HTTP front: api/agent_front.py)."""
    return {"error": {"code": "unavailable", "message": "the database is unavailable; retry later",
                      "details": {"problem": gate.last_error}}}


def unavailable_response(request: HttpRequest) -> HttpResponse:
    response = JsonResponse(unavailable_body(), status=503)
    response["Retry-After"] = str(RETRY_AFTER_SECONDS)
    return response


class DatabaseGateMiddleware:
    """Answers 503 at once while the gate is down (the contract's error shape, ``Retry-After``).

    ``/healthz`` says only that the process is up, ``/readyz`` probes for itself, and static
    files need no database, so those pass. Synchronous only: HTTP runs through Django's WSGI
    handler (backplane/asgi.py), and the probe blocks on a connect.
    """

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if gate.is_marked_down and not request.path.startswith(_PASS_THROUGH) and gate.should_refuse():
            return unavailable_response(request)
        return self.get_response(request)

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        """A page (not the API, whose handler does the same) that lost the database: 503, gate down."""
        if is_connection_failure(exception):
            gate.mark_down(exception)
            return unavailable_response(request)
        return None
