"""The task list: search inside payloads, filters, keyset pages, new tasks arriving live."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from playwright.sync_api import Locator, Page, expect

from tests.browser.conftest import TIMEZONE, ApiAgent, assert_not_reloaded, mark_document, path_of, wait_live
from tests.browser.fleet import build_fleet, claim_task

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

Screenshot = Callable[[Page, str], Path]
ROWS = "#task-table tbody tr[data-task-id]"
# More than one page of the list (50 rows a page).
BULK = 55
FILTER_FIELDS = ("q", "kind", "namespace", "agent", "created_after", "created_before", "updated_after",
                 "updated_before")


def shown_ids(page: Page) -> list[str]:
    return page.locator(ROWS).evaluate_all("rows => rows.map(r => r.dataset.taskId)")


def filters(page: Page) -> Locator:
    return page.locator("form#task-filters")


def apply_filters(page: Page, screenshot: Screenshot, name: str, **values: str) -> list[str]:
    """Fill in the filter form on the task list (every other field emptied), submit it, save a
    screenshot; the ids listed."""
    form = filters(page)
    for field in FILTER_FIELDS:
        form.locator(f"input[name={field}]").fill(values.pop(field, ""))
    form.locator("select[name=status]").select_option(values.pop("status", ""))
    assert not values, f"not a filter: {values}"
    with page.expect_navigation():
        form.locator("[type=submit]").click()
    assert path_of(page.url) == "/tasks/", page.url
    screenshot(page, name)
    return shown_ids(page)


def test_it_finds_a_task_by_a_value_inside_one_event_payload(
    logged_in_page: Page, make_agent: Callable[..., ApiAgent], screenshot: Screenshot
) -> None:
    agent = make_agent("planner")
    needle = f"ref-{uuid.uuid4().hex[:12]}"
    tasks = [agent.create_task("lead-qualification", {"lead": lead}) for lead in ("a@example.com", "b@example.com")]
    target = agent.create_task("lead-qualification", {"lead": "c@example.com"})
    epoch = claim_task(agent, tasks[0])
    agent.append(tasks[0]["task_id"], "ReasoningStepCompleted", {"step": 1, "note": "nothing to find here"},
                 lease_epoch=epoch)
    # Deep in the third event of the target's log, and nowhere else: not in any input, kind or id.
    agent.append(target["task_id"], "CrmRecordLinked", {"crm": {"records": [{"external_ref": needle}]}})

    page = logged_in_page
    page.goto("/tasks/")
    expect(page.locator(ROWS)).to_have_count(3)
    screenshot(page, "tasks-before-search")
    assert apply_filters(page, screenshot, "tasks-search", q=needle) == [target["task_id"]]
    assert apply_filters(page, screenshot, "tasks-search-nothing", q=f"ref-{uuid.uuid4().hex[:12]}") == []


def test_its_filters_narrow_the_list(
    logged_in_page: Page, make_agent: Callable[..., ApiAgent], screenshot: Screenshot
) -> None:
    planner = make_agent("planner")
    ids = build_fleet(planner)
    other = make_agent("scout", namespace="globex").create_task("research", {"company": "Globex"})

    total = sum(map(len, ids.values())) + 1
    page = logged_in_page
    page.goto("/tasks/")
    expect(page.locator(ROWS)).to_have_count(total)
    screenshot(page, "tasks-all")

    assert apply_filters(page, screenshot, "tasks-failed", status="failed") == ids["failed"]
    assert apply_filters(page, screenshot, "tasks-globex", namespace="globex") == [other["task_id"]]
    assert sorted(apply_filters(page, screenshot, "tasks-research", kind="research")) == sorted(
        [*ids["running"], other["task_id"]])
    assert apply_filters(page, screenshot, "tasks-by-scout", agent="scout") == [other["task_id"]]
    # Times are typed in the viewer's timezone (the browser's is not UTC).
    two_minutes_ago = (datetime.now(ZoneInfo(TIMEZONE)) - timedelta(minutes=2)).strftime("%Y-%m-%dT%H:%M")
    for field, expected in (("created_after", total), ("created_before", 0), ("updated_after", total),
                            ("updated_before", 0)):
        shown = apply_filters(page, screenshot, f"tasks-{field}", **{field: two_minutes_ago})
        assert len(shown) == expected, f"{field}={two_minutes_ago} ({TIMEZONE})"


def test_it_pages_with_a_cursor_keeping_the_filters(
    logged_in_page: Page, make_agent: Callable[..., ApiAgent], screenshot: Screenshot
) -> None:
    agent = make_agent("planner")
    created = [agent.create_task("bulk-import", {"row": n})["task_id"] for n in range(BULK)]
    agent.create_task("lead-qualification", {"lead": "not-bulk@example.com"})

    page = logged_in_page
    page.goto("/tasks/?kind=bulk-import")
    seen: list[str] = []
    pages = 0
    while True:
        pages += 1
        seen += shown_ids(page)
        screenshot(page, f"tasks-page-{pages}")
        next_link = page.locator("a#next-page")
        if next_link.count() == 0:
            break
        assert "kind=bulk-import" in (next_link.get_attribute("href") or "")
        with page.expect_navigation():
            next_link.click()
    assert pages >= 2, "one page only: no a#next-page"
    assert seen == list(reversed(created)), "every task once, newest first"


def test_new_tasks_appear_at_the_top_without_a_reload(
    logged_in_page: Page, make_agent: Callable[..., ApiAgent], screenshot: Screenshot
) -> None:
    agent = make_agent("planner")
    first = agent.create_task()
    page = logged_in_page
    page.goto("/tasks/")
    wait_live(page)
    mark_document(page)
    assert shown_ids(page) == [first["task_id"]]

    new = [agent.create_task("lead-qualification", {"lead": f"new-{n}@example.com"})["task_id"] for n in range(2)]
    expect(page.locator(ROWS).first).to_have_attribute("data-task-id", new[-1], timeout=2000)
    page.wait_for_timeout(300)  # a duplicate would come with the next notice
    assert shown_ids(page) == [*reversed(new), first["task_id"]]
    assert_not_reloaded(page)
    screenshot(page, "tasks-live")
