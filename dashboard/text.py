"""The dashboard's words: money, tokens, durations, spend rows, diff values and the timeline's
hover labels, written the same way on every page, in its tables and in its charts' data.

Formatting only: nothing here reads the database, and the charts' symbols and colours are the
pages' scripts' (static/js/).
"""

from __future__ import annotations

import json
from decimal import ROUND_HALF_UP, Decimal
from typing import TYPE_CHECKING, Any

from backplane.eventlog.chain import format_timestamp
from backplane.eventlog.costs import decimal_text
from backplane.eventlog.drift import MISSING
from dashboard.selectors.spend import TOKEN_PARTS

if TYPE_CHECKING:
    from dashboard.selectors.spend import Spend, SpendRow, SpendToday
    from dashboard.selectors.task_detail import Timeline, TimelinePoint, TimelineSpan

# --- money and tokens ----------------------------------------------------------------------------


def money_text(amount: Decimal, currency: str) -> str:
    """An amount as the pages show it: in cents from 1 up, to two significant digits below
    ("0.0042 USD", "0.02 USD"); the exact amount goes in a title or the JSON."""
    places = 2 if amount == 0 else max(2, 1 - amount.copy_abs().adjusted())
    text = f"{amount.quantize(Decimal(1).scaleb(-places), rounding=ROUND_HALF_UP):,.{places}f}"
    if places > 2:  # the second significant digit was a zero: "0.020" reads as "0.02"
        text = text.rstrip("0").ljust(text.index(".") + 3, "0")
    return f"{text} {currency}"


def unpriced_text(count: int) -> str:
    return f"{count:,} call{'' if count == 1 else 's'} with no price"


def plural(count: int, word: str) -> str:
    return f"{count:,} {word}{'' if count == 1 else 's'}"


def usage_text(usage: dict[str, Any]) -> str:
    """Tokens in and out, with the cached and reasoning parts when there are any."""
    def parts(total: str, *named: tuple[str, str]) -> str:
        shown = [f"{usage[key]:,} {words}" for key, words in named if usage.get(key)]
        return f"{usage.get(total) or 0:,}" + (f" ({', '.join(shown)})" if shown else "")

    tokens_in = parts("input_tokens", ("cache_read_input_tokens", "cache read"),
                      ("cache_creation_input_tokens", "cache write"))
    tokens_out = parts("output_tokens", ("reasoning_output_tokens", "reasoning"))
    return f"{tokens_in} in / {tokens_out} out tokens"


def model_call_text(*, model: str | None, provider: str | None, step: Any, usage: Any, cost: Any) -> str:
    """An ``LLMCalled`` in one line: the model, its step, its tokens and what it cost as
    recorded (backplane/eventlog/costs.py), or that it has no price."""
    usage = usage if isinstance(usage, dict) else {}
    cost = cost if isinstance(cost, dict) else {}
    words = [f"model call {provider}/{model}" if provider else f"model call {model}"]
    if step is not None:
        words.append(f"step {step}")
    words.append(usage_text(usage))
    if cost.get("amount") is not None:
        words.append(money_text(Decimal(cost["amount"]), cost.get("currency") or ""))
    else:
        words.append("no price")
    return " · ".join(words)


def charged_text(cost: Any) -> str:
    """What a paid tool's answer charged, for its bar's label (nothing for an unpaid one)."""
    if not isinstance(cost, dict) or cost.get("amount") is None:
        return ""
    return f" · charged {money_text(Decimal(cost['amount']), cost.get('currency') or '')}"


# --- spend ---------------------------------------------------------------------------------------


def spend_text(spend: Spend) -> str:
    """What it cost, in words: each currency, then the calls with no price, if any."""
    parts = [money_text(amount, currency) for currency, amount in spend.cost_items]
    if spend.unpriced_calls:
        parts.append(unpriced_text(spend.unpriced_calls))
    return " + ".join(parts) if parts else "nothing"


def spend_summary(scope: str, spend: Spend) -> str:
    """A rollup row in words: its cost, then what was counted (a tool's paid answers, or model
    calls and their tokens); ``scope`` is "" for the row that sums the rest of a long list."""
    if scope == "tool":
        return f"{spend_text(spend)} · {plural(spend.calls, 'paid answer')}"
    calls = plural(spend.calls, "model call" if scope else "call")
    return f"{spend_text(spend)} · {calls} · {usage_text(spend.tokens)}"


# --- the timeline --------------------------------------------------------------------------------


def duration_text(ms: float) -> str:
    if ms < 1000:
        return f"{ms:.0f} ms"
    if ms < 60_000:
        return f"{ms / 1000:.1f} s"
    return f"{ms / 60_000:.0f} min {ms % 60_000 / 1000:.0f} s"


def timeline_point_label(point: TimelinePoint) -> str:
    """A point's hover: what the event was, and its seq (the page's script reads the seq back
    off the end when the point is clicked)."""
    details = point.details
    if point.kind == "reasoning":
        words = f"step {details['step']}"
    elif point.kind == "model_call":
        words = model_call_text(model=details["model"], provider=details["provider"], step=details["step"],
                                usage=details["usage"], cost=details["cost"])
    elif point.kind in ("claim", "recovery"):
        words = f"{'recovered by' if point.kind == 'recovery' else 'claimed by'} {point.agent}"
    else:
        words = point.type
    return f"{words} (seq {point.seq})"


def timeline_span_label(span: TimelineSpan) -> str:
    """A bar's hover: the tool call (its step, its outcome, what it charged) or the sub-agent, and
    how long it took; "in flight" for an open one (the page's script adds its age)."""
    details = span.details
    if span.kind == "tool_call":
        words = f"{details['tool']} · step {details['step']}"
        if span.end is None:
            return f"{words} · in flight"
        words = f"{words} · {span.status}{charged_text(details.get('cost'))}"
    else:
        words = f"sub-agent {details['kind']}"
        if span.end is None:
            return f"{words} · in flight"
        words = f"{words} · {span.status}"
    return f"{words} · {duration_text((span.end - span.start).total_seconds() * 1000)}"


# --- the diff ------------------------------------------------------------------------------------

DIFF_VALUE_CHARS = 300


def diff_value(value: Any) -> str:
    """A value that differs, as compact JSON cut at ``DIFF_VALUE_CHARS``; "(absent)" on the side
    that has none."""
    if value is MISSING:
        return "(absent)"
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False, sort_keys=True)
    return text if len(text) <= DIFF_VALUE_CHARS else text[: DIFF_VALUE_CHARS - 1] + "…"


def timeline_json(timeline: Timeline) -> dict[str, Any]:
    """The timeline as the page's script draws it: times in RFC 3339, each point and bar with
    its label."""
    return {
        "points": [{"kind": p.kind, "type": p.type, "seq": p.seq, "at": format_timestamp(p.at), "lane": p.lane,
                    "label": timeline_point_label(p)} for p in timeline.points],
        "spans": [{"kind": s.kind, "key": s.key, "lane": s.lane, "start": format_timestamp(s.start),
                   "end": None if s.end is None else format_timestamp(s.end), "status": s.status,
                   "last_seq": s.last_seq, "label": timeline_span_label(s)} for s in timeline.spans],
        "lanes": timeline.lanes,
        "since": None if timeline.since is None else format_timestamp(timeline.since),
        "now": format_timestamp(timeline.now),
        "tool_calls": timeline.tool_calls,
        "in_flight": timeline.in_flight,
        "truncated": timeline.truncated,
    }


def spend_chart(today: SpendToday) -> dict[str, Any]:
    """The panel's charts' data. Per group (by model or tool, by agent), for each row: its
    scope, key and label; per currency its cost (exact decimal strings) and that cost in
    words; tokens per part; calls, and calls with no price (with their words); a summary
    for the hover."""
    currencies = sorted(today.total.cost)

    def group(rows: list[SpendRow]) -> dict[str, Any]:
        parts = [row.spend.token_parts() for row in rows]
        zero = Decimal(0)
        return {
            "scopes": [row.scope for row in rows],
            "keys": [row.key for row in rows],
            "labels": [row.label for row in rows],
            "cost": {c: {"amounts": [decimal_text(row.spend.cost.get(c, zero)) for row in rows],
                         "text": [money_text(row.spend.cost[c], c) if c in row.spend.cost else ""
                                  for row in rows]}
                     for c in currencies},
            "tokens": {part: [p[part] for p in parts] for part in TOKEN_PARTS},
            "calls": [row.spend.calls for row in rows],
            "unpriced_calls": [row.spend.unpriced_calls for row in rows],
            "unpriced_text": [unpriced_text(row.spend.unpriced_calls) if row.spend.unpriced_calls else ""
                              for row in rows],
            "summary": [spend_summary(row.scope, row.spend) for row in rows],
        }

    return {"since": format_timestamp(today.since), "currencies": currencies, "total": today.total.as_json(),
            "by_model": group(today.by_model), "by_agent": group(today.by_agent)}
