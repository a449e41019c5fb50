"""API fixtures: agents with real tokens, clients that send them, row counts for 'changes nothing'."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from rest_framework.test import APIClient

from backplane.delivery.models import OutboxMessage
from backplane.eventlog import services
from backplane.eventlog.models import Event, Task
from recovery.models import ToolCall


class AgentClient(APIClient):
    agent_name: str
    namespace: str
    token: str


@pytest.fixture
def make_agent(db: None) -> Callable[..., AgentClient]:
    def make(name: str = "qualifier-1", namespace: str = "acme", kinds: tuple[str, ...] = ()) -> AgentClient:
        created = services.agent_create(name=name, namespace=namespace, kinds=kinds)
        client = AgentClient()
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {created.token}")
        client.agent_name, client.namespace, client.token = name, namespace, created.token
        return client

    return make


@pytest.fixture
def alice(make_agent) -> AgentClient:  # type: ignore[no-untyped-def]
    """An agent in namespace acme."""
    return make_agent("alice", "acme")


@pytest.fixture
def mallory(make_agent) -> AgentClient:  # type: ignore[no-untyped-def]
    """An agent in another namespace, globex."""
    return make_agent("mallory", "globex")


def row_counts() -> dict[str, int]:
    return {
        "tasks": Task.objects.count(),
        "events": Event.objects.count(),
        "outbox": OutboxMessage.objects.count(),
        "tool_calls": ToolCall.objects.count(),
    }


@pytest.fixture
def counts() -> Callable[[], dict[str, int]]:
    return row_counts


def create_task(client: APIClient, **body: Any) -> dict[str, Any]:
    body.setdefault("kind", "lead-qualification")
    body.setdefault("input", {"lead": "alice@example.com"})
    response = client.post("/api/v1/tasks/", body, format="json")
    assert response.status_code == 201, response.content
    return response.json()


def claim(client: APIClient, **body: Any) -> dict[str, Any]:
    response = client.post("/api/v1/leases/", body, format="json")
    assert response.status_code == 200, response.content
    return response.json()


def assert_error(response: Any, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.content
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message", "details"}, body
    assert body["error"]["code"] == code, body
    return body["error"]
