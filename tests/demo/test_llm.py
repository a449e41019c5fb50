"""The demo's stand-in model: real prompts from its templates, answers in ``model_call``'s shape,
the same answer for the same prompt, and the templates read when a prompt is rendered."""

from __future__ import annotations

from typing import Any

import pytest

from backplane.eventlog.event_types import validate_llm_called
from backplane_client.session import llm_called_payload
from demo import llm

LEAD = {"id": "L-1", "company": "Globex", "email": "buyer@globex.example", "amount_cents": 9900}
ENRICHMENT = {"company": "Globex", "employees": 400, "industry": "saas"}


def decisions() -> list[tuple[llm.Prompt, llm.ModelFunction]]:
    return [
        (llm.plan_prompt(LEAD), llm.plan(7, LEAD)),
        (llm.research_prompt(LEAD, ENRICHMENT), llm.research(7, LEAD, ENRICHMENT)),
        (llm.qualify_prompt(LEAD, 64), llm.qualify(7, LEAD, 64)),
        (llm.summary_prompt(LEAD, {"score": 64, "qualified": True}), llm.summary(LEAD, {"score": 64})),
    ]


@pytest.mark.parametrize("index", range(4))
def test_each_decision_is_a_prompt_and_an_answer_the_server_takes(index: int) -> None:
    prompt, call = decisions()[index]
    assert [m["role"] for m in prompt] == ["system", "user"] and "$" not in prompt[1]["content"]
    answer = call(prompt)
    assert set(answer) == {"output", "usage"} and "thought" in answer["output"]
    assert all(isinstance(n, int) and n > 0 for n in answer["usage"].values())
    # What model_call records is a valid LLMCalled (the hash is the server's too).
    validate_llm_called(llm_called_payload(step=1, model=llm.MODEL, prompt=prompt, output=answer["output"],
                                           usage=answer["usage"], provider=llm.PROVIDER))


def test_the_same_prompt_gets_the_same_answer_whoever_asks() -> None:
    first = [call(prompt) for prompt, call in decisions()]
    again = [call(prompt) for prompt, call in decisions()]
    assert first == again


def test_a_changed_template_changes_the_prompt_when_it_is_rendered(monkeypatch: pytest.MonkeyPatch) -> None:
    before = llm.qualify_prompt(LEAD, 64)
    monkeypatch.setattr(llm, "QUALIFY_PROMPT", llm.QUALIFY_PROMPT + " Be brief.")
    after = llm.qualify_prompt(LEAD, 64)
    assert after[1]["content"] == before[1]["content"] + " Be brief." and after[0] == before[0]


def test_the_decisions_follow_the_score() -> None:
    def decision(score: int) -> Any:
        return llm.qualify(7, LEAD, score)(llm.qualify_prompt(LEAD, score))["output"]["decision"]

    assert decision(49) == {"qualified": False, "buys": False}
    assert decision(50)["qualified"] is True
    research = llm.research(7, LEAD, ENRICHMENT)(llm.research_prompt(LEAD, ENRICHMENT))["output"]["decision"]
    assert 0 <= research["score"] <= 100 and len(research["signals"]) == 3


@pytest.mark.parametrize("index", range(4))
def test_each_answer_reports_usage_as_a_hosted_model_would(index: int) -> None:
    prompt, call = decisions()[index]
    answer = call(prompt)
    usage = answer["usage"]
    # About four characters a token, the system prompt as the cached prefix (read or written).
    assert usage["input_tokens"] == len(llm._json(prompt)) // 4
    [cached] = set(usage) & {"cache_read_input_tokens", "cache_creation_input_tokens"}
    assert usage[cached] == len(llm._json(prompt[0])) // 4 < usage["input_tokens"]
    # Reasoning is part of the output, and only the qualification thinks.
    reasoning = usage.get("reasoning_output_tokens", 0)
    assert usage["output_tokens"] - reasoning == len(llm._json(answer["output"])) // 4
    assert (reasoning > 0) == (index == 2)
    assert llm.QUALIFY_REASONING[0] <= reasoning <= llm.QUALIFY_REASONING[1] or index != 2


def test_most_prompts_find_the_system_prompt_in_the_cache() -> None:
    leads = [{**LEAD, "id": f"L-{n}"} for n in range(200)]
    reads = sum("cache_read_input_tokens" in llm.plan(7, lead)(llm.plan_prompt(lead))["usage"] for lead in leads)
    assert 0.7 * len(leads) < reads < len(leads)  # a miss (a cache write) now and then
