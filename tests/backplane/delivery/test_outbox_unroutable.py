"""A broker message that no queue is bound for is not delivered: the topic exchange would accept
it and drop it, so the broker sink asks the broker's binding table first, fails the attempt as
unroutable, and the relay backs it off, then dead-letters it, like any failed attempt. Against
the real filesystem broker, whose bindings live on disk and are shared by every process."""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.conf import settings
from django.utils import timezone
from kombu import Connection, Exchange, Queue

from backplane.delivery import relay
from backplane.delivery.models import DeadLetter, OutboxMessage
from backplane.delivery.sinks import KombuSink, Sinks
from backplane.eventlog import services
from backplane.eventlog.models import Task
from backplane.eventlog.writer import EventDraft, OutboxDraft


@pytest.fixture
def topic() -> str:
    """A topic of its own: no queue another test bound (``#`` included) may route it."""
    return f"unroutable-{secrets.token_hex(4)}.scored"


@pytest.fixture
def connection() -> Iterator[Connection]:
    conn = Connection(settings.BACKPLANE_OUTBOX_BROKER_URL, transport_options=settings.CELERY_BROKER_TRANSPORT_OPTIONS)
    yield conn
    conn.release()


def bind(connection: Connection, topic: str) -> Queue:
    queue = Queue(f"late-consumer-{secrets.token_hex(4)}", Exchange(settings.BACKPLANE_OUTBOX_EXCHANGE, type="topic",
                                                                    durable=True), routing_key=topic, durable=True)
    queue(connection.default_channel).declare()
    return queue


def enqueue(task: Task, topic: str) -> OutboxMessage:
    services.event_append(namespace=task.namespace, task_id=task.pk, agent="a",
                          draft=EventDraft(type="Noted", payload={},
                                           outbox=(OutboxDraft(topic=topic, payload={"score": 7}, key="k"),)))
    return OutboxMessage.objects.get(topic=topic)


def other_topics_out_of_the_way(topic: str) -> None:
    """The lifecycle messages of the append go elsewhere; only ``topic`` is under test."""
    OutboxMessage.objects.exclude(topic=topic).delete()


def test_a_message_no_queue_is_bound_for_waits_and_goes_out_once_a_queue_is_bound(
    make_task: Callable[..., Task], topic: str, connection: Connection,
) -> None:
    message = enqueue(make_task(), topic)
    other_topics_out_of_the_way(topic)
    sinks = Sinks(broker=KombuSink())
    try:
        step = relay.outbox_relay_once(publish=sinks)
        assert (step.claimed, step.delivered, step.failed) == (1, 0, 1)
        message.refresh_from_db()
        assert message.status == "pending" and message.delivered_at is None and message.attempts == 1
        assert message.last_error.startswith("unroutable: no queue is bound") and topic in message.last_error
        assert message.next_attempt_at is not None and message.next_attempt_at > timezone.now()

        queue = bind(connection, topic)
        OutboxMessage.objects.update(next_attempt_at=timezone.now())
        assert relay.outbox_relay_once(publish=sinks).delivered == 1
    finally:
        sinks.close()
    with connection.SimpleQueue(queue) as simple:
        received: Any = simple.get(timeout=2)
        assert received.payload["message_id"] == str(message.message_id)
        received.ack()
        simple.queue.delete()
    message.refresh_from_db()
    assert message.status == "delivered"


def test_a_message_that_stays_unroutable_becomes_a_dead_letter_that_says_so(
    make_task: Callable[..., Task], topic: str, settings: Any,
) -> None:
    settings.BACKPLANE_OUTBOX_MAX_ATTEMPTS = 2
    message = enqueue(make_task(), topic)
    other_topics_out_of_the_way(topic)
    sinks = Sinks(broker=KombuSink())
    try:
        for _ in range(2):
            OutboxMessage.objects.update(next_attempt_at=timezone.now())
            relay.outbox_relay_once(publish=sinks)
    finally:
        sinks.close()
    message.refresh_from_db()
    (dead_letter,) = DeadLetter.objects.all()
    assert message.status == "dead" and message.delivered_at is None
    assert dead_letter.outbox_message_id == message.pk and dead_letter.error.startswith("unroutable:")
