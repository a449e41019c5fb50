"""Believable data for the browser tests, written the way agents write it: through the REST API.

The exceptions are the stall detector, which runs in the test process (as Celery beat would
run it) once a lease has run out, and the outbox relay, which runs there too (as the worker
would) with a publisher whose broker refuses one topic.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Count
from django.utils import timezone

from backplane.delivery.models import DeadLetter, DeadLetterStatus, OutboxMessage
from backplane.delivery.relay import PublishError, outbox_relay_until_idle
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


# --- dead letters, made the way the product makes them ------------------------------------------


def stalled_leases(agent: ApiAgent, count: int, *, kind: str, max_attempts: int) -> list[str]:
    """``count`` tasks of ``kind`` (this test's own: the agent claims every pending task of it),
    created and claimed by ``agent`` through the API with 1 s leases that it lets run out, then
    one pass of the stall detector. Each stalled lease counts against the agent's circuit
    breaker: from 3 on (the threshold) it is open afterwards. Returns the task ids, oldest first."""
    tasks = [agent.create_task(kind, {"lead": LEADS[n % len(LEADS)], "n": n}, max_attempts=max_attempts)
             for n in range(count)]
    claimed = [agent.claim([kind], lease_seconds=1)["task"]["task_id"] for _ in tasks]
    lease_ends = timezone.now() + timedelta(seconds=1)
    ids = [task["task_id"] for task in tasks]
    assert sorted(claimed) == sorted(ids), "claimed other tasks than the ones made"
    stall_detector_pass(once_past=lease_ends)
    return ids


def dead_lettered_tasks(agent: ApiAgent, count: int, kind: str = "outreach") -> list[str]:
    """Tasks whose only attempt ran out (``stalled_leases`` with one attempt each): the stall
    detector parked each for review (``TaskStalled``, ``TaskDeadLettered`` and a task dead
    letter). Returns the task ids, oldest first."""
    ids = stalled_leases(agent, count, kind=kind, max_attempts=1)
    parked = DeadLetter.objects.filter(task_id__in=ids, source="task", status=DeadLetterStatus.PENDING).count()
    assert parked == count, f"{parked} of {count} tasks were dead-lettered"
    return ids


def dead_letter_of(task_id: str) -> DeadLetter:
    return DeadLetter.objects.get(task_id=task_id, source="task")


REFUSED_TOPIC = "leads.scored"


def refusing_publisher(message: OutboxMessage, body: dict[str, Any]) -> None:
    """The broker refuses ``REFUSED_TOPIC`` and takes everything else."""
    if message.topic == REFUSED_TOPIC:
        raise PublishError("broker: ConnectionRefusedError [Errno 111] Connection refused")


def scored_lead(agent: ApiAgent, *, score: int = 70) -> str:
    """A task whose agent wrote ``LeadScored`` with an outbox message on ``REFUSED_TOPIC``."""
    task = agent.create_task("lead-qualification", {"lead": LEADS[0]})
    agent.append(task["task_id"], "LeadScored", {"score": score},
                 outbox=[{"topic": REFUSED_TOPIC, "payload": {"lead": LEADS[0], "score": score},
                          "key": f"lead-{task['task_id']}"}])
    return str(task["task_id"])


def relay_pass() -> None:
    """The relay, as the worker runs it, publishing through ``refusing_publisher``: every
    message on ``REFUSED_TOPIC`` fails one attempt (with ``BACKPLANE_OUTBOX_MAX_ATTEMPTS`` at
    1 it is dead at once, and a dead letter); the others are delivered."""
    outbox_relay_until_idle(publish=refusing_publisher, budget_seconds=10)


def failed_compensation(agent: ApiAgent) -> str:
    """A dead letter made inside the web process, as agents make it: a task charges a card
    (declaring a refund as its compensation), fails for good, and the compensating agent reports
    that the refund failed. Returns the task id."""
    task = agent.create_task("billing", {"invoice": "INV-2048"})
    epoch = claim_task(agent, task)
    call = agent.tool_call(task["task_id"], step=1, tool="charge-card", input={"amount": 900}, lease_epoch=epoch,
                           compensation={"tool": "refund-card", "input": {"amount": 900}})
    agent.tool_result(call["idempotency_key"], lease_epoch=epoch, result={"charge": "ch_2"})
    agent.append(task["task_id"], "TaskFailed", {"error": "the customer cancelled", "retryable": False},
                 lease_epoch=epoch)
    [requested] = [e for e in agent.events(task["task_id"]) if e["type"] == "CompensationRequested"]
    agent.call("POST", f"/api/v1/tool-calls/{requested['payload']['compensation_key']}/result/", 201,
               json={"status": "failed", "result": {"error": "the card was closed"}})
    return str(task["task_id"])
