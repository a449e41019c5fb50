"""The hot routes' lean path answers exactly as their DRF views do, and is the one agents take."""

from __future__ import annotations

import json

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test.utils import CaptureQueriesContext
from pytest_django.fixtures import Settings
from rest_framework.test import APIClient

from tests.api.conftest import AgentClient, assert_error, claim, create_task

pytestmark = pytest.mark.django_db


def staff_client() -> APIClient:
    """A staff session: always served by the DRF view (session rules, CSRF)."""
    client = APIClient()
    client.force_login(User.objects.create_user("rita", is_staff=True))
    return client


def test_a_task_reads_the_same_on_the_lean_path_and_through_drf(alice: AgentClient) -> None:
    task = create_task(alice, input={"lead": "ana@example.com", "n": [1, 2.5, {"é": "\u2028"}]})
    lease = claim(alice)
    alice.post(f"/api/v1/tasks/{task['task_id']}/events/", {
        "type": "TaskCompleted", "payload": {"output": {"score": 0.5}}, "lease_epoch": lease["lease_epoch"]},
        format="json")
    lean = alice.get(f"/api/v1/tasks/{task['task_id']}/")
    drf = staff_client().get(f"/api/v1/tasks/{task['task_id']}/")
    assert lean.status_code == drf.status_code == 200
    assert lean.content == drf.content  # byte for byte: field order, separators, escapes
    assert lean["Content-Type"] == drf["Content-Type"] == "application/json"
    assert lean["Allow"] == drf["Allow"]


def test_an_agents_task_read_is_two_statements_and_no_queryset(alice: AgentClient, settings: Settings) -> None:
    settings.BACKPLANE_AUTH_CONFIRM_SECONDS = 0  # every request confirms (test_confirmations.py: one statement)
    task = create_task(alice)
    alice.get(f"/api/v1/tasks/{task['task_id']}/")  # the first request also notes the agent as seen
    with CaptureQueriesContext(connection) as queries:
        response = alice.get(f"/api/v1/tasks/{task['task_id']}/")
    assert response.status_code == 200
    sql = [q["sql"] for q in queries.captured_queries]
    # The token with the rate-limit counter, then the row: no LIMIT 1 queryset, no session.
    assert len(sql) == 2, sql
    assert "backplane_agent" in sql[0] and "backplane_cache" in sql[0] and "FROM backplane_task WHERE id" in sql[1]


def test_the_combined_statement_counts_into_the_principals_own_counter(alice: AgentClient,
                                                                       settings: Settings) -> None:
    """The lean path's counter is DRF's: requests through either path share one window."""
    settings.BACKPLANE_RATE_LIMIT = "3/m"
    task = create_task(alice)  # one (the create route is DRF's)
    url = f"/api/v1/tasks/{task['task_id']}/"
    assert alice.get(url).status_code == 200  # two (lean)
    assert alice.get(url, HTTP_ACCEPT="application/json; indent=2").status_code == 200  # three (DRF)
    assert_error(alice.get(url), 429, "rate_limited")  # four (lean)


def test_an_append_answers_like_drf_with_its_allow_header(alice: AgentClient) -> None:
    task = create_task(alice)
    response = alice.post(f"/api/v1/tasks/{task['task_id']}/events/",
                          {"type": "LeadScored", "payload": {"score": 1}, "idempotency_key": "k"}, format="json")
    assert response.status_code == 201
    assert response["Allow"] == "GET, POST, HEAD, OPTIONS"
    body = response.json()
    assert (body["seq"], body["type"], body["idempotency_key"]) == (2, "LeadScored", "k")
    again = alice.post(f"/api/v1/tasks/{task['task_id']}/events/",
                       {"type": "LeadScored", "payload": {"score": 1}, "idempotency_key": "k"}, format="json")
    assert (again.status_code, again["Idempotent-Replay"], again.json()) == (200, "true", body)


def test_a_body_the_check_declines_gets_drfs_own_validation_error(alice: AgentClient) -> None:
    task = create_task(alice)
    url = f"/api/v1/tasks/{task['task_id']}/events/"
    trimmed = alice.post(url, {"type": "LeadScored", "payload": {}, "idempotency_key": "  k  "}, format="json")
    assert trimmed.status_code == 201 and trimmed.json()["idempotency_key"] == "k"  # DRF trims, as before
    error = assert_error(alice.post(url, {"type": "LeadScored", "payload": {}, "seq": 9}, format="json"),
                         400, "validation_error")
    assert error["details"] == {"seq": "Unknown field."}
    error = assert_error(alice.post(url, b'{"type": "LeadScored", "type": "X", "payload": {}}',
                                    content_type="application/json"), 400, "validation_error")
    assert "duplicate object key" in error["details"]["body"]


def test_what_the_lean_path_does_not_take_on_goes_to_drf(alice: AgentClient) -> None:
    task = create_task(alice)
    url = f"/api/v1/tasks/{task['task_id']}/"
    assert_error(alice.get(url, HTTP_ACCEPT="text/html"), 406, "not_acceptable")
    assert alice.get(url, HTTP_ACCEPT="application/json; indent=2").content.startswith(b"{\n  ")
    assert_error(alice.post(f"{url}events/", "type=LeadScored", content_type="text/plain"), 415,
                 "unsupported_media_type")
    assert_error(alice.delete(url), 405, "method_not_allowed")
    unauthenticated = APIClient().get(url)
    assert_error(unauthenticated, 401, "not_authenticated")
    assert unauthenticated["WWW-Authenticate"] == 'Bearer realm="api"'
    bad = APIClient()
    bad.credentials(HTTP_AUTHORIZATION="Bearer nope")
    assert_error(bad.get(url), 401, "not_authenticated")


def test_the_rate_limit_applies_on_the_lean_path(alice: AgentClient, settings: Settings) -> None:
    settings.BACKPLANE_RATE_LIMIT = "2/m"
    task = create_task(alice)  # one
    url = f"/api/v1/tasks/{task['task_id']}/"
    assert alice.get(url).status_code == 200  # two
    error = assert_error(alice.get(url), 429, "rate_limited")
    assert int(alice.get(url)["Retry-After"]) >= 1 and error["details"]["retry_after"] >= 1
    assert json.loads(alice.get(url).content)["error"]["code"] == "rate_limited"


def test_claim_heartbeat_and_tool_calls_answer_on_the_lean_path(alice: AgentClient) -> None:
    nothing = alice.post("/api/v1/leases/", {"kinds": ["lead-qualification"]}, format="json")
    assert nothing.status_code == 204 and nothing.content == b"" and "Content-Type" not in nothing
    task = create_task(alice)
    lease = claim(alice, kinds=["lead-qualification"], lease_seconds=60)
    assert lease["task"]["task_id"] == task["task_id"] and lease["task"]["status"] == "running"
    url = f"/api/v1/tasks/{task['task_id']}/"
    beat = alice.post(f"{url}heartbeat/", {"lease_epoch": lease["lease_epoch"]}, format="json")
    assert beat.status_code == 200 and set(beat.json()) == {"expires_at"}
    assert_error(alice.post(f"{url}heartbeat/", {"lease_epoch": lease["lease_epoch"] + 1}, format="json"),
                 409, "stale_lease")
    body = {"step": 1, "tool": "crm.write", "input": {"lead": 1}, "lease_epoch": lease["lease_epoch"],
            "compensation": {"tool": "crm.revert", "input": {"lead": 1}}}
    first = alice.post(f"{url}tool-calls/", body, format="json")
    assert first.status_code == 201 and first.json()["status"] == "dispatched"
    again = alice.post(f"{url}tool-calls/", body, format="json")
    assert (again.status_code, again["Idempotent-Replay"], again.json()["status"]) == (200, "true", "in_flight")
    key = first.json()["idempotency_key"]
    done = alice.post(f"/api/v1/tool-calls/{key}/result/",
                      {"status": "succeeded", "result": {"id": 7}, "lease_epoch": lease["lease_epoch"]}, format="json")
    assert done.status_code == 201 and done.json()["compensation"] == {"tool": "crm.revert", "input": {"lead": 1}}
    assert_error(alice.post(f"/api/v1/tool-calls/{key}/result/",
                            {"status": "maybe", "result": {}, "lease_epoch": lease["lease_epoch"]}, format="json"),
                 400, "validation_error")


def test_a_staff_session_cannot_claim_on_any_path() -> None:
    assert_error(staff_client().post("/api/v1/leases/", {}, format="json"), 403, "permission_denied")


def test_the_rate_limit_counters_write_no_wal() -> None:
    """Each request's count commits without waiting for a WAL flush (recovery migration 0007)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT relpersistence FROM pg_class WHERE relname = 'backplane_cache'")
        assert cursor.fetchone() == ("u",)
