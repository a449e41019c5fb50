"""/metrics: behind a bearer token when BACKPLANE_METRICS_TOKEN is set, open without one only where
BACKPLANE_METRICS_OPEN says so (closed in production by default), and
computed with aggregates in the database whatever the number of rows."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

from django.test import Client
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families
from pytest_django.fixtures import DjangoAssertNumQueries

from backplane.eventlog.models import Task
from recovery.models import ToolCall

TOKEN = "scrape-3f9c1e7a"


def _samples(body: bytes) -> dict[str, float]:
    return {sample.name: sample.value for family in text_string_to_metric_families(body.decode())
            for sample in family.samples if not sample.labels}


def test_it_is_open_without_a_token_where_told(client: Client, db: None, settings: Any) -> None:
    settings.BACKPLANE_METRICS_TOKEN = ""
    settings.BACKPLANE_METRICS_OPEN = True
    assert client.get("/metrics").status_code == 200


def test_it_is_closed_without_a_token_unless_told_and_says_what_to_set(client: Client, db: None, settings: Any) -> None:
    settings.BACKPLANE_METRICS_TOKEN = ""
    settings.BACKPLANE_METRICS_OPEN = False
    refused = client.get("/metrics")
    assert refused.status_code == 401 and b"backplane_" not in refused.content
    assert b"BACKPLANE_METRICS_TOKEN" in refused.content and b"BACKPLANE_METRICS_OPEN" in refused.content


def test_it_asks_for_the_token_when_one_is_set(client: Client, db: None, settings: Any) -> None:
    settings.BACKPLANE_METRICS_TOKEN = TOKEN
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {TOKEN}"},
                    {"Authorization": f"Bearer {TOKEN}x"}):
        refused = client.get("/metrics", headers=headers)
        assert refused.status_code == 401 and refused["WWW-Authenticate"].startswith("Bearer")
        assert b"backplane_" not in refused.content
    allowed = client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert allowed.status_code == 200 and b"backplane_tasks" in allowed.content


def test_a_scrape_costs_the_same_queries_at_any_size(client: Client, make_task: Callable[..., Task],
                                                     settings: Any,
                                                     django_assert_max_num_queries: DjangoAssertNumQueries) -> None:
    settings.BACKPLANE_METRICS_TOKEN = ""
    long_ago = timezone.now() - timedelta(hours=2)
    for n in range(12):
        task = make_task()
        Task.objects.filter(pk=task.pk).update(status="running", lease_holder="a", last_event_at=long_ago)
        ToolCall.objects.create(idempotency_key=f"{n:064x}", task=task, step=1, tool="send-email",
                                dispatched_at=long_ago, expires_at=long_ago + timedelta(days=1))
    with django_assert_max_num_queries(15) as captured:
        response = client.get("/metrics")
    assert response.status_code == 200
    samples = _samples(response.content)
    assert samples["backplane_tasks_without_progress"] == 12 and samples["backplane_tool_calls_overdue"] == 12
    # Nothing fetches the rows to count them: every query that reads them is an aggregate.
    for query in captured.captured_queries:
        sql = query["sql"]
        if "backplane_task" in sql and "FROM \"backplane_task\"" in sql or "recovery_toolcall" in sql:
            assert "COUNT(" in sql.upper(), sql
