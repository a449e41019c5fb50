"""Forks and sandbox replays of the demo's agents, end to end, with real processes.

The product's web server (uvicorn, as ``make run`` starts it), the demo's tool service (its HTTP
server in threads of this process, as ``manage.py demo`` runs it: every effect a ledger row, a
repeated ``Idempotency-Key`` answered from the row) and the demo's agent processes
(``python -m demo.agent``, Django-free, the SDK only).

1. Fork from failure: an orchestrator is SIGKILLed in the middle of its mail (zone 2: the request
   reached the tool, no answer was read; zone 3: the answer came, it was not recorded) and its
   task, with one attempt allowed, is dead-lettered. A fork from the failure point is finished by
   another real agent process: the mail goes to the tool again under the source's key, and the
   ledger holds exactly one effect per subject (tool and lead) across the source and its fork.
2. Sandbox replays of finished demo tasks with ``backplane_client.replay``, the agent function
   being the demo agent's own code run in this process: unchanged, it reports no drift; with a
   prompt template changed, the first divergence is that ``LLMCalled`` and its prompt; with a
   tool answer edited, that ``ToolCallResultReceived`` and its result. No replay reaches a tool:
   the ledger (its rows and its replay counts) does not move.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.db.models import Sum
from django.utils import timezone

from backplane.eventlog.forks import failure_point
from backplane.eventlog.models import Task
from backplane_client import AgentClient, ReplayResult, RetryPolicy, TaskSession, replay
from demo import llm
from demo.agent import ORCHESTRATOR, RESEARCHER, Agent
from demo.fleet import FEEDER, FleetConfig, agent_names, fleet_prepare
from demo.models import LedgerEntry, Observation
from demo.toolservice import Faults, ToolWorld, make_server
from recovery.detector import lease_expire_stalled
from recovery.models import ToolCall
from tests.conftest import check_projections
from tests.e2e.conftest import ROOT, BackplaneServer
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

SEED = 7
LEASE_SECONDS = 30
KILLED = -signal.SIGKILL
RETRY = RetryPolicy(attempts=5, base_delay=0.05, max_delay=1.0)


@dataclass
class AgentProcess:
    name: str
    process: subprocess.Popen[bytes]
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]

    def stop(self) -> None:
        """SIGTERM: the demo agent gives back a task in hand (uncounted) and exits."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=5)


@dataclass
class DemoWorld:
    """One test's demo: its namespace and tokens, the tool service, and agent processes."""

    server: BackplaneServer
    namespace: str
    tokens: dict[str, str]
    tools_url: str
    feeder: AgentClient
    started: list[AgentProcess] = field(default_factory=list)
    log_start: int = 0

    # --- processes --------------------------------------------------------------------------

    def start_agent(self, name: str, kind: str, *, crash_rate: float = 0.0, crash_zone: int | None = None
                    ) -> AgentProcess:
        argv = [sys.executable, "-m", "demo.agent", "--base-url", self.server.url, "--tools-url", self.tools_url,
                "--kind", kind, "--name", name, "--seed", str(SEED), "--crash-rate", str(crash_rate),
                "--lease-seconds", str(LEASE_SECONDS)]
        if crash_zone is not None:
            argv += ["--crash-zone", str(crash_zone)]
        env = {k: v for k, v in os.environ.items() if k not in {"DJANGO_SETTINGS_MODULE", "DATABASE_URL"}}
        env.update(PYTHONPATH=str(ROOT), BACKPLANE_TOKEN=self.tokens[name])
        log = Path(tempfile.mkstemp(prefix=f"bp-{name}-", suffix=".log")[1])
        with log.open("wb") as out:
            process = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
        agent = AgentProcess(name, process, log)
        self.started.append(agent)
        return agent

    def explain(self) -> str:
        agents = "\n".join(f"--- {a.name} (exit {a.process.poll()}):\n{a.output()}" for a in self.started)
        return f"{agents}\n--- server log:\n{self.server.log(self.log_start)[-6000:]}"

    # --- tasks ------------------------------------------------------------------------------

    def create_lead(self, n: int, *, max_attempts: int = 3) -> tuple[str, dict[str, Any]]:
        lead = {"id": f"L-e2e-{uuid.uuid4().hex[:6]}-{n}", "company": "Globex", "email": f"buyer{n}@globex.example",
                "amount_cents": 9900}
        task = self.feeder.create_task(ORCHESTRATOR, {"lead": lead}, max_attempts=max_attempts)
        return task["task_id"], lead

    def wait_status(self, task_id: str, *statuses: str, timeout: float = 90) -> dict[str, Any]:
        def reached() -> dict[str, Any] | None:
            task = self.feeder.get_task(task_id)
            return task if task["status"] in statuses else None

        return wait_until(reached, timeout=timeout, interval=0.2, what=f"task {task_id} {' or '.join(statuses)}",
                          details=self.explain)

    def finished_demo_task(self) -> tuple[str, str, dict[str, Any]]:
        """A lead worked to the end by the demo's agent processes, no crash: (orchestrator task,
        its research sub-task, the lead)."""
        researcher = self.start_agent(agent_names_of(RESEARCHER)[0], RESEARCHER)
        orchestrator = self.start_agent(agent_names_of(ORCHESTRATOR)[0], ORCHESTRATOR)
        task_id, lead = self.create_lead(1)
        self.wait_status(task_id, "completed")
        orchestrator.stop()
        researcher.stop()
        child = Task.objects.get(parent_id=uuid.UUID(task_id), kind=RESEARCHER)
        assert child.status == "completed"
        return task_id, str(child.pk), lead

    # --- replays ----------------------------------------------------------------------------

    def replay(self, kind: str, source: str, **options: Any) -> ReplayResult:
        """A sandbox replay of ``source`` with the demo agent's own code for ``kind``, run here."""
        token = self.tokens[agent_names_of(kind)[-1]]
        with AgentClient(self.server.url, token, retry=RETRY) as bp:
            agent = Agent(bp=bp, name="replayer", kind=kind, tools_url=self.tools_url, seed=SEED, crash_rate=0.0,
                          lease_seconds=LEASE_SECONDS)
            work: Callable[[TaskSession], None] = agent.qualify if kind == ORCHESTRATOR else agent.research
            try:
                return replay(bp, source, work, **options)
            finally:
                agent.http.close()

    def events(self, task_id: str) -> list[dict[str, Any]]:
        return list(self.feeder.iter_events(task_id))


def agent_names_of(kind: str) -> list[str]:
    return agent_names(FleetConfig(base_url=""))[kind]


def ledger() -> tuple[int, int]:
    """The tool service's effect counters: rows (effects) and replays answered from them."""
    return LedgerEntry.objects.count(), LedgerEntry.objects.aggregate(n=Sum("replays"))["n"] or 0


@pytest.fixture
def world(committed_db: None, backplane_server: BackplaneServer) -> Iterator[DemoWorld]:
    faults = Faults(seed=SEED, transient_rate=0.0, decline_rate=0.0, revert_failure_rate=0.0, latency_ms=(5, 10))
    tool_world = ToolWorld(faults, record_compensation=lambda key, status, result: None)
    secret: dict[str, str] = {}
    tools = make_server(tool_world, webhook_secret_of=lambda: secret.get("value", ""))
    threading.Thread(target=tools.serve_forever, name="demo-tools", daemon=True).start()
    tools_url = f"http://127.0.0.1:{tools.server_address[1]}"
    namespace = f"e2e-replay-{uuid.uuid4().hex[:8]}"
    prepared = fleet_prepare(FleetConfig(base_url=backplane_server.url, namespace=namespace, tidy=False),
                             tools_url=tools_url)
    secret["value"] = prepared.webhook_secret
    feeder = AgentClient(backplane_server.url, prepared.tokens[FEEDER], retry=RETRY)
    demo = DemoWorld(server=backplane_server, namespace=namespace, tokens=dict(prepared.tokens), tools_url=tools_url,
                     feeder=feeder, log_start=backplane_server.log_size())
    try:
        yield demo
    finally:
        for agent in demo.started:
            agent.stop()
            agent.log.unlink(missing_ok=True)
        feeder.close()
        tools.shutdown()
        tools.server_close()
    # Expected refusals are 4xx answers; anything the server logged as an error is a bug.
    log = backplane_server.log(demo.log_start)
    assert "Traceback" not in log and " ERROR " not in log, log[-6000:]
    code, report = check_projections()
    assert code == 0, report


# --- 1. a fork from failure, finished by another agent process ------------------------------------


@pytest.mark.parametrize("zone", [2, 3])
def test_a_fork_from_failure_finishes_the_mail_with_one_effect(world: DemoWorld, zone: int) -> None:
    first_orchestrator, second_orchestrator = agent_names_of(ORCHESTRATOR)[:2]
    world.start_agent(agent_names_of(RESEARCHER)[0], RESEARCHER)
    task_id, lead = world.create_lead(1, max_attempts=1)
    crashing = world.start_agent(first_orchestrator, ORCHESTRATOR, crash_rate=1.0, crash_zone=zone)
    try:
        assert crashing.process.wait(timeout=90) == KILLED, world.explain()
    except subprocess.TimeoutExpired:
        raise AssertionError(f"the orchestrator never crashed\n{world.explain()}") from None
    [crash] = Observation.objects.filter(kind="crash", task_id=task_id)
    assert (crash.zone, crash.step, crash.tool) == (zone, 6, "email-send")

    # The request reached the tool, which acted; the backplane has the call in flight.
    subject = f"email-send:{lead['id']}"
    effect = wait_until(lambda: LedgerEntry.objects.filter(subject=subject).first(), timeout=30,
                        what="the tool acts on the mail", details=world.explain)
    context = world.feeder.recovery_context(task_id)
    [in_flight] = context["in_flight_tool_calls"]
    assert (in_flight["step"], in_flight["tool"], in_flight["idempotency_key"]) == (6, "email-send",
                                                                                  effect.idempotency_key)

    # The lease runs out (the stall detector's sweep, without waiting): one attempt, dead-lettered.
    assert Task.objects.filter(pk=task_id, status="running").update(
        lease_expires_at=timezone.now() - timedelta(seconds=1)) == 1
    sweep = lease_expire_stalled()
    assert (sweep.expired, sweep.dead_lettered) == (1, 1)
    source = world.feeder.get_task(task_id)
    assert source["status"] == "dead_lettered"

    at_seq = failure_point(Task.objects.get(pk=task_id))
    assert at_seq is not None
    assert world.events(task_id)[at_seq - 1]["type"] == "ToolCallDispatched"  # the mail, left in flight
    fork = world.feeder.fork(task_id, at_seq=at_seq, reason="finish the lead after the crash")
    fork_context = world.feeder.recovery_context(fork["task_id"])
    assert [c["idempotency_key"] for c in fork_context["in_flight_tool_calls"]] == [effect.idempotency_key]

    finisher = world.start_agent(second_orchestrator, ORCHESTRATOR)
    finished = world.wait_status(fork["task_id"], "completed", "failed", "dead_lettered")
    finisher.stop()
    assert finished["status"] == "completed", world.explain()

    # The mail was asked again under the source's key and answered from the tool's own record.
    call = ToolCall.objects.get(task_id=fork["task_id"], step=6, tool="email-send")
    assert call.effect_key == effect.idempotency_key != call.idempotency_key
    effect.refresh_from_db()
    assert (call.status, call.result) == ("succeeded", effect.response)
    assert effect.replays == 1
    assert finished["output"]["email"] == effect.response["message_id"]
    # Exactly one effect per subject (tool and lead) across the source and its fork.
    subjects = Counter(LedgerEntry.objects.filter(subject__endswith=f":{lead['id']}").values_list("subject", flat=True))
    assert subjects[subject] == 1 and subjects[f"crm-lookup:{lead['id']}"] == 1, subjects
    assert set(subjects.values()) == {1}, subjects
    # The source was never written; both chains hold.
    assert world.feeder.get_task(task_id)["last_seq"] == source["last_seq"]
    for checked in (task_id, fork["task_id"]):
        assert world.feeder.verify(checked)["valid"] is True


# --- 2. sandbox replays of finished demo tasks ---------------------------------------------------


def test_an_unchanged_research_agent_replays_without_drift(world: DemoWorld) -> None:
    _, research_task, _ = world.finished_demo_task()
    before = ledger()
    result = world.replay(RESEARCHER, research_task)
    assert result.error is None, result.error
    assert result.first_divergence is None and not result.drifted
    assert result.counts["same"] > 0 and (result.counts["changed"], result.counts["only_in_a"],
                                          result.counts["only_in_b"]) == (0, 0, 0)
    assert world.feeder.get_task(result.sandbox_task_id)["status"] == "completed"
    assert ledger() == before


def test_an_unchanged_orchestrator_replays_without_drift(world: DemoWorld) -> None:
    task_id, _, _ = world.finished_demo_task()
    before = ledger()
    result = world.replay(ORCHESTRATOR, task_id)
    assert ledger() == before
    assert result.error is None, result.error
    assert result.first_divergence is None, result.first_divergence


@pytest.mark.parametrize("kind, template, step", [
    (ORCHESTRATOR, "PLAN_PROMPT", 1),
    (RESEARCHER, "RESEARCH_PROMPT", 3),
])
def test_a_changed_prompt_template_is_the_first_divergence(
    world: DemoWorld, monkeypatch: pytest.MonkeyPatch, kind: str, template: str, step: int
) -> None:
    task_id, research_task, _ = world.finished_demo_task()
    source = task_id if kind == ORCHESTRATOR else research_task
    [recorded] = [e for e in world.events(source) if e["type"] == "LLMCalled" and e["payload"]["step"] == step]
    monkeypatch.setattr(llm, template, getattr(llm, template) + " Be brief.")
    before = ledger()
    result = world.replay(kind, source)
    assert ledger() == before
    assert result.error is None, result.error
    first = result.first_divergence
    assert first is not None, result
    assert first["kind"] == "changed" and first["path"] == "$.payload.prompt[1].content", first
    assert first["a"] == {"task_id": source, "seq": recorded["seq"], "type": "LLMCalled"}
    assert first["b"]["type"] == "LLMCalled" and first["b"]["task_id"] == result.sandbox_task_id
    assert first["a_value"] == recorded["payload"]["prompt"][1]["content"]
    assert first["b_value"] == first["a_value"] + " Be brief."
    # Recorded mode: the sandbox got the recorded answer for the new prompt.
    [replayed] = [e for e in world.events(result.sandbox_task_id) if e["type"] == "LLMCalled"
                  and e["payload"]["step"] == step]
    assert replayed["payload"]["output"] == recorded["payload"]["output"]
    assert replayed["payload"]["recorded_from"] == {"task_id": source, "seq": recorded["seq"]}


@pytest.mark.parametrize("kind, tool", [(ORCHESTRATOR, "crm-lookup"), (RESEARCHER, "web-enrich")])
def test_an_edited_tool_answer_is_the_first_divergence(world: DemoWorld, kind: str, tool: str) -> None:
    task_id, research_task, _ = world.finished_demo_task()
    source = task_id if kind == ORCHESTRATOR else research_task
    [answered] = [e for e in world.events(source) if e["type"] == "ToolCallResultReceived"
                  and e["payload"]["tool"] == tool]
    original = answered["payload"]["result"]
    edited = {**original, "employees": original["employees"] + 1}
    before = ledger()
    result = world.replay(kind, source, tool_answers=[
        {"step": 2, "tool": tool, "status": "succeeded", "result": edited}])
    assert ledger() == before
    assert result.error is None, result.error
    first = result.first_divergence
    assert first is not None, result
    assert (first["kind"], first["path"]) == ("changed", "$.payload.result.employees"), first
    assert first["a"] == {"task_id": source, "seq": answered["seq"], "type": "ToolCallResultReceived"}
    assert first["b"]["type"] == "ToolCallResultReceived" and first["b"]["task_id"] == result.sandbox_task_id
    assert (first["a_value"], first["b_value"]) == (original["employees"], original["employees"] + 1)
