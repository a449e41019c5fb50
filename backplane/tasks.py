"""Periodic delivery work. Thin: each task loops a service step until there is nothing to do."""

from __future__ import annotations

import logging

from celery import Task, shared_task
from django.conf import settings

from backplane import integrity, outbox
from backplane.models import VerificationMode
from backplane.sinks import Sinks

logger = logging.getLogger(__name__)

_sinks: Sinks | None = None


def process_sinks() -> Sinks:
    """One broker connection and HTTP client per worker process, reused across runs."""
    global _sinks
    if _sinks is None:
        _sinks = Sinks()
    return _sinks


# Beat fires this every second; a run that overlaps the next is harmless (SKIP LOCKED),
# and `expires` in the schedule drops runs that queued up while workers were busy.
@shared_task(ignore_result=True)
def relay_outbox() -> dict[str, int]:
    step = outbox.outbox_relay_until_idle(
        publish=process_sinks(), budget_seconds=0.9, batch_size=settings.BACKPLANE_OUTBOX_BATCH_SIZE
    )
    if step.failed or step.dead:
        logger.warning("outbox relay: %d failed, %d dead of %d claimed", step.failed, step.dead, step.claimed)
    return {"claimed": step.claimed, "delivered": step.delivered, "failed": step.failed, "dead": step.dead}


@shared_task(ignore_result=True, autoretry_for=(Exception,), retry_backoff=True, max_retries=5)
def prune_delivered_outbox() -> int:
    total = 0
    while deleted := outbox.outbox_prune_delivered():
        total += deleted
    return total


def _verify_chains(mode: str) -> dict[str, int]:
    run = integrity.verification_run_start(mode=mode)
    after = None
    raised = 0
    while (
        step := integrity.verification_run_batch(
            run=run, after_task_id=after, batch_size=settings.BACKPLANE_VERIFY_BATCH_SIZE
        )
    ).tasks_checked:
        after = step.last_task_id
        raised += step.alerts_raised
    run = integrity.verification_run_finish(run_id=run.pk)
    if run.failures:
        logger.warning(
            "chain verification (%s run %d): %d broken chain(s) of %d task(s), %d new alert(s)",
            mode, run.pk, run.failures, run.tasks_checked, raised,
        )
    return {"run": run.pk, "tasks": run.tasks_checked, "events": run.events_checked, "failures": run.failures,
            "alerts_raised": raised}


# Beat fires this every minute. An overlapping run only repeats work: verified heads it writes
# are true either way, and an alert is raised once per break.
@shared_task(ignore_result=True)
def verify_chains_incremental() -> dict[str, int]:
    return _verify_chains(VerificationMode.INCREMENTAL)


# A run that dies part-way stays on record with no finished_at; a retry starts a new run.
@shared_task(ignore_result=True, autoretry_for=(Exception,), retry_backoff=True, max_retries=3)
def verify_chains_full() -> dict[str, int]:
    return _verify_chains(VerificationMode.FULL)


@shared_task(ignore_result=True)
def seal_events() -> int:
    """Seal new events into the Merkle tree and sign the head (one sealer at a time cluster-wide)."""
    from backplane import sealing

    total = 0
    while (step := sealing.seal_new_events()).sealed:
        total += step.sealed
    return total


# Beat fires this hourly. A failure is retried after up to 1, 2, 4 and 8 minutes (full jitter), so a
# short outage of the destination heals by itself; after the last attempt it becomes a dead letter
# (one per failing segment while it stays pending), never only a log line. Segments exported before
# the failure stay exported: each commits on its own, and a retry continues after them.
@shared_task(bind=True, ignore_result=True, autoretry_for=(Exception,), retry_backoff=60, retry_backoff_max=600,
             max_retries=4)
def audit_export(self: Task) -> list[int]:
    from backplane.audit import export

    try:
        return [segment.number for segment in export.audit_export_until_idle().segments]
    except Exception as exc:
        if self.request.retries >= self.max_retries:
            export.audit_export_record_failure(error=exc, attempts=self.request.retries + 1)
        raise
