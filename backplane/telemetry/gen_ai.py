"""Model calls in OpenTelemetry's GenAI terms: read from the events that record them, for the
span of the request that wrote them and for /metrics.

A model call is an ``LLMCalled`` event (backplane/eventlog/costs.py): its payload names the
``model`` and ``provider``, its ``usage`` by token type (``gen_ai.usage.*`` flattened) and the
``cost`` settled when it was appended. Telemetry imports no other part (tests/test_architecture.py),
so events are read here by their shape, and the type by its name.

- ``span_attributes``: the ``gen_ai.*`` attributes ``tracing.span_annotate_write`` puts on the
  span that wrote a model call;
- ``model_calls``: each call's figures, which ``counters.model_calls_count_after_commit`` (a
  writer follow-up) counts once the write commits.

Nothing here imports prometheus_client: the settings import tracing, and so this module, before
the metrics' directory is set (backplane/settings.py checks).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

# backplane.eventlog.event_types.LLM_CALLED, named again (tests/backplane/test_metrics.py checks
# that the two agree).
MODEL_CALL_TYPE = "LLMCalled"

# The usage keys of an LLMCalled (event_types.USAGE_KEYS) by their token type on /metrics, and
# by their span attribute (OpenTelemetry's GenAI conventions).
TOKEN_TYPES = {"input_tokens": "input", "output_tokens": "output",
               "cache_read_input_tokens": "cache_read_input", "cache_creation_input_tokens": "cache_creation_input",
               "reasoning_output_tokens": "reasoning_output"}
_USAGE_ATTRIBUTES = {"input_tokens": "gen_ai.usage.input_tokens", "output_tokens": "gen_ai.usage.output_tokens",
                     "cache_read_input_tokens": "gen_ai.usage.cache_read.input_tokens",
                     "cache_creation_input_tokens": "gen_ai.usage.cache_creation.input_tokens",
                     "reasoning_output_tokens": "gen_ai.usage.reasoning.output_tokens"}


class _Event(Protocol):
    @property
    def type(self) -> str: ...

    @property
    def payload(self) -> Any: ...


class _Task(Protocol):
    @property
    def namespace(self) -> str: ...

    @property
    def sandbox(self) -> bool: ...


class Written(Protocol):
    """What the writer tells a follow-up (``backplane.eventlog.writer.WrittenEvents``), as far as
    telemetry reads it."""

    @property
    def task(self) -> _Task: ...

    @property
    def events(self) -> Sequence[_Event]: ...


@dataclass(frozen=True)
class ModelCall:
    provider: str | None
    model: str
    usage: Mapping[str, int] | None  # None: the call reported no usage
    cost_source: str  # provider, price_table or unpriced
    amount: str | None  # a decimal string; None: no price
    currency: str | None

    def tokens(self) -> dict[str, int] | None:
        """The usage by token type (``TOKEN_TYPES``' values); None when the call reported none."""
        if self.usage is None:
            return None
        return {TOKEN_TYPES[key]: count for key, count in self.usage.items() if key in TOKEN_TYPES}


def model_calls(events: Iterable[_Event]) -> list[ModelCall]:
    """The model calls among ``events``, as recorded (their payloads were checked and priced
    before they were written)."""
    calls = []
    for event in events:
        if event.type != MODEL_CALL_TYPE:
            continue
        payload = event.payload
        usage = payload.get("usage")
        cost = payload.get("cost") or {}
        calls.append(ModelCall(provider=payload.get("provider"), model=str(payload.get("model")),
                               usage=usage if isinstance(usage, dict) else None,
                               cost_source=str(cost.get("source") or "unpriced"), amount=cost.get("amount"),
                               currency=cost.get("currency")))
    return calls


def span_attributes(events: Sequence[_Event]) -> dict[str, Any]:
    """The ``gen_ai.*`` attributes of a write's model calls: the last call's provider and model,
    and the tokens of all of them (a batch of calls is one write); empty when it wrote none. The
    cache and reasoning counts only when there are some."""
    calls = model_calls(events)
    if not calls:
        return {}
    attributes: dict[str, Any] = {"gen_ai.request.model": calls[-1].model}
    if calls[-1].provider:
        attributes["gen_ai.provider.name"] = calls[-1].provider
    for key, name in _USAGE_ATTRIBUTES.items():
        total = sum((call.usage or {}).get(key, 0) for call in calls)
        if total or key in ("input_tokens", "output_tokens"):
            attributes[name] = total
    return attributes
