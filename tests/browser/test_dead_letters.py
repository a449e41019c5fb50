"""Dead-letter review in the browser: a reviewer requeues one and the task runs again, edit and
requeue refuses invalid JSON in the page and on the server, a viewer cannot decide, a bulk
requeue is a job whose dry run and result show what someone else decided meanwhile, and new
dead letters appear live."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Page, expect

from backplane.delivery.models import DeadLetter, OutboxMessage
from backplane.eventlog.models import Event
from recovery import bulk, dead_letters
from recovery.models import BulkJob
from tests.browser.conftest import (
    REVIEWER_USERNAME,
    ApiAgent,
    assert_not_reloaded,
    csrf_token_of,
    mark_document,
    path_of,
    scrolled_to_top,
    wait_live,
)
from tests.browser.fleet import dead_letter_of, dead_lettered_tasks, failed_compensation, relay_pass, scored_lead

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

Screenshot = Callable[[Page, str], Path]
PENDING_ROWS = "#dead-letter-table tbody tr[data-state=pending]"
REVIEWER = f"user:{REVIEWER_USERNAME}"
DECISION_EVENTS = ("DeadLetterRequeued", "DeadLetterDiscarded")
# The queue refreshes on any task notice after 5 s of quiet; a dead letter's own notice must
# show it sooner than that.
LIVE_SECONDS = 4.0


@pytest.fixture
def agent(make_agent: Callable[..., ApiAgent]) -> ApiAgent:
    return make_agent("outreacher")


def pending_ids(page: Page) -> list[int]:
    return [int(pk) for pk in page.locator(PENDING_ROWS).evaluate_all("rows => rows.map(r => r.dataset.id)")]


def timeline(page: Page) -> list[dict[str, Any]]:
    return page.evaluate("() => JSON.parse(JSON.stringify(document.getElementById('timeline').data || []))")


def assert_undecided(item: DeadLetter, task_status: str) -> None:
    """Nothing changed: the dead letter is pending and undecided, its task as it was, no decision logged."""
    item.refresh_from_db()
    assert (item.status, item.decided_by, item.decided_at, item.reason) == ("pending", None, None, ""), item
    assert item.task is not None and item.task.status == task_status
    assert not Event.objects.filter(task=item.task, type__in=DECISION_EVENTS).exists()


# --- one decision ------------------------------------------------------------------------------


def test_a_reviewer_requeues_a_task_dead_letter_and_the_task_runs_again(
    reviewer_page: Page, agent: ApiAgent, make_agent: Callable[..., ApiAgent], screenshot: Screenshot
) -> None:
    first, other = dead_lettered_tasks(agent, 2)
    item, waiting = dead_letter_of(first), dead_letter_of(other)
    page = reviewer_page
    page.goto("/dead-letters/")
    assert pending_ids(page) == [item.pk, waiting.pk]  # oldest first
    screenshot(scrolled_to_top(page), "dead-letters-queue")

    with page.expect_navigation():
        page.locator(f"#dead-letter-table tr[data-id='{item.pk}'] a.dl-link").click()
    assert path_of(page.url) == f"/dead-letters/{item.pk}/"
    expect(page.locator("#requeue-effect")).to_contain_text("goes back to pending")
    expect(page.locator("#task-log tr[data-type=TaskDeadLettered]")).to_have_count(1)
    expect(page.locator("#edit-form")).to_have_count(0)  # a task is requeued as it is
    screenshot(scrolled_to_top(page), "dead-letter-detail")

    reason = "the outreach workers are back after the deploy"
    page.locator("#requeue_reason").fill(reason)
    with page.expect_navigation():
        page.locator("#requeue-form button[type=submit]").click()
    expect(page.locator("#messages")).to_contain_text(f"Dead letter #{item.pk} requeued as it was")
    record = page.locator("#decision-record")
    expect(record).to_contain_text("requeued")
    expect(record).to_contain_text(REVIEWER)
    expect(record.locator(".reason")).to_have_text(reason)
    screenshot(scrolled_to_top(page), "dead-letter-requeued")

    item.refresh_from_db()
    assert (item.status, item.decided_by, item.reason) == ("requeued", REVIEWER, reason)
    # It left the pending list; the other one is still waiting.
    page.goto("/dead-letters/?status=pending")
    assert pending_ids(page) == [waiting.pk]

    # The task runs again: pending with fresh attempts, and the next agent claims it.
    assert agent.get_task(first)["status"] == "pending"
    next_agent = make_agent("outreacher-2")
    claim = next_agent.claim(["outreach"])
    assert claim["task"]["task_id"] == first

    # The decision is in the task's log: its event table and its timeline.
    decision = Event.objects.get(task_id=first, type="DeadLetterRequeued")
    assert (decision.agent, decision.payload["reason"]) == (REVIEWER, reason)
    page.goto(f"/tasks/{first}/")
    wait_live(page)
    row = page.locator(f"#event-table tbody tr[data-seq='{decision.seq}']")
    expect(row).to_have_attribute("data-type", "DeadLetterRequeued")
    expect(row).to_contain_text(reason)
    expect(page.locator("#event-table tbody tr[data-type=TaskClaimed]")).to_have_count(2)
    markers = [t for t in timeline(page) if (t.get("meta") or {}).get("kind") == "dead-letter decision"]
    shown = {seq: text for t in markers for seq, text in zip(t["customdata"], t["text"], strict=True)}
    assert decision.seq in shown and "DeadLetterRequeued" in shown[decision.seq], markers
    screenshot(scrolled_to_top(page), "task-after-requeue")


def test_edit_and_requeue_refuses_invalid_json_in_the_page_and_on_the_server(
    reviewer_page: Page, agent: ApiAgent, settings: Any, screenshot: Screenshot
) -> None:
    settings.BACKPLANE_OUTBOX_MAX_ATTEMPTS = 1  # the relay runs here: its first failure is its last
    task_id = scored_lead(agent)
    relay_pass()
    item = DeadLetter.objects.get(task_id=task_id, source="outbox")
    message = OutboxMessage.objects.get(dead_letters=item)
    original, message_payload = dict(item.payload), dict(message.payload)
    assert message.status == "dead"

    page = reviewer_page
    page.goto(f"/dead-letters/{item.pk}/")
    area, status, submit = page.locator("#edit_payload"), page.locator("#json-status"), page.locator("#edit-submit")
    page.locator("#edit_reason").fill("the consumer wants the score as a string")
    expect(submit).to_be_disabled()  # nothing changed yet
    broken = '{"lead": "ada@example.com", "score": "70"'  # no closing brace
    area.fill(broken)
    expect(status).to_have_class("json-status bad")
    expect(status).to_contain_text("Not valid JSON")
    expect(area).to_have_attribute("aria-invalid", "true")
    expect(submit).to_be_disabled()
    screenshot(scrolled_to_top(page), "dead-letter-edit-invalid")

    # The page refuses it even with the button forced on: its submit handler checks again.
    submit.evaluate("button => button.removeAttribute('disabled')")
    submit.click()
    page.wait_for_timeout(300)
    assert path_of(page.url) == f"/dead-letters/{item.pk}/" and area.input_value() == broken
    # Submitted behind the page's back (a plain form.submit() runs no handler), the server refuses it.
    with page.expect_navigation() as refused:
        page.locator("#edit-form").evaluate("form => form.submit()")
    assert refused.value is not None and refused.value.status == 400
    expect(page.locator("#edit .errorlist")).to_contain_text("Not valid JSON")
    expect(area).to_have_value(broken)  # what was typed comes back, to fix it
    # And posted with the page's own session and CSRF token, as a script would.
    answer = page.request.post(f"/dead-letters/{item.pk}/requeue/", headers={"Accept": "application/json"},
                               form={"csrfmiddlewaretoken": csrf_token_of(page), "payload": "[1, 2]",
                                     "reason": "a list is not a message"})
    assert answer.status == 400 and answer.json()["error"]["code"] == "validation_error", answer.text()
    item.refresh_from_db()
    message.refresh_from_db()
    assert (item.status, item.payload, item.original_payload, item.decided_by) == ("pending", original, None, None)
    assert (message.status, message.payload) == ("dead", message_payload)
    assert not Event.objects.filter(task_id=task_id, type__in=DECISION_EVENTS).exists()

    # Fixed, it shows a diff against the original and goes through; the original stays on record.
    edited = {**original, "score": "70"}
    area.fill(json.dumps(edited, indent=2))
    expect(status).to_have_class("json-status good")
    expect(page.locator("#edit-diff .add")).to_contain_text('"score": "70"')
    expect(page.locator("#edit-diff .del")).to_contain_text('"score": 70')
    expect(submit).to_be_enabled()
    with page.expect_navigation():
        submit.click()
    expect(page.locator("#decision-record")).to_contain_text("with an edited payload")
    expect(page.locator("#decided-diff .add")).to_contain_text('"score": "70"')
    item.refresh_from_db()
    message.refresh_from_db()
    assert (item.status, item.payload, item.original_payload) == ("requeued", edited, original)
    assert (message.status, message.attempts, message.payload) == ("pending", 0, edited)


# --- who may decide ----------------------------------------------------------------------------


def test_a_viewer_sees_no_decision_controls_and_a_forged_decision_gets_403(
    logged_in_page: Page, agent: ApiAgent, screenshot: Screenshot
) -> None:
    [task_id] = dead_lettered_tasks(agent, 1)
    item = dead_letter_of(task_id)
    page = logged_in_page
    page.goto("/dead-letters/")
    assert pending_ids(page) == [item.pk]
    expect(page.locator("#viewer-note")).to_be_visible()
    for control in ("#bulk-form", "#pick-page", "input[name=ids]", "#bulk-preview"):
        expect(page.locator(control)).to_have_count(0)
    screenshot(scrolled_to_top(page), "dead-letters-queue-viewer")

    page.goto(f"/dead-letters/{item.pk}/")
    expect(page.locator("#requeue-effect")).to_be_visible()
    expect(page.locator("#viewer-note")).to_be_visible()
    for control in ("#requeue-form", "#discard-form", "#edit-form", "form[action*='/requeue/']",
                    "form[action*='/discard/']", "#decision button"):
        expect(page.locator(control)).to_have_count(0)
    screenshot(scrolled_to_top(page), "dead-letter-detail-viewer")

    # What the page did not offer, posted from the viewer's session with a valid CSRF token.
    token = csrf_token_of(page)
    forged = {
        f"/dead-letters/{item.pk}/requeue/": {"reason": "forged"},
        f"/dead-letters/{item.pk}/discard/": {"reason": "forged", "compensate": "on"},
        "/dead-letters/bulk/": {"action": "dead_letter_requeue", "reason": "forged", "ids": str(item.pk)},
    }
    for path, data in forged.items():
        answer = page.request.post(path, form={**data, "csrfmiddlewaretoken": token})
        # The view's refusal, not CSRF's: the page names the missing permission.
        assert answer.status == 403, (path, answer.status)
        assert "review_deadletter" in answer.text() and "nothing was changed" in answer.text(), path
    assert_undecided(item, "dead_lettered")
    assert not BulkJob.objects.exists()


# --- many at once ------------------------------------------------------------------------------


def test_a_bulk_requeue_of_50_is_a_job_that_skips_the_one_decided_meanwhile(
    reviewer_page: Page, agent: ApiAgent, screenshot: Screenshot
) -> None:
    task_ids = dead_lettered_tasks(agent, 50)
    items = [dead_letter_of(task_id) for task_id in task_ids]
    page = reviewer_page
    page.goto("/dead-letters/")
    expect(page.locator(PENDING_ROWS)).to_have_count(50)
    page.locator("#pick-page").check()
    expect(page.locator("#selected-count")).to_have_text("50 selected")
    preview_button = page.locator("#bulk-preview")
    expect(preview_button).to_be_disabled()  # no reason yet
    reason = "the outreach pool is restored"
    page.locator("#bulk-reason").fill(reason)
    expect(preview_button).to_be_enabled()
    with page.expect_navigation():
        preview_button.click()
    job = BulkJob.objects.get()
    assert path_of(page.url) == f"/jobs/{job.pk}/"
    assert (job.action, job.total, job.created_by) == ("dead_letter_requeue", 50, REVIEWER)
    expect(page.locator("#job-status")).to_have_text("draft")
    expect(page.locator("#job-reason")).to_have_text(reason)
    expect(page.locator("#job-planned")).to_contain_text("50 requeue")
    expect(page.locator("#count-pending")).to_have_text("50")
    expect(page.locator("#items-pending tbody tr")).to_have_count(50)
    screenshot(scrolled_to_top(page), "dead-letters-bulk-dry-run")
    assert DeadLetter.objects.filter(status="pending").count() == 50  # a dry run decides nothing

    # Between the dry run and the start someone else discards one.
    taken = items[17]
    dead_letters.dead_letter_discard(dead_letter_id=taken.pk, decided_by="user:sam", reason="duplicate lead")
    page.click("#job-start")
    expect(page.locator("#job-dialog-summary")).to_contain_text("50 items")
    with page.expect_navigation():
        page.click("#job-dialog-confirm")
    expect(page.locator("#job-status")).to_have_text("running")
    # The worker's chunks, run here; the page follows them by its poll.
    while bulk.bulk_job_step(job.pk):
        pass
    expect(page.locator("#count-done")).to_have_text("49", timeout=10_000)
    expect(page.locator("#count-skipped")).to_have_text("1")
    expect(page.locator("#count-failed")).to_have_text("0")
    page.reload()
    expect(page.locator("#job-status")).to_have_text("finished")
    expect(page.locator("#items-done tbody tr")).to_have_count(49)
    skipped = page.locator("#items-skipped tbody tr")
    expect(skipped).to_have_count(1)
    expect(skipped).to_contain_text(str(taken.pk))
    expect(skipped).to_contain_text("already discarded")
    screenshot(scrolled_to_top(page), "dead-letters-bulk-result")

    assert DeadLetter.objects.filter(status="requeued", decided_by=REVIEWER, reason=reason).count() == 49
    assert DeadLetter.objects.get(pk=taken.pk).decided_by == "user:sam"
    assert Event.objects.filter(type="DeadLetterRequeued", agent=REVIEWER).count() == 49
    assert Event.objects.filter(type="DeadLetterDiscarded").count() == 1
    assert Event.objects.filter(task__dead_letters=taken, type__in=DECISION_EVENTS).count() == 1


# --- live --------------------------------------------------------------------------------------


def test_a_new_dead_letter_appears_on_an_open_queue_page_without_a_reload(
    reviewer_page: Page, agent: ApiAgent, screenshot: Screenshot
) -> None:
    [task_id] = dead_lettered_tasks(agent, 1)
    old = dead_letter_of(task_id)
    page = reviewer_page
    page.goto("/dead-letters/")
    wait_live(page)
    mark_document(page)
    assert pending_ids(page) == [old.pk]

    # Made inside the web process, through the REST API: a compensating agent reports that a
    # refund failed. That process announces it on the channel layer once it commits.
    started = time.monotonic()
    failed_compensation(agent)
    new = DeadLetter.objects.get(source="compensation")
    row = page.locator(f"#dead-letter-table tbody tr[data-id='{new.pk}']")
    remaining = LIVE_SECONDS - (time.monotonic() - started)
    expect(row).to_have_count(1, timeout=max(remaining, 0.5) * 1000)
    expect(row).to_have_class(re.compile(r"\bdl-new\b"))
    expect(row.locator("input[name=ids]")).to_have_count(1)  # a reviewer's row, checkbox and all
    assert pending_ids(page) == [old.pk, new.pk]
    assert_not_reloaded(page)
    screenshot(scrolled_to_top(page), "dead-letters-live")
