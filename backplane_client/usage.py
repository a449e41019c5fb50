"""What a model call used and cost, in the shape an ``LLMCalled`` event records it.

Standard library only. The ``usage`` object's keys mirror OpenTelemetry GenAI's ``gen_ai.usage.*``
attributes, flattened; every key is optional and counts tokens as a non-negative integer:

=============================== ============================================ ===================================
usage key                       OpenTelemetry attribute                      counts
=============================== ============================================ ===================================
``input_tokens``                ``gen_ai.usage.input_tokens``                all input tokens, cached ones included
``output_tokens``               ``gen_ai.usage.output_tokens``               all output tokens, reasoning included
``cache_read_input_tokens``     ``gen_ai.usage.cache_read.input_tokens``     input served from the provider's cache
``cache_creation_input_tokens`` ``gen_ai.usage.cache_creation.input_tokens`` input written to the provider's cache
``reasoning_output_tokens``     ``gen_ai.usage.reasoning.output_tokens``     output spent on reasoning
=============================== ============================================ ===================================

The totals *include* their parts: ``cache_read_input_tokens + cache_creation_input_tokens <=
input_tokens`` and ``reasoning_output_tokens <= output_tokens`` (the server refuses anything
else, and any other key). Providers disagree on this, which is how tools that add a provider's
cached tokens to a total that already holds them (or forget to add Anthropic's to one that does
not) end up counting the same tokens twice or three times; the adapters here are the one place
that rule is applied:

- :func:`usage_from_openai` (Chat Completions and Responses): OpenAI's prompt/input tokens
  already include the cached ones and its completion/output tokens the reasoning ones, so the
  totals are taken as they are and the details become the parts.
- :func:`usage_from_anthropic` (Messages): Anthropic's ``input_tokens`` *excludes* the tokens read
  from and written to the cache, so ours is the sum of the three. Anthropic reports no reasoning
  count (thinking is inside ``output_tokens``).

A provider-reported price goes beside the usage as ``cost`` (:func:`model_cost`); without one the
server prices the call from its price table.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from decimal import Decimal, InvalidOperation
from typing import Any, NotRequired, TypedDict, cast

__all__ = ["USAGE_KEYS", "Cost", "ModelAnswer", "Usage", "model_cost", "usage_from_anthropic", "usage_from_openai"]

USAGE_KEYS = ("input_tokens", "output_tokens", "cache_read_input_tokens", "cache_creation_input_tokens",
              "reasoning_output_tokens")


class Usage(TypedDict, total=False):
    """The ``usage`` of an ``LLMCalled`` (the module's docstring says what each key counts)."""

    input_tokens: int
    output_tokens: int
    cache_read_input_tokens: int
    cache_creation_input_tokens: int
    reasoning_output_tokens: int


class Cost(TypedDict):
    """A price the provider reported for the call: ``{"amount": "0.00042", "currency": "USD"}``."""

    amount: str
    currency: str


class ModelAnswer(TypedDict):
    """What a model function given to ``TaskSession.model_call`` returns."""

    output: Any
    usage: NotRequired[Usage]
    cost: NotRequired[Cost]


_MISSING = object()


def _field(source: Any, name: str) -> Any:
    """``source[name]`` of a mapping or ``source.name`` of an object (a provider SDK's pydantic
    model), None when absent."""
    if isinstance(source, Mapping):
        return source.get(name)
    return getattr(source, name, None)


def _usage_of(response: Any) -> Any:
    """The usage object of a response; a response without a ``usage`` field is taken to be one
    (so ``response.usage`` may be passed as well)."""
    if isinstance(response, Mapping):
        found = response.get("usage", _MISSING)
    else:
        found = getattr(response, "usage", _MISSING)
    return response if found is _MISSING else found


def _count(source: Any, *path: str, provider: str) -> int | None:
    """The token count at ``path`` in ``source``, None when any step of the path is missing or null."""
    value = source
    for name in path:
        if value is None:
            return None
        value = _field(value, name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{provider} usage {'.'.join(path)} is {value!r}, not a token count")
    return value


def _first(*counts: int | None) -> int | None:
    return next((count for count in counts if count is not None), None)


def _present(**counts: int | None) -> Usage:
    # The callers name Usage's keys, and only those.
    return cast(Usage, {key: count for key, count in counts.items() if count is not None})


def usage_from_openai(response: Any) -> Usage:
    """Our usage from an OpenAI Chat Completions or Responses answer (a dict, the SDK's object, or
    its ``usage``): the keys the answer reports, zeros included; ``{}`` when it reports none.

    Chat's ``prompt_tokens``/``completion_tokens`` and Responses' ``input_tokens``/``output_tokens``
    already include ``…_details.cached_tokens`` and ``…_details.reasoning_tokens``: the totals are
    kept as reported and the details recorded as parts, never added on. ``total_tokens`` is left
    out (it is the sum of the two totals).
    """
    usage = _usage_of(response)
    if usage is None:
        return {}
    return _present(
        input_tokens=_first(_count(usage, "input_tokens", provider="OpenAI"),
                            _count(usage, "prompt_tokens", provider="OpenAI")),
        output_tokens=_first(_count(usage, "output_tokens", provider="OpenAI"),
                             _count(usage, "completion_tokens", provider="OpenAI")),
        cache_read_input_tokens=_first(_count(usage, "input_tokens_details", "cached_tokens", provider="OpenAI"),
                                       _count(usage, "prompt_tokens_details", "cached_tokens", provider="OpenAI")),
        reasoning_output_tokens=_first(
            _count(usage, "output_tokens_details", "reasoning_tokens", provider="OpenAI"),
            _count(usage, "completion_tokens_details", "reasoning_tokens", provider="OpenAI"),
        ),
    )


def usage_from_anthropic(response: Any) -> Usage:
    """Our usage from an Anthropic Messages answer (a dict, the SDK's object, or its ``usage``):
    the keys the answer reports, zeros included; ``{}`` when it reports none.

    Anthropic's ``input_tokens`` excludes ``cache_read_input_tokens`` and
    ``cache_creation_input_tokens``, so our ``input_tokens`` is the three added up. When the answer
    has no ``input_tokens`` (a streaming ``message_delta``) the total is unknown and left out; the
    cache counts it does report are kept.
    """
    usage = _usage_of(response)
    if usage is None:
        return {}
    uncached = _count(usage, "input_tokens", provider="Anthropic")
    cache_read = _count(usage, "cache_read_input_tokens", provider="Anthropic")
    cache_creation = _count(usage, "cache_creation_input_tokens", provider="Anthropic")
    return _present(
        input_tokens=None if uncached is None else uncached + (cache_read or 0) + (cache_creation or 0),
        output_tokens=_count(usage, "output_tokens", provider="Anthropic"),
        cache_read_input_tokens=cache_read,
        cache_creation_input_tokens=cache_creation,
    )


def model_cost(amount: Decimal | str | int | float, currency: str = "USD") -> Cost:
    """A provider-reported price as ``LLMCalled`` records it: the amount as a plain decimal string
    (``Decimal("1E-7")`` becomes ``"0.0000001"``; a float is read as it prints, ``0.1`` is
    ``"0.1"``) and the ISO 4217 currency. Raises :class:`ValueError` for a negative, infinite or
    unreadable amount."""
    if isinstance(amount, bool):
        raise ValueError(f"cost amount {amount!r} is not a number")
    if isinstance(amount, float) and not math.isfinite(amount):
        raise ValueError(f"cost amount {amount!r} is not finite")
    try:
        value = Decimal(repr(amount) if isinstance(amount, float) else amount)
    except (InvalidOperation, TypeError, ValueError):
        raise ValueError(f"cost amount {amount!r} is not a decimal number") from None
    if not value.is_finite() or value < 0:
        raise ValueError(f"cost amount {amount!r} must be a finite, non-negative number")
    return {"amount": format(value.copy_abs(), "f"), "currency": currency}  # copy_abs: "-0" is "0"
