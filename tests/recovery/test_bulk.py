"""Bulk jobs: the dry run freezes a list, the executor settles it chunk by chunk, each item once."""

from __future__ import annotations

import hashlib
import threading
import time
import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection, transaction
from django.utils import timezone

from backplane.celery import app as celery_app
from backplane.delivery.models import DeadLetter
from backplane.eventlog import services
from backplane.eventlog.errors import InvalidInput, NotFound
from backplane.eventlog.models import Agent, Event, Task
from backplane.eventlog.writer import EventDraft, lock_task, write_events
from recovery import bulk, detector, leases
from recovery import tasks as recovery_tasks
from recovery.errors import JobConflict
from recovery.models import BulkJob, BulkJobDecision, BulkJobItem
from tests.conftest import celery_messages_taken, check_projections

REASON = "deploy 412 failed them; fixed in 413"


# --- making tasks in the states the actions meet ------------------------------------------------


def failed_task(kind: str = "lead-qualification", namespace: str = "acme") -> Task:
    task = services.task_create(namespace=namespace, kind=kind, input={"n": uuid.uuid4().hex}, agent="planner").task
    with transaction.atomic():
        locked = lock_task(namespace=None, task_id=task.pk)
        write_events(locked, [EventDraft(type="TaskFailed", payload={"error": "bad deploy", "retryable": False})],
                     agent="planner", now=timezone.now())
    task.refresh_from_db()
    assert task.status == "failed"
    return task


def dead_lettered_tasks(count: int, kind: str = "enrich") -> list[Task]:
    """``count`` tasks whose only attempt stalled: each dead-lettered with a pending dead letter.
    Every claim is taken before the sweep, so the stalls reach the agent's breaker only after."""
    agent = Agent.objects.filter(name="worker").first() or services.agent_create(name="worker", namespace="acme").agent
    for n in range(count):
        services.task_create(namespace="acme", kind=kind, input={"n": n}, agent="planner", max_attempts=1)
    claimed = []
    for _ in range(count):
        claim = leases.lease_claim(agent=agent, kinds=[kind], lease_seconds=30)
        assert claim is not None
        claimed.append(claim.task.pk)
    Task.objects.filter(pk__in=claimed).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    detector.lease_expire_stalled_until_idle(batch_size=500)
    tasks = list(Task.objects.filter(pk__in=claimed).order_by("created_at", "id"))
    assert {t.status for t in tasks} == {"dead_lettered"}
    return tasks


def plan(action: str = "retry", selection: dict[str, Any] | None = None, **kwargs: Any) -> BulkJob:
    kwargs.setdefault("reason", REASON)
    kwargs.setdefault("created_by", "user:rita")
    kwargs.setdefault("rate_per_second", 0)
    return bulk.bulk_job_plan(action=action, selection=selection or {"filter": {"status": "failed"}}, **kwargs)


def start(job: BulkJob) -> BulkJob:
    return bulk.bulk_job_start(job_id=job.pk, selection_hash=job.selection_hash, decided_by="user:rita")


def run_to_end(job: BulkJob) -> BulkJob:
    while bulk.bulk_job_step(job.pk):
        pass
    job.refresh_from_db()
    return job


def items(job: BulkJob) -> list[tuple[str, str, str]]:
    return list(job.items.order_by("index").values_list("target", "status", "detail"))


def job_rows() -> tuple[int, int, int]:
    return BulkJob.objects.count(), BulkJobItem.objects.count(), BulkJobDecision.objects.count()


# --- planning ---------------------------------------------------------------------------------


def test_a_dry_run_freezes_the_filter_into_items_with_what_will_happen(db: None) -> None:
    failed = [failed_task() for _ in range(3)]
    services.task_create(namespace="acme", kind="lead-qualification", input={"open": 1}, agent="planner")
    job = plan("retry", {"filter": {"kind": "lead-qualification"}})
    assert (job.status, job.total, job.created_by) == ("draft", 4, "user:rita")
    planned = list(job.items.order_by("index").values_list("target", "planned", "status"))
    assert planned[:3] == [(str(t.pk), "retry", "pending") for t in failed]
    assert planned[3][1] == "skip: pending, not failed"
    assert job.selection_hash == hashlib.sha256("\n".join(p[0] for p in planned).encode()).hexdigest()
    assert job.selection_hash == bulk.selection_hash_of([p[0] for p in planned])
    assert list(job.decisions.values_list("action", "decided_by", "reason")) == [("create", "user:rita", REASON)]
    # Nothing was done to the tasks.
    assert set(Task.objects.filter(pk__in=[t.pk for t in failed]).values_list("status", flat=True)) == {"failed"}


def test_explicit_ids_keep_their_order_and_an_unknown_id_is_planned_as_a_skip(make_task: Callable[..., Task]) -> None:
    first, second = make_task(), make_task()
    missing = uuid.uuid4()
    job = plan("cancel", {"ids": [str(second.pk), str(missing), str(first.pk), str(second.pk)]})
    assert list(job.items.order_by("index").values_list("target", "planned")) == [
        (str(second.pk), "cancel"), (str(missing), "skip: no such task"), (str(first.pk), "cancel")]


@pytest.mark.parametrize(("action", "selection", "extra", "field"), [
    ("reboot", {"filter": {"status": "failed"}}, {}, "action"),
    ("retry", {"filter": {"status": "failed"}}, {"reason": "  "}, "reason"),
    ("retry", {"ids": []}, {}, "ids"),
    ("retry", {"ids": ["not-a-uuid"]}, {}, "ids"),
    ("retry", {"filter": {"status": "failed", "colour": "red"}}, {}, "filter"),
    ("retry", {"filter": {}, "ids": []}, {}, "selection"),
    ("retry", {"filter": {"kind": "nothing-of-this-kind"}}, {}, "selection"),
    ("retry", {"filter": {"status": "failed"}}, {"options": {"compensate": True}}, "options"),
    ("cancel", {"filter": {"status": "failed"}}, {"options": {"compensate": "yes"}}, "options.compensate"),
    ("dead_letter_requeue", {"ids": [0]}, {}, "ids"),
    ("retry", {"filter": {"status": "failed"}}, {"rate_per_second": -1}, "rate_per_second"),
])
def test_bad_input_is_refused_and_writes_nothing(db: None, action: str, selection: dict[str, Any],
                                                 extra: dict[str, Any], field: str) -> None:
    failed_task()
    before = job_rows()
    with pytest.raises(InvalidInput) as refused:
        plan(action, selection, **extra)
    assert field in refused.value.details
    assert job_rows() == before


def test_a_selection_over_the_limit_is_refused_and_writes_nothing(make_task: Callable[..., Task],
                                                                 settings: Any) -> None:
    settings.BACKPLANE_BULK_MAX_ITEMS = 3
    for _ in range(4):
        make_task()
    with pytest.raises(InvalidInput, match="more than 3 items"):
        plan("cancel", {"filter": {"namespace": "acme"}})
    assert job_rows() == (0, 0, 0)
    settings.BACKPLANE_BULK_MAX_ITEMS = 4
    assert plan("cancel", {"filter": {"namespace": "acme"}}).total == 4


def test_planning_100_000_items_takes_seconds(db: None) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO backplane_deadletter (source, reference, topic, payload, original_payload, error, attempts,"
            " status, created_at, decided_by, reason, history)"
            " SELECT 'outbox', g::text, 'crm.leads', '{}', NULL, 'timeout', 5, 'pending', now(), NULL, '', '[]'"
            "   FROM generate_series(1, 100000) g")
    started = time.monotonic()
    job = plan("dead_letter_discard", {"filter": {"topic": "crm"}})
    assert job.total == 100_000
    assert time.monotonic() - started < 10


# --- deciding on a job -----------------------------------------------------------------------------


def test_a_job_starts_once_and_only_with_its_hash(db: None) -> None:
    failed_task()
    job = plan()
    with pytest.raises(JobConflict) as wrong:
        bulk.bulk_job_start(job_id=job.pk, selection_hash="0" * 64, decided_by="user:rita")
    assert wrong.value.details == {"status": "draft", "selection_hash": job.selection_hash}
    job.refresh_from_db()
    assert job.status == "draft" and job.decisions.count() == 1
    start(job)
    with pytest.raises(JobConflict) as twice:
        start(job)
    assert twice.value.details["status"] == "running"
    assert list(job.decisions.order_by("at").values_list("action", flat=True)) == ["create", "start"]
    with pytest.raises(NotFound):
        bulk.bulk_job_pause(job_id=10**9, decided_by="user:rita", reason="x")


def test_a_started_job_queues_its_runner_on_the_broker_by_the_task_s_name(
    db: None, django_capture_on_commit_callbacks: Callable[..., Any]
) -> None:
    # bulk.py enqueues the runner by its wire name (it cannot import the task module, which
    # imports it): a name the worker does not know would leave every started job unrun.
    failed_task()
    job = plan()
    with django_capture_on_commit_callbacks(execute=True):
        start(job)
    assert (bulk.RUN_BULK_JOB, [job.pk]) in celery_messages_taken()
    assert celery_app.tasks[bulk.RUN_BULK_JOB].run is recovery_tasks.run_bulk_job.run


def test_pause_resume_and_abort_are_decisions_with_who_and_why(db: None) -> None:
    failed_task()
    job = start(plan())
    with pytest.raises(JobConflict):
        bulk.bulk_job_resume(job_id=job.pk, decided_by="user:rita", reason="go on")
    with pytest.raises(InvalidInput):
        bulk.bulk_job_pause(job_id=job.pk, decided_by="user:rita", reason="")
    bulk.bulk_job_pause(job_id=job.pk, decided_by="user:sam", reason="look first")
    assert bulk.bulk_job_step(job.pk) == 0
    bulk.bulk_job_resume(job_id=job.pk, decided_by="user:sam", reason="looked")
    bulk.bulk_job_abort(job_id=job.pk, decided_by="user:rita", reason="wrong list")
    with pytest.raises(JobConflict):
        bulk.bulk_job_abort(job_id=job.pk, decided_by="user:rita", reason="again")
    assert list(job.decisions.order_by("at").values_list("action", "decided_by", "reason"))[2:] == [
        ("pause", "user:sam", "look first"), ("resume", "user:sam", "looked"), ("abort", "user:rita", "wrong list")]


# --- each action -----------------------------------------------------------------------------------


def test_retry_requeues_dead_letters_and_retries_failed_tasks_and_skips_the_rest(db: None) -> None:
    dead = dead_lettered_tasks(2, kind="lead-qualification")
    failed = failed_task()
    completed = services.task_create(namespace="acme", kind="lead-qualification", input={}, agent="planner").task
    job = run_to_end(start(plan("retry", {"ids": [str(t.pk) for t in (*dead, failed, completed)]})))
    assert (job.status, job.done, job.skipped, job.failed) == ("finished", 3, 1, 0)
    assert items(job) == [
        (str(dead[0].pk), "done", "dead letter requeued"), (str(dead[1].pk), "done", "dead letter requeued"),
        (str(failed.pk), "done", "sent back to pending"), (str(completed.pk), "skipped", "pending, not failed")]
    for task in (*dead, failed):
        task.refresh_from_db()
        assert (task.status, task.attempts) == ("pending", 0)
    assert DeadLetter.objects.filter(task__in=dead, status="requeued", decided_by="user:rita").count() == 2
    retried = Event.objects.get(task=failed, type="TaskRetried")
    assert retried.payload == {"retried_by": "user:rita", "reason": REASON, "bulk_job_id": job.pk}
    assert list(job.decisions.order_by("at").values_list("action", flat=True)) == ["create", "start", "finish"]
    assert check_projections()[0] == 0


def test_cancel_cancels_open_tasks_and_skips_closed_ones(make_task: Callable[..., Task]) -> None:
    open_tasks = [make_task() for _ in range(3)]
    failed = failed_task()
    job = run_to_end(start(plan("cancel", {"ids": [str(t.pk) for t in (*open_tasks, failed)]})))
    assert (job.done, job.skipped, job.failed) == (3, 1, 0)
    assert items(job)[-1] == (str(failed.pk), "skipped", "already failed")
    assert set(Task.objects.filter(pk__in=[t.pk for t in open_tasks]).values_list("status", flat=True)) == {
        "cancelled"}
    assert Event.objects.filter(type="TaskCancelled", payload__cancelled_by="user:rita").count() == 3


def test_fork_from_failure_forks_each_failed_task_once(make_task: Callable[..., Task]) -> None:
    failed = failed_task()
    never_failed = make_task()
    job = plan("fork_from_failure", {"ids": [str(failed.pk), str(never_failed.pk)]})
    assert list(job.items.order_by("index").values_list("planned", flat=True)) == [
        "fork from just before its last failure", "skip: it never failed"]
    job = run_to_end(start(job))
    assert (job.done, job.skipped) == (1, 1)
    assert items(job)[1] == (str(never_failed.pk), "skipped", "it never failed")
    forked = Event.objects.filter(type="TaskForked", payload__source_task_id=str(failed.pk))
    assert forked.count() == 1
    assert str(forked.get().task_id) in items(job)[0][2]


def test_dead_letter_discard_decides_pending_ones_and_skips_those_decided_meanwhile(db: None) -> None:
    dead = dead_lettered_tasks(3)
    letters = list(DeadLetter.objects.filter(task__in=dead).order_by("created_at", "id"))
    job = plan("dead_letter_discard", {"filter": {"source": "task"}})
    assert job.total == 3
    from recovery.dead_letters import dead_letter_requeue

    dead_letter_requeue(dead_letter_id=letters[1].pk, decided_by="user:sam", reason="mine")
    job = run_to_end(start(job))
    assert [(status, detail) for _, status, detail in items(job)] == [
        ("done", "discarded"), ("skipped", "this dead letter was already requeued by user:sam"), ("done", "discarded")]
    assert DeadLetter.objects.filter(status="discarded", decided_by="user:rita").count() == 2


def test_an_item_that_raises_is_failed_with_its_error_and_the_rest_of_its_chunk_is_done(db: None) -> None:
    dead = dead_lettered_tasks(5)
    # An outbox dead letter whose message was pruned cannot be requeued: the decision raises.
    pruned = DeadLetter.objects.create(source="outbox", reference="gone", topic="crm", payload={}, error="x",
                                       attempts=5, status="pending", created_at=timezone.now())
    letters = [d.pk for d in DeadLetter.objects.filter(task__in=dead).order_by("id")]
    job = run_to_end(start(plan("dead_letter_requeue", {"ids": [*letters[:2], pruned.pk, *letters[2:]]},
                                chunk_size=10)))
    assert (job.done, job.skipped, job.failed) == (5, 0, 1)
    assert items(job)[2] == (str(pruned.pk), "failed", "the outbox message is gone (pruned)")
    assert DeadLetter.objects.filter(pk__in=letters, status="requeued").count() == 5
    # Each requeue was written once, whatever the splitting rolled back.
    assert Event.objects.filter(type="DeadLetterRequeued").count() == 5


# --- the executor's guarantees ------------------------------------------------------------------


def test_the_executed_list_is_the_dry_run_list_even_when_the_filter_would_now_match_more(db: None) -> None:
    first = [failed_task() for _ in range(3)]
    job = plan("retry", {"filter": {"status": "failed"}})
    shown = [target for target, *_ in items(job)]
    late = failed_task()  # matches the filter now, but was not in the list that was shown
    job = run_to_end(start(job))
    assert shown == [str(t.pk) for t in first]
    assert [target for target, status, _ in items(job) if status == "done"] == shown
    late.refresh_from_db()
    assert late.status == "failed"


def test_a_step_settles_one_chunk_and_abort_stops_the_job_within_one_chunk(make_task: Callable[..., Task]) -> None:
    tasks = [make_task() for _ in range(10)]
    job = start(plan("cancel", {"ids": [str(t.pk) for t in tasks]}, chunk_size=4))
    assert bulk.bulk_job_step(job.pk) == 4
    bulk.bulk_job_abort(job_id=job.pk, decided_by="user:rita", reason="stop")
    assert bulk.bulk_job_step(job.pk) == 0
    job.refresh_from_db()
    assert (job.status, job.done) == ("aborted", 4)
    assert job.items.filter(status="pending").count() == 6
    assert Task.objects.filter(status="cancelled").count() == 4


@pytest.mark.django_db(transaction=True)
def test_abort_during_a_chunk_lets_that_chunk_finish_and_starts_no_other(committed_db: None) -> None:
    tasks = [services.task_create(namespace="acme", kind="k", input={"n": n}, agent="p").task for n in range(9)]
    job = start(plan("cancel", {"ids": [str(t.pk) for t in tasks]}, chunk_size=3))
    locked = threading.Event()
    release = threading.Event()

    # One task of the second chunk is held locked by someone else, so the chunk waits inside
    # its transaction while the abort commits.
    def hold() -> None:
        with transaction.atomic():
            Task.objects.select_for_update().get(pk=tasks[4].pk)
            locked.set()
            release.wait(10)
        connection.close()

    assert bulk.bulk_job_step(job.pk) == 3
    holder = threading.Thread(target=hold)
    holder.start()
    assert locked.wait(5)
    def step() -> None:
        bulk.bulk_job_step(job.pk)
        connection.close()

    stepping = threading.Thread(target=step)
    stepping.start()
    time.sleep(0.3)
    bulk.bulk_job_abort(job_id=job.pk, decided_by="user:rita", reason="stop now")
    release.set()
    holder.join()
    stepping.join()
    assert bulk.bulk_job_step(job.pk) == 0
    job.refresh_from_db()
    assert (job.status, job.done) == ("aborted", 6)


@pytest.mark.django_db(transaction=True)
def test_two_runners_of_one_job_never_settle_an_item_twice(committed_db: None) -> None:
    tasks = [services.task_create(namespace="acme", kind="k", input={"n": n}, agent="p").task for n in range(60)]
    job = start(plan("cancel", {"ids": [str(t.pk) for t in tasks]}, chunk_size=5))

    def runner() -> None:
        while bulk.bulk_job_step(job.pk):
            pass
        connection.close()

    threads = [threading.Thread(target=runner) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    job.refresh_from_db()
    assert (job.status, job.done, job.skipped, job.failed) == ("finished", 60, 0, 0)
    assert Event.objects.filter(type="TaskCancelled").count() == 60
    assert job.decisions.filter(action="finish").count() == 1


def test_the_runner_holds_a_lease_that_a_second_runner_cannot_take_until_it_runs_out(
        make_task: Callable[..., Task]) -> None:
    job = start(plan("cancel", {"ids": [str(make_task().pk)]}))
    until = bulk.bulk_job_claim_runner(job.pk)
    assert until is not None
    assert bulk.bulk_job_claim_runner(job.pk) is None
    assert bulk.bulk_jobs_unattended() == []
    # The holder was killed: once its lease has run out the job is unattended and claimable.
    later = until + timedelta(seconds=1)
    assert bulk.bulk_jobs_unattended(now=later) == [job.pk]
    assert bulk.bulk_job_claim_runner(job.pk, now=later) is not None


def test_the_runner_runs_the_job_to_the_end_and_lets_go(make_task: Callable[..., Task]) -> None:
    job = start(plan("cancel", {"ids": [str(make_task().pk) for _ in range(7)]}, chunk_size=3))
    assert bulk.bulk_job_run(job.pk, seconds=10) is False
    job.refresh_from_db()
    assert (job.status, job.done, job.runner_until) == ("finished", 7, None)


def test_the_rate_limit_is_honoured(make_task: Callable[..., Task]) -> None:
    job = start(plan("cancel", {"ids": [str(make_task().pk) for _ in range(30)]}, rate_per_second=20,
                     chunk_size=100))
    assert bulk.chunk_size_of(job) == 20
    started = time.monotonic()
    bulk.bulk_job_run(job.pk, seconds=10)
    # 30 items at 20 a second: the second chunk (10 items) may start no sooner than 1 s in.
    assert time.monotonic() - started >= 1.0
    job.refresh_from_db()
    assert (job.status, job.done) == ("finished", 30)


def test_retry_failed_makes_a_new_draft_job_over_the_failed_items(db: None) -> None:
    dead = dead_lettered_tasks(2)
    pruned = DeadLetter.objects.create(source="outbox", reference="gone", topic="crm", payload={}, error="x",
                                       attempts=5, status="pending", created_at=timezone.now())
    letters = [d.pk for d in DeadLetter.objects.filter(task__in=dead).order_by("id")]
    job = run_to_end(start(plan("dead_letter_requeue", {"ids": [letters[0], pruned.pk, letters[1]]})))
    assert job.failed == 1
    again = bulk.bulk_job_retry_failed(job_id=job.pk, decided_by="user:sam", reason="message restored")
    assert (again.status, again.retry_of_id, again.total, again.action) == ("draft", job.pk, 1, job.action)
    assert items(again) == [(str(pruned.pk), "pending", "")]
    with pytest.raises(InvalidInput):
        bulk.bulk_job_retry_failed(job_id=again.pk, decided_by="user:sam", reason="nothing failed")
