"""Periodic delivery work. Thin: each task calls a service step.

Task names are the wire names beat and the broker use; they stayed ``backplane.tasks.*`` when
the code moved here, so queued messages and schedules from before still find their task.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from celery import shared_task, signals

from backplane.delivery import relay
from backplane.delivery.lanes import LaneRunner

logger = logging.getLogger(__name__)

_runner: LaneRunner | None = None
_runner_lock = threading.Lock()


def process_lanes() -> LaneRunner:
    """The worker process's delivery lanes (one pool of threads, created on first use)."""
    global _runner
    with _runner_lock:
        if _runner is None:
            _runner = LaneRunner()
        return _runner


@signals.worker_shutting_down.connect(weak=False)
def _stop_lanes(**_: Any) -> None:
    """Running deliveries finish (each within its deadline) and give their untried rows back;
    not waited for here (a signal handler): the process's exit waits for the pool's threads."""
    with _runner_lock:
        runner = _runner
    if runner is not None:
        runner.stop(timeout=0)


# Beat fires this every second. It only starts delivery lanes (backplane/delivery/lanes.py) and
# returns at once: a worker thread never waits for a publish or a POST, so a slow endpoint cannot
# take the threads the other duties (the stall detector) need. `expires` in the schedule drops
# runs that queued up while workers were busy.
@shared_task(name="backplane.tasks.relay_outbox", ignore_result=True)
def relay_outbox() -> dict[str, int]:
    started = process_lanes().tick()
    return {"lanes_started": started}


@shared_task(name="backplane.tasks.prune_delivered_outbox", ignore_result=True, autoretry_for=(Exception,),
             retry_backoff=True, max_retries=5)
def prune_delivered_outbox() -> int:
    total = 0
    while deleted := relay.outbox_prune_delivered():
        total += deleted
    return total
