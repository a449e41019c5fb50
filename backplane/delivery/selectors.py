"""Reads of delivery: dead letters and the outbox's health."""

from __future__ import annotations

import base64
import binascii
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypedDict

from django.conf import settings
from django.db import connection
from django.db.models import Count, F, IntegerField, Min, Q, QuerySet
from django.db.models.expressions import RawSQL
from django.utils import timezone

from backplane.delivery.models import DeadLetter, DeadLetterStatus, OutboxMessage, OutboxStatus


class WaitingBehind(TypedDict):
    waiting_behind: int


class QueueAnnotations(WaitingBehind):
    task_kind: str | None  # None: the dead letter has no task
    task_status: str | None


if TYPE_CHECKING:
    from django_stubs_ext import WithAnnotations  # a development requirement (make lint)

    # A dead letter read with how many messages wait behind it (``with_waiting_behind``).
    WithWaitingBehind = WithAnnotations[DeadLetter, WaitingBehind]
    # A dead letter as the review queue reads it (``_queue_rows``).
    QueueRow = WithAnnotations[DeadLetter, QueueAnnotations]

# How many messages wait behind a dead letter: the undelivered messages of its outbox message's
# key, key scope and destination queued after it, while that message holds its key (strict ordering, not
# decided yet); 0 for every other dead letter. A correlated subquery on the outer row, so a page
# of dead letters still reads in one query (the key-order index answers it).
_WAITING_BEHIND_SQL = """
SELECT count(*) FROM backplane_outboxmessage held
JOIN backplane_outboxmessage waiting
  ON waiting.key = held.key AND waiting.key_scope = held.key_scope AND waiting.destination = held.destination
 AND waiting.subscription_id IS NOT DISTINCT FROM held.subscription_id
 AND waiting.id > held.id AND waiting.status = 'pending'
WHERE held.id = backplane_deadletter.outbox_message_id AND held.holds_key
"""


def _waiting_behind() -> RawSQL:
    return RawSQL(_WAITING_BEHIND_SQL, [], output_field=IntegerField())


def with_waiting_behind(items: QuerySet[DeadLetter]) -> QuerySet[WithWaitingBehind]:
    """Annotate ``waiting_behind`` (see ``_WAITING_BEHIND_SQL``)."""
    return items.annotate(waiting_behind=_waiting_behind())


def dead_letter_waiting_behind(dead_letter_id: int) -> int:
    row = with_waiting_behind(DeadLetter.objects.filter(pk=dead_letter_id)).values_list("waiting_behind", flat=True)
    return next(iter(row), 0)


@dataclass(frozen=True)
class DeadLetterPage:
    items: list[WithWaitingBehind]
    next_cursor: int | None


def dead_letter_list(*, status: str | None, limit: int, after_id: int) -> DeadLetterPage:
    items = with_waiting_behind(DeadLetter.objects.filter(pk__gt=after_id)).order_by("pk")
    if status:
        items = items.filter(status=status)
    page = list(items[: limit + 1])
    more = len(page) > limit
    page = page[:limit]
    return DeadLetterPage(items=page, next_cursor=page[-1].pk if more and page else None)


@dataclass(frozen=True)
class OutboxStats:
    """What the dashboard and /metrics show about delivery."""

    lag_seconds: float
    pending: int
    delivered: int
    failing: int  # pending, and failed at least once
    dead: int
    dead_letters_pending: int
    in_flight: int = 0  # pending, under a relay's live claim
    held: int = 0  # dead letters holding their key (strict ordering, not decided yet)


def outbox_stats(*, now: datetime | None = None) -> OutboxStats:
    """Lag is the age of the oldest message that is due and still undelivered (0 when none)."""
    now = now or timezone.now()
    pending = OutboxMessage.objects.filter(status=OutboxStatus.PENDING)
    aggregates = pending.aggregate(
        oldest_due=Min("created_at", filter=Q(next_attempt_at__lte=now)),
        pending=Count("id"),
        # Attempts are counted when a row is claimed, so a first delivery under way has one too:
        # failing is what has a recorded failure.
        failing=Count("id", filter=~Q(last_error="")),
        in_flight=Count("id", filter=Q(claimed_until__gt=now)),
    )
    by_status = dict(
        OutboxMessage.objects.exclude(status=OutboxStatus.PENDING)
        .values_list("status")
        .annotate(n=Count("id"))
        .values_list("status", "n")
    )
    oldest = aggregates["oldest_due"]
    return OutboxStats(
        lag_seconds=max(0.0, (now - oldest).total_seconds()) if oldest else 0.0,
        pending=aggregates["pending"],
        delivered=by_status.get(OutboxStatus.DELIVERED, 0),
        failing=aggregates["failing"],
        dead=by_status.get(OutboxStatus.DEAD, 0),
        dead_letters_pending=DeadLetter.objects.filter(status=DeadLetterStatus.PENDING).count(),
        in_flight=aggregates["in_flight"],
        held=OutboxMessage.objects.filter(holds_key=True).count(),
    )


# --- the review queue (the dashboard's dead-letter pages) ---------------------------------------
#
# Pending dead letters come first, oldest first (the ``status, created_at`` index); decided ones
# follow, newest first (the primary key, read backwards). A page reads at most two queries and
# never counts or offsets through the table; the cursor says which of the two parts it is in.


@dataclass(frozen=True)
class DeadLetterFilters:
    status: str = ""  # "", a DeadLetterStatus, or "decided" (requeued or discarded)
    source: str = ""
    topic: str = ""  # contained in the topic
    kind: str = ""  # the task's kind
    error: str = ""  # contained in the error, any case
    created_after: datetime | None = None
    created_before: datetime | None = None

    def wants(self, status: str) -> bool:
        if not self.status:
            return True
        if self.status == "decided":
            return status != DeadLetterStatus.PENDING
        return self.status == status


QUEUE_FIELDS = ("id", "source", "reference", "task_id", "outbox_message_id", "topic", "error", "attempts", "status",
                "created_at", "decided_by", "decided_at", "reason")


def dead_letters_filtered(filters: DeadLetterFilters) -> QuerySet[DeadLetter]:
    """Every filter but the status, which the queue applies per part."""
    items = DeadLetter.objects.all()
    if filters.source:
        items = items.filter(source=filters.source)
    if filters.topic:
        items = items.filter(topic__contains=filters.topic)
    if filters.kind:
        items = items.filter(task__kind=filters.kind)
    if filters.error:
        items = items.filter(error__icontains=filters.error)
    if filters.created_after is not None:
        items = items.filter(created_at__gte=filters.created_after)
    if filters.created_before is not None:
        items = items.filter(created_at__lt=filters.created_before)
    return items


def _queue_rows(items: QuerySet[DeadLetter]) -> QuerySet[QueueRow]:
    # The task's kind and status come in the same query (a LEFT JOIN: not every dead letter has a
    # task), and so does how many messages wait behind each one.
    return items.only(*QUEUE_FIELDS).annotate(
        task_kind=F("task__kind"), task_status=F("task__status"), waiting_behind=_waiting_behind()
    )


def _decided(items: QuerySet[DeadLetter], filters: DeadLetterFilters) -> QuerySet[DeadLetter]:
    if filters.status in (DeadLetterStatus.REQUEUED, DeadLetterStatus.DISCARDED):
        return items.filter(status=filters.status)
    return items.exclude(status=DeadLetterStatus.PENDING)


class BadDeadLetterCursor(ValueError):
    pass


PENDING_PART, DECIDED_PART = "p", "d"


def _encode_queue_cursor(item: DeadLetter) -> str:
    if item.status == DeadLetterStatus.PENDING:
        raw = f"{PENDING_PART}|{item.created_at.isoformat()}|{item.pk}"
    else:
        raw = f"{DECIDED_PART}||{item.pk}"
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


# A cursor this module writes is under 80 characters; anything much longer is not one, and is
# refused before it is decoded.
_QUEUE_CURSOR_MAX_LENGTH = 200


def _cursor_pk(text: str) -> int:
    """A dead letter's id as a cursor names it: ASCII digits, within a bigint."""
    if not (text.isascii() and text.isdigit()) or int(text) >= 2**63:
        raise ValueError("not an id")
    return int(text)


def _decode_queue_cursor(cursor: str) -> tuple[str, datetime | None, int]:
    try:
        if len(cursor) > _QUEUE_CURSOR_MAX_LENGTH:
            raise ValueError("too long")
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        part, created, pk = raw.split("|")
        if part == PENDING_PART:
            at = datetime.fromisoformat(created)
            if at.tzinfo is None:
                raise ValueError("naive time")
            return part, at, _cursor_pk(pk)
        if part == DECIDED_PART:
            return part, None, _cursor_pk(pk)
        raise ValueError("unknown part")
    except (ValueError, binascii.Error, UnicodeDecodeError) as exc:
        raise BadDeadLetterCursor("not a cursor of the dead-letter queue") from exc


@dataclass(frozen=True)
class DeadLetterQueuePage:
    items: list[QueueRow]
    next_cursor: str | None
    cursor: str | None


def dead_letter_queue_page(filters: DeadLetterFilters, *, cursor: str | None = None,
                           limit: int = 50) -> DeadLetterQueuePage:
    """One page of the review queue: pending oldest first, then decided newest first. Two
    queries at most (the pending part runs out in the middle of a page)."""
    part, created_at, after_pk = _decode_queue_cursor(cursor) if cursor else (PENDING_PART, None, 0)
    base = dead_letters_filtered(filters)
    rows: list[QueueRow] = []
    if part == PENDING_PART and filters.wants(DeadLetterStatus.PENDING):
        pending = base.filter(status=DeadLetterStatus.PENDING).order_by("created_at", "id")
        if created_at is not None:
            # A row comparison, so the (status, created_at) index starts right after the cursor.
            pending = pending.extra(where=["(backplane_deadletter.created_at, backplane_deadletter.id) > (%s, %s)"],
                                    params=[created_at, after_pk])
        rows = list(_queue_rows(pending)[: limit + 1])
        if len(rows) > limit:
            return DeadLetterQueuePage(rows[:limit], _encode_queue_cursor(rows[limit - 1]), cursor)
    if filters.status != DeadLetterStatus.PENDING:
        decided = _decided(base, filters).order_by("-id")
        if part == DECIDED_PART:
            decided = decided.filter(pk__lt=after_pk)
        room = limit - len(rows)
        more = list(_queue_rows(decided)[: room + 1])
        rows += more[:room]
        if len(more) > room:
            return DeadLetterQueuePage(rows, _encode_queue_cursor(rows[-1]), cursor)
    return DeadLetterQueuePage(rows, None, cursor)


def dead_letter_for_review(dead_letter_id: int) -> WithWaitingBehind | None:
    """One dead letter with its task, its outbox message and that message's webhook, and how many
    messages wait behind it (one query)."""
    return (
        with_waiting_behind(DeadLetter.objects.select_related("task", "outbox_message__subscription"))
        .defer("task__output", "outbox_message__headers", "outbox_message__subscription__secret")
        .filter(pk=dead_letter_id)
        .first()
    )


@dataclass(frozen=True)
class TaskLogEntry:
    seq: int
    type: str
    agent: str | None
    recorded_at: datetime
    payload: dict[str, Any]


TASK_LOG_ENTRIES_SHOWN = 50


def dead_letter_task_log(dead_letter: DeadLetter, *, types: Sequence[str],
                         limit: int = TASK_LOG_ENTRIES_SHOWN) -> list[TaskLogEntry]:
    """The latest events of the given ``types`` in the log of the dead letter's task, oldest
    first: how its attempts ended (stalls, failures) and earlier decisions. One query through
    the dead letter's own foreign key, so delivery names no model of the event log."""
    if dead_letter.task_id is None:
        return []
    rows = (
        DeadLetter.objects.filter(pk=dead_letter.pk, task__events__type__in=list(types))
        .order_by("-task__events__seq")
        .values_list("task__events__seq", "task__events__type", "task__events__agent",
                     "task__events__recorded_at", "task__events__payload")[:limit]
    )
    return [TaskLogEntry(*row) for row in reversed(rows)]


@dataclass(frozen=True)
class SlotState:
    """The CDC relay's replication slot (backplane/delivery/cdc.py), as pg_replication_slots has it."""

    exists: bool
    active: bool = False
    wal_status: str = ""  # PostgreSQL's: reserved, extended, unreserved, lost
    lag_bytes: int = 0  # WAL the slot holds back: from its confirmed position to the server's


def slot_state() -> SlotState:
    """The slot named ``BACKPLANE_CDC_SLOT``; ``exists=False`` when there is none."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT active, coalesce(wal_status, ''), "
            "coalesce(pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn), 0)::bigint "
            "FROM pg_replication_slots WHERE slot_name = %s", [settings.BACKPLANE_CDC_SLOT])
        row = cursor.fetchone()
    if row is None:
        return SlotState(exists=False)
    return SlotState(exists=True, active=row[0], wal_status=row[1], lag_bytes=row[2])
