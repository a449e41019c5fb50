"""Fleet operations: cancel (one task, many locked tasks), pauses, and claims passing over paused work."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from backplane.delivery.models import OutboxMessage
from backplane.eventlog import services
from backplane.eventlog.errors import AlreadyDecided, InvalidInput, NotFound, TaskClosed
from backplane.eventlog.models import Agent, Event, Task
from backplane.eventlog.writer import EventDraft, lock_task
from recovery import fleet, leases, selectors
from recovery.errors import PauseInForce
from tests.api.conftest import AgentClient, assert_error, claim, create_task, row_counts
from tests.backplane.eventlog.test_concurrent_appends import run_in_threads
from tests.conftest import check_projections
from tests.recovery.test_sagas import requested, succeed_three_steps


def cancel(task_id: Any, *, compensate: bool = False, reason: str = "prompt v7 loops") -> Task:
    return fleet.task_cancel(namespace=None, task_id=uuid.UUID(str(task_id)), cancelled_by="user:ops",
                             reason=reason, compensate=compensate)


def event_types(task_id: Any) -> list[str]:
    return list(Event.objects.filter(task_id=task_id).order_by("seq").values_list("type", flat=True))


# --- tasks_cancel_locked ------------------------------------------------------------------------


def test_it_cancels_many_locked_tasks_in_one_write(make_task: Callable[..., Task],
                                                   django_assert_max_num_queries: Any) -> None:
    tasks = [make_task() for _ in range(40)]
    now = timezone.now()
    with transaction.atomic():
        locked = [lock_task(namespace=None, task_id=pk) for pk in sorted(t.pk for t in tasks)]
        # One statement for the events and projections, two for the lifecycle messages (the
        # subscriptions, then one insert), however many tasks: none of these has a parent or
        # compensations, so no follow-up writes.
        with django_assert_max_num_queries(3):
            fleet.tasks_cancel_locked(locked, cancelled_by="user:ops", reason="bad deploy", compensate=False,
                                      now=now)
    assert set(Task.objects.filter(pk__in=[t.pk for t in tasks]).values_list("status", flat=True)) == {"cancelled"}
    cancelled = Event.objects.filter(task_id__in=[t.pk for t in tasks], type="TaskCancelled")
    assert cancelled.count() == 40
    assert {tuple(sorted(e.payload.items())) for e in cancelled} == {
        (("cancelled_by", "user:ops"), ("compensate", False), ("reason", "bad deploy"))}
    assert check_projections()[0] == 0


# --- task_cancel ----------------------------------------------------------------------------------


def test_it_writes_task_cancelled_and_closes_the_task(alice: AgentClient) -> None:
    task = create_task(alice)
    lease = claim(alice)
    cancelled = cancel(task["task_id"])
    assert cancelled.status == "cancelled" and cancelled.lease_holder is None
    row = Task.objects.get(pk=task["task_id"])
    assert row.status == "cancelled" and row.lease_holder is None and row.lease_epoch == lease["lease_epoch"]
    last = Event.objects.filter(task_id=task["task_id"]).order_by("-seq").first()
    assert last is not None and last.type == "TaskCancelled"
    assert last.payload == {"cancelled_by": "user:ops", "reason": "prompt v7 loops", "compensate": False}
    # Announced like any end of a task, for subscribers waiting on it.
    announced = OutboxMessage.objects.filter(task_id=task["task_id"]).order_by("-id").first()
    assert announced is not None and announced.payload["status"] == "cancelled"
    assert announced.payload["previous_status"] == "running"


def test_cancelling_a_closed_task_is_refused_and_writes_nothing(alice: AgentClient) -> None:
    task = create_task(alice)
    cancel(task["task_id"])
    before = row_counts()
    with pytest.raises(TaskClosed) as refused:
        cancel(task["task_id"], reason="again")
    assert refused.value.details["status"] == "cancelled"
    assert refused.value.details["cancelled_by"] == "user:ops"
    assert refused.value.details["reason"] == "prompt v7 loops"
    assert row_counts() == before

    done = create_task(alice)
    lease = claim(alice)
    alice.post(f"/api/v1/tasks/{done['task_id']}/events/", {
        "type": "TaskCompleted", "payload": {"output": {}}, "lease_epoch": lease["lease_epoch"]}, format="json")
    before = row_counts()
    with pytest.raises(TaskClosed) as refused:
        cancel(done["task_id"])
    assert refused.value.details == {"status": "completed"}
    assert row_counts() == before


def test_it_needs_a_reason(alice: AgentClient) -> None:
    task = create_task(alice)
    before = row_counts()
    with pytest.raises(InvalidInput):
        cancel(task["task_id"], reason="  ")
    assert row_counts() == before and Task.objects.get(pk=task["task_id"]).status == "pending"


def test_an_agent_cannot_cancel_another_namespaces_task(alice: AgentClient) -> None:
    task = create_task(alice)
    with pytest.raises(NotFound):
        fleet.task_cancel(namespace="globex", task_id=uuid.UUID(task["task_id"]), cancelled_by="agent:mallory",
                          reason="mine now", compensate=False)
    assert Task.objects.get(pk=task["task_id"]).status == "pending"


def test_the_holders_next_append_heartbeat_and_tool_call_name_the_cancellation(alice: AgentClient) -> None:
    task = create_task(alice)
    lease = claim(alice)
    cancel(task["task_id"])
    before = row_counts()
    epoch = lease["lease_epoch"]
    base = f"/api/v1/tasks/{task['task_id']}"
    answers = [
        alice.post(f"{base}/events/", {"type": "Noted", "payload": {}, "lease_epoch": epoch}, format="json"),
        alice.post(f"{base}/heartbeat/", {"lease_epoch": epoch}, format="json"),
        alice.post(f"{base}/release/", {"lease_epoch": epoch}, format="json"),
        alice.post(f"{base}/tool-calls/", {"step": 1, "tool": "send-email", "input": {}, "lease_epoch": epoch},
                   format="json"),
    ]
    for answer in answers:
        error = assert_error(answer, 409, "task_closed")
        assert error["details"]["status"] == "cancelled"
        assert error["details"]["cancelled_by"] == "user:ops"
        assert error["details"]["reason"] == "prompt v7 loops"
        assert error["details"]["cancelled_at"]
    assert row_counts() == before


def test_compensate_runs_the_saga(alice: AgentClient) -> None:
    task = create_task(alice)
    lease = claim(alice)
    succeed_three_steps(alice, task["task_id"], lease["lease_epoch"])
    cancel(task["task_id"], compensate=True)
    assert Task.objects.get(pk=task["task_id"]).status == "compensating"
    # The holder's work is over while its saga runs.
    error = assert_error(alice.post(f"/api/v1/tasks/{task['task_id']}/events/", {
        "type": "Noted", "payload": {}, "lease_epoch": lease["lease_epoch"]}, format="json"), 409, "task_closed")
    assert error["details"]["cancelled_by"] == "user:ops"
    for _ in range(3):
        latest = requested(task["task_id"])[-1].payload
        response = alice.post(f"/api/v1/tool-calls/{latest['compensation_key']}/result/",
                              {"status": "succeeded", "result": {}}, format="json")
        assert response.status_code == 201, response.content
    assert [e.payload["step"] for e in requested(task["task_id"])] == [3, 2, 1]
    assert Task.objects.get(pk=task["task_id"]).status == "compensated"
    types = event_types(task["task_id"])
    assert types.index("TaskCancelled") < types.index("CompensationStarted") and types[-1] == "TaskCompensated"
    assert check_projections()[0] == 0


def test_without_compensate_nothing_is_undone(alice: AgentClient) -> None:
    task = create_task(alice)
    succeed_three_steps(alice, task["task_id"])
    cancel(task["task_id"])
    assert Task.objects.get(pk=task["task_id"]).status == "cancelled"
    assert requested(task["task_id"]) == []


def test_a_cancelled_child_reports_to_its_parent(alice: AgentClient) -> None:
    parent = create_task(alice)
    dispatched = alice.post(f"/api/v1/tasks/{parent['task_id']}/subtasks/",
                            {"step": 1, "kind": "enrich", "input": {"q": 1}}, format="json")
    assert dispatched.status_code in (200, 201), dispatched.content
    child_id = dispatched.json()["task"]["task_id"]
    cancel(child_id, reason="enrichment is broken")
    result = Event.objects.filter(task_id=parent["task_id"], type="SubAgentResultReceived").get()
    assert result.payload["child_task_id"] == child_id and result.payload["status"] == "cancelled"
    assert "enrichment is broken" in result.payload["error"] and "user:ops" in result.payload["error"]


# --- pauses ---------------------------------------------------------------------------------------


def test_a_scope_has_one_pause_in_force(db: None) -> None:
    pause = fleet.pause_set(namespace="acme", kind="enrich", paused_by="user:ops", reason="tool down")
    with pytest.raises(PauseInForce) as refused:
        fleet.pause_set(namespace="acme", kind="enrich", paused_by="user:other", reason="again")
    assert refused.value.details["pause_id"] == pause.pk
    # Another scope is another pause: the namespace as a whole, or the same kind elsewhere.
    fleet.pause_set(namespace="acme", kind="", paused_by="user:ops", reason="all of it")
    fleet.pause_set(namespace="globex", kind="enrich", paused_by="user:ops", reason="there too")
    assert len(selectors.pauses_in_force()) == 3


def test_a_pause_is_lifted_once_with_a_reason(db: None) -> None:
    pause = fleet.pause_set(namespace="acme", kind="", paused_by="user:ops", reason="deploy")
    with pytest.raises(InvalidInput):
        fleet.pause_lift(pause_id=pause.pk, resumed_by="user:ops", reason="")
    lifted = fleet.pause_lift(pause_id=pause.pk, resumed_by="user:ops", reason="fix is out")
    assert lifted.resumed_at is not None and lifted.resume_reason == "fix is out"
    with pytest.raises(AlreadyDecided):
        fleet.pause_lift(pause_id=pause.pk, resumed_by="user:ops", reason="twice")
    with pytest.raises(NotFound):
        fleet.pause_lift(pause_id=pause.pk + 1000, resumed_by="user:ops", reason="who")
    assert selectors.pauses_in_force() == [] and selectors.pauses_recently_lifted() == [lifted]
    # Lifted, the scope can be paused again.
    fleet.pause_set(namespace="acme", kind="", paused_by="user:ops", reason="again")


def test_pause_needs_a_reason_and_a_valid_scope(db: None) -> None:
    for namespace, kind, reason in (("acme", "", ""), ("", "", "why"), ("acme", "bad kind!", "why")):
        with pytest.raises(InvalidInput):
            fleet.pause_set(namespace=namespace, kind=kind, paused_by="user:ops", reason=reason)
    assert selectors.pauses_in_force() == []


def test_pause_blocking_names_the_pause_holding_a_pending_task(make_task: Callable[..., Task]) -> None:
    task = make_task(kind="enrich")
    assert selectors.pause_blocking(task) is None
    kind_pause = fleet.pause_set(namespace="acme", kind="enrich", paused_by="user:ops", reason="tool down")
    assert selectors.pause_blocking(task) == kind_pause
    namespace_pause = fleet.pause_set(namespace="acme", kind="", paused_by="user:ops", reason="all")
    assert selectors.pause_blocking(task) == namespace_pause
    assert selectors.pause_blocking(make_task(namespace="globex", kind="enrich")) is None


# --- claims pass over paused work -------------------------------------------------------------------


def agent(name: str = "worker", namespace: str = "acme") -> Agent:
    services.agent_create(name=name, namespace=namespace, kinds=())
    return Agent.objects.get(namespace=namespace, name=name)


def take(worker: Agent, kinds: list[str] | None = None, task_id: uuid.UUID | None = None) -> Task | None:
    got = leases.lease_claim(agent=worker, kinds=kinds, lease_seconds=30, task_id=task_id)
    return got.task if got else None


def test_claims_skip_a_paused_kind_while_other_kinds_are_leased(make_task: Callable[..., Task],
                                                                django_assert_max_num_queries: Any) -> None:
    worker = agent()
    paused = make_task(kind="enrich")
    other = make_task(kind="score")
    fleet.pause_set(namespace="acme", kind="enrich", paused_by="user:ops", reason="tool down")
    got = take(worker, ["enrich", "score"])
    assert got is not None and got.pk == other.pk
    assert take(worker, ["enrich", "score"]) is None
    assert take(worker, None, task_id=paused.pk) is None
    assert Task.objects.get(pk=paused.pk).status == "pending"
    pause = selectors.pauses_in_force()[0]
    fleet.pause_lift(pause_id=pause.pk, resumed_by="user:ops", reason="fixed")
    got = take(worker, ["enrich", "score"])
    assert got is not None and got.pk == paused.pk


def test_a_pause_adds_no_query_to_a_claim(make_task: Callable[..., Task]) -> None:
    worker = agent()
    make_task(kind="score")
    make_task(kind="score")
    with CaptureQueriesContext(connection) as unpaused:
        assert take(worker) is not None
    fleet.pause_set(namespace="acme", kind="enrich", paused_by="user:ops", reason="tool down")
    with CaptureQueriesContext(connection) as paused:
        assert take(worker) is not None
    assert len(paused) == len(unpaused)


def test_a_paused_namespace_is_not_leased_at_all(make_task: Callable[..., Task]) -> None:
    worker = agent()
    make_task(kind="enrich")
    make_task(kind="score")
    elsewhere = agent("far", "globex")
    theirs = make_task(namespace="globex", kind="score")
    fleet.pause_set(namespace="acme", kind="", paused_by="user:ops", reason="bad deploy")
    assert take(worker) is None
    got = take(elsewhere)
    assert got is not None and got.pk == theirs.pk


def test_a_running_lease_of_a_paused_kind_keeps_working(alice: AgentClient) -> None:
    task = create_task(alice, kind="enrich")
    lease = claim(alice)
    fleet.pause_set(namespace="acme", kind="enrich", paused_by="user:ops", reason="tool down")
    base = f"/api/v1/tasks/{task['task_id']}"
    epoch = lease["lease_epoch"]
    assert alice.post(f"{base}/heartbeat/", {"lease_epoch": epoch}, format="json").status_code == 200
    assert alice.post(f"{base}/events/", {"type": "Noted", "payload": {}, "lease_epoch": epoch},
                      format="json").status_code == 201
    assert alice.post(f"{base}/events/", {"type": "TaskCompleted", "payload": {"output": {}}, "lease_epoch": epoch},
                      format="json").status_code == 201
    assert Task.objects.get(pk=task["task_id"]).status == "completed"


# --- races with real connections -------------------------------------------------------------------


@pytest.mark.usefixtures("committed_db")
def test_a_cancel_racing_appends_and_claims_ends_consistent() -> None:
    worker = agent()
    tasks = [services.task_create(namespace="acme", kind="score", agent="planner", input={"n": n}).task
             for n in range(6)]
    outcomes: list[str] = []
    lock = threading.Lock()

    def cancel_all() -> None:
        for task in tasks:
            try:
                cancel(task.pk, reason="race")
                result = "cancelled"
            except TaskClosed:
                result = "closed"
            with lock:
                outcomes.append(result)

    def claim_and_append() -> None:
        for _ in range(6):
            got = leases.lease_claim(agent=worker, kinds=None, lease_seconds=30, task_id=None)
            if got is None:
                continue
            try:
                services.event_append(namespace="acme", task_id=got.task.pk, draft=EventDraft(
                    type="Noted", payload={}), agent=worker.name, lease_epoch=got.lease_epoch)
            except TaskClosed:
                with lock:
                    outcomes.append("refused")

    work = (cancel_all, claim_and_append)
    assert run_in_threads(2, lambda index: work[index]()) == []
    assert set(Task.objects.values_list("status", flat=True)) == {"cancelled"}
    for task in tasks:
        types = event_types(task.pk)
        assert types.count("TaskCancelled") == 1 and types[-1] == "TaskCancelled"
    code, output = check_projections()
    assert code == 0, output
