"""Budgets that ask (issue 43): at 100 % a budget asks its group whether the scope may go on, in
the same transaction as the ``BudgetExceeded``; work is refused meanwhile, the refusal naming the
question; a member's approval resumes the scope for the period, a denial keeps it stopped."""

from __future__ import annotations

from decimal import Decimal

import pytest
from rest_framework.test import APIClient

from backplane.eventlog.errors import AlreadyDecided, InvalidInput
from backplane.eventlog.models import Event
from recovery import budgets, tool_calls
from recovery.errors import BudgetExceeded, NotAnApprover
from recovery.models import Budget, BudgetAsk, BudgetDecision
from tests.api.conftest import assert_error
from tests.recovery.test_budgets import new_task, price, record_call  # noqa: F401 - price is a fixture
from tests.support.roles import role_group, staff_user


def asking_budget(limit: str = "0.003") -> Budget:
    role_group("Finance leads")
    return budgets.budget_set(scope="namespace", key="acme", period="day", unit="currency", currency="USD",
                              limit=Decimal(limit), decided_by="user:ops", reason="the trial's cap",
                              at_limit="ask", ask_group="Finance leads")


def spend_it(count: int = 3) -> None:
    task = new_task()
    for step in range(count):
        record_call(task, step)


def test_reaching_the_limit_asks_and_the_refusal_names_the_question(price: None) -> None:  # noqa: F811
    budget = asking_budget()
    spend_it()
    exceeded = Event.objects.get(type="BudgetExceeded").payload
    ask = BudgetAsk.objects.get(budget=budget)
    assert exceeded["asks"] == {"ask_id": ask.pk, "group": "Finance leads"} and ask.status == "pending"
    with pytest.raises(BudgetExceeded) as refused:
        record_call(new_task(input={"n": 2}), 1)
    assert refused.value.details["ask"] == {"ask_id": ask.pk, "status": "pending", "group": "Finance leads"}


def test_a_members_approval_lets_the_scope_go_on_and_a_denial_keeps_it_stopped(
    price: None,  # noqa: F811
) -> None:
    budget = asking_budget()
    spend_it()
    with pytest.raises(NotAnApprover):
        budgets.budget_ask_decide(budget_id=budget.pk, user=staff_user("vera", "Viewers"), verdict="approve",
                                  reason="why not")
    lead = staff_user("fay", "Finance leads")
    budgets.budget_ask_decide(budget_id=budget.pk, user=lead, verdict="approve", reason="the launch")
    task = new_task(input={"n": 3})
    record_call(task, 1)  # goes on for the rest of the day
    tool_calls.tool_call_dispatch(namespace="acme", task_id=task.pk, step=2, tool="mail", input={}, agent="a",
                                  lease_epoch=None)
    with pytest.raises(AlreadyDecided):
        budgets.budget_ask_decide(budget_id=budget.pk, user=lead, verdict="deny", reason="changed my mind")
    decisions = BudgetDecision.objects.filter(budget=budget).order_by("at", "pk")
    assert list(decisions.values_list("action", "decided_by")) == [("set", "user:ops"), ("resume", "user:fay")]


def test_a_denial_keeps_the_scope_stopped(price: None) -> None:  # noqa: F811
    budget = asking_budget()
    spend_it()
    budgets.budget_ask_decide(budget_id=budget.pk, user=staff_user("fay", "Finance leads"), verdict="deny",
                              reason="over plan")
    with pytest.raises(BudgetExceeded) as refused:
        record_call(new_task(input={"n": 4}), 1)
    assert refused.value.details["ask"]["status"] == "denied"


@pytest.mark.django_db
def test_a_budget_that_asks_names_an_existing_group() -> None:
    for values, field in [({"at_limit": "ask"}, "ask_group"), ({"at_limit": "ask", "ask_group": "Nobody"},
                                                                "ask_group"),
                          ({"ask_group": "Viewers"}, "ask_group"), ({"at_limit": "shrug"}, "at_limit")]:
        with pytest.raises(InvalidInput) as refused:
            budgets.budget_set(scope="namespace", key="acme", period="day", unit="tokens", limit=Decimal(10),
                               decided_by="user:ops", reason="r", **values)
        assert field in refused.value.details
    assert not Budget.objects.exists()


def test_over_the_api(price: None) -> None:  # noqa: F811
    operator, lead = APIClient(), APIClient()
    operator.force_login(staff_user("olivia", "Operators"))
    lead.force_login(staff_user("fay", "Finance leads"))
    set_ = operator.post("/api/v1/budgets/", {
        "scope": "namespace", "key": "acme", "period": "day", "unit": "currency", "currency": "USD",
        "limit": "0.003", "reason": "cap", "at_limit": "ask", "ask_group": "Finance leads"}, format="json")
    assert set_.status_code == 200 and (set_.json()["at_limit"], set_.json()["ask"]) == ("ask", None)
    budget_id = set_.json()["id"]
    assert_error(lead.post(f"/api/v1/budgets/{budget_id}/ask/approve/", {"reason": "go"}, format="json"),
                 404, "not_found")
    assert not BudgetAsk.objects.exists()  # nothing asked, nothing answered
    spend_it()
    listed = operator.get("/api/v1/budgets/").json()["results"][0]
    assert (listed["spent"], listed["ask"]["status"], listed["ask"]["group"]) == (True, "pending", "Finance leads")
    events = Event.objects.count()
    for refused in (operator.post(f"/api/v1/budgets/{budget_id}/ask/approve/", {"reason": "go"}, format="json"),
                    operator.post(f"/api/v1/budgets/{budget_id}/ask/deny/", {"reason": "no"}, format="json")):
        assert_error(refused, 403, "permission_denied")
    assert_error(lead.post(f"/api/v1/budgets/{budget_id}/ask/approve/", {}, format="json"), 400, "validation_error")
    assert_error(lead.post(f"/api/v1/budgets/{budget_id}/ask/approve/", {"reason": "x" * 2001}, format="json"),
                 400, "validation_error")
    ask = BudgetAsk.objects.get()
    assert (ask.status, ask.decided_by, ask.decided_at) == ("pending", "", None) and Event.objects.count() == events
    assert operator.get("/api/v1/budgets/").json()["results"][0]["spent"] is True
    answered = lead.post(f"/api/v1/budgets/{budget_id}/ask/approve/", {"reason": "go"}, format="json")
    assert answered.status_code == 200
    assert (answered.json()["spent"], answered.json()["ask"]["status"], answered.json()["ask"]["decided_by"]) == (
        False, "granted", "user:fay")


def test_on_the_budgets_page(price: None) -> None:  # noqa: F811
    from django.test import Client

    budget = asking_budget()
    spend_it()
    lead, viewer = Client(), Client()
    lead.force_login(staff_user("fay", "Finance leads", "Viewers"))
    viewer.force_login(staff_user("vera", "Viewers"))
    assert "asked Finance leads: pending" in viewer.get("/budgets/").content.decode()
    assert 'data-form="ask"' not in viewer.get("/budgets/").content.decode()
    refused = viewer.post(f"/budgets/{budget.pk}/ask/approve/", {"reason": "go"}, follow=True).content.decode()
    assert "Not answered: only members of &#x27;Finance leads&#x27; answer" in refused
    assert 'data-form="ask"' in lead.get("/budgets/").content.decode()
    answered = lead.post(f"/budgets/{budget.pk}/ask/approve/", {"reason": "go"}, follow=True).content.decode()
    assert "goes on for the rest of its period" in answered and "asked Finance leads: granted by user:fay" in answered
