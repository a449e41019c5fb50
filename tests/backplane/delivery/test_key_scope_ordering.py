"""Per-key order is kept within a namespace, and the backplane's own messages have a scope of their
own: an agent's dead letter under a key such as ``alert:1``, or under another namespace's task id,
holds its own namespace's later messages of that key and nobody else's (docs/delivery.md)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.db import transaction
from django.utils import timezone

from backplane.delivery import outbox, relay
from backplane.delivery import selectors as delivery_selectors
from backplane.delivery.models import DeadLetter, OutboxMessage
from backplane.delivery.sinks import KombuSink, Sinks
from backplane.eventlog import services
from backplane.eventlog.models import Task
from backplane.eventlog.writer import EventDraft, OutboxDraft
from tests.backplane.delivery.test_outbox import UNREACHABLE_BROKER, drain


def append(task: Task, messages: list[tuple[str, str]], *, n: int, event_type: str = "Noted",
           payload: dict[str, Any] | None = None) -> None:
    """One event of ``task``'s agent with a message per (topic, key), each carrying ``n``."""
    services.event_append(namespace=task.namespace, task_id=task.pk, agent="agent", draft=EventDraft(
        type=event_type, payload=payload or {},
        outbox=tuple(OutboxDraft(topic=topic, payload={"n": n}, key=key) for topic, key in messages)))


def test_an_agents_dead_letter_holds_only_its_own_namespaces_later_messages_of_its_key(
    make_task: Callable[..., Task], settings: Any, broker_queue: Any
) -> None:
    settings.BACKPLANE_OUTBOX_MAX_ATTEMPTS = 1
    task_a, task_b = make_task(namespace="acc-a"), make_task(namespace="acc-b")
    OutboxMessage.objects.all().delete()  # their "pending" announcements, delivered long ago
    alert_key, task_key = "alert:1", str(task_a.pk)

    # 1. acc-b's agent writes under the key of an alert rule and under acc-a's task id; both
    #    messages die at the broker and, strictly ordered, hold their keys.
    append(task_b, [("acc.alerts", alert_key), ("acc.tasks", task_key)], n=1)
    assert relay.outbox_relay_once(publish=Sinks(broker=KombuSink(url=UNREACHABLE_BROKER))).dead == 2
    assert set(OutboxMessage.objects.values_list("status", "holds_key")) == {("dead", True)}

    # 2. Later messages under the same keys: the alert (recovery/alerts.py writes it so), acc-a's
    #    own, acc-a's task completing (its lifecycle message), and acc-b's own again.
    with transaction.atomic():
        outbox.outbox_enqueue(topic="backplane.alerts", key=alert_key, payload={"n": 2}, headers={},
                              now=timezone.now())
    append(task_a, [("acc.alerts", alert_key), ("acc.tasks", task_key)], n=2, event_type="TaskCompleted",
           payload={"output": {}})
    append(task_b, [("acc.alerts", alert_key), ("acc.tasks", task_key)], n=3)

    relay.outbox_relay_until_idle(publish=Sinks(), budget_seconds=10)

    received = {(m["topic"], m["key"], m["headers"]["namespace"]) for m in drain(broker_queue)}
    assert received == {
        ("backplane.alerts", alert_key, None),
        ("acc.alerts", alert_key, "acc-a"),
        ("acc.tasks", task_key, "acc-a"),
        ("backplane.tasks.lead-qualification", task_key, "acc-a"),
    }
    held = OutboxMessage.objects.filter(status="pending").order_by("id")
    assert [(m.topic, m.key, m.payload["n"]) for m in held] == [("acc.alerts", alert_key, 3),
                                                                 ("acc.tasks", task_key, 3)]
    for letter in DeadLetter.objects.all():
        assert delivery_selectors.dead_letter_waiting_behind(letter.pk) == 1  # acc-b's own, nobody else's
