"""TaskSession.model_call and record_model_call against the live server: a model's answer is
recorded as ``LLMCalled`` (with the prompt's hash the server checks, its usage and cost), and
decided once across attempts."""

from __future__ import annotations

from decimal import Decimal
from types import SimpleNamespace
from typing import Any

import pytest

from backplane.eventlog.event_types import prompt_sha256 as server_prompt_sha256
from backplane_client import BackplaneAPIError, prompt_sha256
from backplane_client.session import PROMPT_RECORD_LIMIT, llm_called_payload
from backplane_client.usage import ModelAnswer, model_cost, usage_from_anthropic, usage_from_openai
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
                                "usage": {"input_tokens": 12, "output_tokens": 3}, "cost": event["payload"]["cost"]}
    # No price reported, and none in the table for this model: the server says so.
    assert event["payload"]["cost"]["source"] == "unpriced"
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


@pytest.mark.parametrize("usage", [
    {"input_tokens": -1},
    {"prompt_tokens": 12, "completion_tokens": 3},  # OpenAI's usage as it comes
    {"input_tokens": 50, "output_tokens": 9, "cache_read_input_tokens": 1708},  # Anthropic's, cache left out
    {"output_tokens": 9, "reasoning_output_tokens": 10},
], ids=["negative", "openai-raw", "anthropic-raw", "reasoning-over-output"])
def test_usage_the_server_refuses_is_a_clear_error(agents: Agents, usage: dict[str, int]) -> None:
    # The SDK checks only that usage is a mapping: the keys and their sums are the server's rule.
    task_id = agents.task()
    with agents.claim(agents.worker) as session, pytest.raises(BackplaneAPIError) as refused:
        session.model_call(1, "gpt-x", PROMPT, Model("x", usage=usage))
    assert (refused.value.status, refused.value.code) == (400, "validation_error")
    assert any(name.startswith("payload.usage") for name in refused.value.details), refused.value.details
    assert llm_events(agents, task_id) == []


# --- record_model_call: a call the agent made itself ----------------------------------------

ANTHROPIC_ANSWER = SimpleNamespace(
    content=[SimpleNamespace(type="text", text='{"score": 72}')],
    usage=SimpleNamespace(input_tokens=40, output_tokens=9, cache_read_input_tokens=1700,
                          cache_creation_input_tokens=0),
)


def test_a_call_the_agent_made_is_recorded_with_its_usage_and_cost(agents: Agents) -> None:
    task_id = agents.task()
    with agents.claim(agents.worker) as session:
        event = session.record_model_call(
            2, "claude-x", PROMPT, {"score": 72}, usage=usage_from_anthropic(ANTHROPIC_ANSWER),
            provider="anthropic", cost=model_cost(Decimal("0.000642")),
        )
        # The step is decided now: model_call answers it from the record, asking nobody.
        model = Model({"score": 10})
        assert session.model_call(2, "claude-x", PROMPT, model) == {"score": 72}
        assert model.asked == []
    assert event["type"] == "LLMCalled" and event["idempotency_key"] == f"{task_id}:llm:2"
    assert event["payload"] == {
        "step": 2, "model": "claude-x", "provider": "anthropic", "prompt": PROMPT,
        "prompt_sha256": server_prompt_sha256(PROMPT), "output": {"score": 72},
        "usage": {"input_tokens": 1740, "output_tokens": 9, "cache_read_input_tokens": 1700,
                  "cache_creation_input_tokens": 0},
        "cost": {"amount": "0.000642", "currency": "USD", "source": "provider"},
    }
    assert llm_events(agents, task_id) == [event]
    [entry] = agents.planner.recovery_context(task_id)["model_calls"]
    assert (entry["seq"], entry["output"], entry["usage"]) == (event["seq"], {"score": 72}, event["payload"]["usage"])


def test_recording_a_step_again_returns_the_first_record(agents: Agents) -> None:
    task_id = agents.task()
    with agents.claim(agents.worker) as first:
        recorded = first.record_model_call(1, "gpt-x", PROMPT, {"route": "email"}, usage={"input_tokens": 12})
        # A retry with the same payload is the same event.
        assert first.record_model_call(1, "gpt-x", PROMPT, {"route": "email"}, usage={"input_tokens": 12}) == recorded
    agents.expire()

    with agents.claim(agents.other) as second:
        seq = agents.last_seq(task_id)
        # Asked again, the model said something else: the key refuses it, and the first answer stands.
        again = second.record_model_call(1, "gpt-x", PROMPT, {"route": "phone"}, usage={"input_tokens": 12})
        assert again == recorded and again["payload"]["output"] == {"route": "email"}
        assert (second.recorded_model_call(1) or {}).get("output") == {"route": "email"}
        assert agents.last_seq(task_id) == seq
    assert len(llm_events(agents, task_id)) == 1


def test_model_call_takes_the_log_answer_when_its_context_is_older_than_the_log(agents: Agents) -> None:
    task_id = agents.task()
    with agents.claim(agents.worker) as session:
        session.context()  # read before anything is recorded, and kept
        session.append("LLMCalled", llm_called_payload(step=4, model="gpt-x", prompt=PROMPT, output="first"),
                       idempotency_key=f"{task_id}:llm:4")
        model = Model("second")
        assert session.model_call(4, "gpt-x", PROMPT, model) == "first"
        assert len(model.asked) == 1  # the stale context let it ask; the record decided
        assert (session.recorded_model_call(4) or {}).get("output") == "first"
    assert [e["payload"]["output"] for e in llm_events(agents, task_id)] == ["first"]


def test_a_model_function_may_report_a_cost(agents: Agents) -> None:
    task_id = agents.task()

    def call(prompt: Any) -> ModelAnswer:
        return {"output": "ok", "usage": usage_from_openai({"usage": {"prompt_tokens": 12, "completion_tokens": 1}}),
                "cost": model_cost("0.0001")}

    with agents.claim(agents.worker) as session:
        assert session.model_call(1, "gpt-x", PROMPT, call, provider="openai") == "ok"
    [event] = llm_events(agents, task_id)
    assert event["payload"]["usage"] == {"input_tokens": 12, "output_tokens": 1}
    assert event["payload"]["cost"] == {"amount": "0.0001", "currency": "USD", "source": "provider"}


def test_a_providers_usage_passed_as_it_comes_sends_nothing(agents: Agents) -> None:
    task_id = agents.task()
    with agents.claim(agents.worker) as session, pytest.raises(TypeError, match="usage_from_anthropic"):
        session.record_model_call(1, "claude-x", PROMPT, "x", usage=ANTHROPIC_ANSWER.usage)
    assert llm_events(agents, task_id) == []
