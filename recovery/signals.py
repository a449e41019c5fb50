"""Waiting for the outside world: a task waits durably for a named signal (docs/approvals.md,
"Signals").

An agent declares the wait (``signal_await``: ``SignalAwaited`` with its deadline); a person, a
webhook or another agent of the namespace sends the signal (``signal_send``: ``SignalReceived``
with its payload and sender); the ``expire-approvals`` duty ends a wait whose time ran out
(``signals_expire``: ``SignalTimedOut``). Each is one transaction under the task's row lock, and
the signal's row (one per task and name) says where it stands, so a signal sent before the wait
is found by it, a repeat of either side is answered from the row, and a crashed agent that
claims the task again waits for the same signal. The stall detector leaves a waiting task alone,
as it does a task waiting for an approval.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.utils import timezone

from backplane.eventlog import event_types as et
from backplane.eventlog.chain import format_timestamp
from backplane.eventlog.errors import AlreadyDecided, InvalidInput, NotFound
from backplane.eventlog.models import Task
from backplane.eventlog.services import ensure_storable_json
from backplane.eventlog.writer import (
    EventDraft,
    check_kind,
    check_lease,
    lock_task,
    task_closed_error,
    write_events,
)
from recovery.models import SignalStatus, TaskSignal

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,99}$")
TIMEOUT_MAX_SECONDS = 30 * 24 * 3600


def _checked_name(name: str) -> str:
    if not NAME.match(name):
        raise InvalidInput("a signal's name is 1 to 100 letters, digits, - and _",
                           {"name": "must match ^[A-Za-z0-9][A-Za-z0-9_-]{0,99}$"})
    return name


def signal_await(*, namespace: str | None, task_id: uuid.UUID, name: str, timeout_seconds: int, agent: str | None,
                 lease_epoch: int | None, kinds: Sequence[str] = ()) -> tuple[TaskSignal, bool]:
    """The task's holder waits for the signal ``name`` for at most ``timeout_seconds``: the row
    and whether this call began the wait (``SignalAwaited`` written). A signal already sent is
    answered at once; a wait already begun is answered as it stands (a retry, a new attempt)."""
    _checked_name(name)
    if not 1 <= timeout_seconds <= TIMEOUT_MAX_SECONDS:
        raise InvalidInput("the timeout is 1 s to 30 days", {"timeout_seconds": f"1 to {TIMEOUT_MAX_SECONDS}"})
    now = timezone.now()
    with transaction.atomic(durable=True):
        task = lock_task(namespace=namespace, task_id=task_id)
        check_lease(task, lease_epoch, agent=agent, kinds=kinds)
        signal = TaskSignal.objects.select_for_update().filter(task=task, name=name).first()
        if signal is not None and signal.awaited_at is not None:
            return signal, False
        if task.is_closed:
            raise task_closed_error(task)
        if signal is None:
            signal = TaskSignal(task=task, name=name, status=SignalStatus.WAITING)
        signal.awaited_by, signal.awaited_at = agent or "", now
        signal.expires_at = now + timedelta(seconds=timeout_seconds)
        signal.save()
        write_events(task, [EventDraft(type=et.SIGNAL_AWAITED, payload={
            "name": name, "expires_at": format_timestamp(signal.expires_at),
            "already_received": signal.status == SignalStatus.RECEIVED})], agent=agent, now=now)
    return signal, True


def signal_send(*, namespace: str | None, task_id: uuid.UUID, name: str, payload: dict[str, Any],
                sent_by: str, agent: str | None = None, kinds: Sequence[str] = ()) -> tuple[TaskSignal, bool]:
    """Send the signal ``name`` to the task: the row and whether this call delivered it
    (``SignalReceived`` written). The same payload again is answered from the row; another
    payload, or a signal whose wait ran out, is ``409 already_decided``; a closed task
    ``409 task_closed``. An agent (``agent``) limited to ``kinds`` signals only tasks of those
    kinds (and those it created), as it writes only to them: another kind is 403."""
    _checked_name(name)
    ensure_storable_json(payload, "payload")
    now = timezone.now()
    with transaction.atomic(durable=True):
        task = lock_task(namespace=namespace, task_id=task_id)
        check_kind(task, agent=agent, kinds=kinds)
        signal = TaskSignal.objects.select_for_update().filter(task=task, name=name).first()
        if signal is not None and signal.status == SignalStatus.RECEIVED:
            if signal.payload == payload:
                return signal, False
            raise AlreadyDecided("this signal was received already, with another payload",
                                 {"name": name, "sent_by": signal.sent_by})
        if signal is not None and signal.status == SignalStatus.TIMED_OUT:
            raise AlreadyDecided("the wait for this signal ran out before it came",
                                 {"name": name, "timed_out_at": format_timestamp(signal.timed_out_at or now)})
        if task.is_closed:
            raise task_closed_error(task)
        if signal is None:
            signal = TaskSignal(task=task, name=name)
        signal.status, signal.payload, signal.sent_by, signal.received_at = (
            SignalStatus.RECEIVED, payload, sent_by, now)
        signal.save()
        write_events(task, [EventDraft(type=et.SIGNAL_RECEIVED, payload={
            "name": name, "payload": payload, "sent_by": sent_by})], agent=None, now=now)
    return signal, True


def signal_get(*, namespace: str | None, task_id: uuid.UUID, name: str) -> TaskSignal:
    signal = TaskSignal.objects.filter(task_id=task_id, name=name).select_related("task").first()
    if signal is None or (namespace is not None and signal.task.namespace != namespace):
        raise NotFound("no such signal on this task: neither waited for nor sent",
                       {"task_id": str(task_id), "name": name})
    return signal


def signals_expire(*, now: datetime | None = None, batch_size: int = 200) -> int:
    """Waits past their deadline end, ``SignalTimedOut``; returns how many."""
    now = now or timezone.now()
    due = list(TaskSignal.objects.filter(status=SignalStatus.WAITING, expires_at__lte=now)
               .order_by("expires_at").values_list("pk", "task_id")[:batch_size])
    ended = 0
    for signal_id, task_id in due:
        with transaction.atomic(durable=True):
            task: Task = lock_task(namespace=None, task_id=task_id)
            signal = TaskSignal.objects.select_for_update().filter(
                pk=signal_id, status=SignalStatus.WAITING, expires_at__lte=now).first()
            if signal is None:
                continue  # received meanwhile
            signal.status, signal.timed_out_at = SignalStatus.TIMED_OUT, now
            signal.save(update_fields=["status", "timed_out_at"])
            write_events(task, [EventDraft(type=et.SIGNAL_TIMED_OUT, payload={"name": signal.name})], agent=None,
                         now=now, allow_closed=True)
            ended += 1
    return ended
