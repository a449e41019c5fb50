"""A long-running outbox relay that wakes on PostgreSQL NOTIFY, for low latency.

The same delivery lanes as the worker (backplane/delivery/lanes.py): this loop only looks for
destinations with due messages (on every NOTIFY, and at least every ``--poll-seconds`` for
retries whose backoff ran out) and starts their jobs; the lanes deliver in threads of their own.

It survives the database going away (a restart, a failover): the error is logged, the
connections are dropped and the loop tries again after a pause, without exiting. SIGTERM or
SIGINT: deliveries under way finish, untried rows are given back, exit 0.
"""

from __future__ import annotations

import logging
import signal
import time
from types import FrameType
from typing import Any

import psycopg
from django.conf import settings
from django.core.management.base import BaseCommand, CommandParser
from django.db import DatabaseError, InterfaceError, OperationalError, connection

from backplane.delivery.lanes import LaneRunner

logger = logging.getLogger("backplane.relay")

CHANNEL = "backplane_outbox"


class Command(BaseCommand):
    help = "Relay outbox messages continuously, woken by NOTIFY (the beat task does the same once a second)."
    # Delivery must not stop because an unrelated module (the URL conf the checks import) is broken.
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--batch-size", type=int, default=settings.BACKPLANE_OUTBOX_BATCH_SIZE)
        parser.add_argument("--threads", type=int, default=settings.BACKPLANE_OUTBOX_RELAY_THREADS,
                            help="delivery threads for all destinations together")
        parser.add_argument("--poll-seconds", type=float, default=1.0,
                            help="wake at least this often, for retries whose backoff has run out")

    def handle(self, *args: Any, **options: Any) -> None:
        self.stopping = False
        signal.signal(signal.SIGTERM, self._stop)
        signal.signal(signal.SIGINT, self._stop)
        lanes = LaneRunner(threads=max(2, options["threads"]), batch_size=options["batch_size"])
        listener: psycopg.Connection[Any] | None = None
        logger.info("relay started")
        try:
            while not self.stopping:
                try:
                    if listener is None or listener.closed:
                        listener = self._listen()
                    lanes.tick()
                    self._wait(listener, options["poll_seconds"])
                except (OperationalError, InterfaceError, DatabaseError, psycopg.Error) as exc:
                    logger.warning("database unavailable (%s); retrying in 1 s", exc.__class__.__name__)
                    connection.close()
                    if listener is not None:
                        listener.close()
                    listener = None
                    time.sleep(1)
        finally:
            lanes.stop()
            if listener is not None:
                listener.close()
            logger.info("relay stopped")

    def _listen(self) -> psycopg.Connection[Any]:
        conninfo = connection.get_connection_params()
        conninfo.pop("cursor_factory", None)
        conninfo.pop("context", None)
        listener = psycopg.connect(**conninfo, autocommit=True)
        listener.execute(f"LISTEN {CHANNEL}")
        return listener

    def _wait(self, listener: psycopg.Connection[Any], seconds: float) -> None:
        """Sleep until a NOTIFY arrives or ``seconds`` pass, whichever is first."""
        for _ in listener.notifies(timeout=seconds, stop_after=1):
            pass

    def _stop(self, signum: int, frame: FrameType | None) -> None:
        self.stopping = True
