"""Waiting for the outside world: a task waits durably for a named signal (docs/approvals.md,
"Signals").

An agent declares the wait (``signal_await``: ``SignalAwaited`` with its deadline); a person, a
webhook or another agent of the namespace sends the signal (``signal_send``: ``SignalReceived``
with its payload and sender); the ``expire-approvals`` duty ends a wait whose time ran out
(``signals_expire``: ``SignalTimedOut``). Each is one transaction under the task's row lock, and
the signal's row (one per task and name) says where it stands, so a signal sent before the wait
is found by it, a repeat of either side is answered from the row, and a crashed agent that
claims the task again waits for the same signal. The stall detector leaves a waiting task alone,
as it does a task waiting for an approval, and a task its holder gave back while it waits is not
handed out again until the wait ends (recovery/leases.py).

Whoever should send the signal needs no account: the wait's answer carries a callback token
(``signal_callback_token``), signed with the server's secret key, that sends this one signal to
this one task and nothing else — what a long-running job or a webhook of another system is given.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from django.core import signing
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
_CALLBACK_SALT = "backplane.signals.callback"
# Each signal is a row and an event or two: a task has at most this many names, so an agent (or a
# sender) cannot grow one task's signals beyond what any real wait needs.
SIGNALS_PER_TASK_MAX = 100


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
            _check_room(task)
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
            _check_room(task)
            signal = TaskSignal(task=task, name=name)
        signal.status, signal.payload, signal.sent_by, signal.received_at = (
            SignalStatus.RECEIVED, payload, sent_by, now)
        signal.save()
        write_events(task, [EventDraft(type=et.SIGNAL_RECEIVED, payload={
            "name": name, "payload": payload, "sent_by": sent_by})], agent=None, now=now)
    return signal, True


def _check_room(task: Task) -> None:
    """Under the task's row lock, so two new names at once cannot both take the last place."""
    if TaskSignal.objects.filter(task=task).count() >= SIGNALS_PER_TASK_MAX:
        raise InvalidInput(f"a task has at most {SIGNALS_PER_TASK_MAX} signals",
                           {"name": f"this task has {SIGNALS_PER_TASK_MAX} signals already"})


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


def signal_callback_token(signal: TaskSignal) -> str:
    """The token that sends ``signal`` (this name, to this task) and nothing else. It names no
    namespace and holds no secret of its own: Django's signing (HMAC with SECRET_KEY) makes it
    unforgeable, and the signal's row makes it good for one payload — a repeat is answered as
    received, another payload or a wait that ran out is refused."""
    return signing.dumps([str(signal.task_id), signal.name], salt=_CALLBACK_SALT)


def signal_callback_target(token: str) -> tuple[uuid.UUID, str]:
    """The task and the signal name a callback token sends; ``404`` for a token that is not one of
    ours (nothing says why)."""
    try:
        task_text, name = signing.loads(token, salt=_CALLBACK_SALT)
        return uuid.UUID(task_text), _checked_name(name)
    except (signing.BadSignature, ValueError, TypeError, InvalidInput):
        raise NotFound("no such signal callback", {}) from None


def signal_send_by_callback(*, task_id: uuid.UUID, name: str, payload: dict[str, Any]) -> tuple[TaskSignal, bool]:
    """``signal_send`` for the holder of the callback token of ``signal_callback_target``, sent by
    ``callback:<the agent that waited>``. Only a signal that was waited for has a token."""
    awaited_by = TaskSignal.objects.filter(task_id=task_id, name=name, awaited_at__isnull=False).values_list(
        "awaited_by", flat=True).first()
    if awaited_by is None:
        raise NotFound("no such signal callback", {})
    return signal_send(namespace=None, task_id=task_id, name=name, payload=payload,
                       sent_by=f"callback:{awaited_by}" if awaited_by else "callback")
