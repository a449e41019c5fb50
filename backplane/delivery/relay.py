"""The relay: claims due outbox rows, delivers them with no transaction open, records the outcome.

Delivery is three short steps per destination (healthchecks' ``sendalerts`` sends its alerts
with no transaction open the same way):

1. **claim** — one short transaction, committed at once: the destination's due rows that head
   their key get a lease (``claimed_until``) and a fresh ``claim_token``; ``attempts`` is counted
   here, so an attempt a relay never finished (it died) still counts, and the next delivery's
   ``attempt`` header says so.
2. **deliver** — no transaction open, no row locked: publish to the broker or POST the webhook,
   each within its destination's deadline.
3. **record** — one short transaction per outcome: delivered, or the next attempt scheduled with
   backoff, or a dead letter. Every write is conditional on the claim token: a relay whose lease
   ran out (and whose rows another relay claimed since) changes nothing.

A relay killed between 1 and 3 leaves its claims behind; once they expire another relay claims
the rows again, so delivery is at least once (consumers drop repeats by ``message_id``).

Per-key order: a row can be claimed only while no earlier row of its key, key scope and
destination is undelivered (a claimed row is still pending) or dead-lettered under strict
ordering (``holds_key``, until a reviewer decides). The scope is the namespace of an agent's
message, or the backplane's own (outbox.py): an agent's key never holds another namespace's
messages, nor the backplane's. See docs/delivery.md.

``outbox_relay_once`` runs the three steps in the calling thread for every destination in turn
(tests, benchmarks); the worker and ``manage.py relay`` run them per destination in threads of
their own (``backplane.delivery.lanes``).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Protocol

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Exists, F, OuterRef, Q, prefetch_related_objects
from django.utils import timezone

from backplane.delivery.announcements import announce_dead_letters
from backplane.delivery.models import DeadLetter, DeadLetterSource, OutboxMessage, OutboxStatus, WebhookSubscription
from backplane.delivery.outbox import cdc_enabled
from backplane.delivery.policy import BROKER_LANE, Lane, LanePolicy, broker_policy, webhook_policy
from backplane.telemetry import counters
from backplane.telemetry.tracing import publish_span

logger = logging.getLogger(__name__)


def envelope(message: OutboxMessage, *, traceparent: str | None = None) -> dict[str, Any]:
    """What every sink delivers: stable id, topic, key, payload, and headers with the attempt
    number (counted when the row was claimed: 1 the first time, more after failures and after
    deliveries a relay never finished) and, while tracing, the publish span's ``traceparent``."""
    headers = {**message.headers, "attempt": max(1, message.attempts)}
    if traceparent:
        headers["traceparent"] = traceparent
    return {
        "message_id": str(message.message_id),
        "topic": message.topic,
        "key": message.key,
        "payload": message.payload,
        "headers": headers,
    }


class PublishError(Exception):
    """A sink could not deliver a message; the relay retries it later.

    ``timed_out``: the destination did not answer within its deadline. The rest of that claim
    is given back untried (each would wait a whole deadline too) and the destination goes on
    trial: one message at a time until it answers again.
    """

    def __init__(self, message: str, *, timed_out: bool = False) -> None:
        super().__init__(message)
        self.timed_out = timed_out


class Acknowledgement(Protocol):
    """A publish its destination has not answered yet. Kafka's producer sends in batches and
    acknowledges later (backplane/delivery/kafka_sink.py); RabbitMQ's confirm and a webhook's
    answer arrive within the publish call, which then returns None."""

    def wait(self, timeout: float) -> None:
        """Return once the destination acknowledged; raise PublishError when it refused, or
        (``timed_out``) when no answer came within ``timeout`` seconds."""


Publisher = Callable[[OutboxMessage, dict[str, Any]], Acknowledgement | None]


# --- 1. claim -------------------------------------------------------------------------------

# Claimable: pending, due, not under another relay's live claim, and no earlier message of the
# same key, key scope and destination still undelivered or holding its key (per-key order). Checking that
# for every due row costs in proportion to the backlog: with fewer keys than the batch size the
# LIMIT is never reached and each claim would read every pending row. So the check runs over a
# window, the destination's oldest due rows, which finds the keys' heads in the usual interleaved
# backlog for a bounded cost. When the window holds nothing claimable (its rows all wait behind
# a head that is backing off, claimed, or held by a dead letter), the second statement looks at
# the head of every key, so a stuck key never starves the others. The window is ordered like
# ``outbox_lane_due_idx`` (``subscription_id`` first: one value here, but ``IS NULL`` does not
# tell the planner so) to be read in index order up to its LIMIT.
# The conditions on ``m`` are checked again on the locked row version (READ COMMITTED
# re-evaluates them after the lock): a concurrent relay may just have claimed or backed it off.
_CLAIMABLE = """m.status = 'pending' AND m.next_attempt_at <= %(now)s
  AND (m.claimed_until IS NULL OR m.claimed_until <= %(now)s)"""
_CLAIM_WINDOW_SQL = """
WITH candidates AS MATERIALIZED (
    SELECT id, key, key_scope, destination FROM backplane_outboxmessage
    WHERE status = 'pending' AND {lane} AND next_attempt_at <= %(now)s
      AND (claimed_until IS NULL OR claimed_until <= %(now)s)
    ORDER BY subscription_id, next_attempt_at, id
    LIMIT %(window)s
)
SELECT m.id FROM backplane_outboxmessage m JOIN candidates c ON c.id = m.id
WHERE {claimable}
  AND NOT EXISTS (
      SELECT 1 FROM backplane_outboxmessage earlier
      WHERE (earlier.status = 'pending' OR earlier.holds_key) AND earlier.key = c.key
        AND earlier.key_scope = c.key_scope AND earlier.destination = c.destination AND {earlier_lane}
        AND earlier.id < c.id
  )
ORDER BY m.id
LIMIT %(limit)s
FOR UPDATE OF m SKIP LOCKED
"""
_CLAIM_KEY_HEADS_SQL = """
SELECT m.id FROM backplane_outboxmessage m
WHERE m.id IN (
      SELECT DISTINCT ON (key, key_scope, destination) id FROM backplane_outboxmessage
      WHERE (status = 'pending' OR holds_key) AND {lane}
      ORDER BY key, key_scope, destination, id
  )
  AND {claimable}
ORDER BY m.id
LIMIT %(limit)s
FOR UPDATE OF m SKIP LOCKED
"""


def _lane_condition(lane: Lane, alias: str = "") -> str:
    prefix = f"{alias}." if alias else ""
    return f"{prefix}subscription_id IS NULL" if lane is BROKER_LANE else f"{prefix}subscription_id = %(lane)s"


# A claim takes the rows one of the statements above finds and returns them as claimed, in one
# statement: what it returns is exactly what it won (the lock and the lease together), and a
# claim under steady load costs one round trip rather than a read, an update and a read back.
# The locking read is a materialized CTE so that it runs once, whatever join the planner picks.
# It returns the model's columns, not ``*``: the row's CDC envelope (migration 0029) is not the
# polling relay's to read.
_CLAIM_SQL = """
WITH won AS MATERIALIZED ({claimable_ids})
UPDATE backplane_outboxmessage claimed
SET claimed_until = %(until)s, claim_token = %(token)s, attempts = claimed.attempts + 1
FROM won WHERE claimed.id = won.id
RETURNING """ + ", ".join(f"claimed.{field.column}" for field in OutboxMessage._meta.concrete_fields) + """
"""


def _claim_rows(*, lane: Lane, now: datetime, limit: int, until: datetime, token: uuid.UUID) -> list[OutboxMessage]:
    params: dict[str, Any] = {"now": now, "limit": limit, "window": limit * 2, "lane": lane, "until": until,
                              "token": token}
    window_sql = _CLAIM_WINDOW_SQL.format(lane=_lane_condition(lane), earlier_lane=_lane_condition(lane, "earlier"),
                                          claimable=_CLAIMABLE)
    messages = list(OutboxMessage.objects.raw(_CLAIM_SQL.format(claimable_ids=window_sql), params))
    if not messages:
        key_heads_sql = _CLAIM_KEY_HEADS_SQL.format(lane=_lane_condition(lane), claimable=_CLAIMABLE)
        messages = list(OutboxMessage.objects.raw(_CLAIM_SQL.format(claimable_ids=key_heads_sql), params))
    return sorted(messages, key=lambda message: message.pk)


@dataclass
class Claim:
    """Rows one relay holds for a while: deliver them, then record each under ``token``."""

    token: uuid.UUID
    until: datetime
    messages: list[OutboxMessage]


def outbox_claim(*, lane: Lane, limit: int, lease_seconds: float) -> Claim | None:
    """Claim up to ``limit`` due heads of their keys for one destination, and commit.

    The claim is its own short transaction: no row stays locked while anything is delivered.
    SKIP LOCKED keeps concurrent claims off each other's rows; the lease keeps later claims off
    them until it runs out."""
    now = timezone.now()
    token = uuid.uuid4()
    until = now + timedelta(seconds=lease_seconds)
    with transaction.atomic(durable=True):
        messages = _claim_rows(lane=lane, now=now, limit=limit, until=until, token=token)
    if not messages:
        return None
    # A webhook lane's rows share one subscription: read once, not once per row.
    prefetch_related_objects(messages, "subscription")
    return Claim(token=token, until=until, messages=messages)


def outbox_extend_claim(*, claim: Claim, ids: Sequence[int], lease_seconds: float) -> set[int]:
    """Lengthen the lease on ``ids`` before a delivery that could outlast it; returns the ids
    still ours. A row missing from the answer was claimed by another relay after our lease ran
    out (this one stalled): it is theirs now and this relay must not deliver it. One statement,
    conditional on the token, so no claim made in between can be overwritten."""
    until = timezone.now() + timedelta(seconds=lease_seconds)
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE backplane_outboxmessage SET claimed_until = %s"
            " WHERE id = ANY(%s) AND claim_token = %s AND status = 'pending' RETURNING id",
            [until, list(ids), claim.token],
        )
        kept = {row[0] for row in cursor.fetchall()}
    claim.until = until
    return kept


def outbox_release(*, claim: Claim, ids: Sequence[int]) -> int:
    """Give rows back untried (the relay is stopping, or their destination stopped answering):
    the claim is cleared and the attempt counted at claim time is taken back. Conditional on the
    token, like every write after the claim."""
    if not ids:
        return 0
    return OutboxMessage.objects.filter(
        pk__in=list(ids), claim_token=claim.token, status=OutboxStatus.PENDING
    ).update(claimed_until=None, claim_token=None, attempts=F("attempts") - 1)


# --- 3. record ------------------------------------------------------------------------------


def outbox_mark_delivered(*, claim: Claim, ids: Sequence[int]) -> int:
    """Mark delivered the rows of ``ids`` this claim still holds; returns how many.

    The race this closes: our lease ran out during a slow delivery and another relay claimed
    the row (a new token). Then the row is theirs: their delivery goes ahead (the consumer gets
    the message twice and drops one by ``message_id``) and their outcome is the one recorded.
    The conditional UPDATE and its row count tell the two cases apart."""
    if not ids:
        return 0
    updated = OutboxMessage.objects.filter(
        pk__in=list(ids), claim_token=claim.token, status=OutboxStatus.PENDING
    ).update(status=OutboxStatus.DELIVERED, delivered_at=timezone.now(), last_error="", claimed_until=None,
             claim_token=None)
    if updated < len(ids):
        logger.warning("%d of %d delivered outbox messages had been claimed by another relay after this one's "
                       "lease ran out; they will arrive twice", len(ids) - updated, len(ids))
    return updated


# Failed attempts kept per message (and copied to its dead letter) for the people who review it.
FAILURES_KEPT = 10

FAILED, DEAD, LOST = "failed", "dead", "lost"


def outbox_record_failure(*, message: OutboxMessage, claim: Claim, error: str, policy: LanePolicy) -> str:
    """Schedule the next attempt, or after the last one make the row a dead letter. One short
    transaction; returns FAILED, DEAD, or LOST when the claim is no longer ours (see
    ``outbox_mark_delivered``: the other relay's outcome counts, this one is dropped)."""
    with transaction.atomic(durable=True):
        row = (
            OutboxMessage.objects.select_for_update()
            .filter(pk=message.pk, claim_token=claim.token, status=OutboxStatus.PENDING)
            .first()
        )
        if row is None:
            logger.warning("outbox message %s: its claim ran out before its failure was recorded", message.message_id)
            return LOST
        now = timezone.now()
        row.last_error = error[:2000]
        failure = {"attempt": row.attempts, "at": now.isoformat(), "error": error[:500]}
        row.failures = [*(row.failures or []), failure][-FAILURES_KEPT:]
        row.claimed_until = None
        row.claim_token = None
        fields = ["last_error", "failures", "claimed_until", "claim_token"]
        if row.attempts >= policy.retry.max_attempts:
            row.status = OutboxStatus.DEAD
            # Strict: the key's later messages wait for a reviewer. Best effort: they go on.
            row.holds_key = policy.strict
            row.save(update_fields=[*fields, "status", "holds_key"])
            DeadLetter.objects.create(
                source=DeadLetterSource.OUTBOX,
                reference=str(row.message_id),
                task_id=row.task_id,
                outbox_message=row,
                topic=row.topic,
                payload=row.payload,
                error=row.last_error,
                attempts=row.attempts,
                history=row.failures,
                created_at=now,
            )
            announce_dead_letters(source=DeadLetterSource.OUTBOX)
            logger.warning("outbox message %s to %s dead after %d attempts (%s ordering): %s", row.message_id,
                           policy.name, row.attempts, policy.ordering, error)
            return DEAD
        # From the moment of failure, not the claim's: a slow failure (a timeout) must not eat
        # the backoff.
        row.next_attempt_at = now + timedelta(seconds=policy.retry.delay_after(row.attempts))
        row.save(update_fields=[*fields, "next_attempt_at"])
        return FAILED


# --- 2. deliver -----------------------------------------------------------------------------


@dataclass
class RelayStep:
    claimed: int = 0
    delivered: int = 0
    failed: int = 0
    dead: int = 0
    lost: int = 0  # outcomes dropped because another relay had claimed the row since
    released: int = 0  # given back untried
    timed_out: bool = False  # a delivery ran into its destination's deadline

    def __add__(self, other: RelayStep) -> RelayStep:
        return RelayStep(self.claimed + other.claimed, self.delivered + other.delivered, self.failed + other.failed,
                         self.dead + other.dead, self.lost + other.lost, self.released + other.released,
                         self.timed_out or other.timed_out)


# Delivered rows are marked in groups (a transaction per broker message would cost more than
# the publish), at least this often, so a key's next message is not held back for long.
_MARK_EVERY_SECONDS = 0.25


def outbox_deliver_claim(*, claim: Claim, publish: Publisher, policy: LanePolicy,
                         should_stop: Callable[[], bool] = lambda: False, deadline: float | None = None) -> RelayStep:
    """Deliver a claim's messages one by one, in id order, with no transaction open, recording
    each outcome. Stops early (giving the rest back untried) when ``should_stop()`` says so,
    when the monotonic ``deadline`` passes, or when the destination stops answering.

    A claim holds at most one message of each key (a key's next message waits for this one), so
    the publishes of one claim may be in flight together: a sink that acknowledges later
    (Kafka) gets the whole claim, and its acknowledgements are awaited before rows are marked."""
    step = RelayStep(claimed=len(claim.messages))
    destination = "broker" if policy.lane is BROKER_LANE else "webhook"  # a label: never the URL
    ours = {m.pk for m in claim.messages}
    pending_marks: list[int] = []
    awaited: list[tuple[OutboxMessage, Acknowledgement]] = []
    marked_at = time.monotonic()

    def record_failure(message: OutboxMessage, exc: Exception) -> None:
        if not isinstance(exc, PublishError):
            logger.exception("publishing outbox message %s failed unexpectedly", message.message_id, exc_info=exc)
        outcome = outbox_record_failure(message=message, claim=claim, error=_describe(exc), policy=policy)
        counters.delivery_failure_count(destination=destination, outcome=outcome)
        step.failed += outcome == FAILED
        step.dead += outcome == DEAD
        step.lost += outcome == LOST
        step.timed_out |= isinstance(exc, PublishError) and exc.timed_out

    def settle() -> None:
        """Wait for the acknowledgements still owed, in id order, within one deadline: the
        producer gave up on the first ones by then, and on the later ones no later."""
        nonlocal awaited
        settle_by = time.monotonic() + policy.timeout_seconds
        for message, acknowledgement in awaited:
            try:
                acknowledgement.wait(max(0.0, settle_by - time.monotonic()))
            except Exception as exc:  # noqa: BLE001 - recorded on the row, like a publish that raised
                record_failure(message, exc)
                continue
            pending_marks.append(message.pk)
        awaited = []

    def mark() -> None:
        nonlocal pending_marks, marked_at
        settle()
        done = outbox_mark_delivered(claim=claim, ids=pending_marks)
        step.delivered += done
        counters.deliveries_count(destination=destination, count=done)
        step.lost += len(pending_marks) - done
        pending_marks = []
        marked_at = time.monotonic()

    for index, message in enumerate(claim.messages):
        if should_stop() or (deadline is not None and time.monotonic() >= deadline) or step.timed_out:
            step.released += outbox_release(claim=claim, ids=[m.pk for m in claim.messages[index:]])
            break
        # The lease must outlast this delivery and its record; lengthen it when it would not.
        if (claim.until - timezone.now()).total_seconds() < policy.timeout_seconds + 1:
            ours = outbox_extend_claim(claim=claim, ids=[*(m.pk for m, _ in awaited),
                                                         *(m.pk for m in claim.messages[index:])],
                                       lease_seconds=policy.lease_seconds)
        if message.pk not in ours:
            step.lost += 1
            continue
        try:
            # The publish span is the child of the span that wrote the event (telemetry/tracing.py).
            with publish_span(topic=message.topic, message_id=str(message.message_id),
                              destination=message.destination, headers=message.headers,
                              attempt=max(1, message.attempts)) as sent_traceparent:
                acknowledgement = publish(message, envelope(message, traceparent=sent_traceparent))
        except Exception as exc:  # noqa: BLE001 - any failure is recorded on the row, never lost in a log
            # A timeout here means each of the others would wait a whole deadline too: the next
            # round of the loop gives them back for now.
            record_failure(message, exc)
            continue
        if acknowledgement is None:
            pending_marks.append(message.pk)
        else:
            awaited.append((message, acknowledgement))
        if time.monotonic() - marked_at >= _MARK_EVERY_SECONDS:
            mark()
    mark()
    return step


def _describe(exc: Exception) -> str:
    return str(exc) if isinstance(exc, PublishError) else f"{exc.__class__.__name__}: {exc}"


# --- the steps, per destination and for all of them -------------------------------------------


def outbox_lanes_due(*, now: datetime | None = None) -> list[LanePolicy]:
    """The destinations that have due, unclaimed messages, with their policies (two queries)."""
    now = now or timezone.now()
    due = OutboxMessage.objects.filter(status=OutboxStatus.PENDING, next_attempt_at__lte=now).filter(
        Q(claimed_until__isnull=True) | Q(claimed_until__lte=now)
    )
    # In the CDC mode the broker's rows are Debezium's to publish (cdc.py), never claimed here.
    broker_due = not cdc_enabled() and due.filter(subscription__isnull=True).exists()
    lanes = [broker_policy()] if broker_due else []
    subscriptions = WebhookSubscription.objects.filter(Exists(due.filter(subscription=OuterRef("pk")))).order_by("pk")
    return lanes + [webhook_policy(subscription) for subscription in subscriptions]


def outbox_relay_lane_once(*, policy: LanePolicy, publish: Publisher, batch_size: int, trial: bool = False,
                           should_stop: Callable[[], bool] = lambda: False,
                           deadline: float | None = None) -> RelayStep:
    """Claim one batch for one destination, deliver it, record the outcomes. ``trial``: claim a
    single message (the destination timed out lately)."""
    claim = outbox_claim(lane=policy.lane, limit=1 if trial else policy.claim_size(batch_size),
                         lease_seconds=policy.lease_seconds)
    if claim is None:
        return RelayStep()
    return outbox_deliver_claim(claim=claim, publish=publish, policy=policy, should_stop=should_stop,
                                deadline=deadline)


def outbox_relay_once(*, publish: Publisher, batch_size: int = 100) -> RelayStep:
    """One batch for every destination with due messages, delivered here, one destination after
    the other (tests and benchmarks; the worker delivers each destination in threads)."""
    total = RelayStep()
    for policy in outbox_lanes_due():
        total += outbox_relay_lane_once(policy=policy, publish=publish, batch_size=batch_size)
    return total


def outbox_relay_until_idle(*, publish: Publisher, budget_seconds: float, batch_size: int = 100) -> RelayStep:
    """Relay batches until nothing is claimable or the time budget is spent."""
    deadline = time.monotonic() + budget_seconds
    total = RelayStep()
    while True:
        step = outbox_relay_once(publish=publish, batch_size=batch_size)
        total += step
        if step.claimed == 0 or step.delivered == 0 or time.monotonic() >= deadline:
            return total


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
