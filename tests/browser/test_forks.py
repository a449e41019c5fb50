"""Forks in the browser: fork from a point of the timeline, land on the fork, compare it with its
source and see where they drift apart; a refused fork says why; fork many from failure as a job,
a dry run first (reviewers only)."""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Page, expect

from backplane.eventlog import forks, lineage
from backplane.eventlog.models import Event, Task
from recovery import bulk
from recovery.models import BulkJob
from tests.browser.conftest import (
    REVIEWER_USERNAME,
    SCREENSHOT_DIR,
    STAFF_USERNAME,
    ApiAgent,
    csrf_token_of,
    path_of,
    scrolled_to_top,
    wait_live,
)
from tests.browser.fleet import TaskWithTools, build_task_with_tools, claim_task, steps

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

Screenshot = Callable[[Page, str], Path]
OPERATOR = f"user:{STAFF_USERNAME}"
REVIEWER = f"user:{REVIEWER_USERNAME}"
TARGETED = re.compile(r"\btargeted\b")
# The first divergence's highlight (static/css/dashboard.css).
HIGHLIGHT = "rgb(255, 241, 194)"


@pytest.fixture
def agent(make_agent: Callable[..., ApiAgent]) -> ApiAgent:
    return make_agent("planner")


@pytest.fixture
def story(agent: ApiAgent) -> TaskWithTools:
    return build_task_with_tools(agent)


def timeline_point(page: Page, trace_name: str, index: int) -> dict[str, Any]:
    """Where point ``index`` of the scatter trace ``trace_name`` is drawn (its centre, in page
    pixels) and the seq it carries."""
    point: dict[str, Any] = page.evaluate(
        """([name, index]) => {
            const gd = document.getElementById("timeline");
            const scatter = gd._fullData.filter((t) => t.type === "scatter");
            const k = scatter.findIndex((t) => t.name === name);
            const trace = gd.querySelectorAll(".scatterlayer .trace")[k];
            const box = trace.querySelectorAll("path.point")[index].getBoundingClientRect();
            return { x: box.x + box.width / 2, y: box.y + box.height / 2, seq: scatter[k].customdata[index] };
        }""",
        [trace_name, index],
    )
    return point


@pytest.fixture
def reasoned(agent: ApiAgent) -> str:
    """A running task that reasoned three steps (seq 3, 4, 5) after its claim (seq 2): points
    only on its timeline, none under a bar (Plotly gives a click inside a bar to the bar)."""
    task = agent.create_task("outreach", {"lead": "ada@example.com", "company": "Example Ltd"})
    epoch = claim_task(agent, task, lease_seconds=600)
    steps(agent, task["task_id"], epoch, range(1, 4))
    return str(task["task_id"])


def test_it_forks_from_a_point_of_the_timeline_and_compares_the_fork_with_its_source(
    logged_in_page: Page, reasoned: str, screenshot: Screenshot
) -> None:
    page = logged_in_page
    page.goto(f"/tasks/{reasoned}/")
    wait_live(page)
    expect(page.locator("#timeline .scatterlayer path.point").first).to_be_visible()
    # The second reasoning step: its point on the timeline, apart from its neighbours.
    point = timeline_point(page, "reasoning steps", 1)
    assert Event.objects.get(task_id=reasoned, seq=point["seq"]).payload["step"] == 2
    for other in (timeline_point(page, "reasoning steps", 0), timeline_point(page, "reasoning steps", 2)):
        assert abs(other["x"] - point["x"]) > 12, "the steps were recorded too close together to click one"
    page.mouse.move(point["x"], point["y"])
    page.mouse.click(point["x"], point["y"])

    dialog = page.locator("dialog#fork-dialog")
    expect(dialog).to_be_visible()
    expect(dialog.locator("input[name=at_seq]")).to_have_value(str(point["seq"]))
    expect(dialog.locator("#fork-at-type")).to_contain_text("ReasoningStepCompleted")
    expect(page.locator(f"#event-table tr#seq-{point['seq']}")).to_have_class(TARGETED)
    # The fork column fits: the event table is no wider than its panel.
    assert page.locator("#event-table").evaluate("t => t.offsetWidth <= t.parentElement.clientWidth")
    dialog.locator("input[name=reason]").fill("retry the quote with the new price list")
    # What the operator sees: the modal over the page's first screen (a full-page picture would
    # stretch the page under a backdrop one screen high).
    scrolled_to_top(page).screenshot(path=str(SCREENSHOT_DIR / "fork-dialog.png"))

    with page.expect_navigation():
        dialog.locator("#fork-submit").click()
    [fork] = Task.objects.filter(forked_from_id=uuid.UUID(reasoned))
    assert path_of(page.url) == f"/tasks/{fork.pk}/", page.url
    assert (fork.forked_at_seq, fork.sandbox, fork.status) == (point["seq"], False, "pending")
    forked = Event.objects.get(task=fork, seq=2)
    assert (forked.type, forked.payload["forked_by"], forked.payload["reason"]) == (
        "TaskForked", OPERATOR, "retry the quote with the new price list")
    expect(page.locator("#messages")).to_contain_text("New fork of outreach")
    expect(page.locator("#fork-origin")).to_contain_text(f"after event {point['seq']}")
    expect(page.locator("#task-header [data-field=fork-of]")).to_contain_text(f"after event {point['seq']}")
    screenshot(scrolled_to_top(page), "fork-page")

    with page.expect_navigation():
        page.locator("#compare-source").click()
    assert path_of(page.url) == f"/tasks/{reasoned}/diff/{fork.pk}/", page.url
    first = page.locator("#diff-table tr.first-divergence")
    expect(first).to_have_count(1)
    expect(first).to_be_in_viewport()
    # The source went on after the fork's event (its third step); the fork did not.
    expect(first).to_have_attribute("data-kind", "only_in_a")
    next_seq = point["seq"] + 1
    expect(first.locator("td.side").first).to_contain_text(f"#{next_seq}")
    assert first.locator("td").first.evaluate("td => getComputedStyle(td).backgroundColor") == HIGHLIGHT
    expect(page.locator("#first-divergence-summary")).to_contain_text("only in A")
    # The counts are the contract's (backplane/eventlog/drift.py decides what is compared).
    drift = lineage.tasks_drift(namespace=None, a_id=uuid.UUID(reasoned), b_id=fork.pk)
    assert drift.first_divergence is not None and drift.first_divergence.a is not None
    assert drift.first_divergence.a.seq == next_seq
    for kind, count in drift.counts.items():
        expect(page.locator(f"#diff-counts li[data-kind={kind}] strong")).to_have_text(str(count))
    screenshot(scrolled_to_top(page), "fork-diff")

    # Each event links into its task's page, at its row.
    with page.expect_navigation():
        first.locator("td.side").first.locator("a.event-link").click()
    assert path_of(page.url) == f"/tasks/{reasoned}/" and page.url.endswith(f"#seq-{next_seq}")
    expect(page.locator(f"#event-table tr#seq-{next_seq}")).to_have_class(TARGETED)


def test_a_sandbox_forked_into_production_is_refused_with_the_contracts_words(
    logged_in_page: Page, story: TaskWithTools, screenshot: Screenshot
) -> None:
    sandbox = forks.task_fork(namespace=None, source_task_id=uuid.UUID(story.parent_id), at_seq=3, reason="replay",
                              forked_by="user:setup", by_staff=True, sandbox=True).task
    before = (Task.objects.count(), Event.objects.count())
    page = logged_in_page
    page.goto(f"/tasks/{sandbox.pk}/")
    expect(page.locator("#task-header [data-field=sandbox]")).to_have_text("sandbox")
    page.locator("#event-table tr#seq-2 a.fork-here").click()
    dialog = page.locator("dialog#fork-dialog")
    expect(dialog).to_be_visible()
    expect(dialog.locator("input[name=at_seq]")).to_have_value("2")
    expect(dialog.locator("input[name=sandbox]")).to_be_checked()  # a sandbox's forks are sandboxes
    dialog.locator("input[name=sandbox]").uncheck()
    dialog.locator("input[name=reason]").fill("make it real")
    with page.expect_navigation():
        dialog.locator("#fork-submit").click()
    expect(dialog).to_be_visible()
    expect(dialog.locator("#fork-error")).to_contain_text(
        "a sandbox's history is a replay; it can only be forked into another sandbox")
    expect(dialog.locator("input[name=reason]")).to_have_value("make it real")
    assert (Task.objects.count(), Event.objects.count()) == before
    scrolled_to_top(page).screenshot(path=str(SCREENSHOT_DIR / "fork-refused.png"))


def failed_tasks(agent: ApiAgent, count: int, kind: str) -> list[uuid.UUID]:
    """Tasks of ``kind`` that reasoned two steps and failed for good, through the API."""
    ids = []
    for n in range(count):
        task = agent.create_task(kind, {"lead": f"lead-{n}@example.com"}, max_attempts=1)
        epoch = claim_task(agent, task)
        steps(agent, task["task_id"], epoch, range(1, 3))
        agent.append(task["task_id"], "TaskFailed", {"error": "the CRM refused the lead", "retryable": False},
                     lease_epoch=epoch)
        ids.append(uuid.UUID(task["task_id"]))
    return ids


def test_it_forks_the_failed_tasks_of_a_filter_as_a_job_after_a_dry_run(
    reviewer_page: Page, agent: ApiAgent, screenshot: Screenshot
) -> None:
    failed = failed_tasks(agent, 3, "enrichment")
    agent.create_task("enrichment", {"lead": "pending@example.com"})
    page = reviewer_page
    page.goto("/tasks/?kind=enrichment")
    expect(page.locator("#task-table tbody tr[data-task-id]")).to_have_count(4)
    page.locator("#all-matching").check()
    page.locator("#bulk-reason").fill("the CRM is back")
    expect(page.locator("#selected-count")).to_have_text("all matching the filter")
    screenshot(scrolled_to_top(page), "fork-bulk-bar")
    before = (Task.objects.count(), Event.objects.count())
    with page.expect_navigation():
        page.locator("#bulk-preview").click()

    job = BulkJob.objects.get()
    assert path_of(page.url) == f"/jobs/{job.pk}/"
    assert (job.action, job.selection, job.created_by) == (
        "fork_from_failure", {"filter": {"kind": "enrichment"}}, REVIEWER)
    expect(page.locator("#job-status")).to_have_text("draft")
    expect(page.locator("#job-planned")).to_contain_text("3 fork from just before its last failure")
    expect(page.locator("#job-planned")).to_contain_text("1 will be skipped: it never failed")
    expect(page.locator("#items-pending tbody tr")).to_have_count(4)
    assert (Task.objects.count(), Event.objects.count()) == before  # the dry run forks nothing
    screenshot(scrolled_to_top(page), "fork-bulk-dry-run")

    page.click("#job-start")
    expect(page.locator("#job-dialog-summary")).to_contain_text("fork from failure of 4 items")
    with page.expect_navigation():
        page.click("#job-dialog-confirm")
    while bulk.bulk_job_step(job.pk):
        pass
    page.reload()
    expect(page.locator("#job-status")).to_have_text("finished")
    expect(page.locator("#count-done")).to_have_text("3")
    expect(page.locator("#count-skipped")).to_have_text("1")
    made = Task.objects.filter(forked_from_id__in=failed)
    assert sorted(str(t.forked_from_id) for t in made) == sorted(map(str, failed))
    # Each fork continues after the event before the failure: the second step, seq 4.
    assert {t.forked_at_seq for t in made} == {4}
    for fork in made:
        expect(page.locator("#items-done")).to_contain_text(f"forked after seq 4 as {fork.pk}")
    screenshot(scrolled_to_top(page), "fork-bulk-result")

    # The start sent again (a resent request from the dry run's page) is refused and forks nothing twice.
    again = page.request.post(f"/jobs/{job.pk}/start/", form={"selection_hash": job.selection_hash,
                                                              "csrfmiddlewaretoken": csrf_token_of(page)})
    assert again.status == 409 and "cannot be started" in again.text()
    while bulk.bulk_job_step(job.pk):
        pass
    assert Task.objects.filter(forked_from_id__in=failed).count() == 3


def test_a_non_reviewer_is_told_bulk_forks_are_for_reviewers(
    logged_in_page: Page, agent: ApiAgent, screenshot: Screenshot
) -> None:
    failed_tasks(agent, 1, "enrichment")
    page = logged_in_page
    page.goto("/tasks/?kind=enrichment")
    expect(page.locator("#bulk-viewer-note")).to_contain_text("for reviewers only")
    for control in ("#fork-bulk-form", "#pick-page", "input[name=ids]", "#bulk-preview"):
        expect(page.locator(control)).to_have_count(0)
    screenshot(scrolled_to_top(page), "fork-bulk-viewer")
