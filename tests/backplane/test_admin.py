"""The admin: every model registered, events strictly read-only, searchable."""

from __future__ import annotations

import pytest
from django.contrib import admin
from django.contrib.auth.models import User
from django.test import Client

from backplane.eventlog.models import Agent, Event, Task


@pytest.fixture
def staff_client(db) -> Client:  # type: ignore[no-untyped-def]
    User.objects.create_superuser("root", "", "pw-for-tests-only")
    client = Client()
    client.login(username="root", password="pw-for-tests-only")
    return client


def test_every_backplane_model_is_registered() -> None:
    for model in (Agent, Task, Event):
        assert admin.site.is_registered(model)


def test_events_cannot_be_added_changed_or_deleted(staff_client: Client, make_task) -> None:  # type: ignore[no-untyped-def]
    task = make_task()
    event = Event.objects.get(task=task)
    assert staff_client.get("/admin/backplane/event/add/").status_code == 403
    change_page = staff_client.get(f"/admin/backplane/event/{event.pk}/change/")
    assert change_page.status_code == 200 and b'name="_save"' not in change_page.content
    assert staff_client.post(f"/admin/backplane/event/{event.pk}/change/", {"type": "Forged"}).status_code == 403
    assert staff_client.post(f"/admin/backplane/event/{event.pk}/delete/", {"post": "yes"}).status_code == 403
    assert Event.objects.get(pk=event.pk).type == "TaskStarted"


@pytest.mark.parametrize("term", ["task", "TaskStarted", "key-42"])
def test_events_are_searchable_by_task_type_and_idempotency_key(staff_client: Client, make_task, term: str) -> None:  # type: ignore[no-untyped-def]
    from backplane.eventlog import services
    from backplane.eventlog.writer import EventDraft

    task = make_task()
    other = make_task()
    services.event_append(namespace="acme", task_id=task.pk, agent="a",
                          draft=EventDraft(type="Noted", payload={}, idempotency_key="key-42"))
    query = str(task.pk) if term == "task" else term
    page = staff_client.get("/admin/backplane/event/", {"q": query})
    assert page.status_code == 200
    listed = {e.pk for e in page.context["cl"].result_list}
    expected = {
        "task": set(Event.objects.filter(task=task).values_list("pk", flat=True)),
        "TaskStarted": set(Event.objects.filter(type="TaskStarted").values_list("pk", flat=True)),
        "key-42": set(Event.objects.filter(idempotency_key="key-42").values_list("pk", flat=True)),
    }[term]
    assert listed == expected and other.pk is not None


def test_adding_an_agent_shows_its_token_once_and_stores_the_hash(staff_client: Client) -> None:
    response = staff_client.post(
        "/admin/backplane/agent/add/",
        {"name": "qualifier-9", "namespace": "acme", "kinds": "lead-qualification", "is_active": "on"},
        follow=True,
    )
    assert response.status_code == 200
    shown = [str(m) for m in response.context["messages"] if "Token for" in str(m)]
    assert len(shown) == 1
    token = shown[0].rsplit(" ", 1)[-1]
    agent = Agent.objects.get(name="qualifier-9")
    assert agent.token_matches(token) and agent.kinds == ["lead-qualification"]


def test_tasks_are_read_only_too(staff_client: Client, make_task) -> None:  # type: ignore[no-untyped-def]
    task = make_task()
    assert staff_client.get("/admin/backplane/task/").status_code == 200
    assert staff_client.post(f"/admin/backplane/task/{task.pk}/delete/", {"post": "yes"}).status_code == 403
