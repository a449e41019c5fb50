"""Saved searches in the browser: a payload search saved from the task list and pinned, an alert
rule added on the searches page, the rule firing on the overview (tile and Alerts panel, kept up
to date by the live refresh), then resolving."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone
from playwright.sync_api import Page, expect

from backplane.delivery.models import OutboxMessage
from recovery import alerts
from recovery.models import AlertRule, SavedSearch
from tests.browser.conftest import ApiAgent, assert_not_reloaded, mark_document, scrolled_to_top, wait_live

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

Screenshot = Callable[[Page, str], Path]


def test_a_saved_search_is_pinned_watched_and_its_alert_fires_on_the_overview(
    logged_in_page: Page, make_agent: Callable[..., ApiAgent], screenshot: Screenshot,
) -> None:
    planner = make_agent("planner")
    for n in range(3):
        planner.create_task(input={"lead": f"lead-{n}@example.com", "note": "refund requested"})
    planner.create_task(input={"lead": "zed@example.com", "note": "happy customer"})
    other = make_agent("support-planner", namespace="support")
    other.create_task(kind="ticket-triage", input={"note": "refund requested"})

    page = logged_in_page
    page.goto("/tasks/?q=refund&namespace=acme")
    expect(page.locator("#task-table tbody tr[data-task-id]")).to_have_count(3)
    page.fill("#save-search-name", "Acme refund requests")
    page.check("#save-search input[name=pinned]")
    with page.expect_navigation():
        page.click("#save-search button[type=submit]")
    # The saved search's URL opened the task list with its filter.
    page.wait_for_url("**/tasks/?*search=acme-refund-requests*")
    expect(page.locator("#saved-search-banner")).to_contain_text("Acme refund requests")
    expect(page.locator("#saved-search-banner")).to_contain_text("/searches/acme-refund-requests/")
    expect(page.locator("#task-table tbody tr[data-task-id]")).to_have_count(3)
    expect(page.locator("#id_q")).to_have_value("refund")
    screenshot(scrolled_to_top(page), "tasks-saved-search")
    search = SavedSearch.objects.get()
    assert (search.filter, search.pinned) == ({"q": "refund", "namespace": "acme"}, True)

    page.goto("/searches/")
    row = page.locator("tr[data-search='acme-refund-requests']")
    expect(row.locator("[data-field=count]")).to_have_text("3")
    row.locator("input[name=threshold]").fill("3")
    row.locator("input[name=window_seconds]").fill("600")
    with page.expect_navigation():
        row.locator(".rule-form button[type=submit]").click()
    expect(page.locator("#messages")).to_contain_text("Alert rule added")
    rule = AlertRule.objects.get()
    assert (rule.threshold, rule.window_seconds) == (3, 600)

    # The evaluation duty's step, as the worker runs it every 30 s.
    assert alerts.alerts_evaluate() == 1
    page.goto("/")
    wait_live(page)
    mark_document(page)
    tile = page.locator(".tile[data-tile='search-acme-refund-requests']")
    expect(tile.locator(".tile-value")).to_have_text("3")
    firing = page.locator(f"#alerts-firing tr[data-rule='{rule.pk}']")
    expect(firing).to_contain_text("Acme refund requests")
    expect(firing).to_contain_text("3 / 3")
    # A new matching task reaches the open overview with the live refresh: the tile counts it.
    planner.create_task(input={"lead": "late@example.com", "note": "refund requested"})
    expect(tile.locator(".tile-value")).to_have_text("4", timeout=15_000)
    assert_not_reloaded(page)
    screenshot(scrolled_to_top(page), "overview-saved-search-alert")

    page.goto("/searches/")
    wait_live(page)
    expect(page.locator(f"div.rule[data-rule='{rule.pk}'] .badge")).to_have_text("firing")
    # The count follows the fleet live here too.
    planner.create_task(input={"lead": "later@example.com", "note": "refund requested"})
    expect(page.locator("tr[data-search='acme-refund-requests'] [data-field=count]")).to_have_text(
        "5", timeout=15_000)
    expect(page.locator("#transition-table")).to_contain_text("fired")
    screenshot(scrolled_to_top(page), "searches")

    # Twenty minutes on, nothing matching changed in the window: the alert resolves, once.
    assert alerts.alerts_evaluate(now=timezone.now() + timedelta(minutes=20)) == 1
    page.goto("/")
    expect(page.locator("#alerts-firing")).to_contain_text("Nothing firing")
    expect(page.locator("#alerts-resolved")).to_contain_text("Acme refund requests")
    sent = OutboxMessage.objects.filter(topic=alerts.TOPIC, destination="broker").order_by("id")
    assert [m.payload["state"] for m in sent] == ["firing", "resolved"]

    # Deleting asks first.
    page.goto("/searches/")
    page.locator("tr[data-search='acme-refund-requests'] a.btn.danger").click()
    expect(page.locator("#delete-confirm")).to_contain_text("Its 1 alert rule goes with it")
    screenshot(scrolled_to_top(page), "searches-delete-confirm")
    with page.expect_navigation():
        page.click("#confirm-delete")
    expect(page.locator("#messages")).to_contain_text("Deleted “Acme refund requests”")
    assert not SavedSearch.objects.exists()
