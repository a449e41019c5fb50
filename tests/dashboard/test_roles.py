"""People's roles on the dashboard (dashboard/views/common.py): every write is refused with 403
and changes nothing for someone whose role does not hold it, whatever the page showed; a viewer
reads; staff with no role see nothing; a user scoped to a namespace sees only its tasks."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from backplane.delivery.models import DeadLetter
from backplane.eventlog import services
from backplane.eventlog.models import Event, Task
from backplane.integrity.models import VerificationRun
from recovery.models import Budget, BulkJob, Pause, SavedSearch, StaffScope
from tests.support.roles import staff_user


def session(username: str, *roles: str) -> Client:
    client = Client()
    client.force_login(staff_user(username, *roles))
    return client


@pytest.fixture
def task(db: None) -> Task:
    return services.task_create(namespace="acme", kind="enrich", input={}, agent="alice").task


def state() -> tuple[Any, ...]:
    return (Event.objects.count(), Task.objects.count(), Pause.objects.count(), Budget.objects.count(),
            BulkJob.objects.count(), VerificationRun.objects.count(), SavedSearch.objects.count(),
            list(DeadLetter.objects.values_list("status", flat=True)), list(Task.objects.values_list("status")))


def operator_posts(task: Task) -> list[tuple[str, dict[str, str]]]:
    return [
        (f"/tasks/{task.pk}/cancel/", {"reason": "loops"}),
        (f"/tasks/{task.pk}/fork/", {"at_seq": "1", "reason": "retry",
                                     "fork_id": "6b1c9a7e-3f1d-4c36-9d0e-2a5c8b7d4e11"}),
        (f"/tasks/{task.pk}/verify/", {}),
        ("/pauses/set/", {"namespace": "acme", "reason": "CRM down"}),
        ("/budgets/set/", {"scope": "namespace", "key": "acme", "period": "day", "unit": "calls", "limit": "5",
                           "reason": "plan"}),
        ("/integrity/verify-all/", {}),
        ("/searches/", {"name": "failed", "query": "status=failed"}),
    ]


def reviewer_posts() -> list[tuple[str, dict[str, str]]]:
    return [("/jobs/new/", {"action": "retry", "reason": "x", "rate_per_second": "1", "chunk_size": "1"}),
            ("/agents/1/reset-breaker/", {"reason": "x"})]


def test_it_lets_a_viewer_read_the_pages(task: Task) -> None:
    viewer = session("vera", "Viewers")
    for path in ("/", "/tasks/", f"/tasks/{task.pk}/", "/pauses/", "/budgets/", "/integrity/", "/dead-letters/"):
        assert viewer.get(path).status_code == 200, path


def test_it_refuses_a_viewer_every_write_and_changes_nothing(task: Task) -> None:
    viewer = session("vera", "Viewers")
    before = state()
    for path, body in operator_posts(task) + reviewer_posts():
        assert viewer.post(path, body).status_code == 403, path
    assert state() == before


def test_it_refuses_a_reviewer_the_operators_writes(task: Task) -> None:
    reviewer = session("rita", "Reviewers")
    before = state()
    for path, body in operator_posts(task):
        assert reviewer.post(path, body).status_code == 403, path
    assert state() == before


def test_it_refuses_an_operator_the_reviewers_writes(task: Task) -> None:
    operator = session("olivia", "Operators")
    before = state()
    for path, body in reviewer_posts():
        assert operator.post(path, body).status_code == 403, path
    assert state() == before


def test_it_shows_staff_with_no_role_nothing(task: Task) -> None:
    nobody = session("sam")
    for path in ("/", "/tasks/", f"/tasks/{task.pk}/"):
        response = nobody.get(path)
        assert response.status_code == 403 and b"view_backplane" in response.content, path


def test_it_lets_an_operator_cancel(task: Task) -> None:
    operator = session("olivia", "Operators")
    assert operator.post(f"/tasks/{task.pk}/cancel/", {"reason": "loops"}).status_code == 302
    task.refresh_from_db()
    assert task.status == "cancelled"


def test_it_scopes_the_task_pages_to_the_users_namespace(task: Task) -> None:
    theirs = services.task_create(namespace="globex", kind="enrich", input={}, agent="mallory").task
    client = Client()
    user = staff_user("olga", "Operators")
    StaffScope.objects.create(user=user, namespace="acme")
    client.force_login(user)
    assert client.get(f"/tasks/{task.pk}/").status_code == 200
    assert client.get(f"/tasks/{theirs.pk}/").status_code == 404
    assert client.post(f"/tasks/{theirs.pk}/cancel/", {"reason": "x"}).status_code == 302
    theirs.refresh_from_db()
    assert theirs.status == "pending"
    listed = client.get("/tasks/").content.decode()
    assert str(task.pk) in listed and str(theirs.pk) not in listed


def test_it_refuses_a_scoped_user_the_pages_over_every_namespace(task: Task) -> None:
    client = Client()
    user = staff_user("olga", "Operators", "Reviewers")
    StaffScope.objects.create(user=user, namespace="acme")
    client.force_login(user)
    before = state()
    for path in ("/dead-letters/", "/jobs/", "/budgets/", "/pauses/", "/agents/", "/outbox/", "/integrity/",
                 "/searches/", "/live/overview/"):
        refused = client.get(path)
        assert refused.status_code == 403, path
        assert "covers every namespace" in refused.content.decode(), path
    for path, body in [("/pauses/set/", {"namespace": "globex", "reason": "mine now"}),
                       ("/integrity/verify-all/", {}), *reviewer_posts()]:
        assert client.post(path, body).status_code == 403, path
    assert state() == before
    # The overview sends them to their namespace's tasks.
    landing = client.get("/")
    assert (landing.status_code, landing["Location"]) == (302, "/tasks/")
