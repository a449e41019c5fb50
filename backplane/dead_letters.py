"""Decisions on dead letters: requeue (optionally with an edited payload) or discard.

The dashboard and the API call these same services. Each decision is recorded on the
dead letter (who, when, why) and, where a task is involved, as an event in its log.
A dead letter is decided once: the row lock and the status check make a second,
concurrent decision fail instead of acting twice.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.utils import timezone

from backplane import event_types as et
from backplane.errors import AlreadyDecided, InvalidInput, NotFound
from backplane.models import (
    DeadLetter,
    DeadLetterSource,
    DeadLetterStatus,
    OutboxMessage,
    OutboxStatus,
    Task,
    TaskStatus,
)
from backplane.outbox import enqueue_lifecycle
from backplane.services import EventDraft, ensure_storable_json, write_events


def _lock_pending(dead_letter_id: int) -> DeadLetter:
    dead_letter = DeadLetter.objects.select_for_update().filter(pk=dead_letter_id).first()
    if dead_letter is None:
        raise NotFound("dead letter not found", {"id": dead_letter_id})
    if dead_letter.status != DeadLetterStatus.PENDING:
        raise AlreadyDecided(
            f"this dead letter was already {dead_letter.status}",
            {"status": dead_letter.status, "decided_by": dead_letter.decided_by},
        )
    return dead_letter


def _require_reason(reason: str) -> str:
    reason = (reason or "").strip()
    if not reason:
        raise InvalidInput("a reason is required", {"reason": "required"})
    return reason


def _record_in_task_log(dead_letter: DeadLetter, event_type: str, *, decided_by: str, reason: str,
                        extra: dict[str, Any] | None = None) -> None:
    if dead_letter.task_id is None:
        return
    task = Task.objects.select_for_update().get(pk=dead_letter.task_id)
    write_events(
        task,
        [
            EventDraft(
                type=event_type,
                payload={"dead_letter_id": dead_letter.pk, "source": dead_letter.source,
                         "reference": dead_letter.reference, "decided_by": decided_by, "reason": reason,
                         **(extra or {})},
            )
        ],
        agent=decided_by,
        now=timezone.now(),
        allow_closed=True,
    )


def dead_letter_requeue(
    *, dead_letter_id: int, decided_by: str, reason: str, payload: dict[str, Any] | None = None
) -> DeadLetter:
    """Send the failed work back: an outbox message is retried from attempt 0 (with the edited
    payload if one is given); a dead-lettered task goes back to pending with fresh attempts."""
    reason = _require_reason(reason)
    if payload is not None:
        ensure_storable_json(payload, "payload")
    with transaction.atomic(durable=True):
        dead_letter = _lock_pending(dead_letter_id)
        now = timezone.now()
        if dead_letter.source == DeadLetterSource.OUTBOX:
            message = OutboxMessage.objects.select_for_update().filter(pk=dead_letter.outbox_message_id).first()
            if message is None:
                raise InvalidInput("the outbox message is gone (pruned)", {"id": dead_letter.pk})
            message.status = OutboxStatus.PENDING
            message.attempts = 0
            message.next_attempt_at = now
            message.last_error = ""
            if payload is not None:
                message.payload = payload
            message.save(update_fields=["status", "attempts", "next_attempt_at", "last_error", "payload"])
        elif dead_letter.source == DeadLetterSource.TASK:
            task = Task.objects.select_for_update().get(pk=dead_letter.task_id)
            if task.status != TaskStatus.DEAD_LETTERED:
                raise InvalidInput("the task is no longer dead-lettered", {"status": task.status})
            if payload is not None:
                raise InvalidInput("a task is requeued as it is", {"payload": "not allowed for task dead letters"})
        elif dead_letter.source == DeadLetterSource.COMPENSATION:
            if payload is not None:
                raise InvalidInput("a compensation is retried as declared", {"payload": "not allowed here"})
        elif dead_letter.source == DeadLetterSource.AUDIT_EXPORT:
            if payload is not None:
                raise InvalidInput("an audit export is retried as it is", {"payload": "not allowed here"})
        else:
            raise InvalidInput(
                f"requeueing {dead_letter.source} dead letters is not supported",
                {"source": dead_letter.source},
            )
        dead_letter.status = DeadLetterStatus.REQUEUED
        dead_letter.decided_by = decided_by
        dead_letter.decided_at = now
        dead_letter.reason = reason
        if payload is not None:
            dead_letter.payload = payload
        dead_letter.save(update_fields=["status", "decided_by", "decided_at", "reason", "payload"])
        _record_in_task_log(dead_letter, et.DEAD_LETTER_REQUEUED, decided_by=decided_by, reason=reason,
                            extra={"edited_payload": payload is not None})
        if dead_letter.source == DeadLetterSource.TASK:
            _requeue_task(dead_letter.task_id, now=now)
        elif dead_letter.source == DeadLetterSource.COMPENSATION:
            # Imported here: sagas live with recovery, which builds on this package.
            from recovery.sagas import saga_retry_compensation

            task = Task.objects.select_for_update().get(pk=dead_letter.task_id)
            saga_retry_compensation(task, dead_letter.reference, now=now)
        elif dead_letter.source == DeadLetterSource.AUDIT_EXPORT:
            # The export continues from the last recorded segment, so requeueing is an export run
            # now rather than at the next hourly beat (which would retry it anyway).
            from backplane.tasks import audit_export

            transaction.on_commit(audit_export.delay)
    return dead_letter


def _requeue_task(task_id: Any, *, now: Any) -> None:
    task = Task.objects.select_for_update().get(pk=task_id)
    previous = task.status
    task.status = TaskStatus.PENDING
    task.attempts = 0
    task.lease_holder = None
    task.lease_expires_at = None
    task.updated_at = now
    task.save(update_fields=["status", "attempts", "lease_holder", "lease_expires_at", "updated_at"])
    enqueue_lifecycle(task=task, previous_status=previous, seq=task.last_seq, event_hash=task.head_hash, now=now)


def dead_letter_discard(*, dead_letter_id: int, decided_by: str, reason: str, compensate: bool = False) -> DeadLetter:
    """Give up on the work for good, with the reason on record.

    ``compensate`` (task dead letters only): the task fails for good, so the compensations
    its succeeded tool calls declared are run (a saga)."""
    reason = _require_reason(reason)
    with transaction.atomic(durable=True):
        dead_letter = _lock_pending(dead_letter_id)
        if compensate and dead_letter.source != DeadLetterSource.TASK:
            raise InvalidInput("only a task's dead letter can be compensated", {"compensate": "task dead letters only"})
        dead_letter.status = DeadLetterStatus.DISCARDED
        dead_letter.decided_by = decided_by
        dead_letter.decided_at = timezone.now()
        dead_letter.reason = reason
        dead_letter.save(update_fields=["status", "decided_by", "decided_at", "reason"])
        _record_in_task_log(dead_letter, et.DEAD_LETTER_DISCARDED, decided_by=decided_by, reason=reason,
                            extra={"compensate": compensate})
        if compensate:
            _fail_and_compensate(dead_letter.task_id, now=dead_letter.decided_at)
    return dead_letter


def _fail_and_compensate(task_id: Any, *, now: Any) -> None:
    from recovery.sagas import saga_start_if_due

    task = Task.objects.select_for_update().get(pk=task_id)
    task.status = TaskStatus.FAILED
    task.save(update_fields=["status"])
    saga_start_if_due(task, now=now)
