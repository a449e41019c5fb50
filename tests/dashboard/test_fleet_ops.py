"""Cancel on the task page, the pauses page, and the pauses on the overview: staff only, through the
same services as the API, and a form without a reason changes nothing."""

from __future__ import annotations

from django.contrib.auth.models import User
from django.test import Client

from backplane.eventlog import services
from backplane.eventlog.models import Event, Task
from recovery import fleet
from recovery.models import Pause
from tests.dashboard.conftest import html


def pending_task(kind: str = "enrich") -> Task:
    return services.task_create(namespace="acme", kind=kind, agent="planner", input={}).task


def test_the_task_page_offers_cancel_and_cancelling_writes_task_cancelled(olivia_client: Client) -> None:
    task = pending_task()
    page = html(olivia_client.get(f"/tasks/{task.pk}/"))
    assert 'id="cancel-task"' in page and 'id="cancel-dialog"' in page and 'name="compensate"' in page
    done = olivia_client.post(f"/tasks/{task.pk}/cancel/", {"reason": "duplicate lead", "compensate": "on"},
                              follow=True)
    assert "Cancelled" in html(done)
    event = Event.objects.get(task_id=task.pk, type="TaskCancelled")
    assert event.payload == {"cancelled_by": "user:olivia", "reason": "duplicate lead", "compensate": True}
    # A closed task offers no cancel.
    assert 'id="cancel-task"' not in html(olivia_client.get(f"/tasks/{task.pk}/"))


def test_a_cancel_without_a_reason_or_of_a_closed_task_changes_nothing(olivia_client: Client) -> None:
    task = pending_task()
    refused = olivia_client.post(f"/tasks/{task.pk}/cancel/", {"reason": "  "}, follow=True)
    assert "Not cancelled: a reason is required" in html(refused)
    assert Task.objects.get(pk=task.pk).status == "pending" and task.last_seq == Task.objects.get(pk=task.pk).last_seq
    fleet.task_cancel(namespace=None, task_id=task.pk, cancelled_by="user:ops", reason="first", compensate=False)
    again = olivia_client.post(f"/tasks/{task.pk}/cancel/", {"reason": "second"}, follow=True)
    assert "Not cancelled: task was cancelled by user:ops: first" in html(again)
    assert Event.objects.filter(task_id=task.pk, type="TaskCancelled").count() == 1


def test_the_task_page_says_which_pause_holds_a_pending_task_back(olivia_client: Client) -> None:
    task = pending_task()
    assert 'id="pause-notice"' not in html(olivia_client.get(f"/tasks/{task.pk}/"))
    fleet.pause_set(namespace="acme", kind="enrich", paused_by="user:ops", reason="CRM tool down")
    page = html(olivia_client.get(f"/tasks/{task.pk}/"))
    assert 'id="pause-notice"' in page and "CRM tool down" in page and "user:ops" in page


def test_the_pauses_page_pauses_and_resumes(olivia_client: Client) -> None:
    assert "Nothing is paused" in html(olivia_client.get("/pauses/"))
    done = olivia_client.post("/pauses/set/", {"namespace": "acme", "kind": "enrich", "reason": "tool down"},
                              follow=True)
    assert "Paused kind enrich of acme" in html(done)
    pause = Pause.objects.get()
    assert pause.paused_by == "user:olivia" and pause.resumed_at is None
    resumed = olivia_client.post(f"/pauses/{pause.pk}/resume/", {"reason": "fixed"}, follow=True)
    assert "Resumed: acme/enrich" in html(resumed)
    pause.refresh_from_db()
    assert pause.resumed_by == "user:olivia" and pause.resume_reason == "fixed"
    assert 'id="pauses-lifted"' in html(resumed) and "fixed" in html(resumed)


def test_pause_forms_refuse_without_a_reason_and_change_nothing(olivia_client: Client) -> None:
    refused = olivia_client.post("/pauses/set/", {"namespace": "acme", "kind": "", "reason": ""}, follow=True)
    assert "Not paused: a reason is required" in html(refused)
    assert not Pause.objects.exists()
    pause = fleet.pause_set(namespace="acme", kind="", paused_by="user:ops", reason="deploy")
    refused = olivia_client.post(f"/pauses/{pause.pk}/resume/", {"reason": ""}, follow=True)
    assert "Not resumed: a reason is required" in html(refused)
    pause.refresh_from_db()
    assert pause.resumed_at is None
    twice = olivia_client.post("/pauses/set/", {"namespace": "acme", "kind": "", "reason": "again"}, follow=True)
    assert "Not paused: a pause is already in force" in html(twice)
    assert Pause.objects.count() == 1


def test_the_overview_shows_the_pauses_in_force(olivia_client: Client) -> None:
    assert 'id="pauses-in-force"' not in html(olivia_client.get("/"))
    fleet.pause_set(namespace="acme", kind="", paused_by="user:ops", reason="bad deploy rolling back")
    page = html(olivia_client.get("/"))
    assert 'id="pauses-in-force"' in page and "bad deploy rolling back" in page and "every kind" in page
    # An open overview's live refresh brings it too, and takes it away once lifted.
    live = olivia_client.get("/live/overview/").json()["pauses"]
    assert 'id="pauses-in-force"' in live and "bad deploy rolling back" in live
    fleet.pause_lift(pause_id=Pause.objects.get().pk, resumed_by="user:ops", reason="rolled back")
    assert olivia_client.get("/live/overview/").json()["pauses"].strip() == ""


def test_only_staff_see_or_use_them(victor: User) -> None:
    task = pending_task()
    anonymous = Client()
    assert anonymous.get("/pauses/").status_code == 302
    assert anonymous.post(f"/tasks/{task.pk}/cancel/", {"reason": "x"}).status_code == 302
    client = Client()
    client.force_login(victor)
    assert client.get("/pauses/").status_code == 403
    assert client.post("/pauses/set/", {"namespace": "acme", "reason": "x"}).status_code == 403
    assert client.post(f"/tasks/{task.pk}/cancel/", {"reason": "x"}).status_code == 403
    assert not Pause.objects.exists() and Task.objects.get(pk=task.pk).status == "pending"


def test_what_no_form_takes_is_said_on_the_page_and_changes_nothing(olivia_client: Client) -> None:
    # U+0000 would reach PostgreSQL, which refuses it in text with an error the page would not
    # survive; the forms say so first.
    task = pending_task()
    refused = olivia_client.post("/pauses/set/", {"namespace": "ac\x00me", "kind": "", "reason": "x"}, follow=True)
    assert refused.status_code == 200 and "Not paused: Null characters are not allowed" in html(refused)
    assert not Pause.objects.exists()
    refused = olivia_client.post(f"/tasks/{task.pk}/cancel/", {"reason": "dup\x00"}, follow=True)
    assert refused.status_code == 200 and "Not cancelled: Null characters are not allowed" in html(refused)
    assert Task.objects.get(pk=task.pk).status == "pending"
    pause = fleet.pause_set(namespace="acme", kind="", paused_by="user:ops", reason="deploy")
    refused = olivia_client.post(f"/pauses/{pause.pk}/resume/", {"reason": "x" * 1001}, follow=True)
    assert refused.status_code == 200 and "Not resumed: Ensure this value has at most 1000 characters" in html(refused)
    pause.refresh_from_db()
    assert pause.resumed_at is None
