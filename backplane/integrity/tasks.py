"""Periodic integrity work: chain verification, sealing, audit export. Thin, like every task.

Task names are the wire names beat and the broker use; they stayed ``backplane.tasks.*`` when
the code moved here, so queued messages and schedules from before still find their task.
"""

from __future__ import annotations

import logging

from celery import Task, shared_task
from django.conf import settings

from backplane.integrity import verification
from backplane.integrity.models import VerificationMode, VerificationRun

logger = logging.getLogger(__name__)


def _verify_chains(mode: str, run_id: int | None = None) -> dict[str, int]:
    run = verification.verification_run_start(mode=mode) if run_id is None else VerificationRun.objects.get(pk=run_id)
    after = None
    raised = 0
    while (
        step := verification.verification_run_batch(
            run=run, after_task_id=after, batch_size=settings.BACKPLANE_VERIFY_BATCH_SIZE
        )
    ).tasks_checked:
        after = step.last_task_id
        raised += step.alerts_raised
    if mode == VerificationMode.FULL:
        # The whole sealed tree, rebuilt from the events' content, against the signed head: an
        # O(all events) pass, so with the full run, not the incremental one.
        verification.verification_run_seals(run=run)
    run = verification.verification_run_finish(run_id=run.pk)
    if run.failures:
        logger.warning(
            "chain verification (%s run %d): %d task(s) with a broken chain or a row that differs from its log, "
            "of %d task(s), %d new alert(s)",
            mode, run.pk, run.failures, run.tasks_checked, raised,
        )
    return {"run": run.pk, "tasks": run.tasks_checked, "events": run.events_checked, "failures": run.failures,
            "alerts_raised": raised}


# Beat fires this every minute. An overlapping run only repeats work: verified heads it writes
# are true either way, and an alert is raised once per break.
@shared_task(name="backplane.tasks.verify_chains_incremental", ignore_result=True)
def verify_chains_incremental() -> dict[str, int]:
    return _verify_chains(VerificationMode.INCREMENTAL)


# A run that dies part-way stays on record with no finished_at; a retry starts a new run.
@shared_task(name="backplane.tasks.verify_chains_full", ignore_result=True, autoretry_for=(Exception,),
             retry_backoff=True, max_retries=3)
def verify_chains_full() -> dict[str, int]:
    return _verify_chains(VerificationMode.FULL)


# A run a person asked for (the dashboard's "verify all now"): its row was written when they
# asked, so the page shows it queued, then its progress batch by batch. Not retried: a run
# that dies stays on record unfinished, and the person can ask again.
@shared_task(name=verification.VERIFY_CHAINS_REQUESTED, ignore_result=True)
def verify_chains_requested(run_id: int) -> dict[str, int]:
    return _verify_chains(VerificationMode.FULL, run_id=run_id)


@shared_task(name="backplane.tasks.seal_events", ignore_result=True)
def seal_events() -> int:
    """Seal new events into the Merkle tree and sign the head (one sealer at a time cluster-wide)."""
    from backplane.integrity import sealing

    total = 0
    try:
        while (step := sealing.seal_new_events()).sealed:
            total += step.sealed
    except Exception as exc:
        # Not retried here: beat runs it again in a few seconds. A dead letter (one per distinct
        # failure) makes it visible; raising makes the duty record it (/readyz, /metrics).
        sealing.sealing_record_failure(error=exc)
        raise
    return total


# Beat fires this hourly. A failure is retried after up to 1, 2, 4 and 8 minutes (full jitter), so a
# short outage of the destination heals by itself; after the last attempt it becomes a dead letter
# (one per failing segment while it stays pending), never only a log line. Segments exported before
# the failure stay exported: each commits on its own, and a retry continues after them.
@shared_task(name="backplane.tasks.audit_export", bind=True, ignore_result=True, autoretry_for=(Exception,),
             retry_backoff=60, retry_backoff_max=600, max_retries=4)
def audit_export(self: Task) -> list[int]:
    from backplane.integrity.audit import export

    try:
        return [segment.number for segment in export.audit_export_until_idle().segments]
    except Exception as exc:
        if self.request.retries >= self.max_retries:
            export.audit_export_record_failure(error=exc, attempts=self.request.retries + 1)
        raise


# Beat runs it every BACKPLANE_EVENT_STREAM_SECONDS when BACKPLANE_EVENT_STREAM is on (settings).
# A failure leaves the cursor where it was; the next run publishes the same leaves again.
@shared_task(name="backplane.tasks.stream_events", ignore_result=True)
def stream_events() -> dict[str, int]:
    from backplane.integrity import stream

    step = stream.event_stream_until_idle()
    return {"published": step.published, "next_leaf": step.next_leaf}
