"""The TypeScript client (clients/typescript) against the product's real web process.

1. Its own suites: ``npm test`` (offline: the shared vectors, integrity checks, usage adapters,
   error classes of the contract's table, retries, the generated types against docs/openapi.yaml)
   and ``npm run test:server`` (a session, tool calls, refusals, sub-agents, replays, approvals,
   personal data, seals and proofs, against this server). For the last three this side sets the
   scene the suite cannot: a tool policy and a person who decides, and two seals.
2. Crash and recovery: an agent process written with the client (test/agents/crash-agent.mjs)
   is SIGKILLed right after the tool answered, before or after the answer was recorded; once its
   lease has run out and the stall detector swept it, a second process claims the task as
   recovered, skips what the log has and completes. The tool acted once; the chain verifies.
3. Replay: the client's ``replay`` of a finished task in a sandbox fork: unchanged, no drift;
   with the prompt changed, the ``LLMCalled`` is the first divergence; with the tool's answer
   edited, its ``ToolCallResultReceived``. No replay reaches the tool. A replay of a recovered
   task differs from it by the stall alone.

Node and npm come from PATH; a missing one fails the test (``make node``), never skips it.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User

from backplane.eventlog import services
from backplane.eventlog.writer import EventDraft
from backplane.integrity import sealing
from backplane_client.agent import AgentClient
from recovery import approvals
from recovery.models import ApprovalRequest, ApprovalStatus, Tool
from tests.conftest import check_projections
from tests.e2e.conftest import (
    ROOT,
    AgentRun,
    BackplaneServer,
    ToolServer,
    kill_those_still_running,
    sweep_once_the_lease_ran_out,
)
from tests.support.roles import staff_user

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

CLIENT = ROOT / "clients" / "typescript"
AGENTS = CLIENT / "test" / "agents"
KIND = "ts-outreach"
CHILD_KIND = "ts-research"
TOOL = "send-email"  # the tool the agents call themselves, through the proxy
GATEWAY_TOOL = "ts-gateway-tool"  # the tool the backplane calls for them (invoke)
GATED_TOOL = "ts-gated-email"  # every call asks a person first (test/server/approvals.test.mjs)
TOOL_STEP = 3  # outreach.mjs's STEPS.send
LEASE_SECONDS = 2  # short, so a dead run's lease runs out quickly


def binary(name: str) -> str:
    """Node or npm from PATH; the full tier must run these tests, so a missing one fails them."""
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is not on PATH: run `make node` (the full tier runs the TypeScript client)")
    return path


def run(argv: list[str], *, env: dict[str, str] | None = None,
        timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=CLIENT, env=env, capture_output=True, text=True, timeout=timeout, check=False)


def node_env(**extra: str) -> dict[str, str]:
    return {"PATH": os.environ.get("PATH", ""), "HOME": os.environ.get("HOME", str(Path.home())), **extra}


@pytest.fixture(scope="module")
def built_client() -> Path:
    """The client's dev dependencies (`npm ci`, only when node_modules is absent) and its build."""
    npm = binary("npm")
    binary("node")
    if not (CLIENT / "node_modules").is_dir():
        installed = run([npm, "ci", "--no-audit", "--no-fund"], env=node_env())
        assert installed.returncode == 0, installed.stdout[-4000:] + installed.stderr[-4000:]
    built = run([npm, "run", "build"], env=node_env())
    assert built.returncode == 0, built.stdout[-4000:] + built.stderr[-4000:]
    return CLIENT / "dist" / "index.js"


@pytest.fixture
def namespace(committed_db: None, backplane_server: BackplaneServer) -> Iterator[str]:
    """A fresh namespace; afterwards the server logged no error and every row replays from its log."""
    log_start = backplane_server.log_size()
    yield f"ts-{uuid.uuid4().hex[:8]}"
    log = backplane_server.log(log_start)
    assert "Traceback" not in log and " ERROR " not in log, log[-6000:]
    code, report = check_projections()
    assert code == 0, report


def observer_token(namespace: str) -> str:
    return services.agent_create(name="planner", namespace=namespace).token


def agent_token(namespace: str, name: str = "ts-agent") -> str:
    return services.agent_create(name=name, namespace=namespace, kinds=(KIND, CHILD_KIND)).token


def seal_everything() -> dict[str, Any]:
    """What the sealer in Celery beat does, run here until nothing is left; the head it signed."""
    while sealing.seal_new_events().sealed:
        pass
    head = sealing.latest_head()
    return {"tree_size": head.tree_size, "root_hash": head.root_hash, "signed_at": head.signed_at,
            "signature": head.signature}


def sealed_twice(namespace: str) -> tuple[str, dict[str, Any]]:
    """A task of the namespace sealed in an earlier head, and that head; then one more event and
    a second seal, so the latest head is a larger tree the earlier one is a prefix of."""
    task = services.task_create(namespace=namespace, kind=KIND, agent="planner", input={"lead": "ada"}).task
    services.event_append(namespace=namespace, task_id=task.pk, agent="planner",
                          draft=EventDraft(type="Noted", payload={"sealed": True}))
    earlier = seal_everything()
    services.task_create(namespace=namespace, kind=KIND, agent="planner", input={"lead": "bob"})
    assert seal_everything()["tree_size"] > earlier["tree_size"]
    return str(task.pk), earlier


def decide_while_running(suite: subprocess.Popen[str], namespace: str, approver: User,
                         timeout: float = 600) -> list[str]:
    """A person in the policy's approver group decides each request of the namespace as its tool
    input's ``verdict`` says, through the approvals service (the dashboard's path), until the
    suite exits; the verdicts given, in order."""
    given: list[str] = []
    deadline = time.monotonic() + timeout
    while suite.poll() is None:
        assert time.monotonic() < deadline, "test:server still running"
        for request in ApprovalRequest.objects.filter(task__namespace=namespace, status=ApprovalStatus.PENDING):
            verdict = request.input.get("verdict", "deny")
            approvals.approval_decide(approval_id=request.pk, user=approver, verdict=verdict, reason="read it")
            given.append(verdict)
        time.sleep(0.05)
    return given


def test_its_offline_and_server_suites_pass(
    built_client: Path, namespace: str, backplane_server: BackplaneServer, tool_server: ToolServer,
) -> None:
    npm = binary("npm")
    offline = run([npm, "test"], env=node_env())
    assert offline.returncode == 0, offline.stdout[-6000:] + offline.stderr[-3000:]
    assert "# fail 0" in offline.stdout and "# pass 0" not in offline.stdout, offline.stdout[-2000:]

    Tool.objects.create(name=GATEWAY_TOOL, namespace=namespace, url=tool_server.url(GATEWAY_TOOL), timeout_seconds=5)
    # The approver first: a flush after an earlier module's committed tests removes the role groups
    # the migrations made, and staff_user makes its group again.
    approver = staff_user("ts-approver", "Approvers")
    approvals.tool_policy_set(tool=GATED_TOOL, namespace=namespace, approver_group="Approvers",
                              set_by="user:olivia", reason="every e-mail to a lead is read first")
    sealed_task, earlier_head = sealed_twice(namespace)
    # Output to files, not pipes: a pipe nobody reads while the suite runs could fill and stall it.
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        env = node_env(
            BACKPLANE_URL=backplane_server.url, BACKPLANE_TOKEN=agent_token(namespace), BACKPLANE_KIND=KIND,
            BACKPLANE_CHILD_KIND=CHILD_KIND, BACKPLANE_TOOL=GATEWAY_TOOL, BACKPLANE_GATED_TOOL=GATED_TOOL,
            BACKPLANE_SEALED_TASK=sealed_task, BACKPLANE_EARLIER_TREE_HEAD=json.dumps(earlier_head),
            BACKPLANE_PUBLIC_KEY=sealing.public_key_hex())
        suite = subprocess.Popen([npm, "run", "test:server"], cwd=CLIENT, stdout=out, stderr=err, text=True, env=env)
        try:
            verdicts = decide_while_running(suite, namespace, approver)
        finally:
            if suite.poll() is None:
                suite.kill()
            suite.wait()
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    assert suite.returncode == 0, stdout[-8000:] + stderr[-3000:]
    assert "# fail 0" in stdout and "# pass 0" not in stdout and "# skipped 0" in stdout, stdout[-2000:]
    # One request granted, one denied (test/server/approvals.test.mjs), each decided once.
    assert verdicts == ["approve", "deny"]
    # The gateway called the registered tool for the session's step 5, once for two invokes.
    assert sum(tool_server.effects.values()) == 1 and sum(tool_server.requests.values()) == 1


@pytest.fixture
def start_agent(built_client: Path, backplane_server: BackplaneServer, tool_server: ToolServer
                ) -> Iterator[Callable[..., AgentRun]]:
    """Starts ``node crash-agent.mjs`` for one task; whatever still runs at the end is killed."""
    started: list[AgentRun] = []

    def start(token: str, **env: str) -> AgentRun:
        environment = node_env(BACKPLANE_URL=backplane_server.url, BACKPLANE_TOKEN=token, AGENT_KIND=KIND,
                               AGENT_LEASE_SECONDS=str(LEASE_SECONDS), TOOL_URL=f"http://127.0.0.1:{tool_server.port}",
                               **env)
        agent = AgentRun(subprocess.Popen([binary("node"), str(AGENTS / "crash-agent.mjs")], cwd=CLIENT,
                                          env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        started.append(agent)
        return agent

    yield start
    kill_those_still_running(started)


def finished_after_a_crash(namespace: str, observer: AgentClient, tool_server: ToolServer,
                           start_agent: Callable[..., AgentRun], crash_after: str
                           ) -> tuple[str, str, AgentRun, AgentRun]:
    token = agent_token(namespace)
    task_id = observer.create_task(KIND, {"to": "alice@example.com"})["task_id"]
    first = start_agent(token, AGENT_CRASH_AFTER=crash_after)
    assert first.wait() == -signal.SIGKILL, first.describe()
    second = start_agent(token)  # polls through the 204s while the dead run's lease holds the task
    sweep_once_the_lease_ran_out(observer, task_id, lease_seconds=LEASE_SECONDS)
    assert second.wait() == 0, second.describe()
    key = hashlib.sha256(f"{task_id}:{TOOL_STEP}:{TOOL}".encode()).hexdigest()
    return task_id, key, first, second


@pytest.mark.parametrize("crash_after", ["tool-answered", "tool-recorded"])
def test_an_agent_killed_after_its_tool_answered_recovers_and_the_tool_acts_once(
    namespace: str, backplane_server: BackplaneServer, tool_server: ToolServer,
    start_agent: Callable[..., AgentRun], crash_after: str,
) -> None:
    with AgentClient(backplane_server.url, observer_token(namespace)) as observer:
        task_id, key, first, second = finished_after_a_crash(namespace, observer, tool_server, start_agent, crash_after)

        assert [(r["task_id"], r["recovered"]) for r in first.reported("claimed")] == [(task_id, False)]
        assert [r["key"] for r in first.reported("tool-answered")] == [key]
        assert first.reported("test-crash") == [{"event": "test-crash", "after": crash_after}]
        assert [(r["task_id"], r["recovered"], r["attempt"]) for r in second.reported("claimed")] == [
            (task_id, True, 2)]
        [context] = second.reported("context")
        assert (context["attempt"], context["completed_steps"]) == (2, [1])
        # The model was asked once, by the first run: the second got its answer from the log.
        assert len(first.reported("model-asked")) == 1 and not second.reported("model-asked")
        [recorded] = second.reported("tool-recorded")
        if crash_after == "tool-answered":
            # In flight: asked again under the same key, answered from the tool's own record.
            assert context["in_flight"] == [TOOL_STEP]
            assert [r["key"] for r in second.reported("tool-requested")] == [key]
            assert (recorded["status"], recorded["needed"]) == ("succeeded", True)
            assert (tool_server.requests[key], tool_server.effects[key]) == (2, 1)
        else:
            assert context["in_flight"] == [] and not second.reported("tool-requested")
            assert (recorded["status"], recorded["needed"], recorded["replayed"]) == ("succeeded", False, True)
            assert (tool_server.requests[key], tool_server.effects[key]) == (1, 1)
        assert second.reported("completed") == [{"event": "completed", "task_id": task_id}]

        task = observer.get_task(task_id)
        assert (task["status"], task["lease"]) == ("completed", None)
        assert task["output"]["email"] == tool_server.answers[key]
        assert observer.verify(task_id) == {"valid": True, "checked": task["last_seq"],
                                            "head_hash": task["head_hash"], "first_invalid_seq": None}
        types = [(e["type"], e["payload"].get("step")) for e in observer.iter_events(task_id)]
        results = [("ToolCallResultReceived", TOOL_STEP)]
        assert types == [
            ("TaskStarted", None), ("TaskClaimed", None), ("ReasoningStepCompleted", 1), ("LLMCalled", 2),
            ("ToolCallDispatched", TOOL_STEP),
            *(results if crash_after == "tool-recorded" else []),
            ("TaskStalled", None), ("TaskClaimed", None),
            *(results if crash_after == "tool-answered" else []),
            ("ReasoningStepCompleted", 4), ("TaskCompleted", None),
        ]


def replayed(backplane_server: BackplaneServer, token: str, tool_server: ToolServer, source: str,
             **env: str) -> dict[str, Any]:
    environment = node_env(BACKPLANE_URL=backplane_server.url, BACKPLANE_TOKEN=token,
                           TOOL_URL=f"http://127.0.0.1:{tool_server.port}", **env)
    done = subprocess.run([binary("node"), str(AGENTS / "replay-agent.mjs"), source], cwd=CLIENT, env=environment,
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_its_replay_of_a_finished_task_reports_the_drift_and_never_reaches_the_tool(
    namespace: str, backplane_server: BackplaneServer, tool_server: ToolServer, start_agent: Callable[..., AgentRun],
) -> None:
    with AgentClient(backplane_server.url, observer_token(namespace)) as observer:
        token = agent_token(namespace)
        source = observer.create_task(KIND, {"to": "alice@example.com"})["task_id"]
        agent = start_agent(token)
        assert agent.wait() == 0 and agent.reported("completed"), agent.describe()
        key = hashlib.sha256(f"{source}:{TOOL_STEP}:{TOOL}".encode()).hexdigest()
        token = agent_token(namespace, "ts-replayer")
        requests = sum(tool_server.requests.values())

        same = replayed(backplane_server, token, tool_server, source)
        assert (same["error"], same["drifted"], same["first_divergence"], same["asked"]) == (
            None, False, None, ["tool-recorded"])
        assert same["counts"]["same"] > 0 and same["counts"] == {**same["counts"], "changed": 0, "only_in_a": 0,
                                                                 "only_in_b": 0}

        prompt = replayed(backplane_server, token, tool_server, source, REPLAY_TEMPLATE="Write briefly to {to}")
        first = prompt["first_divergence"]
        assert prompt["error"] is None and prompt["drifted"]
        assert (first["kind"], first["path"], first["a"]["type"]) == ("changed", "$.payload.prompt[1].content",
                                                                     "LLMCalled")
        assert (first["a_value"], first["b_value"]) == ("Write to alice@example.com",
                                                        "Write briefly to alice@example.com")

        edited = {**tool_server.answers[key], "effect_id": "edited"}
        answer = replayed(backplane_server, token, tool_server, source, REPLAY_TOOL_ANSWERS=json.dumps(
            [{"step": TOOL_STEP, "tool": TOOL, "status": "succeeded", "result": edited}]))
        first = answer["first_divergence"]
        assert answer["error"] is None
        assert (first["kind"], first["path"], first["a"]["type"]) == ("changed", "$.payload.result.effect_id",
                                                                     "ToolCallResultReceived")
        assert (first["a_value"], first["b_value"]) == (tool_server.answers[key]["effect_id"], "edited")

        assert sum(tool_server.requests.values()) == requests and tool_server.effects[key] == 1
        for result in (same, prompt, answer):
            sandbox = observer.get_task(result["sandbox_task_id"])
            assert (sandbox["status"], sandbox["sandbox"]) == ("completed", True)
        assert observer.get_task(source)["status"] == "completed"


def test_its_replay_of_a_recovered_task_differs_from_it_by_the_stall_alone(
    namespace: str, backplane_server: BackplaneServer, tool_server: ToolServer, start_agent: Callable[..., AgentRun],
) -> None:
    """The sandbox runs the agent once, without a crash: the source's TaskStalled is the one event
    only it has, and everything the agent did (its tool call under the proxy's key) is the same."""
    with AgentClient(backplane_server.url, observer_token(namespace)) as observer:
        source, key, _, _ = finished_after_a_crash(namespace, observer, tool_server, start_agent, "tool-answered")
        result = replayed(backplane_server, agent_token(namespace, "ts-replayer"), tool_server, source)
        first = result["first_divergence"]
        assert result["error"] is None and (first["kind"], first["a"]["type"]) == ("only_in_a", "TaskStalled")
        assert (result["counts"]["changed"], result["counts"]["only_in_a"], result["counts"]["only_in_b"]) == (0, 1, 0)
        assert (tool_server.requests[key], tool_server.effects[key]) == (2, 1)


def test_the_packed_package_installs_and_imports_on_its_own(built_client: Path, tmp_path: Path) -> None:
    """What `npm publish` would upload: the tarball installs into an empty project with no network
    (no runtime dependencies) and its entry point exports the client, its types beside it."""
    npm = binary("npm")
    packed = run([npm, "pack", "--pack-destination", str(tmp_path)], env=node_env())
    assert packed.returncode == 0, packed.stderr[-3000:]
    tarball = tmp_path / packed.stdout.strip().splitlines()[-1]
    project = tmp_path / "project"
    project.mkdir()
    (project / "package.json").write_text(json.dumps({"name": "an-agent", "version": "1.0.0", "type": "module"}))
    installed = subprocess.run([npm, "install", "--offline", "--no-audit", "--no-fund", str(tarball)], cwd=project,
                               env=node_env(), capture_output=True, text=True, timeout=120, check=False)
    assert installed.returncode == 0, installed.stderr[-3000:]
    imported = subprocess.run(
        [binary("node"), "--input-type=module", "-e",
         "import * as bp from '@agent-backplane/client'; console.log(Object.keys(bp).sort().join(' '))"],
        cwd=project, env=node_env(), capture_output=True, text=True, timeout=60, check=False)
    assert imported.returncode == 0, imported.stderr[-3000:]
    exported = set(imported.stdout.split())
    assert {"AgentClient", "TaskSession", "RetryPolicy", "replay", "LeaseLost", "verifyChain", "checkProofBundle",
            "usageFromOpenAI", "usageFromAnthropic", "canonicalJson"} <= exported
    package = project / "node_modules" / "@agent-backplane" / "client"
    assert (package / "dist" / "index.d.ts").is_file()
    assert not (package / "src").exists() and not (package / "test").exists()
