"""Each list the API answers runs a fixed number of queries, the same for 1 row as for 21."""

from __future__ import annotations

import re
from pathlib import Path

from django.db import connection
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from backplane.eventlog import forks
from tests.api.conftest import AgentClient
from tests.support import list_rows
from tests.support.roles import staff_user

# Every GET of api/urls.py that answers a collection (or, like a recovery context or a diff,
# grows with the log), by its operation. A read per row (a budget's spend, a job's decisions)
# would add 20 to the larger round.
LISTS = {
    "tasks_list": "/api/v1/tasks/",
    "tasks_events_list": "/api/v1/tasks/{task}/events/",
    "tasks_recovery_context": "/api/v1/tasks/{task}/recovery-context/",
    "tasks_diff": "/api/v1/tasks/{task}/diff/{fork}/",
    "pauses_list": "/api/v1/pauses/",
    "budgets_list": "/api/v1/budgets/",
    "tool_policies_list": "/api/v1/tool-policies/",
    "approvals_list": "/api/v1/approvals/",
    "tool_policies_versions_list": "/api/v1/tool-policies/{policy}/versions/",
    "jobs_list": "/api/v1/jobs/",
    "jobs_read": "/api/v1/jobs/{job}/",
    "jobs_items_list": "/api/v1/jobs/{job}/items/",
    "dead_letters_list": "/api/v1/dead-letters/",
}
# What an agent lists: its namespace's tasks and a task's events.
AGENT_LISTS = ("tasks_list", "tasks_events_list")


def queries_per_list(staff: APIClient, agent: AgentClient, paths: dict[str, str]) -> dict[str, int]:
    counted = {}
    for name, path in paths.items():
        with CaptureQueriesContext(connection) as captured:
            assert staff.get(path).status_code == 200, (path, staff.get(path).content[:300])
        counted[name] = len(captured.captured_queries)
    for name in AGENT_LISTS:
        with CaptureQueriesContext(connection) as captured:
            assert agent.get(paths[name]).status_code == 200, paths[name]
        counted[f"{name} (agent)"] = len(captured.captured_queries)
    return counted


def test_no_list_runs_more_queries_for_more_rows(alice: AgentClient) -> None:
    staff = APIClient()
    staff.force_login(staff_user("dana", "Operators", "Reviewers"))
    rows = list_rows.start()
    fork = forks.task_fork(namespace=None, source_task_id=rows.task.pk, at_seq=1, reason="measure",
                           forked_by="user:dana", by_staff=True).task
    paths = {name: path.format(task=rows.task.pk, fork=fork.pk, job=rows.job.pk, policy=rows.policy.pk)
             for name, path in LISTS.items()}
    list_rows.grow(rows, 1)
    # The agent's first request notes when it was last seen (a write at most every 30 s): not a read.
    alice.get(paths["tasks_list"])
    one = queries_per_list(staff, alice, paths)
    list_rows.grow(rows, 20)
    assert queries_per_list(staff, alice, paths) == one


def test_every_list_operation_of_the_contract_is_counted() -> None:
    """A list added to the API is added here too, or this fails: docs/openapi.yaml is the judge."""
    spec = (Path(__file__).resolve().parents[2] / "docs" / "openapi.yaml").read_text()
    operations = set(re.findall(r"operationId: ([a-z_]+_list)\b", spec))
    assert operations and operations <= set(LISTS), operations - set(LISTS)
