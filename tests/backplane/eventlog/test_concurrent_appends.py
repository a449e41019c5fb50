"""Appends from many real connections at once: one task serializes, the chain stays whole."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest
from django.db import connection

from backplane.eventlog import services
from backplane.eventlog.errors import SeqConflict
from backplane.eventlog.models import Event, Task
from backplane.eventlog.writer import EventDraft
from backplane.integrity.verification import chain_check

pytestmark = pytest.mark.django_db(transaction=True)


def run_in_threads(count: int, work: Callable[[int], None]) -> list[BaseException]:
    errors: list[BaseException] = []
    barrier = threading.Barrier(count)

    def runner(index: int) -> None:
        try:
            barrier.wait()
            work(index)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)
        finally:
            connection.close()  # each thread has its own connection; give it back

    threads = [threading.Thread(target=runner, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    return errors


def new_task() -> Task:
    return services.task_create(namespace="acme", kind="k", input={}, agent="planner").task


def test_parallel_appends_to_one_task_get_gap_free_seqs_and_a_valid_chain(committed_db: None) -> None:
    task = new_task()
    threads, per_thread = 8, 25

    def work(index: int) -> None:
        for n in range(per_thread):
            services.event_append(
                namespace="acme", task_id=task.pk, agent=f"agent-{index}",
                draft=EventDraft(type="ReasoningStepCompleted", payload={"step": n, "by": index}),
            )

    assert run_in_threads(threads, work) == []
    task.refresh_from_db()
    seqs = list(Event.objects.filter(task=task).order_by("seq").values_list("seq", flat=True))
    assert seqs == list(range(1, threads * per_thread + 2))
    assert chain_check(task=task).valid and task.last_seq == len(seqs)


def test_expected_seq_lets_exactly_one_of_the_racers_win(committed_db: None) -> None:
    task = new_task()
    wins: list[int] = []
    conflicts: list[int] = []

    def work(index: int) -> None:
        try:
            services.event_append(
                namespace="acme", task_id=task.pk, agent=f"agent-{index}", expected_seq=1,
                draft=EventDraft(type="Decided", payload={"by": index}),
            )
            wins.append(index)
        except SeqConflict as exc:
            assert exc.details["last_seq"] == 2
            conflicts.append(index)

    assert run_in_threads(12, work) == []
    assert len(wins) == 1 and len(conflicts) == 11
    assert Event.objects.filter(task=task).count() == 2


def test_the_same_idempotency_key_from_many_connections_writes_once(committed_db: None) -> None:
    task = new_task()
    replayed: list[bool] = []

    def work(index: int) -> None:
        outcome = services.event_append(
            namespace="acme", task_id=task.pk, agent="agent",
            draft=EventDraft(type="EmailSent", payload={"to": "bob"}, idempotency_key="email-1"),
        )
        replayed.append(outcome.replayed)

    assert run_in_threads(10, work) == []
    assert sorted(replayed) == [False] + [True] * 9
    assert Event.objects.filter(task=task, type="EmailSent").count() == 1


def test_appends_to_different_tasks_do_not_block_each_other(committed_db: None) -> None:
    tasks = [new_task() for _ in range(6)]
    holding = threading.Event()
    release = threading.Event()

    # One connection holds task 0's row lock in an open transaction...
    def hold_lock() -> None:
        from django.db import transaction

        with transaction.atomic():
            Task.objects.select_for_update().get(pk=tasks[0].pk)
            holding.set()
            release.wait(30)
        connection.close()

    holder = threading.Thread(target=hold_lock)
    holder.start()
    assert holding.wait(10)

    # ...while the other tasks take appends from other connections.
    def work(index: int) -> None:
        task = tasks[index + 1]
        for n in range(10):
            services.event_append(namespace="acme", task_id=task.pk, agent="a",
                                  draft=EventDraft(type="ReasoningStepCompleted", payload={"step": n}))

    errors = run_in_threads(5, work)
    release.set()
    holder.join()
    assert errors == []
    for task in tasks[1:]:
        task.refresh_from_db()
        assert task.last_seq == 11 and chain_check(task=task).valid
