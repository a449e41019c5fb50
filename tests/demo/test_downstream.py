"""The demo's downstream consumer hears every message the product publishes once: its queue is
declared, so the relay's messages are routed and delivered, and a redelivery is recognised."""

from __future__ import annotations

import importlib
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import connection
from kombu import Connection

from backplane.delivery import relay
from backplane.delivery.models import OutboxMessage
from backplane.delivery.sinks import Sinks
from backplane.eventlog.models import Task
from backplane.runtime import launcher
from backplane_client.consumer import ensure_processed_table
from demo.downstream import QUEUE, TABLE, Downstream, downstream_drain_once, downstream_prune, downstream_queue


def processed_ids() -> set[str]:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT message_id::text FROM {TABLE}")
        return {row[0] for row in cursor.fetchall()}


def test_it_hears_each_lifecycle_message_once_even_when_it_comes_again(
        committed_db: None, make_task: Callable[..., Task]) -> None:
    connection.ensure_connection()
    ensure_processed_table(connection.connection, TABLE)
    downstream_prune(older_than=timedelta(0))
    with Connection(settings.BACKPLANE_OUTBOX_BROKER_URL,
                    transport_options=settings.CELERY_BROKER_TRANSPORT_OPTIONS) as broker:
        with broker.SimpleQueue(downstream_queue()) as simple:
            simple.clear()
            make_task()
            message = OutboxMessage.objects.get()
            sinks = Sinks()
            try:
                assert relay.outbox_relay_once(publish=sinks).delivered == 1
                # A redelivery: the relay lost the acknowledgement and sends it again.
                sinks.broker.publish(message, {"message_id": str(message.message_id), "topic": message.topic})
            finally:
                sinks.close()
            assert downstream_drain_once(simple, timeout=2) and downstream_drain_once(simple, timeout=2)
            assert not downstream_drain_once(simple, timeout=0.2)
            # Unbound again: its "#" would route every later test's messages in this process.
            simple.queue.delete()
    assert processed_ids() == {str(message.message_id)}
    assert downstream_prune(older_than=timedelta(0)) == 1 and processed_ids() == set()


def test_the_launcher_declares_the_demo_s_queue_by_its_name() -> None:
    # The launcher may not import the demo: it names the queue itself, so the backplane's own
    # topics have a route to the demo's consumer from the relay's first publish.
    assert launcher.DEMO_QUEUE == QUEUE


def test_the_migration_makes_the_table_the_consumer_writes() -> None:
    made = importlib.import_module("demo.migrations.0002_processed_messages")
    assert made.TABLE == TABLE


def test_on_kafka_it_stops_at_once_instead_of_retrying_a_kombu_queue_forever(settings: Any) -> None:
    settings.BACKPLANE_OUTBOX_BROKER_URL = "kafka://127.0.0.1:9092"
    downstream = Downstream(threading.Event())
    started = time.monotonic()
    downstream.run()  # in this thread: it must return by itself
    assert time.monotonic() - started < 1 and downstream.processed == 0
