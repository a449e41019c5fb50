"""The demo's downstream consumer: the outside world's reader of what the product publishes.

A topic exchange keeps a message only for the queues bound to it when it is published, and the
relay does not mark a message delivered that no queue is bound for (docs/delivery.md). So a
deployment declares its consumers' queues; the demo's is ``demo-downstream``, bound to every
topic, declared when the demo starts. Each message is processed once with the client's consumer
helper (``backplane_client.consumer``: the message id recorded in the consumer's own transaction,
the acknowledgement after the commit), so a redelivery is recognised and counted, not repeated.
"""

from __future__ import annotations

import logging
import threading
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import connection
from kombu import Connection, Exchange, Queue

from backplane.delivery.outbox import broker_is_kafka
from backplane_client.consumer import handle_kombu_message

logger = logging.getLogger(__name__)

QUEUE = "demo-downstream"
TABLE = "demo_processed_messages"


def downstream_queue() -> Queue:
    exchange = Exchange(settings.BACKPLANE_OUTBOX_EXCHANGE, type="topic", durable=True)
    return Queue(QUEUE, exchange, routing_key="#", durable=True)


def downstream_drain_once(simple: Any, *, timeout: float = 1.0) -> bool:
    """Take one message, process it once and acknowledge it; whether there was one."""
    try:
        message = simple.get(timeout=timeout)
    except simple.Empty:
        return False
    connection.ensure_connection()
    # The handler has nothing to do beyond the record of the id: the demo's outside world only
    # needs to have heard each message once.
    handle_kombu_message(connection.connection, message.payload, message, lambda conn, envelope: None, table=TABLE)
    return True


def downstream_prune(*, older_than: timedelta) -> int:
    """Forget ids older than the broker could still redeliver, so the table does not grow for ever."""
    with connection.cursor() as cursor:
        cursor.execute(f"DELETE FROM {TABLE} WHERE processed_at < now() - make_interval(secs => %s)",
                       [older_than.total_seconds()])
        return cursor.rowcount


class Downstream(threading.Thread):
    """Drains ``demo-downstream`` until ``stop`` is set; a broker that fails is tried again."""

    def __init__(self, stop: threading.Event) -> None:
        super().__init__(name="demo-downstream", daemon=True)
        self.stop = stop
        self.processed = 0

    def run(self) -> None:
        if broker_is_kafka():
            # Its consumer is a kombu queue's; on Kafka the lifecycle messages wait in their topic.
            logger.info("demo downstream: the outbox goes to Kafka, which the demo's consumer does not read; "
                        "it is off")
            return
        # Its table is made by the demo's migration 0002: the application's role may not create one.
        while not self.stop.is_set():
            try:
                with Connection(settings.BACKPLANE_OUTBOX_BROKER_URL,
                                transport_options=settings.CELERY_BROKER_TRANSPORT_OPTIONS) as broker:
                    with broker.SimpleQueue(downstream_queue()) as simple:
                        while not self.stop.is_set():
                            self.processed += downstream_drain_once(simple)
            except Exception as exc:  # noqa: BLE001 (a broker or database hiccup: say so and go on)
                logger.warning("demo downstream: %s; trying again in 5 s", exc)
                self.stop.wait(5)
        connection.close()
