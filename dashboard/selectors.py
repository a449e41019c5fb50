"""Reads of the dashboard: the overview's figures, the task list, a task's page, the diff of
two tasks' histories, and model spend (from the cost rollups).

Every function here runs a fixed number of queries whatever the number of rows (the tests
hold them to it with ``django_assert_max_num_queries``; ``drift_page`` reads two whole
histories, one query per range of up to 5,000 events), and none counts or offsets through
a whole table: lists are keyset-paginated, time windows go through the BRIN index on
``recorded_at``, payload search through the GIN index over the payloads' words (migration
``backplane.0011``).

Raw SQL here takes its connection from ``reads_connection()``, as the ORM's reads take theirs from
the router: the read replica on the pages that opt in with ``replica_reads``, the primary
everywhere else (backplane/runtime/replica.py).
"""

from __future__ import annotations

import base64
import binascii
import json
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

from django.db.models import Q
from django.db.models.fields.json import KT
from django.urls import reverse
from django.utils import timezone

from backplane.delivery.models import OutboxMessage
from backplane.eventlog import event_types as et
from backplane.eventlog import lineage
from backplane.eventlog.chain import format_timestamp
from backplane.eventlog.costs import decimal_text
from backplane.eventlog.drift import MISSING, HistoryEntry
from backplane.eventlog.models import Agent, CostRollup, Event, Task, TaskStatus
from backplane.eventlog.selectors import TaskFilters, tasks_filtered
from backplane.integrity.models import (
    IntegrityAlert,
    IntegrityAlertKind,
    VerificationMode,
    VerificationRun,
    VerifiedHead,
)
from backplane.runtime.replica import reads_connection

# --- the overview ------------------------------------------------------------------------------

# Events that are drawn on the overview's chart, per minute.
CHART_SERIES = {
    "events": None,
    "completions": et.TASK_COMPLETED,
    "stalls": et.TASK_STALLED,
    "recoveries": et.TASK_CLAIMED,  # only claims with "recovered": true
}


@dataclass(frozen=True)
class Overview:
    now: datetime
    tasks_by_status: dict[str, int]
    events_last_minute: int
    outbox_pending: int
    outbox_oldest_at: datetime | None
    dead_letters_pending: int
    stalled_last_hour: int
    recovering: int
    recoveries_last_hour: int
    replays_last_hour: int
    breakers_open: int
    last_run: VerificationRun | None
    open_alerts: int

    @property
    def hour_ago(self) -> datetime:
        return self.now - timedelta(hours=1)


# Sandboxes (replays against the record, ``Task.sandbox``) are no part of the fleet's figures:
# every count of tasks or of their events leaves them out. ``NOT EXISTS`` lets the planner pick
# an index probe per row for the small sets (stalls, recoveries) or one hashed anti-join.
NOT_SANDBOX = "NOT EXISTS (SELECT 1 FROM backplane_task s WHERE s.id = {table}.task_id AND s.sandbox)"

_OVERVIEW_FIGURES_SQL = f"""
SELECT
  (SELECT count(*) FROM backplane_event e WHERE recorded_at > %(minute_ago)s AND {NOT_SANDBOX.format(table="e")}),
  (SELECT count(*) FROM backplane_outboxmessage WHERE status = 'pending'),
  (SELECT min(created_at) FROM backplane_outboxmessage WHERE status = 'pending'),
  (SELECT count(*) FROM backplane_deadletter WHERE status = 'pending'),
  (SELECT count(DISTINCT task_id) FROM backplane_event e
    WHERE recorded_at >= %(hour_ago)s AND type = 'TaskStalled' AND {NOT_SANDBOX.format(table="e")}),
  (SELECT count(*) FROM backplane_task WHERE status IN ('pending', 'running') AND attempts > 0 AND NOT sandbox),
  (SELECT count(*) FROM backplane_event e
    WHERE recorded_at >= %(hour_ago)s AND type = 'TaskClaimed' AND payload @> '{{"recovered": true}}'
      AND {NOT_SANDBOX.format(table="e")}),
  (SELECT coalesce(sum(count), 0) FROM backplane_idempotentreplay r
    WHERE minute >= %(replay_since)s AND {NOT_SANDBOX.format(table="r")}),
  (SELECT count(*) FROM backplane_agent WHERE breaker_state <> 'closed')
    + (SELECT count(*) FROM recovery_tool WHERE breaker_state <> 'closed'),
  (SELECT count(*) FROM backplane_integrityalert WHERE acknowledged_at IS NULL)
"""


def overview(*, now: datetime | None = None) -> Overview:
    """The overview's tiles, sandboxes left out: three queries."""
    now = now or timezone.now()
    by_status = dict.fromkeys(TaskStatus.values, 0)
    with reads_connection().cursor() as cursor:
        cursor.execute("SELECT status, count(*) FROM backplane_task WHERE NOT sandbox GROUP BY status")
        by_status.update(dict(cursor.fetchall()))
        cursor.execute(
            _OVERVIEW_FIGURES_SQL,
            {
                "minute_ago": now - timedelta(minutes=1),
                "hour_ago": now - timedelta(hours=1),
                # Replays are counted per whole minute: the minute an hour ago counts whole.
                "replay_since": (now - timedelta(hours=1)).replace(second=0, microsecond=0),
            },
        )
        (events, outbox_pending, outbox_oldest, dead_letters, stalled, recovering, recoveries, replays,
         breakers, alerts) = cursor.fetchone()
    return Overview(
        now=now,
        tasks_by_status=by_status,
        events_last_minute=events,
        outbox_pending=outbox_pending,
        outbox_oldest_at=outbox_oldest,
        dead_letters_pending=dead_letters,
        stalled_last_hour=stalled,
        recovering=recovering,
        recoveries_last_hour=recoveries,
        replays_last_hour=int(replays),
        breakers_open=breakers,
        last_run=VerificationRun.objects.filter(finished_at__isnull=False)
        .exclude(mode=VerificationMode.ON_DEMAND)
        .order_by("-finished_at", "-pk")
        .first(),
        open_alerts=alerts,
    )


def activity_per_minute(*, hours: int, now: datetime | None = None) -> dict[str, Any]:
    """Events, completions, stalls and recoveries per minute over the last ``hours``, as the
    chart's data: every minute present (zeros included), times in RFC 3339. Sandboxes' events
    are left out."""
    now = now or timezone.now()
    end = now.replace(second=0, microsecond=0) + timedelta(minutes=1)
    start = end - timedelta(hours=hours)
    bucket = "date_trunc('minute', recorded_at)" if hours <= 6 else "date_bin('5 minutes', recorded_at, %(start)s)"
    step = timedelta(minutes=1 if hours <= 6 else 5)
    with reads_connection().cursor() as cursor:
        cursor.execute(
            f"""
            SELECT {bucket} AS minute,
                   count(*),
                   count(*) FILTER (WHERE type = 'TaskCompleted'),
                   count(*) FILTER (WHERE type = 'TaskStalled'),
                   count(*) FILTER (WHERE type = 'TaskClaimed' AND payload @> '{{"recovered": true}}')
              FROM backplane_event e
             WHERE recorded_at >= %(start)s AND recorded_at < %(end)s AND {NOT_SANDBOX.format(table="e")}
             GROUP BY 1
            """,
            {"start": start, "end": end},
        )
        counted = {row[0]: row[1:] for row in cursor.fetchall()}
    minutes: list[str] = []
    series: dict[str, list[int]] = {name: [] for name in CHART_SERIES}
    at = start
    while at < end:
        minutes.append(format_timestamp(at))
        for name, value in zip(CHART_SERIES, counted.get(at, (0, 0, 0, 0)), strict=True):
            series[name].append(value)
        at += step
    return {"minutes": minutes, "series": series, "hours": hours, "step_minutes": int(step.total_seconds() // 60)}


@dataclass(frozen=True)
class FeedEvent:
    position: int
    task_id: uuid.UUID
    seq: int
    type: str
    agent: str | None
    recorded_at: datetime
    task_kind: str
    task_status: str


def feed_events(*, after_position: int | None = None, limit: int = 30) -> list[FeedEvent]:
    """The newest events (after ``after_position`` when given), newest first, with their task's kind."""
    events = Event.objects.order_by("-position")
    if after_position is not None:
        events = events.filter(position__gt=after_position)
    rows = events.values_list("position", "task_id", "seq", "type", "agent", "recorded_at", "task__kind",
                              "task__status")[:limit]
    return [FeedEvent(*row) for row in rows]


# --- the task list -----------------------------------------------------------------------------


LIST_FIELDS = ("id", "namespace", "kind", "status", "attempts", "max_attempts", "lease_holder", "lease_expires_at",
               "last_seq", "parent_id", "created_at", "updated_at", "last_event_at", "forked_from_id", "forked_at_seq",
               "sandbox")


@dataclass(frozen=True)
class TaskPage:
    tasks: list[Task]
    next_cursor: str | None
    cursor: str | None


class BadCursor(ValueError):
    pass


def encode_cursor(task: Task) -> str:
    raw = f"{task.created_at.isoformat()}|{task.pk}".encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[datetime, uuid.UUID]:
    try:
        if len(cursor) > 200:  # ``encode_cursor`` writes about 80: refused before decoding
            raise ValueError("too long")
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        created, task_id = raw.split("|")
        at = datetime.fromisoformat(created)
        if at.tzinfo is None:
            raise ValueError("naive time")
        return at, uuid.UUID(task_id)
    except (ValueError, binascii.Error, UnicodeDecodeError) as exc:
        raise BadCursor("not a cursor of this list") from exc


def task_page(filters: TaskFilters, *, cursor: str | None = None, limit: int = 50) -> TaskPage:
    """One page of tasks, newest first: keyset pagination on (created_at, id), one query."""
    tasks = tasks_filtered(filters).only(*LIST_FIELDS).order_by("-created_at", "-id")
    if cursor:
        created_at, task_id = decode_cursor(cursor)
        # A row comparison, so the (created_at, id) index starts right after the cursor.
        tasks = tasks.extra(where=["(backplane_task.created_at, backplane_task.id) < (%s, %s)"],
                            params=[created_at, task_id])
    rows = list(tasks[: limit + 1])
    more = len(rows) > limit
    rows = rows[:limit]
    return TaskPage(tasks=rows, next_cursor=encode_cursor(rows[-1]) if more and rows else None, cursor=cursor)


# --- one task ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class TreeNode:
    id: uuid.UUID
    kind: str
    status: str
    depth: int
    parent_id: uuid.UUID | None
    children: list[TreeNode] = field(default_factory=list)


@dataclass(frozen=True)
class TaskFamily:
    """The task's ancestors (root first) and its descendants (a tree), up to a bound."""

    ancestors: list[TreeNode]
    children: list[TreeNode]
    truncated: bool


FAMILY_MAX_NODES = 200
FAMILY_MAX_DEPTH = 4


def task_family(task: Task) -> TaskFamily:
    """Two recursive queries: up to the root, and down ``FAMILY_MAX_DEPTH`` levels."""
    with reads_connection().cursor() as cursor:
        cursor.execute(
            """
            WITH RECURSIVE up(id, kind, status, parent_id, depth) AS (
              SELECT id, kind, status, parent_id, 0 FROM backplane_task WHERE id = %s
              UNION ALL
              SELECT t.id, t.kind, t.status, t.parent_id, up.depth - 1
                FROM backplane_task t JOIN up ON t.id = up.parent_id WHERE up.depth > -50
            )
            SELECT id, kind, status, depth, parent_id FROM up WHERE depth < 0 ORDER BY depth
            """,
            [task.pk],
        )
        ancestors = [TreeNode(*row) for row in cursor.fetchall()]
        cursor.execute(
            """
            WITH RECURSIVE down(id, kind, status, parent_id, depth, created_at) AS (
              SELECT id, kind, status, parent_id, 1, created_at FROM backplane_task WHERE parent_id = %s
              UNION ALL
              SELECT t.id, t.kind, t.status, t.parent_id, down.depth + 1, t.created_at
                FROM backplane_task t JOIN down ON t.parent_id = down.id WHERE down.depth < %s
            )
            SELECT id, kind, status, depth, parent_id FROM down ORDER BY depth, created_at LIMIT %s
            """,
            [task.pk, FAMILY_MAX_DEPTH, FAMILY_MAX_NODES + 1],
        )
        rows = cursor.fetchall()
    truncated = len(rows) > FAMILY_MAX_NODES
    nodes = {row[0]: TreeNode(*row) for row in rows[:FAMILY_MAX_NODES]}
    top: list[TreeNode] = []
    for node in nodes.values():
        if node.parent_id == task.pk:
            top.append(node)
        elif node.parent_id in nodes:
            nodes[node.parent_id].children.append(node)
    return TaskFamily(ancestors=ancestors, children=top, truncated=truncated)


@dataclass(frozen=True)
class ChainState:
    """What is known of a task's chain: verified through ``verified_seq``, broken at ``broken_seq``."""

    verified_seq: int
    verified_at: datetime | None
    broken_seq: int | None
    problem: str | None

    def mark(self, seq: int) -> str:
        if self.broken_seq is not None:
            # The run that found the break checked every event before it.
            if seq < self.broken_seq:
                return "verified"
            return "broken" if seq == self.broken_seq else "unverified"
        return "verified" if seq <= self.verified_seq else "unverified"


def chain_state(task_id: uuid.UUID) -> ChainState:
    """One query: the verified head and the earliest open chain alert of the task."""
    alert = IntegrityAlert.objects.filter(
        task_id=task_id, kind=IntegrityAlertKind.CHAIN, acknowledged_at__isnull=True
    ).order_by("first_invalid_seq")
    head = (
        VerifiedHead.objects.filter(task_id=task_id)
        .annotate(
            broken_seq=alert.values("first_invalid_seq")[:1],
            problem=alert.values("problem")[:1],
        )
        .values_list("verified_seq", "verified_at", "broken_seq", "problem")
        .first()
    )
    if head is None:
        first = alert.values_list("first_invalid_seq", "problem").first()
        return ChainState(0, None, first[0] if first else None, first[1] if first else None)
    return ChainState(*head)


EVENT_PAGE_SIZE = 200


@dataclass(frozen=True)
class EventRows:
    events: list[Event]
    earlier_before_seq: int | None  # link to the page before, when there is one
    later_before_seq: int | None  # link to the page after, when this is not the latest
    is_latest: bool


def event_rows(task: Task, *, before_seq: int | None = None, after_seq: int | None = None,
               limit: int = EVENT_PAGE_SIZE) -> EventRows:
    """A page of the task's events in seq order: the latest ``limit`` by default, those before
    ``before_seq``, or everything after ``after_seq`` (what a live page missed, up to ``limit``)."""
    events = Event.objects.filter(task_id=task.pk)
    if after_seq is not None:
        rows = list(events.filter(seq__gt=after_seq).order_by("seq")[:limit])
        return EventRows(rows, None, None, True)
    if before_seq is not None:
        events = events.filter(seq__lt=before_seq)
    rows = list(events.order_by("-seq")[:limit])
    rows.reverse()
    first_seq = rows[0].seq if rows else 1
    last_seq = rows[-1].seq if rows else 0
    is_latest = last_seq >= task.last_seq
    return EventRows(
        rows,
        earlier_before_seq=first_seq if first_seq > 1 else None,
        later_before_seq=None if is_latest else min(task.last_seq + 1, last_seq + limit + 1),
        is_latest=is_latest,
    )


# --- the timeline -------------------------------------------------------------------------------

TIMELINE_MAX_EVENTS = 5000
SERVER_LANE = "backplane"

MARKERS: dict[str, tuple[str, str, str]] = {
    # type: (legend name, Plotly symbol, colour)
    et.TASK_STALLED: ("stall", "x", "#d62728"),
    et.TASK_DEAD_LETTERED: ("dead-letter decision", "square", "#444444"),
    et.DEAD_LETTER_REQUEUED: ("dead-letter decision", "square", "#444444"),
    et.DEAD_LETTER_DISCARDED: ("dead-letter decision", "square", "#444444"),
    et.COMPENSATION_STARTED: ("compensation", "diamond", "#9467bd"),
    et.COMPENSATION_REQUESTED: ("compensation", "diamond", "#9467bd"),
    et.COMPENSATION_COMPLETED: ("compensation", "diamond", "#9467bd"),
    et.TASK_COMPENSATED: ("compensation", "diamond", "#9467bd"),
    et.TASK_COMPLETED: ("end", "star", "#2ca02c"),
    et.TASK_FAILED: ("end", "star", "#d62728"),
}


def task_timeline(task: Task, *, now: datetime | None = None) -> dict[str, Any]:
    """The timeline's Plotly traces: one row per agent, reasoning steps and model calls as points,
    tool calls and sub-agents as bars (open while in flight), the rest as markers. One query,
    reading only the few payload fields it draws."""
    now = now or timezone.now()
    rows = list(
        Event.objects.filter(task_id=task.pk)
        .order_by("-seq")
        .values_list(
            "seq", "type", "agent", "recorded_at",
            KT("payload__idempotency_key"), KT("payload__tool"), KT("payload__step"), KT("payload__status"),
            KT("payload__child_task_id"), KT("payload__recovered"), KT("payload__kind"),
            KT("payload__model"), KT("payload__provider"), "payload__usage", "payload__cost",
        )[:TIMELINE_MAX_EVENTS]
    )
    rows.reverse()
    lanes: list[str] = []

    def lane(agent: str | None) -> str:
        name = agent or SERVER_LANE
        if name not in lanes:
            lanes.append(name)
        return name

    reasoning: dict[str, list[Any]] = {"x": [], "y": [], "text": [], "customdata": []}
    calls: dict[str, dict[str, Any]] = {}
    subtasks: dict[str, dict[str, Any]] = {}
    claims: dict[str, list[Any]] = {"x": [], "y": [], "text": [], "customdata": []}
    recoveries: dict[str, list[Any]] = {"x": [], "y": [], "text": [], "customdata": []}
    model_calls: dict[str, list[Any]] = {"x": [], "y": [], "text": [], "customdata": []}
    markers: dict[str, dict[str, Any]] = {}

    for (seq, kind, agent, at, key, tool, step, status, child, recovered, child_kind, model, provider, usage,
         cost) in rows:
        when = format_timestamp(at)
        if kind == et.REASONING_STEP_COMPLETED:
            reasoning["x"].append(when)
            reasoning["y"].append(lane(agent))
            reasoning["text"].append(f"step {step} (seq {seq})")
            reasoning["customdata"].append(seq)
        elif kind == et.LLM_CALLED:
            model_calls["x"].append(when)
            model_calls["y"].append(lane(agent))
            call = model_call_text(model=model, provider=provider, step=step, usage=usage, cost=cost)
            model_calls["text"].append(f"{call} (seq {seq})")
            model_calls["customdata"].append(seq)
        elif kind == et.TOOL_CALL_DISPATCHED and key:
            calls[key] = {"start": at, "end": None, "lane": lane(agent), "tool": tool, "step": step,
                          "status": "in_flight", "seq": seq}
        elif kind == et.TOOL_CALL_RESULT_RECEIVED and key in calls:
            calls[key].update(end=at, status=status or "succeeded", end_seq=seq, cost=cost)
        elif kind == et.SUB_AGENT_DISPATCHED and child:
            subtasks[child] = {"start": at, "end": None, "lane": lane(agent), "kind": child_kind, "status": "running",
                               "seq": seq}
        elif kind == et.SUB_AGENT_RESULT_RECEIVED and child in subtasks:
            subtasks[child].update(end=at, status=status or "done", end_seq=seq)
        elif kind == et.TASK_CLAIMED:
            target = recoveries if recovered == "true" else claims
            target["x"].append(when)
            target["y"].append(lane(agent))
            target["text"].append(f"{'recovered by' if recovered == 'true' else 'claimed by'} {agent} (seq {seq})")
            target["customdata"].append(seq)
        elif kind in MARKERS:
            name, symbol, colour = MARKERS[kind]
            trace = markers.setdefault(name, {"x": [], "y": [], "text": [], "customdata": [], "symbol": symbol,
                                              "colour": colour})
            trace["x"].append(when)
            trace["y"].append(lane(agent))
            trace["text"].append(f"{kind} (seq {seq})")
            trace["customdata"].append(seq)

    # A call that took milliseconds on a timeline of minutes would be drawn narrower than a
    # pixel: every bar is at least 0.4 % of the span wide (its label gives the real duration).
    span_ms = ((now - rows[0][3]).total_seconds() * 1000) if rows else 0.0
    min_bar_ms = max(1.0, span_ms * 0.004)
    traces: list[dict[str, Any]] = []
    done = [(k, c) for k, c in calls.items() if c["end"] is not None]
    flying = [(k, c) for k, c in calls.items() if c["end"] is None]
    traces.append(_bars("tool calls", done, now=now, min_ms=min_bar_ms, width=0.6,
                        meta={"kind": "tool_call", "state": "done"},
                        colour=lambda c: "#2ca02c" if c["status"] == "succeeded" else "#d62728",
                        label=lambda c: f"{c['tool']} · step {c['step']} · {c['status']}{_charged(c.get('cost'))}"))
    traces.append(_bars("tool calls in flight", flying, now=now, min_ms=min_bar_ms,
                        meta={"kind": "tool_call", "state": "in_flight"},
                        width=0.6, colour=lambda c: "rgba(0,0,0,0)", line="#ff7f0e",
                        label=lambda c: f"{c['tool']} · step {c['step']} · in flight"))
    ended = [(k, c) for k, c in subtasks.items() if c["end"] is not None]
    running = [(k, c) for k, c in subtasks.items() if c["end"] is None]
    traces.append(_bars("sub-agents", ended, now=now, min_ms=min_bar_ms, width=0.25,
                        meta={"kind": "subtask", "state": "done"},
                        colour=lambda c: "rgba(31,119,180,0.35)", line="#1f77b4",
                        label=lambda c: f"sub-agent {c['kind']} · {c['status']}"))
    traces.append(_bars("sub-agents running", running, now=now, min_ms=min_bar_ms,
                        meta={"kind": "subtask", "state": "in_flight"},
                        width=0.25, colour=lambda c: "rgba(0,0,0,0)", line="#1f77b4",
                        label=lambda c: f"sub-agent {c['kind']} · in flight"))
    traces.append(_points("reasoning steps", reasoning, symbol="circle", colour="#1f77b4", kind="reasoning"))
    traces.append(_points("model calls", model_calls, symbol="hexagon", colour="#e377c2", kind="model_call"))
    traces.append(_points("claims", claims, symbol="triangle-right", colour="#7f7f7f", kind="claim"))
    traces.append(_points("recoveries", recoveries, symbol="triangle-up", colour="#17becf", kind="recovery"))
    for name, trace in markers.items():
        traces.append(_points(name, trace, symbol=trace["symbol"], colour=trace["colour"], kind=name))
    return {
        "traces": [trace for trace in traces if trace["x"]],
        "lanes": lanes,
        "now": format_timestamp(now),
        "tool_calls": len(calls),
        "in_flight": len(flying),
        "truncated": task.last_seq > TIMELINE_MAX_EVENTS,
    }


def _bars(name: str, items: list[tuple[str, dict[str, Any]]], *, now: datetime, meta: dict[str, Any],
          width: float, colour: Any, label: Any, line: str | None = None, min_ms: float = 1.0) -> dict[str, Any]:
    """Horizontal bars on a date axis: ``base`` is where a bar starts, ``x`` its length in ms;
    ``meta.seqs`` the seq of each bar's last event (its result, or its dispatch while in flight),
    where "fork from here" on the bar continues after."""
    lengths = [((item["end"] or now) - item["start"]).total_seconds() * 1000 for _, item in items]
    return {
        "type": "bar",
        "orientation": "h",
        "name": name,
        "meta": {**meta, "seqs": [item.get("end_seq") or item["seq"] for _, item in items]},
        "base": [format_timestamp(item["start"]) for _, item in items],
        "x": [max(min_ms, length) for length in lengths],
        "y": [item["lane"] for _, item in items],
        "customdata": [key for key, _ in items],
        "text": [
            label(item) + ("" if item["end"] is None else f" · {_duration(length)}")
            for (_, item), length in zip(items, lengths, strict=True)
        ],
        "width": width,
        "marker": {
            "color": [colour(item) for _, item in items],
            "line": {"color": line or "rgba(0,0,0,0.4)", "width": 2 if line else 0.5},
        },
    }


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


def _charged(cost: Any) -> str:
    """What a paid tool's answer charged, for its bar's label (nothing for an unpaid one)."""
    if not isinstance(cost, dict) or cost.get("amount") is None:
        return ""
    return f" · charged {money_text(Decimal(cost['amount']), cost.get('currency') or '')}"


def usage_text(usage: dict[str, Any]) -> str:
    """Tokens in and out, with the cached and reasoning parts when there are any."""
    def parts(total: str, *named: tuple[str, str]) -> str:
        shown = [f"{usage[key]:,} {words}" for key, words in named if usage.get(key)]
        return f"{usage.get(total) or 0:,}" + (f" ({', '.join(shown)})" if shown else "")

    tokens_in = parts("input_tokens", ("cache_read_input_tokens", "cache read"),
                      ("cache_creation_input_tokens", "cache write"))
    tokens_out = parts("output_tokens", ("reasoning_output_tokens", "reasoning"))
    return f"{tokens_in} in / {tokens_out} out tokens"


def _duration(ms: float) -> str:
    if ms < 1000:
        return f"{ms:.0f} ms"
    if ms < 60_000:
        return f"{ms / 1000:.1f} s"
    return f"{ms / 60_000:.0f} min {ms % 60_000 / 1000:.0f} s"


def _points(name: str, trace: dict[str, Any], *, symbol: str, colour: str, kind: str) -> dict[str, Any]:
    return {
        "type": "scatter",
        "mode": "markers",
        "name": name,
        "meta": {"kind": kind},
        "x": trace["x"],
        "y": trace["y"],
        "text": trace["text"],
        "customdata": trace["customdata"],
        "marker": {"symbol": symbol, "color": colour, "size": 10},
    }


# --- forks and drift -----------------------------------------------------------------------------


def event_href(task_id: uuid.UUID | str, seq: int, last_seq: int) -> str:
    """The task page with event ``seq``'s row targeted (``#seq-N``): the latest page when the
    event is on it, else a page of events around it."""
    page = reverse("dashboard:task", args=[task_id])
    if seq > last_seq - EVENT_PAGE_SIZE:
        return f"{page}#seq-{seq}"
    return f"{page}?before_seq={seq + EVENT_PAGE_SIZE // 2}#seq-{seq}"


FORKS_SHOWN = 50


@dataclass(frozen=True)
class ForkedFrom:
    """Where a fork came from, as its ``TaskForked`` records it."""

    source_id: uuid.UUID
    source_kind: str
    source_status: str
    at_seq: int
    at_type: str
    at_href: str  # the source's event the fork continues after, on the source's page
    reason: str
    forked_by: str


@dataclass(frozen=True)
class ForkRow:
    id: uuid.UUID
    kind: str
    status: str
    at_seq: int
    at_href: str  # this task's event the fork continues after
    sandbox: bool
    created_at: datetime


@dataclass(frozen=True)
class Lineage:
    origin: ForkedFrom | None
    forks: list[ForkRow]
    more_forks: bool


def task_lineage(task: Task) -> Lineage:
    """Where a fork came from and the task's own forks, newest first, up to ``FORKS_SHOWN``.
    One query, two for a fork."""
    origin = None
    if task.forked_from_id is not None:
        assert task.forked_at_seq is not None  # a fork always has one (task_fork_has_seq)
        with reads_connection().cursor() as cursor:
            cursor.execute(
                """
                SELECT s.kind, s.status, s.last_seq, e.payload ->> 'source_type', e.payload ->> 'reason',
                       e.payload ->> 'forked_by'
                  FROM backplane_task s
                  LEFT JOIN backplane_event e ON e.task_id = %s AND e.seq = 2 AND e.type = %s
                 WHERE s.id = %s
                """,
                [task.pk, et.TASK_FORKED, task.forked_from_id],
            )
            kind, status, last_seq, at_type, reason, forked_by = cursor.fetchone()
        origin = ForkedFrom(
            source_id=task.forked_from_id, source_kind=kind, source_status=status, at_seq=task.forked_at_seq,
            at_type=at_type or "", at_href=event_href(task.forked_from_id, task.forked_at_seq, last_seq),
            reason=reason or "", forked_by=forked_by or "",
        )
    rows = list(
        Task.objects.filter(forked_from_id=task.pk)
        .order_by("-created_at", "-id")
        .values_list("id", "kind", "status", "forked_at_seq", "sandbox", "created_at")[: FORKS_SHOWN + 1]
    )
    forks = []
    for pk, kind, status, at_seq, sandbox, created_at in rows[:FORKS_SHOWN]:
        assert at_seq is not None  # a fork always has one (task_fork_has_seq)
        forks.append(ForkRow(id=pk, kind=kind, status=status, at_seq=at_seq, sandbox=sandbox, created_at=created_at,
                             at_href=event_href(task.pk, at_seq, task.last_seq)))
    return Lineage(origin=origin, forks=forks, more_forks=len(rows) > FORKS_SHOWN)


def events_at(points: Iterable[tuple[uuid.UUID, int]]) -> dict[tuple[uuid.UUID, int], str]:
    """The types of the events at (task, seq) ``points``: one query."""
    points = list(points)
    if not points:
        return {}
    condition = Q()
    for task_id, seq in points:
        condition |= Q(task_id=task_id, seq=seq)
    return {(task_id, seq): type_ for task_id, seq, type_ in
            Event.objects.filter(condition).values_list("task_id", "seq", "type")}


# The diff page shows a difference with this many same events on each side; a longer run of
# same events is one fold ("N same events"), which opens up to DIFF_EXPAND_MAX at a time. A
# page holds DIFF_PAGE_ITEMS rows and folds: two histories of 10,000 events that differ
# everywhere are paged, never drawn at once.
DIFF_CONTEXT = 3
DIFF_MIN_FOLD = 5
DIFF_EXPAND_MAX = 200
DIFF_PAGE_ITEMS = 250
DIFF_VALUE_CHARS = 300

_DIFF_TASK_FIELDS = ("id", "namespace", "kind", "status", "last_seq", "forked_from_id", "forked_at_seq", "sandbox",
                     "created_at")


@dataclass(frozen=True)
class DiffSide:
    task_id: str
    seq: int
    type: str
    payload: Any
    href: str
    elsewhere: bool  # recorded in another task's log than the one compared (a fork's source)


@dataclass(frozen=True)
class DiffRow:
    index: int
    kind: str
    a: DiffSide | None
    b: DiffSide | None
    path: str | None
    a_value: str | None  # compact JSON of the differing value; None where the side has none
    b_value: str | None
    first: bool
    is_fold: bool = False


@dataclass(frozen=True)
class DiffFold:
    start: int  # the first pair folded
    end: int  # after the last pair folded
    is_fold: bool = True

    @property
    def count(self) -> int:
        return self.end - self.start

    @property
    def expand_end(self) -> int:
        return min(self.end, self.start + DIFF_EXPAND_MAX)

    @property
    def expand_count(self) -> int:
        return self.expand_end - self.start


@dataclass(frozen=True)
class DriftPage:
    a: Task
    b: Task
    counts: dict[str, int]
    total: int
    first: DiffRow | None  # the first divergence
    first_page: int | None
    items: list[DiffRow | DiffFold]
    page: int
    pages: int


def drift_page(*, a_id: uuid.UUID, b_id: uuid.UUID, page: int | None = None,
               expand: tuple[int, int] | None = None) -> DriftPage:
    """Two tasks' histories side by side, aligned as ``tasks_drift`` pairs them, with runs of
    same events folded and the rows paged (``page`` 1-based; by default the one with the first
    divergence). ``expand`` unfolds the pairs ``start``..``end - 1``. Raises ``NotFound``.

    Queries: the drift's (each task, its sources, its history in chunks) and one for the tasks
    the events are recorded in."""
    drift = lineage.tasks_drift(namespace=None, a_id=a_id, b_id=b_id)
    pairs = drift.pairs
    task_ids = {a_id, b_id}
    for pair in pairs:
        task_ids.update(uuid.UUID(side.task_id) for side in (pair.a, pair.b) if side is not None)
    tasks = Task.objects.only(*_DIFF_TASK_FIELDS).in_bulk(task_ids)
    last_seqs = {str(pk): task.last_seq for pk, task in tasks.items()}

    shown = [False] * len(pairs)
    first_index = None
    for index, pair in enumerate(pairs):
        if pair.kind != "same":
            first_index = index if first_index is None else first_index
            for near in range(max(0, index - DIFF_CONTEXT), min(len(pairs), index + DIFF_CONTEXT + 1)):
                shown[near] = True
    if expand is not None:
        for index in range(max(0, expand[0]), min(len(pairs), expand[1], expand[0] + DIFF_EXPAND_MAX)):
            shown[index] = True
    # Rows are pair indices, folds (start, end) ranges; a run of hidden pairs too short to be
    # worth a fold is shown instead.
    plan: list[int | tuple[int, int]] = []
    index = 0
    while index < len(pairs):
        if shown[index]:
            plan.append(index)
            index += 1
            continue
        end = index
        while end < len(pairs) and not shown[end]:
            end += 1
        if end - index < DIFF_MIN_FOLD:
            plan.extend(range(index, end))
        else:
            plan.append((index, end))
        index = end
    pages = max(1, -(-len(plan) // DIFF_PAGE_ITEMS))
    first_page = None
    if first_index is not None:
        position = next(n for n, item in enumerate(plan) if item == first_index)
        first_page = position // DIFF_PAGE_ITEMS + 1
    page = min(max(1, page or first_page or 1), pages)

    def side(entry: HistoryEntry | None, compared: uuid.UUID) -> DiffSide | None:
        if entry is None:
            return None
        return DiffSide(task_id=entry.task_id, seq=entry.seq, type=entry.type, payload=entry.payload,
                        href=event_href(entry.task_id, entry.seq, last_seqs.get(entry.task_id, entry.seq)),
                        elsewhere=entry.task_id != str(compared))

    def row(index: int) -> DiffRow:
        pair = pairs[index]
        changed = pair.kind == "changed"
        return DiffRow(index=index, kind=pair.kind, a=side(pair.a, a_id), b=side(pair.b, b_id), path=pair.path,
                       a_value=_diff_value(pair.a_value) if changed else None,
                       b_value=_diff_value(pair.b_value) if changed else None,
                       first=index == first_index)

    window = plan[(page - 1) * DIFF_PAGE_ITEMS : page * DIFF_PAGE_ITEMS]
    items: list[DiffRow | DiffFold] = [DiffFold(*item) if isinstance(item, tuple) else row(item) for item in window]
    return DriftPage(a=tasks[a_id], b=tasks[b_id], counts=dict(drift.counts), total=len(pairs),
                     first=None if first_index is None else row(first_index), first_page=first_page,
                     items=items, page=page, pages=pages)


def _diff_value(value: Any) -> str:
    if value is MISSING:
        return "(absent)"
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False, sort_keys=True)
    return text if len(text) <= DIFF_VALUE_CHARS else text[: DIFF_VALUE_CHARS - 1] + "…"


# --- the outbox --------------------------------------------------------------------------------


@dataclass(frozen=True)
class DestinationBacklog:
    destination: str  # "broker", or the webhook subscription's name
    waiting: int  # never tried yet
    retrying: int  # failed at least once, due again later
    oldest_at: datetime | None


@dataclass(frozen=True)
class OutboxHealth:
    now: datetime
    backlog: list[DestinationBacklog]
    dead: int
    delivered_last_hour: int
    failing: list[Any]  # the pending messages that failed most recently

    @property
    def waiting(self) -> int:
        return sum(row.waiting for row in self.backlog)

    @property
    def retrying(self) -> int:
        return sum(row.retrying for row in self.backlog)

    @property
    def oldest_at(self) -> datetime | None:
        return min((row.oldest_at for row in self.backlog if row.oldest_at), default=None)


def outbox_health(*, now: datetime | None = None, failing_limit: int = 20) -> OutboxHealth:
    """The outbox page's figures: the pending backlog per destination, dead and delivered
    counts, and the messages that are failing now. Three queries."""
    now = now or timezone.now()
    with reads_connection().cursor() as cursor:
        cursor.execute(
            """
            SELECT coalesce(s.name, m.destination),
                   count(*) FILTER (WHERE m.last_error = ''), count(*) FILTER (WHERE m.last_error <> ''),
                   min(m.created_at)
              FROM backplane_outboxmessage m LEFT JOIN backplane_webhooksubscription s ON s.id = m.subscription_id
             WHERE m.status = 'pending'
             GROUP BY 1 ORDER BY 1
            """
        )
        backlog = [DestinationBacklog(*row) for row in cursor.fetchall()]
        cursor.execute(
            """
            SELECT (SELECT count(*) FROM backplane_outboxmessage WHERE status = 'dead'),
                   (SELECT count(*) FROM backplane_outboxmessage WHERE status = 'delivered' AND delivered_at >= %s)
            """,
            [now - timedelta(hours=1)],
        )
        dead, delivered = cursor.fetchone()
    # Attempts are counted when the relay claims a row, so a first delivery under way has one:
    # failing is what has a recorded failure.
    failing = list(
        OutboxMessage.objects.filter(status="pending").exclude(last_error="")
        .select_related("subscription")
        .only("id", "message_id", "topic", "destination", "subscription__name", "attempts", "last_error",
              "next_attempt_at", "created_at", "task_id")
        .order_by("-attempts", "next_attempt_at")[:failing_limit]
    )
    return OutboxHealth(now=now, backlog=backlog, dead=dead, delivered_last_hour=delivered, failing=failing)


def delivery_lag_per_minute(*, now: datetime | None = None) -> dict[str, Any]:
    """The last hour's delivery lag (from enqueue to delivery) per minute: mean and max seconds,
    and how many were delivered, for every minute (zeros included)."""
    now = now or timezone.now()
    end = now.replace(second=0, microsecond=0) + timedelta(minutes=1)
    start = end - timedelta(hours=1)
    with reads_connection().cursor() as cursor:
        cursor.execute(
            """
            SELECT date_trunc('minute', delivered_at),
                   avg(extract(epoch FROM delivered_at - created_at)),
                   max(extract(epoch FROM delivered_at - created_at)),
                   count(*)
              FROM backplane_outboxmessage
             WHERE status = 'delivered' AND delivered_at >= %s AND delivered_at < %s
             GROUP BY 1
            """,
            [start, end],
        )
        rows = {row[0]: row[1:] for row in cursor.fetchall()}
    minutes, mean, peak, delivered = [], [], [], []
    at = start
    while at < end:
        minutes.append(format_timestamp(at))
        avg_s, max_s, n = rows.get(at, (None, None, 0))
        mean.append(None if avg_s is None else round(float(avg_s), 3))
        peak.append(None if max_s is None else round(float(max_s), 3))
        delivered.append(n)
        at += timedelta(minutes=1)
    return {"minutes": minutes, "mean_seconds": mean, "max_seconds": peak, "delivered": delivered}


# --- model spend ---------------------------------------------------------------------------------
#
# Read from the cost rollups the event writer keeps in each model call's (or paid tool answer's)
# transaction (backplane/eventlog/costs.py), never summed from the events on a page: every figure
# is one aggregate over a few rows, whatever the number of calls. Rows of shared scopes are split
# in shards and each currency is a row of its own, so every read sums the shards and keeps the
# currencies apart. A call with no price adds to ``unpriced_calls`` and to no currency: its cost is
# unknown, and is shown so, never as zero.
#
# What a row counts depends on its scope: ``calls`` and tokens are model calls everywhere but in a
# ``tool`` row (there ``calls`` are a paid tool's answers); ``cost`` is the model calls' and the
# paid tools' charges together, except in a ``model`` row (its calls only).

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


def spend_text(spend: Spend) -> str:
    """What it cost, in words: each currency, then the calls with no price, if any."""
    parts = [money_text(amount, currency) for currency, amount in spend.cost_items]
    if spend.unpriced_calls:
        parts.append(unpriced_text(spend.unpriced_calls))
    return " + ".join(parts) if parts else "nothing"


def _plural(count: int, word: str) -> str:
    return f"{count:,} {word}{'' if count == 1 else 's'}"


# A rollup row: its scope and key ("provider/model", "namespace/tool", "namespace/agent").
RollupKey = tuple[str, str]


@dataclass(frozen=True)
class SpendRow:
    scope: str  # model, tool or agent; "" for the row that sums the rest of a long list
    key: str
    label: str
    spend: Spend

    @property
    def summary(self) -> str:
        """The row in words: its cost, then what was counted (a tool's paid answers, or model
        calls and their tokens)."""
        if self.scope == "tool":
            return f"{spend_text(self.spend)} · {_plural(self.spend.calls, 'paid answer')}"
        calls = _plural(self.spend.calls, "model call" if self.scope else "call")
        return f"{spend_text(self.spend)} · {calls} · {usage_text(self.spend.tokens)}"


# A chart shows this many rows, the biggest; the rest are one row ("N more").
SPEND_TOP = 10


def spend_label(scope: str, key: str) -> str:
    if scope == "tool":
        return f"tool {key}"
    if scope == "agent":  # the backplane's own calls have no agent
        namespace, _, agent = key.partition("/")
        return f"{namespace}/{agent or SERVER_LANE}"
    return key


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

    def chart(self) -> dict[str, Any]:
        """The panel's charts' data. Per group (by model or tool, by agent), for each row: its
        scope, key and label; per currency its cost (exact decimal strings) and that cost in
        words; tokens per part; calls, and calls with no price (with their words); a summary
        for the hover."""
        currencies = sorted(self.total.cost)

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
                "summary": [row.summary for row in rows],
            }

        return {"since": format_timestamp(self.since), "currencies": currencies, "total": self.total.as_json(),
                "by_model": group(self.by_model), "by_agent": group(self.by_agent)}


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
