"""The watchdog over periodic duties: each beat entry records when it last ran, and a duty
that has not succeeded for a few of its intervals is overdue.

A Celery worker can wedge with its main process alive (a pool child killed while holding the
pool's queue lock did exactly that), and beat can die or stop publishing; either way the
stall detector, the relay and the sealer stop while every process still looks healthy. So the
duties report on themselves, through Celery's signals, into ``backplane_duty``:

- ``beat_init``: beat writes one row per schedule entry with ``watch_started_at = now`` (and
  deletes rows of entries that left the schedule). A duty is judged from the later of that and
  its last success, so a fresh start is not overdue before the duty had its chance.
- ``task_prerun`` / ``task_success`` / ``task_failure``: the worker stamps the entry whose task
  ran. A duty that runs but fails every time is overdue too: it is not doing its job.

``backplane.celery`` connects those signals. Three readers act on the rows: ``/readyz``
answers 503 naming overdue duties, ``/metrics`` exports each duty's age, and the supervisor
(``backplane.runtime.launcher``, which has no Django) runs ``OVERDUE_SQL`` from
``backplane.runtime.duty_sql`` and restarts a worker whose duties are overdue.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import DatabaseError, connection, transaction
from django.utils import timezone

# The rule (and the SQL the supervisor runs) lives where no Django is needed; re-exported here.
from backplane.runtime.duty_sql import OVERDUE_FLOOR_SECONDS as OVERDUE_FLOOR_SECONDS
from backplane.runtime.duty_sql import OVERDUE_INTERVALS as OVERDUE_INTERVALS
from backplane.runtime.duty_sql import OVERDUE_SQL as OVERDUE_SQL
from backplane.runtime.duty_sql import allowance_seconds
from backplane.runtime.models import Duty

logger = logging.getLogger(__name__)


def scheduled_duties() -> dict[str, float]:
    """Beat entry name -> interval in seconds, from ``CELERY_BEAT_SCHEDULE``."""
    duties: dict[str, float] = {}
    for name, entry in settings.CELERY_BEAT_SCHEDULE.items():
        schedule = entry["schedule"]
        seconds = schedule.total_seconds() if isinstance(schedule, timedelta) else float(schedule)  # type: ignore[arg-type]
        duties[name] = seconds
    return duties


def _duty_names_by_task() -> dict[str, str]:
    return {str(entry["task"]): name for name, entry in settings.CELERY_BEAT_SCHEDULE.items()}


# --- writes --------------------------------------------------------------------------------


def duties_watch_start(*, now: datetime | None = None) -> int:
    """Beat started: every scheduled duty is watched from now; unscheduled rows go. Returns rows written."""
    now = now or timezone.now()
    duties = scheduled_duties()
    with transaction.atomic(durable=True):
        Duty.objects.exclude(name__in=list(duties)).delete()
        for name, interval in duties.items():
            Duty.objects.update_or_create(
                name=name, defaults={"interval_seconds": interval, "watch_started_at": now}
            )
    return len(duties)


# One statement per stamp, outside any transaction the task may have left (autocommit): the
# relay stamps twice a second, so it must cost one round trip and never fail the duty itself.
_STAMP_SQL = {
    "started": """
        INSERT INTO backplane_duty (name, interval_seconds, last_started_at, last_error, runs_total, failures_total)
        VALUES (%(name)s, %(interval)s, %(now)s, '', 0, 0)
        ON CONFLICT (name) DO UPDATE SET last_started_at = EXCLUDED.last_started_at,
                                         interval_seconds = EXCLUDED.interval_seconds""",
    "succeeded": """
        INSERT INTO backplane_duty (name, interval_seconds, last_succeeded_at, last_error, runs_total, failures_total)
        VALUES (%(name)s, %(interval)s, %(now)s, '', 1, 0)
        ON CONFLICT (name) DO UPDATE SET last_succeeded_at = EXCLUDED.last_succeeded_at,
                                         runs_total = backplane_duty.runs_total + 1""",
    "failed": """
        INSERT INTO backplane_duty (name, interval_seconds, last_failed_at, last_error, runs_total, failures_total)
        VALUES (%(name)s, %(interval)s, %(now)s, %(error)s, 1, 1)
        ON CONFLICT (name) DO UPDATE SET last_failed_at = EXCLUDED.last_failed_at,
                                         last_error = EXCLUDED.last_error,
                                         runs_total = backplane_duty.runs_total + 1,
                                         failures_total = backplane_duty.failures_total + 1""",
}


def duty_stamp(*, task_name: str, outcome: str, error: str = "") -> str | None:
    """Record that the duty run by ``task_name`` started, succeeded or failed. Returns the duty
    name, or None when the task is no duty. A database that cannot take the stamp is logged:
    the duty then goes overdue, which is the truth."""
    name = _duty_names_by_task().get(task_name)
    if name is None:
        return None
    params: dict[str, Any] = {
        "name": name, "interval": scheduled_duties()[name], "now": timezone.now(), "error": error[:2000],
    }
    try:
        with connection.cursor() as cursor:
            cursor.execute(_STAMP_SQL[outcome], params)
    except DatabaseError:
        logger.warning("could not record that duty %s %s", name, outcome, exc_info=True)
    return name


# --- reads ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class DutyState:
    name: str
    interval_seconds: float
    last_succeeded_at: datetime | None
    last_failed_at: datetime | None
    last_error: str
    # Seconds since the later of the last success and the start of watching; None when the
    # duty was never watched (no beat has started since it was scheduled).
    age_seconds: float | None
    overdue: bool
    runs_total: int
    failures_total: int

    @property
    def problem(self) -> str:
        if self.age_seconds is None:
            return f"duty {self.name} has never been scheduled: is beat running?"
        detail = f"; last error: {self.last_error[:200]}" if self.last_error and self.last_failed_at and (
            self.last_succeeded_at is None or self.last_failed_at > self.last_succeeded_at) else ""
        return (f"duty {self.name} overdue: no success for {self.age_seconds:.0f}s "
                f"(runs every {self.interval_seconds:g}s){detail}")


def duties_state(*, now: datetime | None = None) -> list[DutyState]:
    """Every scheduled duty, in schedule order, with its age and whether it is overdue."""
    now = now or timezone.now()
    rows = {duty.name: duty for duty in Duty.objects.all()}
    states = []
    for name, interval in scheduled_duties().items():
        row = rows.get(name)
        # The interval beat recorded: the schedule that actually runs, which the supervisor's
        # SQL judges by too, even where this process's settings differ.
        interval = row.interval_seconds if row is not None else interval
        since = None
        if row is not None:
            marks = [mark for mark in (row.last_succeeded_at, row.watch_started_at) if mark is not None]
            since = max(marks) if marks else None
        age = (now - since).total_seconds() if since is not None else None
        states.append(DutyState(
            name=name,
            interval_seconds=interval,
            last_succeeded_at=row.last_succeeded_at if row else None,
            last_failed_at=row.last_failed_at if row else None,
            last_error=row.last_error if row else "",
            age_seconds=age,
            overdue=age is None or age > allowance_seconds(interval),
            runs_total=row.runs_total if row else 0,
            failures_total=row.failures_total if row else 0,
        ))
    return states


def duties_overdue(*, now: datetime | None = None) -> list[DutyState]:
    return [state for state in duties_state(now=now) if state.overdue]
