"""The sealed event log as a Kafka stream (docs/delivery.md, "The event log as a stream"): every
event, not only outbox messages, to the topic ``BACKPLANE_EVENT_STREAM_TOPIC_PREFIX`` + its
task's namespace, keyed by task id, so analytics and other consumers read the fleet's history
without touching PostgreSQL. On with ``BACKPLANE_EVENT_STREAM``; beat runs ``stream-events``.

What is streamed is the sealed log, in leaf order (backplane/integrity/sealing.py): its leaves are
numbered without gaps once sealed, so a cursor (``EventStreamCursor.next_leaf``) says exactly what
has been published, and a task's events are sealed in seq order (a task's later event commits
after its earlier one, and the sealer takes committed events in position order), so a task's
records reach its partition in seq order. The price is the seal's interval of extra lag.

A record's value is the event as the API and the audit export render it (``event_as_api_dict``),
so a consumer can rebuild a task's chain from the topic alone and check it with the offline
verifier (``python -m backplane.integrity.audit verify-events``); ``task_id``, ``seq``, ``hash``,
``namespace`` and ``leaf_index`` are headers too.

One run (``event_stream_once``), in three steps, none holding a transaction while Kafka answers:

1. claim the cursor (a lease, so one run at a time across processes) and read the next leaves
   with their events, in one short transaction;
2. publish them with an idempotent producer (``acks=all``) and wait for every acknowledgement;
3. move the cursor past them, only if this run's claim still holds (a run whose lease ran out
   publishes twice what the next one publishes again, never skips).

A failure leaves the cursor where it was (the next run publishes the same leaves again, with the
same content: consumers drop repeats by task and seq) and fails the duty, which ``/readyz``
reports once it stays failed; ``/metrics`` has the leaves not yet streamed.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Max, Q
from django.utils import timezone

from backplane.delivery.kafka_sink import create_missing_topics, kafka_client_config, producer_config
from backplane.delivery.relay import PublishError
from backplane.eventlog.chain import event_as_api_dict
from backplane.integrity.models import EventStreamCursor, MerkleLeaf

logger = logging.getLogger(__name__)

CURSOR = "kafka"
# Longer than a run's publishing can take (the producer gives up on a message after its timeout).
LEASE_SECONDS = 120


@dataclass
class StreamStep:
    published: int = 0
    skipped: int = 0  # leaves whose event retention has removed
    next_leaf: int = 0


def stream_topic(namespace: str) -> str:
    return f"{settings.BACKPLANE_EVENT_STREAM_TOPIC_PREFIX}{namespace}"


class EventProducer:
    """One idempotent producer per process, kept between runs; knows which topics exist."""

    def __init__(self) -> None:
        self.client_config = kafka_client_config(settings.BACKPLANE_OUTBOX_BROKER_URL)
        self.timeout = float(settings.BACKPLANE_OUTBOX_BROKER_TIMEOUT_SECONDS)
        self._producer: Any = None
        self._topics: set[str] = set()

    def publish_all(self, records: list[tuple[str, bytes, bytes, list[tuple[str, str]]]]) -> None:
        """Publish ``(topic, key, value, headers)`` records and wait for every acknowledgement
        within the broker's timeout; raises ``PublishError`` if any is refused or unanswered."""
        from confluent_kafka import Producer

        wanted = sorted({topic for topic, _, _, _ in records} - self._topics)
        if wanted:
            create_missing_topics(self.client_config, wanted, timeout=self.timeout)
            self._topics.update(wanted)
        if self._producer is None:
            self._producer = Producer(producer_config(self.client_config, timeout=self.timeout))
        failures: list[str] = []

        def on_delivery(error: Any, message: Any) -> None:
            if error is not None:
                failures.append(f"{message.topic()}: {error.str()}")

        for topic, key, value, headers in records:
            while True:
                try:
                    self._producer.produce(topic, value=value, key=key, headers=headers, on_delivery=on_delivery)
                    break
                except BufferError:
                    self._producer.poll(0.05)
        left = self._producer.flush(self.timeout)
        if left or failures:
            raise PublishError(f"kafka: {left} event record(s) unacknowledged, {len(failures)} refused"
                               + (f" (first: {failures[0]})" if failures else ""), timed_out=bool(left))


_producer: EventProducer | None = None


def process_producer() -> EventProducer:
    global _producer
    if _producer is None:
        _producer = EventProducer()
    return _producer


def _claim(token: uuid.UUID, batch_size: int) -> tuple[int, list[MerkleLeaf]] | None:
    """Claim the cursor and read the leaves after it with their events and tasks; None while
    another run holds it. A leaf whose event retention removed is not among them (the join)."""
    now = timezone.now()
    with transaction.atomic(durable=True):
        EventStreamCursor.objects.get_or_create(name=CURSOR)
        free = EventStreamCursor.objects.filter(Q(claimed_until__isnull=True) | Q(claimed_until__lt=now), name=CURSOR)
        if not free.update(claimed_until=now + timedelta(seconds=LEASE_SECONDS), claim_token=token):
            return None
        next_leaf = EventStreamCursor.objects.values_list("next_leaf", flat=True).get(name=CURSOR)
        leaves = list(MerkleLeaf.objects.filter(leaf_index__gte=next_leaf).order_by("leaf_index")
                      .select_related("event__task")[:batch_size])
    return next_leaf, leaves


def _release(token: uuid.UUID, *, next_leaf: int | None = None) -> bool:
    """Give the claim back, moving the cursor to ``next_leaf`` when given; False when the claim
    had been taken over (the lease ran out)."""
    changes: dict[str, Any] = {"claimed_until": None, "claim_token": None}
    if next_leaf is not None:
        changes.update(next_leaf=next_leaf, advanced_at=timezone.now())
    return bool(EventStreamCursor.objects.filter(name=CURSOR, claim_token=token).update(**changes))


def event_stream_once(*, batch_size: int | None = None, producer: EventProducer | None = None) -> StreamStep:
    """Publish the next sealed leaves' events (module docstring); returns what was done."""
    token = uuid.uuid4()
    claim = _claim(token, batch_size or settings.BACKPLANE_EVENT_STREAM_BATCH)
    if claim is None:
        return StreamStep()
    next_leaf, leaves = claim
    step = StreamStep(next_leaf=next_leaf)
    records = []
    for leaf in leaves:
        event = leaf.event
        namespace = event.task.namespace
        value = json.dumps(event_as_api_dict(event), separators=(",", ":"), ensure_ascii=False).encode()
        headers = [("task_id", str(event.task_id)), ("seq", str(event.seq)), ("hash", event.hash),
                   ("namespace", namespace), ("leaf_index", str(leaf.leaf_index))]
        records.append((stream_topic(namespace), str(event.task_id).encode(), value, headers))
    try:
        if records:
            (producer or process_producer()).publish_all(records)
    except BaseException:
        _release(token)
        raise
    step.published = len(records)
    step.next_leaf = leaves[-1].leaf_index + 1 if leaves else next_leaf
    step.skipped = step.next_leaf - next_leaf - len(leaves)
    if not _release(token, next_leaf=step.next_leaf):
        logger.warning("event stream: the claim on leaves from %d ran out while publishing; another run "
                       "publishes them again", next_leaf)
    return step


def event_stream_until_idle(*, budget_seconds: float = 10.0) -> StreamStep:
    """Runs until a run finds fewer leaves than a batch, or the budget is spent."""
    total = StreamStep()
    deadline = time.monotonic() + budget_seconds
    batch_size = settings.BACKPLANE_EVENT_STREAM_BATCH
    while True:
        step = event_stream_once(batch_size=batch_size)
        total.published += step.published
        total.skipped += step.skipped
        total.next_leaf = max(total.next_leaf, step.next_leaf)
        if step.published + step.skipped < batch_size or time.monotonic() >= deadline:
            return total


def event_stream_lag() -> int:
    """Sealed leaves not streamed yet."""
    sealed = MerkleLeaf.objects.aggregate(last=Max("leaf_index"))["last"]
    cursor = EventStreamCursor.objects.filter(name=CURSOR).values_list("next_leaf", flat=True).first() or 0
    return 0 if sealed is None else max(0, sealed + 1 - cursor)
