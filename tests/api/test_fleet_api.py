"""/api/v1/tasks/{id}/cancel/ and /api/v1/pauses/: the contract's errors, each changing nothing."""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework.test import APIClient

from backplane.eventlog.models import Event, Task
from recovery.models import Pause
from tests.api.conftest import AgentClient, assert_error, claim, create_task, row_counts
from tests.support.roles import staff_user


@pytest.fixture
def staff(db: None) -> APIClient:
    """An operator: staff in the Operators group."""
    client = APIClient()
    client.force_login(staff_user("dana", "Operators"))
    return client


def pause_rows() -> list[tuple[Any, ...]]:
    return list(Pause.objects.order_by("pk").values_list("namespace", "kind", "resumed_at", "resume_reason"))


# --- cancel -----------------------------------------------------------------------------------------


def test_staff_cancel_a_task_and_get_the_task_object(staff: APIClient, alice: AgentClient) -> None:
    task = create_task(alice)
    claim(alice)
    answer = staff.post(f"/api/v1/tasks/{task['task_id']}/cancel/", {"reason": "prompt v7 loops"}, format="json")
    assert answer.status_code == 200, answer.content
    body = answer.json()
    assert body["task_id"] == task["task_id"] and body["status"] == "cancelled" and body["lease"] is None
    event = Event.objects.filter(task_id=task["task_id"]).order_by("-seq").first()
    assert event is not None and event.type == "TaskCancelled"
    assert event.payload == {"cancelled_by": "user:dana", "reason": "prompt v7 loops", "compensate": False}


def test_an_agent_cancels_its_own_namespaces_task(alice: AgentClient) -> None:
    task = create_task(alice)
    answer = alice.post(f"/api/v1/tasks/{task['task_id']}/cancel/", {"reason": "duplicate", "compensate": True},
                        format="json")
    assert answer.status_code == 200, answer.content
    event = Event.objects.get(task_id=task["task_id"], type="TaskCancelled")
    assert event.payload == {"cancelled_by": "agent:alice", "reason": "duplicate", "compensate": True}


@pytest.mark.parametrize("body", [{}, {"reason": ""}, {"reason": 7}, {"reason": "x", "compensate": "yes"},
                                  {"reason": "x", "extra": 1}])
def test_a_bad_cancel_body_is_400_and_changes_nothing(alice: AgentClient, body: dict[str, Any]) -> None:
    task = create_task(alice)
    before = row_counts()
    assert_error(alice.post(f"/api/v1/tasks/{task['task_id']}/cancel/", body, format="json"), 400,
                 "validation_error")
    assert row_counts() == before and Task.objects.get(pk=task["task_id"]).status == "pending"


def test_another_namespaces_task_is_404_and_unchanged(alice: AgentClient, mallory: AgentClient) -> None:
    task = create_task(alice)
    before = row_counts()
    assert_error(mallory.post(f"/api/v1/tasks/{task['task_id']}/cancel/", {"reason": "mine"}, format="json"),
                 404, "not_found")
    assert row_counts() == before and Task.objects.get(pk=task["task_id"]).status == "pending"


def test_a_closed_task_is_409_and_names_its_cancellation(staff: APIClient, alice: AgentClient) -> None:
    task = create_task(alice)
    staff.post(f"/api/v1/tasks/{task['task_id']}/cancel/", {"reason": "first"}, format="json")
    before = row_counts()
    error = assert_error(alice.post(f"/api/v1/tasks/{task['task_id']}/cancel/", {"reason": "second"},
                                    format="json"), 409, "task_closed")
    assert error["details"]["status"] == "cancelled" and error["details"]["cancelled_by"] == "user:dana"
    assert error["details"]["reason"] == "first"
    assert row_counts() == before


def test_an_anonymous_cancel_is_401(alice: AgentClient) -> None:
    task = create_task(alice)
    before = row_counts()
    assert_error(APIClient().post(f"/api/v1/tasks/{task['task_id']}/cancel/", {"reason": "x"}, format="json"),
                 401, "not_authenticated")
    assert row_counts() == before


# --- pauses -----------------------------------------------------------------------------------------


def test_staff_pause_list_and_resume(staff: APIClient) -> None:
    answer = staff.post("/api/v1/pauses/", {"namespace": "acme", "kind": "enrich", "reason": "tool down"},
                        format="json")
    assert answer.status_code == 201, answer.content
    pause = answer.json()
    assert pause["kind"] == "enrich" and pause["in_force"] and pause["paused_by"] == "user:dana"
    whole = staff.post("/api/v1/pauses/", {"namespace": "globex", "reason": "deploy"}, format="json").json()
    assert whole["kind"] is None
    listed = staff.get("/api/v1/pauses/").json()
    assert {p["id"] for p in listed["in_force"]} == {pause["id"], whole["id"]} and listed["recently_lifted"] == []
    resumed = staff.post(f"/api/v1/pauses/{pause['id']}/resume/", {"reason": "fixed"}, format="json")
    assert resumed.status_code == 200, resumed.content
    assert resumed.json()["in_force"] is False and resumed.json()["resume_reason"] == "fixed"
    listed = staff.get("/api/v1/pauses/").json()
    assert [p["id"] for p in listed["recently_lifted"]] == [pause["id"]]


def test_agents_may_not_pause_list_or_resume(staff: APIClient, alice: AgentClient) -> None:
    pause = staff.post("/api/v1/pauses/", {"namespace": "acme", "reason": "deploy"}, format="json").json()
    before = pause_rows()
    assert_error(alice.post("/api/v1/pauses/", {"namespace": "acme", "reason": "me too"}, format="json"), 403,
                 "permission_denied")
    assert_error(alice.get("/api/v1/pauses/"), 403, "permission_denied")
    assert_error(alice.post(f"/api/v1/pauses/{pause['id']}/resume/", {"reason": "let me work"}, format="json"),
                 403, "permission_denied")
    assert pause_rows() == before


@pytest.mark.parametrize("body", [{"namespace": "acme"}, {"namespace": "acme", "reason": ""},
                                  {"reason": "x"}, {"namespace": "ac me", "reason": "x"},
                                  {"namespace": "acme", "kind": "", "reason": "x"},
                                  {"namespace": "acme", "reason": "x", "extra": True}])
def test_a_bad_pause_is_400_and_changes_nothing(staff: APIClient, body: dict[str, Any]) -> None:
    assert_error(staff.post("/api/v1/pauses/", body, format="json"), 400, "validation_error")
    assert pause_rows() == []


def test_a_second_pause_of_a_scope_is_409(staff: APIClient) -> None:
    first = staff.post("/api/v1/pauses/", {"namespace": "acme", "kind": "enrich", "reason": "x"}, format="json")
    before = pause_rows()
    error = assert_error(staff.post("/api/v1/pauses/", {"namespace": "acme", "kind": "enrich", "reason": "y"},
                                    format="json"), 409, "pause_in_force")
    assert error["details"]["pause_id"] == first.json()["id"]
    assert pause_rows() == before


def test_resume_needs_a_reason_a_known_pause_and_only_once(staff: APIClient) -> None:
    pause = staff.post("/api/v1/pauses/", {"namespace": "acme", "reason": "x"}, format="json").json()
    before = pause_rows()
    assert_error(staff.post(f"/api/v1/pauses/{pause['id']}/resume/", {}, format="json"), 400, "validation_error")
    assert_error(staff.post(f"/api/v1/pauses/{pause['id'] + 99}/resume/", {"reason": "x"}, format="json"),
                 404, "not_found")
    assert pause_rows() == before
    staff.post(f"/api/v1/pauses/{pause['id']}/resume/", {"reason": "done"}, format="json")
    before = pause_rows()
    assert_error(staff.post(f"/api/v1/pauses/{pause['id']}/resume/", {"reason": "again"}, format="json"),
                 409, "already_decided")
    assert pause_rows() == before


def test_a_paused_kind_is_not_leased_over_the_api(staff: APIClient, alice: AgentClient) -> None:
    create_task(alice, kind="enrich")
    other = create_task(alice, kind="score")
    staff.post("/api/v1/pauses/", {"namespace": "acme", "kind": "enrich", "reason": "tool down"}, format="json")
    assert claim(alice)["task"]["task_id"] == other["task_id"]
    assert alice.post("/api/v1/leases/", {}, format="json").status_code == 204
