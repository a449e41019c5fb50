"""The agents page and the outbox page in the browser, with data: an agent whose breaker the
stall detector opened, closed by a reviewer with a reason that its history shows; a message
the broker keeps refusing, and the delivery lag of those it took; in the CDC mode, the slot."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Page, expect

from backplane.delivery import cdc
from backplane.delivery.models import OutboxMessage
from backplane.eventlog.models import Agent, BreakerTransition
from tests.browser.conftest import REVIEWER_USERNAME, ApiAgent, scrolled_to_top
from tests.browser.fleet import REFUSED_TOPIC, claim_task, relay_pass, scored_lead, stalled_leases
from tests.support.live_server import WebProcess

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

Screenshot = Callable[[Page, str], Path]


def test_a_reviewer_closes_an_open_agent_breaker_with_a_reason_and_its_history_shows_it(
    reviewer_page: Page, make_agent: Callable[..., ApiAgent], screenshot: Screenshot
) -> None:
    flaky = make_agent("flaky-enricher")
    stalled_leases(flaky, 3, kind="enrichment", max_attempts=3)  # three leases lost: the breaker opens
    assert Agent.objects.get(name=flaky.name).breaker_state == "open"
    steady = make_agent("steady-researcher")
    claim_task(steady, steady.create_task("research", {"company": "Example Ltd"}), lease_seconds=600)

    page = reviewer_page
    page.goto("/agents/")
    row = page.locator(f"#agent-table tr[data-agent='acme/{flaky.name}']")
    expect(row.locator("[data-field=breaker]")).to_have_text("open")
    expect(row.locator("td").nth(4)).to_have_text("3")  # attempts lost in 24 h
    expect(row.locator("td.history div").first).to_contain_text("closed → open")
    other = page.locator(f"#agent-table tr[data-agent='acme/{steady.name}']")
    expect(other.locator("[data-field=breaker]")).to_have_text("closed")
    expect(other.locator("td").nth(3)).to_have_text("1")  # the lease it holds
    expect(other.locator("form.reset-form")).to_have_count(0)  # nothing to close
    screenshot(scrolled_to_top(page), "agents")

    reason = "its host ran out of memory; restarted with more"
    row.locator("form.reset-form input[name=reason]").fill(reason)
    with page.expect_navigation():
        row.locator("form.reset-form button[type=submit]").click()
    expect(page.locator("#messages")).to_contain_text("is closed")
    expect(row.locator("[data-field=breaker]")).to_have_text("closed")
    latest = row.locator("td.history div").first
    expect(latest).to_contain_text("open → closed")
    expect(latest).to_have_attribute("title", re.compile(re.escape(f"{reason} (by user:{REVIEWER_USERNAME})") + "$"))
    expect(row.locator("form.reset-form")).to_have_count(0)
    screenshot(scrolled_to_top(page), "agents-breaker-closed")

    transition = BreakerTransition.objects.filter(agent__name=flaky.name).latest("at", "pk")
    assert (transition.from_state, transition.to_state, transition.decided_by) == (
        "open", "closed", f"user:{REVIEWER_USERNAME}")
    assert transition.reason.endswith(reason), transition.reason
    assert Agent.objects.get(name=flaky.name).breaker_state == "closed"


def plotted(page: Page, element_id: str) -> list[dict[str, Any]]:
    return page.evaluate(f"() => JSON.parse(JSON.stringify(document.getElementById('{element_id}').data || []))")


def test_the_outbox_page_shows_a_failing_message_and_the_delivery_lag(
    logged_in_page: Page, make_agent: Callable[..., ApiAgent], screenshot: Screenshot
) -> None:
    agent = make_agent("scorer")
    task_id = scored_lead(agent)
    relay_pass()  # the broker refuses the score and takes the lifecycle messages
    failing = OutboxMessage.objects.get(task_id=task_id, topic=REFUSED_TOPIC)
    assert (failing.status, failing.attempts) == ("pending", 1)
    delivered = OutboxMessage.objects.filter(status="delivered").count()
    assert delivered > 0

    page = logged_in_page
    page.goto("/outbox/")
    expect(page.locator("[data-tile=retrying] .tile-value")).to_have_text("1")
    expect(page.locator("[data-tile=waiting] .tile-value")).to_have_text("0")
    expect(page.locator("[data-tile=delivered] .tile-value")).to_have_text(str(delivered))
    expect(page.locator("[data-tile=dead] .tile-value")).to_have_text("0")
    backlog = page.locator(f"#backlog-table tr[data-destination='{failing.destination}']")
    expect(backlog.locator("td").nth(1)).to_have_text("0")
    expect(backlog.locator("td").nth(2)).to_have_text("1")
    rows = page.locator("#failing-table tbody tr")
    expect(rows).to_have_count(1)
    expect(rows.first).to_contain_text(REFUSED_TOPIC)
    expect(rows.first).to_contain_text("Connection refused")
    expect(rows.first.locator(f"a[href='/tasks/{task_id}/']")).to_have_count(1)
    lag = plotted(page, "lag-chart")
    [bars] = [trace for trace in lag if trace.get("name") == "delivered"]
    assert sum(bars["y"]) == delivered, bars["y"]
    screenshot(scrolled_to_top(page), "outbox")


def test_in_the_cdc_mode_the_outbox_page_names_the_slot_and_says_when_it_falls_behind(
    logged_in_page: Page, make_agent: Callable[..., ApiAgent], web_processes: Callable[..., WebProcess],
    screenshot: Screenshot,
) -> None:
    cdc.cdc_setup()
    try:
        # A web process in the CDC mode whose limit any WAL written from now on passes; nobody
        # reads the slot in this test (no Kafka Connect).
        server = web_processes(name="web-cdc", env={
            "BACKPLANE_OUTBOX_BROKER_URL": "kafka://127.0.0.1:9", "BACKPLANE_OUTBOX_RELAY_MODE": "cdc",
            "BACKPLANE_CDC_MAX_LAG_BYTES": "4096"})
        scored_lead(make_agent("scorer"))
        page = logged_in_page
        page.goto(f"{server.url}/outbox/")
        notice = page.locator("#cdc-relay")
        expect(notice).to_have_class(re.compile(r"\berror\b"))
        expect(notice).to_contain_text("Replication slot backplane_outbox: not being read,")
        expect(notice).to_contain_text("of WAL behind")
        expect(notice).to_contain_text("bytes behind (limit 4096); is Kafka Connect running?")
        screenshot(scrolled_to_top(page), "outbox-cdc")
        # The polling mode's page (the suite's web process) says nothing of a slot.
        page.goto("/outbox/")
        expect(page.locator("#cdc-relay")).to_have_count(0)
    finally:
        cdc.cdc_teardown()
