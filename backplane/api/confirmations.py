"""An agent's token and its rate-limit count, confirmed with the database at most once per
``BACKPLANE_AUTH_CONFIRM_SECONDS`` in each process, and its requests counted here in between.

A lean request begins with one statement: find the agent by its token's hash and count the
request into the agent's counter row (``authentication.agent_authenticate_counting``). That
statement was 45 % of a task read's samples in process; over HTTP, confirming once per 0.25 s
served 8 % more single appends and 31 % more task reads a second (docs/benchmarks.md, "Confirmed
agents"). It also wrote the same counter row for every request of an agent, so an agent's
concurrent requests queued on that row's lock. Now, within one interval of a confirmation, a
request with the same token in the same process is served from it, and what holds is:

- **Revocation**: a deactivated agent, a deleted one or a replaced token stops working in every
  process within one interval (0.25 s by default): the next confirmation finds no row.
- **The agent's fields** (kinds, namespace) are as fresh as the last confirmation too.
- **The rate limit**: this process counts exactly (the shared count at its last confirmation,
  or a higher one its DRF views' throttle got since, plus what it counted itself). What other
  processes counted since their own last confirmation it does not see: with P web processes,
  an agent can pass its limit by at most what the P - 1 others served it in one interval (two
  processes in tests/backplane/test_shared_rate_limit.py).
  A request that would pass the limit here confirms first, so a 429 is always decided on the
  shared count. Requests counted here reach the shared counter with the next confirmation in
  the same window; those of a window that ended before it are dropped with the window, which
  no longer limits anything.

With an interval of 0 (the tests' default) every request confirms, as before this module. With
Redis as the shared cache (``REDIS_URL``) the lean routes authenticate and count every request
as DRF does (``lean._authenticate_and_count``), and this module is not used.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field
from typing import Any

# More tokens than this confirmed: the expired confirmations are dropped (a bound on memory).
MAX_CONFIRMED = 10_000


@dataclass
class Confirmation:
    row: tuple[Any, ...]  # the agent's columns, as the confirming statement returned them
    window_end: int  # the rate limit's window these counts belong to (epoch seconds)
    shared_count: int  # the highest value of the agent's counter a statement of this process returned
    confirmed_at: float  # time.monotonic() of the confirmation; -inf before the first one
    counted_here: int = 0  # requests counted here since, not handed to a confirming statement
    # Requests handed to confirming statements still running: in the shared counter, or about to
    # be, but not in ``shared_count`` yet. Counted as well, so this process never counts fewer
    # requests than it served.
    in_flight: int = 0
    # One confirming statement at a time per token in a process: each starts from the count the
    # one before it left, so what this process counts is exact (a test runs 8 threads against it).
    confirming: threading.Lock = field(default_factory=threading.Lock)

    @property
    def count(self) -> int:
        return self.shared_count + self.counted_here + self.in_flight


class Confirmations:
    """The confirmations of one process, by token hash; every method is safe across threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_token: dict[str, Confirmation] = {}

    def count_if_fresh(
        self, token_hash: str, *, window_end: int, interval: float, now: float
    ) -> tuple[tuple[Any, ...], int] | None:
        """Count one request under a confirmation younger than ``interval`` in the same window:
        the agent's row and this process's count so far; None (nothing counted) without one."""
        with self._lock:
            found = self._by_token.get(token_hash)
            if found is None or found.window_end != window_end or now - found.confirmed_at >= interval:
                return None
            found.counted_here += 1
            return found.row, found.count

    def confirming(self, token_hash: str, *, window_end: int) -> threading.Lock:
        """The lock a thread holds while it confirms ``token_hash`` (``hand_over`` to ``confirm``)."""
        with self._lock:
            return self._entry(token_hash, window_end).confirming

    def hand_over(self, token_hash: str, *, window_end: int, own: int) -> int:
        """What a confirming statement adds to the shared counter: ``own`` (1 for a request not
        counted here yet) and the requests counted here in ``window_end``'s window since the
        last confirmation, which stay in flight until ``confirm`` or ``settle``."""
        with self._lock:
            found = self._entry(token_hash, window_end)
            handed = own + found.counted_here
            found.counted_here = 0
            found.in_flight += handed
            return handed

    def confirm(self, token_hash: str, *, row: tuple[Any, ...], window_end: int, shared_count: int, handed: int,
                now: float) -> None:
        """A confirming statement found the agent and left its counter at ``shared_count``,
        ``handed`` (from ``hand_over``) included."""
        with self._lock:
            found = self._by_token.get(token_hash)
            if found is None or found.window_end != window_end:
                return  # forgotten, or the window moved on, while the statement ran
            found.row = row
            found.in_flight = max(found.in_flight - handed, 0)
            # A count noted meanwhile (note_shared_count) may be higher: the counter only grows.
            found.shared_count = max(found.shared_count, shared_count)
            found.confirmed_at = now

    def note_shared_count(self, token_hash: str, *, window_end: int, shared_count: int) -> None:
        """Another path of this process (DRF's throttle) counted a request of this token into the
        shared counter and got ``shared_count``. It may already include requests that are also
        in flight here, which only makes this process count more than it served, never fewer."""
        with self._lock:
            found = self._by_token.get(token_hash)
            if found is not None and found.window_end == window_end:
                found.shared_count = max(found.shared_count, shared_count)

    def settle(self, token_hash: str, *, window_end: int, handed: int) -> None:
        """A confirming statement failed: what it took over is no longer in flight (the
        transaction rolled back, so the shared counter does not have it either)."""
        with self._lock:
            found = self._by_token.get(token_hash)
            if found is not None and found.window_end == window_end:
                found.in_flight = max(found.in_flight - handed, 0)

    def forget(self, token_hash: str) -> None:
        """The token no longer authenticates: nothing is served from it any more."""
        with self._lock:
            self._by_token.pop(token_hash, None)

    def clear(self) -> None:
        with self._lock:
            self._by_token.clear()

    def _entry(self, token_hash: str, window_end: int) -> Confirmation:
        """The token's confirmation in ``window_end``'s window, unconfirmed if new (the lock held)."""
        found = self._by_token.get(token_hash)
        if found is not None and found.window_end == window_end:
            return found
        if found is None and len(self._by_token) >= MAX_CONFIRMED:
            self._drop_idle()
        # A request of an earlier window counted here is dropped with its window.
        found = self._by_token[token_hash] = Confirmation(row=(), window_end=window_end, shared_count=0,
                                                          confirmed_at=-math.inf)
        return found

    def _drop_idle(self) -> None:
        """Make room: drop the confirmations no thread is confirming, oldest first, half of them."""
        idle = sorted((found.confirmed_at, key) for key, found in self._by_token.items()
                      if not found.in_flight and not found.confirming.locked())
        for _, key in idle[: max(len(self._by_token) // 2, 1)]:
            del self._by_token[key]


confirmations = Confirmations()
