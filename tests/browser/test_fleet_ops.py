"""Cancel and pause in the browser: the task page's cancel dialog (reason, compensate), a pending
task held back by a pause, the pauses page with its confirmation, and the overview's paused work."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect

from backplane.eventlog import services
from backplane.eventlog.models import Event, Task
from recovery import fleet
from recovery.models import Pause
from tests.browser.conftest import scrolled_to_top

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_a_task_is_cancelled_from_its_page_with_a_reason(logged_in_page: Page,
                                                        screenshot: Callable[[Page, str], Path]) -> None:
    task = services.task_create(namespace="acme", kind="lead-qualification", agent="planner",
                                input={"lead": "dana@example.com"}).task
    page = logged_in_page
    page.goto(f"/tasks/{task.pk}/")
    page.click("#cancel-task")
    dialog = page.locator("#cancel-dialog")
    expect(dialog).to_be_visible()
    dialog.locator("input[name=reason]").fill("prompt v7 loops on step 3")
    dialog.locator("input[name=compensate]").check()
    screenshot(page, "task-cancel-dialog")

    with page.expect_navigation():
        dialog.locator("#cancel-submit").click()
    expect(page.locator("#messages")).to_contain_text("Cancelled")
    expect(page.locator("[data-field=status]")).to_have_text("cancelled")
    expect(page.locator("#cancel-task")).to_have_count(0)
    event = Event.objects.get(task_id=task.pk, type="TaskCancelled")
    assert event.payload["reason"] == "prompt v7 loops on step 3" and event.payload["compensate"] is True
    screenshot(scrolled_to_top(page), "task-cancelled")


def test_a_cancel_without_a_reason_is_not_sent(logged_in_page: Page) -> None:
    task = services.task_create(namespace="acme", kind="lead-qualification", agent="planner", input={}).task
    page = logged_in_page
    page.goto(f"/tasks/{task.pk}/")
    page.click("#cancel-task")
    page.locator("#cancel-submit").click()
    # The browser keeps the form (the reason is required); nothing reached the server.
    expect(page.locator("#cancel-dialog")).to_be_visible()
    assert Task.objects.get(pk=task.pk).status == "pending"


def test_pausing_a_kind_from_the_pauses_page_and_where_it_shows(logged_in_page: Page,
                                                                 screenshot: Callable[[Page, str], Path]) -> None:
    held = services.task_create(namespace="acme", kind="lead-enrichment", agent="planner", input={}).task
    fleet.pause_set(namespace="globex", kind="", paused_by="user:ops", reason="a bad deploy is being rolled back")
    lifted = fleet.pause_set(namespace="acme", kind="invoice-send", paused_by="user:ops", reason="PDF renderer down")
    fleet.pause_lift(pause_id=lifted.pk, resumed_by="user:ops", reason="renderer fixed")
    page = logged_in_page
    page.goto("/pauses/")
    form = page.locator("#pause-form")
    form.locator("input[name=namespace]").fill("acme")
    form.locator("input[name=kind]").fill("lead-enrichment")
    form.locator("input[name=reason]").fill("the CRM enrichment tool rejects every lookup")
    form.locator("#pause-submit").click()
    dialog = page.locator("#pause-dialog")
    expect(dialog).to_be_visible()
    expect(dialog.locator("#pause-summary")).to_contain_text("Every pending lead-enrichment task of acme will wait")
    screenshot(page, "pauses-confirm")
    assert Pause.objects.filter(resumed_at__isnull=True).count() == 1  # nothing yet: the dialog asks first

    with page.expect_navigation():
        dialog.locator("#pause-confirm").click()
    expect(page.locator("#messages")).to_contain_text("Paused kind lead-enrichment of acme")
    expect(page.locator("#pauses-in-force tbody tr")).to_have_count(2)
    expect(page.locator("#pauses-lifted")).to_contain_text("renderer fixed")
    screenshot(scrolled_to_top(page), "pauses")

    page.goto(f"/tasks/{held.pk}/")
    expect(page.locator("#pause-notice")).to_contain_text("the CRM enrichment tool rejects every lookup")
    screenshot(scrolled_to_top(page), "task-held-by-pause")

    page.goto("/")
    expect(page.locator("#pauses-in-force li")).to_have_count(2)
    screenshot(scrolled_to_top(page), "overview-pauses")

    page.goto("/pauses/")
    row = page.locator("#pauses-in-force tr", has_text="lead-enrichment")
    row.locator("input[name=reason]").fill("the CRM fix is deployed")
    with page.expect_navigation():
        row.locator("button[type=submit]").click()
    expect(page.locator("#messages")).to_contain_text("Resumed: acme/lead-enrichment")
    assert Pause.objects.get(kind="lead-enrichment").resume_reason == "the CRM fix is deployed"
