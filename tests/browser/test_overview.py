"""The overview: tiles that match the database, the activity chart, the live feed."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import pytest
from django.conf import settings
from django.utils import timezone
from playwright.sync_api import Page, expect

from backplane.delivery.models import OutboxMessage
from backplane.eventlog.models import Event
from backplane.runtime.duties import duties_watch_start, duty_stamp
from tests.browser.conftest import ApiAgent, assert_not_reloaded, mark_document, path_of, wait_live
from tests.browser.fleet import build_fleet, dead_letters_pending, status_counts

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

Screenshot = Callable[[Page, str], Path]

TILES = [
    "tasks-pending", "tasks-running", "tasks-completed", "tasks-failed", "tasks-dead_lettered",
    "tasks-compensating", "tasks-compensated", "tasks-cancelled", "events-per-minute", "outbox-pending",
    "outbox-oldest-age",
    "dead-letters-pending", "stalled", "recovering", "recoveries-hour", "replays-hour", "breakers-open",
    "chain-verification", "duties",
]
NAV = ["overview", "tasks", "dead-letters", "integrity", "agents"]


def tile_value(page: Page, name: str) -> str:
    return page.locator(f".tile[data-tile='{name}'] .tile-value").inner_text().strip()


def test_it_shows_the_nav_and_goes_live(logged_in_page: Page, screenshot: Screenshot) -> None:
    page = logged_in_page
    page.goto("/")
    for name in NAV:
        expect(page.locator(f"nav.topnav [data-nav='{name}']")).to_have_count(1)
    expect(page.locator("nav.topnav a[data-nav='overview']")).to_have_attribute("href", "/")
    expect(page.locator("nav.topnav a[data-nav='tasks']")).to_have_attribute("href", "/tasks/")
    assert page.locator("#live-status").get_attribute("data-state") in {"connecting", "connected", "reconnecting"}
    wait_live(page)
    screenshot(page, "overview-empty")

    page.locator("nav.topnav a[data-nav='tasks']").click()
    page.wait_for_url("**/tasks/")
    expect(page.locator("#task-table")).to_be_visible()
    screenshot(page, "tasks-empty")


def test_its_numbers_match_the_database(
    logged_in_page: Page, make_agent: Callable[..., ApiAgent], screenshot: Screenshot
) -> None:
    ids = build_fleet(make_agent("planner"))
    by_status, dead_letters = status_counts(), dead_letters_pending()
    # Beat and the worker as a running product has them: every duty watched and just run.
    duties_watch_start()
    for entry in settings.CELERY_BEAT_SCHEDULE.values():
        duty_stamp(task_name=str(entry["task"]), outcome="succeeded")
    assert dead_letters >= 1 and all(by_status[s] for s in ids), (by_status, dead_letters)

    page = logged_in_page
    page.goto("/")
    wait_live(page)
    for name in TILES:
        tile = page.locator(f".tile[data-tile='{name}']")
        expect(tile).to_have_count(1)
        expect(tile.locator(".tile-value")).to_have_count(1)
        assert tile.locator("a[href]").count() >= 1, f"tile {name} links nowhere"
    for status, count in by_status.items():
        assert tile_value(page, f"tasks-{status}") == str(count), status
    assert tile_value(page, "dead-letters-pending") == str(dead_letters)
    assert tile_value(page, "duties") == "all running"
    expect(page.locator("#duties-body tr[data-duty]")).to_have_count(len(settings.CELERY_BEAT_SCHEDULE))
    expect(page.locator("#duties-body tr.overdue")).to_have_count(0)

    chart = page.evaluate("""() => {
        const el = document.getElementById('activity-chart');
        return {plotted: Boolean(el && el._fullLayout), data: (el && el.data || []).map(t => t.y || [])};
    }""")
    assert chart["plotted"], "no Plotly chart in #activity-chart"
    assert sum(sum(v for v in y if isinstance(v, int | float)) for y in chart["data"]) > 0, chart

    feed = [int(p) for p in page.locator("#live-feed tr[data-position]").evaluate_all(
        "rows => rows.map(r => r.dataset.position)")]
    assert feed, "the live feed is empty"
    assert feed == sorted(feed, reverse=True) and len(set(feed)) == len(feed), feed
    newest = Event.objects.order_by("-position").values_list("position", flat=True).first()
    assert feed[0] == newest
    screenshot(page, "overview")

    # A tile's link is the filtered list behind its number.
    page.locator(".tile[data-tile='tasks-pending'] a").first.click()
    page.wait_for_load_state()
    assert path_of(page.url) == "/tasks/", page.url
    shown = page.locator("#task-table tbody tr[data-task-id]").evaluate_all("rows => rows.map(r => r.dataset.taskId)")
    assert sorted(shown) == sorted(ids["pending"])
    screenshot(page, "tasks-pending-from-tile")


def test_it_updates_tiles_and_feed_without_a_reload(
    logged_in_page: Page, make_agent: Callable[..., ApiAgent], screenshot: Screenshot
) -> None:
    agent = make_agent("planner")
    agent.create_task()
    page = logged_in_page
    page.goto("/")
    wait_live(page)
    mark_document(page)
    expect(page.locator(".tile[data-tile='tasks-pending'] .tile-value")).to_have_text("1")

    task = agent.create_task()
    expect(page.locator(".tile[data-tile='tasks-pending'] .tile-value")).to_have_text("2", timeout=2000)
    started = agent.events(task["task_id"])[0]
    appended = agent.append(task["task_id"], "LeadScored", {"score": 87})
    for event in (started, appended):
        row = page.locator(f"#live-feed tr[data-position='{event['position']}']")
        expect(row).to_have_count(1, timeout=2000)
    page.wait_for_timeout(300)  # a duplicate would come with the next notice
    positions = page.locator("#live-feed tr[data-position]").evaluate_all("rows => rows.map(r => r.dataset.position)")
    assert len(positions) == len(set(positions)), positions
    assert positions[0] == str(appended["position"])
    assert_not_reloaded(page)
    screenshot(page, "overview-live")


def test_every_tile_shows_its_value_whole(
    logged_in_page: Page, make_agent: Callable[..., ApiAgent], screenshot: Screenshot
) -> None:
    # The longest value a tile shows: an age in minutes and seconds ("31 min 02 s ago"), which
    # does not fit one line of a tile at the width of a laptop's window.
    build_fleet(make_agent("planner"))
    oldest = OutboxMessage.objects.filter(status="pending").order_by("id").first()
    assert oldest is not None
    OutboxMessage.objects.filter(pk=oldest.pk).update(created_at=timezone.now() - timedelta(minutes=31, seconds=2))
    page = logged_in_page
    page.goto("/")
    wait_live(page)
    expect(page.locator(".tile[data-tile='outbox-oldest-age'] .tile-value")).to_contain_text("31 min")
    clipped = page.locator(".tile .tile-value").evaluate_all(
        "values => values.filter(v => v.scrollWidth > v.clientWidth || v.getBoundingClientRect().right >"
        " v.closest('.tile').getBoundingClientRect().right).map(v => v.closest('.tile').dataset.tile)")
    assert clipped == [], clipped
    screenshot(page, "overview-long-age")
