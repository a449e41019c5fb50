"""Dashboard fixtures: staff and non-staff people, and a task with a realistic history."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from django.contrib.auth.models import Group, User
from django.test import Client

from backplane.eventlog import services
from backplane.eventlog.models import Task
from backplane.eventlog.writer import EventDraft
from recovery.leases import lease_claim
from recovery.subtasks import subtask_dispatch
from recovery.tool_calls import tool_call_dispatch, tool_call_record_result
from tests.api.conftest import alice, make_agent, mallory  # noqa: F401 - pytest fixtures
from tests.support.roles import role_group, staff_user


def reviewers_group() -> Group:
    """The group migrations make (backplane 0012, recovery 0013); an earlier test's flush
    (transactional tests) removes it."""
    return role_group("Reviewers")


@pytest.fixture
def olivia(db: None) -> User:
    """An on-call operator: staff in the Operators group, not a superuser."""
    return staff_user("olivia", "Operators", password="correct horse battery")


@pytest.fixture
def olivia_client(olivia: User) -> Client:
    client = Client()
    client.force_login(olivia)
    return client


@pytest.fixture
def victor(db: None) -> User:
    """A user who is not staff."""
    return User.objects.create_user("victor", password="correct horse battery")


@dataclass
class History:
    task: Task
    child: Task
    done_key: str
    in_flight_key: str
    epoch: int


@pytest.fixture
def make_history(db: None) -> Callable[..., History]:
    """A claimed task with reasoning, an answered and an in-flight tool call, and a sub-task."""

    def make(namespace: str = "acme", needle: str = "cus_NEEDLE_4711", agent_name: str = "qualifier-1") -> History:
        agent = services.agent_create(name=agent_name, namespace=namespace).agent
        task = services.task_create(namespace=namespace, kind="lead-qualification", input={"lead": "a@example.com"},
                                    agent=agent.name).task
        claim = lease_claim(agent=agent, kinds=None, lease_seconds=60)
        assert claim is not None and claim.task.pk == task.pk
        epoch = claim.lease_epoch
        services.event_append(namespace=namespace, task_id=task.pk, agent=agent.name, lease_epoch=epoch,
                              draft=EventDraft(type="ReasoningStepCompleted",
                                               payload={"step": 1, "thought": "look up"}))
        done = tool_call_dispatch(namespace=namespace, task_id=task.pk, step=1, tool="crm_lookup",
                                  input={"customer_id": needle}, agent=agent.name, lease_epoch=epoch)
        tool_call_record_result(namespace=namespace, key=done.call.pk, status="succeeded", result={"tier": "gold"},
                                agent=agent.name, lease_epoch=epoch)
        flying = tool_call_dispatch(namespace=namespace, task_id=task.pk, step=2, tool="send_email",
                                    input={"to": "a@example.com"}, agent=agent.name, lease_epoch=epoch)
        child = subtask_dispatch(namespace=namespace, parent_task_id=task.pk, step=3, kind="enrichment",
                                 input={"domain": "example.com"}, agent=agent.name, lease_epoch=epoch).child
        task.refresh_from_db()
        return History(task=task, child=child, done_key=done.call.pk, in_flight_key=flying.call.pk, epoch=epoch)

    return make


def html(response: Any) -> str:
    return response.content.decode()
