"""The stall detector: leases that ran out (or tasks that heartbeat without progress) are taken
back, the holder fenced off, the attempt counted, the task requeued or dead-lettered."""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta

import psycopg
from django.conf import settings
from django.db import OperationalError, transaction
from django.db.models import Exists, OuterRef, Q
from django.utils import timezone

from backplane.delivery.announcements import announce_dead_letters
from backplane.delivery.models import DeadLetter, DeadLetterSource
from backplane.eventlog import event_types as et
from backplane.eventlog.chain import format_timestamp
from backplane.eventlog.models import Task, TaskStatus
from backplane.eventlog.selectors import task_head_traces
from backplane.eventlog.writer import EventDraft, TaskWrite, write_events_many
from backplane.telemetry.tracing import TaskSpan, task_span_start
from recovery.breakers import breaker_record_failures
from recovery.models import ApprovalRequest, ApprovalStatus, SignalStatus, TaskSignal

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class StallSweep:
    expired: int
    requeued: int
    dead_lettered: int


def lease_expire_stalled(*, now: datetime | None = None, batch_size: int = 100) -> StallSweep:
    """Expire one batch of leases that ran out: fence the holder off and hand the task on.

    Races, and why they are safe:
    - a heartbeat and this sweep both lock the row. If the heartbeat holds it, SKIP LOCKED
      passes the row over this round; if it committed a moment ago, PostgreSQL re-checks
      the WHERE clause against the new row version and the extended lease no longer
      matches. Either way a renewed lease is never expired;
    - two sweeps at once (several workers) lock disjoint rows, so nothing is counted twice;
    - a task whose tool call waits for people's approval (recovery/approvals.py), or that waits
      for a signal (recovery/signals.py), is not stalled while it waits, nor for one lease's
      length after the decision or the signal, so the waiting agent can make its next move; an
      agent that died meanwhile is found stalled then.

    The batch is written set-wise (a sweep after a crash of a busy agent can have thousands
    of leases to take back, and the lag until TaskStalled is the time to sweep them all):
    1. lock the batch's tasks (one SELECT ... FOR UPDATE SKIP LOCKED);
    2. ``write_events_many``: every TaskStalled (and TaskDeadLettered) with its projection in
       one statement, every lifecycle message in one more; the events are chained exactly as
       ``write_events`` chains them, each on its own task's head;
    3. the dead letters of the exhausted tasks in one INSERT;
    4. the holders' circuit breakers: every agent locked (in id order) and updated once.
    """
    now = now or timezone.now()
    # The stalls' spans end once the batch has committed, or failed with it.
    spans: list[TaskSpan] = []
    error: str | None = None
    try:
        return _lease_expire_stalled(now=now, batch_size=batch_size, spans=spans)
    except BaseException as exc:
        error = f"{exc.__class__.__name__}: {exc}"
        raise
    finally:
        for span in spans:
            span.end(error=error)


def _lease_expire_stalled(*, now: datetime, batch_size: int, spans: list[TaskSpan]) -> StallSweep:
    with transaction.atomic(durable=True):
        silent_since = now - timedelta(seconds=settings.BACKPLANE_NO_PROGRESS_STALL_SECONDS)
        # A wait that ended within one lease's length: its agent may be making its next move.
        just_now = now - timedelta(seconds=settings.BACKPLANE_LEASE_SECONDS)
        stalled = list(
            Task.objects.select_for_update(skip_locked=True)
            .filter(status=TaskStatus.RUNNING, lease_holder__isnull=False)
            # A lease that ran out, or one kept alive by heartbeats while nothing was written.
            .filter(Q(lease_expires_at__lt=now) | Q(last_event_at__lt=silent_since))
            .exclude(Exists(ApprovalRequest.objects.filter(task=OuterRef("pk")).filter(
                Q(status=ApprovalStatus.PENDING) | Q(decided_at__gt=just_now))))
            .exclude(Exists(TaskSignal.objects.filter(task=OuterRef("pk")).filter(
                Q(status=SignalStatus.WAITING) | Q(awaited_at__isnull=False, received_at__gt=just_now))))
            .order_by("lease_expires_at")[:batch_size]
        )
        if not stalled:
            return StallSweep(expired=0, requeued=0, dead_lettered=0)
        # Each task's stall continues the task's trace: a child of the span that wrote its last
        # event (an agent's request, usually the crashed one's), linked to this sweep's run.
        traces = task_head_traces(stalled)
        writes: list[TaskWrite] = []
        # Read before the events release the lease: why each task stalled and who held it.
        stalls: list[tuple[Task, str, str | None, bool]] = []
        # (namespace, holder) -> (leases of it that stalled, the last of them)
        failed_holders: dict[tuple[str, str], tuple[int, uuid.UUID]] = {}
        for task in stalled:
            # A lease's holder and expiry are set together (the reducer), and each row has a holder.
            assert task.lease_expires_at is not None
            reason = "lease expired" if task.lease_expires_at < now else "no progress"
            exhausted = task.attempts + 1 >= task.max_attempts
            quiet_for = (now - (task.last_event_at or task.created_at)).total_seconds()
            trace_id, parent_span_id = traces.get(task.pk, (None, None))
            span = task_span_start("stall task", trace_id=trace_id, span_id=parent_span_id, attributes={
                "backplane.task_id": str(task.pk), "backplane.task.kind": task.kind,
                "backplane.agent": task.lease_holder or "", "backplane.lease_epoch": task.lease_epoch,
                "backplane.stall.reason": reason, "backplane.attempt": task.attempts + 1,
            })
            if span is not None:
                spans.append(span)
                trace_id, span_id = span.trace_id, span.span_id
            else:
                span_id = None
            drafts = [
                EventDraft(
                    type=et.TASK_STALLED,
                    payload={
                        "reason": reason,
                        "holder": task.lease_holder,
                        "lease_epoch": task.lease_epoch,
                        "lease_expired_at": format_timestamp(task.lease_expires_at),
                        "seconds_since_last_event": round(quiet_for, 3),
                        "attempt": task.attempts + 1,
                        "max_attempts": task.max_attempts,
                    },
                    trace_id=trace_id,
                    span_id=span_id,
                )
            ]
            if exhausted:
                drafts.append(
                    EventDraft(type=et.TASK_DEAD_LETTERED, payload={"reason": "attempts exhausted"},
                               trace_id=trace_id, span_id=span_id)
                )
            # The events drive the projection: TaskStalled fences the holder off (epoch + 1),
            # counts the attempt and frees the task; TaskDeadLettered parks it for review.
            writes.append(TaskWrite(task=task, drafts=drafts))
            holder = task.lease_holder
            stalls.append((task, reason, holder, exhausted))
            # A sandbox (a replay) is nobody's production work: its stalls count against no
            # breaker and its last one leaves no dead letter for the fleet's reviewers.
            if holder and not task.sandbox:
                count, _ = failed_holders.get((task.namespace, holder), (0, task.pk))
                failed_holders[(task.namespace, holder)] = (count + 1, task.pk)
        write_events_many(writes, agent=None, now=now)
        dead_letters = [
            DeadLetter(
                source=DeadLetterSource.TASK,
                reference=str(task.pk),
                task=task,
                topic=f"backplane.tasks.{task.kind}",
                payload={"task_id": str(task.pk), "kind": task.kind, "input": task.input},
                error=f"{reason} (holder {holder}); attempts exhausted ({task.attempts}/{task.max_attempts})",
                attempts=task.attempts,
                created_at=now,
            )
            for task, reason, holder, exhausted in stalls
            if exhausted and not task.sandbox
        ]
        DeadLetter.objects.bulk_create(dead_letters)
        announce_dead_letters(source=DeadLetterSource.TASK, count=len(dead_letters))
        dead_lettered = len(dead_letters)
        requeued = len(stalled) - dead_lettered
        # Breakers last, once per agent, locked in a fixed order: two sweeps running at once
        # cannot deadlock on agent rows (each locks only its own tasks), and an agent's claims
        # wait for its row only while this transaction commits.
        breaker_record_failures(failures=failed_holders, reason="lease expired", now=now)
    return StallSweep(expired=len(stalled), requeued=requeued, dead_lettered=dead_lettered)


# A batch PostgreSQL aborted to break a deadlock is retried at once, this many times in a row.
DEADLOCK_RETRIES = 5


def lease_expire_stalled_until_idle(*, batch_size: int = 100) -> StallSweep:
    """Sweep batch after batch until no lease is left to expire (what the beat task runs).

    Concurrent sweeps lock disjoint tasks, but writing a batch can lock more rows: the
    holders' agents (in id order), and the parent of a dead-lettered sub-task. Two sweeps whose
    batches hold each other's parents, or a sweep and an agent finishing a sub-task, can then
    wait on each other; PostgreSQL aborts one transaction. Nothing of that batch was written,
    its rows are unlocked again, and it is simply swept again.
    """
    totals = [0, 0, 0]
    deadlocks_in_a_row = 0
    while True:
        try:
            sweep = lease_expire_stalled(batch_size=batch_size)
        except OperationalError as exc:
            if not isinstance(exc.__cause__, psycopg.errors.DeadlockDetected) or (
                deadlocks_in_a_row >= DEADLOCK_RETRIES
            ):
                raise
            deadlocks_in_a_row += 1
            logger.warning("stall sweep batch aborted by a deadlock; sweeping it again (%d)", deadlocks_in_a_row)
            continue
        deadlocks_in_a_row = 0
        if not sweep.expired:
            return StallSweep(*totals)
        totals = [a + b for a, b in zip(totals, (sweep.expired, sweep.requeued, sweep.dead_lettered), strict=True)]
