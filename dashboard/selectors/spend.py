"""Reads of model spend: today's on the overview, a task's and its tree's, each agent's last 24
hours.

Read from the cost rollups the event writer keeps in each model call's (or paid tool answer's)
transaction (backplane/eventlog/costs.py), never summed from the events on a page: every figure
is one aggregate over a few rows, whatever the number of calls. Rows of shared scopes are split
in shards and each currency is a row of its own, so every read sums the shards and keeps the
currencies apart. A call with no price adds to ``unpriced_calls`` and to no currency: its cost is
unknown, and is shown so, never as zero.

What a row counts depends on its scope: ``calls`` and tokens are model calls everywhere but in a
``tool`` row (there ``calls`` are a paid tool's answers); ``cost`` is the model calls' and the
paid tools' charges together, except in a ``model`` row (its calls only).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from django.utils import timezone

from backplane.eventlog import event_types as et
from backplane.eventlog.costs import decimal_text
from backplane.eventlog.models import Agent, CostRollup, Task
from backplane.runtime.replica import reads_connection
from dashboard.selectors.task_detail import SERVER_LANE

_SPEND_COLUMNS = ("calls", "unpriced_calls", *et.USAGE_KEYS, "cost")
# sum() of a bigint is a numeric: counts are cast back to whole numbers.
_SPEND_SUMS = ", ".join(f"sum(r.{name})" if name == "cost" else f"sum(r.{name})::bigint" for name in _SPEND_COLUMNS)
# The kinds of token a call's usage splits into, each counted once: cache reads and writes are
# part of ``input_tokens``, reasoning part of ``output_tokens`` (OpenTelemetry's GenAI usage).
TOKEN_PARTS = ("uncached input", "cache read", "cache write", "output", "reasoning")


@dataclass
class Spend:
    """Rollup rows summed: calls, how many had no price, tokens by type (``USAGE_KEYS``) and cost
    by currency (priced calls only)."""

    calls: int = 0
    unpriced_calls: int = 0
    tokens: dict[str, int] = field(default_factory=lambda: dict.fromkeys(et.USAGE_KEYS, 0))
    cost: dict[str, Decimal] = field(default_factory=dict)

    def add_row(self, currency: str, sums: Sequence[Any]) -> None:
        """Add a rollup row's sums (``_SPEND_COLUMNS`` in order); NULLs (no row) add nothing."""
        calls, unpriced, *tokens, cost = (value or 0 for value in sums)
        self.calls += calls
        self.unpriced_calls += unpriced
        for name, count in zip(et.USAGE_KEYS, tokens, strict=True):
            self.tokens[name] += count
        if currency:  # the rows of unpriced calls have none, and no cost
            self.cost[currency] = self.cost.get(currency, Decimal(0)) + Decimal(cost)

    def add(self, other: Spend) -> None:
        self.calls += other.calls
        self.unpriced_calls += other.unpriced_calls
        for name, count in other.tokens.items():
            self.tokens[name] += count
        for currency, amount in other.cost.items():
            self.cost[currency] = self.cost.get(currency, Decimal(0)) + amount

    @property
    def input_tokens(self) -> int:
        return self.tokens["input_tokens"]

    @property
    def output_tokens(self) -> int:
        return self.tokens["output_tokens"]

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    @property
    def cost_items(self) -> list[tuple[str, Decimal]]:
        return sorted(self.cost.items())

    @property
    def is_empty(self) -> bool:
        return not self.calls and not self.cost

    def token_parts(self) -> dict[str, int]:
        t = self.tokens
        return {
            "uncached input": t["input_tokens"] - t["cache_read_input_tokens"] - t["cache_creation_input_tokens"],
            "cache read": t["cache_read_input_tokens"],
            "cache write": t["cache_creation_input_tokens"],
            "output": t["output_tokens"] - t["reasoning_output_tokens"],
            "reasoning": t["reasoning_output_tokens"],
        }

    def rank(self) -> tuple[Decimal, int]:
        """For ordering the biggest first: the cost (currencies added, for the order only), then tokens."""
        return sum(self.cost.values(), Decimal(0)), self.total_tokens

    def as_json(self) -> dict[str, Any]:
        return {"calls": self.calls, "unpriced_calls": self.unpriced_calls, "tokens": dict(self.tokens),
                "cost": {currency: decimal_text(amount) for currency, amount in self.cost_items}}


# A rollup row: its scope and key ("provider/model", "namespace/tool", "namespace/agent").
RollupKey = tuple[str, str]


@dataclass(frozen=True)
class SpendRow:
    scope: str  # model, tool or agent; "" for the row that sums the rest of a long list
    key: str
    label: str
    spend: Spend


def spend_label(scope: str, key: str) -> str:
    """A rollup row's name on the cost panels: the model, "tool <namespace/tool>", or the agent."""
    if scope == "tool":
        return f"tool {key}"
    if scope == "agent":  # the backplane's own calls have no agent
        namespace, _, agent = key.partition("/")
        return f"{namespace}/{agent or SERVER_LANE}"
    return key


# A chart shows this many rows, the biggest; the rest are one row ("N more").
SPEND_TOP = 10


def _ranked(spends: dict[RollupKey, Spend]) -> list[SpendRow]:
    ordered = sorted(spends.items(), key=lambda item: (tuple(-v for v in item[1].rank()), item[0]))
    rows = [SpendRow(scope=scope, key=key, label=spend_label(scope, key), spend=spend)
            for (scope, key), spend in ordered]
    if len(rows) <= SPEND_TOP:
        return rows
    rest = Spend()
    for row in rows[SPEND_TOP - 1:]:
        rest.add(row.spend)
    folded = len(rows) - SPEND_TOP + 1
    return [*rows[: SPEND_TOP - 1], SpendRow(scope="", key="", label=f"{folded} more", spend=rest)]


@dataclass(frozen=True)
class SpendToday:
    """The overview's cost panel: today's (UTC) spend and model calls, in all (the namespaces'
    rollups), by model or paid tool, and by agent."""

    since: datetime
    total: Spend
    models: int  # how many models were called
    by_model: list[SpendRow]  # models and paid tools
    by_agent: list[SpendRow]



_SPEND_TODAY_SQL = f"""
SELECT r.scope, r.key, r.currency, {_SPEND_SUMS}
  FROM {CostRollup._meta.db_table} r
 WHERE r.scope IN ('namespace', 'model', 'tool', 'agent') AND r.hour >= %(since)s AND r.hour < %(until)s
 GROUP BY r.scope, r.key, r.currency
"""


def spend_today(*, now: datetime | None = None) -> SpendToday:
    """Today's (UTC) spend from the hourly rollups: in all, by model or paid tool, and by agent.
    One query."""
    now = now or timezone.now()
    since = now.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    total = Spend()
    by_scope: dict[str, dict[RollupKey, Spend]] = {"model": {}, "tool": {}, "agent": {}}
    with reads_connection().cursor() as cursor:
        cursor.execute(_SPEND_TODAY_SQL, {"since": since, "until": since + timedelta(days=1)})
        for scope, key, currency, *sums in cursor.fetchall():
            if scope == "namespace":
                total.add_row(currency, sums)
            else:
                by_scope[scope].setdefault((scope, key), Spend()).add_row(currency, sums)
    return SpendToday(since=since, total=total, models=len(by_scope["model"]),
                      by_model=_ranked({**by_scope["model"], **by_scope["tool"]}),
                      by_agent=_ranked(by_scope["agent"]))


@dataclass(frozen=True)
class TaskSpend:
    """A task's spend and model calls (its own) and its tree's: the root task's with all its
    sub-agents (the ``tree`` rollup is kept for roots only). For a root task the tree is its own
    with its sub-agents; for a sub-agent it is its root's."""

    own: Spend
    tree: Spend
    root_id: uuid.UUID
    is_root: bool


_TASK_SPEND_SQL = f"""
WITH RECURSIVE up(id, parent_id) AS (
    SELECT id, parent_id FROM backplane_task WHERE id = %(task)s
    UNION ALL
    SELECT t.id, t.parent_id FROM backplane_task t JOIN up ON t.id = up.parent_id
), root AS (SELECT id FROM up WHERE parent_id IS NULL)
SELECT root.id, r.scope, r.currency, {_SPEND_SUMS}
  FROM root LEFT JOIN {CostRollup._meta.db_table} r
    ON (r.scope = 'task' AND r.key = %(key)s) OR (r.scope = 'tree' AND r.key = root.id::text)
 GROUP BY root.id, r.scope, r.currency
"""


def task_spend(task: Task) -> TaskSpend:
    """The task's own and its tree's spend, from their rollups (one row per currency each): one
    query, which finds the root too."""
    own, tree = Spend(), Spend()
    with reads_connection().cursor() as cursor:
        cursor.execute(_TASK_SPEND_SQL, {"task": task.pk, "key": str(task.pk)})
        rows = cursor.fetchall()
    root_id = rows[0][0] if rows else task.pk
    for _, scope, currency, *sums in rows:
        if scope is not None:  # the root with no rollup row
            (own if scope == "task" else tree).add_row(currency, sums)
    return TaskSpend(own=own, tree=tree, root_id=root_id, is_root=root_id == task.pk)


SPEND_WINDOW_HOURS = 24


@dataclass(frozen=True)
class AgentSpend:
    """Spend and model calls per agent over the last ``SPEND_WINDOW_HOURS`` whole hours (this
    one included)."""

    since: datetime
    by_key: dict[str, Spend]

    def of(self, namespace: str, name: str) -> Spend:
        return self.by_key.get(f"{namespace}/{name}") or Spend()

    def others(self, agents: Iterable[Agent]) -> list[SpendRow]:
        """The spend recorded by no listed agent (people, the backplane), biggest first."""
        known = {f"{agent.namespace}/{agent.name}" for agent in agents}
        return _ranked({("agent", k): v for k, v in self.by_key.items() if k not in known})


_AGENT_SPEND_SQL = f"""
SELECT r.key, r.currency, {_SPEND_SUMS}
  FROM {CostRollup._meta.db_table} r
 WHERE r.scope = 'agent' AND r.hour >= %(since)s
 GROUP BY r.key, r.currency
"""


def agent_spend(*, now: datetime | None = None) -> AgentSpend:
    """Each agent's spend and model calls of the last 24 hourly rollups: one query."""
    now = now or timezone.now()
    since = now.replace(minute=0, second=0, microsecond=0) - timedelta(hours=SPEND_WINDOW_HOURS - 1)
    by_key: dict[str, Spend] = {}
    with reads_connection().cursor() as cursor:
        cursor.execute(_AGENT_SPEND_SQL, {"since": since})
        for key, currency, *sums in cursor.fetchall():
            by_key.setdefault(key, Spend()).add_row(currency, sums)
    return AgentSpend(since=since, by_key=by_key)
