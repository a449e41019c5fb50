"""Per-principal rate limit (``BACKPLANE_RATE_LIMIT``, DRF's "<count>/<s|m|h|d>"): 429 with the
seconds left in the window as ``Retry-After``, shared by every web process.

The counters live in PostgreSQL, in the unlogged ``backplane_cache`` table (created by a
migration whether or not Redis is configured), one row per principal: its count as text and the
end of its window (``expires``). A fixed window rather than DRF's list of request times: one
small value counted atomically in one statement, so concurrent requests in several processes
never pass the limit. An agent's request is counted in the statement that finds its token
(authentication.py); a staff session's by ``count_request``. DRF's throttle class, which reads
either count, is ``authentication.PrincipalRateThrottle``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime

from django.conf import settings
from django.db import connection

PERIODS = {"s": 1, "m": 60, "h": 3600, "d": 86400}

# ON CONFLICT takes the row's lock, so two processes counting at the same instant queue and the
# second sees the first's count: no request is lost. A row from an earlier window starts again at
# 1; one from a later window (another process's clock is ahead) is counted into, never moved
# back. These rows are not pickled values: Django's cache API must not read them, and its
# culling (when the table is Django's cache too) only starts a window afresh.
COUNT_SQL = """
INSERT INTO backplane_cache AS c (cache_key, value, expires) {source}
ON CONFLICT (cache_key) DO UPDATE SET
    value = CASE WHEN c.expires < EXCLUDED.expires THEN '1' ELSE (c.value::bigint + 1)::text END,
    expires = GREATEST(c.expires, EXCLUDED.expires)
RETURNING value::bigint
"""


def parse_rate(rate: str) -> tuple[int, int]:
    """DRF's "<count>/<period>" (period s, m, h or d; only its first letter counts, "10/min" too)."""
    count, _, period = rate.partition("/")
    return int(count), PERIODS[period.strip()[:1]]


@dataclass(frozen=True)
class Window:
    """The rate limit's current window: a request counted as number ``n`` in it waits
    ``wait_after(n)`` seconds (None: it is within the limit)."""

    limit: int
    ends_at: float  # epoch seconds

    @property
    def expires(self) -> datetime:
        return datetime.fromtimestamp(self.ends_at, tz=UTC)

    def wait_after(self, count: int) -> float | None:
        if count <= self.limit:
            return None
        return max(self.ends_at - time.time(), 0.0)


def current_window() -> Window:
    limit, period = parse_rate(settings.BACKPLANE_RATE_LIMIT)
    return Window(limit=limit, ends_at=(time.time() // period + 1) * period)


def counter_key(principal_pk: str) -> str:
    return f"throttle:{principal_pk}"


_COUNT_ONE_SQL = COUNT_SQL.format(source="VALUES (%s, '1', %s)")


def count_request(principal_pk: str) -> float | None:
    """Count one request of a principal; the seconds until its window ends when it is over the
    limit, else None."""
    window = current_window()
    return window.wait_after(count_into(counter_key(principal_pk), window))


def count_into(key: str, window: Window) -> int:
    """Count one request into ``key``'s counter for ``window``; the count so far."""
    with connection.cursor() as cursor:
        cursor.execute(_COUNT_ONE_SQL, [key, window.expires])
        (count,) = cursor.fetchone()
    return int(count)
