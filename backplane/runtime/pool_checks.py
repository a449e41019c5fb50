"""The connection pool's health check, paid only by connections that sat idle.

psycopg_pool's ``check_connection`` (Django's default with ``CONN_HEALTH_CHECKS``) sends an
empty query every time a connection leaves the pool: one more round trip on every request, a
quarter of a task read's. A connection handed back less than ``FRESH_SECONDS`` ago was working
then; one that was idle longer (an outage, a restart, an idle night) is checked as before, so a
restarted database still never hands a request a dead connection. What is left uncovered is a
server that drops a connection within that second; the request that meets it gets the API's
503 with ``Retry-After`` (backplane/runtime/database_gate.py) and the pool discards it.

The settings hand ``note_returned`` to the pool as its ``reset`` hook. Django passes the pool
its own ``check`` (and refuses a second one in the options), so ``install`` replaces it on the
pool Django built, once per process (``BackplaneConfig.ready``); a test fails if psycopg_pool
stops keeping it where ``install`` looks.
"""

from __future__ import annotations

import time
import weakref

import psycopg
from psycopg_pool import ConnectionPool

FRESH_SECONDS = 1.0

_returned_at: weakref.WeakKeyDictionary[psycopg.Connection, float] = weakref.WeakKeyDictionary()


def note_returned(conn: psycopg.Connection) -> None:
    """The pool's ``reset`` hook: the connection is back, in working order, at this instant."""
    _returned_at[conn] = time.monotonic()


def check_if_idle(conn: psycopg.Connection) -> None:
    """The pool's ``check`` hook: ``check_connection`` unless the connection was returned just now."""
    returned = _returned_at.get(conn)
    if returned is not None and time.monotonic() - returned < FRESH_SECONDS:
        return
    ConnectionPool.check_connection(conn)


def install(pool: ConnectionPool) -> None:
    """Make ``pool`` check connections with ``check_if_idle`` instead of before every use."""
    if getattr(pool, "_check", None) is not ConnectionPool.check_connection:
        raise RuntimeError(f"unexpected pool check {getattr(pool, '_check', None)!r}; psycopg_pool changed?")
    pool._check = check_if_idle
