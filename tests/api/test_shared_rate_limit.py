"""The API's rate limit is one limit for all web processes: they count in PostgreSQL's unlogged
counter rows, not each in its own memory."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
from django.db import connection
from pytest_django.fixtures import DjangoAssertNumQueries

from api.throttling import Window, count_into, counter_key
from backplane.eventlog import services
from backplane.eventlog.models import Agent
from tests.support.live_server import ROOT, web_env

# One process: set Django up, wait for the common start, then send its requests as fast as it can.
REQUESTS = """
import json, sys, time
import django
django.setup()
from django.test import Client
token, start, count = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
client = Client(HTTP_AUTHORIZATION=f"Bearer {token}")
client.get("/readyz/traffic")  # first-request costs (URL resolution, imports) before the start
while time.time() < start:
    time.sleep(0.005)
path = sys.argv[4]
print(json.dumps([client.get(path).status_code for _ in range(count)]))
"""


def _away_from_a_window_edge(period: int, margin: float) -> None:
    """Fixed windows: a run that straddles two windows would get twice the limit."""
    into = time.time() % period
    if into > period - margin:
        time.sleep(period - into + 0.1)


def _two_processes_send_ten_requests(token: str, path: str, extra_env: dict[str, str]) -> list[list[int]]:
    """Two processes, a limit of 7 a minute: each sends ten GETs of ``path`` from one instant on;
    their statuses, process by process."""
    env = {**web_env(), "BACKPLANE_RATE_LIMIT": "7/m", "DJANGO_SETTINGS_MODULE": "backplane.settings", **extra_env}
    _away_from_a_window_edge(60, margin=25)
    start = time.time() + 8  # both processes are set up by then
    runs = [
        subprocess.Popen([sys.executable, "-c", REQUESTS, token, str(start), "10", path], cwd=ROOT, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    answers = []
    for run in runs:
        out, err = run.communicate(timeout=60)
        assert run.returncode == 0, err
        answers.append(json.loads(out.strip().splitlines()[-1]))
    assert time.time() - start < 20, "too slow to stay in one window"
    return answers


@pytest.mark.slow
@pytest.mark.parametrize("route", ["drf", "agent-route"])
def test_two_processes_share_one_limit(committed_db: None, route: str) -> None:
    token = services.agent_create(name="bursty", namespace="acme").token
    task = services.task_create(namespace="acme", kind="k", input={}, agent="seed").task  # no HTTP: not counted
    path = "/api/v1/tasks/" if route == "drf" else f"/api/v1/tasks/{task.pk}/"
    answers = _two_processes_send_ten_requests(token, path, {})
    statuses = [status for answer in answers for status in answer]
    # 20 requests against one limit of 7: exactly 7 got through, whichever process sent them;
    # with a limit per process each would have let 7 through (14).
    assert statuses.count(200) == 7 and statuses.count(429) == 13, answers
    # Every request reached the shared counter, the refused ones too.
    agent_id = Agent.objects.get(name="bursty").pk
    with connection.cursor() as cursor:
        cursor.execute("SELECT value FROM backplane_cache WHERE cache_key = %s", [counter_key(f"agent:{agent_id}")])
        assert cursor.fetchone() == ("20",)


def test_a_counter_starts_each_window_afresh_in_one_statement(
    db: None, django_assert_num_queries: DjangoAssertNumQueries
) -> None:
    window = Window(limit=5, ends_at=time.time() // 60 * 60 + 60)
    later = Window(limit=5, ends_at=window.ends_at + 60)
    with django_assert_num_queries(1):
        assert count_into("throttle:test", window) == 1
    assert count_into("throttle:test", window) == 2
    assert count_into("throttle:test", later) == 1  # the next window
    # A process whose clock is behind counts into the newer window instead of moving it back.
    assert count_into("throttle:test", window) == 2
    assert count_into("throttle:other", window) == 1
