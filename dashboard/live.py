"""Live notices: after an event write commits, a small notice goes to the channel layer.

The event log tells ``notice_after_commit`` of every write (a writer observer, registered in
``DashboardConfig.ready``). It answers the notice to send once the write commits, so a
rolled-back write announces nothing and nothing slow happens under the task's row lock.

After commit the notice is handed to one publisher per process, which coalesces what arrived
in the last ``FLUSH_SECONDS`` (the latest seq per task) into one ``group_send`` to the
``fleet`` group. Pages treat a notice as a hint and fetch what they missed by ``seq`` or
``position``, so coalescing loses nothing a page would show.

Where the publisher runs: ``channels_postgres`` keeps one connection pool per process, bound
to the event loop that first used it. In a web process that is the ASGI server's loop (the
consumers use it), so the publisher runs there (``bind_event_loop``, called by
``backplane.asgi``); in any other process (Celery, management commands) it gets a loop of
its own in a daemon thread.

Failures are not silent: a ``group_send`` that fails is logged, counted, and retried with
backoff with the notices merged back in; the notices that follow it say ``resync`` so
open pages refetch everything they show.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
from collections.abc import Callable
from typing import Any

from channels.layers import get_channel_layer
from django.conf import settings

from backplane.eventlog.writer import WrittenEvents

logger = logging.getLogger("dashboard.live")

FLEET_GROUP = "fleet"
NOTICE_TYPE = "fleet.notice"
# Notices that arrive within this window go out as one message.
FLUSH_SECONDS = 0.1
# More distinct tasks than this in one window: send "resync" instead of the list.
MAX_TASKS_PER_NOTICE = 200
RETRY_SECONDS = (0.2, 0.5, 1.0, 2.0, 5.0)


def task_notice(written: WrittenEvents) -> dict[str, Any]:
    task, last = written.task, written.events[-1]
    return {
        "task_id": str(task.pk),
        "seq": task.last_seq,
        "position": last.position,
        "type": last.type,
        "status": task.status,
        "namespace": task.namespace,
        "parent_id": str(task.parent_id) if task.parent_id else None,
    }


def notice_after_commit(written: WrittenEvents) -> Callable[[], None] | None:
    """Writer observer: the write's notice, announced once (and only if) it commits."""
    if not written.events or not settings.BACKPLANE_LIVE_NOTICES:
        return None
    return functools.partial(publisher.publish, task_notice(written))


class NoticePublisher:
    """Coalesces notices per task and sends them to the fleet group from one event loop."""

    def __init__(self, send: Callable[[dict[str, Any]], Any] | None = None) -> None:
        self._lock = threading.Lock()
        self._pending: dict[str, dict[str, Any]] = {}
        self._dead_letters = 0
        self._resync = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._started = False
        self._own_loop = False
        self._task: asyncio.Task[None] | None = None
        self._send = send
        self.sent = 0
        self.failures = 0

    # --- which loop -------------------------------------------------------------------------

    def bind_event_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        """Run on ``loop`` (the ASGI server's), unless already running somewhere."""
        with self._lock:
            if self._started:
                return
            self._loop = loop
            self._start_locked()

    def _ensure_started(self) -> None:
        with self._lock:
            if self._started:
                return
            self._loop = asyncio.new_event_loop()
            self._own_loop = True
            threading.Thread(target=self._loop.run_forever, name="live-notices", daemon=True).start()
            self._start_locked()

    def _start_locked(self) -> None:
        assert self._loop is not None
        self._started = True
        loop = self._loop

        def start() -> None:
            self._wake = asyncio.Event()
            self._task = loop.create_task(self._flush_forever())

        loop.call_soon_threadsafe(start)

    def close(self) -> None:
        """Stop sending (and the thread, if the publisher has its own loop)."""
        loop = self._loop
        if loop is None or loop.is_closed():
            return

        def stop() -> None:
            if self._task is not None:
                self._task.cancel()
            if self._own_loop:
                loop.call_soon(loop.stop)

        loop.call_soon_threadsafe(stop)

    # --- from any thread --------------------------------------------------------------------

    def publish(self, notice: dict[str, Any]) -> None:
        with self._lock:
            known = self._pending.get(notice["task_id"])
            if known is None or known["seq"] < notice["seq"]:
                self._pending[notice["task_id"]] = notice
        self._ensure_started()
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self._wake_up)

    def publish_dead_letters(self, count: int) -> None:
        """New dead letters were committed (they write no event when they come from the outbox)."""
        with self._lock:
            self._dead_letters += count
        self._ensure_started()
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self._wake_up)

    def _wake_up(self) -> None:
        if self._wake is not None:
            self._wake.set()

    def _take(self) -> tuple[list[dict[str, Any]], int, bool]:
        with self._lock:
            pending, dead_letters, resync = list(self._pending.values()), self._dead_letters, self._resync
            self._pending, self._dead_letters, self._resync = {}, 0, False
        if len(pending) > MAX_TASKS_PER_NOTICE:
            return pending[-MAX_TASKS_PER_NOTICE:], dead_letters, True
        return pending, dead_letters, resync

    def _give_back(self, notices: list[dict[str, Any]], dead_letters: int) -> None:
        with self._lock:
            self._dead_letters += dead_letters
            for notice in notices:
                known = self._pending.get(notice["task_id"])
                if known is None or known["seq"] < notice["seq"]:
                    self._pending[notice["task_id"]] = notice
            self._resync = True

    # --- on the loop ------------------------------------------------------------------------

    async def _flush_forever(self) -> None:
        assert self._wake is not None
        failures_in_a_row = 0
        while True:
            await self._wake.wait()
            self._wake.clear()
            await asyncio.sleep(FLUSH_SECONDS)
            notices, dead_letters, resync = self._take()
            if not notices and not dead_letters and not resync:
                continue
            try:
                await self._group_send(
                    {"type": NOTICE_TYPE, "tasks": notices, "dead_letters": dead_letters, "resync": resync}
                )
            except Exception:  # noqa: BLE001 - any failure of the layer: log, count, retry
                self.failures += 1
                delay = RETRY_SECONDS[min(failures_in_a_row, len(RETRY_SECONDS) - 1)]
                failures_in_a_row += 1
                logger.exception("live notice not sent (%d tasks); retrying in %.1f s", len(notices), delay)
                self._give_back(notices, dead_letters)
                await asyncio.sleep(delay)
                self._wake.set()
                continue
            failures_in_a_row = 0
            self.sent += 1

    async def _group_send(self, message: dict[str, Any]) -> None:
        if self._send is not None:
            await self._send(message)
            return
        layer = get_channel_layer()
        if layer is None:
            raise RuntimeError("no channel layer is configured (CHANNEL_LAYERS)")
        await layer.group_send(FLEET_GROUP, message)


publisher = NoticePublisher()


def bind_event_loop(loop: asyncio.AbstractEventLoop) -> None:
    publisher.bind_event_loop(loop)


def dead_letters_after_commit(count: int) -> None:
    """Delivery's dead-letter listener (registered in ``DashboardConfig.ready``); runs after commit."""
    if settings.BACKPLANE_LIVE_NOTICES:
        publisher.publish_dead_letters(count)
