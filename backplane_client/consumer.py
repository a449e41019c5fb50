"""Process each backplane message once, in the consumer's own database transaction.

Why this exists: the backplane's relay delivers at least once. A message is marked delivered
only after the broker or webhook accepted it, so a crash, a timeout or a lost acknowledgement
in between means the same message is sent again. Every message therefore carries a stable
``message_id`` (the same on every attempt), and the consumer drops the repeats.

The dedupe must live in the *same* transaction as the consumer's own work. Recording the id
in one transaction and doing the work in another leaves a window where a crash either loses
the message (id recorded, work lost) or applies it twice (work done, id lost).
:func:`process_once` does both together::

    BEGIN;
    INSERT INTO backplane_processed_messages (message_id, topic) VALUES (...)
        ON CONFLICT (message_id) DO NOTHING;   -- took effect? then:
    <handler(conn, envelope)>                  -- the consumer's own writes
    COMMIT;                                    -- id and effects become visible together

Concurrency comes from PostgreSQL: when two processes get the same message at once, the second
``INSERT`` finds the first one's uncommitted row under the primary key and waits for that
transaction. If it commits, the second sees the conflict and skips; if it rolls back (the handler
failed), the second insert succeeds and that process does the work. Exactly one handler run
commits. This relies on READ COMMITTED (PostgreSQL's default); under REPEATABLE READ or
SERIALIZABLE the waiter gets a serialization failure instead, which is safe but must be retried.

Only the standard library and psycopg 3 are used (and confluent-kafka by handle_kafka_message);
both are imported inside the functions that need them, so :mod:`backplane_client.signing` works
without either.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import confluent_kafka
    import psycopg
    from psycopg import sql

__all__ = [
    "DEFAULT_TABLE",
    "Envelope",
    "Handler",
    "ensure_processed_table",
    "handle_kafka_message",
    "handle_kombu_message",
    "parse_envelope",
    "process_once",
]

DEFAULT_TABLE = "backplane_processed_messages"

Envelope = Mapping[str, Any]
"""``{"message_id": "<uuid>", "topic": str, "key": str, "payload": {...}, "headers": {...}}``"""

Handler = Callable[["psycopg.Connection[Any]", Envelope], object]
"""``handler(conn, envelope)``: the consumer's work, run inside the dedupe transaction on ``conn``."""

# Lower-case identifiers only, optionally schema-qualified: quoted mixed-case names are a trap.
_IDENTIFIER = r"[a-z_][a-z0-9_]{0,62}"
_TABLE_NAME = re.compile(rf"^{_IDENTIFIER}(?:\.{_IDENTIFIER})?$")


def _table_identifier(table: str) -> sql.Identifier:
    from psycopg import sql

    if not isinstance(table, str) or not _TABLE_NAME.fullmatch(table):
        raise ValueError(
            f"invalid table name {table!r}: use lower-case letters, digits and underscores "
            "(at most 63, not starting with a digit), optionally as schema.table"
        )
    return sql.Identifier(*table.split("."))


def _message_id(envelope: Envelope) -> uuid.UUID:
    if not isinstance(envelope, Mapping):
        raise TypeError(f"the envelope must be a mapping, not {type(envelope).__name__}")
    raw = envelope.get("message_id")
    if raw is None:
        raise ValueError("the envelope has no message_id")
    if isinstance(raw, uuid.UUID):
        return raw
    try:
        return uuid.UUID(str(raw))
    except ValueError:
        raise ValueError(f"the envelope's message_id {raw!r} is not a UUID")


def ensure_processed_table(conn: psycopg.Connection[Any], table: str = DEFAULT_TABLE) -> None:
    """Create the processed-ids table if it is missing (idempotent, safe to call at start-up).

    Several consumers starting at once may race on ``CREATE TABLE IF NOT EXISTS`` (PostgreSQL
    can then report a unique violation on its catalogue); that case counts as "exists".
    """
    import psycopg
    from psycopg import sql

    statement = sql.SQL(
        "CREATE TABLE IF NOT EXISTS {} ("
        " message_id uuid PRIMARY KEY,"
        " topic text,"
        " processed_at timestamptz NOT NULL DEFAULT now())"
    ).format(_table_identifier(table))
    try:
        with conn.transaction():
            conn.execute(statement)
    except psycopg.errors.UniqueViolation:
        pass  # created concurrently by another consumer


def process_once(
    conn: psycopg.Connection[Any],
    envelope: Envelope,
    handler: Handler,
    *,
    table: str = DEFAULT_TABLE,
) -> bool:
    """Run ``handler(conn, envelope)`` unless this ``message_id`` was already processed.

    Returns True when the handler ran and its work committed together with the message id,
    False for a duplicate (the handler is not called). If the handler raises, the transaction
    is rolled back, so the id is not recorded and a redelivery will be processed; the exception
    propagates.

    The handler must do its database work on ``conn`` (that is what makes it atomic with the
    dedupe record) and must not commit or roll back itself (psycopg refuses that inside the
    transaction block). Side effects outside the database (e-mails, HTTP calls) are not covered:
    they can still happen twice if the commit fails after them.

    ``conn`` may be in autocommit mode or not, but must be idle: the commit has to happen here,
    before the caller acknowledges the message. Inside a caller's open transaction the work would
    only become a savepoint, and acknowledging before that outer commit could lose the message,
    so that case is refused.
    """
    from psycopg import sql
    from psycopg.pq import TransactionStatus

    message_id = _message_id(envelope)
    topic = envelope.get("topic")
    insert = sql.SQL("INSERT INTO {} (message_id, topic) VALUES (%s, %s) ON CONFLICT (message_id) DO NOTHING").format(
        _table_identifier(table)
    )
    status = conn.info.transaction_status
    if status != TransactionStatus.IDLE:
        raise RuntimeError(
            f"process_once needs an idle connection so that it can commit before the message is "
            f"acknowledged, but the connection is {status.name}; commit or roll back first"
        )
    with conn.transaction():
        cursor = conn.execute(insert, (message_id, topic if isinstance(topic, str) else None))
        if cursor.rowcount != 1:
            return False  # duplicate: leaving the block commits an empty transaction
        handler(conn, envelope)
    return True


def parse_envelope(body: Mapping[str, Any] | str | bytes) -> dict[str, Any]:
    """Accept a broker message body as a dict (kombu's json serializer) or JSON text/bytes."""
    if isinstance(body, Mapping):
        return dict(body)
    if isinstance(body, str | bytes | bytearray):
        try:
            value = json.loads(body)
        except ValueError as exc:
            raise ValueError(f"the message body is not valid JSON: {exc}")
        if not isinstance(value, dict):
            raise ValueError(f"the message body must be a JSON object, got {type(value).__name__}")
        return value
    raise TypeError(f"unsupported message body type {type(body).__name__}")


class _Ackable(Protocol):
    def ack(self) -> None: ...


def handle_kombu_message(
    conn: psycopg.Connection[Any],
    body: Mapping[str, Any] | str | bytes,
    message: _Ackable,
    handler: Handler,
    *,
    table: str = DEFAULT_TABLE,
) -> bool:
    """A kombu ``on_message``/callback body: process once, then ack after the commit.

    The order matters: acknowledging first and crashing before the commit would lose the
    message, while committing first and crashing before the ack only causes a redelivery,
    which :func:`process_once` recognises as a duplicate (and this function then acks).
    Duplicates are acknowledged too. If parsing or the handler fails the message is *not*
    acknowledged and the exception propagates; the caller decides between
    ``message.reject(requeue=True)`` (transient failure) and a dead-letter queue (poison).
    """
    envelope = parse_envelope(body)
    processed = process_once(conn, envelope, handler, table=table)
    message.ack()
    return processed


def handle_kafka_message(
    conn: psycopg.Connection[Any],
    consumer: confluent_kafka.Consumer,
    message: confluent_kafka.Message,
    handler: Handler,
    *,
    table: str = DEFAULT_TABLE,
) -> bool:
    """Process a message polled from Kafka once, then commit its offset (confluent-kafka).

    The consumer must run with ``enable.auto.commit=false``: only this function commits, and
    only after the handler's transaction committed. A crash in between redelivers the message
    from the last committed offset, and :func:`process_once` drops it as a repeat by
    ``message_id`` (the relay's redeliveries too: they carry the same id).

    When parsing or the handler fails, nothing is committed and the consumer is rewound to this
    message before the exception propagates: a Kafka consumer reads on past a message it did not
    commit, and a later commit would skip it for good. The next ``poll`` returns it again; a
    message that can never be processed (poison) has to be set aside by the caller, e.g. to a
    dead-letter topic, then committed.
    """
    try:
        envelope = parse_envelope(message.value() or b"")
        processed = process_once(conn, envelope, handler, table=table)
    except BaseException:
        from confluent_kafka import TopicPartition

        topic, partition, offset = message.topic(), message.partition(), message.offset()
        if topic is not None and partition is not None and offset is not None:
            consumer.seek(TopicPartition(topic, partition, offset))
        raise
    # Synchronous: the next message is not handled before this offset is stored in Kafka.
    consumer.commit(message=message, asynchronous=False)
    return processed
