"""The API's rate limit is one limit for all web processes: they count in the shared cache
(the database's cache table here; Redis with REDIS_URL), not each in its own memory."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
from django.conf import settings
from django.core.cache import caches
from django.core.cache.backends.db import DatabaseCache
from django.db import connection
from pytest_django.fixtures import DjangoAssertNumQueries

from backplane.api.throttling import agent_counting
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
client.get("/healthz")  # first-request costs (URL resolution, imports) before the start
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
def test_two_processes_share_one_limit(committed_db: None) -> None:
    assert isinstance(caches["default"], DatabaseCache)  # no REDIS_URL in tests: the database's table
    token = services.agent_create(name="bursty", namespace="acme").token
    answers = _two_processes_send_ten_requests(token, "/api/v1/tasks/", {})
    statuses = [status for answer in answers for status in answer]
    # 20 requests against one limit of 7: exactly 7 got through, whichever process sent them;
    # with a limit per process each would have let 7 through (14).
    assert statuses.count(200) == 7 and statuses.count(429) == 13, answers


@pytest.mark.slow
def test_with_confirmations_two_processes_pass_the_limit_by_at_most_what_the_other_served(
    committed_db: None,
) -> None:
    """The lean routes with BACKPLANE_AUTH_CONFIRM_SECONDS on (api/confirmations.py): each process
    counts its own requests exactly and sees the other's only when it confirms, so together they
    let through at most the limit plus what the other served past its last confirmation; every
    request still reaches the shared counter (each over-limit request confirms)."""
    token = services.agent_create(name="bursty", namespace="acme").token
    task = services.task_create(namespace="acme", kind="k", input={}, agent="seed").task  # no HTTP: not counted
    answers = _two_processes_send_ten_requests(token, f"/api/v1/tasks/{task.pk}/",
                                               {"BACKPLANE_AUTH_CONFIRM_SECONDS": "60"})
    passed = [answer.count(200) for answer in answers]
    assert all(set(answer) <= {200, 429} for answer in answers), answers
    # Each process alone keeps the limit; the first to confirm saw at most the other's first
    # request, so together at most 7 + 6.
    assert max(passed) <= 7 and 7 <= sum(passed) <= 13, answers
    counting = agent_counting()
    assert counting is not None
    agent_id = Agent.objects.get(name="bursty").pk
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT value FROM {settings.CACHES['default']['LOCATION']} WHERE cache_key = %s",
                       [f"{counting.key_prefix}{agent_id}"])
        assert cursor.fetchone() == ("20",)


def test_the_database_counter_starts_each_window_afresh_in_one_statement(
    db: None, django_assert_num_queries: DjangoAssertNumQueries
) -> None:
    from backplane.api.throttling import _count

    window = int(time.time()) + 60
    with django_assert_num_queries(1):
        assert _count("throttle:test", window_end=window, period=60) == 1
    assert _count("throttle:test", window_end=window, period=60) == 2
    assert _count("throttle:test", window_end=window + 60, period=60) == 1  # the next window
    # A process whose clock is behind counts into the newer window instead of moving it back.
    assert _count("throttle:test", window_end=window, period=60) == 2
    assert _count("throttle:other", window_end=window, period=60) == 1
