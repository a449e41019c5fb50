"""Per-token rate limit (429 with Retry-After through the exception handler), shared by every
web process through the shared cache (settings.CACHES: Redis with REDIS_URL, else the database's
cache table)."""

from __future__ import annotations

import time
from typing import Any

from django.conf import settings
from django.core.cache import caches
from django.core.cache.backends.db import DatabaseCache
from django.db import connections, router, transaction
from rest_framework.request import Request
from rest_framework.throttling import BaseThrottle


class PrincipalRateThrottle(BaseThrottle):
    """One counter per agent token (or staff user) and fixed window of the rate's period
    (``BACKPLANE_RATE_LIMIT``, DRF's "<count>/<s|m|h|d>"): 600/s lets 600 requests through in
    each second, whichever web process serves them.

    A counter rather than DRF's list of request times: one small value per window to read and
    write instead of a list as long as the limit, and it can be counted atomically.
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
        limit, period = parse_rate(settings.BACKPLANE_RATE_LIMIT)
        now = time.time()
        window = int(now // period)
        # Kept a second past its window: the database cache stores expiry times in whole seconds.
        if _count(f"{key}:{period}:{window}", timeout=period + 1) <= limit:
            return True
        self.retry_after = (window + 1) * period - now
        return False

    def wait(self) -> float | None:
        return self.retry_after


PERIODS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_rate(rate: str) -> tuple[int, int]:
    """DRF's "<count>/<period>" (period s, m, h or d; only its first letter counts, "10/min" too)."""
    count, _, period = rate.partition("/")
    return int(count), PERIODS[period.strip()[:1]]


def _count(key: str, *, timeout: int) -> int:
    """Count one request into ``key`` and return the count so far, atomically across processes.

    ``add`` creates the counter only where there is none (of two processes opening a window,
    one creates it, the other counts into it). Redis's INCR is atomic. The database cache's incr
    is a read then a write, so the counter's row is locked first: two processes counting at
    the same instant queue on it instead of both writing the same number.
    """
    cache = caches["default"]
    if cache.add(key, 1, timeout):
        return 1
    try:
        if isinstance(cache, DatabaseCache):
            return _database_incr(cache, key)
        return int(cache.incr(key))
    except ValueError:  # the counter expired between add and incr: a new window
        cache.add(key, 1, timeout)
        return 1


def _database_incr(db_cache: DatabaseCache, key: str) -> int:
    db = router.db_for_write(db_cache.cache_model_class)
    table = connections[db].ops.quote_name(db_cache._table)
    with transaction.atomic(using=db), connections[db].cursor() as cursor:
        cursor.execute(f"SELECT 1 FROM {table} WHERE cache_key = %s FOR UPDATE",
                       [db_cache.make_and_validate_key(key)])
        return int(db_cache.incr(key))
