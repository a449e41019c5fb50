"""The backplane's own messages (``backplane.*``: lifecycle, alerts, budgets, compensations) go to
the broker only where a route is declared, so a fresh install has no failing messages: nobody
asked for them, and on a topic exchange they would only be unroutable, retried and then dead
letters. An agent's message still goes to the broker, and still fails there when nothing routes
it (it asked for it). Through the real writer and the real relay, against the real filesystem
broker."""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.conf import settings
from kombu import Connection, Exchange, Queue

from backplane.delivery import relay
from backplane.delivery.models import DeadLetter, OutboxMessage, WebhookSubscription
from backplane.delivery.outbox import broker_takes
from backplane.delivery.sinks import KombuSink, Sinks
from backplane.eventlog import services
from backplane.eventlog.models import Task
from backplane.eventlog.writer import EventDraft, OutboxDraft


@pytest.fixture
def fresh_install(settings: Any) -> Any:
    """An install's defaults: no queue of the product's declared, no route for its own topics."""
    settings.BACKPLANE_OUTBOX_QUEUES = []
    settings.BACKPLANE_OUTBOX_BROKER_TOPICS = []
    return settings


@pytest.fixture
def kind() -> str:
    """A kind of its own, so no queue another test bound to a lifecycle topic routes this one's."""
    return f"k{secrets.token_hex(4)}"


@pytest.fixture
def connection() -> Iterator[Connection]:
    conn = Connection(settings.BACKPLANE_OUTBOX_BROKER_URL, transport_options=settings.CELERY_BROKER_TRANSPORT_OPTIONS)
    yield conn
    conn.release()


def completed_with_a_message(make_task: Callable[..., Task], kind: str, topic: str | None = None) -> Task:
    task = make_task(kind=kind)
    outbox = (OutboxDraft(topic=topic, payload={"score": 7}, key="k"),) if topic else ()
    services.event_append(namespace=task.namespace, task_id=task.pk, agent="a",
                          draft=EventDraft(type="TaskCompleted", payload={"output": {}}, outbox=outbox))
    return task


def rows(task: Task) -> list[tuple[str, str]]:
    return sorted(OutboxMessage.objects.filter(task_id=task.pk).values_list("topic", "destination"))


def relay_everything() -> relay.RelayStep:
    sinks = Sinks(broker=KombuSink())
    try:
        return relay.outbox_relay_once(publish=sinks)
    finally:
        sinks.close()


def test_a_fresh_install_writes_no_broker_row_for_the_product_s_topics_and_relays_no_failure(
    fresh_install: Any, make_task: Callable[..., Task], kind: str,
) -> None:
    task = completed_with_a_message(make_task, kind)
    assert rows(task) == []
    OutboxMessage.objects.exclude(task_id=task.pk).delete()  # other tests' rows are not this one's business
    step = relay_everything()
    assert (step.claimed, step.failed) == (0, 0)
    assert not DeadLetter.objects.exists()


def test_an_agent_s_message_still_goes_to_the_broker_and_fails_there_when_nothing_routes_it(
    fresh_install: Any, make_task: Callable[..., Task], kind: str,
) -> None:
    topic = f"crm-{secrets.token_hex(4)}.scored"
    task = completed_with_a_message(make_task, kind, topic)
    assert rows(task) == [(topic, "broker")]
    OutboxMessage.objects.exclude(task_id=task.pk).delete()
    step = relay_everything()
    assert (step.claimed, step.failed) == (1, 1)
    assert OutboxMessage.objects.get(topic=topic).last_error.startswith("unroutable")


def test_a_subscription_gets_the_product_s_messages_without_a_broker_route(
    fresh_install: Any, make_task: Callable[..., Task], kind: str,
) -> None:
    WebhookSubscription.objects.create(name="ops", topic_pattern="backplane.tasks.#", url="https://ops.example/hook",
                                       secret="s")
    task = completed_with_a_message(make_task, kind)
    assert rows(task) == [(f"backplane.tasks.{kind}", "webhook")] * 2  # created, then completed


@pytest.mark.parametrize(("queues", "topics", "routed"), [
    # A queue of the product's whose binding takes the topic declares the route.
    ([("ops-{kind}", "backplane.tasks.{kind}")], [], True),
    ([("ops-{kind}", "backplane.budgets.#")], [], False),
    # Or a pattern for the queues external consumers declare themselves.
    ([], ["backplane.tasks.#"], True),
    ([], ["backplane.#"], True),
    ([], ["backplane.alerts.#"], False),
])
def test_a_declared_route_sends_the_product_s_messages_to_the_broker(
    settings: Any, kind: str, queues: list[tuple[str, str]], topics: list[str], routed: bool,
) -> None:
    settings.BACKPLANE_OUTBOX_QUEUES = [(name.format(kind=kind), binding.format(kind=kind)) for name, binding in queues]
    settings.BACKPLANE_OUTBOX_BROKER_TOPICS = topics
    assert broker_takes(f"backplane.tasks.{kind}") is routed
    assert broker_takes(f"crm.{kind}") is True  # an agent's topic, whatever is declared


def test_a_product_message_with_a_declared_queue_is_delivered_to_it(
    settings: Any, make_task: Callable[..., Task], kind: str, connection: Connection,
) -> None:
    name = f"ops-{kind}"
    settings.BACKPLANE_OUTBOX_QUEUES = [(name, f"backplane.tasks.{kind}")]
    settings.BACKPLANE_OUTBOX_BROKER_TOPICS = []
    task = completed_with_a_message(make_task, kind)
    assert rows(task) == [(f"backplane.tasks.{kind}", "broker")] * 2
    OutboxMessage.objects.exclude(task_id=task.pk).delete()
    # One per relay step: the second waits for the first of its key (per-key order).
    assert [relay_everything().delivered for _ in range(3)] == [1, 1, 0]
    queue = Queue(name, Exchange(settings.BACKPLANE_OUTBOX_EXCHANGE, type="topic", durable=True),
                  routing_key=f"backplane.tasks.{kind}", durable=True)
    with connection.SimpleQueue(queue) as simple:
        received: list[Any] = [simple.get(timeout=2) for _ in range(2)]
        assert [m.payload["payload"]["status"] for m in received] == ["pending", "completed"]
        for message in received:
            message.ack()
        simple.queue.delete()
