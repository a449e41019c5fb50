"""People's roles on the staff API (api/permissions.py): a viewer reads, an operator
cancels, pauses, forks and sets budgets, a reviewer decides dead letters and bulk jobs; staff
with no role get nothing, and a staff user scoped to a namespace sees only that namespace."""

from __future__ import annotations

from typing import Any

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from backplane.delivery.models import DeadLetter, OutboxMessage
from recovery.models import Budget, BulkJob, Pause, StaffScope
from tests.api.conftest import AgentClient, assert_error, create_task, row_counts
from tests.support.roles import staff_user


def session(username: str, *roles: str) -> APIClient:
    client = APIClient()
    client.force_login(staff_user(username, *roles))
    return client


@pytest.fixture
def task(alice: AgentClient) -> dict[str, Any]:
    return create_task(alice)


@pytest.fixture
def dead_letter(task: dict[str, Any]) -> DeadLetter:
    message = OutboxMessage.objects.get(task_id=task["task_id"])
    OutboxMessage.objects.filter(pk=message.pk).update(status="dead", attempts=5)
    return DeadLetter.objects.create(source="outbox", reference=str(message.message_id), task_id=task["task_id"],
                                     outbox_message=message, topic=message.topic, payload=message.payload,
                                     error="broker: ConnectionRefusedError", attempts=5, created_at=timezone.now())


def operator_writes(task_id: str) -> list[tuple[str, dict[str, Any]]]:
    return [
        (f"/api/v1/tasks/{task_id}/cancel/", {"reason": "loops"}),
        (f"/api/v1/tasks/{task_id}/fork/", {"at_seq": 1, "reason": "retry"}),
        ("/api/v1/pauses/", {"namespace": "acme", "reason": "CRM down"}),
        ("/api/v1/budgets/", {"scope": "namespace", "key": "acme", "period": "day", "unit": "currency",
                              "currency": "USD", "limit": "10.00", "reason": "the plan"}),
    ]


def reviewer_routes(dead_letter_id: int) -> list[tuple[str, str, dict[str, Any]]]:
    return [
        ("get", "/api/v1/dead-letters/", {}),
        ("post", f"/api/v1/dead-letters/{dead_letter_id}/requeue/", {"reason": "the broker is back"}),
        ("post", f"/api/v1/dead-letters/{dead_letter_id}/discard/", {"reason": "duplicate"}),
        ("get", "/api/v1/jobs/", {}),
        ("post", "/api/v1/jobs/", {"action": "cancel", "ids": [], "reason": "x"}),
    ]


def nothing_changed(dead_letter: DeadLetter, before: dict[str, int]) -> None:
    assert row_counts() == before
    assert DeadLetter.objects.get(pk=dead_letter.pk).status == "pending"
    assert not Pause.objects.exists() and not Budget.objects.exists() and not BulkJob.objects.exists()


def test_it_lets_a_viewer_read(task: dict[str, Any]) -> None:
    viewer = session("vera", "Viewers")
    for path in ("/api/v1/tasks/", f"/api/v1/tasks/{task['task_id']}/", f"/api/v1/tasks/{task['task_id']}/events/",
                 f"/api/v1/tasks/{task['task_id']}/verify/", "/api/v1/pauses/", "/api/v1/budgets/"):
        assert viewer.get(path).status_code == 200, path


def test_it_refuses_a_viewer_every_operator_and_reviewer_route(task: dict[str, Any], dead_letter: DeadLetter) -> None:
    viewer = session("vera", "Viewers")
    before = row_counts()
    for path, body in operator_writes(task["task_id"]):
        assert_error(viewer.post(path, body, format="json"), 403, "permission_denied")
    for method, path, body in reviewer_routes(dead_letter.pk):
        assert_error(getattr(viewer, method)(path, body, format="json"), 403, "permission_denied")
    nothing_changed(dead_letter, before)


def test_it_refuses_staff_with_no_role_even_reads(task: dict[str, Any]) -> None:
    nobody = session("sam")
    assert_error(nobody.get("/api/v1/tasks/"), 403, "permission_denied")
    assert_error(nobody.get(f"/api/v1/tasks/{task['task_id']}/"), 403, "permission_denied")
    assert_error(nobody.get("/api/v1/pauses/"), 403, "permission_denied")


def test_it_lets_an_operator_cancel_pause_fork_and_set_budgets_but_not_review(
    alice: AgentClient, dead_letter: DeadLetter,
) -> None:
    operator = session("olivia", "Operators")
    first, second = create_task(alice), create_task(alice)
    assert operator.post(f"/api/v1/tasks/{first['task_id']}/fork/", {"at_seq": 1, "reason": "retry"},
                         format="json").status_code == 201
    assert operator.post(f"/api/v1/tasks/{second['task_id']}/cancel/", {"reason": "loops"},
                         format="json").status_code == 200
    pause = operator.post("/api/v1/pauses/", {"namespace": "acme", "reason": "CRM down"}, format="json")
    assert pause.status_code == 201
    assert operator.post(f"/api/v1/pauses/{pause.json()['id']}/resume/", {"reason": "fixed"},
                         format="json").status_code == 200
    _, budget = operator_writes(first["task_id"])[3]
    assert operator.post("/api/v1/budgets/", budget, format="json").status_code == 200
    for method, path, body in reviewer_routes(dead_letter.pk):
        assert_error(getattr(operator, method)(path, body, format="json"), 403, "permission_denied")
    assert DeadLetter.objects.get(pk=dead_letter.pk).status == "pending" and not BulkJob.objects.exists()


def test_it_lets_a_reviewer_requeue_but_not_operate(task: dict[str, Any], dead_letter: DeadLetter) -> None:
    reviewer = session("rita", "Reviewers")
    before = row_counts()
    for path, body in operator_writes(task["task_id"]):
        assert_error(reviewer.post(path, body, format="json"), 403, "permission_denied")
    assert row_counts() == before and not Pause.objects.exists() and not Budget.objects.exists()
    assert reviewer.get("/api/v1/dead-letters/").status_code == 200
    assert reviewer.post(f"/api/v1/dead-letters/{dead_letter.pk}/requeue/", {"reason": "the broker is back"},
                         format="json").status_code == 200
    assert DeadLetter.objects.get(pk=dead_letter.pk).status == "requeued"


def test_it_scopes_a_staff_user_to_their_namespace(alice: AgentClient, mallory: AgentClient) -> None:
    ours, theirs = create_task(alice), create_task(mallory)
    operator = staff_user("olga", "Operators")
    StaffScope.objects.create(user=operator, namespace="acme")
    client = APIClient()
    client.force_login(operator)
    assert client.get(f"/api/v1/tasks/{ours['task_id']}/").status_code == 200
    assert_error(client.get(f"/api/v1/tasks/{theirs['task_id']}/"), 404, "not_found")
    assert_error(client.post(f"/api/v1/tasks/{theirs['task_id']}/cancel/", {"reason": "x"}, format="json"),
                 404, "not_found")
    assert [t["task_id"] for t in client.get("/api/v1/tasks/").json()["results"]] == [ours["task_id"]]
    # Pauses and budgets span namespaces: not for a scoped user.
    assert_error(client.post("/api/v1/pauses/", {"namespace": "globex", "reason": "x"}, format="json"),
                 403, "permission_denied")
    assert not Pause.objects.exists()
