"""The four failure zones of docs/design.md, end to end, with real processes.

Each test runs the product's web server (uvicorn), an external tool (a real HTTP server on
127.0.0.1 that counts its side effects per ``Idempotency-Key``) and agent processes written
only against ``backplane_client.agent`` (``agent_worker.py``). The first agent is SIGKILLed at
the exact point of its zone; its lease is then expired (as the stall detector would, without
waiting 30 s) and a second agent process claims the recovered task, reads its recovery context
and finishes it.

Pass: every task completes, every side effect happened exactly once (in flight: the tool saw
the key at most twice and acted once), a sub-agent's result is in the parent's log once, and
every chain verifies, on the server and recomputed here from the API's events (docs/api.md's rule).
"""

from __future__ import annotations

import hashlib
import signal
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest
import rfc8785
from django.utils import timezone

from backplane.eventlog import services
from backplane.eventlog.models import Task
from backplane_client.agent import AgentClient, BackplaneAPIError
from recovery.detector import lease_expire_stalled
from tests.conftest import check_projections
from tests.e2e.conftest import AgentRun, BackplaneServer, ToolServer

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

KIND = "outreach"
CHILD_KIND = "research"
TOOL = "send-email"
CHILD_TOOL = "fetch-profile"
TOOL_STEP = 2
KILLED = -signal.SIGKILL
ZERO_HASH = "0" * 64


def tool_key(task_id: str, step: int, tool: str) -> str:
    """The contract's stable key, computed here independently of the server."""
    return hashlib.sha256(f"{task_id}:{step}:{tool}".encode()).hexdigest()


@dataclass
class Zone:
    """One test's world: agents with tokens, an observer client, the tool, agent processes."""

    server: BackplaneServer
    tool: ToolServer
    run_agent: Callable[..., AgentRun]
    observer: AgentClient
    tokens: dict[str, str]
    log_start: int = 0

    def explain(self, agent: AgentRun) -> str:
        return f"{agent.describe()}\nserver log:\n{self.server.log(self.log_start)[-6000:]}"

    # --- setting up -----------------------------------------------------------------------

    def create_task(self, *, subagent: bool = False) -> str:
        plan: dict[str, Any] = {
            "tool": TOOL,
            "tool_url": self.tool.url(TOOL),
            "tool_input": {"to": "alice@example.com", "subject": "Your quote"},
        }
        if subagent:
            plan["subagent"] = {
                "kind": CHILD_KIND,
                "input": {"tool": CHILD_TOOL, "tool_url": self.tool.url(CHILD_TOOL),
                          "tool_input": {"company": "Example Ltd"}},
            }
        task = self.observer.create_task(KIND, plan)
        assert task["status"] == "pending"
        return task["task_id"]

    # --- the crash and the recovery -------------------------------------------------------

    def crash(self, zone: str) -> AgentRun:
        first = self.run_agent(self.tokens["agent-a"], KIND, crash_at=zone)
        assert first.wait() == KILLED, self.explain(first)
        [crash] = first.reported("crash")
        assert crash["zone"] == zone
        return first

    def expire_lease(self, task_id: str) -> None:
        """What the stall detector does once the lease runs out, without waiting for it;
        then the dead holder's epoch is fenced off."""
        dead_epoch = self.observer.get_task(task_id)["lease"]["epoch"]
        assert Task.objects.filter(pk=task_id, status="running").update(
            lease_expires_at=timezone.now() - timedelta(seconds=1)
        ) == 1
        sweep = lease_expire_stalled()
        assert (sweep.expired, sweep.requeued, sweep.dead_lettered) == (1, 1, 0)
        with pytest.raises(BackplaneAPIError) as refused:
            self.observer.append(task_id, "ReasoningStepCompleted", {"step": 99}, lease_epoch=dead_epoch)
        assert (refused.value.status, refused.value.code) == (409, "stale_lease"), refused.value

    def recover(self, task_id: str) -> AgentRun:
        self.expire_lease(task_id)
        second = self.run_agent(self.tokens["agent-b"], KIND)
        assert second.wait() == 0, self.explain(second)
        [claimed] = second.reported("claimed")
        assert claimed["task_id"] == task_id and claimed["recovered"] is True
        [context] = second.reported("context")
        assert context["attempt"] == 2
        assert second.reported("completed"), self.explain(second)
        assert second.reported("modules")[0]["django_free"], self.explain(second)
        return second

    # --- reading the outcome --------------------------------------------------------------

    def events(self, task_id: str) -> list[dict[str, Any]]:
        return list(self.observer.iter_events(task_id))

    def types(self, task_id: str) -> Counter[str]:
        return Counter(e["type"] for e in self.events(task_id))

    def assert_chain_verifies(self, task_id: str) -> None:
        task = self.observer.get_task(task_id)
        verdict = self.observer.verify(task_id)
        assert verdict == {"valid": True, "checked": task["last_seq"], "head_hash": task["head_hash"],
                           "first_invalid_seq": None}
        # And with no code of the server's: docs/api.md's hash rule over the events as served.
        prev = ZERO_HASH
        events = self.events(task_id)
        assert [e["seq"] for e in events] == list(range(1, task["last_seq"] + 1))
        for event in events:
            hashed = {k: v for k, v in event.items() if k not in ("hash", "position")}
            assert event["prev_hash"] == prev, f"seq {event['seq']}: broken link"
            assert hashlib.sha256(rfc8785.dumps(hashed)).hexdigest() == event["hash"], f"seq {event['seq']}"
            prev = event["hash"]
        assert prev == task["head_hash"]

    def assert_completed_once(self, task_id: str) -> dict[str, Any]:
        """The task completed, each step is in its log once, and the tool acted once per key."""
        task = self.observer.get_task(task_id)
        assert task["status"] == "completed", task
        assert task["lease"] is None
        types = self.types(task_id)
        assert types["TaskCompleted"] == 1
        assert types["ToolCallDispatched"] == 1
        assert types["ToolCallResultReceived"] == 1
        steps = Counter(e["payload"]["step"] for e in self.events(task_id) if e["type"] == "ReasoningStepCompleted")
        assert steps and all(n == 1 for n in steps.values()), steps
        key = tool_key(task_id, TOOL_STEP, TOOL)
        assert self.tool.effects[key] == 1
        # The output carries the answer of the one side effect that happened.
        assert task["output"]["tool_result"] == self.tool.answers[key]
        record = self.observer.get_tool_call(key)
        assert (record["status"], record["result"]) == ("succeeded", self.tool.answers[key])
        assert all(count == 1 for count in self.tool.effects.values()), self.tool.effects
        self.assert_chain_verifies(task_id)
        return task


@pytest.fixture
def zone(
    committed_db: None,
    backplane_server: BackplaneServer,
    tool_server: ToolServer,
    run_agent: Callable[..., AgentRun],
) -> Iterator[Zone]:
    namespace = f"e2e-{uuid.uuid4().hex[:8]}"
    tokens = {
        name: services.agent_create(name=name, namespace=namespace, kinds=kinds).token
        for name, kinds in (
            ("planner", ()),
            ("agent-a", (KIND,)),
            ("agent-b", (KIND,)),
            ("researcher", (CHILD_KIND,)),
        )
    }
    log_start = backplane_server.log_size()
    with AgentClient(backplane_server.url, tokens["planner"]) as observer:
        yield Zone(server=backplane_server, tool=tool_server, run_agent=run_agent, observer=observer, tokens=tokens,
                   log_start=log_start)
    # Expected refusals are 4xx answers; anything the server logged as an error is a bug.
    log = backplane_server.log(log_start)
    assert "Traceback" not in log and " ERROR " not in log, log[-6000:]
    # Whatever crashed and recovered, every task's row is what its log replays to.
    code, report = check_projections()
    assert code == 0, report


def test_zone1_before_the_tool_call(zone: Zone) -> None:
    """Decided, then died before dispatch: the decision is kept, the call is made once."""
    task_id = zone.create_task()
    zone.crash("zone1")

    context = zone.observer.recovery_context(task_id)
    assert [s["step"] for s in context["completed_steps"]] == [1]
    assert context["tool_calls"] == [] and context["in_flight_tool_calls"] == []
    assert context["recovery_point_seq"] == zone.observer.get_task(task_id)["last_seq"]
    assert zone.tool.requests == Counter()

    second = zone.recover(task_id)
    assert second.reported("skip-step") == [{"event": "skip-step", "step": 1}]
    [dispatch] = second.reported("tool-dispatch")
    key = tool_key(task_id, TOOL_STEP, TOOL)
    assert (dispatch["key"], dispatch["status"], dispatch["replayed"]) == (key, "dispatched", False)

    zone.assert_completed_once(task_id)
    assert zone.tool.requests == Counter({key: 1})
    types = zone.types(task_id)
    assert (types["TaskClaimed"], types["TaskStalled"]) == (2, 1)


def test_zone2_in_flight(zone: Zone) -> None:
    """The request left, no answer came back: the retry reuses the key; the tool acts once."""
    task_id = zone.create_task()
    first = zone.crash("zone2")
    key = tool_key(task_id, TOOL_STEP, TOOL)
    assert first.reported("crash")[0]["key"] == key
    assert not first.reported("tool-answered")
    zone.tool.wait_for_request(key)  # it did arrive, and the tool acted on it
    assert zone.tool.effects[key] == 1

    context = zone.observer.recovery_context(task_id)
    [in_flight] = context["in_flight_tool_calls"]
    assert (in_flight["idempotency_key"], in_flight["status"], in_flight["step"]) == (key, "in_flight", TOOL_STEP)
    assert context["recovery_point_seq"] == in_flight["dispatched_seq"] - 1
    assert key in context["resume_prompt"]
    assert zone.observer.get_tool_call(key)["status"] == "in_flight"

    second = zone.recover(task_id)
    [dispatch] = second.reported("tool-dispatch")
    assert (dispatch["key"], dispatch["status"], dispatch["replayed"]) == (key, "in_flight", True)

    zone.assert_completed_once(task_id)
    assert zone.tool.requests[key] <= 2
    assert zone.tool.effects == Counter({key: 1})


def test_zone3_after_the_call_before_the_commit(zone: Zone) -> None:
    """The tool answered, the agent died before recording it: no second email."""
    task_id = zone.create_task()
    first = zone.crash("zone3")
    key = tool_key(task_id, TOOL_STEP, TOOL)
    [answered] = first.reported("tool-answered")
    assert answered["result"] == zone.tool.answers[key]
    assert (zone.tool.requests[key], zone.tool.effects[key]) == (1, 1)

    context = zone.observer.recovery_context(task_id)
    assert [c["idempotency_key"] for c in context["in_flight_tool_calls"]] == [key]
    assert [s["step"] for s in context["completed_steps"]] == [1]
    types = zone.types(task_id)
    assert (types["ToolCallDispatched"], types["ToolCallResultReceived"]) == (1, 0)

    second = zone.recover(task_id)
    [dispatch] = second.reported("tool-dispatch")
    assert (dispatch["key"], dispatch["status"]) == (key, "in_flight")
    # The repeat reached the tool with the original key and got the original answer back.
    [again] = second.reported("tool-answered")
    assert again["result"] == answered["result"]

    zone.assert_completed_once(task_id)
    assert zone.tool.requests == Counter({key: 2})
    assert zone.tool.effects == Counter({key: 1})


def test_zone4_cross_agent_hand_off(zone: Zone) -> None:
    """The sub-agent finished, the orchestrator died before recording it: its result is kept,
    in the parent's log once, and nothing is handed off or done twice."""
    task_id = zone.create_task(subagent=True)
    orchestrator = zone.run_agent(zone.tokens["agent-a"], KIND, crash_at="zone4")
    researcher = zone.run_agent(zone.tokens["researcher"], CHILD_KIND, claim_timeout=30)
    assert orchestrator.wait() == KILLED, zone.explain(orchestrator)
    assert researcher.wait() == 0, zone.explain(researcher)
    [dispatched] = orchestrator.reported("subagent-dispatched")
    child_id = dispatched["child_task_id"]
    assert researcher.reported("claimed")[0]["task_id"] == child_id
    child = zone.observer.get_task(child_id)
    assert child["status"] == "completed" and child["parent_task_id"] == task_id

    # The crash: the result is in the parent's log, nothing after it.
    events = zone.events(task_id)
    assert events[-1]["type"] == "SubAgentResultReceived"
    assert events[-1]["payload"]["output"] == child["output"]
    assert zone.observer.get_task(task_id)["status"] == "running"
    context = zone.observer.recovery_context(task_id)
    [sub] = context["subtasks"]
    assert (sub["child_task_id"], sub["status"], sub["output"]) == (child_id, "completed", child["output"])
    assert [c["status"] for c in context["tool_calls"]] == ["succeeded"]
    assert context["in_flight_tool_calls"] == []
    assert [s["step"] for s in context["completed_steps"]] == [1]

    second = zone.recover(task_id)
    assert second.reported("subagent-result-from-context")[0]["child_task_id"] == child_id
    assert not second.reported("subagent-dispatched")
    assert second.reported("tool-result-from-context")

    parent = zone.assert_completed_once(task_id)
    assert parent["output"]["subagent_output"] == child["output"]
    types = zone.types(task_id)
    assert (types["SubAgentDispatched"], types["SubAgentAccepted"], types["SubAgentResultReceived"]) == (1, 1, 1)
    assert Task.objects.filter(parent_id=uuid.UUID(task_id)).count() == 1
    child_key = tool_key(child_id, TOOL_STEP, CHILD_TOOL)
    assert child["output"]["tool_result"] == zone.tool.answers[child_key]
    assert zone.tool.requests == Counter({tool_key(task_id, TOOL_STEP, TOOL): 1, child_key: 1})
    assert zone.tool.effects == zone.tool.requests
    zone.assert_chain_verifies(child_id)
