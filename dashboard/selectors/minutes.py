"""The time axis of the per-minute charts (activity, delivery lag): a window that ends with the
current minute, and every bucket in it, so a minute with nothing in it is drawn as zero."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta


def window_to_this_minute(now: datetime, *, hours: int) -> tuple[datetime, datetime]:
    """``hours`` back from the end of the current minute: (start, end), end excluded."""
    end = now.replace(second=0, microsecond=0) + timedelta(minutes=1)
    return end - timedelta(hours=hours), end


def buckets(start: datetime, end: datetime, step: timedelta) -> Iterator[datetime]:
    """Each bucket's start, from ``start`` up to ``end`` (excluded)."""
    at = start
    while at < end:
        yield at
        at += step
