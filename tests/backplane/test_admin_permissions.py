"""Least privilege in the admin: every action declares the permission it needs, and a staff user
who may only look at agents and tools can neither rotate a token nor close a breaker."""

from __future__ import annotations

import pytest
from django.contrib import admin
from django.contrib.auth.models import Permission, User
from django.contrib.messages import get_messages
from django.test import Client
from django.utils import timezone

from backplane.eventlog import services
from backplane.eventlog.models import Agent
from recovery.models import Tool


def _staff(name: str, *codenames: str) -> Client:
    user = User.objects.create_user(name, password="pw-for-tests-only", is_staff=True)
    user.user_permissions.add(*Permission.objects.filter(codename__in=codenames))
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def viewer(db: None) -> Client:
    return _staff("vera", "view_agent", "view_tool")


@pytest.fixture
def operator(db: None) -> Client:
    return _staff("otto", "view_agent", "change_agent", "view_tool", "change_tool")


@pytest.fixture
def open_agent(db: None) -> Agent:
    agent = services.agent_create(name="qualifier-1", namespace="acme").agent
    Agent.objects.filter(pk=agent.pk).update(breaker_state="open", consecutive_failures=3,
                                             breaker_opened_at=timezone.now())
    return Agent.objects.get(pk=agent.pk)


@pytest.fixture
def open_tool(db: None) -> Tool:
    return Tool.objects.create(name="send-email", url="https://tools.example.com/send", breaker_state="open",
                               consecutive_failures=3, opened_at=timezone.now())


def test_every_admin_action_declares_its_permission() -> None:
    for model_admin in admin.site._registry.values():
        for action in model_admin.actions or ():
            function = getattr(model_admin, action) if isinstance(action, str) else action
            permissions = getattr(function, "allowed_permissions", None)
            assert permissions, f"{type(model_admin).__name__}.{action}"
            for permission in permissions:
                assert hasattr(model_admin, f"has_{permission}_permission")


def test_a_viewer_is_not_offered_the_agent_and_tool_actions(viewer: Client, open_agent: Agent,
                                                            open_tool: Tool) -> None:
    agents = viewer.get("/admin/backplane/agent/")
    tools = viewer.get("/admin/recovery/tool/")
    assert agents.status_code == tools.status_code == 200
    for page in (agents, tools):
        assert b"rotate_tokens" not in page.content and b"reset_breakers" not in page.content


def test_a_viewer_cannot_rotate_a_token_with_a_forged_post(viewer: Client, open_agent: Agent) -> None:
    before = open_agent.token_hash
    response = viewer.post("/admin/backplane/agent/",
                           {"action": "rotate_tokens", "_selected_action": [open_agent.pk], "index": 0})
    assert b'class="token"' not in response.content
    assert Agent.objects.get(pk=open_agent.pk).token_hash == before


def test_a_viewer_cannot_close_an_agent_or_tool_breaker_with_a_forged_post(viewer: Client, open_agent: Agent,
                                                                            open_tool: Tool) -> None:
    viewer.post("/admin/backplane/agent/", {"action": "reset_breakers", "_selected_action": [open_agent.pk]})
    viewer.post("/admin/recovery/tool/", {"action": "reset_breakers", "_selected_action": [open_tool.pk]})
    assert Agent.objects.get(pk=open_agent.pk).breaker_state == "open"
    assert Tool.objects.get(pk=open_tool.pk).breaker_state == "open"


def test_a_user_with_the_change_permission_closes_breakers(operator: Client, open_agent: Agent,
                                                           open_tool: Tool) -> None:
    assert b"reset_breakers" in operator.get("/admin/recovery/tool/").content
    operator.post("/admin/backplane/agent/", {"action": "reset_breakers", "_selected_action": [open_agent.pk]})
    operator.post("/admin/recovery/tool/", {"action": "reset_breakers", "_selected_action": [open_tool.pk]})
    assert Agent.objects.get(pk=open_agent.pk).breaker_state == "closed"
    assert Tool.objects.get(pk=open_tool.pk).breaker_state == "closed"


def test_a_rotated_token_is_shown_once_on_its_own_uncached_page(operator: Client, open_agent: Agent) -> None:
    response = operator.post("/admin/backplane/agent/",
                             {"action": "rotate_tokens", "_selected_action": [open_agent.pk]})
    assert response.status_code == 200 and "no-store" in response["Cache-Control"]
    token = response.content.decode().split('<code class="token">')[1].split("<")[0]
    assert Agent.objects.get(pk=open_agent.pk).token_matches(token)
    assert not list(get_messages(response.wsgi_request)) and token not in str(response.cookies)
    assert token not in operator.get("/admin/backplane/agent/").content.decode()
