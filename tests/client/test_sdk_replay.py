"""backplane_client.replay against the live server: an agent function run again in a sandbox of a
finished task, its model calls answered from the record (or live), its tool calls answered by the
server from the record, and the diff naming where it drifts. The tool is a real HTTP server that
counts its requests: a replay never reaches it."""

from __future__ import annotations

from collections import Counter
from typing import Any

import httpx
import pytest

from backplane_client import ModelCallNotRecorded, ReplayResult, SandboxRefused, TaskSession, model_cost, replay
from tests.client.conftest import Agents
from tests.e2e.conftest import ToolServer

TEMPLATE = "Score the lead {lead} from 0 to 100."


class LeadAgent:
    """The agent under replay: a model call (step 1), a reasoning step, a mail (step 2), done."""

    def __init__(self, tool: ToolServer, *, template: str = TEMPLATE, extra_step: str | None = None,
                 cost: str | None = None) -> None:
        self.tool = tool
        self.template = template
        self.extra_step = extra_step  # "tool" or "model": one more step the recorded run never took
        self.cost = cost  # what the provider reports each call cost, if it does
        self.asked: list[Any] = []

    def model(self, prompt: Any) -> dict[str, Any]:
        """Deterministic: the same prompt always gets the same score."""
        self.asked.append(prompt)
        answer = {"output": {"score": len(prompt[0]["content"]) % 100},
                  "usage": {"input_tokens": 9, "output_tokens": 2}}
        return answer if self.cost is None else {**answer, "cost": model_cost(self.cost)}

    def send(self, key: str, body: dict[str, Any]) -> dict[str, Any]:
        answer: dict[str, Any] = httpx.post(self.tool.url("send-email"), json=body, headers={"Idempotency-Key": key},
                                            timeout=10).json()
        return answer

    def __call__(self, s: TaskSession) -> None:
        prompt = [{"role": "user", "content": self.template.format(lead=s.input["lead"])}]
        score = s.model_call(1, "gpt-x", prompt, self.model, provider="test")["score"]
        s.reason(1, {"score": score})
        mail = s.call_tool(2, "send-email", {"to": s.input["lead"], "score": score}, self.send)
        if self.extra_step == "tool":
            s.call_tool(3, "send-sms", {"to": s.input["lead"]}, self.send)
        elif self.extra_step == "model":
            s.model_call(5, "gpt-x", "one more thought", self.model)
        s.complete({"score": score, "mail": mail.result})


@pytest.fixture
def finished(agents: Agents, tool_server: ToolServer) -> str:
    """A task the agent worked to the end, once: one model call, one mail."""
    task_id = agents.task(lead="alice@example.com")
    with agents.claim(agents.worker) as session:
        LeadAgent(tool_server)(session)
    assert agents.planner.get_task(task_id)["status"] == "completed"
    assert sum(tool_server.effects.values()) == 1
    return task_id


def llm_called(agents: Agents, task_id: str) -> list[dict[str, Any]]:
    return [e for e in agents.planner.iter_events(task_id) if e["type"] == "LLMCalled"]


def assert_no_tool_reached(tool: ToolServer, before: Counter[str]) -> None:
    assert tool.requests == before and sum(tool.effects.values()) == 1


def test_an_unchanged_agent_replays_without_drift(agents: Agents, tool_server: ToolServer, finished: str) -> None:
    before = Counter(tool_server.requests)
    agent = LeadAgent(tool_server)
    result = replay(agents.worker, finished, agent)
    assert isinstance(result, ReplayResult)
    assert result.error is None and not result.drifted and result.first_divergence is None
    assert result.counts["same"] > 0 and result.counts == {**result.counts, "changed": 0, "only_in_a": 0,
                                                           "only_in_b": 0}
    assert agent.asked == []  # recorded mode: the model is never called
    assert_no_tool_reached(tool_server, before)
    sandbox = agents.planner.get_task(result.sandbox_task_id)
    assert (sandbox["status"], sandbox["sandbox"]) == ("completed", True)
    assert sandbox["forked_from"] == {"task_id": finished, "at_seq": 1}
    [source_call] = llm_called(agents, finished)
    [replayed] = llm_called(agents, result.sandbox_task_id)
    assert replayed["payload"]["recorded_from"] == {"task_id": finished, "seq": source_call["seq"]}
    assert {k: v for k, v in replayed["payload"].items() if k != "recorded_from"} == source_call["payload"]


def test_a_provider_reported_cost_is_served_with_the_answer(agents: Agents, tool_server: ToolServer) -> None:
    task_id = agents.task(lead="bob@example.com")
    with agents.claim(agents.worker) as session:
        LeadAgent(tool_server, cost="0.00042")(session)
    result = replay(agents.worker, task_id, LeadAgent(tool_server, cost="0.00042"))
    assert result.error is None and result.first_divergence is None, result.first_divergence
    [replayed] = llm_called(agents, result.sandbox_task_id)
    assert replayed["payload"]["cost"] == {"amount": "0.00042", "currency": "USD", "source": "provider"}


def test_a_changed_prompt_is_the_first_divergence(agents: Agents, tool_server: ToolServer, finished: str) -> None:
    before = Counter(tool_server.requests)
    agent = LeadAgent(tool_server, template="Score {lead} from 0 to 100, and be strict.")
    result = replay(agents.worker, finished, agent)
    first = result.first_divergence
    assert result.drifted and result.error is None and first is not None
    [source_call] = llm_called(agents, finished)
    assert first["kind"] == "changed" and first["path"] == "$.payload.prompt[0].content"
    assert first["a"] == {"task_id": finished, "seq": source_call["seq"], "type": "LLMCalled"}
    assert first["b"]["task_id"] == result.sandbox_task_id and first["b"]["type"] == "LLMCalled"
    assert (first["a_value"], first["b_value"]) == ("Score the lead alice@example.com from 0 to 100.",
                                                    "Score alice@example.com from 0 to 100, and be strict.")
    # The recorded answer was served, so nothing after the prompt differs.
    assert result.counts["changed"] == 1 and result.counts["only_in_a"] == result.counts["only_in_b"] == 0
    assert agent.asked == []
    assert_no_tool_reached(tool_server, before)


def test_an_edited_tool_answer_is_the_first_divergence(agents: Agents, tool_server: ToolServer, finished: str) -> None:
    before = Counter(tool_server.requests)
    [key] = tool_server.answers
    edited = {**tool_server.answers[key], "effect_id": "edited"}
    result = replay(agents.worker, finished, LeadAgent(tool_server),
                    tool_answers=[{"step": 2, "tool": "send-email", "status": "succeeded", "result": edited}])
    first = result.first_divergence
    assert first is not None and result.error is None
    assert (first["kind"], first["path"], first["a"]["type"]) == ("changed", "$.payload.result.effect_id",
                                                                  "ToolCallResultReceived")
    assert (first["a_value"], first["b_value"]) == (tool_server.answers[key]["effect_id"], "edited")
    # ... and the output built on it.
    assert result.counts["changed"] == 2
    assert agents.planner.get_task(result.sandbox_task_id)["output"]["mail"] == edited
    assert_no_tool_reached(tool_server, before)


def test_a_tool_call_the_record_cannot_answer_ends_the_replay(
    agents: Agents, tool_server: ToolServer, finished: str
) -> None:
    before = Counter(tool_server.requests)
    result = replay(agents.worker, finished, LeadAgent(tool_server, extra_step="tool"))
    assert isinstance(result.error, SandboxRefused) and result.error.details["step"] == 3
    assert result.drifted
    # The diff is of what the function did: it stopped where the source completed.
    first = result.first_divergence
    assert first is not None and (first["kind"], first["a"]["type"]) == ("only_in_a", "TaskCompleted")
    assert_no_tool_reached(tool_server, before)
    # Left open by the function, the sandbox is failed afterwards, never handed to anyone.
    sandbox = agents.planner.get_task(result.sandbox_task_id)
    assert sandbox["status"] == "failed" and "SandboxRefused" in sandbox["error"]


def test_recorded_models_are_never_called(agents: Agents, tool_server: ToolServer, finished: str) -> None:
    agent = LeadAgent(tool_server, extra_step="model")
    result = replay(agents.worker, finished, agent)
    assert isinstance(result.error, ModelCallNotRecorded) and result.error.step == 5
    assert agent.asked == []


def test_live_models_are_asked_again(agents: Agents, tool_server: ToolServer, finished: str) -> None:
    before = Counter(tool_server.requests)
    agent = LeadAgent(tool_server)
    result = replay(agents.worker, finished, agent, models="live")
    # The model is asked; being deterministic, it says what it said, and nothing drifts.
    assert len(agent.asked) == 1 and not result.drifted and result.error is None
    [replayed] = llm_called(agents, result.sandbox_task_id)
    assert "recorded_from" not in replayed["payload"]
    assert_no_tool_reached(tool_server, before)


def test_a_replay_from_a_later_event_keeps_the_history_before_it(
    agents: Agents, tool_server: ToolServer, finished: str
) -> None:
    reasoned = next(e for e in agents.planner.iter_events(finished) if e["type"] == "ReasoningStepCompleted")
    agent = LeadAgent(tool_server)
    result = replay(agents.worker, finished, agent, at_seq=reasoned["seq"])
    assert result.error is None and agent.asked == []
    # The model call is in the sandbox's history (read through the source): not recorded again.
    assert llm_called(agents, result.sandbox_task_id) == []
    # No difference: the sandbox's own claim (after the source's claim in its history) is lease
    # bookkeeping, which the diff leaves out.
    assert result.first_divergence is None, result.first_divergence
    assert (result.counts["changed"], result.counts["only_in_a"], result.counts["only_in_b"]) == (0, 0, 0)


def test_the_package_exports_the_function_not_a_module() -> None:
    import backplane_client
    import backplane_client.sandbox

    assert backplane_client.replay is backplane_client.sandbox.replay is replay


def test_only_recorded_or_live_models(agents: Agents, tool_server: ToolServer, finished: str) -> None:
    cached: Any = "cached"  # not a mode the signature allows: what a caller without a type checker sends
    with pytest.raises(ValueError, match="models must be"):
        replay(agents.worker, finished, LeadAgent(tool_server), models=cached)
