"""Signals (recovery/signals.py): a task waits durably for a named signal; the signal ends the
wait whichever comes first; repeats are answered from the row; a wait runs out; every step is an
event in the task's chain; the detector leaves a waiting task alone."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from backplane.eventlog import services
from backplane.eventlog.errors import AlreadyDecided, InvalidInput, StaleLease, TaskClosed
from backplane.eventlog.models import Agent, Event, Task
from backplane.eventlog.writer import EventDraft
from recovery import detector, leases, signals
from recovery.models import SignalStatus, TaskSignal

pytestmark = pytest.mark.django_db


@pytest.fixture
def leased() -> tuple[Task, int]:
    agent = services.agent_create(name="waiter", namespace="acme").agent
    services.task_create(namespace="acme", kind="k", input={}, agent="planner")
    claim = leases.lease_claim(agent=agent, kinds=None, lease_seconds=30)
    assert claim is not None
    return claim.task, claim.lease_epoch


def await_it(leased: tuple[Task, int], name: str = "invoice-paid", timeout: int = 3600) -> tuple[TaskSignal, bool]:
    task, epoch = leased
    return signals.signal_await(namespace="acme", task_id=task.pk, name=name, timeout_seconds=timeout,
                                agent="waiter", lease_epoch=epoch)


def send(task: Task, payload: dict[str, object], name: str = "invoice-paid") -> tuple[TaskSignal, bool]:
    return signals.signal_send(namespace="acme", task_id=task.pk, name=name, payload=payload, sent_by="user:ops")


def types_of(task: Task) -> list[str]:
    return list(Event.objects.filter(task=task).order_by("seq").values_list("type", flat=True))


def test_a_wait_then_its_signal_each_written_once(leased: tuple[Task, int]) -> None:
    task = leased[0]
    waiting, began = await_it(leased)
    assert began and waiting.status == SignalStatus.WAITING
    assert await_it(leased)[1] is False  # a retry: the same wait
    received, delivered = send(task, {"paid": True})
    assert delivered and received.status == SignalStatus.RECEIVED and received.payload == {"paid": True}
    assert send(task, {"paid": True})[1] is False  # the same payload again: answered as sent
    with pytest.raises(AlreadyDecided):
        send(task, {"paid": False})
    assert types_of(task)[-2:] == ["SignalAwaited", "SignalReceived"]
    assert Event.objects.get(task=task, type="SignalReceived").payload == {
        "name": "invoice-paid", "payload": {"paid": True}, "sent_by": "user:ops"}


def test_a_signal_sent_before_the_wait_is_found_by_it(leased: tuple[Task, int]) -> None:
    send(leased[0], {"paid": True})
    found, began = await_it(leased)
    assert began and found.status == SignalStatus.RECEIVED and found.payload == {"paid": True}
    assert Event.objects.get(task=leased[0], type="SignalAwaited").payload["already_received"] is True


def test_a_wait_runs_out_and_a_late_signal_is_refused(leased: tuple[Task, int]) -> None:
    await_it(leased, timeout=60)
    assert signals.signals_expire(now=timezone.now() + timedelta(seconds=30)) == 0
    assert signals.signals_expire(now=timezone.now() + timedelta(seconds=61)) == 1
    with pytest.raises(AlreadyDecided):
        send(leased[0], {"paid": True})
    assert types_of(leased[0])[-1] == "SignalTimedOut"


def test_refusals_change_nothing(leased: tuple[Task, int]) -> None:
    task, epoch = leased
    before = types_of(task)
    with pytest.raises(InvalidInput):
        await_it(leased, name="not a name!")
    with pytest.raises(InvalidInput):
        await_it(leased, timeout=0)
    with pytest.raises(StaleLease):
        signals.signal_await(namespace="acme", task_id=task.pk, name="x", timeout_seconds=60, agent="waiter",
                             lease_epoch=epoch + 1)
    with pytest.raises(InvalidInput):
        send(task, {"blob": "x" * 10}, name="-leading-dash")
    services.event_append(namespace="acme", task_id=task.pk, agent="waiter", lease_epoch=epoch,
                          draft=EventDraft(type="TaskCompleted", payload={"output": {}}))
    with pytest.raises(TaskClosed):
        send(task, {"late": True})
    assert types_of(task) == [*before, "TaskCompleted"]


def test_a_waiting_task_is_not_stalled(leased: tuple[Task, int]) -> None:
    await_it(leased)
    assert detector.lease_expire_stalled(now=timezone.now() + timedelta(hours=1)).expired == 0
    send(leased[0], {"paid": True})
    assert detector.lease_expire_stalled(now=timezone.now()).expired == 0
    assert detector.lease_expire_stalled(now=timezone.now() + timedelta(hours=1)).expired == 1


def test_a_task_given_back_while_waiting_for_a_signal_is_not_handed_out_until_it_comes(
    leased: tuple[Task, int],
) -> None:
    task, epoch = leased
    await_it(leased)
    leases.lease_release(namespace="acme", task_id=task.pk, lease_epoch=epoch, agent="waiter")
    agent = Agent.objects.get(namespace="acme", name="waiter")
    assert leases.lease_claim(agent=agent, kinds=None, lease_seconds=30) is None
    assert leases.lease_claim(agent=agent, kinds=None, lease_seconds=30, task_id=task.pk) is None
    send(task, {"paid": True})
    again = leases.lease_claim(agent=agent, kinds=None, lease_seconds=30)
    assert again is not None and again.task.pk == task.pk
    # A wait that ran out frees the task as well: its next holder reads the timeout.
    await_it((again.task, again.lease_epoch), name="second-invoice", timeout=60)
    leases.lease_release(namespace="acme", task_id=task.pk, lease_epoch=again.lease_epoch, agent="waiter")
    assert leases.lease_claim(agent=agent, kinds=None, lease_seconds=30) is None
    assert signals.signals_expire(now=timezone.now() + timedelta(seconds=61)) == 1
    third = leases.lease_claim(agent=agent, kinds=None, lease_seconds=30)
    assert third is not None and third.task.pk == task.pk


def test_a_task_has_at_most_a_hundred_signals(leased: tuple[Task, int]) -> None:
    task = leased[0]
    for n in range(signals.SIGNALS_PER_TASK_MAX - 1):
        send(task, {}, name=f"s{n}")
    await_it(leased, name="last-one")
    before = types_of(task)
    with pytest.raises(InvalidInput) as refused:
        send(task, {}, name="one-too-many")
    assert refused.value.details == {"name": "this task has 100 signals already"}
    with pytest.raises(InvalidInput):
        await_it(leased, name="one-too-many")
    assert types_of(task) == before and TaskSignal.objects.filter(task=task).count() == 100
    assert send(task, {"ok": True}, name="last-one")[1]  # the names it has still work
