"""The lease's holder alone writes (docs/api.md, "Tasks and events"): another agent of the namespace,
even one that read the right epoch off the task, is 409 stale_lease on every write route, and
nothing is written. A token limited to kinds writes only tasks of those kinds (and the tasks it
dispatched); reads stay namespace-wide. Staff sessions write only through the staff actions."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth.models import User
from rest_framework.test import APIClient

from backplane.eventlog.models import Task
from recovery.models import Tool
from tests.api.conftest import AgentClient, assert_error, claim, create_task, row_counts

Counts = Callable[[], dict[str, int]]


@pytest.fixture
def holder(make_agent: Callable[..., AgentClient]) -> AgentClient:
    return make_agent("payout-1", "acme", kinds=("payout",))


@pytest.fixture
def intruder(make_agent: Callable[..., AgentClient]) -> AgentClient:
    """Same namespace, may touch every kind: only the lease keeps it out."""
    return make_agent("crm-1", "acme")


@pytest.fixture
def leased(holder: AgentClient) -> dict[str, Any]:
    """A payout task held by ``holder``, with one tool call dispatched under the lease."""
    task = create_task(holder, kind="payout", input={"amount": 1200})
    lease = claim(holder, kinds=["payout"])
    assert lease["task"]["task_id"] == task["task_id"]
    dispatched = holder.post(f"/api/v1/tasks/{task['task_id']}/tool-calls/",
                             {"step": 1, "tool": "bank", "input": {"amount": 1200},
                              "lease_epoch": lease["lease_epoch"]}, format="json")
    assert dispatched.status_code == 201, dispatched.content
    Tool.objects.create(name="bank", namespace="acme", url="http://127.0.0.1:9/bank", timeout_seconds=1)
    return {"task_id": task["task_id"], "epoch": lease["lease_epoch"], "key": dispatched.json()["idempotency_key"]}


def writes(leased: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    task_id, epoch = leased["task_id"], leased["epoch"]
    return [
        (f"/api/v1/tasks/{task_id}/events/",
         {"type": "TaskCompleted", "payload": {"output": {"paid": "to mallory"}}, "lease_epoch": epoch}),
        (f"/api/v1/tasks/{task_id}/events/batch/",
         {"lease_epoch": epoch, "events": [{"type": "ReasoningStepCompleted", "payload": {"step": 9}}]}),
        (f"/api/v1/tasks/{task_id}/tool-calls/",
         {"step": 2, "tool": "bank", "input": {"amount": 1}, "lease_epoch": epoch}),
        (f"/api/v1/tool-calls/{leased['key']}/result/",
         {"status": "succeeded", "result": {"paid": True}, "lease_epoch": epoch}),
        (f"/api/v1/tasks/{task_id}/subtasks/",
         {"step": 3, "kind": "payout", "input": {"amount": 5}, "lease_epoch": epoch}),
        ("/api/v1/tools/bank/invoke/", {"task_id": task_id, "step": 4, "input": {}, "lease_epoch": epoch}),
        (f"/api/v1/tasks/{task_id}/heartbeat/", {"lease_epoch": epoch}),
        (f"/api/v1/tasks/{task_id}/release/", {"lease_epoch": epoch}),
    ]


ROUTES = ["append", "batch", "tool call", "tool result", "sub-task", "invoke", "heartbeat", "release"]


@pytest.mark.parametrize("route", range(len(ROUTES)), ids=ROUTES)
def test_it_refuses_another_agent_writing_with_the_holders_epoch(
    leased: dict[str, Any], intruder: AgentClient, route: int
) -> None:
    path, body = writes(leased)[route]
    # The intruder reads the epoch off the task, as anyone in the namespace may.
    read = intruder.get(f"/api/v1/tasks/{leased['task_id']}/")
    assert read.status_code == 200 and read.json()["lease"]["epoch"] == leased["epoch"]
    before, task_before = row_counts(), Task.objects.get(pk=leased["task_id"])
    assert_error(intruder.post(path, body, format="json"), 409, "stale_lease")
    task = Task.objects.get(pk=leased["task_id"])
    assert row_counts() == before
    assert (task.status, task.last_seq, task.lease_holder, task.lease_expires_at) == (
        task_before.status, task_before.last_seq, "payout-1", task_before.lease_expires_at)


def test_the_holder_writes_under_its_lease(leased: dict[str, Any], holder: AgentClient) -> None:
    path, body = writes(leased)[0]
    answer = holder.post(path, body, format="json")
    assert answer.status_code == 201, answer.content
    assert Task.objects.get(pk=leased["task_id"]).status == "completed"


def test_a_token_limited_to_kinds_reads_but_does_not_write_other_kinds(
    make_agent: Callable[..., AgentClient], counts: Counts
) -> None:
    payer = make_agent("payer", "acme")
    crm = make_agent("crm-only", "acme", kinds=("crm",))
    payout = create_task(payer, kind="payout", input={"amount": 1})  # pending: no lease to hold it
    assert crm.get(f"/api/v1/tasks/{payout['task_id']}/").status_code == 200
    assert crm.get(f"/api/v1/tasks/{payout['task_id']}/events/").status_code == 200
    before = counts()
    denied = assert_error(crm.post(f"/api/v1/tasks/{payout['task_id']}/events/",
                                   {"type": "TaskCompleted", "payload": {"output": {}}}, format="json"),
                          403, "permission_denied")
    assert denied["details"] == {"kind": "payout"}
    assert_error(crm.post(f"/api/v1/tasks/{payout['task_id']}/tool-calls/",
                          {"step": 1, "tool": "bank", "input": {}}, format="json"), 403, "permission_denied")
    assert_error(crm.post("/api/v1/tasks/", {"kind": "payout", "input": {}}, format="json"), 403,
                 "permission_denied")
    assert counts() == before
    assert Task.objects.get(pk=payout["task_id"]).last_seq == 1


def test_a_token_limited_to_kinds_writes_the_sub_tasks_it_dispatches(
    make_agent: Callable[..., AgentClient],
) -> None:
    crm = make_agent("crm-only", "acme", kinds=("crm",))
    own = create_task(crm, kind="crm", input={})
    lease = claim(crm, kinds=["crm"])
    child = crm.post(f"/api/v1/tasks/{own['task_id']}/subtasks/",
                     {"step": 1, "kind": "research", "input": {"q": 1}, "lease_epoch": lease["lease_epoch"]},
                     format="json")
    assert child.status_code == 201, child.content
    child_id = child.json()["task"]["task_id"]
    noted = crm.post(f"/api/v1/tasks/{child_id}/events/", {"type": "Noted", "payload": {}}, format="json")
    assert noted.status_code == 201, noted.content
    # ...and creates sub-tasks of its own tasks through POST /tasks/ too.
    created = crm.post("/api/v1/tasks/", {"kind": "research", "input": {}, "parent_task_id": own["task_id"]},
                       format="json")
    assert created.status_code == 201, created.content


def test_a_staff_session_does_not_write_as_an_agent(leased: dict[str, Any]) -> None:
    staff = APIClient()
    staff.force_login(User.objects.create_superuser("root", password="pw"))
    before = row_counts()
    for path, body in writes(leased):
        assert_error(staff.post(path, body, format="json"), 403, "permission_denied")
    assert_error(staff.post("/api/v1/leases/", {}, format="json"), 403, "permission_denied")
    assert_error(staff.post("/api/v1/tasks/", {"kind": "payout", "input": {}}, format="json"), 403,
                 "permission_denied")
    assert row_counts() == before
    # Reads stay open to staff.
    assert staff.get(f"/api/v1/tasks/{leased['task_id']}/").status_code == 200
