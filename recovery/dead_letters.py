"""Decisions on dead letters: requeue (optionally with an edited payload) or discard.

The dashboard, the admin and the API call these same services. Each decision is recorded on
the dead letter (who, when, why) and, where a task is involved, as an event in its log
(``DeadLetterRequeued`` / ``DeadLetterDiscarded``), which is also what changes the task.
A dead letter is decided once: the row lock and the status check make a second,
concurrent decision fail instead of acting twice.
"""

from __future__ import annotations

import functools
from typing import Any

from django.db import transaction
from django.utils import timezone

from backplane.delivery.models import DeadLetter, DeadLetterSource, DeadLetterStatus, OutboxMessage, OutboxStatus
from backplane.eventlog import event_types as et
from backplane.eventlog.errors import AlreadyDecided, InvalidInput, NotFound
from backplane.eventlog.models import Task, TaskStatus
from backplane.eventlog.services import ensure_storable_json
from backplane.eventlog.writer import EventDraft, write_events
from backplane.integrity.tasks import audit_export
from backplane.telemetry import counters
from recovery.sagas import saga_retry_compensation, saga_skip_compensation


def _lock_pending(dead_letter_id: int) -> DeadLetter:
    dead_letter = DeadLetter.objects.select_for_update().filter(pk=dead_letter_id).first()
    if dead_letter is None:
        raise NotFound("dead letter not found", {"id": dead_letter_id})
    if dead_letter.status != DeadLetterStatus.PENDING:
        raise AlreadyDecided(
            f"this dead letter was already {dead_letter.status} by {dead_letter.decided_by or 'the backplane'}",
            {"status": dead_letter.status, "decided_by": dead_letter.decided_by},
        )
    return dead_letter


def _require_reason(reason: str) -> str:
    reason = (reason or "").strip()
    if not reason:
        raise InvalidInput("a reason is required", {"reason": "required"})
    return reason


def _record_in_task_log(dead_letter: DeadLetter, event_type: str, *, decided_by: str, reason: str,
                        extra: dict[str, Any] | None = None) -> Task | None:
    """Write the decision into the log of the task it concerns (if any); returns that task, locked."""
    if dead_letter.task_id is None:
        return None
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
    return task


def dead_letter_requeue(
    *, dead_letter_id: int, decided_by: str, reason: str, payload: dict[str, Any] | None = None
) -> DeadLetter:
    """Send the failed work back: an outbox message is retried from attempt 0 (with the edited
    payload if one is given); a dead-lettered task goes back to pending with fresh attempts."""
    reason = _require_reason(reason)
    if payload is not None:
        ensure_storable_json(payload, "payload")
    with transaction.atomic(durable=True):
        return dead_letter_requeue_in_transaction(dead_letter_id=dead_letter_id, decided_by=decided_by,
                                                  reason=reason, payload=payload)


def dead_letter_requeue_in_transaction(
    *, dead_letter_id: int, decided_by: str, reason: str, payload: dict[str, Any] | None = None
) -> DeadLetter:
    """``dead_letter_requeue``'s decision in the caller's transaction (a bulk job's chunk,
    recovery/bulk.py), with ``reason`` and ``payload`` already checked. Locks the dead letter,
    then its task."""
    dead_letter = _lock_pending(dead_letter_id)
    now = timezone.now()
    if dead_letter.source == DeadLetterSource.OUTBOX:
        message = None
        if dead_letter.outbox_message_id is not None:  # None once the message was pruned
            message = OutboxMessage.objects.select_for_update().filter(pk=dead_letter.outbox_message_id).first()
        if message is None:
            raise InvalidInput("the outbox message is gone (pruned)", {"id": dead_letter.pk})
        # The same row goes back, keeping its id, which is its place in its key's order: under
        # strict ordering the messages that waited behind it are delivered after it (it heads
        # its key again); under best effort they went ahead already and it comes late.
        message.status = OutboxStatus.PENDING
        message.attempts = 0
        message.next_attempt_at = now
        message.last_error = ""
        message.holds_key = False
        message.claimed_until = None
        message.claim_token = None
        if payload is not None:
            message.payload = payload
        message.save(update_fields=["status", "attempts", "next_attempt_at", "last_error", "payload", "holds_key",
                                    "claimed_until", "claim_token"])
    elif dead_letter.source == DeadLetterSource.TASK:
        assert dead_letter.task_id is not None  # a task's dead letter always names it (PROTECT)
        current = Task.objects.select_for_update().get(pk=dead_letter.task_id)
        if current.status != TaskStatus.DEAD_LETTERED:
            raise InvalidInput("the task is no longer dead-lettered", {"status": current.status})
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
    # An edit replaces the payload on the message; the dead letter and the log keep both.
    edit = {} if payload is None else {"payload": payload, "original_payload": dead_letter.payload}
    dead_letter.status = DeadLetterStatus.REQUEUED
    dead_letter.decided_by = decided_by
    dead_letter.decided_at = now
    dead_letter.reason = reason
    if payload is not None:
        # The payload as it failed stays on record beside the one requeued.
        dead_letter.original_payload = dead_letter.payload
        dead_letter.payload = payload
    dead_letter.save(update_fields=["status", "decided_by", "decided_at", "reason", "payload", "original_payload"])
    # For a task's own dead letter the event is the requeue: the reducer sends the task
    # back to pending with fresh attempts. Otherwise it records the decision in the log.
    task = _record_in_task_log(
        dead_letter, et.DEAD_LETTER_REQUEUED, decided_by=decided_by, reason=reason,
        extra={"edited_payload": payload is not None, **edit},
    )
    if dead_letter.source == DeadLetterSource.COMPENSATION:
        assert task is not None  # a compensation always belongs to a task
        saga_retry_compensation(task, dead_letter.reference, now=now)
    elif dead_letter.source == DeadLetterSource.AUDIT_EXPORT:
        # The export continues from the last recorded segment, so requeueing is an export run
        # now rather than at the next hourly beat (which would retry it anyway).
        transaction.on_commit(audit_export.delay)
    transaction.on_commit(
        functools.partial(counters.dead_letter_decided_count, decision=DeadLetterStatus.REQUEUED.value))
    return dead_letter


def dead_letter_discard(*, dead_letter_id: int, decided_by: str, reason: str, compensate: bool = False) -> DeadLetter:
    """Give up on the work for good, with the reason on record.

    ``compensate`` (task dead letters only): the task fails for good, so the compensations
    its succeeded tool calls declared are run (a saga)."""
    reason = _require_reason(reason)
    with transaction.atomic(durable=True):
        return dead_letter_discard_in_transaction(dead_letter_id=dead_letter_id, decided_by=decided_by,
                                                  reason=reason, compensate=compensate)


def dead_letter_discard_in_transaction(*, dead_letter_id: int, decided_by: str, reason: str,
                                       compensate: bool = False) -> DeadLetter:
    """``dead_letter_discard``'s decision in the caller's transaction (a bulk job's chunk), with
    ``reason`` already checked."""
    dead_letter = _lock_pending(dead_letter_id)
    if compensate and dead_letter.source != DeadLetterSource.TASK:
        raise InvalidInput("only a task's dead letter can be compensated", {"compensate": "task dead letters only"})
    dead_letter.status = DeadLetterStatus.DISCARDED
    dead_letter.decided_by = decided_by
    dead_letter.decided_at = timezone.now()
    dead_letter.reason = reason
    dead_letter.save(update_fields=["status", "decided_by", "decided_at", "reason"])
    if dead_letter.source == DeadLetterSource.OUTBOX and dead_letter.outbox_message_id is not None:
        # The message stays dead; under strict ordering its key goes on without it (the relays'
        # next poll finds the messages behind it).
        OutboxMessage.objects.filter(pk=dead_letter.outbox_message_id, holds_key=True).update(holds_key=False)
    # With ``compensate`` the event fails the task for good (the reducer), and the failure
    # starts its saga (recovery's follow-up to the write).
    task = _record_in_task_log(dead_letter, et.DEAD_LETTER_DISCARDED, decided_by=decided_by, reason=reason,
                               extra={"compensate": compensate})
    if dead_letter.source == DeadLetterSource.COMPENSATION:
        # Nobody will undo this step: the saga goes on with the steps before it.
        assert task is not None
        saga_skip_compensation(task, dead_letter.reference, now=dead_letter.decided_at)
    transaction.on_commit(
        functools.partial(counters.dead_letter_decided_count, decision=DeadLetterStatus.DISCARDED.value))
    return dead_letter


# --- what a decision will do, and many decisions at once --------------------------------------


def requeue_effect(dead_letter: DeadLetter) -> str:
    """In words, what requeueing this dead letter does (shown before a reviewer decides)."""
    if dead_letter.source == DeadLetterSource.OUTBOX:
        return (f"The outbox message is sent again to {dead_letter.topic or 'its destination'} from attempt 0 "
                "(with the edited payload, if you edit it). Under strict ordering the later messages of its key, "
                "held back behind it, follow it in their order; discarding it lets them go on without it.")
    if dead_letter.source == DeadLetterSource.TASK:
        return ("The task goes back to pending with fresh attempts; the next agent that claims it gets its "
                "recovery context, so finished steps and answered tool calls are not redone.")
    if dead_letter.source == DeadLetterSource.COMPENSATION:
        return "The compensation is tried again as declared; the saga then goes on with the steps before it."
    if dead_letter.source == DeadLetterSource.AUDIT_EXPORT:
        return "An audit export runs now and continues after the last exported segment."
    return f"{dead_letter.source} dead letters cannot be requeued; they can be discarded."


def may_edit_payload(dead_letter: DeadLetter) -> bool:
    return dead_letter.source == DeadLetterSource.OUTBOX
