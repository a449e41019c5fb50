"""The stall detector: expired leases are fenced off and handed on; renewals and parallel
detectors never double-expire."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.utils import timezone

from backplane.delivery.models import DeadLetter, OutboxMessage
from backplane.eventlog import services
from backplane.eventlog.errors import StaleLease
from backplane.eventlog.models import Agent, Event, Task
from backplane.eventlog.writer import EventDraft
from recovery import dead_letters, detector, leases, tool_calls


def claimed_task(max_attempts: int = 3, lease_seconds: int = 30) -> tuple[Task, int]:
    agent = Agent.objects.filter(name="worker").first() or services.agent_create(name="worker", namespace="acme").agent
    services.task_create(namespace="acme", kind="k", input={"n": 1}, agent="planner", max_attempts=max_attempts)
    claim = leases.lease_claim(agent=agent, kinds=None, lease_seconds=lease_seconds)
    assert claim is not None
    return claim.task, claim.lease_epoch


def expire(task: Task) -> None:
    Task.objects.filter(pk=task.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))


def test_an_expired_lease_is_fenced_off_and_the_task_goes_back_to_pending(db) -> None:  # type: ignore[no-untyped-def]
    task, epoch = claimed_task()
    expire(task)
    sweep = detector.lease_expire_stalled()
    assert (sweep.expired, sweep.requeued, sweep.dead_lettered) == (1, 1, 0)
    task.refresh_from_db()
    assert (task.status, task.attempts, task.lease_holder, task.lease_epoch) == ("pending", 1, None, epoch + 1)
    stalled = Event.objects.get(task=task, type="TaskStalled")
    assert stalled.payload["holder"] == "worker" and stalled.payload["lease_epoch"] == epoch
    with pytest.raises(StaleLease):  # the old holder is fenced off
        services.event_append(namespace="acme", task_id=task.pk, agent="worker", lease_epoch=epoch,
                              draft=EventDraft(type="Noted"))
    assert OutboxMessage.objects.filter(key=str(task.pk), payload__status="pending").count() == 2
    again = leases.lease_claim(agent=Agent.objects.get(name="worker"), kinds=None, lease_seconds=30)
    assert again is not None and again.recovered and again.lease_epoch == epoch + 2


def test_a_live_lease_is_left_alone(db) -> None:  # type: ignore[no-untyped-def]
    task, epoch = claimed_task()
    assert detector.lease_expire_stalled().expired == 0
    task.refresh_from_db()
    assert (task.status, task.lease_epoch) == ("running", epoch)


def test_the_last_attempt_dead_letters_the_task_for_review(db) -> None:  # type: ignore[no-untyped-def]
    task, _ = claimed_task(max_attempts=1)
    expire(task)
    assert detector.lease_expire_stalled().dead_lettered == 1
    task.refresh_from_db()
    assert task.status == "dead_lettered" and task.attempts == 1
    types = list(Event.objects.filter(task=task).order_by("seq").values_list("type", flat=True))
    assert types[-2:] == ["TaskStalled", "TaskDeadLettered"]
    dead_letter = DeadLetter.objects.get(source="task", task=task)
    dead_letters.dead_letter_requeue(dead_letter_id=dead_letter.pk, decided_by="user:op", reason="retry once more")
    task.refresh_from_db()
    assert (task.status, task.attempts) == ("pending", 0)
    assert Event.objects.filter(task=task, type="DeadLetterRequeued").count() == 1


@pytest.mark.django_db(transaction=True)
def test_a_lease_renewed_while_the_detector_runs_is_never_expired(committed_db) -> None:  # type: ignore[no-untyped-def]
    task, epoch = claimed_task(lease_seconds=1)
    expire(task)
    renewing = threading.Event()
    swept = threading.Event()
    done = threading.Event()

    # A heartbeat that holds the row lock across the detector's run, then commits a new expiry.
    def slow_heartbeat() -> None:
        with transaction.atomic():
            locked = Task.objects.select_for_update().get(pk=task.pk)
            renewing.set()
            swept.wait(5)  # the run below has returned (or, were it waiting for this lock, 5 s passed)
            locked.lease_expires_at = timezone.now() + timedelta(seconds=60)
            locked.save(update_fields=["lease_expires_at"])
        done.set()
        connection.close()

    thread = threading.Thread(target=slow_heartbeat)
    thread.start()
    assert renewing.wait(5)
    during = detector.lease_expire_stalled()
    swept.set()
    thread.join()
    after = detector.lease_expire_stalled()
    assert (during.expired, after.expired) == (0, 0)
    task.refresh_from_db()
    assert (task.status, task.lease_epoch, task.attempts) == ("running", epoch, 0)
    assert not Event.objects.filter(task=task, type="TaskStalled").exists()
    # The real heartbeat path does not revive a lease past its deadline, swept or not: the
    # holder is fenced at once (409 stale_lease) and the detector then expires it as usual.
    expire(task)
    with pytest.raises(StaleLease):
        leases.lease_heartbeat(namespace="acme", task_id=task.pk, lease_epoch=epoch, agent=str(task.lease_holder))
    assert detector.lease_expire_stalled().expired == 1


@pytest.mark.django_db(transaction=True)
def test_detectors_running_at_once_expire_each_lease_once(committed_db) -> None:  # type: ignore[no-untyped-def]
    tasks = [claimed_task()[0] for _ in range(40)]
    Task.objects.update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    counts: list[int] = []
    barrier = threading.Barrier(4)

    def sweep() -> None:
        barrier.wait()
        total = 0
        while (step := detector.lease_expire_stalled(batch_size=5)).expired:
            total += step.expired
        counts.append(total)
        connection.close()

    threads = [threading.Thread(target=sweep) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(counts) == 40
    assert Event.objects.filter(type="TaskStalled").count() == 40
    assert set(Task.objects.values_list("attempts", flat=True)) == {1}
    assert all(t.pk for t in tasks)


def test_a_heartbeating_task_without_progress_is_flagged_then_stalled(db, settings) -> None:  # type: ignore[no-untyped-def]
    from recovery import selectors

    task, epoch = claimed_task(lease_seconds=600)
    Task.objects.filter(pk=task.pk).update(last_event_at=timezone.now() - timedelta(minutes=10))
    (flagged,) = selectors.tasks_without_progress()
    assert flagged["id"] == task.pk and flagged["silent_seconds"] >= 600
    assert detector.lease_expire_stalled().expired == 0  # flagged, not yet taken back
    Task.objects.filter(pk=task.pk).update(
        last_event_at=timezone.now() - timedelta(seconds=settings.BACKPLANE_NO_PROGRESS_STALL_SECONDS + 1))
    assert detector.lease_expire_stalled().expired == 1
    stalled = Event.objects.get(task=task, type="TaskStalled")
    assert stalled.payload["reason"] == "no progress"
    task.refresh_from_db()
    assert (task.status, task.lease_epoch) == ("pending", epoch + 1)


def test_tool_calls_in_flight_past_their_timeout_are_flagged_with_their_age(db) -> None:  # type: ignore[no-untyped-def]
    from recovery import selectors
    from recovery.models import ToolCall

    task, epoch = claimed_task()
    tool_calls.tool_call_dispatch(namespace="acme", task_id=task.pk, step=1, tool="crm", input={}, agent="worker",
                                lease_epoch=epoch)
    assert selectors.tool_calls_overdue() == []
    ToolCall.objects.update(dispatched_at=timezone.now() - timedelta(hours=1))
    (overdue,) = selectors.tool_calls_overdue()
    assert overdue["tool"] == "crm" and overdue["age_seconds"] >= 3600


@pytest.mark.django_db(transaction=True)
def test_concurrent_sweeps_over_leases_of_many_agents_do_not_deadlock(committed_db) -> None:  # type: ignore[no-untyped-def]
    # Found by bench/detector.py: sweeps used to lock the holders' breaker rows in task order.
    agents = [services.agent_create(name=f"holder-{n}", namespace="acme").agent for n in range(5)]
    for n in range(60):
        services.task_create(namespace="acme", kind="k", input={"n": n}, agent="planner", max_attempts=5)
        leases.lease_claim(agent=agents[(n * 7) % 5], kinds=None, lease_seconds=30)
    # Expiry order interleaves the holders differently in every batch.
    for position, task in enumerate(Task.objects.order_by("?")):
        Task.objects.filter(pk=task.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=100 - position))
    errors: list[BaseException] = []
    barrier = threading.Barrier(4)

    def sweep() -> None:
        try:
            barrier.wait()
            while detector.lease_expire_stalled(batch_size=7).expired:
                pass
        except BaseException as exc:  # noqa: BLE001 - asserted below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=sweep) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert Event.objects.filter(type="TaskStalled").count() == 60
    assert sum(Agent.objects.filter(name__startswith="holder-").values_list("consecutive_failures", flat=True)) == 60


def test_a_stalled_sandbox_leaves_no_dead_letter_and_counts_against_no_breaker(db: None) -> None:
    from backplane.eventlog import forks

    source = services.task_create(namespace="acme", kind="k", input={"n": 2}, agent="planner", max_attempts=1).task
    sandbox = forks.task_fork(namespace="acme", source_task_id=source.pk, at_seq=1, reason="replay",
                              forked_by="planner", by_staff=False, sandbox=True).task
    agent = services.agent_create(name="replayer", namespace="acme").agent
    assert leases.lease_claim(agent=agent, kinds=None, lease_seconds=30, task_id=sandbox.pk) is not None
    expire(sandbox)
    detector.lease_expire_stalled()
    sandbox.refresh_from_db()
    agent.refresh_from_db()
    assert sandbox.status == "dead_lettered"
    assert not DeadLetter.objects.filter(task=sandbox).exists()
    assert agent.consecutive_failures == 0 and agent.breaker_state == "closed"
    # Nor does a replay that fails itself.
    sandbox_two = forks.task_fork(namespace="acme", source_task_id=source.pk, at_seq=1, reason="replay",
                                  forked_by="planner", by_staff=False, sandbox=True).task
    claim = leases.lease_claim(agent=agent, kinds=None, lease_seconds=30, task_id=sandbox_two.pk)
    assert claim is not None
    services.event_append(namespace="acme", task_id=sandbox_two.pk, agent="replayer", lease_epoch=claim.lease_epoch,
                          draft=EventDraft(type="TaskFailed", payload={"error": "x", "retryable": False}))
    agent.refresh_from_db()
    assert agent.consecutive_failures == 0
