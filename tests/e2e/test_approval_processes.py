"""Approvals with real processes: an agent SIGKILLed while it waits for people is restarted,
finds its request, the approval arrives, and the tool acts once; an agent waiting when its request
expires fails its task; an agent that gives the task back leaves it waiting, handed to no agent
until people decide. Each chain verifies over the API."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from datetime import timedelta

import httpx
import pytest
from django.utils import timezone

from backplane.eventlog import services
from backplane.eventlog.models import Event, Task
from recovery import approvals
from recovery.detector import lease_expire_stalled
from recovery.models import ApprovalRequest
from tests.e2e.conftest import ROOT, AgentRun, BackplaneServer, ToolServer
from tests.support.roles import role_group, staff_user

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("committed_db")]

AGENT = ROOT / "tests" / "e2e" / "approval_agent.py"


def start_agent(server: BackplaneServer, token: str, *options: str) -> AgentRun:
    env = {k: v for k, v in os.environ.items() if k not in {"DJANGO_SETTINGS_MODULE", "DATABASE_URL"}}
    env.update(PYTHONPATH=str(ROOT), BACKPLANE_TOKEN=token)
    return AgentRun(subprocess.Popen([sys.executable, str(AGENT), "--base-url", server.url, "--kind", "payment",
                                      *options],
                                     cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))


def gate_payments() -> None:
    role_group("Approvers")
    approvals.tool_policy_set(tool="payments.transfer", condition="amount > 1000", field_types={"amount": "number"},
                              approver_group="Approvers", set_by="user:olivia", reason="finance rule",
                              open_seconds=60)


def payment_task(tool_server: ToolServer) -> Task:
    return services.task_create(namespace="acme", kind="payment", agent="planner", input={
        "tool_url": tool_server.url("pay"), "payment": {"payee": "ACME GmbH", "amount": 5000}}).task


def assert_chain_verifies(server: BackplaneServer, token: str, task: Task) -> None:
    answer = httpx.get(f"{server.url}/api/v1/tasks/{task.pk}/verify/", headers={"Authorization": f"Bearer {token}"},
                       timeout=30).json()
    assert answer["valid"] is True and answer["checked"] == Task.objects.get(pk=task.pk).last_seq, answer


def wait_for_request(run: AgentRun, task: Task) -> ApprovalRequest:
    deadline = time.monotonic() + 30
    while not ApprovalRequest.objects.filter(task=task).exists():
        assert run.process.poll() is None and time.monotonic() < deadline, run.describe()
        time.sleep(0.05)
    return ApprovalRequest.objects.get(task=task)


def test_an_agent_killed_while_it_waits_finds_its_request_and_the_tool_acts_once(
    backplane_server: BackplaneServer, tool_server: ToolServer,
) -> None:
    approver = staff_user("ana", "Approvers")
    approvals.tool_policy_set(tool="payments.transfer", condition="amount > 1000", field_types={"amount": "number"},
                              approver_group="Approvers", set_by="user:olivia", reason="finance rule")
    token = services.agent_create(name="payer", namespace="acme").token
    task = services.task_create(namespace="acme", kind="payment", agent="planner", input={
        "tool_url": tool_server.url("pay"), "payment": {"payee": "ACME GmbH", "amount": 5000}}).task

    first = start_agent(backplane_server, token)
    deadline = time.monotonic() + 30
    while not ApprovalRequest.objects.filter(task=task).exists():
        assert first.process.poll() is None and time.monotonic() < deadline, first.describe()
        time.sleep(0.05)
    time.sleep(1.0)  # well inside its wait for the decision (reads of up to 30 s each)
    assert first.process.poll() is None, "the agent stopped instead of waiting"
    first.process.send_signal(signal.SIGKILL)
    assert first.wait() == -signal.SIGKILL
    assert not tool_server.requests, "the tool was called before the approval"

    request = ApprovalRequest.objects.get(task=task)
    approvals.approval_decide(approval_id=request.pk, user=approver, verdict="approve", reason="checked the invoice")
    # The dead agent's lease runs out; the detector hands the task on.
    assert lease_expire_stalled(now=timezone.now() + timedelta(hours=1)).expired == 1

    second = start_agent(backplane_server, token)
    assert second.wait(timeout=60) == 0, second.describe()
    paid = second.reported("paid")[0]
    assert paid["status"] == "succeeded" and tool_server.effects == {paid["key"]: 1}
    types = list(Event.objects.filter(task=task).values_list("type", flat=True))
    assert (types.count("ApprovalRequested"), types.count("ApprovalGranted"), types.count("ToolCallDispatched")) == \
        (1, 1, 1)
    assert ApprovalRequest.objects.filter(task=task).count() == 1 and types[-1] == "TaskCompleted"
    assert_chain_verifies(backplane_server, token, task)


def test_an_agent_waiting_when_its_request_expires_fails_its_task_and_pays_nothing(
    backplane_server: BackplaneServer, tool_server: ToolServer,
) -> None:
    gate_payments()
    token = services.agent_create(name="payer", namespace="acme").token
    task = payment_task(tool_server)
    agent = start_agent(backplane_server, token)
    wait_for_request(agent, task)
    time.sleep(0.5)  # the agent is in its wait
    # What the expire-approvals duty runs every 5 s, at the request's deadline.
    assert approvals.approvals_expire(now=timezone.now() + timedelta(seconds=61)) == 1
    assert agent.wait(timeout=60) == 5, agent.describe()
    assert agent.reported("refused")[0]["code"] == "approval_expired" and not tool_server.requests
    task.refresh_from_db()
    assert task.status == "failed"
    types = list(Event.objects.filter(task=task).order_by("seq").values_list("type", flat=True))
    assert types[-3:] == ["ApprovalRequested", "ApprovalExpired", "TaskFailed"] and "ToolCallDispatched" not in types
    assert_chain_verifies(backplane_server, token, task)


def test_a_task_given_back_waits_for_people_with_no_agent_then_pays_once(
    backplane_server: BackplaneServer, tool_server: ToolServer,
) -> None:
    gate_payments()
    token = services.agent_create(name="payer", namespace="acme").token
    task = payment_task(tool_server)
    impatient = start_agent(backplane_server, token, "--patience", "1")
    request = wait_for_request(impatient, task)
    assert impatient.wait(timeout=60) == 4, impatient.describe()
    task.refresh_from_db()
    assert (task.status, task.lease_holder) == ("pending", None)

    # Nobody is handed it while people have not decided: a second agent finds nothing to claim.
    idle = start_agent(backplane_server, token, "--claim-timeout", "2")
    assert idle.wait(timeout=60) == 3, idle.describe()

    approvals.approval_decide(approval_id=request.pk, user=staff_user("ana", "Approvers"), verdict="approve",
                              reason="checked the invoice")
    last = start_agent(backplane_server, token)
    assert last.wait(timeout=60) == 0, last.describe()
    paid = last.reported("paid")[0]
    assert paid["status"] == "succeeded" and tool_server.effects == {paid["key"]: 1}
    claims = Event.objects.filter(task=task, type="TaskClaimed").count()
    assert claims == 2 and ApprovalRequest.objects.filter(task=task).count() == 1  # the first, then the last
    assert_chain_verifies(backplane_server, token, task)
