"""Reads of the outbox page: the pending backlog per destination, what is failing now, the
last hour's delivery lag, and in the CDC mode the replication slot Debezium reads."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.utils import timezone

from backplane.delivery.cdc import cdc_problem
from backplane.delivery.models import OutboxMessage
from backplane.delivery.outbox import cdc_enabled
from backplane.delivery.selectors import SlotState, slot_state
from backplane.eventlog.chain import format_timestamp
from backplane.runtime.replica import reads_connection
from dashboard.selectors.minutes import buckets, window_to_this_minute


@dataclass(frozen=True)
class DestinationBacklog:
    destination: str  # "broker", or the webhook subscription's name
    waiting: int  # never tried yet
    retrying: int  # failed at least once, due again later
    oldest_at: datetime | None


@dataclass(frozen=True)
class OutboxHealth:
    now: datetime
    backlog: list[DestinationBacklog]
    dead: int
    delivered_last_hour: int
    failing: list[Any]  # the pending messages that failed most recently

    @property
    def waiting(self) -> int:
        return sum(row.waiting for row in self.backlog)

    @property
    def retrying(self) -> int:
        return sum(row.retrying for row in self.backlog)

    @property
    def oldest_at(self) -> datetime | None:
        return min((row.oldest_at for row in self.backlog if row.oldest_at), default=None)


def outbox_health(*, now: datetime | None = None, failing_limit: int = 20) -> OutboxHealth:
    """The outbox page's figures: the pending backlog per destination, dead and delivered
    counts, and the messages that are failing now. Three queries."""
    now = now or timezone.now()
    with reads_connection().cursor() as cursor:
        cursor.execute(
            """
            SELECT coalesce(s.name, m.destination),
                   count(*) FILTER (WHERE m.last_error = ''), count(*) FILTER (WHERE m.last_error <> ''),
                   min(m.created_at)
              FROM backplane_outboxmessage m LEFT JOIN backplane_webhooksubscription s ON s.id = m.subscription_id
             WHERE m.status = 'pending'
             GROUP BY 1 ORDER BY 1
            """
        )
        backlog = [DestinationBacklog(*row) for row in cursor.fetchall()]
        cursor.execute(
            """
            SELECT (SELECT count(*) FROM backplane_outboxmessage WHERE status = 'dead'),
                   (SELECT count(*) FROM backplane_outboxmessage WHERE status = 'delivered' AND delivered_at >= %s)
            """,
            [now - timedelta(hours=1)],
        )
        dead, delivered = cursor.fetchone()
    # Attempts are counted when the relay claims a row, so a first delivery under way has one:
    # failing is what has a recorded failure.
    failing = list(
        OutboxMessage.objects.filter(status="pending").exclude(last_error="")
        .select_related("subscription")
        .only("id", "message_id", "topic", "destination", "subscription__name", "attempts", "last_error",
              "next_attempt_at", "created_at", "task_id")
        .order_by("-attempts", "next_attempt_at")[:failing_limit]
    )
    return OutboxHealth(now=now, backlog=backlog, dead=dead, delivered_last_hour=delivered, failing=failing)


def delivery_lag_per_minute(*, now: datetime | None = None) -> dict[str, Any]:
    """The last hour's delivery lag (from enqueue to delivery) per minute: mean and max seconds,
    and how many were delivered, for every minute (zeros included)."""
    now = now or timezone.now()
    start, end = window_to_this_minute(now, hours=1)
    with reads_connection().cursor() as cursor:
        cursor.execute(
            """
            SELECT date_trunc('minute', delivered_at),
                   avg(extract(epoch FROM delivered_at - created_at)),
                   max(extract(epoch FROM delivered_at - created_at)),
                   count(*)
              FROM backplane_outboxmessage
             WHERE status = 'delivered' AND delivered_at >= %s AND delivered_at < %s
             GROUP BY 1
            """,
            [start, end],
        )
        rows = {row[0]: row[1:] for row in cursor.fetchall()}
    minutes, mean, peak, delivered = [], [], [], []
    for at in buckets(start, end, timedelta(minutes=1)):
        minutes.append(format_timestamp(at))
        avg_s, max_s, n = rows.get(at, (None, None, 0))
        mean.append(None if avg_s is None else round(float(avg_s), 3))
        peak.append(None if max_s is None else round(float(max_s), 3))
        delivered.append(n)
    return {"minutes": minutes, "mean_seconds": mean, "max_seconds": peak, "delivered": delivered}


@dataclass(frozen=True)
class CdcRelayState:
    slot_name: str
    slot: SlotState
    problem: str | None  # what /readyz says of it, or None


def cdc_relay_state() -> CdcRelayState | None:
    """The CDC relay's replication slot, read on the primary (a replica has slots of its own);
    None in the polling mode."""
    if not cdc_enabled():
        return None
    state = slot_state()
    return CdcRelayState(slot_name=settings.BACKPLANE_CDC_SLOT, slot=state, problem=cdc_problem(state))
