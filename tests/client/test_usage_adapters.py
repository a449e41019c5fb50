"""backplane_client.usage: providers' usage read into ``LLMCalled``'s keys, every cached and
reasoning token counted once, from dicts and from SDK-style objects alike."""

from __future__ import annotations

from decimal import Decimal
from types import SimpleNamespace
from typing import Any

import pytest

import backplane_client
from backplane.eventlog.event_types import validate_llm_called
from backplane_client.session import llm_called_payload
from backplane_client.usage import USAGE_KEYS, model_cost, usage_from_anthropic, usage_from_openai

OPENAI_CHAT = {
    "id": "chatcmpl-1", "object": "chat.completion",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "{\"score\": 72}"}}],
    "usage": {"prompt_tokens": 2006, "completion_tokens": 300, "total_tokens": 2306,
              "prompt_tokens_details": {"cached_tokens": 1920, "audio_tokens": 0},
              "completion_tokens_details": {"reasoning_tokens": 256, "audio_tokens": 0}},
}
OPENAI_RESPONSES = {
    "id": "resp_1", "object": "response",
    "usage": {"input_tokens": 2006, "output_tokens": 300, "total_tokens": 2306,
              "input_tokens_details": {"cached_tokens": 1920},
              "output_tokens_details": {"reasoning_tokens": 256}},
}
ANTHROPIC = {
    "id": "msg_1", "type": "message", "content": [{"type": "text", "text": "{\"score\": 72}"}],
    "usage": {"input_tokens": 50, "output_tokens": 300, "cache_creation_input_tokens": 248,
              "cache_read_input_tokens": 1708, "service_tier": "standard"},
}


def as_object(value: Any) -> Any:
    """A provider SDK's answer as its pydantic models present it: attributes, no keys."""
    if isinstance(value, dict):
        return SimpleNamespace(**{key: as_object(item) for key, item in value.items()})
    return value


@pytest.mark.parametrize("response", [OPENAI_CHAT, OPENAI_RESPONSES], ids=["chat", "responses"])
def test_it_keeps_openais_totals_and_records_cached_and_reasoning_tokens_as_parts(response: dict[str, Any]) -> None:
    assert usage_from_openai(response) == {"input_tokens": 2006, "output_tokens": 300,
                                           "cache_read_input_tokens": 1920, "reasoning_output_tokens": 256}


def test_it_adds_anthropics_cache_tokens_to_its_uncached_input() -> None:
    assert usage_from_anthropic(ANTHROPIC) == {"input_tokens": 50 + 1708 + 248, "output_tokens": 300,
                                               "cache_read_input_tokens": 1708, "cache_creation_input_tokens": 248}


def test_the_same_call_counts_the_same_tokens_whichever_provider_reports_it() -> None:
    # 2006 input tokens of which 1708 cached: OpenAI reports the total, Anthropic the rest.
    openai = usage_from_openai({"usage": {"prompt_tokens": 2006, "completion_tokens": 44,
                                          "prompt_tokens_details": {"cached_tokens": 1708}}})
    anthropic = usage_from_anthropic({"usage": {"input_tokens": 298, "output_tokens": 44,
                                                "cache_read_input_tokens": 1708}})
    assert openai == anthropic == {"input_tokens": 2006, "output_tokens": 44, "cache_read_input_tokens": 1708}


@pytest.mark.parametrize("adapter, response", [
    (usage_from_openai, OPENAI_CHAT), (usage_from_openai, OPENAI_RESPONSES), (usage_from_anthropic, ANTHROPIC),
], ids=["chat", "responses", "anthropic"])
def test_it_reads_sdk_objects_and_their_usage_like_dicts(adapter: Any, response: dict[str, Any]) -> None:
    obj = as_object(response)
    assert adapter(obj) == adapter(obj.usage) == adapter(response["usage"]) == adapter(response)


@pytest.mark.parametrize("adapter, response", [
    (usage_from_openai, OPENAI_CHAT), (usage_from_openai, OPENAI_RESPONSES), (usage_from_anthropic, ANTHROPIC),
], ids=["chat", "responses", "anthropic"])
def test_what_it_returns_is_a_usage_the_server_takes(adapter: Any, response: dict[str, Any]) -> None:
    usage = adapter(response)
    assert set(usage) <= set(USAGE_KEYS)
    cached = usage.get("cache_read_input_tokens", 0) + usage.get("cache_creation_input_tokens", 0)
    assert cached <= usage["input_tokens"]
    assert usage.get("reasoning_output_tokens", 0) <= usage["output_tokens"]
    validate_llm_called(llm_called_payload(step=1, model="m", prompt="p", output=None, usage=usage))


@pytest.mark.parametrize("response", [
    {"id": "chatcmpl-2"}, {"usage": None}, SimpleNamespace(id="resp_2", usage=None), {"usage": {}},
], ids=["no-usage-key", "null-usage", "object-null-usage", "empty-usage"])
def test_an_answer_without_usage_gives_an_empty_usage(response: Any) -> None:
    assert usage_from_openai(response) == {}
    assert usage_from_anthropic(response) == {}


def test_it_leaves_out_what_the_answer_does_not_report_and_keeps_zeros() -> None:
    # A non-reasoning model, no cache hit, details null (as some OpenAI-compatible servers send).
    chat = {"usage": {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15,
                      "prompt_tokens_details": {"cached_tokens": 0}, "completion_tokens_details": None}}
    assert usage_from_openai(chat) == {"input_tokens": 12, "output_tokens": 3, "cache_read_input_tokens": 0}
    assert usage_from_anthropic({"usage": {"input_tokens": 12, "output_tokens": 3}}) == {
        "input_tokens": 12, "output_tokens": 3}


def test_a_streamed_anthropic_delta_has_no_input_total() -> None:
    # message_delta carries the output count only; the input is in message_start.
    assert usage_from_anthropic({"type": "message_delta", "usage": {"output_tokens": 87}}) == {"output_tokens": 87}
    assert usage_from_anthropic(as_object({"usage": {"input_tokens": None, "output_tokens": 87,
                                                     "cache_read_input_tokens": 12}})) == {
        "output_tokens": 87, "cache_read_input_tokens": 12}


@pytest.mark.parametrize("bad", [-1, 1.5, "12", True])
def test_a_count_that_is_not_a_token_count_is_refused_naming_the_field(bad: Any) -> None:
    with pytest.raises(ValueError, match=r"OpenAI usage prompt_tokens_details\.cached_tokens is"):
        usage_from_openai({"usage": {"prompt_tokens": 12, "prompt_tokens_details": {"cached_tokens": bad}}})
    with pytest.raises(ValueError, match="Anthropic usage cache_read_input_tokens is"):
        usage_from_anthropic({"usage": {"input_tokens": 12, "cache_read_input_tokens": bad}})


@pytest.mark.parametrize("amount, written", [
    (Decimal("0.00042"), "0.00042"), ("1.50", "1.50"), (0.1, "0.1"), (1e-7, "0.0000001"), (3, "3"),
    (Decimal("1E-7"), "0.0000001"), (Decimal("-0"), "0"),
])
def test_a_provider_reported_cost_is_a_plain_decimal_string(amount: Any, written: str) -> None:
    assert model_cost(amount) == {"amount": written, "currency": "USD"}
    assert model_cost(amount, "EUR")["currency"] == "EUR"


@pytest.mark.parametrize("amount", [-0.01, "NaN", float("inf"), "a lot", True, Decimal("-1")])
def test_a_cost_that_is_no_amount_is_refused(amount: Any) -> None:
    with pytest.raises(ValueError, match="cost amount"):
        model_cost(amount)


def test_a_providers_usage_object_passed_as_it_comes_is_refused_before_sending() -> None:
    raw_usage, bare_amount = as_object(OPENAI_CHAT).usage, as_object(Decimal("0.1"))
    with pytest.raises(TypeError, match=r"usage_from_openai\(response\)"):
        llm_called_payload(step=1, model="m", prompt="p", output=None, usage=raw_usage)
    with pytest.raises(TypeError, match=r"model_cost\(amount\)"):
        llm_called_payload(step=1, model="m", prompt="p", output=None, cost=bare_amount)


def test_the_package_exports_the_adapters() -> None:
    assert backplane_client.usage_from_openai is usage_from_openai
    assert backplane_client.usage_from_anthropic is usage_from_anthropic
    assert backplane_client.model_cost is model_cost
    assert backplane_client.USAGE_KEYS == USAGE_KEYS
