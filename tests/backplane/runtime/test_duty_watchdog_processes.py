"""A frozen duty in a real worker turns /readyz red, naming it, within three of its intervals.

A real Celery worker (the thread pool ``make run`` uses) and beat, against the test database.
The sealer is frozen the way a duty really hangs: it waits on a lock. The test holds an ACCESS
EXCLUSIVE lock on the Merkle leaf table, which only the sealer reads here, so every seal run
blocks on its first query while the relay and the stall detector keep running.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from django.test import Client

from backplane.runtime.models import Duty
from tests.support.celery_processes import CeleryProcesses
from tests.support.live_server import database_url_of_test_db

pytestmark = pytest.mark.slow

SEAL_SECONDS = 4
METRICS_TOKEN = "watchdog-scrape-token"


@pytest.fixture
def worker_and_beat(committed_db: None, settings: Any) -> Iterator[CeleryProcesses]:
    settings.BACKPLANE_DUTY_WATCH = True
    settings.BACKPLANE_METRICS_TOKEN = METRICS_TOKEN  # what opens /readyz's details
    processes = CeleryProcesses(env={"BACKPLANE_SEAL_SECONDS": str(SEAL_SECONDS)})
    try:
        processes.start("worker")
        processes.start("beat")
        yield processes
    finally:
        processes.stop()


def _duty_problems(client: Client) -> list[str]:
    response = client.get("/readyz", HTTP_AUTHORIZATION=f"Bearer {METRICS_TOKEN}")
    return [] if response.status_code == 200 else response.json()["error"]["details"]["problems"]


def _wait(what: str, condition: Callable[[], object], timeout: float, processes: CeleryProcesses) -> float:
    started = time.monotonic()
    while not condition():
        assert time.monotonic() - started < timeout, (
            f"{what} did not happen in {timeout}s\n--- worker\n{processes.log('worker')[-3000:]}"
            f"\n--- beat\n{processes.log('beat')[-1500:]}")
        time.sleep(0.2)
    return time.monotonic() - started


def test_a_frozen_duty_turns_duty_health_red_naming_it_and_green_when_it_thaws(
    worker_and_beat: CeleryProcesses,
) -> None:
    client = Client()
    _wait("every duty watched and fresh", lambda: _duty_problems(client) == [], 60, worker_and_beat)
    _wait("a first seal", lambda: Duty.objects.filter(name="seal-events", last_succeeded_at__isnull=False).exists(),
          30, worker_and_beat)

    with psycopg.connect(database_url_of_test_db()) as blocker:
        blocker.execute("LOCK TABLE backplane_merkleleaf IN ACCESS EXCLUSIVE MODE")
        frozen_at = time.monotonic()
        took = _wait("/readyz naming the frozen sealer", lambda: any(
            p.startswith("duty seal-events overdue") for p in _duty_problems(client)), 60, worker_and_beat)
        problems = _duty_problems(client)
        print(f"\n/readyz named the frozen sealer {took:.1f}s after the freeze "
              f"(interval {SEAL_SECONDS}s): {problems}")
        assert took <= 3 * SEAL_SECONDS + 0.5
        # The others kept running beside it: the hung runs did not take the pool.
        relay_before = Duty.objects.get(name="relay-outbox").runs_total
        _wait("the relay duty runs beside the frozen sealer",
              lambda: Duty.objects.get(name="relay-outbox").runs_total > relay_before, 3, worker_and_beat)
        assert [p for p in _duty_problems(client) if not p.startswith("duty seal-events")] == []
        assert time.monotonic() - frozen_at < 60
        blocker.rollback()

    took = _wait("/readyz green again after the lock is gone", lambda: _duty_problems(client) == [], 30,
                 worker_and_beat)
    print(f"green again {took:.1f}s after the sealer thawed")
    assert "skipped" in worker_and_beat.log("worker")  # beat's later seal runs were not stacked on the hung one
