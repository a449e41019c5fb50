"""Periodic delivery work. Thin: each task loops a service step until there is nothing to do.

Task names are the wire names beat and the broker use; they stayed ``backplane.tasks.*`` when
the code moved here, so queued messages and schedules from before still find their task.
"""

from __future__ import annotations

import logging

from celery import shared_task
from django.conf import settings

from backplane.delivery import relay
from backplane.delivery.sinks import Sinks

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
@shared_task(name="backplane.tasks.relay_outbox", ignore_result=True)
def relay_outbox() -> dict[str, int]:
    step = relay.outbox_relay_until_idle(
        publish=process_sinks(), budget_seconds=0.9, batch_size=settings.BACKPLANE_OUTBOX_BATCH_SIZE
    )
    if step.failed or step.dead:
        logger.warning("outbox relay: %d failed, %d dead of %d claimed", step.failed, step.dead, step.claimed)
    return {"claimed": step.claimed, "delivered": step.delivered, "failed": step.failed, "dead": step.dead}


@shared_task(name="backplane.tasks.prune_delivered_outbox", ignore_result=True, autoretry_for=(Exception,),
             retry_backoff=True, max_retries=5)
def prune_delivered_outbox() -> int:
    total = 0
    while deleted := relay.outbox_prune_delivered():
        total += deleted
    return total
