"""Periodic recovery work. Thin: each task loops over a service step until it reports no work."""

from __future__ import annotations

import logging

from celery import shared_task

from recovery import detector, tool_calls

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
