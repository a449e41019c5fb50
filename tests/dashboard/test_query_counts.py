"""Each page runs a fixed number of queries, the same for 10 rows as for 1,000."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from backplane.eventlog import services
from backplane.eventlog.writer import EventDraft
from tests.dashboard.conftest import History

# The session and its user are two of them on every page.
BOUNDS = {"overview": 8, "overview-live": 8, "tasks": 4, "tasks-search": 4, "task": 9, "task-live": 9}


def pages(history: History) -> dict[str, str]:
    return {
        "overview": "/",
        "overview-live": "/live/overview/?after_position=0",
        "tasks": "/tasks/",
        "tasks-search": "/tasks/?q=cus_NEEDLE_4711&status=running",
        "task": f"/tasks/{history.task.pk}/",
        "task-live": f"/tasks/{history.task.pk}/live/?after_seq=0",
    }


def queries_per_page(client: Client, history: History) -> dict[str, int]:
    counted = {}
    for name, path in pages(history).items():
        with CaptureQueriesContext(connection) as captured:
            assert client.get(path).status_code == 200, path
        counted[name] = len(captured.captured_queries)
    return counted


def grow(history: History, make_task: Callable[..., Any], *, tasks: int, events: int) -> None:
    for n in range(tasks):
        make_task(input={"n": n})
    drafts = [EventDraft(type="ReasoningStepCompleted", payload={"step": n + 10, "thought": f"t{n}"})
              for n in range(events)]
    services.event_append_batch(namespace="acme", task_id=history.task.pk, drafts=drafts, agent="qualifier-1",
                                lease_epoch=history.epoch)


@pytest.mark.slow
def test_no_page_runs_more_queries_for_more_rows(olivia_client: Client, make_history: Any, make_task: Any,
                                                 django_assert_max_num_queries: Any) -> None:
    history: History = make_history()
    grow(history, make_task, tasks=10, events=10)
    small = queries_per_page(olivia_client, history)
    grow(history, make_task, tasks=990, events=990)
    large = queries_per_page(olivia_client, history)
    assert large == small
    for name, path in pages(history).items():
        with django_assert_max_num_queries(BOUNDS[name]):
            olivia_client.get(path)
