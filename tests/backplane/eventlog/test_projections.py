"""Task rows against their logs: projection_replay, projection_check, projection_rebuild and
`manage.py rebuild_projections`."""

from __future__ import annotations

import io
from collections.abc import Callable

import pytest
from django.core.management import CommandError, call_command

from backplane.eventlog import services
from backplane.eventlog.models import Agent, Event, Task
from backplane.eventlog.projections import projection_check, projection_rebuild, projection_replay
from backplane.eventlog.reducer import task_state_as_json, task_state_from_json, task_state_of
from backplane.eventlog.writer import EventDraft
from recovery import leases


@pytest.fixture
def worker(db: None) -> Agent:
    return services.agent_create(name="qualifier-1", namespace="acme").agent


@pytest.fixture
def running_task(make_task: Callable[..., Task], worker: Agent) -> Task:
    """Claimed by ``worker``, with two steps recorded under its lease."""
    task = make_task()
    claim = leases.lease_claim(agent=worker, kinds=None, lease_seconds=30)
    assert claim is not None and claim.task.pk == task.pk
    for step in (1, 2):
        services.event_append(
            namespace="acme", task_id=task.pk, draft=EventDraft(type="ReasoningStepCompleted", payload={"step": step}),
            agent=worker.name, lease_epoch=claim.lease_epoch,
        )
    return Task.objects.get(pk=task.pk)


def rebuild_projections(*args: str) -> tuple[int, str]:
    """The command in process: (exit code, what it printed)."""
    out = io.StringIO()
    try:
        call_command("rebuild_projections", *args, stdout=out, stderr=out)
    except SystemExit as exc:
        return int(exc.code or 0), out.getvalue()
    return 0, out.getvalue()


def test_a_replay_equals_the_row_after_a_few_appends(running_task: Task, worker: Agent) -> None:
    assert projection_replay(task_id=running_task.pk) == task_state_of(running_task)
    assert running_task.status == "running" and running_task.last_seq == 4

    completion = EventDraft(type="TaskCompleted", payload={"output": {"ok": 1}})
    services.event_append(
        namespace="acme", task_id=running_task.pk, draft=completion, agent=worker.name,
        lease_epoch=running_task.lease_epoch,
    )
    completed = Task.objects.get(pk=running_task.pk)
    replayed = projection_replay(task_id=running_task.pk)
    assert replayed == task_state_of(completed)
    assert (replayed.status, replayed.output, replayed.lease_holder, replayed.last_seq) == (
        "completed", {"ok": 1}, None, 5)
    # Retention's time: the last event's, once finished; none while the task ran.
    assert running_task.finished_last_event_at is None
    assert completed.finished_last_event_at == completed.last_event_at is not None
    # Bounded: the log as it was when the row recorded seq 4.
    assert projection_replay(task_id=running_task.pk, through_seq=4) == task_state_of(running_task)


def test_the_check_passes_on_a_clean_database(running_task: Task, make_task: Callable[..., Task]) -> None:
    make_task()
    code, report = rebuild_projections("--check")
    assert code == 0, report
    assert report == "every checked task row matches its log, and every cost rollup the sum of its events\n"


def test_the_check_names_a_row_edited_behind_the_logs_back_and_the_rebuild_repairs_it(
    running_task: Task, make_task: Callable[..., Task]
) -> None:
    untouched = make_task()
    Task.objects.filter(pk=running_task.pk).update(status="completed", attempts=2)

    code, report = rebuild_projections("--check")
    assert code == 1
    assert report.splitlines() == [
        f"task {running_task.pk} differs from its log:",
        "  status: row='completed' log='running'",
        "  attempts: row=2 log=0",
        "1 task row(s) differ from their logs",
    ]
    assert Task.objects.get(pk=running_task.pk).status == "completed"  # --check changes nothing

    code, report = rebuild_projections()
    assert (code, report) == (0, "rebuilt 1 task row(s) from their logs\n")
    repaired = Task.objects.get(pk=running_task.pk)
    assert (repaired.status, repaired.attempts) == ("running", 0)
    assert task_state_of(repaired) == task_state_of(running_task)
    assert Task.objects.get(pk=untouched.pk).updated_at == untouched.updated_at  # a matching row is not written

    assert rebuild_projections("--check") == (
        0, "every checked task row matches its log, and every cost rollup the sum of its events\n")
    assert rebuild_projections() == (0, "rebuilt 0 task row(s) from their logs\n")


def test_the_command_takes_tasks_by_id(running_task: Task, make_task: Callable[..., Task]) -> None:
    other = make_task()
    Task.objects.filter(pk__in=[running_task.pk, other.pk]).update(lamport=99)

    code, report = rebuild_projections("--check", "--task", str(other.pk))
    assert code == 1 and str(other.pk) in report and str(running_task.pk) not in report
    assert "  lamport: row=99 log=1" in report.splitlines()

    assert rebuild_projections("--task", str(other.pk)) == (0, "rebuilt 1 task row(s) from their logs\n")
    assert [drift.task_id for drift in projection_check()] == [running_task.pk]
    with pytest.raises(CommandError, match="no task 00000000-0000-0000-0000-000000000000"):
        call_command("rebuild_projections", "--check", "--task", "00000000-0000-0000-0000-000000000000")


def test_a_lease_extended_by_heartbeats_is_not_drift(running_task: Task) -> None:
    beaten = leases.lease_heartbeat(namespace="acme", task_id=running_task.pk, lease_epoch=running_task.lease_epoch,
                                    agent=str(running_task.lease_holder))
    replayed = projection_replay(task_id=running_task.pk)
    assert beaten.lease_expires_at is not None and replayed.lease_expires_at is not None
    assert beaten.lease_expires_at > replayed.lease_expires_at

    assert list(projection_check()) == []
    # Another field drifting does not make the rebuild shorten the live lease either.
    Task.objects.filter(pk=running_task.pk).update(status="pending")
    assert projection_rebuild() == 1
    rebuilt = Task.objects.get(pk=running_task.pk)
    assert (rebuilt.status, rebuilt.lease_expires_at) == ("running", beaten.lease_expires_at)


def test_an_earlier_deadline_or_another_holder_is_drift(running_task: Task) -> None:
    Task.objects.filter(pk=running_task.pk).update(lease_holder="mallory")
    [drift] = projection_check()
    assert drift.task_id == running_task.pk and set(drift.differences) == {"lease_holder"}

    projection_rebuild()
    replayed_deadline = projection_replay(task_id=running_task.pk).lease_expires_at
    assert replayed_deadline is not None
    Task.objects.filter(pk=running_task.pk).update(lease_expires_at=replayed_deadline.replace(year=2000))
    [drift] = projection_check()
    assert drift.differences["lease_expires_at"][1] == replayed_deadline


def test_reconcile_records_the_row_in_the_log_with_who_and_why(make_task: Callable[..., Task]) -> None:
    task = make_task()
    # A history from before every transition was an event: the row moved, the log did not.
    Task.objects.filter(pk=task.pk).update(status="compensated")
    with pytest.raises(CommandError, match="--reason"):
        call_command("rebuild_projections", "--reconcile", stdout=io.StringIO())

    call_command("rebuild_projections", "--reconcile", "--by", "user:olga", "--reason", "old saga",
                 stdout=io.StringIO())

    event = Event.objects.filter(task=task).order_by("-seq").first()
    assert event is not None and event.type == "ProjectionReconciled"
    assert event.payload == {"fields": {"status": "compensated"}, "log_had": {"status": "pending"},
                             "decided_by": "user:olga", "reason": "old saga"}
    assert Task.objects.get(pk=task.pk).status == "compensated"
    assert projection_replay(task_id=task.pk).status == "compensated"
    assert list(projection_check()) == []


def test_a_checkpoint_kept_before_finished_last_event_at_existed_reads_as_its_log_would(
        running_task: Task, worker: Agent) -> None:
    services.event_append(
        namespace="acme", task_id=running_task.pk, draft=EventDraft(type="TaskCompleted", payload={"output": {}}),
        agent=worker.name, lease_epoch=running_task.lease_epoch,
    )
    for task in (running_task, Task.objects.get(pk=running_task.pk)):
        state = task_state_of(task)
        kept = task_state_as_json(state)
        del kept["finished_last_event_at"]
        assert task_state_from_json(kept) == state
