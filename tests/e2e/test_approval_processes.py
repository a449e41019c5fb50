"""Approvals with real processes: an agent SIGKILLed while it waits for people is restarted,
finds its request, the approval arrives, and the tool acts once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from datetime import timedelta

import pytest
from django.utils import timezone

from backplane.eventlog import services
from backplane.eventlog.models import Event
from recovery import approvals
from recovery.detector import lease_expire_stalled
from recovery.models import ApprovalRequest
from tests.e2e.conftest import ROOT, AgentRun, BackplaneServer, ToolServer
from tests.support.roles import staff_user

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("committed_db")]

AGENT = ROOT / "tests" / "e2e" / "approval_agent.py"


def start_agent(server: BackplaneServer, token: str) -> AgentRun:
    env = {k: v for k, v in os.environ.items() if k not in {"DJANGO_SETTINGS_MODULE", "DATABASE_URL"}}
    env.update(PYTHONPATH=str(ROOT), BACKPLANE_TOKEN=token)
    return AgentRun(subprocess.Popen([sys.executable, str(AGENT), "--base-url", server.url, "--kind", "payment"],
                                     cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))


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
