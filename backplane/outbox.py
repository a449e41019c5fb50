"""The transactional outbox: messages written with the change that causes them, then
relayed at least once, in order per key, with retries that end in a dead letter.

Writing (``outbox_enqueue``) happens inside the caller's transaction. Relaying is a loop
of small steps (``outbox_relay_once``), each one transaction: claim due rows with
``FOR UPDATE SKIP LOCKED``, publish them, record what happened. The row locks are held
while publishing, so a second relay skips those rows instead of delivering them again;
a relay killed mid-batch leaves its rows pending and they are delivered again later
(at least once; consumers drop duplicates by ``message_id``).
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

from backplane.chain import format_timestamp
from backplane.models import (
    DeadLetter,
    DeadLetterSource,
    OutboxDestination,
    OutboxMessage,
    OutboxStatus,
    Task,
    WebhookSubscription,
)

logger = logging.getLogger(__name__)

LIFECYCLE_TOPIC = "backplane.tasks.{kind}"


def topic_matches(pattern: str, topic: str) -> bool:
    """AMQP topic matching: '.'-separated words, '*' is one word, '#' zero or more."""
    words, parts = topic.split("."), pattern.split(".")

    def match(i: int, j: int) -> bool:
        if j == len(parts):
            return i == len(words)
        if parts[j] == "#":
            return any(match(k, j + 1) for k in range(i, len(words) + 1))
        return i < len(words) and parts[j] in ("*", words[i]) and match(i + 1, j + 1)

    return match(0, 0)


# --- writing -------------------------------------------------------------------------------


def outbox_enqueue(
    *,
    topic: str,
    key: str,
    payload: dict[str, Any],
    headers: dict[str, Any],
    now: datetime,
    task: Task | None = None,
    event_position: int | None = None,
) -> list[OutboxMessage]:
    """Write one message for the broker plus one per matching webhook subscription.

    Must run inside the transaction of the change it announces: that is the whole point.
    """
    rows = [
        OutboxMessage(
            destination=OutboxDestination.BROKER,
            topic=topic,
            key=key,
            payload=payload,
            headers=headers,
            task=task,
            event_position=event_position,
            next_attempt_at=now,
            created_at=now,
        )
    ]
    for subscription in WebhookSubscription.objects.filter(is_active=True):
        if topic_matches(subscription.topic_pattern, topic):
            rows.append(
                OutboxMessage(
                    destination=OutboxDestination.WEBHOOK,
                    subscription=subscription,
                    topic=topic,
                    key=key,
                    payload=payload,
                    headers=headers,
                    task=task,
                    event_position=event_position,
                    next_attempt_at=now,
                    created_at=now,
                )
            )
    OutboxMessage.objects.bulk_create(rows)
    return rows


def enqueue_lifecycle(*, task: Task, previous_status: str | None, seq: int, event_hash: str, now: datetime) -> None:
    """Announce that a task became pending, completed, failed or dead-lettered."""
    if task.status == previous_status or task.status not in LIFECYCLE_STATUSES:
        return
    outbox_enqueue(
        topic=LIFECYCLE_TOPIC.format(kind=task.kind),
        key=str(task.pk),
        payload={
            "task_id": str(task.pk),
            "namespace": task.namespace,
            "kind": task.kind,
            "status": task.status,
            "previous_status": previous_status,
            "attempts": task.attempts,
            "output": task.output,
            "error": task.error,
        },
        headers={"task_id": str(task.pk), "seq": seq, "event_hash": event_hash, "created_at": format_timestamp(now)},
        now=now,
        task=task,
    )


LIFECYCLE_STATUSES = frozenset({"pending", "completed", "failed", "dead_lettered"})


# --- relaying ------------------------------------------------------------------------------


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

# Due, and no earlier message for the same key and destination still waiting: per-key order.
_CLAIM_SQL = """
SELECT m.id FROM backplane_outboxmessage m
WHERE m.status = 'pending' AND m.next_attempt_at <= %s
  AND NOT EXISTS (
      SELECT 1 FROM backplane_outboxmessage earlier
      WHERE earlier.status = 'pending' AND earlier.key = m.key AND earlier.destination = m.destination
        AND earlier.subscription_id IS NOT DISTINCT FROM m.subscription_id AND earlier.id < m.id
  )
ORDER BY m.id
LIMIT %s
FOR UPDATE SKIP LOCKED
"""


@dataclass(frozen=True)
class RelayStep:
    claimed: int
    delivered: int
    failed: int
    dead: int


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
        with connection.cursor() as cursor:
            cursor.execute(_CLAIM_SQL, [now, batch_size])
            ids = [row[0] for row in cursor.fetchall()]
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
    if message.attempts >= settings.BACKPLANE_OUTBOX_MAX_ATTEMPTS:
        message.status = OutboxStatus.DEAD
        message.save(update_fields=["attempts", "last_error", "status"])
        DeadLetter.objects.create(
            source=DeadLetterSource.OUTBOX,
            reference=str(message.message_id),
            task=message.task,
            outbox_message=message,
            topic=message.topic,
            payload=message.payload,
            error=message.last_error,
            attempts=message.attempts,
            created_at=now,
        )
        logger.warning("outbox message %s dead after %d attempts: %s", message.message_id, message.attempts, error)
        return True
    # From the moment of failure, not the batch's start: a slow failure (a connect timeout)
    # must not eat the backoff.
    message.next_attempt_at = timezone.now() + timedelta(seconds=backoff_seconds(message.attempts))
    message.save(update_fields=["attempts", "last_error", "next_attempt_at"])
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
