"""Fork from failure over many tasks: the dry run writes nothing, the batch forks exactly its
list once, each task after the event before its last failure."""

from __future__ import annotations

import pytest
from django.db import transaction
from django.utils import timezone

from backplane.eventlog import forks, services
from backplane.eventlog.errors import InvalidInput
from backplane.eventlog.models import Event, Task
from backplane.eventlog.writer import EventDraft, lock_task, write_events

pytestmark = pytest.mark.django_db


def failed_task(n: int) -> Task:
    task = services.task_create(namespace="acme", kind="k", input={"n": n}, agent="a", max_attempts=1).task
    services.event_append_batch(namespace="acme", task_id=task.pk, agent="a", drafts=[
        EventDraft(type="ReasoningStepCompleted", payload={"step": 1}),
        EventDraft(type="TaskFailed", payload={"error": "boom", "retryable": False}),
    ])
    return Task.objects.get(pk=task.pk)


def test_the_dry_run_writes_nothing_and_the_batch_forks_its_list_once() -> None:
    failed = [failed_task(n) for n in range(3)]
    running = services.task_create(namespace="acme", kind="k", input={}, agent="a").task
    sandbox = forks.task_fork(namespace="acme", source_task_id=failed[0].pk, at_seq=1, reason="replay",
                              forked_by="a", by_staff=False, sandbox=True).task
    ids = [t.pk for t in failed] + [running.pk, sandbox.pk]
    events = Event.objects.count()

    plan = forks.fork_from_failure_plan(ids + ids[:1])
    assert [(p.task.pk, p.at_seq) for p in plan] == [(t.pk, 2) for t in failed] + [(running.pk, None),
                                                                                   (sandbox.pk, None)]
    assert plan[3].skip_reason == "it never failed" and "sandbox" in (plan[4].skip_reason or "")
    assert Event.objects.count() == events

    results = forks.tasks_fork_from_failure(task_ids=ids, reason="bad deploy", forked_by="alice", batch="b-1")
    assert [r.outcome for r in results] == ["done", "done", "done", "skipped", "skipped"]
    made = Task.objects.filter(forked_from__in=failed, sandbox=False)
    assert made.count() == 3 and {t.forked_at_seq for t in made} == {2}
    forked = Event.objects.get(task=made[0], seq=2)
    assert forked.payload["by_staff"] is True and forked.payload["forked_by"] == "alice"

    again = forks.tasks_fork_from_failure(task_ids=ids, reason="bad deploy", forked_by="alice", batch="b-1")
    assert [r.outcome for r in again[:3]] == ["skipped"] * 3
    assert Task.objects.filter(forked_from__in=failed, sandbox=False).count() == 3
    assert forks.tasks_fork_from_failure(task_ids=ids[:1], reason="again", forked_by="alice", batch="b-2")[0].outcome \
        == "done"


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


def test_too_many_at_once_is_refused() -> None:
    with pytest.raises(InvalidInput):
        forks.tasks_fork_from_failure(task_ids=[Task().pk for _ in range(forks.BULK_MAX_ITEMS + 1)], reason="x",
                                      forked_by="a", batch="b")


def test_the_last_failure_counts_not_an_earlier_one() -> None:
    task = services.task_create(namespace="acme", kind="k", input={}, agent="a", max_attempts=2).task
    services.event_append_batch(namespace="acme", task_id=task.pk, agent="a", drafts=[
        EventDraft(type="TaskFailed", payload={"error": "first", "retryable": True}),  # 2: back to pending
        EventDraft(type="ReasoningStepCompleted", payload={"step": 1}),  # 3
        EventDraft(type="TaskFailed", payload={"error": "second", "retryable": False}),  # 4
    ])
    assert forks.failure_points([task.pk]) == {task.pk: 3}
