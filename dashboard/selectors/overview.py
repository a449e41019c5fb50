"""Reads of the overview: its tiles' figures, the activity chart's counts per minute, and the
feed of the newest events. Sandboxes (replays against the record) are left out of every figure."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.utils import timezone

from backplane.eventlog import event_types as et
from backplane.eventlog.chain import format_timestamp
from backplane.eventlog.models import Event, TaskStatus
from backplane.integrity.models import VerificationMode, VerificationRun
from backplane.runtime.replica import reads_connection
from dashboard.selectors.minutes import buckets, window_to_this_minute

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


def overview_figures(*, now: datetime | None = None) -> Overview:
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
    start, end = window_to_this_minute(now, hours=hours)
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
    for at in buckets(start, end, step):
        minutes.append(format_timestamp(at))
        for name, value in zip(CHART_SERIES, counted.get(at, (0, 0, 0, 0)), strict=True):
            series[name].append(value)
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
