"""Budgets: warnings at 80 % and 95 %, the stop at 100 % (leases, tool calls and model-call
records refused with the contract's error, nothing written), raising or resuming lets work go on,
and the overshoot of concurrent agents stays within the calls admitted before the stop."""

from __future__ import annotations

import threading
from decimal import Decimal
from typing import Any

import pytest
from rest_framework.test import APIClient

from backplane.delivery.models import OutboxMessage
from backplane.eventlog import services
from backplane.eventlog.event_types import prompt_sha256
from backplane.eventlog.models import Event, ModelPrice, Task
from backplane.eventlog.writer import EventDraft
from recovery import budgets, leases, tool_calls
from recovery.errors import BudgetExceeded
from recovery.models import Budget, BudgetDecision
from tests.api.conftest import AgentClient, assert_error
from tests.backplane.eventlog.test_concurrent_appends import run_in_threads
from tests.support.roles import staff_user

# 1,000 input tokens at 1 per million: a call costs 0.001.
CALL_USAGE = {"input_tokens": 1000}
CALL_COST = Decimal("0.001")


@pytest.fixture
def price(db: None) -> None:
    for token_type in ("input", "output"):
        ModelPrice.objects.create(provider="acme-ai", model="m", token_type=token_type, per_million=Decimal(1),
                                  currency="USD", version="v1", valid_from="2026-01-01T00:00:00Z")


def record_call(task: Task, step: int, *, agent: str = "a") -> Event:
    payload = {"step": step, "model": "m", "provider": "acme-ai", "prompt_sha256": prompt_sha256("p"), "output": {},
               "usage": CALL_USAGE}
    return services.event_append(namespace=task.namespace, task_id=task.pk, agent=agent,
                                 draft=EventDraft(type="LLMCalled", payload=payload)).events[0]


def new_task(**kwargs: Any) -> Task:
    return services.task_create(namespace="acme", kind="k", input=kwargs.pop("input", {}), agent="a", **kwargs).task


def set_budget(limit: str, *, scope: str = "namespace", key: str = "acme", period: str = "day") -> Budget:
    return budgets.budget_set(scope=scope, key=key, period=period, unit="currency", currency="USD",
                              limit=Decimal(limit), decided_by="user:ops", reason="the plan")


def test_warnings_at_80_and_95_percent_then_the_stop_each_once(price: None) -> None:
    set_budget("0.010")  # ten calls
    task = new_task()
    outbox = OutboxMessage.objects.count()
    for step in range(10):
        record_call(task, step)
    kinds = [(e.type, e.payload["threshold"]) for e in Event.objects.filter(task=task, type__startswith="Budget")]
    assert kinds == [("BudgetWarning", "80%"), ("BudgetWarning", "95%"), ("BudgetExceeded", "100%")]
    assert OutboxMessage.objects.filter(topic="backplane.budgets").count() == 3
    assert OutboxMessage.objects.count() == outbox + 3

    agent = services.agent_create(name="worker", namespace="acme").agent
    new_task(input={"n": 2})
    before = Event.objects.count()
    with pytest.raises(BudgetExceeded) as refused:
        record_call(task, 11)
    assert refused.value.details["limit"] == "0.010000" and Decimal(refused.value.details["spend"]) == 10 * CALL_COST
    with pytest.raises(BudgetExceeded):
        tool_calls.tool_call_dispatch(namespace="acme", task_id=task.pk, step=12, tool="mail", input={}, agent="a",
                                      lease_epoch=None)
    with pytest.raises(BudgetExceeded):
        leases.lease_claim(agent=agent, kinds=None, lease_seconds=30)
    assert Event.objects.count() == before


def test_raising_the_limit_or_resuming_lets_work_go_on_and_both_are_decisions(price: None) -> None:
    budget = set_budget("0.002")
    task = new_task()
    record_call(task, 1)
    record_call(task, 2)
    with pytest.raises(BudgetExceeded):
        record_call(task, 3)
    set_budget("0.004")  # raised above the spend: the crossings of this day start afresh
    record_call(task, 3)
    record_call(task, 4)
    with pytest.raises(BudgetExceeded):
        record_call(task, 5)
    budgets.budget_resume(budget_id=budget.pk, decided_by="user:ops", reason="the launch")
    record_call(task, 5)
    assert list(BudgetDecision.objects.filter(budget=budget).order_by("at").values_list("action", flat=True)) == [
        "set", "set", "resume"]
    assert Event.objects.filter(task=task, type="BudgetExceeded").count() == 2


def test_a_task_budget_covers_its_sub_agents_and_a_claim_passes_over_its_tree(price: None) -> None:
    root = new_task()
    child = new_task(parent_task_id=root.pk)
    other = new_task(input={"other": True})
    set_budget("0.001", scope="task", key=str(root.pk), period="task")
    record_call(child, 1)  # the child's call spends the root's budget
    assert Event.objects.filter(task=child, type="BudgetExceeded").count() == 1
    with pytest.raises(BudgetExceeded):
        record_call(root, 2)
    agent = services.agent_create(name="worker", namespace="acme").agent
    claim = leases.lease_claim(agent=agent, kinds=None, lease_seconds=30)
    assert claim is not None and claim.task.pk == other.pk  # root and child are passed over


def test_the_api_refuses_with_the_contracts_error_and_staff_set_budgets(price: None, alice: AgentClient) -> None:
    staff = APIClient()
    staff.force_login(staff_user("ops", "Operators"))
    body = {"scope": "namespace", "key": "acme", "period": "day", "unit": "currency", "currency": "USD",
            "limit": "0.001", "reason": "tight"}
    assert_error(alice.post("/api/v1/budgets/", body, format="json"), 403, "permission_denied")
    answer = staff.post("/api/v1/budgets/", body, format="json")
    assert answer.status_code == 200, answer.content
    assert answer.json()["spent"] is False and answer.json()["spend"] == "0"
    task = alice.post("/api/v1/tasks/", {"kind": "k", "input": {}}, format="json").json()
    payload = {"step": 1, "model": "m", "provider": "acme-ai", "prompt_sha256": prompt_sha256("p"), "output": {},
               "usage": CALL_USAGE}
    assert alice.post(f"/api/v1/tasks/{task['task_id']}/events/", {"type": "LLMCalled", "payload": payload},
                      format="json").status_code == 201
    refused = alice.post(f"/api/v1/tasks/{task['task_id']}/events/",
                         {"type": "LLMCalled", "payload": {**payload, "step": 2}}, format="json")
    error = assert_error(refused, 409, "budget_exceeded")
    assert error["details"]["scope"] == "namespace" and error["details"]["limit"] == "0.001000"
    assert_error(alice.post("/api/v1/leases/", {}, format="json"), 409, "budget_exceeded")
    listed = staff.get("/api/v1/budgets/").json()["results"]
    assert [(b["key"], b["spent"]) for b in listed] == [("acme", True)]
    resumed = staff.post(f"/api/v1/budgets/{listed[0]['id']}/resume/", {"reason": "go on"}, format="json")
    assert resumed.status_code == 200 and resumed.json()["spent"] is False


@pytest.mark.django_db(transaction=True)
def test_concurrent_agents_overshoot_by_at_most_the_calls_admitted_before_the_stop(committed_db: None) -> None:
    for token_type in ("input", "output"):
        ModelPrice.objects.create(provider="acme-ai", model="m", token_type=token_type, per_million=Decimal(1),
                                  currency="USD", version="v1", valid_from="2026-01-01T00:00:00Z")
    agents = 8
    set_budget("0.020")  # 20 calls
    tasks = [new_task(input={"agent": n}) for n in range(agents)]
    recorded: list[int] = []
    lock = threading.Lock()

    def work(index: int) -> None:
        for step in range(10):  # 80 calls wanted, 20 allowed
            try:
                record_call(tasks[index], step, agent=f"agent-{index}")
            except BudgetExceeded:
                return
            with lock:
                recorded.append(index)

    assert run_in_threads(agents, work) == []
    # Records of a budgeted scope are serialized on its budget: the call that reaches the limit
    # is the last one recorded; each agent's next call is refused (docs/costs.md).
    assert len(recorded) == 20
    assert Event.objects.filter(type="BudgetExceeded").count() == 1
    assert Event.objects.filter(type="LLMCalled").count() == len(recorded)
