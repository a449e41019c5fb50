"""Sagas: a task that fails for good has its succeeded calls compensated, last step first."""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone

from backplane.delivery.models import DeadLetter, OutboxMessage
from backplane.eventlog.models import Agent, Event, Task
from recovery import dead_letters, detector, leases
from recovery.models import ToolCall
from tests.api.conftest import assert_error, claim, create_task


def succeed_three_steps(client, task_id: str, lease_epoch: int | None = None) -> None:  # type: ignore[no-untyped-def]
    for step, tool in ((1, "reserve-room"), (2, "charge-card"), (3, "send-email")):
        body = {"step": step, "tool": tool, "input": {"step": step}, "lease_epoch": lease_epoch,
                "compensation": {"tool": f"undo-{tool}", "input": {"undo": step}}}
        key = client.post(f"/api/v1/tasks/{task_id}/tool-calls/", {k: v for k, v in body.items() if v is not None},
                          format="json").json()["idempotency_key"]
        answer: dict[str, object] = {"status": "succeeded", "result": {"ok": step}}
        if lease_epoch is not None:
            answer["lease_epoch"] = lease_epoch
        assert client.post(f"/api/v1/tool-calls/{key}/result/", answer, format="json").status_code == 201


def requested(task_id: str) -> list[Event]:
    return list(Event.objects.filter(task_id=task_id, type="CompensationRequested").order_by("seq"))


def test_three_steps_are_compensated_in_reverse_order(alice) -> None:  # type: ignore[no-untyped-def]
    task = create_task(alice)
    lease = claim(alice)
    succeed_three_steps(alice, task["task_id"], lease["lease_epoch"])
    alice.post(f"/api/v1/tasks/{task['task_id']}/events/", {
        "type": "TaskFailed", "payload": {"error": "card declined later", "retryable": False},
        "lease_epoch": lease["lease_epoch"]}, format="json")
    assert Task.objects.get(pk=task["task_id"]).status == "compensating"
    # Its work has ended: no client event is taken while the saga runs, with or without an epoch.
    last_seq = Task.objects.get(pk=task["task_id"]).last_seq
    assert_error(alice.post(f"/api/v1/tasks/{task['task_id']}/events/", {"type": "Noted", "payload": {}},
                            format="json"), 409, "task_closed")
    assert Task.objects.get(pk=task["task_id"]).last_seq == last_seq

    order = []
    for _ in range(3):
        latest = requested(task["task_id"])[-1].payload
        order.append(latest["step"])
        message = OutboxMessage.objects.get(topic=f"backplane.compensations.{latest['tool']}")
        assert message.payload["compensation_key"] == latest["compensation_key"]
        response = alice.post(f"/api/v1/tool-calls/{latest['compensation_key']}/result/",
                              {"status": "succeeded", "result": {"undone": latest["step"]}}, format="json")
        assert response.status_code == 201, response.content
    assert order == [3, 2, 1]
    assert [e.payload["tool"] for e in requested(task["task_id"])] == [
        "undo-send-email", "undo-charge-card", "undo-reserve-room"]
    assert Event.objects.filter(task_id=task["task_id"], type="CompensationCompleted").count() == 3
    assert Task.objects.get(pk=task["task_id"]).status == "compensated"
    assert alice.get(f"/api/v1/tasks/{task['task_id']}/verify/").json()["valid"]
    late = {"type": "Noted", "payload": {}}
    assert_error(alice.post(f"/api/v1/tasks/{task['task_id']}/events/", late, format="json"), 409, "task_closed")


def test_a_failed_compensation_becomes_a_dead_letter_and_requeue_asks_again(alice) -> None:  # type: ignore[no-untyped-def]
    task = create_task(alice)
    succeed_three_steps(alice, task["task_id"])
    alice.post(f"/api/v1/tasks/{task['task_id']}/events/", {
        "type": "TaskFailed", "payload": {"error": "x", "retryable": False}}, format="json")
    first = requested(task["task_id"])[-1].payload
    alice.post(f"/api/v1/tool-calls/{first['compensation_key']}/result/",
               {"status": "failed", "result": {"why": "already sent"}}, format="json")
    dead_letter = DeadLetter.objects.get(source="compensation")
    assert dead_letter.reference == first["compensation_key"] and dead_letter.task_id is not None
    assert Task.objects.get(pk=task["task_id"]).status == "compensating"
    dead_letters.dead_letter_requeue(dead_letter_id=dead_letter.pk, decided_by="user:op", reason="retry")
    assert len(requested(task["task_id"])) == 2
    assert ToolCall.objects.get(pk=first["compensation_key"]).status == "dispatched"


def test_a_task_without_compensations_just_fails(alice) -> None:  # type: ignore[no-untyped-def]
    task = create_task(alice)
    alice.post(f"/api/v1/tasks/{task['task_id']}/events/", {
        "type": "TaskFailed", "payload": {"error": "x", "retryable": False}}, format="json")
    assert Task.objects.get(pk=task["task_id"]).status == "failed"
    assert requested(task["task_id"]) == []


def test_discarding_a_task_dead_letter_with_compensate_runs_the_saga(alice) -> None:  # type: ignore[no-untyped-def]
    task = create_task(alice, max_attempts=1)
    # Claimed as alice, the agent that then writes under the lease (only the holder writes).
    lease = leases.lease_claim(agent=Agent.objects.get(namespace="acme", name="alice"), kinds=None, lease_seconds=30)
    assert lease is not None
    succeed_three_steps(alice, task["task_id"], lease.lease_epoch)
    Task.objects.filter(pk=task["task_id"]).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    detector.lease_expire_stalled()
    dead_letter = DeadLetter.objects.get(source="task")
    dead_letters.dead_letter_discard(dead_letter_id=dead_letter.pk, decided_by="user:op", reason="give up",
                                     compensate=True)
    assert Task.objects.get(pk=task["task_id"]).status == "compensating"
    assert requested(task["task_id"])[0].payload["step"] == 3
