"""The stall detector's set-wise batches: every task of a batch gets exactly the events, projection,
lifecycle rows, dead letter and breaker count the one-task-at-a-time path gives it, and sweeps
running at once neither double-expire a lease nor deadlock on the holders' agent rows."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.db import OperationalError, connection, transaction
from django.db.models import Count
from django.utils import timezone

from backplane.delivery.models import DeadLetter, OutboxMessage, WebhookSubscription
from backplane.delivery.outbox import outbox_enqueue_many
from backplane.eventlog import services
from backplane.eventlog.chain import format_timestamp
from backplane.eventlog.errors import StaleLease
from backplane.eventlog.lifecycle import lifecycle_message
from backplane.eventlog.models import Agent, BreakerTransition, Event, Task
from backplane.eventlog.writer import EventDraft
from backplane.integrity.verification import chain_check
from recovery import detector, leases, subtasks
from recovery.errors import CircuitOpen
from tests.recovery.test_circuit_breaker import cool_down, fail_one

# What a lifecycle row holds apart from its own identity (id, message_id).
OUTBOX_FIELDS = ("destination", "subscription_id", "topic", "key", "payload", "headers", "task_id", "event_position",
                 "status", "attempts", "next_attempt_at", "last_error", "created_at", "delivered_at")


def new_agent(name: str, namespace: str = "acme") -> Agent:
    return services.agent_create(name=name, namespace=namespace).agent


def claim_new(agent: Agent, *, kind: str = "k", max_attempts: int = 3, lease_seconds: int = 30) -> tuple[Task, int]:
    """A fresh task of ``kind`` in the agent's namespace, claimed by the agent."""
    created = services.task_create(namespace=agent.namespace, kind=kind, input={"by": agent.name}, agent="planner",
                                   max_attempts=max_attempts).task
    return claim_next(agent, created, lease_seconds=lease_seconds)


def claim_next(agent: Agent, expected: Task, *, lease_seconds: int = 30) -> tuple[Task, int]:
    claim = leases.lease_claim(agent=agent, kinds=None, lease_seconds=lease_seconds)
    assert claim is not None and claim.task.pk == expected.pk
    return claim.task, claim.lease_epoch


def expire_in_order(tasks: list[Task]) -> None:
    """Leases that ran out a minute ago, one second apart: the sweep takes them in this order."""
    base = timezone.now() - timedelta(seconds=60)
    for position, task in enumerate(tasks):
        Task.objects.filter(pk=task.pk).update(lease_expires_at=base + timedelta(seconds=position))


def sweep_until_idle(*, now: datetime, batch_size: int = 100) -> list[tuple[int, int, int]]:
    sweeps = []
    while True:
        step = detector.lease_expire_stalled(now=now, batch_size=batch_size)
        sweeps.append((step.expired, step.requeued, step.dead_lettered))
        if not step.expired:
            return sweeps


def last_outbox_id() -> int:
    return OutboxMessage.objects.order_by("-id").values_list("id", flat=True).first() or 0


def assert_chain_intact(task: Task) -> None:
    task.refresh_from_db()
    verification = chain_check(task=task)
    assert verification.valid, verification.problem
    assert verification.checked == task.last_seq
    seqs = list(Event.objects.filter(task=task).order_by("seq").values_list("seq", flat=True))
    assert seqs == list(range(1, task.last_seq + 1))


def expected_stall_payload(before: Task, *, now: datetime, reason: str) -> dict[str, Any]:
    """The TaskStalled payload for the task as the sweep found it (the single-task path's contract)."""
    assert before.lease_expires_at is not None and before.last_event_at is not None
    return {
        "reason": reason,
        "holder": before.lease_holder,
        "lease_epoch": before.lease_epoch,
        "lease_expired_at": format_timestamp(before.lease_expires_at),
        "seconds_since_last_event": round((now - before.last_event_at).total_seconds(), 3),
        "attempt": before.attempts + 1,
        "max_attempts": before.max_attempts,
    }


def test_a_mixed_sweep_in_batches_writes_what_the_one_task_path_writes(db, settings) -> None:  # type: ignore[no-untyped-def]
    settings.BACKPLANE_NO_PROGRESS_STALL_SECONDS = 120
    settings.BACKPLANE_BREAKER_THRESHOLD = 100  # breakers only count here; they open in the tests below
    worker, helper = new_agent("worker"), new_agent("helper")
    # Same name as acme's worker: breaker counts must follow (namespace, name), not the name.
    globex_worker, scout = new_agent("worker", "globex"), new_agent("scout", "globex")

    retry, _ = claim_new(worker, kind="lead-qualification")
    last_try, _ = claim_new(worker, kind="lead-qualification", max_attempts=1)
    parent, parent_epoch = claim_new(worker, kind="research")
    retry_child = subtasks.subtask_dispatch(namespace="acme", parent_task_id=parent.pk, step=1, kind="lookup",
                                            input={"q": 1}, agent="worker", lease_epoch=parent_epoch).child
    settings.BACKPLANE_MAX_ATTEMPTS = 1  # a sub-task gets the global max_attempts
    doomed_child = subtasks.subtask_dispatch(namespace="acme", parent_task_id=parent.pk, step=2, kind="lookup",
                                             input={"q": 2}, agent="worker", lease_epoch=parent_epoch).child
    settings.BACKPLANE_MAX_ATTEMPTS = 3
    claim_next(helper, retry_child)
    claim_next(helper, doomed_child)
    # Heartbeating, so the lease is live, but silent for longer than the no-progress limit.
    silent, silent_epoch = claim_new(helper, kind="lead-qualification", lease_seconds=600)
    leases.lease_heartbeat(namespace="acme", task_id=silent.pk, lease_epoch=silent_epoch, agent=helper.name)
    Task.objects.filter(pk=silent.pk).update(last_event_at=timezone.now() - timedelta(seconds=300))
    globex_retry, _ = claim_new(globex_worker, kind="enrich")
    globex_last_try, _ = claim_new(scout, kind="enrich", max_attempts=1)
    # Batches of 3: [retry, last_try, globex_retry], [retry_child, doomed_child, parent],
    # [globex_last_try, silent] (a live lease sorts last). The doomed child reports to a parent
    # that stalls later in the same batch: the one-task-at-a-time loop then numbered the parent's
    # TaskStalled on its row as the batch had read it, one seq behind, and the sweep failed.
    expire_in_order([retry, last_try, globex_retry, retry_child, doomed_child, parent, globex_last_try])
    everyone = [retry, last_try, globex_retry, retry_child, doomed_child, parent, globex_last_try, silent]
    exhausted = {last_try.pk, doomed_child.pk, globex_last_try.pk}
    before = {task.pk: Task.objects.get(pk=task.pk) for task in everyone}
    silent_until = before[silent.pk].lease_expires_at
    assert silent_until is not None and silent_until > timezone.now() + timedelta(seconds=500)
    outbox_before = last_outbox_id()
    now = timezone.now()

    assert sweep_until_idle(now=now, batch_size=3) == [(3, 2, 1), (3, 2, 1), (2, 1, 1), (0, 0, 0)]

    for task in everyone:
        old = before[task.pk]
        after = Task.objects.get(pk=task.pk)
        new_events = list(Event.objects.filter(task=task, seq__gt=old.last_seq).order_by("seq"))
        own_types = ["TaskStalled", "TaskDeadLettered"] if task.pk in exhausted else ["TaskStalled"]
        reported = ["SubAgentResultReceived"] if task.pk == parent.pk else []
        assert [e.type for e in new_events] == own_types + reported, task.kind
        # Numbered, linked, clocked and attributed as write_events does it; the hashes are
        # recomputed from these fields by chain_verify below.
        previous_hash = old.head_hash
        for offset, event in enumerate(new_events[: len(own_types)], start=1):
            assert (event.seq, event.lamport, event.prev_hash) == (
                old.last_seq + offset, old.lamport + offset, previous_hash)
            assert (event.agent, event.recorded_at, event.idempotency_key, event.request_digest) == (
                None, now, None, None)
            previous_hash = event.hash
        reason = "no progress" if task.pk == silent.pk else "lease expired"
        assert new_events[0].payload == expected_stall_payload(old, now=now, reason=reason)
        if task.pk in exhausted:
            assert new_events[1].payload == {"reason": "attempts exhausted"}
        assert_chain_intact(after)

        # The projection: fenced (epoch + 1), one attempt counted, lease released.
        assert (after.lease_epoch, after.attempts, after.lease_holder, after.lease_expires_at) == (
            old.lease_epoch + 1, old.attempts + 1, None, None)
        assert after.status == ("dead_lettered" if task.pk in exhausted else "pending")
        assert (after.last_event_at, after.updated_at) == (now, now)

        # One lifecycle row per status change, headed by the sweep's own last event (for the
        # parent: its TaskStalled, not the SubAgentResultReceived written after it).
        own_last = new_events[len(own_types) - 1]
        (lifecycle,) = OutboxMessage.objects.filter(id__gt=outbox_before, key=str(task.pk))
        assert (lifecycle.destination, lifecycle.topic, lifecycle.task_id) == (
            "broker", f"backplane.tasks.{task.kind}", task.pk)
        assert lifecycle.payload == {
            "task_id": str(task.pk), "namespace": task.namespace, "kind": task.kind, "status": after.status,
            "previous_status": "running", "attempts": old.attempts + 1, "output": None, "error": None,
        }
        assert lifecycle.headers == {"task_id": str(task.pk), "seq": own_last.seq, "event_hash": own_last.hash,
                                     "created_at": format_timestamp(now), "namespace": task.namespace}

        # The old holder is fenced off: its writes and heartbeats get 409 stale_lease.
        with pytest.raises(StaleLease):
            services.event_append(namespace=task.namespace, task_id=task.pk, agent=old.lease_holder,
                                  lease_epoch=old.lease_epoch, draft=EventDraft(type="Noted"))
        with pytest.raises(StaleLease):
            leases.lease_heartbeat(namespace=task.namespace, task_id=task.pk, lease_epoch=old.lease_epoch,
                                    agent=str(old.lease_holder))

    assert OutboxMessage.objects.filter(id__gt=outbox_before).count() == len(everyone)

    # The dead child's result reached its parent, once, after the parent's own TaskStalled.
    doomed_after = Task.objects.get(pk=doomed_child.pk)
    (report,) = Event.objects.filter(task=parent, type="SubAgentResultReceived")
    assert report.payload == {"child_task_id": str(doomed_child.pk), "dispatch_key": doomed_after.dispatch_key,
                              "kind": "lookup", "status": "dead_lettered", "output": None, "error": None}
    assert (report.causation_id, report.agent, report.recorded_at) == (
        f"{doomed_child.pk}:{doomed_after.last_seq}", None, now)

    dead_letters = {d.task_id: d for d in DeadLetter.objects.all()}
    assert set(dead_letters) == exhausted
    for task_pk in exhausted:
        old, letter = before[task_pk], dead_letters[task_pk]
        assert (letter.source, letter.reference, letter.topic, letter.status, letter.attempts, letter.created_at) == (
            "task", str(task_pk), f"backplane.tasks.{old.kind}", "pending", 1, now)
        assert letter.payload == {"task_id": str(task_pk), "kind": old.kind, "input": old.input}
        assert letter.error == f"lease expired (holder {old.lease_holder}); attempts exhausted (1/1)"

    failures = {(a.namespace, a.name): a.consecutive_failures for a in Agent.objects.all()}
    assert failures == {("acme", "worker"): 3, ("acme", "helper"): 3, ("globex", "worker"): 1,
                        ("globex", "scout"): 1}


def single_path_lifecycle_rows(task: Task, *, now: datetime) -> list[dict[str, Any]]:
    """The rows the one-task path (``write_events``: its lifecycle message, one INSERT) writes for
    this status change; rolled back."""
    with transaction.atomic():
        after = last_outbox_id()
        message = lifecycle_message(task=task, previous_status="running", seq=task.last_seq,
                                    event_hash=task.head_hash, now=now)
        assert message is not None
        outbox_enqueue_many([message], now=now)
        rows = list(OutboxMessage.objects.filter(id__gt=after).order_by("id").values(*OUTBOX_FIELDS))
        transaction.set_rollback(True)
    return rows


def test_each_expired_lease_gets_a_broker_row_then_one_per_matching_subscription(db) -> None:  # type: ignore[no-untyped-def]
    def subscribe(name: str, pattern: str, *, active: bool = True) -> WebhookSubscription:
        return WebhookSubscription.objects.create(name=name, topic_pattern=pattern, url=f"https://{name}.test/hook",
                                                  secret="whsec", is_active=active)

    leads = subscribe("leads", "backplane.tasks.lead-qualification")
    every_task = subscribe("all-tasks", "backplane.tasks.#")
    subscribe("paused", "#", active=False)
    subscribe("scores", "leads.*")
    worker = new_agent("worker")
    first, _ = claim_new(worker, kind="lead-qualification")
    second, _ = claim_new(worker, kind="enrich")
    third, _ = claim_new(worker, kind="lead-qualification", max_attempts=1)
    expire_in_order([first, second, third])
    outbox_before = last_outbox_id()
    now = timezone.now()

    assert sweep_until_idle(now=now) == [(3, 2, 1), (0, 0, 0)]

    rows = list(OutboxMessage.objects.filter(id__gt=outbox_before).order_by("id"))
    # Per task in sweep order: the broker's row, then the matching active subscriptions by id.
    assert [(row.task_id, row.destination, row.subscription_id) for row in rows] == [
        (first.pk, "broker", None), (first.pk, "webhook", leads.pk), (first.pk, "webhook", every_task.pk),
        (second.pk, "broker", None), (second.pk, "webhook", every_task.pk),
        (third.pk, "broker", None), (third.pk, "webhook", leads.pk), (third.pk, "webhook", every_task.pk),
    ]
    assert len({row.message_id for row in rows}) == len(rows)
    written = list(OutboxMessage.objects.filter(id__gt=outbox_before).order_by("id").values(*OUTBOX_FIELDS))
    for task in (first, second, third):
        task.refresh_from_db()
        expected = single_path_lifecycle_rows(task, now=now)
        assert [row for row in written if row["task_id"] == task.pk] == expected
        assert expected[0]["payload"]["status"] == ("dead_lettered" if task.pk == third.pk else "pending")


@pytest.fixture
def flaky(db) -> Agent:  # type: ignore[no-untyped-def]
    return new_agent("flaky")


def test_a_half_open_trial_whose_lease_expires_opens_the_breaker_again(flaky, settings) -> None:  # type: ignore[no-untyped-def]
    settings.BACKPLANE_BREAKER_THRESHOLD = 3
    for _ in range(3):
        fail_one(flaky)
    cool_down(flaky)
    trial, _ = claim_new(flaky)
    flaky.refresh_from_db()
    assert flaky.breaker_state == "half_open"
    expire_in_order([trial])
    now = timezone.now()

    assert sweep_until_idle(now=now) == [(1, 1, 0), (0, 0, 0)]

    flaky.refresh_from_db()
    assert (flaky.breaker_state, flaky.breaker_opened_at, flaky.consecutive_failures) == ("open", now, 4)
    transitions = list(BreakerTransition.objects.filter(agent=flaky).order_by("at", "id")
                       .values_list("from_state", "to_state", "reason", "task_id", "at"))
    assert [t[:2] for t in transitions] == [("closed", "open"), ("open", "half_open"), ("half_open", "open")]
    assert transitions[-1][2:] == ("trial failed: lease expired", trial.pk, now)
    # A new cool-down: the trial's task is pending again, but the agent may not take it.
    with pytest.raises(CircuitOpen):
        leases.lease_claim(agent=flaky, kinds=None, lease_seconds=30)


def test_leases_of_one_agent_expiring_in_one_sweep_count_as_that_many_failures(flaky, settings) -> None:  # type: ignore[no-untyped-def]
    settings.BACKPLANE_BREAKER_THRESHOLD = 3
    namesake = new_agent("flaky", "globex")
    leases = [claim_new(flaky)[0] for _ in range(3)]
    other, _ = claim_new(namesake)
    expire_in_order([*leases, other])
    now = timezone.now()

    assert sweep_until_idle(now=now) == [(4, 4, 0), (0, 0, 0)]

    # Three at once reach the threshold of three: one transition, naming the last of them.
    flaky.refresh_from_db()
    assert (flaky.breaker_state, flaky.consecutive_failures, flaky.breaker_opened_at) == ("open", 3, now)
    assert list(BreakerTransition.objects.filter(agent=flaky).values_list("from_state", "to_state", "reason",
                                                                          "task_id")) == [
        ("closed", "open", "3 consecutive failures, last: lease expired", leases[-1].pk)]
    namesake.refresh_from_db()
    assert (namesake.breaker_state, namesake.consecutive_failures) == ("closed", 1)
    assert not BreakerTransition.objects.filter(agent=namesake).exists()


def backend_pid() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return cursor.fetchone()[0]


def wait_until_waiting_for_a_lock(pid: int, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    with connection.cursor() as cursor:
        while time.monotonic() < deadline:
            cursor.execute("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", [pid])
            row = cursor.fetchone()
            if row and row[0] == "Lock":
                return True
            time.sleep(0.02)
    return False


def agent_row_is_locked(agent: Agent) -> bool:
    try:
        with transaction.atomic():
            Agent.objects.select_for_update(nowait=True).get(pk=agent.pk)
    except OperationalError:
        return True
    return False


@pytest.mark.django_db(transaction=True)
def test_the_sweep_locks_the_holders_agent_rows_in_id_order(committed_db) -> None:  # type: ignore[no-untyped-def]
    # Id order differs from name order and from the order the leases expire in, so a sweep
    # locking agents by name or by task would take "amy" first.
    zed, amy = new_agent("zed"), new_agent("amy")
    assert zed.pk < amy.pk
    amy_task, _ = claim_new(amy)
    zed_task, _ = claim_new(zed)
    expire_in_order([amy_task, zed_task])
    holding, release = threading.Event(), threading.Event()
    sweep_pid: list[int] = []
    outcome: list[object] = []

    def hold_amy() -> None:
        try:
            with transaction.atomic():
                Agent.objects.select_for_update().get(pk=amy.pk)
                holding.set()
                release.wait(10)
        finally:
            connection.close()

    def sweep() -> None:
        try:
            sweep_pid.append(backend_pid())
            outcome.append(detector.lease_expire_stalled())
        except BaseException as exc:  # noqa: BLE001 - asserted below
            outcome.append(exc)
        finally:
            connection.close()

    holder = threading.Thread(target=hold_amy)
    holder.start()
    assert holding.wait(5)
    assert not agent_row_is_locked(zed)
    sweeper = threading.Thread(target=sweep)
    sweeper.start()
    try:
        deadline = time.monotonic() + 5
        while not sweep_pid and time.monotonic() < deadline:
            time.sleep(0.01)
        assert sweep_pid and wait_until_waiting_for_a_lock(sweep_pid[0])
        # Waiting for amy, the sweep already holds zed: it locks in id order.
        assert agent_row_is_locked(zed)
    finally:
        release.set()
        holder.join()
        sweeper.join()
    (step,) = outcome
    assert isinstance(step, detector.StallSweep) and step.expired == 2
    assert set(Agent.objects.values_list("name", "consecutive_failures")) == {("zed", 1), ("amy", 1)}


@pytest.mark.django_db(transaction=True)
def in_two_threads(sweep: Callable[[], int]) -> tuple[list[int], list[BaseException]]:
    """Run ``sweep`` in two threads released together, each on its own connection."""
    totals: list[int] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(2)

    def run() -> None:
        try:
            barrier.wait()
            totals.append(sweep())
        except BaseException as exc:  # noqa: BLE001 - the caller asserts on them
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=run) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return totals, errors


def test_two_sweeps_at_once_expire_each_of_30_leases_once(committed_db) -> None:  # type: ignore[no-untyped-def]
    agents = [new_agent(f"holder-{n}") for n in range(5)]
    tasks = [claim_new(agents[(n * 3) % 5], max_attempts=1 if n % 4 == 0 else 3)[0] for n in range(30)]
    # Every batch of 4 mixes the holders in another order.
    expire_in_order(random.Random(7).sample(tasks, len(tasks)))
    leases_of = {agent.name: sum(1 for t in tasks if t.lease_holder == agent.name) for agent in agents}
    now = timezone.now()

    def sweep() -> int:
        total = 0
        while expired := detector.lease_expire_stalled(now=now, batch_size=4).expired:
            total += expired
        return total

    totals, errors = in_two_threads(sweep)

    assert errors == []
    assert sum(totals) == 30
    stalls = Event.objects.filter(type="TaskStalled").values("task").annotate(n=Count("position"))
    assert sorted((row["task"], row["n"]) for row in stalls) == sorted((t.pk, 1) for t in tasks)
    assert set(Task.objects.values_list("attempts", "lease_epoch", "lease_holder")) == {(1, 2, None)}
    assert DeadLetter.objects.count() == sum(1 for t in tasks if t.max_attempts == 1)
    lifecycle = OutboxMessage.objects.filter(payload__previous_status="running")
    assert sorted(lifecycle.values_list("key", flat=True)) == sorted(str(t.pk) for t in tasks)
    assert dict(Agent.objects.values_list("name", "consecutive_failures")) == leases_of
    for task in tasks:
        assert_chain_intact(task)


def test_sweeps_crossing_parents_and_children_retry_a_deadlocked_batch(committed_db, settings) -> None:  # type: ignore[no-untyped-def]
    # Sweep A's batch holds parent 1 and child 2, sweep B's parent 2 and child 1; each child is
    # on its last attempt, so dead-lettering it locks its parent, which the other sweep holds.
    # PostgreSQL aborts one batch (4 runs in 5 before the retry existed); it is swept again.
    worker, helper = new_agent("worker"), new_agent("helper")
    pairs = []
    for n in range(2):
        parent, epoch = claim_new(worker, kind="research")
        settings.BACKPLANE_MAX_ATTEMPTS = 1
        child = subtasks.subtask_dispatch(namespace="acme", parent_task_id=parent.pk, step=n, kind="lookup",
                                          input={"n": n}, agent="worker", lease_epoch=epoch).child
        settings.BACKPLANE_MAX_ATTEMPTS = 3
        claim_next(helper, child)
        pairs.append((parent, child))
    (parent_1, child_1), (parent_2, child_2) = pairs
    expire_in_order([parent_1, child_2, parent_2, child_1])
    totals, errors = in_two_threads(lambda: detector.lease_expire_stalled_until_idle(batch_size=2).expired)

    assert errors == [] and sum(totals) == 4
    for parent, child in pairs:
        assert Event.objects.filter(task=parent, type="TaskStalled").count() == 1
        assert Event.objects.filter(task=child, type="TaskDeadLettered").count() == 1
        reports = Event.objects.filter(task=parent, type="SubAgentResultReceived")
        assert [r.payload["child_task_id"] for r in reports] == [str(child.pk)]
        assert_chain_intact(parent)
        assert_chain_intact(child)
