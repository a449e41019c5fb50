"""Live updates on a task's page: within 2 s, exactly once, across web processes, across a
dropped socket."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect

from tests.browser.conftest import ApiAgent, assert_not_reloaded, mark_document, wait_live
from tests.browser.fleet import TaskWithTools, build_task_with_tools
from tests.support.live_server import WebProcess

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

Screenshot = Callable[[Page, str], Path]
# Tests that start web processes ask for ``web_processes`` first: it is then torn down last,
# after the page that talks to them is closed.
ROWS = "#event-table tbody tr[data-seq]"
# How soon an append must show on an open page.
LIVE_SECONDS = 2.0
# A socket dropped by the server: the page retries with backoff (up to 10 s between tries).
RECONNECT_SECONDS = 25.0


@pytest.fixture
def agent(make_agent: Callable[..., ApiAgent]) -> ApiAgent:
    return make_agent("planner")


@pytest.fixture
def story(agent: ApiAgent) -> TaskWithTools:
    return build_task_with_tools(agent)


def seq_counts(page: Page) -> Counter[int]:
    return Counter(int(s) for s in page.locator(ROWS).evaluate_all("rows => rows.map(r => r.dataset.seq)"))


def append_step(agent: ApiAgent, story: TaskWithTools, step: int) -> int:
    event = agent.append(story.parent_id, "ReasoningStepCompleted", {"step": step, "thought": f"live step {step}"},
                         lease_epoch=story.epoch)
    return int(event["seq"])


def assert_shown_once_within(page: Page, seq: int, since: float, seconds: float = LIVE_SECONDS) -> None:
    remaining = max(0.0, seconds - (time.monotonic() - since))
    expect(page.locator(f"{ROWS}[data-seq='{seq}']")).to_have_count(1, timeout=remaining * 1000)


def assert_every_event_once(page: Page, last_seq: int) -> None:
    page.wait_for_timeout(500)  # a duplicate would arrive with a later notice or catch-up
    counts = seq_counts(page)
    assert counts == Counter(range(1, last_seq + 1)), counts


def test_an_append_shows_on_an_open_task_page_within_2_s_once(
    logged_in_page: Page, agent: ApiAgent, story: TaskWithTools, screenshot: Screenshot
) -> None:
    page = logged_in_page
    page.goto(f"/tasks/{story.parent_id}/")
    wait_live(page)
    mark_document(page)

    for step in (6, 7):
        started = time.monotonic()
        seq = append_step(agent, story, step)
        assert_shown_once_within(page, seq, started)
    # A sub-task's completion is written into the parent's log too (SubAgentResultReceived).
    started = time.monotonic()
    agent.append(story.child_id, "TaskCompleted", {"output": {"summary": "Example Ltd, 40 staff"}},
                 lease_epoch=story.child_epoch)
    last_seq = agent.get_task(story.parent_id)["last_seq"]
    assert_shown_once_within(page, last_seq, started)
    expect(page.locator(f"{ROWS}[data-seq='{last_seq}']")).to_have_attribute("data-type", "SubAgentResultReceived")
    assert_every_event_once(page, last_seq)
    assert_not_reloaded(page)
    screenshot(page, "live-task-append")


def test_an_append_served_by_another_web_process_shows_on_the_page(
    web_processes: Callable[..., WebProcess], web_server: WebProcess, logged_in_page: Page, agent: ApiAgent,
    story: TaskWithTools, screenshot: Screenshot,
) -> None:
    other = web_processes(name="web-b")
    page = logged_in_page
    page.goto(f"{web_server.url}/tasks/{story.parent_id}/")
    wait_live(page)
    mark_document(page)

    via_other = agent.via(other)
    started = time.monotonic()
    seq = append_step(via_other, story, 6)
    assert_shown_once_within(page, seq, started)
    assert_every_event_once(page, seq)
    assert_not_reloaded(page)
    screenshot(page, "live-two-processes")


def test_a_socket_dropped_by_the_server_reconnects_and_catches_up_once(
    web_processes: Callable[..., WebProcess], web_server: WebProcess, logged_in_page: Page, agent: ApiAgent,
    story: TaskWithTools, screenshot: Screenshot,
) -> None:
    # The page is held by a process of its own, killed and started again; the appends made
    # meanwhile go through the package's web process. The session cookie is for 127.0.0.1,
    # whatever the port, so it works on both.
    first, second = web_processes(name="web-a"), web_server
    page = logged_in_page
    page.goto(f"{first.url}/tasks/{story.parent_id}/")
    wait_live(page)
    mark_document(page)
    started = time.monotonic()
    seq = append_step(agent.via(first), story, 6)
    assert_shown_once_within(page, seq, started)
    screenshot(page, "live-before-drop")

    first.kill()
    expect(page.locator("#live-status")).not_to_have_attribute("data-state", "connected", timeout=5000)
    missed = [append_step(agent.via(second), story, step) for step in (7, 8, 9)]
    screenshot(page, "live-dropped")

    first.start()
    wait_live(page, timeout=RECONNECT_SECONDS * 1000)
    for seq in missed:
        expect(page.locator(f"{ROWS}[data-seq='{seq}']")).to_have_count(1)
    assert_every_event_once(page, missed[-1])

    # And the new socket is live: the next append through the restarted process shows too.
    started = time.monotonic()
    seq = append_step(agent.via(first), story, 10)
    assert_shown_once_within(page, seq, started)
    assert_every_event_once(page, seq)
    assert_not_reloaded(page)
    screenshot(page, "live-reconnected")
