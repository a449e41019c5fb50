"""Waiting on a condition instead of sleeping a fixed time: done as soon as it holds, and a
failure that names what never happened."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(condition: Callable[[], T | None], *, timeout: float, what: str, interval: float = 0.1,
               details: Callable[[], str] | None = None) -> T:
    """Poll until ``condition()`` is truthy and return it (so a condition answering ``X | None``
    gives an ``X``); fail naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        result = condition()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:.0f} s: {what}\n" + (details() if details else ""))
        time.sleep(interval)
