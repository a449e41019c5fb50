"""/api/v1/tasks/: create (idempotent), list (filtered, paginated), detail, namespace isolation."""

from __future__ import annotations

import uuid
from collections.abc import Callable

import pytest

from tests.api.conftest import AgentClient, assert_error, create_task


def test_it_creates_a_task_with_task_started(alice) -> None:  # type: ignore[no-untyped-def]
    task = create_task(alice, max_attempts=5, metadata={"source": "crm"})
    assert task["status"] == "pending" and task["namespace"] == "acme" and task["max_attempts"] == 5
    assert task["last_seq"] == 1 and task["lease"] is None and task["output"] is None
    events = alice.get(f"/api/v1/tasks/{task['task_id']}/events/").json()["results"]
    assert [e["type"] for e in events] == ["TaskStarted"] and events[0]["agent"] == "alice"


def test_the_same_task_id_and_content_again_is_200_and_writes_nothing(alice, counts) -> None:  # type: ignore[no-untyped-def]
    task_id = str(uuid.uuid4())
    first = create_task(alice, task_id=task_id)
    before = counts()
    again = alice.post("/api/v1/tasks/", {"task_id": task_id, "kind": "lead-qualification",
                                          "input": {"lead": "alice@example.com"}}, format="json")
    assert again.status_code == 200 and again.json() == first
    assert again["Idempotent-Replay"] == "true"
    assert counts() == before


def test_the_same_task_id_with_other_content_is_409(alice, counts) -> None:  # type: ignore[no-untyped-def]
    task_id = str(uuid.uuid4())
    create_task(alice, task_id=task_id)
    before = counts()
    response = alice.post("/api/v1/tasks/", {"task_id": task_id, "kind": "other", "input": {}}, format="json")
    assert_error(response, 409, "task_exists")
    assert counts() == before


def test_a_task_id_taken_in_another_namespace_answers_like_any_conflict(
    alice: AgentClient, mallory: AgentClient, counts: Callable[[], dict[str, int]]
) -> None:
    task_id = str(uuid.uuid4())
    same = {"task_id": task_id, "kind": "lead-qualification", "input": {"lead": "alice@example.com"}}
    create_task(alice, **same)
    before = counts()
    own_conflict = assert_error(alice.post("/api/v1/tasks/", {**same, "kind": "other"}, format="json"),
                                409, "task_exists")
    # Identical content from another namespace is no replay of alice's task, and other
    # content answers alike: neither says where the id is used or what it holds.
    for body in (same, {**same, "kind": "other"}, {**same, "input": {}}):
        error = assert_error(mallory.post("/api/v1/tasks/", body, format="json"), 409, "task_exists")
        assert error == own_conflict
        assert task_id not in str(error)
    assert_error(mallory.get(f"/api/v1/tasks/{task_id}/"), 404, "not_found")
    assert counts() == before


@pytest.mark.parametrize(
    "body",
    [
        {"input": {}},
        {"kind": "k"},
        {"kind": "k", "input": []},
        {"kind": "k", "input": "x"},
        {"kind": 5, "input": {}},
        {"kind": "k", "input": {}, "max_attempts": "3"},
        {"kind": "k", "input": {}, "max_attempts": 0},
        {"kind": "k", "input": {}, "task_id": "not-a-uuid"},
        {"kind": "k", "input": {}, "namespace": "globex"},
        {"kind": "k", "input": {}, "status": "completed"},
        {"kind": "k", "input": {}, "last_seq": 9},
        {"kind": "k", "input": {}, "parent_task_id": str(uuid.uuid4())},
        {"kind": "k", "input": {"bad": "\u0000"}},
        {"kind": "", "input": {}},
    ],
)
def test_bad_bodies_are_400_and_write_nothing(alice, counts, body) -> None:  # type: ignore[no-untyped-def]
    before = counts()
    error = assert_error(alice.post("/api/v1/tasks/", body, format="json"), 400, "validation_error")
    assert error["details"], error
    assert counts() == before


def test_malformed_json_is_400(alice, counts) -> None:  # type: ignore[no-untyped-def]
    before = counts()
    response = alice.post("/api/v1/tasks/", data=b'{"kind": "k", "input": {', content_type="application/json")
    assert_error(response, 400, "validation_error")
    response = alice.post("/api/v1/tasks/", data=b'{"kind": "k", "input": {"n": NaN}}', content_type="application/json")
    assert_error(response, 400, "validation_error")
    response = alice.post("/api/v1/tasks/", data=b"[1, 2]", content_type="application/json")
    assert_error(response, 400, "validation_error")
    assert counts() == before


def test_an_oversize_body_is_413_and_writes_nothing(alice, counts, settings) -> None:  # type: ignore[no-untyped-def]
    before = counts()
    body = {"kind": "k", "input": {"blob": "x" * (settings.BACKPLANE_PAYLOAD_LIMIT_BYTES + 1)}}
    assert_error(alice.post("/api/v1/tasks/", body, format="json"), 413, "payload_too_large")
    assert counts() == before


def test_it_lists_filters_and_paginates(alice) -> None:  # type: ignore[no-untyped-def]
    created = [create_task(alice, kind="a" if n % 2 else "b") for n in range(7)]
    page = alice.get("/api/v1/tasks/", {"limit": 3}).json()
    seen = [t["task_id"] for t in page["results"]]
    while page["next"]:
        page = alice.get(page["next"]).json()
        seen += [t["task_id"] for t in page["results"]]
    assert seen == [t["task_id"] for t in created]
    kinds = alice.get("/api/v1/tasks/", {"kind": "a"}).json()["results"]
    assert {t["kind"] for t in kinds} == {"a"} and len(kinds) == 3
    assert alice.get("/api/v1/tasks/", {"status": "completed"}).json() == {"results": [], "next": None}
    assert_error(alice.get("/api/v1/tasks/", {"status": "nope"}), 400, "validation_error")
    assert_error(alice.get("/api/v1/tasks/", {"limit": "0"}), 400, "validation_error")
    assert_error(alice.get("/api/v1/tasks/", {"cursor": "garbage!"}), 400, "validation_error")


TASK_ROUTES = [
    ("get", "/api/v1/tasks/{id}/", None),
    ("get", "/api/v1/tasks/{id}/events/", None),
    ("post", "/api/v1/tasks/{id}/events/", {"type": "Noted", "payload": {}}),
    ("post", "/api/v1/tasks/{id}/events/batch/", {"events": [{"type": "Noted", "payload": {}}]}),
    ("get", "/api/v1/tasks/{id}/verify/", None),
    ("post", "/api/v1/tasks/{id}/heartbeat/", {"lease_epoch": 1}),
    ("post", "/api/v1/tasks/{id}/release/", {"lease_epoch": 1}),
    ("get", "/api/v1/tasks/{id}/recovery-context/", None),
    ("post", "/api/v1/tasks/{id}/tool-calls/", {"step": 1, "tool": "crm", "input": {}}),
    ("post", "/api/v1/tasks/{id}/subtasks/", {"step": 1, "kind": "k", "input": {}}),
]


@pytest.mark.parametrize(("method", "path", "body"), TASK_ROUTES)
def test_another_namespace_gets_404_on_every_task_route(alice, mallory, counts, method, path, body) -> None:  # type: ignore[no-untyped-def]
    task = create_task(alice)
    before = counts()
    response = getattr(mallory, method)(path.format(id=task["task_id"]), body, format="json")
    assert_error(response, 404, "not_found")
    assert counts() == before
    assert mallory.get("/api/v1/tasks/").json()["results"] == []


@pytest.mark.parametrize(("method", "path", "body"), [*TASK_ROUTES, ("get", "/api/v1/tasks/", None),
                                                      ("post", "/api/v1/leases/", {})])
def test_every_route_wants_a_valid_token(alice, counts, method, path, body) -> None:  # type: ignore[no-untyped-def]
    from rest_framework.test import APIClient

    task = create_task(alice)
    before = counts()
    anonymous = APIClient()
    response = getattr(anonymous, method)(path.format(id=task["task_id"]), body, format="json")
    assert_error(response, 401, "not_authenticated")
    anonymous.credentials(HTTP_AUTHORIZATION="Bearer bp_not-a-real-token")
    response = getattr(anonymous, method)(path.format(id=task["task_id"]), body, format="json")
    assert_error(response, 401, "not_authenticated")
    assert counts() == before


def test_an_inactive_agent_is_401(alice) -> None:  # type: ignore[no-untyped-def]
    from backplane.eventlog.models import Agent

    Agent.objects.filter(name="alice").update(is_active=False)
    assert_error(alice.get("/api/v1/tasks/"), 401, "not_authenticated")


def test_unknown_routes_and_methods_answer_in_the_error_shape(alice) -> None:  # type: ignore[no-untyped-def]
    assert_error(alice.get("/api/v1/nope/"), 404, "not_found")
    assert_error(alice.delete("/api/v1/tasks/"), 405, "method_not_allowed")
