"""Periodic recovery work. Thin: each task loops over a service step until it reports no work."""

from __future__ import annotations

import logging
import time

from celery import shared_task
from django.conf import settings

from recovery import alerts, approvals, bulk, detector, retention, signals, tool_calls

logger = logging.getLogger(__name__)


@shared_task(autoretry_for=(Exception,), retry_backoff=True, max_retries=5)
def purge_expired_tool_calls() -> int:
    """Delete tool-call records past their TTL, a batch at a time."""
    total = 0
    while deleted := tool_calls.tool_call_purge_expired():
        total += deleted
    if total:
        logger.info("purged %d expired tool-call records", total)
    return total


@shared_task(ignore_result=True)
def detect_stalls() -> int:
    """Expire run-out leases in batches until none is left (several workers may run this at once)."""
    sweep = detector.lease_expire_stalled_until_idle()
    if sweep.dead_lettered:
        logger.warning("stall detector: %d task(s) dead-lettered after their last attempt", sweep.dead_lettered)
    return sweep.expired


@shared_task(ignore_result=True)
def prune_retained_tasks() -> int:
    """Prune the finished tasks the retention rules have made due, a batch at a time.

    Stops after half its interval even with work left, so a large backlog (a rule just added
    over a long history) never runs past its duty's allowance; the next run goes on."""
    deadline = time.monotonic() + settings.BACKPLANE_RETENTION_SECONDS / 2
    total = 0
    while (pruned := retention.retention_prune_batch()) and time.monotonic() < deadline:
        total += pruned
    return total + pruned


@shared_task(ignore_result=True)
def evaluate_alerts() -> int:
    """Count every enabled alert rule's saved search and record the crossings (recovery/alerts.py).
    Several workers may run it at once: each crossing is still announced once."""
    return alerts.alerts_evaluate()


@shared_task(ignore_result=True)
def expire_approvals() -> int:
    """Escalate or expire the approval requests past their time, and end the waits for signals
    past theirs, a batch at a time (several workers may run it at once: each is handled once,
    under its lock)."""
    total = 0
    while handled := approvals.approvals_expire() + signals.signals_expire():
        total += handled
    return total


@shared_task(name=bulk.RUN_BULK_JOB, ignore_result=True)
def run_bulk_job(job_id: int) -> None:
    """Run a bulk job's chunks for a while under its runner lease, then enqueue it again if work
    is left (the lease is released first, so the next run can claim it)."""
    if bulk.bulk_job_run(job_id):
        run_bulk_job.delay(job_id)


@shared_task(ignore_result=True)
def resume_bulk_jobs() -> int:
    """Enqueue the running jobs nobody runs: never picked up, or their worker was killed."""
    job_ids = bulk.bulk_jobs_unattended()
    for job_id in job_ids:
        run_bulk_job.delay(job_id)
    return len(job_ids)
