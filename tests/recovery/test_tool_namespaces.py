"""Tools per namespace: a namespace's tool shadows a global one of the same name, each tool row
has its own breaker and rate limit, and another namespace's tool does not exist for an agent."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import IntegrityError, transaction

from recovery.models import Tool
from tests.api.conftest import assert_error
from tests.recovery import test_tool_gateway
from tests.recovery.test_tool_gateway import AgentClient, ToolServer, agent_client, invoke, new_task

# The real HTTP tool of the gateway's tests, as this module's fixture ``tool_server``.
globals()["tool_server"] = test_tool_gateway.tool_server

DEAD_URL = "http://127.0.0.1:9/send"  # discard port: nothing listens, the call fails at once


@pytest.fixture
def acme(db: None) -> AgentClient:
    return agent_client("alice", "acme")


@pytest.fixture
def globex(db: None) -> AgentClient:
    return agent_client("gus", "globex")


def test_each_namespace_gets_its_own_tool_and_the_others_the_global_one(acme: AgentClient, globex: AgentClient,
                                                                         tool_server: ToolServer) -> None:
    Tool.objects.create(name="send-email", url=tool_server.url("/honest"), timeout_seconds=5)
    Tool.objects.create(name="send-email", namespace="acme", url=tool_server.url("/naive"), timeout_seconds=5)
    assert invoke(acme, new_task("acme")).status_code == 200
    assert invoke(globex, new_task("globex")).status_code == 200
    assert [seen.path for seen in tool_server.seen] == ["/naive", "/honest"]


def test_two_namespaces_with_a_same_named_tool_have_their_own_breakers(acme: AgentClient, globex: AgentClient,
                                                                       tool_server: ToolServer,
                                                                       settings: Any) -> None:
    settings.BACKPLANE_TOOL_BREAKER_THRESHOLD = 2
    broken = Tool.objects.create(name="send-email", namespace="acme", url=DEAD_URL, timeout_seconds=2)
    healthy = Tool.objects.create(name="send-email", namespace="globex", url=tool_server.url("/honest"),
                                  timeout_seconds=5)
    task = new_task("acme")
    for step in (1, 2):
        assert_error(invoke(acme, task, step=step), 502, "tool_unavailable")
    assert_error(invoke(acme, task, step=3), 503, "circuit_open")
    assert Tool.objects.get(pk=broken.pk).breaker_state == "open"

    answered = invoke(globex, new_task("globex"))
    assert answered.status_code == 200, answered.content
    assert Tool.objects.get(pk=healthy.pk).breaker_state == "closed" and tool_server.calls() == 1


def test_two_namespaces_with_a_same_named_tool_have_their_own_rate_limits(acme: AgentClient, globex: AgentClient,
                                                                          tool_server: ToolServer) -> None:
    for namespace in ("acme", "globex"):
        Tool.objects.create(name="send-email", namespace=namespace, url=tool_server.url("/honest"), timeout_seconds=5,
                            rate_limit_per_minute=1)
    acme_task, globex_task = new_task("acme"), new_task("globex")
    assert invoke(acme, acme_task, step=1).status_code == 200
    assert_error(invoke(acme, acme_task, step=2), 429, "rate_limited")
    assert invoke(globex, globex_task, step=1).status_code == 200
    assert_error(invoke(globex, globex_task, step=2), 429, "rate_limited")
    assert tool_server.calls() == 2


def test_another_namespaces_tool_is_not_found(acme: AgentClient, globex: AgentClient,
                                              tool_server: ToolServer) -> None:
    Tool.objects.create(name="crm-lookup", namespace="acme", url=tool_server.url("/honest"), timeout_seconds=5)
    assert_error(invoke(globex, new_task("globex"), tool="crm-lookup"), 404, "not_found")
    assert tool_server.calls() == 0
    assert invoke(acme, new_task("acme"), tool="crm-lookup").status_code == 200


def test_a_namespaces_inactive_tool_still_shadows_the_global_one(acme: AgentClient, tool_server: ToolServer) -> None:
    Tool.objects.create(name="send-email", url=tool_server.url("/honest"), timeout_seconds=5)
    Tool.objects.create(name="send-email", namespace="acme", url=tool_server.url("/naive"), timeout_seconds=5,
                        is_active=False)
    assert_error(invoke(acme, new_task("acme")), 404, "not_found")
    assert tool_server.calls() == 0


def test_a_name_is_unique_within_a_namespace(db: None) -> None:
    Tool.objects.create(name="send-email", namespace="acme", url=DEAD_URL)
    Tool.objects.create(name="send-email", url=DEAD_URL)
    with pytest.raises(IntegrityError), transaction.atomic():
        Tool.objects.create(name="send-email", namespace="acme", url=DEAD_URL)
    with pytest.raises(IntegrityError), transaction.atomic():
        Tool.objects.create(name="send-email", url=DEAD_URL)
