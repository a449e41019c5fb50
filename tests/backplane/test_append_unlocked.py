"""The append path's common case: read without a lock, write with one compare-and-set statement.

``event_append`` outside a transaction first tries ``write_events_if_unmoved``; a task that
moved between the read and the write, a write that is not quiet, or a known idempotency key
sends it down the locked path. These tests run on committed data (the fast path refuses to run
inside a transaction) and check both outcomes against the log itself.
"""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from pytest_django.fixtures import Settings

from backplane.eventlog import services
from backplane.eventlog.errors import StaleLease, TaskClosed
from backplane.eventlog.models import Event, Task
from backplane.eventlog.projections import projection_check
from backplane.eventlog.selectors import chain_verify
from backplane.eventlog.writer import EventDraft, OutboxDraft, write_events_if_unmoved
from backplane.lib.sql_rows import RowLoader
from recovery.leases import lease_claim, lease_heartbeat

pytestmark = pytest.mark.django_db(transaction=True)

_TASKS = RowLoader(Task)


def new_task(namespace: str = "acme") -> Task:
    return services.task_create(namespace=namespace, kind="k", input={}, agent="planner").task


def unlocked_read(task: Task) -> Task:
    """The task as the fast path reads it: a plain SELECT, no lock."""
    loaded = _TASKS.fetch_one(f"SELECT {_TASKS.columns} FROM backplane_task WHERE id = %s", [task.pk])
    assert loaded is not None
    return loaded


def step(n: int, **extra: object) -> EventDraft:
    return EventDraft(type="ReasoningStepCompleted", payload={"step": n, **extra})


def test_it_appends_a_step_in_two_statements_without_a_lock(committed_db: None) -> None:
    task = new_task()
    with CaptureQueriesContext(connection) as queries:
        outcome = services.event_append(namespace="acme", task_id=task.pk, agent="a", draft=step(1))
    sql = [q["sql"] for q in queries.captured_queries]
    assert len(sql) == 2, sql
    assert not any("FOR UPDATE" in s for s in sql)
    event = outcome.events[0]
    assert (event.seq, event.prev_hash, event.position is not None) == (2, task.head_hash, True)
    task.refresh_from_db()
    assert (task.last_seq, task.head_hash) == (2, event.hash)
    assert chain_verify(task=task).valid
    assert list(projection_check(task_ids=[task.pk])) == []


def test_a_task_that_moved_since_the_read_gets_nothing_written(committed_db: None) -> None:
    task = new_task()
    stale = unlocked_read(task)
    services.event_append(namespace="acme", task_id=task.pk, agent="b", draft=step(1))
    assert write_events_if_unmoved(stale, [step(2)], agent="a", now=timezone.now()) is None
    assert Event.objects.filter(task=task).count() == 2
    task.refresh_from_db()
    assert task.last_seq == 2 and chain_verify(task=task).valid


def test_a_heartbeat_between_the_read_and_the_write_keeps_its_deadline(committed_db: None) -> None:
    from backplane.eventlog.models import Agent

    task = new_task()
    agent = Agent.objects.create(name="worker", namespace="acme", kinds=["k"], token_hash="x" * 64)
    claim = lease_claim(agent=agent, kinds=["k"], lease_seconds=30)
    assert claim is not None and claim.task.pk == task.pk
    stale = unlocked_read(task)
    # The heartbeat extends the lease without an event: the write must not put the old deadline back.
    extended = lease_heartbeat(namespace="acme", task_id=task.pk, lease_epoch=claim.lease_epoch)
    events = write_events_if_unmoved(stale, [step(1)], agent="worker", now=timezone.now())
    assert events is not None
    task.refresh_from_db()
    assert task.lease_expires_at == extended.lease_expires_at != stale.lease_expires_at
    assert task.last_seq == events[0].seq and task.head_hash == events[0].hash
    assert list(projection_check(task_ids=[task.pk])) == []


def test_an_expired_lease_is_refused_on_the_fast_path_too(committed_db: None) -> None:
    from backplane.eventlog.models import Agent

    task = new_task()
    agent = Agent.objects.create(name="worker", namespace="acme", kinds=["k"], token_hash="y" * 64)
    claim = lease_claim(agent=agent, kinds=["k"], lease_seconds=30)
    assert claim is not None
    Task.objects.filter(pk=task.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    with pytest.raises(StaleLease):
        services.event_append(namespace="acme", task_id=task.pk, agent="worker", draft=step(1),
                              lease_epoch=claim.lease_epoch)
    assert Event.objects.filter(task=task).count() == 2  # TaskStarted, TaskClaimed


@pytest.mark.parametrize(
    "draft",
    [
        EventDraft(type="TaskCompleted", payload={"output": {}}),
        EventDraft(type="TaskFailed", payload={"error": "no", "retryable": True}),
        EventDraft(type="LeadScored", payload={}, outbox=(OutboxDraft(topic="t", payload={}),)),
    ],
    ids=["completion", "failure", "outbox"],
)
def test_writes_that_are_not_quiet_are_left_to_the_locked_path(committed_db: None, draft: EventDraft) -> None:
    task = new_task()
    assert write_events_if_unmoved(unlocked_read(task), [draft], agent="a", now=timezone.now()) is None
    assert Event.objects.filter(task=task).count() == 1
    # ...which writes them, with their follow-ups and messages.
    outcome = services.event_append(namespace="acme", task_id=task.pk, agent="a", draft=draft)
    assert outcome.events[0].seq == 2


def test_a_closed_task_is_never_written_unlocked(committed_db: None) -> None:
    task = new_task()
    services.event_append(namespace="acme", task_id=task.pk, agent="a",
                          draft=EventDraft(type="TaskCompleted", payload={"output": {}}))
    closed = unlocked_read(task)
    assert write_events_if_unmoved(closed, [step(1)], agent="a", now=timezone.now()) is None


def test_it_refuses_to_run_inside_a_transaction(committed_db: None) -> None:
    from django.db import transaction

    task = new_task()
    with transaction.atomic(), pytest.raises(RuntimeError):
        write_events_if_unmoved(unlocked_read(task), [step(1)], agent="a", now=timezone.now())


def test_racing_appends_fall_back_and_still_make_one_gap_free_chain(committed_db: None) -> None:
    """Threads appending to one task collide on the compare-and-set; the losers take the lock."""
    task = new_task()
    threads, per_thread = 8, 20
    barrier = threading.Barrier(threads)
    errors: list[BaseException] = []

    def work(index: int) -> None:
        try:
            barrier.wait()
            for n in range(per_thread):
                services.event_append(namespace="acme", task_id=task.pk, agent=f"a{index}", draft=step(n, by=index))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            connection.close()

    workers = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=120)
    assert errors == []
    task.refresh_from_db()
    seqs = list(Event.objects.filter(task=task).order_by("seq").values_list("seq", flat=True))
    assert seqs == list(range(1, threads * per_thread + 2))
    assert task.last_seq == len(seqs) and chain_verify(task=task).valid
    assert list(projection_check(task_ids=[task.pk])) == []


def test_an_unlocked_append_still_tells_open_pages(committed_db: None, settings: Settings,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The dashboard's live notice observes quiet writes too, after the statement commits."""
    from dashboard import live

    settings.BACKPLANE_LIVE_NOTICES = True
    published: list[dict[str, object]] = []
    monkeypatch.setattr(live.publisher, "publish", published.append)
    task = new_task()
    published.clear()
    with CaptureQueriesContext(connection) as queries:
        outcome = services.event_append(namespace="acme", task_id=task.pk, agent="a", draft=step(1))
    assert not any("FOR UPDATE" in q["sql"] for q in queries.captured_queries)  # the unlocked path
    assert published == [{"task_id": str(task.pk), "seq": 2, "position": outcome.events[0].position,
                           "type": "ReasoningStepCompleted", "status": "pending", "namespace": "acme",
                           "parent_id": None}]


def test_quiet_writes_run_only_the_observing_follow_ups(committed_db: None) -> None:
    from backplane.eventlog import writer

    seen: list[str] = []

    def reacts(written: writer.WrittenEvents) -> None:
        seen.append("reacts:" + written.events[-1].type)

    def observes(written: writer.WrittenEvents) -> None:
        seen.append("observes:" + written.events[-1].type)

    saved = list(writer._follow_ups)
    try:
        writer.register_follow_up(reacts)
        writer.register_follow_up(observes, on_quiet_writes=True)
        task = new_task()
        seen.clear()
        services.event_append(namespace="acme", task_id=task.pk, agent="a", draft=step(1))
        services.event_append(namespace="acme", task_id=task.pk, agent="a",
                              draft=EventDraft(type="TaskCompleted", payload={"output": {}}))
    finally:
        writer._follow_ups[:] = saved
    assert seen == ["observes:ReasoningStepCompleted", "reacts:TaskCompleted", "observes:TaskCompleted"]


def task_row_updates() -> tuple[int, int]:
    """The task table's updates so far and how many of them were HOT, as PostgreSQL counts them.
    Counts reach the shared statistics when a backend goes idle, at most once a second unless
    asked: this session asks, then reads them in a statement of their own."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_force_next_flush()")
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute("SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relname = 'backplane_task'")
        updates, hot = cursor.fetchone()
    return updates, hot


def test_a_step_on_a_running_task_updates_its_row_in_place(committed_db: None) -> None:
    """No indexed column of the task row moves on a quiet append (retention's indexes are on
    finished_last_event_at, which only finished tasks have): PostgreSQL can write the new row
    version on the same page with no new index entry, a HOT update, a third more appends a
    second (docs/benchmarks.md)."""
    from backplane.eventlog.models import Agent

    task = new_task()
    agent = Agent.objects.create(name="worker", namespace="acme", kinds=["k"], token_hash="x" * 64)
    claim = lease_claim(agent=agent, kinds=["k"], lease_seconds=60)
    assert claim is not None
    before = task_row_updates()
    for n in range(20):
        services.event_append(namespace="acme", task_id=task.pk, agent="worker", draft=step(n),
                              lease_epoch=claim.lease_epoch)
    updates, hot = (after - earlier for after, earlier in zip(task_row_updates(), before, strict=True))
    assert updates == 20
    # Pruning makes room on the page between updates; an update that finds none goes elsewhere.
    assert hot >= 18, (updates, hot)
    task.refresh_from_db()
    assert (task.status, task.last_seq, task.finished_last_event_at) == ("running", 22, None)


# --- the head this process last wrote (backplane/eventlog/known_heads.py) ---------------------


def claimed(task: Task, name: str = "worker") -> int:
    from backplane.eventlog.models import Agent

    agent = Agent.objects.create(name=name, namespace="acme", kinds=["k"], token_hash=name.ljust(64, "x"))
    claim = lease_claim(agent=agent, kinds=["k"], lease_seconds=30)
    assert claim is not None and claim.task.pk == task.pk
    return claim.lease_epoch


def test_the_next_step_through_the_same_process_is_one_statement(committed_db: None) -> None:
    task = new_task()
    epoch = claimed(task)
    services.event_append(namespace="acme", task_id=task.pk, agent="worker", draft=step(1), lease_epoch=epoch)
    with CaptureQueriesContext(connection) as queries:
        second = services.event_append(namespace="acme", task_id=task.pk, agent="worker", draft=step(2),
                                       lease_epoch=epoch).events[0]
    assert len(queries.captured_queries) == 1, [q["sql"] for q in queries.captured_queries]
    assert "UPDATE backplane_task" in queries.captured_queries[0]["sql"]
    # A known head keeps no input (up to the payload limit, for each of up to 1,024 tasks).
    known = services.known_heads.take(task.pk)
    assert known is not None and {"input", "metadata"}.isdisjoint(known.__dict__)
    task.refresh_from_db()
    assert (task.last_seq, task.head_hash, second.seq) == (4, second.hash, 4)
    assert chain_verify(task=task).valid and list(projection_check(task_ids=[task.pk])) == []


def test_a_known_head_is_a_copy_that_the_writer_may_change(committed_db: None) -> None:
    task = new_task()
    services.event_append(namespace="acme", task_id=task.pk, agent="worker", draft=step(1))
    first, second = services.known_heads.take(task.pk), services.known_heads.take(task.pk)
    assert first is not None and second is not None and first is not second
    task.refresh_from_db()
    assert (first.pk, first.last_seq, first.head_hash, first.status) == (task.pk, 2, task.head_hash, "pending")
    assert (first._state.db, first._state.adding) == ("default", False)
    # Numbering an event changes the taken copy in memory; the known head stays as committed.
    first.last_seq, first.head_hash = 3, "f" * 64
    assert first._state is not second._state
    assert (second.last_seq, second.head_hash) == (2, task.head_hash)


def test_a_write_from_elsewhere_sends_the_next_step_to_a_fresh_read(committed_db: None) -> None:
    task = new_task()
    epoch = claimed(task)
    services.event_append(namespace="acme", task_id=task.pk, agent="worker", draft=step(1), lease_epoch=epoch)
    known = services.known_heads.take(task.pk)  # seq 3, as this process wrote it
    assert known is not None and known.last_seq == 3
    # Another process, which knows nothing of this task, appends meanwhile.
    services.known_heads.forget(task.pk)
    services.event_append(namespace="acme", task_id=task.pk, agent="worker", draft=step(2), lease_epoch=epoch)
    services.known_heads.remember(known)
    with CaptureQueriesContext(connection) as queries:
        third = services.event_append(namespace="acme", task_id=task.pk, agent="worker", draft=step(3),
                                      lease_epoch=epoch).events[0]
    # The compare-and-set on the known head found the task moved; a read and a write followed.
    assert len(queries.captured_queries) == 3
    assert (third.seq, third.prev_hash) == (5, Event.objects.get(task_id=task.pk, seq=4).hash)
    task.refresh_from_db()
    assert chain_verify(task=task).valid and list(projection_check(task_ids=[task.pk])) == []


def test_a_lease_a_heartbeat_extended_past_the_known_deadline_is_still_alive(committed_db: None) -> None:
    task = new_task()
    epoch = claimed(task)
    services.event_append(namespace="acme", task_id=task.pk, agent="worker", draft=step(1), lease_epoch=epoch)
    known = services.known_heads.take(task.pk)
    assert known is not None and known.lease_expires_at is not None
    later = known.lease_expires_at - timedelta(seconds=5)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(timezone, "now", lambda: later)
        lease_heartbeat(namespace="acme", task_id=task.pk, lease_epoch=epoch)  # a deadline 30 s on
        # Past the deadline this process knows, within the one the heartbeat set.
        patch.setattr(timezone, "now", lambda: known.lease_expires_at + timedelta(seconds=10))
        outcome = services.event_append(namespace="acme", task_id=task.pk, agent="worker", draft=step(2),
                                        lease_epoch=epoch)
    assert outcome.events[0].seq == 4


def test_a_refusal_is_decided_on_a_fresh_read_never_on_a_known_head(committed_db: None) -> None:
    task = new_task()
    epoch = claimed(task)
    services.event_append(namespace="acme", task_id=task.pk, agent="worker", draft=step(1), lease_epoch=epoch)
    # An operator's rebuild changed the row without an event: the known head is behind it.
    Task.objects.filter(pk=task.pk).update(status="completed", lease_holder=None)
    with pytest.raises(TaskClosed):
        services.event_append(namespace="acme", task_id=task.pk, agent="worker", draft=step(2))
    assert Event.objects.filter(task_id=task.pk).count() == 3
