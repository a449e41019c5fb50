"""What model calls cost: priced when they are recorded, summed by the writer as they are.

An ``LLMCalled`` event carries the call's usage by token type (``USAGE_KEYS``, OpenTelemetry
GenAI's ``gen_ai.usage.*`` flattened). Its cost is settled once, when the event is appended
(``llm_called_priced``), and kept on the event: what the provider reported (``source:
"provider"``), else what the price table said then (``source: "price_table"`` and the rates'
``price_version``), else nothing, said so (``source: "unpriced"``, never a silent zero). A later
price change never rewrites history: it is a new version of the table for later calls.

A paid tool's answer may carry the cost the tool charged (``ToolCallResultReceived``'s
``cost``, as its provider reported it); it is summed with the model calls, under its tool.

The writer then adds each priced call into ``CostRollup`` rows (``rollup_records``) in the same
statement as the event, so the rollups always equal the sum of the events;
``rollup_differences`` recomputes them from the log to prove it. Sandboxes (replays) are left out:
they are not the fleet's spending.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

from django.db import connection, transaction

from backplane.eventlog import event_types as et
from backplane.eventlog.errors import InvalidInput
from backplane.eventlog.event_types import USAGE_KEYS, amount_within_bounds, reported_cost
from backplane.eventlog.models import ALL_TIME, CostRollup, Event, ModelPrice, Task, TokenType

MILLION = Decimal(1_000_000)
# Shared scopes' rows are split in this many, by task (CostRollup's docstring).
SHARDS = 16


# --- prices ----------------------------------------------------------------------------------

# Which rate prices a token type the table has no row for: cached tokens at the input rate,
# reasoning at the output rate (how providers that do not list them bill them).
_FALLBACK = {TokenType.CACHE_READ: TokenType.INPUT, TokenType.CACHE_WRITE: TokenType.INPUT,
             TokenType.REASONING: TokenType.OUTPUT}


@dataclass(frozen=True)
class Rates:
    currency: str
    version: str
    per_million: Mapping[str, Decimal]


# On the append path of every model call: SQL written once, as the writer's statements are (the
# queryset API compiles a statement in more Python than its round trip takes).
RATES_SQL = """
SELECT DISTINCT ON (token_type) token_type, per_million, currency, version
FROM backplane_modelprice
WHERE provider = %s AND model = %s AND valid_from <= %s AND (valid_to IS NULL OR valid_to > %s)
ORDER BY token_type, valid_from DESC
"""


def rates_at(*, provider: str, model: str, at: datetime) -> Rates | None:
    """The provider's model's rates in force at ``at``, or None when the table has none."""
    with connection.cursor() as cursor:
        cursor.execute(RATES_SQL, [provider, model, at, at])
        return rates_from(cursor.fetchall())


def rates_from(rows: Sequence[Sequence[Any]]) -> Rates | None:
    """``RATES_SQL``'s rows as the rates they make, or None when they make none."""
    latest = {token_type: (per_million, currency, version) for token_type, per_million, currency, version in rows}
    if TokenType.INPUT not in latest or TokenType.OUTPUT not in latest:
        return None
    currencies = {currency for _, currency, _ in latest.values()}
    if len(currencies) != 1:
        return None  # a table that mixes currencies for one model cannot be summed
    versions = sorted({version for _, _, version in latest.values()})
    return Rates(currency=currencies.pop(), version="+".join(versions),
                 per_million={t: per_million for t, (per_million, _, _) in latest.items()})


def cost_of(usage: Mapping[str, int], rates: Rates) -> Decimal:
    """The cost of ``usage`` at ``rates``: each token type at its own rate (``_FALLBACK`` when
    the table lists none), uncached input and non-reasoning output as the remainders."""
    cache_read = usage.get("cache_read_input_tokens", 0)
    cache_write = usage.get("cache_creation_input_tokens", 0)
    reasoning = usage.get("reasoning_output_tokens", 0)
    counts = {
        TokenType.INPUT: usage.get("input_tokens", 0) - cache_read - cache_write,
        TokenType.CACHE_READ: cache_read,
        TokenType.CACHE_WRITE: cache_write,
        TokenType.OUTPUT: usage.get("output_tokens", 0) - reasoning,
        TokenType.REASONING: reasoning,
    }
    total = Decimal(0)
    for token_type, count in counts.items():
        rate = rates.per_million.get(token_type, rates.per_million.get(_FALLBACK.get(token_type, token_type)))
        total += Decimal(count) * (rate or Decimal(0)) / MILLION
    return total


def llm_called_priced(payload: dict[str, Any], *, at: datetime) -> dict[str, Any]:
    """The payload (already validated: ``event_types.validate_llm_called``) with its ``cost``
    settled, as the module's docstring says; reads the price table only when the caller
    reported no cost."""
    wanted = rates_wanted(payload)
    return llm_called_settled(payload, rates_at(provider=wanted[0], model=wanted[1], at=at) if wanted else None)


def rates_wanted(payload: dict[str, Any]) -> tuple[str, str] | None:
    """The (provider, model) whose rates price a model call (``RATES_SQL``'s first two
    parameters); None when none are read: the caller reported the cost, or named no provider."""
    provider = payload.get("provider")
    return None if "cost" in payload or not isinstance(provider, str) else (provider, payload["model"])


def llm_called_settled(payload: dict[str, Any], rates: Rates | None) -> dict[str, Any]:
    """``llm_called_priced`` once the rates it wanted (``rates_wanted``) are read, on either driver."""
    if "cost" in payload:
        amount, currency = reported_cost(payload["cost"])
        return {**payload, "cost": {"amount": decimal_text(amount), "currency": currency, "source": "provider"}}
    provider = payload.get("provider")
    if rates is None:
        return {**payload, "cost": {"amount": None, "currency": None, "source": "unpriced",
                                    "reason": f"no price for {provider or '(no provider)'}/{payload['model']}"}}
    amount = cost_of(payload.get("usage") or {}, rates)
    if not amount_within_bounds(amount):
        # Counts and rates are bounded, but their product can still pass what a reported
        # amount may be (and what the rollups' numeric columns hold).
        raise InvalidInput("payload.usage at the price table's rates costs more than an amount may be",
                           {"payload.usage": f"this usage costs {amount:.0f} {rates.currency}"})
    return {**payload, "cost": {"amount": decimal_text(amount), "currency": rates.currency,
                                "source": "price_table", "price_version": rates.version}}


def decimal_text(amount: Decimal) -> str:
    """An amount as the log keeps it: plain digits, no exponent, no trailing zeros ("5.45", "0")."""
    return format(amount.normalize(), "f")


def prices_load(path: Path) -> int:
    """Add the rates of a prices file (JSON: ``{"prices": [{provider, model, token_type,
    per_million, currency, valid_from, valid_to?, version}]}``) that the table lacks; returns how
    many were added. Insert-only: a rate already there (same provider, model, type and start) is
    left as it is, so an administrator's edit survives the next start."""
    data = json.loads(path.read_text())
    added = 0
    with transaction.atomic(durable=True):
        for item in data["prices"]:
            _, created = ModelPrice.objects.get_or_create(
                provider=item["provider"], model=item["model"], token_type=item["token_type"],
                valid_from=item["valid_from"],
                defaults={"per_million": Decimal(str(item["per_million"])), "currency": item.get("currency", "USD"),
                          "valid_to": item.get("valid_to"), "version": item["version"]},
            )
            added += created
    return added


# --- rollups ---------------------------------------------------------------------------------

_COUNTERS = ("calls", "unpriced_calls", *USAGE_KEYS, "cost")


def costs_something(event: Any) -> bool:
    """A model call, or a paid tool's answer (a ``ToolCallResultReceived`` with a ``cost``)."""
    return event.type == et.LLM_CALLED or (event.type == et.TOOL_CALL_RESULT_RECEIVED and "cost" in event.payload)


def _scopes(task: Task, root_id: Any, event: Any) -> list[tuple[str, str, bool]]:
    """(scope, key, by hour) of each rollup an event adds into: a model call into its model's,
    a paid tool's answer into its tool's."""
    payload = event.payload
    own = (("model", f"{payload.get('provider') or ''}/{payload['model']}", True) if event.type == et.LLM_CALLED
           else ("tool", f"{task.namespace}/{payload['tool']}", True))
    return [("task", str(task.pk), False), ("tree", str(root_id), False),
            ("agent", f"{task.namespace}/{event.agent or ''}", True), own, ("namespace", task.namespace, True)]


def task_root_id(task: Task) -> uuid.UUID:
    """The root of the task's tree: the task itself, or its topmost parent (one query)."""
    if task.parent_id is None:
        return task.pk
    with connection.cursor() as cursor:
        cursor.execute(TASK_ROOT_SQL, [task.pk])
        return uuid.UUID(str(cursor.fetchone()[0]))


# The topmost parent of a task that has one, on either driver (``task_root_id``).
TASK_ROOT_SQL = """
WITH RECURSIVE up(id, parent_id) AS (
    SELECT id, parent_id FROM backplane_task WHERE id = %s
    UNION ALL
    SELECT t.id, t.parent_id FROM backplane_task t JOIN up ON t.id = up.parent_id
)
SELECT id FROM up WHERE parent_id IS NULL
"""


# A rollup row's identity: scope, key, hour (ISO 8601), shard, currency.
RowKey = tuple[str, str, str, int, str]


def rollup_rows(task: Task, events: Iterable[Any], *, root_id: Any) -> dict[RowKey, dict[str, Any]]:
    """The rollup increments of ``task``'s ``LLMCalled`` events, by row."""
    rows: dict[RowKey, dict[str, Any]] = {}
    shard = task.pk.int % SHARDS
    for event in events:
        if not costs_something(event):
            continue
        payload = event.payload
        # Tokens and calls count model calls; a paid tool adds its cost (and its own rows' calls).
        model_call = event.type == et.LLM_CALLED
        cost = payload.get("cost") or {}
        priced = cost.get("amount") is not None
        currency = cost.get("currency") or "" if priced else ""
        hour = event.recorded_at.replace(minute=0, second=0, microsecond=0).isoformat()
        for scope, key, by_hour in _scopes(task, root_id, event):
            row_key = (scope, key, hour if by_hour else ALL_TIME, shard if by_hour else 0, currency)
            row = rows.setdefault(row_key, dict.fromkeys(_COUNTERS, 0))
            row["cost"] += Decimal(cost["amount"]) if priced else Decimal(0)
            if model_call or scope == "tool":
                row["calls"] += 1
            if model_call:
                row["unpriced_calls"] += 0 if priced else 1
                for usage_key in USAGE_KEYS:
                    row[usage_key] += (payload.get("usage") or {}).get(usage_key, 0)
    return rows


def rollup_records(writes: Iterable[tuple[Task, Sequence[Event]]]) -> list[dict[str, Any]]:
    """The rollup increments of a write (events by task) as the writer's statement takes them
    (``ROLLUP_UPSERT_SQL``): one record per row, since one statement may not update a row twice,
    in key order, so two writers that share rows always lock them in the same order. Sandboxes
    add nothing; a write with nothing that costs makes no query."""
    rows: dict[RowKey, dict[str, Any]] = {}
    for task, events in writes:
        if task.sandbox or not any(costs_something(event) for event in events):
            continue
        for row_key, counters in rollup_rows(task, events, root_id=task_root_id(task)).items():
            total = rows.setdefault(row_key, dict.fromkeys(_COUNTERS, 0))
            for name in _COUNTERS:
                total[name] += counters[name]
    return [{"scope": k[0], "key": k[1], "hour": k[2], "shard": k[3], "currency": k[4],
             **{name: str(value) if name == "cost" else value for name, value in v.items()}}
            for k, v in sorted(rows.items())]


# The rollups' part of the writer's statement (a CTE of it: the increments arrive with the
# events, in the same round trip). Its one parameter is ``rollup_records``' rows as JSON.
ROLLUP_UPSERT_SQL = f"""
    INSERT INTO backplane_costrollup ({", ".join(("scope", "key", "hour", "shard", "currency", *_COUNTERS))})
    SELECT {", ".join(("scope", "key", "hour", "shard", "currency", *_COUNTERS))}
    FROM jsonb_to_recordset(%s::jsonb) AS r(
        scope text, key text, hour timestamptz, shard smallint, currency text, calls bigint,
        unpriced_calls bigint, input_tokens bigint, output_tokens bigint, cache_read_input_tokens bigint,
        cache_creation_input_tokens bigint, reasoning_output_tokens bigint, cost numeric)
    ORDER BY scope, key, hour, shard, currency
    ON CONFLICT (scope, key, hour, shard, currency) DO UPDATE SET
        {", ".join(f"{name} = backplane_costrollup.{name} + excluded.{name}" for name in _COUNTERS)}
"""


def rollup_differences() -> list[str]:
    """Every rollup that is not the sum of its events (``rebuild_projections --check``): the
    log's model calls summed afresh, against the rows with their shards summed. Empty: they agree."""
    expected: dict[tuple[str, str, str, str], dict[str, Any]] = {}
    kinds = [et.LLM_CALLED, et.TOOL_CALL_RESULT_RECEIVED]
    tasks = {task.pk: task for task in Task.objects.filter(sandbox=False, events__type__in=kinds).distinct()}
    for task in tasks.values():
        events = Event.objects.filter(task=task, type__in=kinds).only("type", "payload", "agent", "recorded_at")
        for (scope, key, hour, _shard, currency), row in rollup_rows(task, events, root_id=task_root_id(task)).items():
            total = expected.setdefault((scope, key, hour, currency), dict.fromkeys(_COUNTERS, 0))
            for name in _COUNTERS:
                total[name] += row[name]
    actual: dict[tuple[str, str, str, str], dict[str, Any]] = {}
    for rollup in CostRollup.objects.all():
        total = actual.setdefault((rollup.scope, rollup.key, rollup.hour.isoformat(), rollup.currency),
                                  dict.fromkeys(_COUNTERS, 0))
        for name in _COUNTERS:
            total[name] += getattr(rollup, name)
    differences = []
    for row_key in sorted(set(expected) | set(actual)):
        want, have = expected.get(row_key), actual.get(row_key)
        if want is None or have is None or any(Decimal(want[n]) != Decimal(have[n]) for n in _COUNTERS):
            differences.append(f"{'/'.join(row_key)}: rollup {have} but the events sum to {want}")
    return differences
