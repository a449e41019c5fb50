"""Each page runs a fixed number of queries, the same for 10 rows as for 1,000."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from backplane.eventlog import forks, services
from backplane.eventlog.models import Task
from backplane.eventlog.writer import EventDraft
from tests.dashboard.conftest import History, reviewers_group
from tests.support import list_rows

# The session and its user are two of them on every page. A task page reads its forks (and a
# fork's page where it came from); the diff reads each history range by range, one query per
# range of up to 5,000 events (backplane/eventlog/lineage.py), and the tasks its events are in.
# The overview and a task's page read their model spend from the cost rollups in one query each.
# The overview's saved searches: the pinned ones, the firing rules, the recent resolutions (their
# counts add one statement for all pinned searches, when there are some).
# The pauses in force (recovery/selectors.py) are one more on the overview, and a pending task's page
# (the fork here) reads the pause that may hold it back. The task list asks once whether the
# user may review (its bulk bar makes a bulk job, which is for reviewers only).
# Every page adds 2 for who may look (the user's and their groups' permissions) and 1 for the
# user's staff scope (the overview refuses a scoped user; the task pages scope to it), the diff 3
# more (the task looked up in it, for each of two, and the scope again).
_ROLE = 2
BOUNDS = {"overview": 13 + _ROLE + 1, "overview-live": 13 + _ROLE + 1, "tasks": 5 + _ROLE + 1,
          "tasks-search": 5 + _ROLE + 1, "task": 11 + _ROLE + 1, "task-live": 10 + _ROLE + 1,
          "fork": 13 + _ROLE + 1, "diff": 10 + _ROLE + 4}


def pages(history: History, fork: Task) -> dict[str, str]:
    return {
        "overview": "/",
        "overview-live": "/live/overview/?after_position=0",
        "tasks": "/tasks/",
        "tasks-search": "/tasks/?q=cus_NEEDLE_4711&status=running",
        "task": f"/tasks/{history.task.pk}/",
        "task-live": f"/tasks/{history.task.pk}/live/?after_seq=0",
        "fork": f"/tasks/{fork.pk}/",
        "diff": f"/tasks/{history.task.pk}/diff/{fork.pk}/",
    }


def queries_per_page(client: Client, history: History, fork: Task) -> dict[str, int]:
    counted = {}
    for name, path in pages(history, fork).items():
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
    fork = forks.task_fork(namespace=None, source_task_id=history.task.pk, at_seq=3, reason="measure",
                           forked_by="user:olivia", by_staff=True).task
    grow(history, make_task, tasks=10, events=10)
    small = queries_per_page(olivia_client, history, fork)
    grow(history, make_task, tasks=990, events=990)
    large = queries_per_page(olivia_client, history, fork)
    assert large == small
    for name, path in pages(history, fork).items():
        with django_assert_max_num_queries(BOUNDS[name]):
            olivia_client.get(path)


# --- the other list pages ------------------------------------------------------------------------

# Every page that lists rows, by its name in dashboard/urls.py (a list included from a page's own
# module by the name it has there). Each runs the same queries for 1 row of each kind as for 21:
# a read per row (a budget's spend, a job's decisions, a search's rules) would add 20.
LIST_PAGES = {
    "approvals": "/approvals/",
    "approvals-waiting": "/approvals/?partial=waiting",
    "budgets": "/budgets/",
    "pauses": "/pauses/",
    "dead-letters": "/dead-letters/",
    "jobs": "/jobs/",
    "job": "/jobs/{job}/",
    "searches": "/searches/",
    "searches-counts": "/searches/?partial=counts",
    "agents": "/agents/",
    "outbox": "/outbox/",
    "integrity": "/integrity/",
}


def queries_per_list_page(client: Client, rows: list_rows.ListRows) -> dict[str, int]:
    counted = {}
    for name, path in LIST_PAGES.items():
        with CaptureQueriesContext(connection) as captured:
            assert client.get(path.format(job=rows.job.pk)).status_code == 200, path
        counted[name] = len(captured.captured_queries)
    return counted


def test_no_list_page_runs_more_queries_for_more_rows(olivia: User) -> None:
    # A reviewer as well as an operator: the job pages show what a reviewer may do.
    olivia.groups.add(reviewers_group())
    client = Client()
    client.force_login(olivia)
    rows = list_rows.start()
    list_rows.grow(rows, 1)
    one = queries_per_list_page(client, rows)
    list_rows.grow(rows, 20)
    assert queries_per_list_page(client, rows) == one
