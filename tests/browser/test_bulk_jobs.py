"""Bulk jobs in the browser: "Bulk action…" from a filtered task list, the dry run's page, the
start confirmed in a dialog, live progress as chunks settle, and a pause half done."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect

from recovery import bulk
from recovery.models import BulkJob
from tests.browser.conftest import scrolled_to_top
from tests.recovery.test_bulk import failed_task

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

TASKS = 60


def test_a_bulk_retry_from_the_task_list_runs_live_and_pauses_half_done(
        reviewer_page: Page, screenshot: Callable[[Page, str], Path]) -> None:
    for _ in range(TASKS):
        failed_task(kind="lead-enrichment")
    page = reviewer_page
    page.goto("/tasks/?status=failed&kind=lead-enrichment")
    with page.expect_navigation():
        page.click("#bulk-action")
    expect(page.locator("#job-filter")).to_contain_text("status=failed")
    form = page.locator("#job-new-form")
    form.locator("select[name=action]").select_option("retry")
    form.locator("input[name=reason]").fill("deploy 412 of the enrichment tool failed them; fixed in 413")
    form.locator("input[name=rate_per_second]").fill("0")
    form.locator("input[name=chunk_size]").fill("20")
    with page.expect_navigation():
        page.click("#job-dry-run")
    job = BulkJob.objects.get()
    expect(page.locator("#job-status")).to_have_text("draft")
    expect(page.locator("#count-pending")).to_have_text(str(TASKS))
    expect(page.locator("#items-pending tbody tr").first).to_contain_text("retry")
    screenshot(scrolled_to_top(page), "job-dry-run")

    page.click("#job-start")
    expect(page.locator("#job-dialog")).to_be_visible()
    expect(page.locator("#job-dialog-summary")).to_contain_text(f"retry of {TASKS} items")
    with page.expect_navigation():
        page.click("#job-dialog-confirm")
    expect(page.locator("#job-status")).to_have_text("running")
    job.refresh_from_db()
    assert job.status == "running"

    # The worker's steps, run here: the page follows them by its poll, without a reload.
    assert bulk.bulk_job_step(job.pk) == 20
    assert bulk.bulk_job_step(job.pk) == 20
    expect(page.locator("#count-done")).to_have_text("40", timeout=10_000)
    expect(page.locator("#count-pending")).to_have_text("20")
    expect(page.locator("#job-percent")).to_have_text("66.7 %")

    page.locator("#job-actions input[name=reason]").first.fill("checking the first results")
    page.click("#job-pause")
    with page.expect_navigation():
        page.click("#job-dialog-confirm")
    expect(page.locator("#job-status")).to_have_text("paused")
    expect(page.locator("#items-done tbody tr")).to_have_count(40)
    expect(page.locator("#job-resume")).to_be_visible()
    expect(page.locator("#job-decisions")).to_contain_text("checking the first results")
    assert bulk.bulk_job_step(job.pk) == 0  # paused: no chunk starts
    screenshot(scrolled_to_top(page), "job-paused-half-done")

    page.goto("/jobs/")
    expect(page.locator(f"#jobs-table tr[data-job='{job.pk}']")).to_contain_text("paused")
    screenshot(page, "jobs-list")
