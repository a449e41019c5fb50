"""Cancel and pause with real processes: the product's web server and agent processes written
only against ``backplane_client.agent`` (``fleet_agent.py``).

- A staff cancel of a task an agent process is working on: the agent's next write is
  ``409 task_closed`` naming the cancellation, and it stops there.
- With kind A paused, an agent draining kinds A and B gets only B's tasks; once the pause is
  lifted, the next one gets A's.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from backplane.eventlog import services
from backplane.eventlog.models import Event, Task
from recovery import fleet
from tests.conftest import check_projections
from tests.e2e.conftest import ROOT, AgentRun, BackplaneServer, kill_those_still_running

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

AGENT = Path(__file__).resolve().parent / "fleet_agent.py"


@pytest.fixture
def fleet_agent(backplane_server: BackplaneServer) -> Iterator[Callable[..., AgentRun]]:
    started: list[AgentRun] = []

    def run(token: str, *, mode: str, kinds: list[str]) -> AgentRun:
        env = {k: v for k, v in os.environ.items() if k not in {"DJANGO_SETTINGS_MODULE", "DATABASE_URL"}}
        env["PYTHONPATH"] = str(ROOT)
        env["BACKPLANE_TOKEN"] = token
        argv = [sys.executable, str(AGENT), "--base-url", backplane_server.url, "--mode", mode,
                "--kinds", ",".join(kinds)]
        agent = AgentRun(subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                          text=True))
        started.append(agent)
        return agent

    yield run
    kill_those_still_running(started)


def wait_until(condition: Callable[[], bool], *, timeout: float = 20, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {what}")
        time.sleep(0.05)


def test_the_holder_of_a_cancelled_task_is_refused_at_its_next_write(
    committed_db: None, fleet_agent: Callable[..., AgentRun]
) -> None:
    namespace = f"e2e-{uuid.uuid4().hex[:8]}"
    token = services.agent_create(name="worker", namespace=namespace, kinds=()).token
    task = services.task_create(namespace=namespace, kind="outreach", agent="planner", input={}).task
    agent = fleet_agent(token, mode="work", kinds=["outreach"])
    # Working: a few steps are in its log before the cancel.
    wait_until(lambda: Event.objects.filter(task_id=task.pk, type="ReasoningStepCompleted").count() >= 3,
               what="the agent's first steps")
    fleet.task_cancel(namespace=None, task_id=task.pk, cancelled_by="user:dana", reason="prompt v7 loops",
                      compensate=False)

    assert agent.wait(timeout=30) == 0, agent.describe()
    (refused,) = agent.reported("refused")
    assert refused["status"] == 409 and refused["code"] == "task_closed", agent.describe()
    assert refused["details"]["status"] == "cancelled"
    assert refused["details"]["cancelled_by"] == "user:dana" and refused["details"]["reason"] == "prompt v7 loops"
    assert refused["details"]["cancelled_at"]
    # Nothing it sent after the cancel is in the log: the cancel is the last event.
    last = Event.objects.filter(task_id=task.pk).order_by("-seq").first()
    assert last is not None and last.type == "TaskCancelled"
    steps = Event.objects.filter(task_id=task.pk, type="ReasoningStepCompleted").count()
    assert steps == refused["step"] - 1
    assert Task.objects.get(pk=task.pk).status == "cancelled"
    assert check_projections()[0] == 0


def test_a_paused_kind_is_not_leased_while_other_kinds_are(
    committed_db: None, fleet_agent: Callable[..., AgentRun]
) -> None:
    namespace = f"e2e-{uuid.uuid4().hex[:8]}"
    token = services.agent_create(name="worker", namespace=namespace, kinds=()).token
    paused = [services.task_create(namespace=namespace, kind="enrich", agent="planner", input={"n": n}).task
              for n in range(3)]
    others = [services.task_create(namespace=namespace, kind="score", agent="planner", input={"n": n}).task
              for n in range(3)]
    pause = fleet.pause_set(namespace=namespace, kind="enrich", paused_by="user:dana", reason="CRM tool down")

    first = fleet_agent(token, mode="drain", kinds=["enrich", "score"])
    assert first.wait(timeout=30) == 0, first.describe()
    assert [r["kind"] for r in first.reported("completed")] == ["score"] * 3, first.describe()
    assert {r["task_id"] for r in first.reported("completed")} == {str(t.pk) for t in others}
    assert set(Task.objects.filter(pk__in=[t.pk for t in paused]).values_list("status", flat=True)) == {"pending"}
    assert not Event.objects.filter(task_id__in=[t.pk for t in paused], type="TaskClaimed").exists()

    fleet.pause_lift(pause_id=pause.pk, resumed_by="user:dana", reason="CRM fix deployed")
    second = fleet_agent(token, mode="drain", kinds=["enrich", "score"])
    assert second.wait(timeout=30) == 0, second.describe()
    # Oldest first, as claims always go.
    assert [r["task_id"] for r in second.reported("completed")] == [str(t.pk) for t in paused], second.describe()
    assert check_projections()[0] == 0
