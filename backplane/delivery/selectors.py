"""Reads of delivery: dead letters and the outbox's health."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.db.models import Count, Min, Q
from django.utils import timezone

from backplane.delivery.models import DeadLetter, DeadLetterStatus, OutboxMessage, OutboxStatus


@dataclass(frozen=True)
class DeadLetterPage:
    items: list[DeadLetter]
    next_cursor: int | None


def dead_letter_list(*, status: str | None, limit: int, after_id: int) -> DeadLetterPage:
    items = DeadLetter.objects.filter(pk__gt=after_id).order_by("pk")
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
    failing: int
    dead: int
    dead_letters_pending: int


def outbox_stats(*, now: datetime | None = None) -> OutboxStats:
    """Lag is the age of the oldest message that is due and still undelivered (0 when none)."""
    now = now or timezone.now()
    pending = OutboxMessage.objects.filter(status=OutboxStatus.PENDING)
    aggregates = pending.aggregate(
        oldest_due=Min("created_at", filter=Q(next_attempt_at__lte=now)),
        pending=Count("id"),
        failing=Count("id", filter=Q(attempts__gt=0)),
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
    )
