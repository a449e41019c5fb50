"""Two bulk jobs deciding the same dead letters at the same moment: each is decided exactly
once, and no task is requeued twice. Real commits, two threads, each with its own database
connection (``committed_db``)."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection
from django.db.models import Count
from django.test import Client

from backplane.delivery.models import DeadLetter
from backplane.eventlog.models import Event, Task
from recovery import bulk
from recovery.models import BulkJob
from tests.dashboard.test_dead_letters import dead_lettered_tasks, make_reviewer, task_id_of


def at_once(*work: Callable[[], Any]) -> list[Any]:
    """Run each callable in its own thread, released together; their results in order."""
    barrier = threading.Barrier(len(work))
    results: list[Any] = [None] * len(work)
    errors: list[BaseException] = []

    def run(n: int, fn: Callable[[], Any]) -> None:
        try:
            barrier.wait(timeout=30)
            results[n] = fn()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test's thread below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(n, fn)) for n, fn in enumerate(work)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    if errors:
        raise errors[0]
    return results


def decision_events_per_task(tasks: list[Any]) -> Counter[Any]:
    rows = (Event.objects.filter(task_id__in=tasks, type__in=["DeadLetterRequeued", "DeadLetterDiscarded"])
            .values_list("task_id").annotate(n=Count("position")))
    return Counter(dict(rows))


def run_to_the_end(job_id: int) -> int:
    """One worker on one job: chunks until nothing is pending; how many items it settled."""
    settled = 0
    while count := bulk.bulk_job_step(job_id):
        settled += count
    return settled


def outcomes_by_dead_letter(*jobs: BulkJob) -> dict[int, list[str]]:
    outcomes: dict[int, list[str]] = {}
    for job in jobs:
        for target, status in job.items.values_list("target", "status"):
            outcomes.setdefault(int(target), []).append(status)
    return outcomes


@pytest.mark.django_db(transaction=True)
def test_two_reviewers_jobs_over_the_same_100_run_at_once_and_decide_each_once(committed_db: None) -> None:
    items = dead_lettered_tasks(100)
    ids = [item.pk for item in items]
    jobs = []
    for name, chosen in (("rita", {"all_matching": "on", "query": "status=pending"}),
                         # Sam checked them newest first: the two meet in the middle of the list.
                         ("sam", {"ids": list(reversed(ids))})):
        client = Client()
        client.force_login(make_reviewer(name))
        draft = client.post("/dead-letters/bulk/", {"action": "dead_letter_requeue",
                                                    "reason": f"{name}: pool is back", **chosen})
        assert draft.status_code == 302
        job = BulkJob.objects.latest("pk")
        assert job.total == 100
        assert client.post(f"/jobs/{job.pk}/start/", {"selection_hash": job.selection_hash}).status_code == 302
        jobs.append(job)

    at_once(*(lambda job_id=job.pk: run_to_the_end(job_id) for job in jobs))

    rita, sam = (BulkJob.objects.get(pk=job.pk) for job in jobs)
    outcomes = outcomes_by_dead_letter(rita, sam)
    assert all(sorted(both) == ["done", "skipped"] for both in outcomes.values()), outcomes
    assert rita.done + sam.done == 100 and rita.failed == sam.failed == 0
    assert (rita.status, sam.status) == ("finished", "finished")

    decided = Counter(DeadLetter.objects.filter(pk__in=ids).values_list("status", "decided_by"))
    assert decided == Counter({("requeued", "user:rita"): rita.done, ("requeued", "user:sam"): sam.done})
    tasks = [task_id_of(item) for item in items]
    assert decision_events_per_task(tasks) == Counter(dict.fromkeys(tasks, 1))  # no double requeue
    assert set(Task.objects.filter(pk__in=tasks).values_list("status", "attempts")) == {("pending", 0)}


@pytest.mark.django_db(transaction=True)
def test_a_requeue_job_and_a_discard_job_over_the_same_100_at_once_never_both_happen(committed_db: None) -> None:
    items = dead_lettered_tasks(100)
    ids = [item.pk for item in items]
    jobs = []
    for action, order in (("dead_letter_requeue", ids), ("dead_letter_discard", ids[::-1])):
        job = bulk.bulk_job_plan(action=action, selection={"ids": order}, reason=f"{action} them",
                                 created_by=f"user:{action}-er")
        bulk.bulk_job_start(job_id=job.pk, selection_hash=job.selection_hash, decided_by=f"user:{action}-er")
        jobs.append(job)

    at_once(*(lambda job_id=job.pk: run_to_the_end(job_id) for job in jobs))

    requeued, discarded = (BulkJob.objects.get(pk=job.pk) for job in jobs)
    outcomes = outcomes_by_dead_letter(requeued, discarded)
    assert all(sorted(both) == ["done", "skipped"] for both in outcomes.values()), outcomes
    assert requeued.done + discarded.done == 100
    tasks = {item.task_id: item.pk for item in items}
    assert decision_events_per_task(list(tasks)) == Counter(dict.fromkeys(tasks, 1))
    # Each task went the way of the one decision its dead letter got.
    status_of = dict(DeadLetter.objects.filter(pk__in=ids).values_list("pk", "status"))
    for task_id, task_status in Task.objects.filter(pk__in=list(tasks)).values_list("pk", "status"):
        expected = "pending" if status_of[tasks[task_id]] == "requeued" else "dead_lettered"
        assert task_status == expected
