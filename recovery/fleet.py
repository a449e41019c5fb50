"""Fleet operations: cancel a task, pause and resume a namespace or one kind of it.

A cancellation is an event (``TaskCancelled``, with who, why and whether to compensate): the
reducer closes the task and drops its lease, so the holder's next write, heartbeat or tool
call is refused with ``task_closed`` naming the cancellation (``writer.task_closed_error``).
With ``compensate`` the saga starts as it does for a terminal failure (recovery/handlers.py),
and a cancelled sub-task reports to its parent like a failed one.

A pause is a row (``recovery.models.Pause``) that claims read (recovery/leases.py): pending
work of a paused namespace, or of a paused kind in it, is passed over; leases already held run
on. Lifting it fills its resume fields, so the row is its own audit trail. The reads (the pauses
in force, those lifted lately, the one holding a task back) are in recovery/selectors.py.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone

from backplane.eventlog import event_types as et
from backplane.eventlog.errors import AlreadyDecided, InvalidInput, NotFound
from backplane.eventlog.models import NAME_VALIDATOR, Task
from backplane.eventlog.writer import EventDraft, TaskWrite, lock_task, task_closed_error, write_events_many
from recovery.errors import PauseInForce
from recovery.models import Pause


def _require_reason(reason: str) -> str:
    reason = (reason or "").strip()
    if not reason:
        raise InvalidInput("a reason is required", {"reason": "required"})
    return reason


# --- cancel -----------------------------------------------------------------------------------


def tasks_cancel_locked(tasks: Sequence[Task], *, cancelled_by: str, reason: str, compensate: bool,
                        now: datetime) -> None:
    """Write one ``TaskCancelled`` to each task, all in one statement (``write_events_many``).

    The caller holds the tasks' row locks, taken in id order so that two cancels over
    overlapping sets cannot deadlock, and has left out tasks that are already closed (the
    writer refuses an event on a closed task and the whole batch would roll back). The
    follow-ups run per task inside the same transaction: the saga starts for ``compensate``,
    a sub-task reports to its parent.
    """
    payload = {"cancelled_by": cancelled_by, "reason": reason, "compensate": compensate}
    write_events_many(
        [TaskWrite(task=task, drafts=[EventDraft(type=et.TASK_CANCELLED, payload=payload)]) for task in tasks],
        agent=None,
        now=now,
    )


def task_cancel(*, namespace: str | None, task_id: uuid.UUID, cancelled_by: str, reason: str,
                compensate: bool) -> Task:
    """Cancel one task (``namespace=None``: staff, any namespace). 409 ``task_closed`` when it
    has already finished, naming its status (and, if cancelled, who cancelled it and why)."""
    reason = _require_reason(reason)
    with transaction.atomic(durable=True):
        task = lock_task(namespace=namespace, task_id=task_id)
        if task.is_closed:
            raise task_closed_error(task)
        tasks_cancel_locked([task], cancelled_by=cancelled_by, reason=reason, compensate=compensate,
                            now=timezone.now())
    return task


# --- pause and resume -------------------------------------------------------------------------


def pause_set(*, namespace: str, kind: str, paused_by: str, reason: str) -> Pause:
    """Hold back the pending work of a namespace (``kind`` blank) or of one kind in it.

    409 ``pause_in_force`` when a pause already holds that scope: the unique constraint on
    pauses in force decides between two concurrent requests, so exactly one of them wins."""
    reason = _require_reason(reason)
    for field, value in (("namespace", namespace), ("kind", kind)):
        if field == "namespace" or value:
            try:
                NAME_VALIDATOR(value)
            except Exception:  # noqa: BLE001 - a ValidationError: the contract's 400
                raise InvalidInput(f"invalid {field}", {field: "letters, digits, '.', '_' or '-'"}) from None
    try:
        with transaction.atomic(durable=True):
            return Pause.objects.create(namespace=namespace, kind=kind, reason=reason, paused_by=paused_by,
                                        paused_at=timezone.now())
    except IntegrityError:
        in_force = Pause.objects.filter(namespace=namespace, kind=kind, resumed_at__isnull=True).first()
        details: dict[str, Any] = {"namespace": namespace, "kind": kind}
        if in_force is not None:
            details.update(pause_id=in_force.pk, paused_by=in_force.paused_by, reason=in_force.reason)
        raise PauseInForce("a pause is already in force for this scope", details) from None


def pause_lift(*, pause_id: int, resumed_by: str, reason: str) -> Pause:
    """Let the paused work be claimed again. 409 ``already_decided`` if it was lifted before."""
    reason = _require_reason(reason)
    with transaction.atomic(durable=True):
        pause = Pause.objects.select_for_update().filter(pk=pause_id).first()
        if pause is None:
            raise NotFound("pause not found", {"pause_id": pause_id})
        if pause.resumed_at is not None:
            raise AlreadyDecided("this pause was already lifted",
                                 {"resumed_by": pause.resumed_by, "resumed_at": pause.resumed_at.isoformat()})
        pause.resumed_by, pause.resumed_at, pause.resume_reason = resumed_by, timezone.now(), reason
        pause.save(update_fields=["resumed_by", "resumed_at", "resume_reason"])
    return pause
