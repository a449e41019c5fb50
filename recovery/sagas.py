"""Sagas: undoing a failed task's side effects, last step first.

A tool call may declare a compensation (``{"tool", "input"}``) when it is dispatched. When
its task fails for good, every call that succeeded and declared one is compensated in
reverse step order, one at a time:

1. ``CompensationRequested`` in the task's log, a compensation record (a ToolCall whose
   ``compensation_of`` names the original) and an outbox message on
   ``backplane.compensations.<tool>`` for the compensating agent, all in one transaction;
2. the compensating agent reports through the usual ``POST /tool-calls/{key}/result/``
   with the compensation's key, which writes ``CompensationCompleted`` and requests the
   next one, or, after the last, ``TaskCompensated``;
3. a failed compensation becomes a dead letter (source ``compensation``); requeueing it
   requests the same compensation again, discarding it goes on with the next one.

The status follows the events (the reducer): ``CompensationStarted`` makes the failed task
``compensating``, ``TaskCompensated`` makes it ``compensated``.

Everything here runs inside the caller's transaction, with the task row locked.
"""

from __future__ import annotations

import hashlib
from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import Q

from backplane.delivery.announcements import announce_dead_letters
from backplane.delivery.models import DeadLetter, DeadLetterSource, DeadLetterStatus
from backplane.delivery.outbox import outbox_enqueue
from backplane.eventlog import event_types as et
from backplane.eventlog.chain import format_timestamp
from backplane.eventlog.models import Task, TaskStatus
from backplane.eventlog.writer import EventDraft, write_events
from recovery.models import ToolCall, ToolCallStatus

COMPENSATION_TOPIC = "backplane.compensations.{tool}"


def compensation_key(original: ToolCall) -> str:
    """Stable, like every tool-call key: a retried request finds the same record."""
    tool = (original.compensation or {}).get("tool", "")
    return hashlib.sha256(f"{original.task_id}:{original.step}:{tool}:compensates:{original.pk}".encode()).hexdigest()


def _skipped_keys(task: Task) -> list[str]:
    """Compensations of this task that failed and a reviewer discarded: nobody will run them."""
    return list(
        DeadLetter.objects.filter(task=task, source=DeadLetterSource.COMPENSATION, status=DeadLetterStatus.DISCARDED)
        .order_by("pk")
        .values_list("reference", flat=True)
    )


def _next_to_compensate(task: Task) -> ToolCall | None:
    """The latest-step succeeded call with a compensation that has been neither compensated
    nor given up on (a discarded compensation's dead letter). One query."""
    settled = ToolCall.objects.filter(task=task, compensation_of__isnull=False).filter(
        Q(status=ToolCallStatus.SUCCEEDED)
        | Q(pk__in=DeadLetter.objects.filter(task=task, source=DeadLetterSource.COMPENSATION,
                                             status=DeadLetterStatus.DISCARDED).values("reference"))
    )
    candidates = (
        ToolCall.objects.filter(task=task, compensation_of__isnull=True, status=ToolCallStatus.SUCCEEDED,
                                compensation__isnull=False)
        .exclude(pk__in=settled.values("compensation_of"))
        .order_by("-step", "-dispatched_at")
    )
    return candidates.first()


def saga_start_if_due(task: Task, *, now: datetime) -> bool:
    """Called when a task has just failed for good: start compensating if anything needs it."""
    original = _next_to_compensate(task)
    if original is None:
        return False
    # The event makes the task compensating (the reducer); the task has just failed, so it is
    # closed to clients, and the backplane records its own saga anyway.
    write_events(
        task,
        [EventDraft(type=et.COMPENSATION_STARTED, payload={"first": original.pk, "step": original.step})],
        agent=None,
        now=now,
        allow_closed=True,
    )
    _request(task, original, now=now)
    return True


def _request(task: Task, original: ToolCall, *, now: datetime) -> ToolCall:
    compensation = original.compensation or {}
    key = compensation_key(original)
    record, _ = ToolCall.objects.update_or_create(
        pk=key,
        defaults={
            "task": task,
            "step": original.step,
            "tool": compensation["tool"],
            "input": compensation.get("input", {}),
            "compensation_of": original.pk,
            "status": ToolCallStatus.DISPATCHED,
            "result": None,
            "completed_at": None,
            "dispatched_at": now,
            "expires_at": now + timedelta(seconds=settings.BACKPLANE_TOOL_CALL_TTL_SECONDS),
        },
    )
    payload = {
        "compensation_key": key,
        "compensates": original.pk,
        "step": original.step,
        "tool": record.tool,
        "input": record.input,
        "original_tool": original.tool,
        "original_result": original.result,
    }
    (event,) = write_events(task, [EventDraft(type=et.COMPENSATION_REQUESTED, payload=payload)], agent=None, now=now)
    outbox_enqueue(
        topic=COMPENSATION_TOPIC.format(tool=record.tool),
        key=str(task.pk),
        payload={"task_id": str(task.pk), **payload},
        headers={"task_id": str(task.pk), "seq": event.seq, "event_hash": event.hash,
                 "created_at": format_timestamp(now)},
        now=now,
        namespace=task.namespace,
        task_id=str(task.pk),
        event_position=event.position,
    )
    return record


def saga_record_compensation_result(task: Task, record: ToolCall, *, agent: str | None, now: datetime) -> None:
    """The compensating agent answered (``record`` already holds status and result)."""
    write_events(
        task,
        [
            EventDraft(
                type=et.COMPENSATION_COMPLETED,
                payload={"compensation_key": record.pk, "compensates": record.compensation_of, "step": record.step,
                         "tool": record.tool, "status": record.status, "result": record.result},
            )
        ],
        agent=agent,
        now=now,
    )
    if record.status != ToolCallStatus.SUCCEEDED:
        DeadLetter.objects.create(
            source=DeadLetterSource.COMPENSATION,
            reference=record.pk,
            task=task,
            topic=COMPENSATION_TOPIC.format(tool=record.tool),
            payload={"compensation_key": record.pk, "tool": record.tool, "input": record.input,
                     "result": record.result},
            error=f"compensation {record.tool} of step {record.step} failed",
            attempts=1,
            created_at=now,
        )
        announce_dead_letters(source=DeadLetterSource.COMPENSATION)
        return
    _request_next_or_finish(task, now=now)


def _request_next_or_finish(task: Task, *, now: datetime) -> None:
    following = _next_to_compensate(task)
    if following is not None:
        _request(task, following, now=now)
        return
    write_events(task, [EventDraft(type=et.TASK_COMPENSATED, payload={"skipped": _skipped_keys(task)})], agent=None,
                 now=now)


def saga_skip_compensation(task: Task, compensation_key_: str, *, now: datetime) -> None:
    """A reviewer discarded a failed compensation: nobody will undo that step, so the saga
    goes on with the step before it, or ends (``TaskCompensated`` lists what was skipped)."""
    if task.status != TaskStatus.COMPENSATING:
        return
    _request_next_or_finish(task, now=now)


def saga_retry_compensation(task: Task, compensation_key_: str, *, now: datetime) -> None:
    """A reviewer requeued a failed compensation: ask for the same compensation again."""
    record = ToolCall.objects.get(pk=compensation_key_)
    original = ToolCall.objects.get(pk=record.compensation_of)
    _request(task, original, now=now)
