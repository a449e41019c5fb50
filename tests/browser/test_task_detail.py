"""A task's page: header, parent and sub-tasks, the timeline, chain marks, the recovery context."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from playwright.sync_api import Page, expect

from tests.browser.conftest import ApiAgent, path_of, wait_live
from tests.browser.fleet import TaskWithTools, build_task_with_tools

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

Screenshot = Callable[[Page, str], Path]
CHAIN_STATES = {"verified", "unverified", "broken"}


@pytest.fixture
def agent(make_agent: Callable[..., ApiAgent]) -> ApiAgent:
    return make_agent("planner")


@pytest.fixture
def story(agent: ApiAgent) -> TaskWithTools:
    return build_task_with_tools(agent)


def timeline(page: Page) -> list[dict[str, Any]]:
    return page.evaluate("() => JSON.parse(JSON.stringify(document.getElementById('timeline').data || []))")


def tool_call_traces(traces: list[dict[str, Any]], state: str) -> list[dict[str, Any]]:
    return [t for t in traces if (t.get("meta") or {}).get("kind") == "tool_call" and t["meta"].get("state") == state]


def bars(trace: dict[str, Any]) -> int:
    values = trace.get("x") if trace.get("orientation") == "h" else trace.get("y")
    return len(values or [])


def is_transparent(colour: Any) -> bool:
    if colour in (None, "", "transparent", "none"):
        return True
    match = re.fullmatch(r"rgba\(\s*[\d.]+\s*,\s*[\d.]+\s*,\s*[\d.]+\s*,\s*([\d.]+)\s*\)", str(colour).strip())
    return match is not None and float(match.group(1)) == 0


def colours(value: Any) -> list[Any]:
    return list(value) if isinstance(value, list) else [value]


def event_seqs(page: Page) -> list[int]:
    return [int(s) for s in page.locator("#event-table tbody tr[data-seq]").evaluate_all(
        "rows => rows.map(r => r.dataset.seq)")]


def chain_marks(page: Page) -> dict[int, str]:
    return {int(seq): state for seq, state in page.locator("#event-table tbody tr[data-seq]").evaluate_all(
        "rows => rows.map(r => [r.dataset.seq, r.querySelector('.chain-mark[data-chain]').dataset.chain])")}


def test_it_shows_the_task_its_timeline_and_its_events(
    logged_in_page: Page, agent: ApiAgent, story: TaskWithTools, screenshot: Screenshot
) -> None:
    task = agent.get_task(story.parent_id)
    page = logged_in_page
    page.goto(f"/tasks/{story.parent_id}/")
    wait_live(page)

    header = page.locator("#task-header")
    expect(header.locator("[data-field=status]")).to_contain_text("running")
    expect(header.locator("[data-field=attempts]")).to_contain_text(str(task["attempts"]))
    expect(header.locator("[data-field=lease]")).to_contain_text(task["lease"]["agent"])

    children = page.locator("#task-tree a.task-link[data-task-id]")
    assert children.evaluate_all("links => links.map(a => a.dataset.taskId)") == [story.child_id]

    assert event_seqs(page) == list(range(1, task["last_seq"] + 1))
    marks = chain_marks(page)
    assert set(marks.values()) <= CHAIN_STATES, marks

    traces = timeline(page)
    done, in_flight = tool_call_traces(traces, "done"), tool_call_traces(traces, "in_flight")
    assert sum(map(bars, done)) == 1 and sum(map(bars, in_flight)) == 1, traces
    assert [k for t in done for k in t["customdata"]] == [story.done_key]
    assert [k for t in in_flight for k in t["customdata"]] == [story.in_flight_key]
    # In flight is drawn open: an outline and no fill.
    [open_bar] = in_flight
    marker = open_bar.get("marker") or {}
    assert all(map(is_transparent, colours(marker.get("color")))), marker
    line = marker.get("line") or {}
    assert (line.get("width") or 0) > 0 and not any(map(is_transparent, colours(line.get("color")))), marker
    [closed_bar] = done
    assert not any(map(is_transparent, colours((closed_bar.get("marker") or {}).get("color")))), closed_bar

    context = agent.call("GET", f"/api/v1/tasks/{story.parent_id}/recovery-context/", 200)
    recovery = page.locator("#recovery-context")
    expect(recovery).to_contain_text(" ".join(context["resume_prompt"].split()[:8]))
    screenshot(page, "task-detail")


def test_it_verifies_the_chain_on_demand(
    logged_in_page: Page, story: TaskWithTools, screenshot: Screenshot
) -> None:
    page = logged_in_page
    page.goto(f"/tasks/{story.parent_id}/")
    wait_live(page)
    page.locator("button#verify-chain").click()
    seqs = event_seqs(page)
    expect(page.locator("#event-table tbody tr[data-seq] .chain-mark[data-chain=verified]")).to_have_count(len(seqs))
    screenshot(page, "task-verified")


def test_it_marks_where_a_tampered_chain_breaks(
    logged_in_page: Page, story: TaskWithTools, screenshot: Screenshot
) -> None:
    # Rewrite one event's payload behind the log's back (the table refuses UPDATE; a superuser
    # skipping triggers does not), as an attacker with database access would.
    with connection.cursor() as cursor:
        cursor.execute("SET session_replication_role = replica")
        cursor.execute(
            "UPDATE backplane_event SET payload = jsonb_set(payload, '{thought}', '\"edited\"') "
            "WHERE task_id = %s AND seq = 3",
            [story.parent_id],
        )
        cursor.execute("SET session_replication_role = origin")
    page = logged_in_page
    page.goto(f"/tasks/{story.parent_id}/")
    wait_live(page)
    page.locator("button#verify-chain").click()
    broken = page.locator("#event-table tbody tr[data-seq='3'] .chain-mark")
    expect(broken).to_have_attribute("data-chain", "broken")
    marks = chain_marks(page)
    assert [marks[1], marks[2], marks[3]] == ["verified", "verified", "broken"], marks
    assert set(list(marks.values())[3:]) == {"unverified"}, marks
    screenshot(page, "task-chain-broken")


def test_its_tree_links_lead_to_the_sub_task_and_back(
    logged_in_page: Page, story: TaskWithTools, screenshot: Screenshot
) -> None:
    page = logged_in_page
    page.goto(f"/tasks/{story.parent_id}/")
    with page.expect_navigation():
        page.locator(f"#task-tree a.task-link[data-task-id='{story.child_id}']").click()
    assert path_of(page.url) == f"/tasks/{story.child_id}/", page.url
    expect(page.locator("#task-header [data-field=status]")).to_contain_text("running")
    screenshot(page, "task-detail-child")

    with page.expect_navigation():
        page.locator(f"#task-tree a.task-link[data-task-id='{story.parent_id}']").click()
    assert path_of(page.url) == f"/tasks/{story.parent_id}/", page.url
    expect(page.locator("#task-tree a.task-link[data-task-id]")).to_have_count(1)
