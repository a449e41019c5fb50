"""The JavaScript agent (examples/node-agent/agent.mjs) against the real web process.

It speaks only the REST contract. Its first run is killed by its test hook right after the
tool answered through the proxy; once that lease has run out and the stall detector has swept
it, its second run claims the task as recovered, reads the recovery context, skips step 1, gets
the tool's answer from the record and completes. The tool acts once and the chain verifies.
A task cancelled while the agent waits on its tool stops the agent's work at the next heartbeat.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from backplane.eventlog import services
from backplane_client.agent import AgentClient
from recovery.models import Tool
from tests.conftest import check_projections
from tests.e2e.conftest import (
    AgentRun,
    BackplaneServer,
    ToolServer,
    kill_those_still_running,
    sweep_once_the_lease_ran_out,
)

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

AGENT = Path(__file__).resolve().parents[2] / "examples" / "node-agent" / "agent.mjs"
KIND = "outreach"
TOOL = "send-email"
TOOL_STEP = 2
LEASE_SECONDS = 2  # short, so the dead run's lease runs out quickly


def node_binary() -> str:
    """Node from PATH; the full tier must run this test, so a missing one fails it (never a skip)."""
    path = shutil.which("node")
    if path is None:
        pytest.fail("node is not on PATH: run `make node` (the full tier runs the JavaScript agent)")
    return path


@pytest.fixture
def namespace(committed_db: None, backplane_server: BackplaneServer) -> Iterator[str]:
    """A fresh namespace; afterwards the server logged no error and every row replays from its log."""
    log_start = backplane_server.log_size()
    yield f"node-{uuid.uuid4().hex[:8]}"
    log = backplane_server.log(log_start)
    assert "Traceback" not in log and " ERROR " not in log, log[-6000:]
    code, report = check_projections()
    assert code == 0, report


@pytest.fixture
def start_agent(backplane_server: BackplaneServer) -> Iterator[Callable[..., AgentRun]]:
    """Starts ``node agent.mjs`` for one task; whatever still runs at the end is killed."""
    started: list[AgentRun] = []

    def start(token: str, **env: str) -> AgentRun:
        environment = {"PATH": os.environ.get("PATH", ""), "BACKPLANE_URL": backplane_server.url,
                       "BACKPLANE_TOKEN": token, "AGENT_KIND": KIND, "AGENT_TOOL": TOOL,
                       "AGENT_LEASE_SECONDS": str(LEASE_SECONDS), "AGENT_MAX_TASKS": "1", **env}
        agent = AgentRun(subprocess.Popen([node_binary(), str(AGENT)], env=environment, stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, text=True))
        started.append(agent)
        return agent

    yield start
    kill_those_still_running(started)


def test_it_recovers_after_its_own_crash_without_calling_the_tool_twice(
    namespace: str, backplane_server: BackplaneServer, tool_server: ToolServer,
    start_agent: Callable[..., AgentRun],
) -> None:
    token = services.agent_create(name="node-agent", namespace=namespace, kinds=(KIND,)).token
    observer_token = services.agent_create(name="planner", namespace=namespace).token
    Tool.objects.create(name=TOOL, namespace=namespace, url=tool_server.url(TOOL), timeout_seconds=5)

    with AgentClient(backplane_server.url, observer_token) as observer:
        task_id = observer.create_task(KIND, {"to": "alice@example.com", "subject": "Your quote"})["task_id"]
        key = hashlib.sha256(f"{task_id}:{TOOL_STEP}:{TOOL}".encode()).hexdigest()

        first = start_agent(token, AGENT_CRASH_AFTER="tool-call")
        assert first.wait() == -signal.SIGKILL, first.describe()
        assert [(r["task_id"], r["recovered"]) for r in first.reported("claimed")] == [(task_id, False)]
        [answered] = first.reported("tool-answered")
        assert (answered["key"], answered["status"], answered["replayed"]) == (key, "succeeded", False)
        assert first.reported("test-crash") and not first.reported("completed")
        assert (tool_server.requests[key], tool_server.effects[key]) == (1, 1)

        # Started while the dead run's lease still holds the task: it polls through the 204s.
        second = start_agent(token)
        sweep_once_the_lease_ran_out(observer, task_id, lease_seconds=LEASE_SECONDS)
        assert second.wait() == 0, second.describe()
        assert [(r["task_id"], r["recovered"]) for r in second.reported("claimed")] == [(task_id, True)]
        [context] = second.reported("context")
        assert (context["attempt"], context["completed_steps"]) == (2, [1])
        assert second.reported("skip-step") == [{"event": "skip-step", "task_id": task_id, "step": 1}]
        [replayed] = second.reported("tool-answered")
        assert (replayed["key"], replayed["status"], replayed["replayed"]) == (key, "succeeded", True)
        assert second.reported("completed") == [{"event": "completed", "task_id": task_id}]

        task = observer.get_task(task_id)
        assert (task["status"], task["lease"]) == ("completed", None)
        assert task["output"] == {"tool_result": tool_server.answers[key]}
        assert (tool_server.requests[key], tool_server.effects[key]) == (1, 1)
        assert observer.verify(task_id) == {"valid": True, "checked": task["last_seq"],
                                            "head_hash": task["head_hash"], "first_invalid_seq": None}
        events = list(observer.iter_events(task_id))
        assert [(e["type"], e["payload"].get("step")) for e in events] == [
            ("TaskStarted", None),
            ("TaskClaimed", None),
            ("ReasoningStepCompleted", 1),
            ("ToolCallDispatched", TOOL_STEP),
            ("ToolCallResultReceived", TOOL_STEP),
            ("TaskStalled", None),
            ("TaskClaimed", None),
            ("ReasoningStepCompleted", 3),
            ("TaskCompleted", None),
        ]
        assert [e["idempotency_key"] for e in events if e["agent"] == "node-agent" and e["type"] in (
            "ReasoningStepCompleted", "TaskCompleted")] == [f"{task_id}:reasoning:1", f"{task_id}:reasoning:3",
                                                             f"{task_id}:completed"]


class HeldTool:
    """A tool that holds each request until ``release`` is set, so the agent waits on it."""

    def __init__(self) -> None:
        self.arrived = threading.Event()
        self.release = threading.Event()
        self.answered = threading.Event()
        tool = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                tool.arrived.set()
                tool.release.wait(timeout=10)
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")
                tool.answered.set()

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/{TOOL}"
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def close(self) -> None:
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def held_tool() -> Iterator[HeldTool]:
    tool = HeldTool()
    try:
        yield tool
    finally:
        tool.close()


def test_it_stops_working_on_a_task_cancelled_under_its_lease(
    namespace: str, backplane_server: BackplaneServer, held_tool: HeldTool, start_agent: Callable[..., AgentRun],
) -> None:
    token = services.agent_create(name="node-agent", namespace=namespace, kinds=(KIND,)).token
    observer_token = services.agent_create(name="planner", namespace=namespace).token
    Tool.objects.create(name=TOOL, namespace=namespace, url=held_tool.url, timeout_seconds=10)

    with AgentClient(backplane_server.url, observer_token) as observer:
        task_id = observer.create_task(KIND, {"to": "alice@example.com"})["task_id"]
        agent = start_agent(token)
        assert held_tool.arrived.wait(timeout=10), agent.describe()

        cancelled = httpx.post(f"{backplane_server.url}/api/v1/tasks/{task_id}/cancel/",
                               json={"reason": "the customer withdrew"},
                               headers={"Authorization": f"Bearer {observer_token}"})
        assert cancelled.status_code == 200, cancelled.text
        # The tool still holds the call: the agent gives up on it, it does not wait for the answer.
        assert agent.wait(timeout=3 * LEASE_SECONDS) == 0, agent.describe()
        assert not held_tool.answered.is_set()
        assert agent.reported("lease-lost") == [{"event": "lease-lost", "task_id": task_id, "code": "task_closed"}]
        assert not agent.reported("tool-answered") and not agent.reported("completed")

        held_tool.release.set()
        assert held_tool.answered.wait(timeout=5)
        task = observer.get_task(task_id)
        assert (task["status"], task["lease"]) == ("cancelled", None)
        # Nothing after the cancellation: the agent wrote neither step 3 nor a completion.
        assert [(e["type"], e["payload"].get("step")) for e in observer.iter_events(task_id)] == [
            ("TaskStarted", None),
            ("TaskClaimed", None),
            ("ReasoningStepCompleted", 1),
            ("ToolCallDispatched", TOOL_STEP),
            ("TaskCancelled", None),
        ]


@pytest.mark.parametrize("verdict", ["approve", "deny"])
def test_it_waits_for_people_and_then_calls_the_tool_once_or_fails_the_task(
    namespace: str, backplane_server: BackplaneServer, tool_server: ToolServer,
    start_agent: Callable[..., AgentRun], verdict: str,
) -> None:
    """A tool policy gates every call of the tool: the agent waits for the decision (its lease kept
    by its heartbeats), then the tool acts once, or the task fails with the denial."""
    from recovery import approvals
    from recovery.models import ApprovalRequest
    from tests.support.roles import staff_user

    approver = staff_user(f"ana-{verdict}", "Approvers")
    approvals.tool_policy_set(tool=TOOL, namespace=namespace, approver_group="Approvers", set_by="user:olivia",
                              reason="every e-mail to a customer is read first")
    token = services.agent_create(name="node-agent", namespace=namespace, kinds=(KIND,)).token
    observer_token = services.agent_create(name="planner", namespace=namespace).token
    Tool.objects.create(name=TOOL, namespace=namespace, url=tool_server.url(TOOL), timeout_seconds=5)
    with AgentClient(backplane_server.url, observer_token) as observer:
        task_id = observer.create_task(KIND, {"to": "alice@example.com", "subject": "Your quote"})["task_id"]
        agent = start_agent(token, AGENT_LEASE_SECONDS="30")
        deadline = time.monotonic() + 30
        while (request := ApprovalRequest.objects.filter(task_id=task_id).first()) is None:
            assert agent.process.poll() is None and time.monotonic() < deadline, agent.describe()
            time.sleep(0.05)
        time.sleep(0.5)
        assert not tool_server.requests, "the tool was called before the decision"
        approvals.approval_decide(approval_id=request.pk, user=approver, verdict=verdict, reason="read it")
        assert agent.wait(timeout=60) == 0, agent.describe()
        assert [r["status"] for r in agent.reported("approval-decided")] == [
            "granted" if verdict == "approve" else "denied"]
        task = observer.get_task(task_id)
        if verdict == "approve":
            key = hashlib.sha256(f"{task_id}:{TOOL_STEP}:{TOOL}".encode()).hexdigest()
            assert task["status"] == "completed" and tool_server.effects == {key: 1}
        else:
            assert task["status"] == "failed" and not tool_server.requests
            assert agent.reported("refused")[0]["code"] == "approval_denied"
