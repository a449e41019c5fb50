"""Reads of a task's page: its family (ancestors and sub-tasks), what is known of its chain, a
page of its events, its timeline, and its lineage (where a fork came from, its own forks).
Its spend is read with the other rollups (dashboard/selectors/spend.py)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db.models.fields.json import KT
from django.urls import reverse
from django.utils import timezone

from backplane.eventlog import event_types as et
from backplane.eventlog.models import Event, Task
from backplane.integrity.models import IntegrityAlert, IntegrityAlertKind, VerifiedHead
from backplane.runtime.replica import reads_connection

# --- family, chain, events -----------------------------------------------------------------------


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
#
# What happened and when, one lane per agent; how it is drawn (symbols, colours, legend names, the
# Plotly traces) is the page's script's (static/js/task_detail.js).

TIMELINE_MAX_EVENTS = 5000
# Who the events and model calls with no agent are: the backplane's own (a lane, a row's name).
SERVER_LANE = "backplane"

# The events drawn as points besides reasoning steps, model calls and claims: the page's script
# has a legend name, a symbol and a colour for each of these types.
MARKED_EVENTS = frozenset({
    et.TASK_STALLED, et.TASK_DEAD_LETTERED, et.DEAD_LETTER_REQUEUED, et.DEAD_LETTER_DISCARDED,
    et.COMPENSATION_STARTED, et.COMPENSATION_REQUESTED, et.COMPENSATION_COMPLETED, et.TASK_COMPENSATED,
    et.TASK_COMPLETED, et.TASK_FAILED,
})


@dataclass(frozen=True)
class TimelinePoint:
    """An event drawn as a point. ``kind``: reasoning, model_call, claim, recovery (a claim that
    took over a stalled task) or marker (one of ``MARKED_EVENTS``); ``details``: the payload
    fields its label is written from."""

    kind: str
    seq: int
    type: str
    at: datetime
    lane: str
    agent: str | None
    details: dict[str, Any] = field(default_factory=dict)


@dataclass
class TimelineSpan:
    """A tool call (``kind`` tool_call, ``key`` its idempotency key) or a sub-agent (subtask, the
    child's id) from its dispatch to its result; ``end`` is None while it is in flight."""

    kind: str
    key: str
    lane: str
    start: datetime
    seq: int  # its dispatch
    status: str
    details: dict[str, Any]
    end: datetime | None = None
    end_seq: int | None = None

    @property
    def last_seq(self) -> int:
        """Its last event's seq (its result, or its dispatch while in flight): where "fork from
        here" on its bar continues after."""
        return self.end_seq or self.seq


@dataclass(frozen=True)
class Timeline:
    points: list[TimelinePoint]  # in seq order
    spans: list[TimelineSpan]  # the tool calls, then the sub-agents, each in dispatch order
    lanes: list[str]  # the agents, in the order they first acted
    since: datetime | None  # the first event read
    now: datetime
    truncated: bool  # only the latest ``TIMELINE_MAX_EVENTS`` were read

    @property
    def tool_calls(self) -> int:
        return sum(span.kind == "tool_call" for span in self.spans)

    @property
    def in_flight(self) -> int:
        return sum(span.kind == "tool_call" and span.end is None for span in self.spans)


def task_timeline(task: Task, *, now: datetime | None = None) -> Timeline:
    """The task's latest ``TIMELINE_MAX_EVENTS`` events as a timeline: reasoning steps, model
    calls, claims and ``MARKED_EVENTS`` as points, tool calls and sub-agents as spans (open
    while in flight). One query, reading only the few payload fields the labels need."""
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

    points: list[TimelinePoint] = []
    # By key: a call dispatched again keeps its place and shows its latest dispatch.
    calls: dict[str, TimelineSpan] = {}
    subtasks: dict[str, TimelineSpan] = {}
    for (seq, kind, agent, at, key, tool, step, status, child, recovered, child_kind, model, provider, usage,
         cost) in rows:
        if kind == et.REASONING_STEP_COMPLETED:
            points.append(TimelinePoint("reasoning", seq, kind, at, lane(agent), agent, {"step": step}))
        elif kind == et.LLM_CALLED:
            points.append(TimelinePoint("model_call", seq, kind, at, lane(agent), agent,
                                        {"model": model, "provider": provider, "step": step, "usage": usage,
                                         "cost": cost}))
        elif kind == et.TOOL_CALL_DISPATCHED and key:
            calls[key] = TimelineSpan("tool_call", key, lane(agent), at, seq, "in_flight", {"tool": tool, "step": step})
        elif kind == et.TOOL_CALL_RESULT_RECEIVED and key in calls:
            call = calls[key]
            call.end, call.status, call.end_seq = at, status or "succeeded", seq
            call.details["cost"] = cost
        elif kind == et.SUB_AGENT_DISPATCHED and child:
            subtasks[child] = TimelineSpan("subtask", child, lane(agent), at, seq, "running", {"kind": child_kind})
        elif kind == et.SUB_AGENT_RESULT_RECEIVED and child in subtasks:
            subtask = subtasks[child]
            subtask.end, subtask.status, subtask.end_seq = at, status or "done", seq
        elif kind == et.TASK_CLAIMED:
            points.append(TimelinePoint("recovery" if recovered == "true" else "claim", seq, kind, at, lane(agent),
                                        agent))
        elif kind in MARKED_EVENTS:
            points.append(TimelinePoint("marker", seq, kind, at, lane(agent), agent))
    return Timeline(points=points, spans=[*calls.values(), *subtasks.values()], lanes=lanes,
                    since=rows[0][3] if rows else None, now=now, truncated=task.last_seq > TIMELINE_MAX_EVENTS)


# --- lineage -------------------------------------------------------------------------------------

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
