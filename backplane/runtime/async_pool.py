"""psycopg's async connection pool, for the routes the HTTP front serves on the event loop
(``api/agent_front.py``), on the database Django's ``default`` alias names.

Django's own connections belong to the threads of the WSGI pool and cannot be awaited; these
belong to the server's event loop. The pool is opened on first use, in the loop that uses it
(uvicorn runs one; each test runs its own and closes the pool with ``async_pool_close``), from
the connection parameters Django would use (the same hosts, multi-host failover and connect
timeout included). Its connections are in autocommit: each statement of a read is its own
transaction, as in Django outside ``atomic``; like Django's, they prepare the statements they
run often (the settings' ``prepare_threshold``), and prepare none behind a transaction pooler
(``BACKPLANE_DB_POOLER``), where the settings set that threshold to None.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import psycopg
from django.conf import settings
from django.db import connections
from psycopg_pool import AsyncConnectionPool

# Names the pool's connections in pg_stat_activity.
APPLICATION_NAME = "backplane-async"

_pools: dict[asyncio.AbstractEventLoop, asyncio.Task[AsyncConnectionPool]] = {}


def _connection_kwargs() -> dict[str, Any]:
    params = dict(connections["default"].get_connection_params())
    # Django's cursor classes are synchronous; an async connection makes its own.
    params.pop("cursor_factory", None)
    params["autocommit"] = True
    params["application_name"] = APPLICATION_NAME
    return params


async def _opened() -> AsyncConnectionPool:
    pool = AsyncConnectionPool(kwargs=_connection_kwargs(), min_size=1, max_size=settings.BACKPLANE_ASYNC_DB_POOL_MAX,
                               timeout=settings.BACKPLANE_DB_POOL_TIMEOUT,
                               reconnect_timeout=settings.BACKPLANE_DB_POOL_RECONNECT_TIMEOUT, open=False,
                               name=APPLICATION_NAME)
    # wait=False: a database that is down must not hold the first request past the pool's timeout.
    await pool.open(wait=False)
    return pool


async def async_pool() -> AsyncConnectionPool:
    """The running loop's pool, opened on first use. Requests that arrive together while it
    opens all wait for the one opening (a task awaited by each), never open a second."""
    loop = asyncio.get_running_loop()
    opening = _pools.get(loop)
    if opening is None:
        opening = _pools[loop] = loop.create_task(_opened())
    return await opening


@contextlib.asynccontextmanager
async def pooled_connection() -> AsyncIterator[psycopg.AsyncConnection[Any]]:
    """A connection of the running loop's pool for one request's statements.

    An error that leaves the connection broken is raised as ``psycopg.OperationalError``, the
    error of a lost database (503, and the pool renewed), whatever psycopg called it: a server
    connection lost in the middle of the protocol surfaces as another error, e.g. the
    ``InternalError`` "received 2 results from command 'BEGIN'" when PgBouncer's server
    connection dies under a transaction during a failover."""
    pool = await async_pool()
    async with pool.connection() as conn:
        try:
            yield conn
        except psycopg.Error as exc:
            if conn.broken and not isinstance(exc, psycopg.OperationalError):
                raise psycopg.OperationalError(f"the database connection was lost: {exc}") from exc
            raise


async def async_pool_renew() -> None:
    """Replace every idle connection of the running loop's pool, after one of them found the
    database gone: after a restart or a failover they are all dead, and each would cost a
    request its 503. No check runs when a connection is handed out (psycopg_pool's would cost
    every read a round trip, and a failed check waits out a second of backoff, past the pool's
    timeout): the read that meets a lost database answers 503 and renews the pool."""
    opening = _pools.get(asyncio.get_running_loop())
    if opening is not None:
        await (await opening).drain()


async def async_pool_close() -> None:
    """Close the running loop's pool, if it has one (a test's loop before it ends)."""
    opening = _pools.pop(asyncio.get_running_loop(), None)
    if opening is not None:
        await (await opening).close()
