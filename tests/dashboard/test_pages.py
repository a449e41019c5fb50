"""The dashboard's pages, through Django's test client on the real database."""

from __future__ import annotations

import functools
import re
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

from backplane.delivery.models import DeadLetter
from backplane.eventlog import services
from backplane.eventlog.models import Event, Task
from backplane.eventlog.writer import EventDraft
from backplane.integrity.models import IntegrityAlert, VerificationRun, VerifiedHead
from tests.dashboard.conftest import History, html


def tile_value(page: str, name: str) -> str:
    match = re.search(rf'data-tile="{name}".*?<div class="tile-value">(.*?)</div>', page, re.S)
    assert match, f"no tile {name}"
    return match.group(1).strip()


# --- who may look -------------------------------------------------------------------------------


def test_it_sends_anonymous_visitors_to_the_products_login(client: Client, make_history: Any) -> None:
    history: History = make_history()
    for path in ("/", "/tasks/", f"/tasks/{history.task.pk}/", f"/tasks/{history.task.pk}/live/", "/live/overview/"):
        response = client.get(path)
        assert response.status_code == 302
        assert response["Location"].startswith("/login/?next=")


def test_it_logs_a_staff_user_in_through_its_own_form(client: Client, olivia: User) -> None:
    page = client.get("/login/")
    assert 'id="login-form"' in html(page) and "/admin/" not in page.request["PATH_INFO"]
    response = client.post("/login/", {"username": "olivia", "password": "correct horse battery", "next": "/tasks/"})
    assert response.status_code == 302 and response["Location"] == "/tasks/"
    assert client.get("/tasks/").status_code == 200


def test_it_shows_a_wrong_password_as_a_form_error(client: Client, olivia: User) -> None:
    response = client.post("/login/", {"username": "olivia", "password": "nope"})
    assert response.status_code == 200
    assert 'class="form-error"' in html(response)


def test_it_refuses_a_user_who_is_not_staff(client: Client, victor: User) -> None:
    client.force_login(victor)
    assert client.get("/").status_code == 403
    assert client.get("/tasks/").status_code == 403


def test_it_logs_out_with_a_post(olivia_client: Client) -> None:
    response = olivia_client.post("/logout/")
    assert response.status_code == 302 and response["Location"] == "/login/"
    assert olivia_client.get("/").status_code == 302


def test_the_admin_stays_at_admin(olivia_client: Client) -> None:
    assert olivia_client.get("/admin/").status_code in (200, 302)


# --- overview -----------------------------------------------------------------------------------


def test_the_overview_numbers_match_the_database(olivia_client: Client, make_history: Any, make_task: Any) -> None:
    make_history()
    make_task()
    make_task(namespace="globex")
    DeadLetter.objects.create(source="task", reference="x", payload={}, error="gave up", attempts=3,
                              created_at=timezone.now())
    page = html(olivia_client.get("/"))
    for status in ("pending", "running", "completed", "failed", "dead_lettered"):
        assert tile_value(page, f"tasks-{status}") == str(Task.objects.filter(status=status).count()), status
    assert tile_value(page, "dead-letters-pending") == "1"
    assert int(tile_value(page, "events-per-minute")) == Event.objects.count()
    assert tile_value(page, "chain-verification") == "never"
    assert 'id="activity-chart"' in page and 'id="chart-data"' in page
    assert page.count("<tr data-position=") == min(30, Event.objects.count())


def test_the_overview_names_the_periodic_duties_that_stopped(olivia_client: Client) -> None:
    from backplane.runtime.duties import duties_watch_start
    from backplane.runtime.models import Duty

    duties_watch_start()
    assert tile_value(html(olivia_client.get("/")), "duties") == "all running"
    Duty.objects.filter(name__in=["detect-stalls", "relay-outbox"]).update(
        watch_started_at=timezone.now() - timedelta(minutes=5))
    page = html(olivia_client.get("/"))
    assert tile_value(page, "duties") == "2 overdue"
    assert re.search(r'data-tile="duties".*?<div class="tile-sub">detect-stalls, relay-outbox</div>', page, re.S)
    assert re.findall(r'<tr data-duty="([^"]+)" class="overdue">', page) == ["detect-stalls", "relay-outbox"]
    live = olivia_client.get("/live/overview/").json()
    assert live["duties"].count("<tr data-duty=") == len(Duty.objects.all()) and "overdue" in live["duties"]


def test_the_overview_counts_idempotent_replays(olivia_client: Client, make_history: Any) -> None:
    history: History = make_history()
    draft = EventDraft(type="NoteTaken", payload={"n": 1}, idempotency_key="note-1")
    for _ in range(3):
        services.event_append(namespace="acme", task_id=history.task.pk, draft=draft, agent="qualifier-1",
                              lease_epoch=history.epoch)
    page = html(olivia_client.get("/"))
    assert tile_value(page, "replays-hour") == "2"
    link = re.search(r'data-tile="replays-hour"><a href="([^"]+)"', page)
    assert link, "the replays tile links to its tasks"
    listed = html(olivia_client.get(link.group(1).replace("&amp;", "&")))
    assert f'data-task-id="{history.task.pk}"' in listed


def test_each_tile_links_to_a_list_that_opens(olivia_client: Client, make_history: Any) -> None:
    make_history()
    page = html(olivia_client.get("/"))
    links = [link.replace("&amp;", "&") for link in re.findall(r'data-tile="[^"]+"><a href="([^"]+)"', page)]
    assert len(links) == 20  # 19 tiles, and the model-spend panel's calls with no price (the price table)
    admin = Client()
    admin.force_login(User.objects.create_superuser("root", password="x" * 20))
    for link in links:
        if link.startswith("#"):
            assert f'id="{link[1:]}"' in page, link
            continue
        # Outbox, dead letters, breakers and alerts open the admin's lists until part 2's pages.
        response = (admin if link.startswith("/admin/") else olivia_client).get(link)
        assert response.status_code == 200, link


def test_the_overview_live_read_returns_only_newer_feed_rows(olivia_client: Client, make_history: Any) -> None:
    history: History = make_history()
    last = Event.objects.order_by("-position").first()
    assert last is not None
    services.event_append(namespace="acme", task_id=history.task.pk, agent="qualifier-1", lease_epoch=history.epoch,
                          draft=EventDraft(type="NoteTaken", payload={"n": 2}))
    data = olivia_client.get(f"/live/overview/?after_position={last.position}").json()
    assert data["feed"].count("<tr data-position=") == 1 and "NoteTaken" in data["feed"]
    assert data["last_position"] == last.position + 1
    assert 'data-tile="tasks-running"' in data["tiles"]
    assert len(data["chart"]["minutes"]) == 60


# --- task list ----------------------------------------------------------------------------------


def test_it_finds_a_task_by_a_value_only_inside_one_events_payload(olivia_client: Client, make_history: Any) -> None:
    wanted: History = make_history(needle="cus_NEEDLE_4711")
    other: History = make_history(namespace="globex", needle="cus_other_1")
    page = html(olivia_client.get("/tasks/", {"q": "cus_NEEDLE_4711"}))
    assert f'data-task-id="{wanted.task.pk}"' in page
    assert f'data-task-id="{other.task.pk}"' not in page
    # A tool name, a word of free text, and a task id.
    assert f'data-task-id="{wanted.task.pk}"' in html(olivia_client.get("/tasks/", {"q": "crm_lookup"}))
    assert f'data-task-id="{wanted.task.pk}"' in html(olivia_client.get("/tasks/", {"q": "look up"}))
    by_id = html(olivia_client.get("/tasks/", {"q": str(other.child.pk)}))
    assert f'data-task-id="{other.child.pk}"' in by_id and f'data-task-id="{wanted.task.pk}"' not in by_id


def test_a_phrase_is_written_into_the_search_as_a_literal_quotes_percents_and_all(make_task: Any) -> None:
    """The phrase is planned for its own value (``payload_match_sql``): no bound parameter carries
    it, and a quote, a percent sign or a backslash in it finds what it says and nothing else."""
    from django.db import connection

    from backplane.eventlog.errors import InvalidInput
    from backplane.eventlog.selectors import TaskFilters, tasks_filtered

    wanted = make_task(input={"note": "o'brien paid 50% \\ twice"})
    other = make_task(input={"note": "o'brien paid 40% \\ once"})
    bound: list[Any] = []

    def spy(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        bound.extend(params or ())
        return execute(sql, params, many, context)

    searches: list[tuple[str, set[Any]]] = [
        ("o'brien paid 50%", {wanted.pk}), ("paid 40%", {other.pk}), ("o'brien", {wanted.pk, other.pk}),
        ("50% \\ twice", {wanted.pk}), ("'; DROP TABLE backplane_task; --", set()),
    ]
    for phrase, found in searches:
        # Six times: a prepared statement's generic plan would be the sixth run's.
        bound.clear()
        with connection.execute_wrapper(spy):
            for _ in range(6):
                assert {task.pk for task in tasks_filtered(TaskFilters(q=phrase))} == found, phrase
        assert phrase not in bound, phrase
    with pytest.raises(InvalidInput):
        tasks_filtered(TaskFilters(q="a\x00b"))


def test_the_listed_fields_need_no_converter_of_djangos() -> None:
    """The task list makes its models from raw rows (``_load_listed``), which is right only while
    Django converts none of the listed columns on the way out (a JSON column would stay text)."""
    from django.db import connection

    from backplane.eventlog.models import Task
    from dashboard.selectors.tasks import _LISTED

    for attname in _LISTED:
        field = next(f for f in Task._meta.concrete_fields if f.attname == attname)
        column = field.get_col(Task._meta.db_table)
        assert not field.get_db_converters(connection) and not connection.ops.get_db_converters(column), attname


def test_it_filters_by_status_kind_namespace_and_agent(olivia_client: Client, make_history: Any,
                                                       make_task: Any) -> None:
    history: History = make_history(agent_name="closer-7")
    plain = make_task(kind="invoice-followup", namespace="globex")

    def listed(**query: str) -> set[str]:
        return set(re.findall(r'data-task-id="([0-9a-f-]+)"', html(olivia_client.get("/tasks/", query))))

    assert listed(status="running") == {str(history.task.pk)}
    assert listed(kind="invoice-followup") == {str(plain.pk)}
    assert listed(namespace="globex") == {str(plain.pk)}
    # The tasks it claimed or created (the sub-task it dispatched).
    assert listed(agent="closer-7") == {str(history.task.pk), str(history.child.pk)}
    assert str(history.child.pk) in listed(status="pending")


def test_it_filters_by_time_in_the_viewers_timezone(olivia_client: Client, make_task: Any) -> None:
    task = make_task()
    # A viewer at UTC+2 types wall-clock times; the page sends getTimezoneOffset() = -120.
    typed_before = (task.created_at + timedelta(hours=2, minutes=-1)).replace(tzinfo=None).isoformat(timespec="seconds")
    typed_after = (task.created_at + timedelta(hours=2, minutes=1)).replace(tzinfo=None).isoformat(timespec="seconds")

    def listed(**query: str) -> bool:
        return f'data-task-id="{task.pk}"' in html(olivia_client.get("/tasks/", {**query, "tz": "-120"}))

    assert listed(created_after=typed_before) and not listed(created_after=typed_after)
    assert listed(created_before=typed_after) and not listed(created_before=typed_before)
    # Links carry RFC 3339 times, which need no offset.
    assert listed(created_after=(task.created_at - timedelta(seconds=1)).isoformat())


def test_it_pages_by_keyset_without_repeating_or_skipping(olivia_client: Client, make_task: Any,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    made = {str(make_task(input={"n": n}).pk) for n in range(7)}
    seen: list[str] = []
    url = "/tasks/"
    from dashboard.selectors.tasks import task_page
    from dashboard.views import pages

    monkeypatch.setattr(pages, "task_page", functools.partial(task_page, limit=3))
    for _ in range(5):
        page = html(olivia_client.get(url))
        seen += re.findall(r'data-task-id="([0-9a-f-]+)"', page)
        more = re.search(r'id="next-page" href="([^"]+)"', page)
        if not more:
            break
        url = "/tasks/" + more.group(1).replace("&amp;", "&")
    assert len(seen) == 7 and set(seen) == made


def test_a_bad_cursor_or_filter_is_a_visible_error_not_a_500(olivia_client: Client, make_task: Any) -> None:
    make_task()
    response = olivia_client.get("/tasks/", {"cursor": "not-a-cursor"})
    assert response.status_code == 200 and "not valid any more" in html(response)
    response = olivia_client.get("/tasks/", {"status": "exploded", "created_after": "yesterday-ish"})
    assert response.status_code == 400
    assert "Some filters are not valid" in html(response)


def test_the_rows_read_renders_the_first_page_as_json(olivia_client: Client, make_task: Any) -> None:
    task = make_task()
    data = olivia_client.get("/tasks/", {"partial": "rows"}).json()
    assert f'data-task-id="{task.pk}"' in data["rows"] and data["next_cursor"] is None


# --- task detail ----------------------------------------------------------------------------------


def test_the_task_page_shows_header_tree_events_and_marks(olivia_client: Client, make_history: Any) -> None:
    history: History = make_history()
    page = html(olivia_client.get(f"/tasks/{history.task.pk}/"))
    assert 'data-field="status">running<' in page
    assert f'data-task-id="{history.child.pk}"' in page  # the child in the tree
    assert page.count('<tr id="seq-') == history.task.last_seq
    assert page.count('data-chain="unverified" title=') == history.task.last_seq  # nothing verified yet
    child_page = html(olivia_client.get(f"/tasks/{history.child.pk}/"))
    assert 'data-relation="parent"' in child_page and str(history.task.pk) in child_page


def test_the_timeline_has_one_bar_per_tool_call_and_an_open_in_flight_one(olivia_client: Client,
                                                                         make_history: Any) -> None:
    history: History = make_history()
    response = olivia_client.get(f"/tasks/{history.task.pk}/live/")
    timeline = response.json()["timeline"]
    calls = [span for span in timeline["spans"] if span["kind"] == "tool_call"]
    assert len(calls) == 2 == timeline["tool_calls"] and timeline["in_flight"] == 1
    [done] = [span for span in calls if span["end"] is not None]
    [flying] = [span for span in calls if span["end"] is None]
    assert done["key"] == history.done_key and flying["key"] == history.in_flight_key
    assert flying["status"] == "in_flight" and flying["label"].endswith(" · in flight")
    assert timeline["lanes"][0] == "qualifier-1"
    assert any(span["kind"] == "subtask" for span in timeline["spans"])


def test_the_live_read_returns_only_events_after_the_seq_it_was_given(olivia_client: Client,
                                                                     make_history: Any) -> None:
    history: History = make_history()
    before = history.task.last_seq
    services.event_append(namespace="acme", task_id=history.task.pk, agent="qualifier-1", lease_epoch=history.epoch,
                          draft=EventDraft(type="NoteTaken", payload={"n": 3}))
    data = olivia_client.get(f"/tasks/{history.task.pk}/live/", {"after_seq": before}).json()
    assert data["rows"].count("<tr id=") == 1 and f'data-seq="{before + 1}"' in data["rows"]
    assert data["last_seq"] == before + 1 == data["task_last_seq"]


def test_verify_chain_now_records_a_run_and_marks_every_event(olivia_client: Client, make_history: Any) -> None:
    history: History = make_history()
    response = olivia_client.post(f"/tasks/{history.task.pk}/verify/")
    assert response.status_code == 200
    body = response.json()
    assert body["valid"] is True and body["verified_seq"] == history.task.last_seq and body["broken_seq"] is None
    assert VerifiedHead.objects.get(task=history.task).verified_seq == history.task.last_seq
    assert VerificationRun.objects.filter(mode="on_demand", finished_at__isnull=False).count() == 1
    page = html(olivia_client.get(f"/tasks/{history.task.pk}/"))
    assert page.count('data-chain="verified" title=') == history.task.last_seq
    # The periodic runs' tile ignores on-demand runs.
    assert "never" in html(olivia_client.get("/"))


def test_a_broken_chain_is_marked_at_the_first_bad_seq(olivia_client: Client, make_history: Any) -> None:
    history: History = make_history()
    run = VerificationRun.objects.create(mode="full", started_at=history.task.created_at)
    IntegrityAlert.objects.create(run=run, task=history.task, kind="chain", first_invalid_seq=3, problem="rewritten",
                                  created_at=history.task.created_at)
    page = html(olivia_client.get(f"/tasks/{history.task.pk}/"))
    assert re.search(r'<tr id="seq-3".*?data-chain="broken"', page, re.S)
    assert re.search(r'<tr id="seq-2".*?data-chain="verified"', page, re.S)  # checked by the run that broke
    assert re.search(r'<tr id="seq-4".*?data-chain="unverified"', page, re.S)
    assert "broken at seq 3" in page


def test_verify_is_post_only_and_an_unknown_task_is_404(olivia_client: Client, make_history: Any) -> None:
    history: History = make_history()
    assert olivia_client.get(f"/tasks/{history.task.pk}/verify/").status_code == 405
    assert olivia_client.get("/tasks/00000000-0000-0000-0000-000000000000/").status_code == 404


def test_the_recovery_context_fragment_is_what_the_next_agent_gets(olivia_client: Client, alice: Any,
                                                                   make_history: Any) -> None:
    history: History = make_history()
    fragment = html(olivia_client.get(f"/tasks/{history.task.pk}/recovery-context/"))
    assert "resume_prompt" in fragment and history.in_flight_key in fragment
    assert "You are resuming task" in fragment


def test_static_assets_are_served_by_the_app(olivia_client: Client) -> None:
    for path in ("/static/vendor/plotly/plotly.min.js", "/static/js/live.js", "/static/css/dashboard.css"):
        response = olivia_client.get(path)
        assert response.status_code == 200, path
