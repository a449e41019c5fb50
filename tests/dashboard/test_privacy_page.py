"""Personal data on the dashboard (docs/privacy.md): a task page shows sealed values as labels to
everyone; only a privacy officer opens them, and that read is recorded; the Privacy page is theirs
alone, and its erasure says why it refused, changing nothing."""

from __future__ import annotations

import pytest
from django.test import Client

from backplane.eventlog import services
from backplane.eventlog.models import Task
from backplane.eventlog.writer import EventDraft
from backplane.privacy.models import DataSubject, PersonalDataRead
from backplane.privacy.sealing import seal_personal
from tests.support.roles import staff_user

pytestmark = pytest.mark.django_db

EMAIL = "ada@example.com"


def session(*roles: str, name: str = "ana") -> Client:
    client = Client()
    client.force_login(staff_user(name, *roles))
    return client


@pytest.fixture
def task() -> Task:
    marked = seal_personal("acme", {"step": 1, "email": {"$personal": {"subject": "lead:8812", "value": EMAIL}}})
    task = services.task_create(namespace="acme", kind="lead", input={}, agent="qualifier").task
    services.event_append(namespace="acme", task_id=task.pk, agent="qualifier",
                          draft=EventDraft(type="ReasoningStepCompleted", payload=marked))
    return task


def test_a_viewer_sees_labels_and_cannot_open(task: Task) -> None:
    viewer = session("Viewers", name="vera")
    for url in (f"/tasks/{task.pk}/", f"/tasks/{task.pk}/?personal=open"):
        page = viewer.get(url).content.decode()
        assert "[personal: lead:8812]" in page and EMAIL not in page and 'id="show-personal"' not in page
    live = viewer.get(f"/tasks/{task.pk}/live/?after_seq=0").json()["rows"]
    assert "[personal: lead:8812]" in live and EMAIL not in live
    assert viewer.get("/privacy/").status_code == 403
    assert PersonalDataRead.objects.count() == 0


def test_a_privacy_officer_opens_and_the_read_is_recorded(task: Task) -> None:
    officer = session("Privacy officers", name="priya")
    assert 'id="show-personal"' in officer.get(f"/tasks/{task.pk}/").content.decode()
    assert PersonalDataRead.objects.count() == 0
    assert EMAIL in officer.get(f"/tasks/{task.pk}/?personal=open").content.decode()
    read = PersonalDataRead.objects.get()
    assert (read.reader, read.where, read.task_id) == ("user:priya", "task page", task.pk)
    assert "user:priya" in officer.get("/privacy/").content.decode()


def test_the_privacy_pages_erasure_refuses_in_words_and_changes_nothing(task: Task) -> None:
    officer = session("Privacy officers", name="priya")
    refused = officer.post("/privacy/erase/", {"namespace": "acme", "subject": "lead:1", "reason": "asked"},
                           follow=True)
    assert "Not erased: no such data subject in this namespace." in refused.content.decode()
    missing = officer.post("/privacy/erase/", {"namespace": "acme", "subject": "lead:8812", "reason": ""}, follow=True)
    assert "Not erased: an erasure says why" in missing.content.decode()
    assert session("Operators", name="olivia").post(
        "/privacy/erase/", {"namespace": "acme", "subject": "lead:8812", "reason": "asked"}).status_code == 403
    assert DataSubject.objects.get().erased_at is None

    done = officer.post("/privacy/erase/", {"namespace": "acme", "subject": "lead:8812", "reason": "DSAR 9"},
                        follow=True)
    assert "Erased: acme/lead:8812." in done.content.decode()
    again = officer.post("/privacy/erase/", {"namespace": "acme", "subject": "lead:8812", "reason": "again"},
                         follow=True)
    assert "Not erased: data subject &#x27;lead:8812&#x27; was already erased." in again.content.decode()
    assert "[erased: lead:8812" in officer.get(f"/tasks/{task.pk}/?personal=open").content.decode()


def test_a_privacy_officer_finds_a_subject_by_a_value_marked_for_lookup(task: Task) -> None:
    seal_personal("acme", {"email": {"$personal": {"subject": "lead:8812", "value": EMAIL, "lookup": True}}})
    officer = session("Privacy officers", name="priya")
    found = officer.post("/privacy/find/", {"namespace": "acme", "value": EMAIL}).content.decode()
    assert "Belongs to <code>lead:8812</code>." in found
    read = PersonalDataRead.objects.get()
    assert (read.reader, read.where, read.subjects) == ("user:priya", "lookup", ["lead:8812"])
    assert "No live subject" in officer.post("/privacy/find/", {"namespace": "acme", "value": "x@y.z"}).content.decode()
    assert officer.post("/privacy/find/", {"namespace": "", "value": EMAIL}).status_code == 400
    assert session("Viewers", name="vera").post("/privacy/find/", {"namespace": "acme", "value": EMAIL}).status_code \
        == 403
    assert PersonalDataRead.objects.count() == 1
