"""The budgets page: spend against limit, setting and resuming as the API does, each a decision."""

from __future__ import annotations

from decimal import Decimal

from django.test import Client

from backplane.eventlog import services
from backplane.eventlog.event_types import prompt_sha256
from backplane.eventlog.models import ModelPrice
from backplane.eventlog.writer import EventDraft
from recovery import budgets
from recovery.models import Budget, BudgetDecision
from tests.dashboard.conftest import html


def spend_calls(count: int) -> None:
    ModelPrice.objects.get_or_create(provider="acme-ai", model="m", token_type="input", valid_from="2026-01-01T00:00Z",
                                     defaults={"per_million": Decimal(1), "version": "v1"})
    ModelPrice.objects.get_or_create(provider="acme-ai", model="m", token_type="output", valid_from="2026-01-01T00:00Z",
                                     defaults={"per_million": Decimal(1), "version": "v1"})
    task = services.task_create(namespace="acme", kind="k", input={}, agent="a").task
    for step in range(count):
        services.event_append(namespace="acme", task_id=task.pk, agent="a", draft=EventDraft(type="LLMCalled", payload={
            "step": step, "model": "m", "provider": "acme-ai", "prompt_sha256": prompt_sha256("p"), "output": {},
            "usage": {"input_tokens": 1000}}))


def test_it_shows_spend_against_limit_and_a_spent_budget_can_be_resumed(olivia_client: Client) -> None:
    budgets.budget_set(scope="namespace", key="acme", period="day", unit="currency", currency="USD",
                       limit=Decimal("0.002"), decided_by="user:ops", reason="tight")
    spend_calls(2)
    page = olivia_client.get("/budgets/")
    assert page.status_code == 200
    html = page.content.decode()
    assert "spent: work refused" in html and "0.002 USD" in html and 'data-budget=' in html
    budget = Budget.objects.get()
    resumed = olivia_client.post(f"/budgets/{budget.pk}/resume/", {"reason": "the launch"}, follow=True)
    assert "Resumed for the rest of its period" in resumed.content.decode()
    assert list(BudgetDecision.objects.order_by("at").values_list("action", "decided_by")) == [
        ("set", "user:ops"), ("resume", "user:olivia")]


def test_setting_from_the_page_goes_through_the_service_and_refusals_write_nothing(olivia_client: Client) -> None:
    body = {"scope": "agent", "key": "acme/qualifier", "period": "day", "unit": "tokens", "currency": "",
            "limit": "50000", "reason": "per agent"}
    done = olivia_client.post("/budgets/set/", body, follow=True)
    assert "Budget set" in done.content.decode()
    assert Budget.objects.get().limit == Decimal(50000)
    refused = olivia_client.post("/budgets/set/", {**body, "scope": "task", "key": "x", "period": "day"}, follow=True)
    assert "Not set" in refused.content.decode()
    assert Budget.objects.count() == 1 and BudgetDecision.objects.count() == 1
    assert "Not set: a budget decision needs a reason" in olivia_client.post(
        "/budgets/set/", {**body, "reason": " "}, follow=True).content.decode()


def test_bad_input_is_said_on_the_page_and_writes_nothing(olivia_client: Client) -> None:
    body = {"scope": "namespace", "key": "acme", "period": "day", "unit": "currency", "currency": "usd",
            "limit": "5", "reason": "plan"}
    for changed, said in (
        ({"limit": "five"}, "Not set: the limit must be a number."),
        ({"limit": "NaN"}, "Not set: the limit must be a number."),
        ({"scope": "galaxy"}, "Not set: the scope must be one of namespace, agent, task."),
        ({"key": "ac\x00me"}, "Not set: Null characters are not allowed."),
        ({"reason": "\x00"}, "Not set: Null characters are not allowed."),
        ({"key": " ", "reason": ""}, "Not set: a budget needs a key: a namespace, namespace/agent or a root task "
                                     "id; a budget decision needs a reason."),
    ):
        page = olivia_client.post("/budgets/set/", {**body, **changed}, follow=True)
        assert page.status_code == 200 and said in html(page), changed
    assert not Budget.objects.exists() and not BudgetDecision.objects.exists()
    assert "Budget set: namespace acme: 5 USD a day." in html(olivia_client.post("/budgets/set/", body, follow=True))
    budget = Budget.objects.get()
    refused = olivia_client.post(f"/budgets/{budget.pk}/resume/", {"reason": "  "}, follow=True)
    assert "Not resumed: a budget decision needs a reason." in html(refused)
    assert BudgetDecision.objects.count() == 1
