"""Every outbox message carries the namespace it belongs to, set by the server: a client sets no
header at all, and a delivered envelope says the task's namespace (docs/delivery.md)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.db import transaction
from django.utils import timezone

from backplane.delivery import outbox, relay
from backplane.delivery.models import OutboxMessage
from backplane.delivery.sinks import Sinks
from tests.api.conftest import AgentClient, assert_error, create_task
from tests.backplane.delivery.test_outbox import drain


def events_url(task: dict[str, Any]) -> str:
    return f"/api/v1/tasks/{task['task_id']}/events/"


def test_every_row_of_an_agents_message_and_of_the_lifecycle_names_the_tasks_namespace(
    alice: AgentClient, mallory: AgentClient
) -> None:
    for client in (alice, mallory):
        task = create_task(client)
        body = {"type": "TaskCompleted", "payload": {"output": {}},
                "outbox": [{"topic": "leads.scored", "payload": {"score": 7}}]}
        assert client.post(events_url(task), body, format="json").status_code == 201
    rows = OutboxMessage.objects.order_by("id")
    assert {(r.topic, r.headers["namespace"]) for r in rows} == {
        ("backplane.tasks.lead-qualification", "acme"), ("leads.scored", "acme"),
        ("backplane.tasks.lead-qualification", "globex"), ("leads.scored", "globex"),
    }
    assert rows.count() == 6  # per namespace: pending, completed, and the agent's message


@pytest.mark.parametrize("item", [
    {"topic": "leads.scored", "payload": {}, "headers": {"namespace": "globex"}},
    {"topic": "leads.scored", "payload": {}, "namespace": "globex"},
    {"topic": "leads.scored", "payload": {}, "key": "k", "key_scope": "globex"},
])
def test_a_client_cannot_set_or_override_headers_or_the_namespace(
    alice: AgentClient, counts: Callable[[], dict[str, int]], item: dict[str, Any]
) -> None:
    task = create_task(alice)
    before = counts()
    body = {"type": "Noted", "payload": {}, "outbox": [item]}
    error = assert_error(alice.post(events_url(task), body, format="json"), 400, "validation_error")
    (unknown,) = set(item) - {"topic", "payload", "key"}
    assert set(error["details"]) == {f"outbox[0].{unknown}"}, error
    assert counts() == before


def test_the_namespace_header_is_the_servers_word_over_any_header_it_is_given(db: None) -> None:
    now = timezone.now()
    with transaction.atomic():
        (row,) = outbox.outbox_enqueue(topic="leads.scored", key="k", payload={}, headers={"namespace": "globex"},
                                       now=now, namespace="acme")
    assert OutboxMessage.objects.get(pk=row.pk).headers["namespace"] == "acme"


def test_the_delivered_envelope_carries_the_namespace_and_an_alert_carries_none(
    alice: AgentClient, broker_queue: Any
) -> None:
    task = create_task(alice)
    body = {"type": "Noted", "payload": {}, "outbox": [{"topic": "leads.scored", "payload": {"score": 7}}]}
    assert alice.post(events_url(task), body, format="json").status_code == 201
    with transaction.atomic():
        # What recovery/alerts.py writes for a crossing: a rule watches the fleet, no one namespace.
        outbox.outbox_enqueue(topic="backplane.alerts", key="alert:1", payload={"state": "firing"},
                              headers={}, now=timezone.now(), namespace=None)
    sinks = Sinks()
    try:
        relay.outbox_relay_until_idle(publish=sinks, budget_seconds=10)
    finally:
        sinks.close()
    received = {m["topic"]: m["headers"] for m in drain(broker_queue)}
    assert received["leads.scored"]["namespace"] == "acme"
    assert received["backplane.tasks.lead-qualification"]["namespace"] == "acme"
    assert "namespace" in received["backplane.alerts"] and received["backplane.alerts"]["namespace"] is None
