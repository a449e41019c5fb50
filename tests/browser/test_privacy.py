"""Personal data in the browser (docs/privacy.md): a task page shows sealed values as
``[personal: …]``; a privacy officer opens them (the read is listed on the Privacy page), finds
the subject by its e-mail there, erases it with a reason, and the task page then shows the value
as erased while its chain still verifies."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from django.contrib.auth.models import AbstractUser
from playwright.sync_api import Page, expect

from backplane.privacy.models import DataSubject, PersonalDataRead
from tests.browser.conftest import ApiAgent, scrolled_to_top, wait_live
from tests.support.roles import role_group

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

Screenshot = Callable[[Page, str], Path]
EMAIL = "ada.lovelace@example.com"


def personal(value: object) -> dict[str, object]:
    return {"$personal": {"subject": "lead:8812", "value": value}}


def test_a_privacy_officer_opens_then_erases_and_the_page_shows_it_erased(
    logged_in_page: Page, staff_user: AbstractUser, make_agent: Callable[..., ApiAgent], screenshot: Screenshot,
) -> None:
    staff_user.groups.add(role_group("Privacy officers"))
    agent = make_agent("qualifier")
    task = agent.create_task("lead-qualification", {"lead": {"$personal": {"subject": "lead:8812", "value": EMAIL,
                                                                           "lookup": True}},
                                                    "source": "webinar"})
    agent.append(task["task_id"], "LeadQualified", {"email": personal(EMAIL), "score": 87,
                                                    "name": personal({"first": "Ada", "last": "Lovelace"})})

    page = logged_in_page
    page.goto(f"/tasks/{task['task_id']}/")
    wait_live(page)
    row = page.locator("tr[data-type=LeadQualified]")
    expect(row).to_contain_text("[personal: lead:8812]")
    expect(page.locator("#event-table")).not_to_contain_text(EMAIL)
    with page.expect_navigation():
        page.locator("#show-personal").click()
    expect(page.locator("#personal-notice")).to_contain_text("reading them is recorded")
    expect(page.locator("tr[data-type=LeadQualified]")).to_contain_text(EMAIL)
    assert PersonalDataRead.objects.get().reader == f"user:{staff_user.username}"

    page.goto("/privacy/")
    expect(page.locator("#personal-reads")).to_contain_text("task page")
    find = page.locator("#find-form")
    find.locator("input[name=namespace]").fill(agent.namespace)
    find.locator("input[name=value]").fill(EMAIL)
    with page.expect_navigation():
        find.get_by_role("button", name="Find").click()
    expect(page.locator("#found")).to_have_text("Belongs to lead:8812.")
    form = page.locator("#erase-form")
    form.locator("input[name=namespace]").fill(agent.namespace)
    form.locator("input[name=subject]").fill("lead:8812")
    form.locator("input[name=reason]").fill("erasure request #4411 (art. 17)")
    with page.expect_navigation():
        form.get_by_role("button", name="Erase").click()
    expect(page.locator("#messages")).to_contain_text(f"Erased: {agent.namespace}/lead:8812")
    expect(page.locator("#subjects tr[data-subject='lead:8812']")).to_contain_text("erasure request #4411")
    screenshot(scrolled_to_top(page), "privacy-erased")
    assert DataSubject.objects.get(subject="lead:8812").wrapped_key is None

    page.goto(f"/tasks/{task['task_id']}/?personal=open")
    wait_live(page)
    row = page.locator("tr[data-type=LeadQualified]")
    expect(row).to_contain_text("[erased: lead:8812")
    expect(page.locator("body")).not_to_contain_text(EMAIL)
    row.locator("details.payload summary").click()
    screenshot(scrolled_to_top(page), "task-personal-erased")
    assert agent.call("GET", f"/api/v1/tasks/{task['task_id']}/verify/", 200)["valid"] is True
