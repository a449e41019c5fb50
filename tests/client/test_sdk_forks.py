"""Forks through the SDK against the live server: made once however often the request is sent,
claimed by id, continued from the source's record (its model calls, and its calls in flight under
the source's key), sandboxes refusing what the record cannot answer, and the diff."""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from typing import Any

import httpx
import pytest

from backplane.eventlog.models import Task
from backplane_client import AgentClient, AsyncAgentClient, BackplaneAPIError, SandboxRefused
from tests.client.conftest import DROP_ANSWER, QUICK, Agents, Crash, FaultProxy, Fleet
from tests.e2e.conftest import ToolServer
from tests.support.live_server import WebProcess


def send_with(tool: ToolServer, keys: list[str]) -> Any:
    """A tool function for ``call_tool`` that calls the real tool with the key it is given."""
    def send(key: str, body: dict[str, Any]) -> dict[str, Any]:
        keys.append(key)
        answer: dict[str, Any] = httpx.post(tool.url("send-email"), json=body, headers={"Idempotency-Key": key},
                                            timeout=10).json()
        return answer
    return send


def test_a_fork_is_made_once_however_often_the_request_is_sent(
    agents: Agents, fleet: Fleet, fault_proxy: FaultProxy
) -> None:
    source = agents.task()
    with AgentClient(fault_proxy.url, fleet.tokens["planner"], retry=QUICK) as planner:
        fault_proxy.fail_next(DROP_ANSWER)  # the fork is made; its answer never arrives
        fork = planner.fork(source, at_seq=1, reason="try again")
        assert planner.last_replayed  # the retry found the fork the first request made
    assert len(fault_proxy.requests_to("/fork/")) == 2
    assert fork["forked_from"] == {"task_id": source, "at_seq": 1} and fork["status"] == "pending"
    assert Task.objects.filter(forked_from_id=uuid.UUID(source)).count() == 1


def test_a_sandbox_is_claimed_by_its_id_and_never_by_kind(agents: Agents) -> None:
    source = agents.task()
    sandbox = agents.planner.fork(source, at_seq=1, reason="replay", sandbox=True)
    assert sandbox["sandbox"] is True
    first = agents.worker.claim([Fleet.KIND])
    assert first is not None and first.task_id == source  # the source, never the sandbox
    assert agents.worker.claim([Fleet.KIND]) is None
    lease = agents.worker.claim(task_id=sandbox["task_id"], lease_seconds=30)
    assert lease is not None and lease.task_id == sandbox["task_id"] and lease.lease_seconds == 30
    # A kind the agent may not claim: nothing (the child agent only takes CHILD_KIND).
    other = agents.planner.fork(source, at_seq=1, reason="replay", sandbox=True)
    assert agents.child.claim(task_id=other["task_id"]) is None


def test_a_fork_continues_from_its_sources_record(agents: Agents, tool_server: ToolServer) -> None:
    """The source decided (a model call), then died with its mail in flight after the tool
    acted. The fork gets the decision from the record and makes the mail under the source's
    key: the tool acts once across both."""
    source = agents.task()
    model_asked: list[Any] = []

    def model(prompt: Any) -> dict[str, Any]:
        model_asked.append(prompt)
        return {"output": {"route": "email"}}

    keys: list[str] = []
    send = send_with(tool_server, keys)
    with agents.claim(agents.worker) as first:
        assert first.model_call(1, "gpt-x", "route?", model) == {"route": "email"}
        with pytest.raises(Crash), first.tool_call(2, "send-email", {"to": "bob@example.com"}) as call:
            assert call.effect_key == call.key
            send(call.effect_key, call.input)
            raise Crash("died before recording the answer")
    agents.expire()
    at_seq = agents.last_seq(source) - 1  # before the stall

    fork = agents.planner.fork(source, at_seq=at_seq, reason="finish the mail")
    session = agents.worker.claim_session(task_id=fork["task_id"])
    assert session is not None
    with session:
        assert session.context()["forked_from"] == {"task_id": source, "at_seq": at_seq, "sandbox": False}
        assert session.model_call(1, "gpt-x", "route?", model) == {"route": "email"}
        again = session.call_tool(2, "send-email", {"to": "bob@example.com"}, send)
        assert again.key != call.key and again.effect_key == call.key
        session.complete({"mail": again.result})
    assert len(model_asked) == 1
    assert keys == [call.key, call.key]
    assert tool_server.effects == Counter({call.key: 1})
    assert again.result == tool_server.answers[call.key]
    result = [e for e in agents.planner.iter_events(fork["task_id"]) if e["type"] == "ToolCallResultReceived"]
    assert [e["payload"]["effect_key"] for e in result] == [call.key]


def test_a_sandbox_refuses_what_its_record_cannot_answer(agents: Agents, tool_server: ToolServer) -> None:
    source = agents.task()
    with agents.claim(agents.worker) as first:
        first.complete({"done": True})
    sandbox = agents.planner.fork(source, at_seq=1, reason="replay", sandbox=True)
    session = agents.worker.claim_session(task_id=sandbox["task_id"])
    assert session is not None
    keys: list[str] = []
    with session:
        seq = agents.last_seq(sandbox["task_id"])
        with pytest.raises(SandboxRefused) as refused:
            session.call_tool(2, "send-email", {"to": "bob@example.com"}, send_with(tool_server, keys))
        with pytest.raises(SandboxRefused):
            session.subtask(3, Fleet.CHILD_KIND, {"company": "Acme"})
        assert agents.last_seq(sandbox["task_id"]) == seq
    error = refused.value
    assert isinstance(error, BackplaneAPIError) and (error.status, error.code) == (409, "sandbox_refused")
    assert error.details["step"] == 2 and error.details["tool"] == "send-email"
    assert "sandbox never calls a tool" in error.message
    assert keys == [] and tool_server.requests == Counter()


def test_the_diff_of_a_task_with_itself_finds_nothing(agents: Agents) -> None:
    task_id = agents.task()
    diff = agents.planner.diff(task_id, task_id)
    assert diff["first_divergence"] is None and diff["counts"] == {"same": 1, "changed": 0, "only_in_a": 0,
                                                                   "only_in_b": 0}


def test_the_async_client_forks_claims_by_id_and_diffs(sdk_server: WebProcess, fleet: Fleet, agents: Agents) -> None:
    source = agents.task()

    async def work() -> dict[str, Any]:
        async with AsyncAgentClient(sdk_server.url, fleet.tokens["worker"], retry=QUICK) as bp:
            sandbox = await bp.fork(source, at_seq=1, reason="replay", sandbox=True,
                                    tool_answers=[{"step": 2, "tool": "x", "status": "succeeded", "result": {}}])
            lease = await bp.claim(task_id=sandbox["task_id"])
            assert lease is not None and lease.task_id == sandbox["task_id"]
            diff: dict[str, Any] = await bp.diff(source, sandbox["task_id"])
            return diff

    diff = asyncio.run(work())
    # The sandbox claimed and the source never was; a claim is lease bookkeeping, left out.
    assert diff["first_divergence"] is None and diff["counts"]["same"] == 1, diff
