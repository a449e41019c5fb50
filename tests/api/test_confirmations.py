"""Agents confirmed with the database once per interval, their requests counted in process
meanwhile (backplane/api/confirmations.py): what holds with the interval on, as in production."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator

import pytest
from django.conf import settings as django_settings
from django.db import connection
from django.test.utils import CaptureQueriesContext
from pytest_django.fixtures import Settings
from rest_framework.test import APIClient

from backplane.api.confirmations import confirmations
from backplane.api.throttling import agent_counting, rate_limit_wait
from backplane.eventlog.models import Agent, hash_token
from tests.api.conftest import AgentClient, assert_error, create_task


@pytest.fixture(autouse=True)
def confirming(settings: Settings) -> Iterator[None]:
    settings.BACKPLANE_AUTH_CONFIRM_SECONDS = 60.0
    settings.BACKPLANE_RATE_LIMIT = "1000/m"
    confirmations.clear()
    yield
    confirmations.clear()


def shared_count(agent: AgentClient) -> int:
    counting = agent_counting()
    assert counting is not None
    agent_id = Agent.objects.get(token_hash=hash_token(agent.token)).pk
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT value FROM {django_settings.CACHES['default']['LOCATION']} WHERE cache_key = %s",
                       [f"{counting.key_prefix}{agent_id}"])
        return int(cursor.fetchone()[0])


def expire_confirmations() -> None:
    """As if the interval had passed since every confirmation."""
    for found in confirmations._by_token.values():
        found.confirmed_at -= 3600


@pytest.mark.django_db
def test_within_the_interval_a_read_is_one_statement_and_the_count_comes_later(alice: AgentClient) -> None:
    task = create_task(alice)  # through DRF: counted in the shared counter at once
    url = f"/api/v1/tasks/{task['task_id']}/"
    assert alice.get(url).status_code == 200  # confirms: the agent's statement
    assert shared_count(alice) == 2
    with CaptureQueriesContext(connection) as queries:
        for _ in range(3):
            assert alice.get(url).status_code == 200
    assert [q["sql"] for q in queries.captured_queries if "backplane_agent" in q["sql"]] == []
    assert len(queries.captured_queries) == 3  # the task's row, three times
    assert shared_count(alice) == 2  # counted here, not yet there
    expire_confirmations()
    assert alice.get(url).status_code == 200  # confirms again, handing over the three
    assert shared_count(alice) == 6


@pytest.mark.django_db
def test_a_deactivated_agent_is_refused_at_the_next_confirmation(alice: AgentClient) -> None:
    task = create_task(alice)
    url = f"/api/v1/tasks/{task['task_id']}/"
    assert alice.get(url).status_code == 200
    Agent.objects.filter(name="alice").update(is_active=False)
    assert alice.get(url).status_code == 200  # within the interval: served from the confirmation
    expire_confirmations()
    assert_error(alice.get(url), 401, "not_authenticated")
    assert_error(alice.get(url), 401, "not_authenticated")  # and no confirmation is left to serve it


@pytest.mark.django_db
def test_the_limit_is_exact_in_one_process_and_a_429_is_decided_on_the_shared_count(
    alice: AgentClient, settings: Settings
) -> None:
    settings.BACKPLANE_RATE_LIMIT = "5/m"
    task = create_task(alice)  # one (DRF)
    url = f"/api/v1/tasks/{task['task_id']}/"
    assert [alice.get(url).status_code for _ in range(4)] == [200] * 4  # two to five
    assert shared_count(alice) == 2  # the first lean request confirmed; three counted here
    limited = alice.get(url)  # six: past the limit here, so it confirms with everything counted
    assert_error(limited, 429, "rate_limited")
    assert 1 <= int(limited["Retry-After"]) <= 60
    assert shared_count(alice) == 6


@pytest.mark.django_db
def test_one_process_counts_a_tokens_drf_and_lean_requests_alike(alice: AgentClient, settings: Settings) -> None:
    settings.BACKPLANE_RATE_LIMIT = "4/m"
    task = create_task(alice)  # one (DRF; nothing confirmed yet)
    url = f"/api/v1/tasks/{task['task_id']}/"
    assert alice.get(url).status_code == 200  # two, confirmed
    assert alice.get(url, HTTP_ACCEPT="application/json; indent=2").status_code == 200  # three (DRF)
    assert alice.get(url).status_code == 200  # four, counted here on top of the DRF path's three
    assert_error(alice.get(url), 429, "rate_limited")  # five


@pytest.mark.django_db
def test_another_process_counting_is_seen_at_the_next_confirmation(alice: AgentClient, settings: Settings) -> None:
    settings.BACKPLANE_RATE_LIMIT = "6/m"
    task = create_task(alice)  # one
    url = f"/api/v1/tasks/{task['task_id']}/"
    assert alice.get(url).status_code == 200  # two, confirmed
    agent_id = Agent.objects.get(token_hash=hash_token(alice.token)).pk
    for _ in range(3):  # three to five, counted by another process (no token: nothing noted here)
        assert rate_limit_wait(f"throttle:agent:{agent_id}") is None
    assert alice.get(url).status_code == 200  # six by the shared count, three by this process's
    expire_confirmations()
    assert_error(alice.get(url), 429, "rate_limited")  # seven: the confirmation sees all of them


@pytest.mark.django_db(transaction=True)
def test_concurrent_requests_in_one_process_pass_the_limit_exactly_as_often_as_it_allows(
    committed_db: None, make_agent: Callable[..., AgentClient], settings: Settings
) -> None:
    settings.BACKPLANE_RATE_LIMIT = "40/h"
    agent = make_agent("racer", "acme")
    task = create_task(agent)  # one
    url = f"/api/v1/tasks/{task['task_id']}/"
    statuses: Counter[int] = Counter()
    lock = threading.Lock()
    start = threading.Barrier(8)

    def worker() -> None:
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {agent.token}")
        start.wait()
        try:
            for _ in range(10):
                code = client.get(url).status_code
                with lock:
                    statuses[code] += 1
        finally:
            connection.close()

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert statuses == {200: 39, 429: 41}
    expire_confirmations()
    assert agent.get(url).status_code == 429
    assert shared_count(agent) == 82  # every request counted once, the ones counted here included


def test_confirmations_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    import backplane.api.confirmations as module

    monkeypatch.setattr(module, "MAX_CONFIRMED", 4)
    for n in range(4):
        confirmations.hand_over(f"token{n}", window_end=1, own=1)
        confirmations.confirm(f"token{n}", row=(), window_end=1, shared_count=1, handed=1, now=time.monotonic())
    confirmations.hand_over("token1", window_end=1, own=1)  # token1 is being confirmed: kept
    confirmations.hand_over("new", window_end=1, own=1)
    assert set(confirmations._by_token) == {"token1", "token3", "new"}  # the two oldest idle ones went
