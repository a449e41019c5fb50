"""A long-running outbox relay that looks for due messages every ``--poll-seconds``, for latency
lower than the beat task's once a second.

The same delivery lanes as the worker (backplane/delivery/lanes.py): this loop only looks for
destinations with due messages and starts their jobs; the lanes deliver in threads of their own.
It polls rather than LISTENs: a NOTIFY in the writing transaction would make every commit that
writes an outbox row wait on PostgreSQL's one notification lock (migration 0028), while a poll
is two indexed reads ten times a second that no writer waits for.

In the CDC mode (``BACKPLANE_OUTBOX_RELAY_MODE=cdc``) Debezium publishes the broker's messages and
the lanes mark what they read back from Kafka (backplane/delivery/cdc.py); webhooks are delivered
here in both modes.

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

from django.conf import settings
from django.core.management.base import BaseCommand, CommandParser
from django.db import DatabaseError, InterfaceError, OperationalError, connection

from backplane.delivery.lanes import LaneRunner

logger = logging.getLogger("backplane.relay")


class Command(BaseCommand):
    help = "Relay outbox messages continuously, polling for due ones (the beat task does the same once a second)."
    # Delivery must not stop because an unrelated module (the URL conf the checks import) is broken.
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--batch-size", type=int, default=settings.BACKPLANE_OUTBOX_BATCH_SIZE)
        parser.add_argument("--threads", type=int, default=settings.BACKPLANE_OUTBOX_RELAY_THREADS,
                            help="delivery threads for all destinations together")
        parser.add_argument("--poll-seconds", type=float, default=0.1,
                            help="how often to look for due messages (new ones, and retries whose backoff ran out)")

    def handle(self, *args: Any, **options: Any) -> None:
        self.stopping = False
        signal.signal(signal.SIGTERM, self._stop)
        signal.signal(signal.SIGINT, self._stop)
        lanes = LaneRunner(threads=max(2, options["threads"]), batch_size=options["batch_size"])
        logger.info("relay started")
        try:
            while not self.stopping:
                try:
                    lanes.tick()
                    time.sleep(options["poll_seconds"])
                except (OperationalError, InterfaceError, DatabaseError) as exc:
                    logger.warning("database unavailable (%s); retrying in 1 s", exc.__class__.__name__)
                    connection.close()
                    time.sleep(1)
        finally:
            lanes.stop()
            logger.info("relay stopped")

    def _stop(self, signum: int, frame: FrameType | None) -> None:
        self.stopping = True
