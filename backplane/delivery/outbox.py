"""The transactional outbox: messages written with the change that causes them, then
relayed at least once, in order per key, with retries that end in a dead letter.

Writing (``outbox_enqueue``) happens inside the caller's transaction: one row per destination
(the broker, and each webhook subscription whose pattern matches the topic), ids in the order
written, which is the order per key. Relaying is backplane/delivery/relay.py: rows are claimed
with a lease in a short transaction, delivered with no transaction open, and their outcome
recorded in another short one; a relay killed mid-delivery leaves claims that expire, and the
rows are delivered again (at least once; consumers drop duplicates by ``message_id``). The
whole picture, ordering modes and retry schedule included: docs/delivery.md.

Whose a message is: every row carries the namespace it belongs to in its ``namespace`` header
(set here, over whatever the caller's headers say; ``null`` for the backplane's own messages
that concern no namespace, e.g. alerts), a subscription limited to namespaces gets only theirs,
and per-key order is kept within a ``key_scope``: the namespace for an agent's messages, one
scope of its own (``SERVER_KEY_SCOPE``) for the backplane's topics (``backplane.*``, which no
client may use), so no agent's key can hold up another namespace's or the backplane's messages.
"""

from __future__ import annotations

import functools
import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import connection

from backplane.delivery.models import OutboxDestination, OutboxMessage
from backplane.lib.sql_rows import recordset, recordset_json

logger = logging.getLogger(__name__)

# Topics whose first word is this (in any case) are the backplane's own: lifecycle, alerts,
# budgets, compensations. A client message on one is refused (eventlog/services.py).
RESERVED_TOPIC_WORD = "backplane"
# The key scope of the backplane's own messages. No namespace can be named so (a namespace
# starts with a letter or a digit), so an agent's keys never share it.
SERVER_KEY_SCOPE = "@backplane"


def topic_is_reserved(topic: str) -> bool:
    """Whether a topic is the backplane's: its first word is ``backplane`` in any case, around
    any whitespace. ``backplane`` alone counts too: the pattern ``backplane.#`` matches it."""
    return topic.strip().split(".", 1)[0].strip().casefold() == RESERVED_TOPIC_WORD


def outbox_key_scope(*, topic: str, namespace: str | None) -> str:
    """The scope a message's per-key order is kept in: the backplane's topics (and anything not
    written for a namespace) share ``SERVER_KEY_SCOPE``; an agent's messages, their namespace."""
    return SERVER_KEY_SCOPE if namespace is None or topic_is_reserved(topic) else namespace


# The broker URL that makes the broker lane publish to Kafka (backplane/delivery/kafka_sink.py).
KAFKA_URL_SCHEME = "kafka://"


def broker_is_kafka(url: str | None = None) -> bool:
    return (url or settings.BACKPLANE_OUTBOX_BROKER_URL).startswith(KAFKA_URL_SCHEME)


def cdc_enabled() -> bool:
    """Whether Debezium publishes the broker's messages (backplane/delivery/cdc.py) rather than the relay."""
    return settings.BACKPLANE_OUTBOX_RELAY_MODE == "cdc"


def broker_takes(topic: str) -> bool:
    """Whether a message on ``topic`` gets a row for the broker. An agent's message always does
    (it asked for it: unroutable, it is retried and then a dead letter). The backplane's own only
    where a route is declared for it (``BACKPLANE_OUTBOX_QUEUES``' bindings,
    ``BACKPLANE_OUTBOX_BROKER_TOPICS``): nobody else asked for them. Kafka takes every message:
    it keeps them for consumers that come later, where a topic exchange would drop them."""
    if not topic_is_reserved(topic) or broker_is_kafka():
        return True
    routes = [*(binding for _, binding in settings.BACKPLANE_OUTBOX_QUEUES), *settings.BACKPLANE_OUTBOX_BROKER_TOPICS]
    return any(topic_matches(route, topic) for route in routes)


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
    namespace: str | None = None,
    task_id: str | None = None,
    event_position: int | None = None,
) -> list[OutboxMessage]:
    """Write one message for the broker plus one per matching webhook subscription.

    ``namespace``: whose message it is (the task's); None for the backplane's own messages that
    concern no namespace. Must run inside the transaction of the change it announces: that is
    the whole point.
    """
    rows = _rows_for(
        topic=topic, key=key, payload=payload, headers=headers, namespace=namespace, task_id=task_id,
        event_position=event_position, subscriptions=_active_subscriptions(), first=0,
    )
    inserted = _insert_rows(rows, now=now)
    return [
        OutboxMessage(
            id=pk, message_id=message_id, destination=row["destination"], subscription_id=row["subscription_id"],
            topic=topic, key=key, key_scope=row["key_scope"], payload=payload, headers=row["headers"],
            task_id=task_id, event_position=event_position, next_attempt_at=now, created_at=now,
        )
        for row, (pk, message_id) in zip(rows, inserted, strict=True)
    ]


@dataclass(frozen=True)
class Subscription:
    """An active webhook subscription, as the enqueue reads it (``SUBSCRIPTIONS_SQL``)."""

    pk: int
    topic_pattern: str
    namespaces: frozenset[str]  # empty: every namespace

    def wants(self, *, topic: str, namespace: str | None) -> bool:
        """A subscription limited to namespaces gets their messages only: none of another
        namespace's, nor the backplane's messages that concern no namespace."""
        in_scope = not self.namespaces or namespace in self.namespaces
        return in_scope and topic_matches(self.topic_pattern, topic)


# The active webhook subscriptions, in id order: read in the transaction that enqueues, so a
# subscription added a moment ago already gets messages.
SUBSCRIPTIONS_SQL = (
    "SELECT id, topic_pattern, namespaces FROM backplane_webhooksubscription WHERE is_active ORDER BY id"
)


def subscriptions_from(rows: Sequence[Sequence[Any]]) -> list[Subscription]:
    return [Subscription(pk, pattern, frozenset(namespaces)) for pk, pattern, namespaces in rows]


def _active_subscriptions() -> list[Subscription]:
    with connection.cursor() as cursor:
        cursor.execute(SUBSCRIPTIONS_SQL)
        return subscriptions_from(cursor.fetchall())


def _rows_for(
    *,
    topic: str,
    key: str,
    payload: dict[str, Any],
    headers: dict[str, Any],
    namespace: str | None,
    task_id: str | None,
    event_position: int | None,
    subscriptions: list[Subscription],
    first: int,
) -> list[dict[str, Any]]:
    """One message's rows: the broker's, then one per subscription that wants it. The broker
    gets every namespace's: its routing key is the topic, and consumers filter on the
    ``namespace`` header."""
    matching = [s.pk for s in subscriptions if s.wants(topic=topic, namespace=namespace)]
    destinations: list[int | None] = [None, *matching] if broker_takes(topic) else [*matching]
    # The server's word on whose message this is, over anything the caller's headers say.
    headers = {**headers, "namespace": namespace}
    key_scope = outbox_key_scope(topic=topic, namespace=namespace)
    return [
        {
            "n": first + offset,  # ids follow this order (per-key delivery order)
            "message_id": str(uuid.uuid4()),
            "destination": OutboxDestination.BROKER if subscription_id is None else OutboxDestination.WEBHOOK,
            "subscription_id": subscription_id,
            "topic": topic,
            "key": key,
            "key_scope": key_scope,
            "payload": payload,
            "headers": headers,
            "task_id": task_id,
            "event_position": event_position,
        }
        for offset, subscription_id in enumerate(destinations)
    ]


@dataclass(frozen=True)
class Message:
    """A message to enqueue with others (``outbox_enqueue_many``)."""

    topic: str
    key: str
    payload: dict[str, Any]
    headers: dict[str, Any]
    namespace: str | None = None  # whose message it is (``outbox_enqueue``)
    task_id: str | None = None
    event_position: int | None = None


def outbox_enqueue_many(messages: Sequence[Message], *, now: datetime) -> int:
    """``outbox_enqueue`` for several messages: the subscriptions read once, every row in one
    INSERT, ids in the order given. Returns how many rows were written."""
    if not messages:
        return 0
    rows = outbox_rows(messages, _active_subscriptions())
    _insert_rows(rows, now=now)
    return len(rows)


def outbox_rows(messages: Sequence[Message], subscriptions: list[Subscription]) -> list[dict[str, Any]]:
    """The rows of ``messages`` (each: the broker's, then one per subscription that wants it), in
    the order their ids follow, as ``OUTBOX_INSERT_SQL`` takes them (``outbox_insert_params``)."""
    rows: list[dict[str, Any]] = []
    for message in messages:
        rows += _rows_for(
            topic=message.topic, key=message.key, payload=message.payload, headers=message.headers,
            namespace=message.namespace, task_id=message.task_id, event_position=message.event_position,
            subscriptions=subscriptions, first=len(rows),
        )
    return rows


# Every enqueue is one INSERT of a JSON array of records: its text is quoted once by the
# client-side binding, where the queryset API (bulk_create) and a multi-row VALUES list compile
# and quote every value in Python. Ids follow ``n``.
_ENQUEUED_FIELDS = (
    "message_id", "destination", "subscription", "topic", "key", "key_scope", "payload", "headers", "task",
    "event_position",
)


@functools.cache
def outbox_insert_sql() -> str:
    """The one INSERT of every enqueue; its parameters are ``outbox_insert_params``'."""
    rows = recordset(OutboxMessage, _ENQUEUED_FIELDS)
    return f"""
INSERT INTO backplane_outboxmessage ({rows.column_list}, status, attempts, next_attempt_at, last_error, failures,
                                    created_at)
SELECT {rows.column_list}, 'pending', 0, %s, '', '[]'::jsonb, %s
FROM jsonb_to_recordset(%s::jsonb) AS {rows.definition("m", extra=[("n", "integer")])}
ORDER BY m.n
RETURNING id, message_id
"""


def outbox_insert_params(rows: list[dict[str, Any]], *, now: datetime) -> list[Any]:
    return [now, now, recordset_json(rows)]


def _insert_rows(rows: list[dict[str, Any]], *, now: datetime) -> list[tuple[int, uuid.UUID]]:
    with connection.cursor() as cursor:
        cursor.execute(outbox_insert_sql(), outbox_insert_params(rows, now=now))
        return sorted(cursor.fetchall())
