"""Template helpers of the dashboard: shortened ids with a copy button, times the browser
shows in the viewer's timezone (``static/js/live.js`` rewrites every ``<time>``), JSON, and
model spend (money, tokens, calls with no price)."""

from __future__ import annotations

import json
from datetime import datetime
from decimal import Decimal
from typing import Any

from django import template
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe

from backplane.eventlog.chain import format_timestamp
from backplane.eventlog.costs import decimal_text
from dashboard.selectors.spend import Spend
from dashboard.text import money_text, unpriced_text, usage_text

register = template.Library()


@register.simple_tag
def short_id(value: Any, length: int = 8) -> SafeString:
    """The first ``length`` characters, the whole value on hover and a copy button."""
    if value is None or value == "":
        return format_html('<span class="muted">—</span>')
    full = str(value)
    return format_html(
        '<span class="id" title="{}"><code>{}</code><button type="button" class="copy" data-copy="{}" '
        'aria-label="copy {}" title="copy">{}</button></span>',
        full, full[:length] + ("…" if len(full) > length else ""), full, full, COPY_ICON,
    )


# Drawn, not a character: the fonts of a bare Debian chromium have no glyph for ⧉.
COPY_ICON = mark_safe(
    '<svg viewBox="0 0 16 16" aria-hidden="true"><rect x="5" y="5" width="9" height="9" rx="1.5" fill="none" '
    'stroke="currentColor" stroke-width="1.5"/><path d="M3 11V3.5A1.5 1.5 0 0 1 4.5 2H11" fill="none" '
    'stroke="currentColor" stroke-width="1.5"/></svg>'
)


@register.simple_tag
def when(value: datetime | None, relative: bool = False, short: bool = False) -> SafeString:
    """A time the page shows in the viewer's timezone with seconds (UTC until the script runs);
    ``relative`` shows "3 min ago" instead, kept current by the script; ``short`` leaves the
    date out when it is today."""
    if value is None:
        return format_html('<span class="muted">—</span>')
    stamp = format_timestamp(value)
    utc = value.strftime("%Y-%m-%d %H:%M:%S UTC")
    if relative:
        return format_html('<time datetime="{}" data-relative title="{}">{}</time>', stamp, utc, utc)
    if short:
        return format_html('<time datetime="{}" data-short title="{}">{}</time>', stamp, utc, utc)
    return format_html('<time datetime="{}" title="{}">{}</time>', stamp, utc, utc)


@register.filter
def pretty_json(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False)


@register.filter
def compact_json(value: Any, limit: int = 120) -> str:
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    return text if len(text) <= limit else text[: limit - 1] + "…"


@register.filter
def short_hash(value: str | None, length: int = 12) -> str:
    return (value or "")[:length]


CHAIN_MARKS = {
    "verified": ("✓", "verified: the chain holds up to and including this event"),
    "unverified": ("○", "not verified yet"),
    "broken": ("✕", "the chain is broken here"),
}


@register.simple_tag
def chain_mark(chain: Any, seq: int) -> SafeString:
    """The event's place in its chain: verified through here, not yet verified, or broken here."""
    state = chain.mark(seq)
    symbol, words = CHAIN_MARKS[state]
    return format_html('<span class="chain-mark" data-chain="{}" title="{}">{}</span>', state, words, symbol)


@register.filter
def every(seconds: float) -> str:
    """A schedule's interval as people say it: 2 s, 10 min, 6 h."""
    for unit, size in (("h", 3600), ("min", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:.0f} {unit}"
    return f"{seconds:g} s"


@register.filter
def duration_until(start: datetime | None, end: datetime | None) -> str:
    """How long from ``start`` to ``end``, in the unit that reads best (ms, s, min)."""
    if start is None or end is None:
        return "—"
    seconds = (end - start).total_seconds()
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 120:
        return f"{seconds:.1f} s"
    return f"{seconds // 60:.0f} min {seconds % 60:.0f} s"


DIFF_KINDS = {"same": "same", "changed": "changed", "only_in_a": "only in A", "only_in_b": "only in B"}


@register.filter
def diff_kind(kind: str) -> str:
    """A pair's kind (backplane/eventlog/drift.py) as the diff page says it."""
    return DIFF_KINDS.get(kind, kind)


# --- model spend ---------------------------------------------------------------------------------


@register.filter
def count(value: int | None) -> str:
    """A count with thousands separated: 12,345."""
    return f"{value or 0:,}"


@register.simple_tag
def spend_cost(spend: Spend, unpriced: bool = True) -> SafeString:
    """What was spent: each currency (the exact amount on hover), then the calls with no price,
    shown as such (unless ``unpriced`` is off: the page says it beside): their cost is unknown,
    never added in as zero."""
    parts = [format_html('<span class="money" data-currency="{}" data-amount="{}" title="{} {}">{}</span>',
                         currency, decimal_text(amount), decimal_text(amount), currency, money_text(amount, currency))
             for currency, amount in spend.cost_items]
    if spend.unpriced_calls and unpriced:
        parts.append(format_html('<span class="unpriced" data-unpriced="{}" title="{}">{}</span>',
                                 spend.unpriced_calls, "no rate in the price table and no cost reported: "
                                 "see the price table in the admin", unpriced_text(spend.unpriced_calls)))
    if not parts:
        return format_html('<span class="muted">{}</span>', "—")
    return format_html_join(" + ", "{}", ((part,) for part in parts))


@register.simple_tag
def spend_tokens(spend: Spend) -> SafeString:
    """Tokens in and out; the cached and reasoning parts on hover."""
    t = spend.tokens
    detail = (f"input {t['input_tokens']:,}: {t['cache_read_input_tokens']:,} cache read, "
              f"{t['cache_creation_input_tokens']:,} cache write · output {t['output_tokens']:,}: "
              f"{t['reasoning_output_tokens']:,} reasoning")
    return format_html('<span class="tokens" title="{}">{} in / {} out tokens</span>', detail,
                       f"{spend.input_tokens:,}", f"{spend.output_tokens:,}")


@register.simple_tag
def spend_summary(spend: Spend) -> SafeString:
    """Cost (model calls and paid tools), model calls and their tokens in one line, or that
    nothing was spent."""
    if spend.is_empty:
        return format_html('<span class="muted">{}</span>', "no model calls, no paid tools")
    if not spend.calls:  # paid tools only
        return format_html('{} · <span class="muted">{}</span>', spend_cost(spend), "no model calls")
    return format_html('{} · {} model call{} · {}', spend_cost(spend), f"{spend.calls:,}",
                       "" if spend.calls == 1 else "s", spend_tokens(spend))


@register.filter
def unpriced(calls: int) -> str:
    """"3 calls with no price"."""
    return unpriced_text(calls)


COST_SOURCES = {"provider": "as the provider reported it", "price_table": "from the price table"}


@register.simple_tag
def tool_charge(payload: dict[str, Any]) -> SafeString:
    """What a paid tool's answer (a ``ToolCallResultReceived`` with a ``cost``) charged, as reported."""
    cost = _object(payload.get("cost"))
    if cost.get("amount") is None:
        return format_html("")
    amount, currency = Decimal(cost["amount"]), cost.get("currency") or ""
    return format_html('<div class="call-cost" data-field="call-cost">{} charged <span class="money" title="{} {}, '
                       'as the tool reported it">{}</span></div>', payload.get("tool"), decimal_text(amount), currency,
                       money_text(amount, currency))


@register.simple_tag
def model_call(payload: dict[str, Any]) -> SafeString:
    """An ``LLMCalled`` event's model, tokens and cost, as recorded with it."""
    usage, cost = _object(payload.get("usage")), _object(payload.get("cost"))
    provider, model = payload.get("provider"), payload.get("model")
    if cost.get("amount") is not None:
        amount, currency = Decimal(cost["amount"]), cost.get("currency") or ""
        source = COST_SOURCES.get(str(cost.get("source")), str(cost.get("source")))
        if cost.get("price_version"):
            source = f"{source}, version {cost['price_version']}"
        priced = format_html('<span class="money" title="{} {}, {}">{}</span>', decimal_text(amount), currency,
                             source, money_text(amount, currency))
    else:
        priced = format_html('<span class="unpriced" title="{}">no price</span>', cost.get("reason") or "unpriced")
    return format_html('<div class="call-cost" data-field="call-cost">{} · {} · {}</div>',
                       f"{provider}/{model}" if provider else model, usage_text(usage), priced)


def _object(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}
