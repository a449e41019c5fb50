"""The budgets page in the browser: a namespace's spend against its limit, spent; a person
resumes it with a reason, and the decision is listed."""

from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect

from recovery import budgets
from recovery.models import Budget
from tests.browser.conftest import scrolled_to_top
from tests.dashboard.test_budgets_page import spend_calls

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_a_spent_budget_is_shown_and_resumed_with_a_reason(logged_in_page: Page,
                                                           screenshot: Callable[[Page, str], Path]) -> None:
    budgets.budget_set(scope="namespace", key="acme", period="day", unit="currency", currency="USD",
                       limit=Decimal("0.003"), decided_by="user:ops", reason="the trial's daily cap")
    budgets.budget_set(scope="agent", key="acme/qualifier-1", period="day", unit="tokens", limit=Decimal(100000),
                       decided_by="user:ops", reason="one agent")
    spend_calls(3)
    page = logged_in_page
    page.goto("/budgets/")
    spent = page.locator(f"#budget-table tr[data-budget='{Budget.objects.get(scope='namespace').pk}']")
    expect(spent.locator("[data-field=state]")).to_have_text("spent: work refused")
    expect(spent.locator("[data-field=spend]")).to_have_text("0.003 USD")
    screenshot(scrolled_to_top(page), "budgets")

    spent.locator("input[name=reason]").fill("the launch needs the rest of today")
    with page.expect_navigation():
        spent.locator("button[type=submit]").click()
    expect(page.locator("#messages")).to_contain_text("Resumed for the rest of its period")
    expect(spent.locator("[data-field=state]")).to_have_text("resumed")
    expect(page.locator("#decision-table")).to_contain_text("the launch needs the rest of today")
    screenshot(scrolled_to_top(page), "budgets-resumed")
