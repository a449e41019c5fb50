"""TaskSession.model_call against the live server: a model's answer is recorded as ``LLMCalled``
(with the prompt's hash the server checks), and decided once across attempts."""

from __future__ import annotations

from typing import Any

import pytest

from backplane.eventlog.event_types import prompt_sha256 as server_prompt_sha256
from backplane_client import BackplaneAPIError, prompt_sha256
from backplane_client.session import PROMPT_RECORD_LIMIT
from tests.client.conftest import Agents

PROMPT = [{"role": "system", "content": "Answer in JSON."}, {"role": "user", "content": "Score Acme from 0 to 100."}]


class Model:
    """A model that answers from a list, and counts how often it was asked."""

    def __init__(self, *outputs: Any, usage: dict[str, int] | None = None) -> None:
        self.outputs = list(outputs)
        self.asked: list[Any] = []
        self.usage = usage if usage is not None else {"input_tokens": 12, "output_tokens": 3}

    def __call__(self, prompt: Any) -> dict[str, Any]:
        self.asked.append(prompt)
        return {"output": self.outputs[len(self.asked) - 1], "usage": self.usage}


def llm_events(agents: Agents, task_id: str) -> list[dict[str, Any]]:
    return [e for e in agents.planner.iter_events(task_id) if e["type"] == "LLMCalled"]


def test_a_model_call_is_recorded_with_its_prompt_hash_and_usage(agents: Agents) -> None:
    task_id = agents.task()
    model = Model({"score": 72})
    with agents.claim(agents.worker) as session:
        assert session.model_call(2, "gpt-x", PROMPT, model, provider="openai") == {"score": 72}
    [event] = llm_events(agents, task_id)
    assert event["idempotency_key"] == f"{task_id}:llm:2"
    assert event["payload"] == {"step": 2, "model": "gpt-x", "provider": "openai", "prompt": PROMPT,
                                "prompt_sha256": server_prompt_sha256(PROMPT), "output": {"score": 72},
                                "usage": {"input_tokens": 12, "output_tokens": 3}}
    context = agents.planner.recovery_context(task_id)
    assert [(c["step"], c["output"], c["seq"]) for c in context["model_calls"]] == [(2, {"score": 72}, event["seq"])]


def test_a_model_call_is_decided_once_across_attempts(agents: Agents) -> None:
    task_id = agents.task()
    model = Model({"route": "email"}, {"route": "phone"})
    with agents.claim(agents.worker) as first:
        assert first.model_call(1, "gpt-x", PROMPT, model) == {"route": "email"}
        # The same session asks again: its own record answers.
        assert first.model_call(1, "gpt-x", PROMPT, model) == {"route": "email"}
    agents.expire()  # died before doing anything with it

    with agents.claim(agents.other) as second:
        seq = agents.last_seq(task_id)
        # A model asked now would say "phone"; the recorded "email" is what the task goes on with.
        assert second.model_call(1, "gpt-x", PROMPT, model) == {"route": "email"}
        assert second.recorded_model_call(1) is not None
        assert second.recorded_model_call(2) is None
        assert agents.last_seq(task_id) == seq
    assert len(model.asked) == 1
    assert len(llm_events(agents, task_id)) == 1


def test_a_null_output_is_a_recorded_answer_too(agents: Agents) -> None:
    task_id = agents.task()
    model = Model(None, "late")
    with agents.claim(agents.worker) as session:
        assert session.model_call(3, "gpt-x", "say nothing", model) is None
        session.refresh_context()
        assert session.model_call(3, "gpt-x", "say nothing", model) is None
    assert len(model.asked) == 1
    [event] = llm_events(agents, task_id)
    assert event["payload"]["prompt"] == "say nothing" and event["payload"]["output"] is None


def test_a_prompt_over_64_kib_is_recorded_by_its_hash_only(agents: Agents) -> None:
    task_id = agents.task()
    big = [{"role": "user", "content": "x" * PROMPT_RECORD_LIMIT}]
    with agents.claim(agents.worker) as session:
        session.model_call(1, "gpt-x", big, Model("ok"))
    [event] = llm_events(agents, task_id)
    assert "prompt" not in event["payload"]
    assert event["payload"]["prompt_sha256"] == prompt_sha256(big) == server_prompt_sha256(big)


@pytest.mark.parametrize("answer", [{"usage": {"input_tokens": 1}}, "just text", None])
def test_an_answer_without_output_is_refused_and_nothing_recorded(
    agents: Agents, answer: Any
) -> None:
    task_id = agents.task()

    def call(prompt: Any) -> Any:
        return answer

    with agents.claim(agents.worker) as session, pytest.raises(TypeError, match="must return"):
        session.model_call(1, "gpt-x", PROMPT, call)
    assert llm_events(agents, task_id) == []


def test_usage_the_server_refuses_is_a_clear_error(agents: Agents) -> None:
    task_id = agents.task()
    with agents.claim(agents.worker) as session, pytest.raises(BackplaneAPIError) as refused:
        session.model_call(1, "gpt-x", PROMPT, Model("x", usage={"input_tokens": -1}))
    assert (refused.value.status, refused.value.code) == (400, "validation_error")
    assert "payload.usage" in refused.value.details
    assert llm_events(agents, task_id) == []
