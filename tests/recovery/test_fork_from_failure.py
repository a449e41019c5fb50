"""Fork from failure over many tasks, as a bulk job: the dry run writes nothing, the job forks
exactly its frozen list once, each task after the event before its last failure."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import transaction
from django.utils import timezone

from backplane.eventlog import forks, services
from backplane.eventlog.errors import InvalidInput
from backplane.eventlog.models import Event, Task
from backplane.eventlog.writer import EventDraft, lock_task, write_events
from recovery import bulk
from recovery.errors import JobConflict
from recovery.models import BulkJob, BulkJobItem

pytestmark = pytest.mark.django_db


def failed_task(n: int) -> Task:
    task = services.task_create(namespace="acme", kind="k", input={"n": n}, agent="a", max_attempts=1).task
    services.event_append_batch(namespace="acme", task_id=task.pk, agent="a", drafts=[
        EventDraft(type="ReasoningStepCompleted", payload={"step": 1}),
        EventDraft(type="TaskFailed", payload={"error": "boom", "retryable": False}),
    ])
    return Task.objects.get(pk=task.pk)


def run_to_the_end(job: BulkJob) -> BulkJob:
    while bulk.bulk_job_step(job.pk):
        pass
    job.refresh_from_db()
    return job


def test_the_dry_run_writes_nothing_and_the_job_forks_its_list_once() -> None:
    failed = [failed_task(n) for n in range(3)]
    running = services.task_create(namespace="acme", kind="k", input={}, agent="a").task
    sandbox = forks.task_fork(namespace="acme", source_task_id=failed[0].pk, at_seq=1, reason="replay",
                              forked_by="a", by_staff=False, sandbox=True).task
    ids = [str(t.pk) for t in [*failed, running, sandbox]]
    events = Event.objects.count()

    job = bulk.bulk_job_plan(action="fork_from_failure", selection={"ids": ids + ids[:1]}, reason="bad deploy",
                             created_by="alice")
    assert list(job.items.order_by("index").values_list("target", "planned")) == [
        *((str(t.pk), "fork from just before its last failure") for t in failed),
        (str(running.pk), "skip: it never failed"),
        (str(sandbox.pk), "skip: a sandbox is replayed, not forked into production")]
    assert Event.objects.count() == events

    bulk.bulk_job_start(job_id=job.pk, selection_hash=job.selection_hash, decided_by="alice")
    job = run_to_the_end(job)
    assert list(job.items.order_by("index").values_list("status", flat=True)) == [
        "done", "done", "done", "skipped", "skipped"]
    made = Task.objects.filter(forked_from__in=failed, sandbox=False)
    assert made.count() == 3 and {t.forked_at_seq for t in made} == {2}
    forked = Event.objects.get(task=made[0], seq=2)
    assert forked.payload["by_staff"] is True and forked.payload["forked_by"] == "alice"

    with pytest.raises(JobConflict):  # started once only
        bulk.bulk_job_start(job_id=job.pk, selection_hash=job.selection_hash, decided_by="alice")
    assert run_to_the_end(job).done == 3
    assert Task.objects.filter(forked_from__in=failed, sandbox=False).count() == 3
    # Another job over the same task is another decision: it forks again, under its own id.
    second = bulk.bulk_job_plan(action="fork_from_failure", selection={"ids": ids[:1]}, reason="again",
                                created_by="alice")
    bulk.bulk_job_start(job_id=second.pk, selection_hash=second.selection_hash, decided_by="alice")
    assert run_to_the_end(second).done == 1
    assert Task.objects.filter(forked_from=failed[0], sandbox=False).count() == 2


def test_a_stall_that_dead_letters_is_one_failure() -> None:
    task = services.task_create(namespace="acme", kind="k", input={}, agent="a").task
    services.event_append(namespace="acme", task_id=task.pk, agent="a",
                          draft=EventDraft(type="ReasoningStepCompleted", payload={"step": 1}))

    with transaction.atomic():
        locked = lock_task(namespace=None, task_id=task.pk)
        write_events(locked, [EventDraft(type="TaskStalled", payload={}), EventDraft(type="TaskDeadLettered",
                                                                                      payload={})],
                     agent=None, now=timezone.now())
    assert forks.failure_point(Task.objects.get(pk=task.pk)) == 2


def test_too_many_at_once_is_refused_and_plans_nothing(settings: Any) -> None:
    settings.BACKPLANE_BULK_MAX_ITEMS = 2
    with pytest.raises(InvalidInput, match="more than 2 items"):
        bulk.bulk_job_plan(action="fork_from_failure", selection={"ids": [str(failed_task(n).pk) for n in range(3)]},
                           reason="x", created_by="a")
    assert not BulkJob.objects.exists() and not BulkJobItem.objects.exists()


def test_the_last_failure_counts_not_an_earlier_one() -> None:
    task = services.task_create(namespace="acme", kind="k", input={}, agent="a", max_attempts=2).task
    services.event_append_batch(namespace="acme", task_id=task.pk, agent="a", drafts=[
        EventDraft(type="TaskFailed", payload={"error": "first", "retryable": True}),  # 2: back to pending
        EventDraft(type="ReasoningStepCompleted", payload={"step": 1}),  # 3
        EventDraft(type="TaskFailed", payload={"error": "second", "retryable": False}),  # 4
    ])
    assert forks.failure_points([task.pk]) == {task.pk: 3}
