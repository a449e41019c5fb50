"""The agent routes (api/routes.py): on Django, each is its DRF view, serving every request the
HTTP front leaves to it (a staff session's), in DRF's order and with DRF's answers."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import resolve
from rest_framework.test import APIClient

from api.routes import AgentRoute, AgentRouteView
from backplane.eventlog import services
from backplane.eventlog.models import Agent, Event
from tests.api.conftest import AgentClient, assert_error, claim, create_task
from tests.support.roles import role_group

pytestmark = pytest.mark.django_db

AGENT_ROUTES = [
    "/api/v1/tasks/{task}/",
    "/api/v1/tasks/{task}/events/",
    "/api/v1/tasks/{task}/events/batch/",
    "/api/v1/leases/",
    "/api/v1/tasks/{task}/heartbeat/",
    "/api/v1/tasks/{task}/tool-calls/",
    "/api/v1/tool-calls/{key}/result/",
]


def staff_client(*, enforce_csrf_checks: bool = False) -> APIClient:
    client = APIClient(enforce_csrf_checks=enforce_csrf_checks)
    user, _ = User.objects.get_or_create(username="rita", is_staff=True)
    user.groups.add(role_group("Operators"))  # reads as a viewer; an operator is still no agent
    client.force_login(user)
    return client


@pytest.mark.parametrize("path", AGENT_ROUTES)
def test_each_agent_route_is_one_drf_view_of_its_operations(path: str) -> None:
    view = resolve(path.format(task="3f0c1f9e-8a0e-4a51-9d57-6c1f0f7f2a10", key="a" * 64)).func
    assert isinstance(view, AgentRoute) and issubclass(view.cls, AgentRouteView)
    assert {method for method in view.operations} == {
        method.upper() for method in ("get", "post") if method in vars(view.cls)}


def test_an_agents_task_read_is_two_statements(alice: AgentClient) -> None:
    task = create_task(alice)
    alice.get(f"/api/v1/tasks/{task['task_id']}/")  # the first request also notes the agent as seen
    with CaptureQueriesContext(connection) as queries:
        response = alice.get(f"/api/v1/tasks/{task['task_id']}/")
    assert response.status_code == 200
    sql = [q["sql"] for q in queries.captured_queries]
    # The token's agent with its rate-limit count, then the row: no queryset, no session.
    assert len(sql) == 2, sql
    assert "backplane_agent" in sql[0] and "backplane_cache" in sql[0] and "FROM backplane_task" in sql[1]


def test_a_staff_session_and_an_agent_read_the_same_bytes(alice: AgentClient) -> None:
    task = create_task(alice, input={"lead": "ana@example.com", "n": [1, 2.5, {"é": "\u2028"}]})
    as_agent = alice.get(f"/api/v1/tasks/{task['task_id']}/")
    as_staff = staff_client().get(f"/api/v1/tasks/{task['task_id']}/")
    assert as_agent.status_code == as_staff.status_code == 200
    assert as_agent.content == as_staff.content  # field order, separators, escapes
    assert b"\\u2028" in as_agent.content
    assert as_agent["Content-Type"] == as_staff["Content-Type"] == "application/json"
    assert as_agent["Allow"] == as_staff["Allow"] == "GET, HEAD, OPTIONS"


def test_an_append_answers_with_its_allow_header_and_replays(alice: AgentClient) -> None:
    task = create_task(alice)
    url = f"/api/v1/tasks/{task['task_id']}/events/"
    response = alice.post(url, {"type": "LeadScored", "payload": {"score": 1}, "idempotency_key": "k"}, format="json")
    assert response.status_code == 201
    assert response["Allow"] == "GET, POST, HEAD, OPTIONS"
    body = response.json()
    assert (body["seq"], body["type"], body["idempotency_key"]) == (2, "LeadScored", "k")
    again = alice.post(url, {"type": "LeadScored", "payload": {"score": 1}, "idempotency_key": "k"}, format="json")
    assert (again.status_code, again["Idempotent-Replay"], again.json()) == (200, "true", body)


def test_a_body_is_trimmed_checked_and_refused_with_each_fault_named(alice: AgentClient) -> None:
    task = create_task(alice)
    url = f"/api/v1/tasks/{task['task_id']}/events/"
    trimmed = alice.post(url, {"type": "LeadScored", "payload": {}, "idempotency_key": "  k  "}, format="json")
    assert trimmed.status_code == 201 and trimmed.json()["idempotency_key"] == "k"  # api/bodies.py trims
    error = assert_error(alice.post(url, {"type": "LeadScored", "payload": {}, "seq": 9}, format="json"),
                         400, "validation_error")
    assert error["details"] == {"seq": "Unknown field."}
    error = assert_error(alice.post(url, b'{"type": "LeadScored", "type": "X", "payload": {}}',
                                    content_type="application/json"), 400, "validation_error")
    assert "duplicate object key" in error["details"]["body"]
    error = assert_error(alice.post(url, b"", content_type="application/json"), 400, "validation_error")
    assert error["details"] == {"type": "This field is required.", "payload": "This field is required."}


def test_transport_errors_are_drfs_answers_in_the_contracts_shape(alice: AgentClient) -> None:
    task = create_task(alice)
    url = f"/api/v1/tasks/{task['task_id']}/"
    error = assert_error(alice.post(f"{url}events/", "type=LeadScored", content_type="text/plain"), 415,
                         "unsupported_media_type")
    assert error["message"] == 'Unsupported media type "text/plain" in request.'
    not_allowed = alice.delete(url)
    assert_error(not_allowed, 405, "method_not_allowed")
    assert not_allowed["Allow"] == "GET, HEAD, OPTIONS"
    unauthenticated = APIClient().get(url)
    assert_error(unauthenticated, 401, "not_authenticated")
    assert unauthenticated["WWW-Authenticate"] == 'Bearer realm="api"'
    assert unauthenticated["Allow"] == "GET, HEAD, OPTIONS"
    # Who is calling is decided before which method: a stranger learns nothing of the route.
    assert_error(APIClient().delete(url), 401, "not_authenticated")
    bad = APIClient()
    bad.credentials(HTTP_AUTHORIZATION="Bearer nope")
    assert_error(bad.get(url), 401, "not_authenticated")
    bad.credentials(HTTP_AUTHORIZATION="Bearer two words")
    assert_error(bad.get(url), 401, "not_authenticated")


def test_head_and_options(alice: AgentClient) -> None:
    task = create_task(alice)
    url = f"/api/v1/tasks/{task['task_id']}/"
    head = alice.head(url)
    assert (head.status_code, head.content, head["Content-Type"]) == (200, b"", "application/json")
    options = alice.options(f"{url}events/")
    assert (options.status_code, options.content, options["Allow"]) == (204, b"", "GET, POST, HEAD, OPTIONS")


def test_a_staff_session_write_is_checked_for_csrf_then_refused(alice: AgentClient) -> None:
    """CSRF first, as DRF decides it; then the route's own rule: staff do not write as agents."""
    task = create_task(alice)
    url = f"/api/v1/tasks/{task['task_id']}/events/"
    error = assert_error(staff_client(enforce_csrf_checks=True).post(url, {"type": "LeadScored", "payload": {}},
                                                                    format="json"), 403, "permission_denied")
    assert error["message"].startswith("CSRF Failed")
    refused = assert_error(staff_client().post(url, {"type": "LeadScored", "payload": {}}, format="json"),
                           403, "permission_denied")
    assert refused["message"].startswith("this route writes as an agent")
    assert Event.objects.filter(task_id=task["task_id"]).count() == 1


def test_a_user_who_is_not_staff_is_not_authenticated(alice: AgentClient) -> None:
    task = create_task(alice)
    client = APIClient()
    client.force_login(User.objects.create_user("walt"))
    assert_error(client.get(f"/api/v1/tasks/{task['task_id']}/"), 401, "not_authenticated")


def test_a_rotated_or_deactivated_token_stops_at_once(alice: AgentClient) -> None:
    task = create_task(alice)
    url = f"/api/v1/tasks/{task['task_id']}/"
    assert alice.get(url).status_code == 200
    agent = Agent.objects.get(name="alice")
    rotated = services.agent_rotate_token(agent_id=agent.pk)
    assert_error(alice.get(url), 401, "not_authenticated")
    alice.credentials(HTTP_AUTHORIZATION=f"Bearer {rotated.token}")
    assert alice.get(url).status_code == 200
    Agent.objects.filter(pk=agent.pk).update(is_active=False)
    assert_error(alice.get(url), 401, "not_authenticated")


def test_claim_heartbeat_and_tool_calls(alice: AgentClient) -> None:
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


def test_a_staff_session_cannot_claim() -> None:
    assert_error(staff_client().post("/api/v1/leases/", {}, format="json"), 403, "permission_denied")


def test_the_rate_limit_counters_write_no_wal() -> None:
    """Each request's count commits without waiting for a WAL flush (recovery migration 0007)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT relpersistence FROM pg_class WHERE relname = 'backplane_cache'")
        assert cursor.fetchone() == ("u",)
