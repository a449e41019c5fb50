"""Rows for every list the dashboard and the API show, written in bulk: the query-count tests
(tests/dashboard/test_query_counts.py, tests/api/test_query_counts.py) load each list once with
a few rows and again with many, and the two counts must be equal.

Every round writes ``n`` of each, all of them different from the earlier rounds' (a round's
number is in their keys), and each budget scope has spend in the cost rollups, so a list that
reads per row (a spend, a decision, a rule) runs more queries in the larger round."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal

from django.contrib.auth.models import Group, User
from django.utils import timezone

from backplane.delivery.models import DeadLetter
from backplane.eventlog import services
from backplane.eventlog.event_types import prompt_sha256
from backplane.eventlog.models import ModelPrice, Task
from backplane.eventlog.writer import EventDraft
from backplane.integrity.models import VerificationRun
from recovery.models import (
    AlertRule,
    AlertState,
    AlertTransition,
    ApprovalDecision,
    ApprovalRequest,
    Budget,
    BudgetDecision,
    BulkItemStatus,
    BulkJob,
    BulkJobDecision,
    BulkJobItem,
    Pause,
    SavedSearch,
    Tool,
    ToolPolicy,
)


@dataclass
class ListRows:
    """What the rounds wrote that a list is read through: a task with events, a job with items."""

    task: Task
    job: BulkJob
    policy: ToolPolicy
    rounds: int = 0


def spend(task: Task, *, calls: int, first_step: int) -> None:
    """Priced model calls on ``task`` (by agent ``qualifier-1``): spend for the namespace's, the
    agent's and the tree's rollups."""
    for token_type in ("input", "output"):
        ModelPrice.objects.get_or_create(provider="acme-ai", model="m", token_type=token_type,
                                         valid_from="2026-01-01T00:00Z",
                                         defaults={"per_million": Decimal(1), "version": "v1"})
    for step in range(first_step, first_step + calls):
        services.event_append(namespace=task.namespace, task_id=task.pk, agent="qualifier-1", draft=EventDraft(
            type="LLMCalled", payload={"step": step, "model": "m", "provider": "acme-ai",
                                       "prompt_sha256": prompt_sha256("p"), "output": {},
                                       "usage": {"input_tokens": 1000, "output_tokens": 10}}))


def start() -> ListRows:
    task = services.task_create(namespace="acme", kind="lead-qualification", input={"n": 0}, agent="planner").task
    job = BulkJob.objects.create(action="retry", selection={"ids": []}, selection_hash="0" * 64, reason="measure",
                                 created_by="user:ops", created_at=timezone.now())
    approvers, _ = Group.objects.get_or_create(name="Approvers")
    policy = ToolPolicy.objects.create(tool="payments.transfer", version=1, is_current=False, approver_group=approvers,
                                       set_by="user:ops", reason="measure", created_at=timezone.now())
    return ListRows(task=task, job=job, policy=policy)


def grow(rows: ListRows, n: int) -> None:
    """``n`` more of every listed row."""
    rows.rounds += 1
    round_, now = rows.rounds, timezone.now()
    tasks = [services.task_create(namespace="acme", kind="lead-qualification", input={"round": round_, "n": i},
                                  agent="planner").task for i in range(n)]
    spend(rows.task, calls=n, first_step=round_ * 10_000)

    budgets = Budget.objects.bulk_create(
        [Budget(scope="namespace", key="acme" if round_ == 1 and i == 0 else f"ns-{round_}-{i}", period="day",
                unit="currency", currency="USD", limit=Decimal("0.5")) for i in range(n)]
        + [Budget(scope="agent", key="acme/qualifier-1" if round_ == 1 and i == 0 else f"acme/agent-{round_}-{i}",
                  period="day", unit="tokens", limit=Decimal(100_000)) for i in range(n)]
        + [Budget(scope="task", key=str(rows.task.pk) if round_ == 1 and i == 0 else str(uuid.uuid4()),
                  period="task", unit="tokens", limit=Decimal(100_000)) for i in range(n)])
    BudgetDecision.objects.bulk_create(
        BudgetDecision(budget=budget, action="set", new_limit=budget.limit, spend=Decimal(0), decided_by="user:ops",
                       reason="measure", at=now) for budget in budgets)

    Pause.objects.bulk_create(
        [Pause(namespace=f"held-{round_}-{i}", reason="measure", paused_by="user:ops", paused_at=now)
         for i in range(n)]
        + [Pause(namespace=f"lifted-{round_}-{i}", reason="measure", paused_by="user:ops", paused_at=now,
                 resumed_by="user:ops", resumed_at=now, resume_reason="done") for i in range(n)])

    DeadLetter.objects.bulk_create(
        DeadLetter(source="outbox" if i % 2 else "task", reference=f"r-{round_}-{i}", task=tasks[i],
                   topic="backplane.tasks", payload={"n": i}, error="broker: Connection refused", attempts=5,
                   created_at=now - timedelta(seconds=i), status="pending" if i % 4 else "requeued")
        for i in range(n))

    jobs = BulkJob.objects.bulk_create(
        BulkJob(action="cancel", selection={"ids": []}, selection_hash="0" * 64, reason="measure",
                created_by="user:ops", created_at=now) for _ in range(n))
    BulkJobDecision.objects.bulk_create(
        BulkJobDecision(job=job, action="create", decided_by="user:ops", reason="measure", at=now) for job in jobs)
    first = rows.job.items.count()
    BulkJobItem.objects.bulk_create(
        BulkJobItem(job=rows.job, index=first + i, target=str(tasks[i].pk), planned="retry",
                    status=BulkItemStatus.values[i % len(BulkItemStatus.values)]) for i in range(n))
    BulkJob.objects.filter(pk=rows.job.pk).update(total=first + n)

    searches = SavedSearch.objects.bulk_create(
        SavedSearch(name=f"search {round_}-{i}", slug=f"search-{round_}-{i}", filter={"status": "pending"},
                    pinned=True, created_by="user:ops", created_at=now) for i in range(n))
    rules = AlertRule.objects.bulk_create(
        AlertRule(search=search, window_seconds=300, threshold=1, state=AlertState.FIRING, state_since=now,
                  created_by="user:ops", created_at=now) for search in searches)
    AlertTransition.objects.bulk_create(
        AlertTransition(rule=rule, search_name=rule.search.name, state=state, count=1, threshold=1,
                        window_seconds=300, at=now) for rule in rules for state in ("fired", "resolved"))

    for i in range(n):
        services.agent_create(name=f"agent-{round_}-{i}", namespace="acme")
    Tool.objects.bulk_create(Tool(name=f"tool-{round_}-{i}", url="https://tools.example.com/x") for i in range(n))
    VerificationRun.objects.bulk_create(
        VerificationRun(mode="incremental", started_at=now, finished_at=now) for _ in range(n))
    approvers, escalated = (Group.objects.get_or_create(name=name)[0] for name in ("Approvers", "Operators"))
    # Current policies of n more tools, and n more (past) versions of the one whose versions are listed.
    ToolPolicy.objects.bulk_create(
        [ToolPolicy(tool=f"tool-{round_}-{i}", version=1, approver_group=approvers, on_expiry="escalate",
                    escalate_to=escalated, set_by="user:ops", reason="measure", created_at=now) for i in range(n)]
        + [ToolPolicy(tool=rows.policy.tool, version=round_ * 1000 + i, is_current=False, approver_group=approvers,
                      set_by="user:ops", reason="measure", created_at=now) for i in range(n)])
    # n more pending requests (of two approvals), each with one decision by this round's approver.
    approver = User.objects.create_user(f"approver-{round_}", is_staff=True)
    requests = ApprovalRequest.objects.bulk_create(
        ApprovalRequest(idempotency_key=f"{round_:032x}{i:032x}", task=tasks[i], step=i, tool=rows.policy.tool,
                        input={"n": i}, argument_sha256="0" * 64, requested_by="payer", requested_at=now,
                        policy=rows.policy, group=approvers, expires_at=now + timedelta(hours=1))
        for i in range(n))
    ApprovalDecision.objects.bulk_create(
        ApprovalDecision(request=request, user=approver, decided_by=f"user:approver-{round_}", verdict="approve",
                         reason="measure", at=now) for request in requests)

    for i in range(n):
        services.event_append(namespace="acme", task_id=rows.task.pk, agent="qualifier-1", draft=EventDraft(
            type="ReasoningStepCompleted", payload={"step": round_ * 10_000 + 5_000 + i, "thought": f"t{i}"}))
