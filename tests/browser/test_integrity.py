"""The integrity page in the browser: "verify now" finds a tampered task broken at the right seq
(on the task's page, for one task, and for all in the worker, with its progress), and an
event's inclusion proof downloads and checks offline with the command line the page shows."""

from __future__ import annotations

import shlex
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from django.db import connection
from playwright.sync_api import Page, expect

from backplane.eventlog.models import Event
from backplane.integrity import sealing
from backplane.integrity.models import IntegrityAlert, VerificationRun
from backplane.integrity.tasks import verify_chains_requested
from tests.browser.conftest import STAFF_USERNAME, ApiAgent, scrolled_to_top, wait_live
from tests.browser.fleet import LEADS, claim_task, steps
from tests.support.live_server import ROOT

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

Screenshot = Callable[[Page, str], Path]
ROWS = "#event-table tbody tr[data-seq]"
# The event whose payload is rewritten: the third reasoning step (1 TaskStarted, 2 TaskClaimed).
TAMPERED_SEQ = 5


@pytest.fixture
def agent(make_agent: Callable[..., ApiAgent]) -> ApiAgent:
    return make_agent("researcher")


def reasoning_task(agent: ApiAgent, kind: str, step_count: int = 4) -> str:
    """A claimed task with ``step_count`` reasoning steps (seq 3 on)."""
    task = agent.create_task(kind, {"lead": LEADS[1]})
    epoch = claim_task(agent, task, lease_seconds=600)
    steps(agent, task["task_id"], epoch, range(1, step_count + 1))
    return str(task["task_id"])


def rewrite_payload_behind_the_logs_back(task_id: str, seq: int) -> None:
    """The table refuses UPDATE; a superuser skipping triggers does not, as an attacker with
    database access would."""
    with connection.cursor() as cursor:
        cursor.execute("SET session_replication_role = replica")
        cursor.execute(
            "UPDATE backplane_event SET payload = jsonb_set(payload, '{thought}', '\"nothing to see\"') "
            "WHERE task_id = %s AND seq = %s",
            [task_id, seq],
        )
        cursor.execute("SET session_replication_role = origin")


def chain_marks(page: Page) -> dict[int, str]:
    return {int(seq): state for seq, state in page.locator(ROWS).evaluate_all(
        "rows => rows.map(r => [r.dataset.seq, r.querySelector('.chain-mark[data-chain]').dataset.chain])")}


def test_verify_now_shows_a_tampered_task_broken_at_the_right_seq(
    logged_in_page: Page, agent: ApiAgent, screenshot: Screenshot
) -> None:
    tampered = reasoning_task(agent, "research")
    intact = reasoning_task(agent, "enrichment", step_count=2)
    rewrite_payload_behind_the_logs_back(tampered, TAMPERED_SEQ)
    page = logged_in_page

    # On the task's page.
    page.goto(f"/tasks/{tampered}/")
    wait_live(page)
    page.locator("button#verify-chain").click()
    expect(page.locator(f"{ROWS}[data-seq='{TAMPERED_SEQ}'] .chain-mark")).to_have_attribute("data-chain", "broken")
    marks = chain_marks(page)
    assert [marks[seq] for seq in range(1, TAMPERED_SEQ + 1)] == ["verified"] * (TAMPERED_SEQ - 1) + ["broken"], marks
    assert {marks[seq] for seq in marks if seq > TAMPERED_SEQ} == {"unverified"}, marks
    screenshot(scrolled_to_top(page), "integrity-task-broken")

    # On the integrity page: one task.
    page.goto("/integrity/")
    page.locator("#verify-task").fill(tampered)
    page.locator("#verify-one button[type=submit]").click()
    result = page.locator("#verify-one-result")
    expect(result).to_contain_text(f"broken at seq {TAMPERED_SEQ}")
    expect(result.locator(".chain-mark")).to_have_attribute("data-chain", "broken")
    page.locator("#verify-task").fill(intact)
    page.locator("#verify-one button[type=submit]").click()
    expect(result).to_contain_text("intact through seq 4")
    expect(result.locator(".chain-mark")).to_have_attribute("data-chain", "verified")

    # Every task, in the worker: the page shows the run queued, then its progress until done.
    page.locator("#verify-all button[type=submit]").click()
    bar = page.locator("#run-progress .progress")
    expect(bar).to_have_count(1)
    expect(bar.locator(".progress-text")).to_contain_text("waiting for the worker")
    run_id = int(bar.get_attribute("data-run") or 0)
    run = VerificationRun.objects.get(pk=run_id)
    assert (run.mode, run.requested_by, run.finished_at, run.tasks_total) == ("full", STAFF_USERNAME, None, 2)
    verify_chains_requested(run_id)  # what the worker does with the message the web process queued
    expect(bar.locator(".progress-text")).to_contain_text("2 of 2 tasks", timeout=10_000)
    expect(bar.locator(".progress-text")).to_contain_text("1 broken")
    expect(bar).to_have_class("progress failed")
    assert bar.locator(".fill").evaluate("fill => fill.style.width") == "100%"
    screenshot(scrolled_to_top(page), "integrity-verify-all")

    # The run and the broken chain are on record, with the task and its first bad seq.
    page.reload()
    expect(page.locator(f"#run-table tr[data-run='{run_id}']")).to_contain_text("1 broken")
    alert = IntegrityAlert.objects.get(task_id=tampered, acknowledged_at__isnull=True)
    assert alert.first_invalid_seq == TAMPERED_SEQ
    row = page.locator(f"#alert-table tr[data-alert='{alert.pk}']")
    expect(row.locator(f"a[href^='/tasks/{tampered}/']").first).to_be_visible()
    expect(row.locator("td.num")).to_have_text(str(TAMPERED_SEQ))
    expect(page.locator("#alert-table tbody tr[data-alert]")).to_have_count(1)  # the intact task has none
    screenshot(scrolled_to_top(page), "integrity")


def test_an_inclusion_proof_downloads_and_checks_offline(
    logged_in_page: Page, agent: ApiAgent, tmp_path: Path, screenshot: Screenshot
) -> None:
    task_id = reasoning_task(agent, "research")
    # The sealer, as the worker runs it every 10 s: every event so far goes into the signed tree.
    while sealing.seal_new_events().sealed:
        pass
    events = Event.objects.count()
    seq = 4
    page = logged_in_page
    page.goto("/integrity/")
    expect(page.locator("[data-tile=tree-size] .tile-value")).to_have_text(str(events))
    form = page.locator("#proof-form")
    form.locator("input[name=task_id]").fill(task_id)
    form.locator("input[name=seq]").fill(str(seq))
    command = page.locator("#proof-command")
    expect(command).to_contain_text(f"proof-{task_id}-{seq}.json")
    expect(command).to_contain_text(f"--public-key {sealing.public_key_hex()}")
    screenshot(scrolled_to_top(page), "integrity-proof")

    with page.expect_download() as download_info:
        form.locator("button[type=submit]").click()
    download = download_info.value
    assert download.suggested_filename == f"proof-{task_id}-{seq}.json"
    download.save_as(tmp_path / download.suggested_filename)

    # The command line exactly as the page shows it, run where the file is, with no database.
    argv = shlex.split(command.inner_text().replace("\\\n", " "))
    assert argv[:4] == ["python", "-m", "backplane.integrity.audit", "check-proof"], argv
    checked = subprocess.run([sys.executable, *argv[1:]], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                             env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)})
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert checked.stdout.startswith(f"OK: event {task_id}#{seq}"), checked.stdout
