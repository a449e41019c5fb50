"""The crash report fails a run for each thing it promises to catch (each planted here), and the
fleet decides its own forgotten dead letters."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import timedelta

from django.db import connection
from django.utils import timezone

from backplane.delivery.models import DeadLetter, DeadLetterStatus
from backplane.eventlog import services
from backplane.eventlog.models import Event, Task
from backplane.eventlog.writer import EventDraft
from demo.fleet import demo_dead_letters_decide
from demo.models import LedgerEntry
from demo.report import build_report
from recovery.detector import lease_expire_stalled
from recovery.leases import lease_claim
from recovery.models import ToolCall, ToolCallStatus


def report_of(root_ids: list[str]) -> list[str]:
    now = timezone.now()
    return build_report(root_ids=root_ids, started_at=now - timedelta(minutes=1), finished_at=now,
                        config={"timed_out": False}, agent_restarts=0)["problems"]


def completed(make_task: Callable[..., Task]) -> Task:
    task = make_task(namespace="demo-batch")
    services.event_append(namespace="demo-batch", task_id=task.pk, agent="a",
                          draft=EventDraft(type="TaskCompleted", payload={"output": {}}))
    return task


def effect(task: Task, *, key: str, subject: str, recorded: bool = False) -> None:
    """One effect in the ledger; ``recorded``: with the backplane's record of a succeeded call."""
    now = timezone.now()
    LedgerEntry.objects.create(tool="email-send", idempotency_key=key, subject=subject, task_id=task.pk,
                               status_code=200, created_at=now)
    if recorded:
        ToolCall.objects.create(idempotency_key=key, task=task, step=6, tool="email-send", input={},
                                status=ToolCallStatus.SUCCEEDED, result={}, dispatched_at=now,
                                expires_at=now + timedelta(days=1))


def test_a_clean_run_has_no_problem(committed_db: None, make_task: Callable[..., Task]) -> None:
    task = completed(make_task)
    effect(task, key="k-1", subject="email-send:L-1", recorded=True)
    assert report_of([str(task.pk)]) == []


def test_a_succeeded_call_without_its_effect_fails_the_run(committed_db: None,
                                                           make_task: Callable[..., Task]) -> None:
    task = completed(make_task)
    effect(task, key="k-1", subject="email-send:L-1", recorded=True)
    LedgerEntry.objects.all().delete()
    assert "1 succeeded tool call(s) with no effect in the ledger" in report_of([str(task.pk)])


def test_two_effects_for_one_lead_under_two_keys_are_a_duplicate(committed_db: None,
                                                                  make_task: Callable[..., Task]) -> None:
    task = completed(make_task)
    effect(task, key="k-1", subject="email-send:L-1", recorded=True)
    effect(task, key="k-2", subject="email-send:L-1")
    problems = report_of([str(task.pk)])
    assert any("duplicate side effect" in p for p in problems)
    assert "1 effect(s) the backplane has no record of" in problems  # k-2 never went through the proxy


def test_an_open_task_is_lost_and_a_missing_one_is_reported(committed_db: None,
                                                             make_task: Callable[..., Task]) -> None:
    open_task = make_task(namespace="demo-batch")
    problems = report_of([str(open_task.pk), str(uuid.uuid4())])
    assert "1 lost tasks" in problems
    assert "1 task(s) of the run are no longer in the database" in problems


def test_a_broken_chain_fails_the_run(committed_db: None, make_task: Callable[..., Task]) -> None:
    task = completed(make_task)
    with connection.cursor() as cursor:  # tampering, as only a superuser skipping triggers can
        cursor.execute("SET session_replication_role = replica")
        cursor.execute("UPDATE backplane_event SET payload = '{\"output\": {\"forged\": 1}}' "
                       "WHERE task_id = %s AND type = 'TaskCompleted'", [task.pk])
        cursor.execute("SET session_replication_role = DEFAULT")
    assert "1 broken chain(s)" in report_of([str(task.pk)])


def test_the_fleet_decides_its_own_old_dead_letters_so_its_tasks_can_finish(
        committed_db: None, make_task: Callable[..., Task]) -> None:
    poison = make_task(namespace="demo-fleet", max_attempts=1)
    other = make_task(namespace="elsewhere", max_attempts=1)
    for task in (poison, other):
        agent = services.agent_create(name=f"agent-{task.pk.hex[:6]}", namespace=task.namespace).agent
        assert lease_claim(agent=agent, kinds=None, lease_seconds=1) is not None
    lease_expire_stalled(now=timezone.now() + timedelta(seconds=5))
    DeadLetter.objects.update(created_at=timezone.now() - timedelta(minutes=11))

    assert demo_dead_letters_decide(namespace="demo-fleet") == 1
    decided = DeadLetter.objects.get(task=poison)
    assert (decided.status, decided.decided_by) == (DeadLetterStatus.DISCARDED, "demo-fleet")
    assert DeadLetter.objects.get(task=other).status == DeadLetterStatus.PENDING  # not the demo's
    assert Event.objects.filter(task=poison, type="DeadLetterDiscarded").count() == 1
    assert demo_dead_letters_decide(namespace="demo-fleet") == 0
