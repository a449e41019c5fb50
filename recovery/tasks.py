"""Periodic recovery work. Thin: each task loops over a service step until it reports no work."""

from __future__ import annotations

import logging
import time

from celery import shared_task
from django.conf import settings

from recovery import detector, retention, tool_calls

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
