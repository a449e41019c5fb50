"""Per-token rate limit (429 with Retry-After through the exception handler), shared by every
web process through the shared cache (settings.CACHES: Redis with REDIS_URL, else the database's
cache table). The lean routes count into the same counter, from a web process's own count
between two confirmations (api/confirmations.py)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from django.conf import settings
from django.core.cache import caches
from django.core.cache.backends.db import DatabaseCache
from django.db import connections, router
from rest_framework.request import Request
from rest_framework.throttling import BaseThrottle

from backplane.api.confirmations import confirmations
from backplane.eventlog.models import hash_token


class PrincipalRateThrottle(BaseThrottle):
    """One counter per agent token (or staff user) and fixed window of the rate's period
    (``BACKPLANE_RATE_LIMIT``, DRF's "<count>/<s|m|h|d>"): 600/s lets 600 requests through in
    each second, whichever web process serves them.

    A counter rather than DRF's list of request times: one small value to write instead of a
    list as long as the limit, counted atomically (one statement on the database cache's table,
    INCR on Redis), so concurrent requests in several processes never exceed the limit. (On the
    lean routes, with ``BACKPLANE_AUTH_CONFIRM_SECONDS`` above 0, other processes' requests are
    seen once per interval: api/confirmations.py gives the bound.)
    """

    scope = "principal"

    def __init__(self) -> None:
        self.retry_after: float | None = None

    def get_cache_key(self, request: Request, view: Any) -> str | None:
        principal = getattr(request, "user", None)
        if principal is None or not getattr(principal, "is_authenticated", False):
            return None
        return f"throttle:{principal.pk}"

    def allow_request(self, request: Request, view: Any) -> bool:
        key = self.get_cache_key(request, view)
        if key is None:
            return True
        # An agent's token (DRF's request.auth): the lean routes of this process may be counting
        # it themselves between confirmations, and learn this count too.
        token = request.auth if isinstance(request.auth, str) else None
        self.retry_after = rate_limit_wait(key, token=token)
        return self.retry_after is None


def rate_limit_wait(key: str, *, token: str | None = None) -> float | None:
    """Count one request of the principal behind ``key`` (``throttle:<principal.pk>``); None when
    it is within the limit, else the seconds until its window ends. The lean routes call it too.
    With the agent's ``token``, the count is also noted for this process's lean routes
    (api/confirmations.py), so that one process counts both paths of a token exactly."""
    limit, period = parse_rate(settings.BACKPLANE_RATE_LIMIT)
    now = time.time()
    window_end = (int(now // period) + 1) * period
    count = _count(key, window_end=window_end, period=period)
    if token is not None:
        confirmations.note_shared_count(hash_token(token), window_end=window_end, shared_count=count)
    if count <= limit:
        return None
    return window_end - now

    def wait(self) -> float | None:
        return self.retry_after


PERIODS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_rate(rate: str) -> tuple[int, int]:
    """DRF's "<count>/<period>" (period s, m, h or d; only its first letter counts, "10/min" too)."""
    count, _, period = rate.partition("/")
    return int(count), PERIODS[period.strip()[:1]]


def _count(key: str, *, window_end: int, period: int) -> int:
    """Count one request into the window ending at ``window_end`` (epoch seconds) and return the
    count so far, atomically across processes."""
    cache = caches["default"]
    if isinstance(cache, DatabaseCache):
        return _database_count(cache, key, window_end=window_end)
    # Redis: a key per window, created by SET NX (of two processes opening a window, one creates
    # it, the other counts into it), counted by INCR, gone a second after the window.
    windowed = f"{key}:{window_end}"
    if cache.add(windowed, 1, period + 1):
        return 1
    try:
        return int(cache.incr(windowed))
    except ValueError:  # it expired between the two: a new window
        cache.add(windowed, 1, period + 1)
        return 1


def _database_count(db_cache: DatabaseCache, key: str, *, window_end: int) -> int:
    """One statement on the cache table: the principal's row holds its count (as text) and the
    end of its window (``expires``). A row from an earlier window starts again at 1; a row from
    a later window (another process's clock is ahead) is counted into, never moved back.

    ON CONFLICT takes the row's lock, so two processes counting at the same instant queue and the
    second sees the first's count: no request is lost, unlike the cache API's incr (a read, then
    a write). One row per principal, so the table does not grow with time. These rows are not
    pickled values, so they are for this function only (``cache.get`` cannot read them);
    ``cache.clear()`` and the cache's culling may remove them, which only starts a window afresh.
    """
    connection = connections[router.db_for_write(db_cache.cache_model_class)]
    expires = datetime.fromtimestamp(window_end, tz=UTC)
    with connection.cursor() as cursor:
        cursor.execute(count_upsert_sql(db_cache, "VALUES (%s, '1', %s)"),
                       [db_cache.make_and_validate_key(key), expires])
        (count,) = cursor.fetchone()
    return int(count)


def count_upsert_sql(db_cache: DatabaseCache, source: str) -> str:
    """The counting statement of ``_database_count``; ``source`` gives the (key, count, expires)
    row, its count as text: 1, or more when a web process hands over requests it counted itself
    (api/confirmations.py)."""
    table = connections[router.db_for_write(db_cache.cache_model_class)].ops.quote_name(db_cache._table)
    return f"""
INSERT INTO {table} AS c (cache_key, value, expires) {source}
ON CONFLICT (cache_key) DO UPDATE SET
    value = CASE WHEN c.expires < EXCLUDED.expires THEN EXCLUDED.value
                 ELSE (c.value::bigint + EXCLUDED.value::bigint)::text END,
    expires = GREATEST(c.expires, EXCLUDED.expires)
RETURNING value::bigint
"""


@dataclass(frozen=True)
class AgentCounting:
    """How to count an agent's request in the statement that authenticates it (lean routes):
    the database cache, and its key for agent N is ``key_prefix`` followed by N."""

    db_cache: DatabaseCache
    key_prefix: str
    limit: int
    window_end: int


def agent_counting() -> AgentCounting | None:
    """None unless the database cache counts requests with Django's default key function."""
    cache = caches["default"]
    if not isinstance(cache, DatabaseCache):
        return None
    probe = cache.make_key("throttle:agent:")
    if cache.make_key("throttle:agent:12345") != probe + "12345":
        return None
    limit, period = parse_rate(settings.BACKPLANE_RATE_LIMIT)
    return AgentCounting(cache, probe, limit, (int(time.time() // period) + 1) * period)


def wait_after_count(counting: AgentCounting, count: int) -> float | None:
    """``rate_limit_wait``'s answer once the count is known."""
    return None if count <= counting.limit else max(counting.window_end - time.time(), 0.0)
