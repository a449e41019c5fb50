"""The tool gateway behind the outbound guard (backplane/delivery/outbound.py): a tool at an
address that is neither public nor allowed is never called, its caller gets the answer of an
unreachable tool, and its breaker counts it like a connection failure. The real tool of
test_tool_gateway.py listens on 127.0.0.1, which an empty allow list forbids."""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from recovery.models import Tool, ToolCall
from tests.api.conftest import assert_error
from tests.recovery import test_tool_gateway
from tests.recovery.test_tool_gateway import AgentClient, ToolServer, invoke, key_of, new_task, tool_events

# The real HTTP tool of the gateway's tests, its agent and its tool factory, as this module's fixtures.
for _fixture in ("tool_server", "alice", "make_tool"):
    globals()[_fixture] = getattr(test_tool_gateway, _fixture)

SETTING = "BACKPLANE_OUTBOUND_ALLOWED_NETWORKS"


def test_a_tool_at_a_forbidden_address_is_not_called_and_the_caller_gets_tool_unavailable(
        alice: AgentClient, make_tool: Callable[..., Tool], tool_server: ToolServer, settings: Any) -> None:
    settings.BACKPLANE_OUTBOUND_ALLOWED_NETWORKS = []
    tool = make_tool()
    task = new_task()

    error = assert_error(invoke(alice, task), 502, "tool_unavailable")

    assert error["message"] == f"tool send-email: refused: 127.0.0.1 is a loopback address; allow it with {SETTING}"
    assert error["details"] == {"tool": "send-email"}
    assert tool_server.calls() == 0
    # Like a refused connection: the call stays in flight and the breaker counts a failure.
    assert ToolCall.objects.get(pk=key_of(task, 1)).status == "dispatched"
    assert [t for t, _ in tool_events(task)] == ["ToolCallDispatched"]
    tool.refresh_from_db()
    assert tool.consecutive_failures == 1 and tool.last_error.startswith("tool send-email: refused: 127.0.0.1")


def test_a_tool_named_by_a_host_that_resolves_to_a_forbidden_address_is_refused_too(
        alice: AgentClient, tool_server: ToolServer, settings: Any) -> None:
    settings.BACKPLANE_OUTBOUND_ALLOWED_NETWORKS = []
    Tool.objects.create(name="send-email", url=tool_server.url("/honest").replace("127.0.0.1", "localhost"),
                        timeout_seconds=5)

    error = assert_error(invoke(alice, new_task()), 502, "tool_unavailable")

    assert error["message"].startswith("tool send-email: refused: localhost (")
    assert error["message"].endswith(f"is a loopback address; allow it with {SETTING}")
    assert tool_server.calls() == 0


def test_the_allow_list_lets_the_same_tool_be_called(alice: AgentClient, make_tool: Callable[..., Tool],
                                                     tool_server: ToolServer, settings: Any) -> None:
    settings.BACKPLANE_OUTBOUND_ALLOWED_NETWORKS = []
    make_tool()
    task = new_task()
    assert_error(invoke(alice, task), 502, "tool_unavailable")

    settings.BACKPLANE_OUTBOUND_ALLOWED_NETWORKS = [ipaddress.ip_network("127.0.0.1/32")]
    answer = invoke(alice, task)

    assert answer.status_code == 200 and answer.json()["status"] == "succeeded"
    assert tool_server.calls() == 1


@pytest.mark.parametrize(("url", "refusal"), [
    ("http://169.254.169.254/latest/meta-data/", "169.254.169.254 is a link-local address"),
    ("https://10.0.0.5/tools/crm", "10.0.0.5 is a private address"),
    ("http://[fe80::1]:8080/", "fe80::1 is a link-local address"),
])
def test_the_admin_refuses_a_tool_at_a_literal_address_the_gateway_would_refuse(db: None, url: str,
                                                                                refusal: str) -> None:
    staff = Client()
    staff.force_login(User.objects.create_superuser("root", "", "pw-for-tests-only"))
    form = {"name": "crm-lookup", "namespace": "", "url": url, "timeout_seconds": 5, "rate_limit_per_minute": 0,
            "ttl_seconds": 3600, "is_active": "on"}

    page = staff.post("/admin/recovery/tool/add/", form)

    assert page.status_code == 200
    assert f"refused: {refusal}; allow it with {SETTING}" in page.content.decode()
    assert not Tool.objects.exists()
    saved = staff.post("/admin/recovery/tool/add/", {**form, "url": "https://crm.example.com/lookup"})
    assert saved.status_code == 302 and Tool.objects.get().url == "https://crm.example.com/lookup"
