"""Believable data for the browser tests, written the way agents write it: through the REST API.

The one exception is the stall detector, which runs in the test process (as Celery beat would
run it) once a lease has run out.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Count
from django.utils import timezone

from backplane.delivery.models import DeadLetter, DeadLetterStatus
from backplane.eventlog.models import Task, TaskStatus
from recovery.detector import lease_expire_stalled
from tests.browser.conftest import ApiAgent

LEADS = ["ada@example.com", "grace@example.org", "edsger@example.net", "barbara@example.com", "alan@example.org"]


def claim_task(agent: ApiAgent, task: dict[str, Any], **kwargs: Any) -> int:
    """Claim ``task`` (the only pending one of its kind) and return the lease epoch."""
    claim = agent.claim([task["kind"]], **kwargs)
    assert claim["task"]["task_id"] == task["task_id"], "claimed another task than the one meant"
    return int(claim["lease_epoch"])


def steps(agent: ApiAgent, task_id: str, epoch: int, numbers: range) -> None:
    for step in numbers:
        agent.append(task_id, "ReasoningStepCompleted", {"step": step, "thought": f"step {step} of the plan"},
                     lease_epoch=epoch)


def stall_detector_pass(*, once_past: datetime) -> None:
    """One pass of the stall detector once ``once_past`` has gone by. The test process sends no
    live notices (tests/conftest.py turns them off), so pages show its events on load."""
    wait = (once_past - timezone.now()).total_seconds()
    if wait > 0:
        time.sleep(wait + 0.05)
    lease_expire_stalled()


def build_fleet(agent: ApiAgent) -> dict[str, list[str]]:
    """Tasks in every status but ``compensated`` (which needs a compensating agent), with a
    dead letter; returns task ids by status."""
    ids: dict[str, list[str]] = {}

    def keep(status: str, task: dict[str, Any]) -> str:
        ids.setdefault(status, []).append(task["task_id"])
        return str(task["task_id"])

    # First the task whose one attempt stalls: its 1 s lease runs out while the others are made.
    doomed = agent.create_task("outreach", {"lead": LEADS[3]}, max_attempts=1)
    claim_task(agent, doomed, lease_seconds=1)
    lease_ends = timezone.now() + timedelta(seconds=1)

    for n, lead in enumerate(LEADS[:2]):
        task = agent.create_task("lead-qualification", {"lead": lead})
        epoch = claim_task(agent, task)
        steps(agent, task["task_id"], epoch, range(1, 3 + n))
        agent.append(task["task_id"], "TaskCompleted", {"output": {"qualified": n % 2 == 0, "score": 70 + n}},
                     lease_epoch=epoch)
        keep("completed", task)

    task = agent.create_task("research", {"company": "Example Ltd"})
    epoch = claim_task(agent, task, lease_seconds=600)
    steps(agent, task["task_id"], epoch, range(1, 4))
    keep("running", task)

    task = agent.create_task("enrichment", {"lead": LEADS[2]})
    epoch = claim_task(agent, task)
    steps(agent, task["task_id"], epoch, range(1, 2))
    agent.append(task["task_id"], "TaskFailed", {"error": "the CRM refused the lead", "retryable": False},
                 lease_epoch=epoch)
    keep("failed", task)

    task = agent.create_task("billing", {"invoice": "INV-1042"})
    epoch = claim_task(agent, task)
    # A succeeded call that declared a compensation: failing the task for good starts undoing it.
    call = agent.tool_call(task["task_id"], step=1, tool="charge-card", input={"amount": 1200}, lease_epoch=epoch,
                           compensation={"tool": "refund-card", "input": {"amount": 1200}})
    agent.tool_result(call["idempotency_key"], lease_epoch=epoch, result={"charge": "ch_1"})
    agent.append(task["task_id"], "TaskFailed", {"error": "the customer cancelled", "retryable": False},
                 lease_epoch=epoch)
    keep("compensating", task)

    stall_detector_pass(once_past=lease_ends)
    keep("dead_lettered", doomed)

    for lead in LEADS[3:]:
        keep("pending", agent.create_task("lead-qualification", {"lead": lead}))
    return ids


def status_counts() -> dict[str, int]:
    counts = dict(Task.objects.values_list("status").annotate(n=Count("pk")).order_by())
    return {status: counts.get(status, 0) for status in TaskStatus.values}


def dead_letters_pending() -> int:
    return DeadLetter.objects.filter(status=DeadLetterStatus.PENDING).count()


@dataclass
class TaskWithTools:
    """A running parent with a finished tool call, one in flight and a claimed sub-task."""

    parent_id: str
    child_id: str
    epoch: int
    done_key: str
    in_flight_key: str
    child_epoch: int


def build_task_with_tools(agent: ApiAgent) -> TaskWithTools:
    parent = agent.create_task("outreach", {"lead": LEADS[0], "company": "Example Ltd"})
    parent_id = parent["task_id"]
    epoch = claim_task(agent, parent, lease_seconds=600)
    steps(agent, parent_id, epoch, range(1, 2))
    done = agent.tool_call(parent_id, step=2, tool="crm-lookup", input={"email": LEADS[0]}, lease_epoch=epoch)
    agent.tool_result(done["idempotency_key"], lease_epoch=epoch, result={"account": "acct_7", "tier": "gold"})
    steps(agent, parent_id, epoch, range(3, 4))
    child = agent.subtask(parent_id, step=4, kind="research", input={"company": "Example Ltd"}, lease_epoch=epoch)
    child_id = child["task"]["task_id"]
    child_epoch = claim_task(agent, child["task"], lease_seconds=600)
    steps(agent, child_id, child_epoch, range(1, 3))
    in_flight = agent.tool_call(parent_id, step=5, tool="send-email",
                                input={"to": LEADS[0], "subject": "Your quote"}, lease_epoch=epoch)
    assert in_flight["status"] == "dispatched"
    return TaskWithTools(parent_id=parent_id, child_id=child_id, epoch=epoch, done_key=done["idempotency_key"],
                         in_flight_key=in_flight["idempotency_key"], child_epoch=child_epoch)
