"""Rollups equal the sum of the events after concurrent agents over HTTP and a web process killed
with SIGKILL in the middle of their model-call records: a record and its rollups commit together
or not at all."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from decimal import Decimal

import httpx
import pytest

from backplane.eventlog import costs, services
from backplane.eventlog.event_types import prompt_sha256
from backplane.eventlog.models import CostRollup, Event, ModelPrice
from tests.support.live_server import WebProcess
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.slow]


@pytest.fixture
def web(committed_db: None) -> Iterator[WebProcess]:
    server = WebProcess(name="costs-web", env={"BACKPLANE_DB_POOL": "1", "DEBUG": "0"})
    try:
        yield server.start()
    finally:
        server.close()


def test_rollups_equal_the_events_after_the_web_process_is_killed_mid_writes(web: WebProcess) -> None:
    for token_type in ("input", "output"):
        ModelPrice.objects.create(provider="acme-ai", model="m", token_type=token_type, per_million=Decimal(1),
                                  currency="USD", version="v1", valid_from="2026-01-01T00:00:00Z")
    token = services.agent_create(name="spender", namespace="acme").token
    agents = 6
    tasks = [services.task_create(namespace="acme", kind="k", input={"n": n}, agent="spender").task
             for n in range(agents)]
    stop = threading.Event()
    answered = [0] * agents

    def spend(index: int) -> None:
        with httpx.Client(base_url=web.url, headers={"Authorization": f"Bearer {token}"}, timeout=5) as client:
            step = 0
            while not stop.is_set():
                step += 1
                payload = {"step": step, "model": "m", "provider": "acme-ai", "prompt_sha256": prompt_sha256("p"),
                           "output": {}, "usage": {"input_tokens": 1000 + step, "output_tokens": 7}}
                try:
                    response = client.post(f"/api/v1/tasks/{tasks[index].pk}/events/",
                                           json={"type": "LLMCalled", "payload": payload})
                except httpx.HTTPError:
                    time.sleep(0.05)  # the process is down: try again once it is back
                    continue
                if response.status_code == 201:
                    answered[index] += 1

    threads = [threading.Thread(target=spend, args=(i,)) for i in range(agents)]
    for thread in threads:
        thread.start()
    try:
        for _ in range(2):
            wait_until(lambda: sum(answered) >= 40 or None, timeout=60, what="model calls recorded")
            web.kill()  # SIGKILL, with requests in the middle of their transactions
            web.start()
            wanted = sum(answered) + 20

            def recorded_after_restart(wanted: int = wanted) -> bool:
                return sum(answered) > wanted

            wait_until(recorded_after_restart, timeout=60, what="model calls recorded after the restart")
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=30)

    recorded = Event.objects.filter(type="LLMCalled").count()
    assert recorded >= sum(answered)  # every answered record is there (some were cut before their answer)
    assert costs.rollup_differences() == []
    namespace_calls = sum(r.calls for r in CostRollup.objects.filter(scope="namespace", key="acme"))
    assert namespace_calls == recorded
