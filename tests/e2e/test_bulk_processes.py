"""A bulk retry run by a real Celery worker that is SIGKILLed twice mid-job: every item is done
exactly once, with one result row each.

The worker and beat are real processes (tests/support/celery_processes.py) on the test
database. The job is left to the beat's ``resume-bulk-jobs``: it enqueues the running job that
no worker holds, at the start and again after each kill once the killed runner's lease (short
here) has run out.
"""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from collections.abc import Iterator

import pytest

from backplane.delivery.models import DeadLetter
from backplane.eventlog.models import Event, Task
from recovery import bulk
from recovery.models import BulkJob
from tests.recovery.test_bulk import dead_lettered_tasks
from tests.support.celery_processes import CeleryProcesses
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

TASKS = 2000


@pytest.fixture
def processes(committed_db: None) -> Iterator[CeleryProcesses]:
    started = CeleryProcesses(env={"BACKPLANE_BULK_LEASE_SECONDS": "3", "BACKPLANE_BULK_RUN_SECONDS": "2"})
    try:
        yield started
    finally:
        started.stop()


def done_count(job: BulkJob) -> int:
    return BulkJob.objects.values_list("done", flat=True).get(pk=job.pk)


def kill_worker(processes: CeleryProcesses) -> None:
    worker = processes.processes["worker"]
    os.killpg(worker.pid, signal.SIGKILL)
    assert worker.wait(timeout=10) == -signal.SIGKILL


def test_a_bulk_retry_of_2000_dead_letters_survives_two_kills_of_the_worker(processes: CeleryProcesses) -> None:
    tasks = dead_lettered_tasks(TASKS)
    job = bulk.bulk_job_plan(action="retry", selection={"filter": {"status": "dead_lettered"}},
                             reason="the enrichment API is back", created_by="user:rita", rate_per_second=300,
                             chunk_size=100)
    shown = list(job.items.order_by("index").values_list("target", flat=True))
    assert job.total == TASKS and set(shown) == {str(t.pk) for t in tasks}
    bulk.bulk_job_start(job_id=job.pk, selection_hash=job.selection_hash, decided_by="user:rita")

    def logs() -> str:
        return f"--- worker\n{processes.log('worker')[-3000:]}\n--- beat\n{processes.log('beat')[-1500:]}"

    processes.start("beat")
    processes.start("worker")
    at_kills = []
    for threshold in (400, 1100):

        def reached(threshold: int = threshold) -> bool:
            return done_count(job) >= threshold

        wait_until(reached, timeout=90, what=f"{threshold} items done", details=logs)
        # A chunk of 100 takes about as long as the rate allows it (a third of a second), so a
        # kill a moment after a commit lands inside the next chunk's transaction.
        time.sleep(0.1)
        kill_worker(processes)
        at_kills.append(done_count(job))
        processes.start("worker")
    assert all(done < TASKS for done in at_kills), at_kills

    wait_until(lambda: BulkJob.objects.get(pk=job.pk).status == "finished", timeout=120, what="the job finishes",
               details=logs)
    job.refresh_from_db()
    assert (job.done, job.skipped, job.failed) == (TASKS, 0, 0)
    # One result row per item, each done, in the order of the dry run.
    assert list(job.items.order_by("index").values_list("target", "status")) == [(t, "done") for t in shown]
    # Exactly once: one DeadLetterRequeued per task in its log, every dead letter requeued once.
    requeued = Counter(Event.objects.filter(type="DeadLetterRequeued").values_list("task_id", flat=True))
    assert len(requeued) == TASKS and set(requeued.values()) == {1}
    assert DeadLetter.objects.filter(status="requeued", decided_by="user:rita").count() == TASKS
    assert set(Task.objects.filter(pk__in=[t.pk for t in tasks]).values_list("status", "attempts")) == {
        ("pending", 0)}
    print(f"\n{TASKS} items; done when the worker was killed: {at_kills}")
