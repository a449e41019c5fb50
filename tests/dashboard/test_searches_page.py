"""The saved-searches page, saving from the task list, the shareable URL, and the overview's tiles
and alerts panel (dashboard/views/searches.py)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import parse_qs, urlsplit

from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

from backplane.delivery.models import OutboxMessage
from backplane.eventlog.models import Task
from recovery import alerts
from recovery.models import AlertRule, AlertTransition, SavedSearch


def saved(name: str = "Stuck refunds", filter: dict[str, Any] | None = None, **kwargs: Any) -> SavedSearch:
    return alerts.saved_search_save(name=name, filter=filter if filter is not None else {"q": "refund"},
                                    created_by="user:ops", **kwargs)


def state() -> tuple[int, int, int, int]:
    return (SavedSearch.objects.count(), AlertRule.objects.count(), AlertTransition.objects.count(),
            OutboxMessage.objects.filter(topic=alerts.TOPIC).count())


# --- who may -------------------------------------------------------------------------------------


def test_the_pages_are_for_staff_only(client: Client, victor: User) -> None:
    search = saved()
    for url in ("/searches/", f"/searches/{search.slug}/", f"/searches/{search.pk}/delete/"):
        assert client.get(url).status_code == 302  # to the login page
    client.force_login(victor)
    before = state()
    for url in ("/searches/", f"/searches/{search.slug}/", f"/searches/{search.pk}/delete/"):
        assert client.get(url).status_code == 403
    for url, body in (("/searches/", {"name": "x", "query": "status=failed"}),
                      (f"/searches/{search.pk}/pin/", {"pinned": "1"}),
                      (f"/searches/{search.pk}/delete/", {"confirm": "yes"}),
                      (f"/searches/{search.pk}/rules/", {"threshold": "1", "window_seconds": "60"})):
        assert client.post(url, body).status_code == 403
    assert state() == before and not SavedSearch.objects.get().pinned


def test_posts_need_the_csrf_token(olivia: User) -> None:
    client = Client(enforce_csrf_checks=True)
    client.force_login(olivia)
    search = saved()
    before = state()
    assert client.post("/searches/", {"name": "x", "query": "status=failed"}).status_code == 403
    assert client.post(f"/searches/{search.pk}/rules/", {"threshold": "1", "window_seconds": "60"}).status_code == 403
    assert client.post(f"/searches/{search.pk}/delete/", {"confirm": "yes"}).status_code == 403
    assert state() == before
    # With the page's token it goes through.
    page = client.get("/searches/").content.decode()
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page)
    assert token is not None
    done = client.post(f"/searches/{search.pk}/rules/", {"threshold": "1", "window_seconds": "60",
                                                          "csrfmiddlewaretoken": token.group(1)})
    assert done.status_code == 302 and AlertRule.objects.count() == 1


# --- saving and opening --------------------------------------------------------------------------


def test_the_task_list_saves_its_filter_and_the_saved_url_opens_it(
    olivia_client: Client, make_task: Callable[..., Task],
) -> None:
    make_task(input={"note": "refund please"}), make_task(input={"note": "all good"})
    listed = olivia_client.get("/tasks/?q=refund&status=pending")
    html = listed.content.decode()
    assert 'id="save-search"' in html and 'name="query" value="q=refund&amp;status=pending"' in html
    done = olivia_client.post("/searches/", {"name": "Refunds waiting", "query": "q=refund&status=pending",
                                             "pinned": "on"})
    assert done.status_code == 302 and done["Location"] == "/searches/refunds-waiting/"
    search = SavedSearch.objects.get()
    assert (search.filter, search.pinned, search.created_by) == (
        {"q": "refund", "status": "pending"}, True, "user:olivia")
    opened = olivia_client.get("/searches/refunds-waiting/")
    assert opened.status_code == 302
    target = urlsplit(opened["Location"])
    assert target.path == "/tasks/"
    assert parse_qs(target.query) == {"q": ["refund"], "status": ["pending"], "search": ["refunds-waiting"]}
    page = olivia_client.get(opened["Location"]).content.decode()
    assert 'id="saved-search-banner"' in page and "Refunds waiting" in page
    assert page.count('data-task-id="') == 1


def test_times_in_a_saved_filter_survive_the_round_trip(olivia_client: Client) -> None:
    # A local time typed in the viewer's timezone (tz: minutes behind UTC) is kept in UTC.
    olivia_client.post("/searches/", {"name": "Since", "query": "updated_after=2026-11-30T14:05&tz=-60"})
    search = SavedSearch.objects.get()
    assert search.filter == {"updated_after": "2026-11-30T13:05:00+00:00"}
    location = olivia_client.get("/searches/since/")["Location"]
    assert parse_qs(urlsplit(location).query)["updated_after"] == ["2026-11-30T13:05:00+00:00"]
    opened = olivia_client.get(location)
    assert opened.status_code == 200 and opened.context["form"].filters().updated_after == datetime(
        2026, 11, 30, 13, 5, tzinfo=UTC)


def test_bad_saves_are_refused_and_change_nothing(olivia_client: Client) -> None:
    saved(name="Taken")
    before = state()
    for body in ({"name": "Taken", "query": "status=failed"},  # the slug "taken" exists
                 {"name": "", "query": "status=failed"},
                 {"name": "Bad status", "query": "status=sleeping"},
                 {"name": "Bad time", "query": "created_after=yesterday"}):
        refused = olivia_client.post("/searches/", body, follow=True)
        assert "Not saved" in refused.content.decode(), body
    # A script asking for JSON gets the API's error shape.
    answer = olivia_client.post("/searches/", {"name": "Taken", "query": ""}, HTTP_ACCEPT="application/json")
    assert answer.status_code == 400
    error = json.loads(answer.content)["error"]
    assert error["code"] == "validation_error" and "slug" in error["details"]
    assert state() == before


def test_an_unknown_saved_search_is_404(olivia_client: Client) -> None:
    assert olivia_client.get("/searches/nothing-here/").status_code == 404


# --- the page: counts, pins, rules, deletion -----------------------------------------------------


def test_the_page_lists_searches_with_live_counts_and_their_rules(
    olivia_client: Client, make_task: Callable[..., Task], django_assert_max_num_queries: Any,
) -> None:
    make_task(input={"note": "refund"}), make_task(input={"note": "refund"}), make_task(kind="other")
    for n in range(5):
        search = saved(name=f"Search {n}", filter={"q": "refund"} if n % 2 else {"kind": "other"})
        alerts.alert_rule_set(search_id=search.pk, window_seconds=300, threshold=2, created_by="user:ops")
    # Two of them are the permission check's, one the staff scope's (a scoped user is refused).
    with django_assert_max_num_queries(9):
        page = olivia_client.get("/searches/")
    html = page.content.decode()
    counts = re.findall(r'data-search="(search-\d)".*?data-field="count">(\d+)<', html, re.S)
    assert counts == [("search-0", "1"), ("search-1", "2"), ("search-2", "1"), ("search-3", "2"), ("search-4", "1")]
    assert html.count('class="rule"') == 5
    make_task(kind="other")
    # Two of them are the permission check's (the user's and their groups' permissions), one the
    # staff scope's.
    with django_assert_max_num_queries(7):
        counts = olivia_client.get("/searches/?partial=counts").json()["counts"]
    assert counts == {"search-0": 2, "search-1": 2, "search-2": 2, "search-3": 2, "search-4": 2}


def test_pin_and_unpin(olivia_client: Client) -> None:
    search = saved()
    olivia_client.post(f"/searches/{search.pk}/pin/", {"pinned": "1"})
    assert SavedSearch.objects.get().pinned
    olivia_client.post(f"/searches/{search.pk}/pin/", {"pinned": "0"})
    assert not SavedSearch.objects.get().pinned
    assert olivia_client.post("/searches/999/pin/", {"pinned": "1"}).status_code == 302


def test_rules_are_added_and_bad_numbers_refused(olivia_client: Client) -> None:
    search = saved()
    done = olivia_client.post(f"/searches/{search.pk}/rules/", {"threshold": "5", "window_seconds": "600"},
                              follow=True)
    assert "Alert rule added" in done.content.decode()
    rule = AlertRule.objects.get()
    assert (rule.threshold, rule.window_seconds, rule.created_by) == (5, 600, "user:olivia")
    before = state()
    for body in ({"threshold": "0", "window_seconds": "60"}, {"threshold": "3", "window_seconds": "-5"},
                 {"threshold": "three", "window_seconds": "60"}, {"threshold": "3"}):
        refused = olivia_client.post(f"/searches/{search.pk}/rules/", body, follow=True)
        assert "No rule added" in refused.content.decode(), body
    answer = olivia_client.post("/searches/999/rules/", {"threshold": "1", "window_seconds": "60"},
                                HTTP_ACCEPT="application/json")
    assert answer.status_code == 404 and json.loads(answer.content)["error"]["code"] == "not_found"
    assert state() == before


def test_deleting_asks_first_then_resolves_a_firing_rule(
    olivia_client: Client, make_task: Callable[..., Task],
) -> None:
    search = saved(filter={"namespace": "acme"})
    rule = alerts.alert_rule_set(search_id=search.pk, window_seconds=300, threshold=1, created_by="user:ops")
    make_task()
    assert alerts.alerts_evaluate() == 1
    asked = olivia_client.get(f"/searches/{search.pk}/delete/")
    assert asked.status_code == 200
    assert "1 rule firing now" in asked.content.decode()
    # A POST without the confirmation only asks again.
    assert olivia_client.post(f"/searches/{search.pk}/delete/").status_code == 200
    assert SavedSearch.objects.exists()
    rule_page = olivia_client.get(f"/searches/rules/{rule.pk}/delete/")
    assert rule_page.status_code == 200 and 'id="confirm-delete"' in rule_page.content.decode()
    done = olivia_client.post(f"/searches/{search.pk}/delete/", {"confirm": "yes"})
    assert done.status_code == 302
    assert not SavedSearch.objects.exists() and not AlertRule.objects.exists()
    assert [t.state for t in AlertTransition.objects.order_by("at", "pk")] == ["fired", "resolved"]


def test_deleting_a_rule(olivia_client: Client) -> None:
    search = saved()
    rule = alerts.alert_rule_set(search_id=search.pk, window_seconds=60, threshold=1, created_by="user:ops")
    olivia_client.post(f"/searches/rules/{rule.pk}/delete/", {"confirm": "yes"})
    assert not AlertRule.objects.exists() and SavedSearch.objects.exists()


# --- the overview --------------------------------------------------------------------------------


def test_the_overview_shows_pinned_tiles_and_firing_alerts_and_its_live_refresh_too(
    olivia_client: Client, make_task: Callable[..., Task],
) -> None:
    pinned = saved(name="Acme work", filter={"namespace": "acme"}, pinned=True)
    saved(name="Not pinned", filter={})
    rule = alerts.alert_rule_set(search_id=pinned.pk, window_seconds=300, threshold=2, created_by="user:ops")
    make_task(), make_task()
    alerts.alerts_evaluate()
    html = olivia_client.get("/").content.decode()
    tile = re.search(r'data-tile="search-acme-work">.*?<div class="tile-value">(\d+)</div>', html, re.S)
    assert tile is not None and tile.group(1) == "2"
    assert 'data-tile="search-not-pinned"' not in html
    assert re.search(rf'<tr data-rule="{rule.pk}">.*?2 / 2', html, re.S)

    make_task()
    alerts.alert_rule_set(search_id=pinned.pk, rule_id=rule.pk, window_seconds=300, threshold=2, enabled=False,
                          created_by="user:ops")
    live = olivia_client.get("/live/overview/").json()
    assert re.search(r'<div class="tile-value">3</div>', live["saved_tiles"])
    assert "Nothing firing" in live["alerts"] and "rule disabled by user:ops" in live["alerts"]


def test_the_overview_reads_its_alerts_in_a_bounded_number_of_queries(
    olivia_client: Client, make_task: Callable[..., Task], django_assert_max_num_queries: Any,
) -> None:
    make_task()
    for n in range(6):
        search = saved(name=f"Pinned {n}", filter={"namespace": "acme"}, pinned=True)
        alerts.alert_rule_set(search_id=search.pk, window_seconds=300, threshold=1, created_by="user:ops")
    alerts.alerts_evaluate(now=timezone.now())
    alerts.alerts_evaluate(now=timezone.now() + timedelta(hours=1))
    olivia_client.get("/live/overview/")  # warm: sessions, duties rows
    with django_assert_max_num_queries(40) as counted:
        olivia_client.get("/live/overview/")
    alert_queries = [q for q in counted.captured_queries
                     if "recovery_alert" in q["sql"] or "recovery_saved" in q["sql"]]
    assert len(alert_queries) <= 4
