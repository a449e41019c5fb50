"""The relay: claims due outbox rows, publishes them through the sinks, records what happened.

Each step is one transaction: claim due rows with ``FOR UPDATE SKIP LOCKED``, publish them,
record the outcome. The row locks are held while publishing, so a second relay skips those
rows instead of delivering them again; a relay killed mid-batch leaves its rows pending and
they are delivered again later (at least once; consumers drop duplicates by ``message_id``).
A message that keeps failing backs off exponentially, then becomes a dead letter.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from backplane.delivery.announcements import announce_dead_letters
from backplane.delivery.models import DeadLetter, DeadLetterSource, OutboxMessage, OutboxStatus

logger = logging.getLogger(__name__)


def envelope(message: OutboxMessage) -> dict[str, Any]:
    """What every sink delivers: stable id, topic, key, payload, headers with the attempt number."""
    return {
        "message_id": str(message.message_id),
        "topic": message.topic,
        "key": message.key,
        "payload": message.payload,
        "headers": {**message.headers, "attempt": message.attempts + 1},
    }


class PublishError(Exception):
    """A sink could not deliver a message; the relay retries it later."""


Publisher = Callable[[OutboxMessage, dict[str, Any]], None]

# Claimable: due, and no earlier message for the same key and destination still waiting
# (per-key order). Checking that for every pending row costs in proportion to the backlog:
# with fewer keys than the batch size the LIMIT is never reached and each claim probed every
# pending row (43-80 ms for 5,000 rows on 50 keys). So the check runs over a window, the
# oldest due rows, which finds the keys' heads in the usual interleaved backlog for a bounded
# cost. When the window holds nothing claimable (its rows all wait behind a head that is
# backing off, or other relays hold them), the second statement looks at the head of every
# key, so a stuck key never starves the others. ``m.next_attempt_at`` is checked on the
# locked row too: a concurrent relay may just have backed it off.
_CLAIM_WINDOW_SQL = """
WITH candidates AS MATERIALIZED (
    SELECT id, key, destination, subscription_id FROM backplane_outboxmessage
    WHERE status = 'pending' AND next_attempt_at <= %(now)s
    ORDER BY next_attempt_at, id
    LIMIT %(window)s
)
SELECT m.id FROM backplane_outboxmessage m JOIN candidates c ON c.id = m.id
WHERE m.status = 'pending' AND m.next_attempt_at <= %(now)s
  AND NOT EXISTS (
      SELECT 1 FROM backplane_outboxmessage earlier
      WHERE earlier.status = 'pending' AND earlier.key = c.key AND earlier.destination = c.destination
        AND earlier.subscription_id IS NOT DISTINCT FROM c.subscription_id AND earlier.id < c.id
  )
ORDER BY m.id
LIMIT %(limit)s
FOR UPDATE OF m SKIP LOCKED
"""
_CLAIM_KEY_HEADS_SQL = """
SELECT m.id FROM backplane_outboxmessage m
WHERE m.id IN (
      SELECT DISTINCT ON (key, destination, subscription_id) id FROM backplane_outboxmessage
      WHERE status = 'pending'
      ORDER BY key, destination, subscription_id, id
  )
  AND m.status = 'pending' AND m.next_attempt_at <= %(now)s
ORDER BY m.id
LIMIT %(limit)s
FOR UPDATE OF m SKIP LOCKED
"""


def _claim_due(*, now: datetime, batch_size: int) -> list[int]:
    params = {"now": now, "limit": batch_size, "window": batch_size * 2}
    with connection.cursor() as cursor:
        cursor.execute(_CLAIM_WINDOW_SQL, params)
        ids = [row[0] for row in cursor.fetchall()]
        if not ids:
            cursor.execute(_CLAIM_KEY_HEADS_SQL, params)
            ids = [row[0] for row in cursor.fetchall()]
    return ids


@dataclass(frozen=True)
class RelayStep:
    claimed: int
    delivered: int
    failed: int
    dead: int


# Failed attempts kept per message (and copied to its dead letter) for the people who review it.
FAILURES_KEPT = 10


def backoff_seconds(attempts: int) -> float:
    """Exponential with full jitter: spreads retries of many rows that failed together."""
    base = settings.BACKPLANE_OUTBOX_BACKOFF_BASE_SECONDS
    ceiling = min(settings.BACKPLANE_OUTBOX_BACKOFF_MAX_SECONDS, base * 2 ** (attempts - 1))
    return random.uniform(ceiling / 2, ceiling)


def outbox_relay_once(*, publish: Publisher, batch_size: int = 100) -> RelayStep:
    """Claim one batch of due messages, publish each, record the outcome. One transaction."""
    delivered = failed = dead = 0
    with transaction.atomic(durable=True):
        now = timezone.now()
        ids = _claim_due(now=now, batch_size=batch_size)
        if not ids:
            return RelayStep(0, 0, 0, 0)
        messages = list(OutboxMessage.objects.filter(pk__in=ids).select_related("subscription").order_by("id"))
        delivered_ids: list[int] = []
        blocked_keys: set[tuple[str, str, int | None]] = set()
        for message in messages:
            ordering_key = (message.key, message.destination, message.subscription_id)
            if ordering_key in blocked_keys:
                # An earlier message of this key failed in this batch: later ones wait for it.
                continue
            try:
                publish(message, envelope(message))
            except PublishError as exc:
                blocked_keys.add(ordering_key)
                if _record_failure(message, str(exc), now=now):
                    dead += 1
                else:
                    failed += 1
                continue
            delivered_ids.append(message.pk)
        if delivered_ids:
            OutboxMessage.objects.filter(pk__in=delivered_ids).update(
                status=OutboxStatus.DELIVERED, delivered_at=timezone.now(), last_error=""
            )
            delivered = len(delivered_ids)
    return RelayStep(len(ids), delivered, failed, dead)


def _record_failure(message: OutboxMessage, error: str, *, now: datetime) -> bool:
    """Back off, or after the last attempt turn the row into a dead letter. True when dead."""
    message.attempts += 1
    message.last_error = error[:2000]
    failure = {"attempt": message.attempts, "at": now.isoformat(), "error": error[:500]}
    message.failures = [*(message.failures or []), failure][-FAILURES_KEPT:]
    if message.attempts >= settings.BACKPLANE_OUTBOX_MAX_ATTEMPTS:
        message.status = OutboxStatus.DEAD
        message.save(update_fields=["attempts", "last_error", "status", "failures"])
        DeadLetter.objects.create(
            source=DeadLetterSource.OUTBOX,
            reference=str(message.message_id),
            task=message.task,
            outbox_message=message,
            topic=message.topic,
            payload=message.payload,
            error=message.last_error,
            attempts=message.attempts,
            history=message.failures,
            created_at=now,
        )
        announce_dead_letters()
        logger.warning("outbox message %s dead after %d attempts: %s", message.message_id, message.attempts, error)
        return True
    # From the moment of failure, not the batch's start: a slow failure (a connect timeout)
    # must not eat the backoff.
    message.next_attempt_at = timezone.now() + timedelta(seconds=backoff_seconds(message.attempts))
    message.save(update_fields=["attempts", "last_error", "next_attempt_at", "failures"])
    return False


def outbox_relay_until_idle(*, publish: Publisher, budget_seconds: float, batch_size: int = 100) -> RelayStep:
    """Relay batches until nothing is due or the time budget is spent (the beat task's loop)."""
    deadline = time.monotonic() + budget_seconds
    totals = [0, 0, 0, 0]
    while True:
        step = outbox_relay_once(publish=publish, batch_size=batch_size)
        totals = [a + b for a, b in zip(totals, (step.claimed, step.delivered, step.failed, step.dead), strict=True)]
        if step.claimed == 0 or step.delivered == 0 or time.monotonic() >= deadline:
            return RelayStep(*totals)


def outbox_prune_delivered(*, older_than: timedelta | None = None, batch_size: int = 5000) -> int:
    """Delete one batch of delivered rows past the retention; 0 when nothing is left to prune."""
    cutoff = timezone.now() - (older_than or timedelta(seconds=settings.BACKPLANE_OUTBOX_RETENTION_SECONDS))
    with transaction.atomic(durable=True):
        ids = list(
            OutboxMessage.objects.filter(status=OutboxStatus.DELIVERED, delivered_at__lt=cutoff)
            .order_by("delivered_at")
            .values_list("pk", flat=True)[:batch_size]
        )
        if not ids:
            return 0
        deleted, _ = OutboxMessage.objects.filter(pk__in=ids).delete()
    return deleted
