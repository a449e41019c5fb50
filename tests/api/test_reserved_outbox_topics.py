"""Outbox topics beginning with ``backplane.`` are the server's: a client's is 400 and writes nothing
(docs/api.md, "Tasks and events"), on the single append and the batch, with whitespace around it or not."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from backplane.delivery.models import OutboxMessage
from tests.api.conftest import AgentClient, assert_error, create_task

# Every spelling a broker or a subscription pattern would take for the backplane's own: any case,
# whitespace around it (trimmed on the way in), and the bare first word, which `backplane.#` matches.
RESERVED = ["backplane.alerts", "backplane.tasks.lead-qualification", "BACKPLANE.alerts", "BackPlane.budgets",
            " backplane.alerts", "backplane.alerts\t", "backplane", "Backplane.", "backplane.compensations.refund"]


def events_url(task: dict[str, Any]) -> str:
    return f"/api/v1/tasks/{task['task_id']}/events/"


def message(topic: str) -> dict[str, Any]:
    return {"topic": topic, "key": "alert:1", "payload": {"state": "resolved"}}


@pytest.mark.parametrize("topic", RESERVED)
def test_it_refuses_a_reserved_topic_on_an_append_and_writes_nothing(
    alice: AgentClient, counts: Callable[[], dict[str, int]], topic: str
) -> None:
    task = create_task(alice)
    before = counts()
    body = {"type": "Noted", "payload": {}, "outbox": [message("leads.scored"), message(topic)]}
    error = assert_error(alice.post(events_url(task), body, format="json"), 400, "validation_error")
    assert set(error["details"]) == {"outbox[1].topic"}, error
    assert counts() == before


@pytest.mark.parametrize("topic", RESERVED)
def test_it_refuses_a_reserved_topic_anywhere_in_a_batch_and_writes_nothing(
    alice: AgentClient, counts: Callable[[], dict[str, int]], topic: str
) -> None:
    task = create_task(alice)
    before = counts()
    body = {"events": [{"type": "Noted", "payload": {}, "outbox": [message("leads.scored")]},
                       {"type": "Noted", "payload": {}, "outbox": [message("leads.lost"), message(topic)]}]}
    error = assert_error(alice.post(f"{events_url(task)}batch/", body, format="json"), 400, "validation_error")
    assert set(error["details"]) == {"events[1].outbox[1].topic"}, error
    assert counts() == before


def test_the_refusal_holds_with_whitespace_around_the_topic(
    alice: AgentClient, counts: Callable[[], dict[str, int]]
) -> None:
    """The body's declaration trims the topic (api/bodies.py) and the service's rule looks past
    whitespace too: both spellings are refused, alone and in a batch."""
    task = create_task(alice)
    fast = {"type": "Noted", "payload": {}, "outbox": [message("backplane.alerts")]}
    slow = {"type": "Noted", "payload": {}, "outbox": [message(" backplane.alerts ")]}
    before = counts()
    for body in (fast, slow):
        error = assert_error(alice.post(events_url(task), body, format="json"), 400, "validation_error")
        assert set(error["details"]) == {"outbox[0].topic"}, error
    for body in (fast, slow):
        batch = {"events": [body, {"type": "Noted", "payload": {}}]}
        error = assert_error(alice.post(f"{events_url(task)}batch/", batch, format="json"), 400, "validation_error")
        assert set(error["details"]) == {"events[0].outbox[0].topic"}, error
    assert counts() == before


@pytest.mark.parametrize("topic", ["backplanes.alerts", "my.backplane.alerts", "back-plane.alerts", "alerts.backplane"])
def test_it_takes_topics_that_only_look_like_the_backplanes(alice: AgentClient, topic: str) -> None:
    task = create_task(alice)
    body = {"type": "Noted", "payload": {}, "outbox": [message(topic)]}
    assert alice.post(events_url(task), body, format="json").status_code == 201
    assert OutboxMessage.objects.filter(topic=topic).exists()


def test_the_backplanes_own_messages_still_go_out_on_its_topics(alice: AgentClient) -> None:
    task = create_task(alice)
    done = {"type": "TaskCompleted", "payload": {"output": {"score": 7}}}
    assert alice.post(events_url(task), done, format="json").status_code == 201
    statuses = [m.payload["status"] for m in OutboxMessage.objects.filter(topic="backplane.tasks.lead-qualification",
                                                                          subscription=None).order_by("id")]
    assert statuses == ["pending", "completed"]
