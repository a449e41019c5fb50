"""Recovery's figures on /metrics: states read at scrape time, and the events counted as they commit.

``RecoveryCollector`` is added through ``backplane.metrics.register_collector``: each figure is one
aggregate in the database (a count, a min, percentiles), whatever the number of rows behind it.

``count_committed_events`` is an observer of the event log's writer (``RecoveryConfig.ready``
registers it; it is told of every write): most of what an operator counts is an event type (a claim,
a stall, a compensation, a tool call), so one look at every write counts them all, after commit.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection
from django.db.models import Count, Min, Q
from django.utils import timezone
from prometheus_client.core import GaugeMetricFamily, Metric

from backplane.eventlog import event_types as et
from backplane.eventlog.models import Agent, Event, Task, TaskStatus
from backplane.eventlog.writer import WrittenEvents
from backplane.telemetry import counters
from recovery.models import ApprovalRequest, ApprovalStatus, BreakerState, Tool, ToolCall, ToolCallStatus

# The window of the step latency figures, and how much of it is read: the most recently active
# running tasks and, of each, its last events (a sample that keeps the query bounded at any size).
STEP_WINDOW_SECONDS = 300
STEP_TASKS = 2000
STEP_TAIL_EVENTS = 16

_STEP_LATENCY_SQL = """
WITH active AS (
    SELECT id, last_seq FROM backplane_task
    WHERE status = %(running)s AND last_event_at >= %(since)s AND NOT sandbox
    ORDER BY last_event_at DESC
    LIMIT %(tasks)s
), steps AS (
    SELECT e.recorded_at,
           extract(epoch FROM e.recorded_at - lag(e.recorded_at) OVER (PARTITION BY e.task_id ORDER BY e.seq)) AS gap
    FROM active a JOIN backplane_event e ON e.task_id = a.id AND e.seq > a.last_seq - %(tail)s
)
SELECT count(gap), percentile_cont(0.5) WITHIN GROUP (ORDER BY gap), percentile_cont(0.99) WITHIN GROUP (ORDER BY gap)
FROM steps WHERE gap IS NOT NULL AND recorded_at >= %(since)s
"""

_OPEN_BREAKERS_SQL = f"""
SELECT 'agent', count(*) FROM {Agent._meta.db_table} WHERE breaker_state <> %(closed)s
UNION ALL
SELECT 'tool', count(*) FROM {Tool._meta.db_table} WHERE breaker_state <> %(closed)s
"""


class RecoveryCollector:
    def collect(self) -> Iterator[Metric]:
        now = timezone.now()
        # The same rules as recovery.selectors.tasks_without_progress and tool_calls_overdue,
        # which list the rows for the dashboard; here only their number is wanted.
        silent_since = now - timedelta(seconds=settings.BACKPLANE_NO_PROGRESS_FLAG_SECONDS)
        without_progress = Task.objects.filter(status="running", lease_holder__isnull=False,
                                               last_event_at__lt=silent_since).count()
        overdue_since = now - timedelta(seconds=settings.BACKPLANE_TOOL_CALL_TIMEOUT_SECONDS)
        # One aggregate, from the partial index on in-flight calls (toolcall_in_flight_idx).
        in_flight = ToolCall.objects.filter(status=ToolCallStatus.DISPATCHED).aggregate(
            overdue=Count("pk", filter=Q(dispatched_at__lt=overdue_since)), oldest=Min("dispatched_at"))
        yield GaugeMetricFamily("backplane_tasks_without_progress",
                                "Running tasks that heartbeat but have written no event for too long",
                                value=without_progress)
        yield GaugeMetricFamily("backplane_tool_calls_overdue", "Tool calls in flight longer than their timeout",
                                value=in_flight["overdue"])
        oldest = in_flight["oldest"]
        yield GaugeMetricFamily("backplane_tool_call_oldest_in_flight_age_seconds",
                                "Age of the oldest tool call dispatched and not answered (0 when none is in flight)",
                                value=(now - oldest).total_seconds() if oldest is not None else 0.0)
        waiting = ApprovalRequest.objects.filter(status=ApprovalStatus.PENDING).aggregate(
            count=Count("pk"), oldest=Min("requested_at"))
        yield GaugeMetricFamily("backplane_approvals_pending", "Gated tool calls waiting for people's decision",
                                value=waiting["count"])
        yield GaugeMetricFamily("backplane_approval_oldest_pending_age_seconds",
                                "Age of the oldest approval request waiting (0 when none is)",
                                value=(now - waiting["oldest"]).total_seconds() if waiting["oldest"] else 0.0)
        yield from self.collect_step_latency(now=now)
        yield self.collect_open_breakers()

    @staticmethod
    def collect_step_latency(*, now: datetime) -> Iterator[Metric]:
        """Time between consecutive events of running tasks that ended in the last minutes."""
        with connection.cursor() as cursor:
            cursor.execute(_STEP_LATENCY_SQL, {"running": TaskStatus.RUNNING, "tasks": STEP_TASKS,
                                               "tail": STEP_TAIL_EVENTS,
                                               "since": now - timedelta(seconds=STEP_WINDOW_SECONDS)})
            steps, p50, p99 = cursor.fetchone()
        latency = GaugeMetricFamily(
            "backplane_step_latency_seconds",
            f"Time between consecutive events of running tasks over the last {STEP_WINDOW_SECONDS} s, by quantile",
            labels=["quantile"])
        if steps:
            latency.add_metric(["0.5"], float(p50))
            latency.add_metric(["0.99"], float(p99))
        yield latency
        yield GaugeMetricFamily("backplane_step_latency_samples",
                                "Steps (gaps between consecutive events) behind backplane_step_latency_seconds",
                                value=steps)

    @staticmethod
    def collect_open_breakers() -> Metric:
        """Breakers not closed (open, or half-open with a trial out), by kind."""
        breakers = GaugeMetricFamily("backplane_breakers_open", "Circuit breakers open or half-open, by kind",
                                     labels=["kind"])
        with connection.cursor() as cursor:
            cursor.execute(_OPEN_BREAKERS_SQL, {"closed": BreakerState.CLOSED.value})
            for kind, count in cursor.fetchall():
                breakers.add_metric([kind], count)
        return breakers


# --- counted from the events written ---------------------------------------------------------------

# Every type event_types.py names (its upper-case string constants). Any other type is a client's
# own, unbounded in number: counted as "custom".
BUILT_IN_EVENT_TYPES = frozenset(
    value for name, value in vars(et).items() if name.isupper() and isinstance(value, str))
_STALL_REASONS = {"lease expired": "lease_expired", "no progress": "no_progress"}
_RECOVERY_OUTCOMES = {TaskStatus.PENDING.value: "requeued", TaskStatus.DEAD_LETTERED.value: "dead_lettered"}
Tally = Callable[[], None]


def _claim_tally(event: Event, written: WrittenEvents) -> Tally:
    return functools.partial(counters.claim_count, recovered=bool(event.payload.get("recovered")))


def _stall_tally(event: Event, written: WrittenEvents) -> Tally:
    return functools.partial(
        counters.stall_count, reason=_STALL_REASONS.get(str(event.payload.get("reason")), "other"),
        # What the write left the task in: pending again, or parked as a dead letter.
        outcome=_RECOVERY_OUTCOMES.get(written.status, "other"))


def _compensation_tally(event: Event, written: WrittenEvents) -> Tally:
    status = str(event.payload.get("status"))
    return functools.partial(counters.compensation_count,
                             outcome=status if status in ToolCallStatus.values else "other")


_APPROVAL_ENDS = {et.APPROVAL_GRANTED: "granted", et.APPROVAL_DENIED: "denied", et.APPROVAL_EXPIRED: "expired"}


def _approval_tally(event: Event, written: WrittenEvents) -> Tally:
    requested_at = datetime.fromisoformat(str(event.payload["requested_at"]))
    return functools.partial(counters.approval_decision_observe, outcome=_APPROVAL_ENDS[event.type],
                             seconds=(event.recorded_at - requested_at).total_seconds())


def _tool_call_tally(event: Event, written: WrittenEvents) -> Tally:
    return functools.partial(counters.tool_call_dispatched_count, tool=str(event.payload.get("tool")))


# The types with a counter of their own besides events appended, and how each is counted.
_COUNTED_APART: dict[str, Callable[[Event, WrittenEvents], Tally]] = {
    et.TASK_CLAIMED: _claim_tally,
    et.TASK_STALLED: _stall_tally,
    et.COMPENSATION_COMPLETED: _compensation_tally,
    et.TOOL_CALL_DISPATCHED: _tool_call_tally,
    **dict.fromkeys(_APPROVAL_ENDS, _approval_tally),
}


def event_type_label(event_type: str) -> str:
    return event_type if event_type in BUILT_IN_EVENT_TYPES else "custom"


def count_committed_events(written: WrittenEvents) -> Tally | None:
    """Writer observer: count a write's events once its transaction commits; a write rolled
    back is not counted. The figures are taken when told, from the events as written."""
    tallies: list[Tally] = [
        functools.partial(counters.events_appended_count, type_label=label, count=count)
        for label, count in Counter(event_type_label(event.type) for event in written.events).items()
    ]
    for event in written.events:
        apart = _COUNTED_APART.get(event.type)
        if apart is not None:
            tallies.append(apart(event, written))
    if not tallies:
        return None
    # An agent's next step, the commonest write by far, has one tally: answered as it is.
    return tallies[0] if len(tallies) == 1 else functools.partial(_count, tallies)


def _count(tallies: list[Tally]) -> None:
    for tally in tallies:
        tally()

