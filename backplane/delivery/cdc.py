"""Change data capture: the outbox's broker messages published to Kafka by Debezium, read from
PostgreSQL's WAL, instead of claimed and published by the relay (docs/delivery.md, "Change data
capture"). On with ``BACKPLANE_OUTBOX_RELAY_MODE=cdc``; webhooks stay the relay's.

What runs:

1. PostgreSQL decodes every new broker row of the outbox (``subscription_id IS NULL``; inserts
   only, and only the columns Debezium needs) through the publication ``BACKPLANE_CDC_PUBLICATION``
   into the logical replication slot ``BACKPLANE_CDC_SLOT``. ``cdc_setup`` makes both, and the
   role Debezium logs in as, with least privilege: REPLICATION and SELECT on the outbox table.
   The slot exists before Debezium first connects, so nothing written in between is missed.
2. Kafka Connect (standalone) runs Debezium's PostgreSQL connector with its outbox router, from
   the files ``connector_properties`` and ``worker_properties`` write (``manage.py cdc config``):
   a row's ``cdc_value`` (the relay's envelope, a generated column that setup adds and teardown
   drops: migration 0029) is the record's value, its key
   the Kafka key, its ``message_id`` and ``topic`` headers; the Kafka topic is chosen by the same
   settings and patterns as the relay's (``BACKPLANE_OUTBOX_KAFKA_TOPIC[S]``), as a chain of
   Connect's RegexRouter transforms. Connect's producer is idempotent with ``acks=all``; Debezium
   moves the slot on only after Connect has stored its offsets, which follows the acknowledgements.
3. The relay (``PublishedConfirmations``, run by the lanes) reads those Kafka topics back in a
   consumer group of its own and marks the rows it finds there delivered: the dashboard's figures
   say what reached Kafka, in both modes.

A slot whose consumer stops holds back WAL: the embedded server caps it
(``max_slot_wal_keep_size``), ``/metrics`` shows the slot's lag and ``/readyz`` turns red past
``BACKPLANE_CDC_MAX_LAG_BYTES``, when the slot is gone, or when the server invalidated it.
``cdc_teardown`` drops the slot, the publication and the role when the mode is switched off.

Delivery is at least once, as the relay's: after a crash of Connect, what it published since
its last stored offset is published again, with the same ``message_id``.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from psycopg import sql

from backplane.delivery.kafka_sink import kafka_client_config, librdkafka_logger, settings_kafka_topics
from backplane.delivery.models import OutboxMessage
from backplane.delivery.outbox import cdc_enabled
from backplane.delivery.selectors import SlotState, slot_state
from backplane.telemetry import counters

logger = logging.getLogger(__name__)

OUTBOX_TABLE = OutboxMessage._meta.db_table
# What Debezium reads of a row: its envelope, key and routing, never the rest of it.
PUBLISHED_COLUMNS = ("id", "message_id", "topic", "key", "cdc_value")
CONNECTOR_NAME = "backplane-outbox"
# Debezium's outbox router names a record's topic this plus the row's topic; the RegexRouter chain
# then replaces it with a Kafka topic. ':' is not allowed in Kafka topic names, so a name the
# chain already chose can never match a later link of it.
_ROUTED_PREFIX = "outbox:"


# --- routing: the relay's topic patterns as regular expressions ------------------------------


def pattern_regex(pattern: str) -> str:
    """An AMQP topic pattern (``outbox.topic_matches``) as a regular expression that matches
    ``"." + topic`` whole, in the syntax Java's and Python's engines share: '*' is one word, '#'
    zero or more, every other character literal."""
    pieces = []
    for word in pattern.split("."):
        if word == "#":
            pieces.append(r"(?:\.[^.]*)*")
        elif word == "*":
            pieces.append(r"\.[^.]*")
        else:
            pieces.append(r"\." + "".join(c if c.isalnum() or c == "_" else "\\" + c for c in word))
    return "".join(pieces)


def routing_transforms() -> dict[str, str]:
    """Connect transforms that send a routed record to the Kafka topic the relay would choose:
    the first route of ``BACKPLANE_OUTBOX_KAFKA_TOPICS`` whose pattern matches, else
    ``BACKPLANE_OUTBOX_KAFKA_TOPIC``."""
    routes = [*settings.BACKPLANE_OUTBOX_KAFKA_TOPICS, (settings.BACKPLANE_OUTBOX_KAFKA_TOPIC, "#")]
    properties: dict[str, str] = {}
    for index, (kafka_topic, pattern) in enumerate(routes):
        name = f"transforms.route{index}"
        properties[f"{name}.type"] = "org.apache.kafka.connect.transforms.RegexRouter"
        properties[f"{name}.regex"] = _ROUTED_PREFIX + pattern_regex(pattern)
        properties[f"{name}.replacement"] = kafka_topic
    return properties


# --- the files Kafka Connect runs from ------------------------------------------------------


@dataclass(frozen=True)
class DatabaseTarget:
    """Where Debezium connects: a host and port, or a unix socket (the embedded server's), which
    PostgreSQL's JDBC driver reaches through junixsocket (kafka/connect/pom.xml)."""

    dbname: str
    host: str
    port: int
    socket: str | None


def database_target(settings_dict: dict[str, Any] | None = None) -> DatabaseTarget:
    database = settings_dict or connection.settings_dict
    host, port = database.get("HOST") or "", int(database.get("PORT") or 5432)
    if not host or host.startswith("/"):
        socket_dir = host or "/var/run/postgresql"
        return DatabaseTarget(dbname=database["NAME"], host="localhost", port=port,
                              socket=f"{socket_dir}/.s.PGSQL.{port}")
    return DatabaseTarget(dbname=database["NAME"], host=host, port=port, socket=None)


def connector_properties(*, password: str | None = None, target: DatabaseTarget | None = None) -> dict[str, str]:
    """Debezium's PostgreSQL connector with its outbox router, as Connect standalone reads it."""
    target = target or database_target()
    routes = routing_transforms()
    properties = {
        "name": CONNECTOR_NAME,
        "connector.class": "io.debezium.connector.postgresql.PostgresConnector",
        "tasks.max": "1",
        "plugin.name": "pgoutput",
        "database.hostname": target.host,
        "database.port": str(target.port),
        "database.user": settings.BACKPLANE_CDC_ROLE,
        "database.password": settings.BACKPLANE_CDC_PASSWORD if password is None else password,
        "database.dbname": target.dbname,
        "topic.prefix": "backplane",
        # The product made both (cdc_setup): Debezium only reads them.
        "slot.name": settings.BACKPLANE_CDC_SLOT,
        "publication.name": settings.BACKPLANE_CDC_PUBLICATION,
        "publication.autocreate.mode": "disabled",
        "table.include.list": f"public.{OUTBOX_TABLE}",
        "column.include.list": ",".join(f"public.{OUTBOX_TABLE}.{column}" for column in PUBLISHED_COLUMNS),
        # The slot starts where cdc_setup made it: rows from before are the polling relay's.
        "snapshot.mode": "no_data",
        # A slot advances only when something is decoded; with no outbox traffic the heartbeat
        # moves it, so an idle product holds no WAL back.
        "heartbeat.interval.ms": "10000",
        # How long the connector's task waits for changes before handing Connect a batch (500 ms
        # by default): the CDC relay's lag is mostly this.
        "poll.interval.ms": "50",
        "tombstones.on.delete": "false",
        "transforms": ",".join(["outbox", *(name.split(".")[1] for name in routes if name.endswith(".type"))]),
        "transforms.outbox.type": "io.debezium.transforms.outbox.EventRouter",
        "transforms.outbox.table.field.event.id": "message_id",
        "transforms.outbox.table.field.event.key": "key",
        "transforms.outbox.table.field.event.payload": "cdc_value",
        "transforms.outbox.table.fields.additional.placement": "message_id:header:message_id,topic:header:topic",
        "transforms.outbox.route.by.field": "topic",
        "transforms.outbox.route.topic.replacement": _ROUTED_PREFIX + ".${routedByValue}",
        # Topics Connect creates get the cluster's defaults, as the relay's do.
        "topic.creation.default.partitions": "-1",
        "topic.creation.default.replication.factor": "-1",
        **routes,
    }
    if target.socket is not None:
        properties["database.socketFactory"] = "org.newsclub.net.unix.AFUNIXSocketFactory$FactoryArg"
        properties["database.socketFactoryArg"] = target.socket
    return properties


def worker_properties(*, state_dir: Path, rest_port: int = 8083) -> dict[str, str]:
    """A standalone Connect worker: the broker URL's cluster, string key and value (the value is
    the envelope's JSON text as PostgreSQL wrote it), offsets in a file under ``state_dir``."""
    bootstrap = kafka_client_config(settings.BACKPLANE_OUTBOX_BROKER_URL)["bootstrap.servers"]
    return {
        "bootstrap.servers": bootstrap,
        "key.converter": "org.apache.kafka.connect.storage.StringConverter",
        "value.converter": "org.apache.kafka.connect.storage.StringConverter",
        "offset.storage.file.filename": str(state_dir / "offsets"),
        # Debezium confirms a position to the slot once Connect has stored it: each second.
        "offset.flush.interval.ms": "1000",
        "producer.enable.idempotence": "true",
        "producer.acks": "all",
        "producer.linger.ms": "5",
        "listeners": f"http://127.0.0.1:{rest_port}",
        "plugin.discovery": "only_scan",
    }


def properties_text(properties: dict[str, str]) -> str:
    """A Java properties file: backslashes doubled (the regular expressions have them), and the
    characters a key or value may not hold raw escaped."""

    def escaped(text: str, *, key: bool) -> str:
        text = text.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r")
        if key:
            text = re.sub(r"([=: #!])", r"\\\1", text)
        return text

    return "".join(f"{escaped(key, key=True)}={escaped(value, key=False)}\n" for key, value in properties.items())


# --- setting up and tearing down on the server ----------------------------------------------


class CdcSetupError(Exception):
    """The server cannot serve the CDC relay as it is configured; the message says why."""


def add_envelope_column() -> bool:
    """Add the outbox's ``cdc_value`` column (migration 0029 says why) unless it is there; True
    when added. A table rewrite under an exclusive lock, short: the outbox holds the undelivered
    and the recently delivered rows only."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1 FROM pg_attribute WHERE attrelid = %s::regclass AND attname = 'cdc_value' "
                       "AND NOT attisdropped", [OUTBOX_TABLE])
        if cursor.fetchone() is not None:
            return False
        cursor.execute(sql.SQL("ALTER TABLE {} ADD COLUMN cdc_value jsonb GENERATED ALWAYS AS "
                               "(backplane_outbox_envelope(message_id, topic, key, payload, headers)) STORED").format(
            sql.Identifier(OUTBOX_TABLE)))
    return True


def cdc_setup(*, password: str | None = None) -> list[str]:
    """Make (or bring up to date) the role, the publication and the slot; returns what was done.
    Run as the owner of the tables (``MIGRATION_DATABASE_URL``). Refused, changing nothing, when
    the server cannot decode logically or would let a stopped slot fill its disk."""
    done: list[str] = []
    role = sql.Identifier(settings.BACKPLANE_CDC_ROLE)
    publication = sql.Identifier(settings.BACKPLANE_CDC_PUBLICATION)
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_setting('wal_level'), current_setting('max_slot_wal_keep_size')")
        wal_level, keep = cursor.fetchone()
    if wal_level != "logical":
        raise CdcSetupError(f"wal_level is {wal_level}; the CDC relay needs wal_level = logical (a restart)")
    if keep == "-1":
        raise CdcSetupError("max_slot_wal_keep_size is unlimited: a slot whose consumer stops would keep WAL until "
                            "the disk is full; set it (docs/delivery.md, \"Change data capture\")")
    with transaction.atomic(), connection.cursor() as cursor:
        # Before the publication, whose column list names it.
        if add_envelope_column():
            done.append(f"added the column {OUTBOX_TABLE}.cdc_value")
        cursor.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", [settings.BACKPLANE_CDC_ROLE])
        login = sql.SQL("LOGIN REPLICATION PASSWORD {}").format(sql.Literal(password)) if password else sql.SQL(
            "LOGIN REPLICATION")
        if cursor.fetchone() is None:
            cursor.execute(sql.SQL("CREATE ROLE {} ").format(role) + login)
            done.append(f"created role {settings.BACKPLANE_CDC_ROLE}")
        else:
            cursor.execute(sql.SQL("ALTER ROLE {} ").format(role) + login)
        cursor.execute(sql.SQL("GRANT SELECT ON {} TO {}").format(sql.Identifier(OUTBOX_TABLE), role))
        published = sql.SQL("TABLE {} ({}) WHERE (subscription_id IS NULL)").format(
            sql.Identifier(OUTBOX_TABLE), sql.SQL(", ").join(map(sql.Identifier, PUBLISHED_COLUMNS)))
        cursor.execute("SELECT 1 FROM pg_publication WHERE pubname = %s", [settings.BACKPLANE_CDC_PUBLICATION])
        if cursor.fetchone() is None:
            cursor.execute(sql.SQL("CREATE PUBLICATION {} FOR {} WITH (publish = 'insert')").format(
                publication, published))
            done.append(f"created publication {settings.BACKPLANE_CDC_PUBLICATION}")
        else:
            cursor.execute(sql.SQL("ALTER PUBLICATION {} SET {}").format(publication, published))
            cursor.execute(sql.SQL("ALTER PUBLICATION {} SET (publish = 'insert')").format(publication))
    # Its own statement, after the commit: a slot cannot be made in a transaction that wrote.
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1 FROM pg_replication_slots WHERE slot_name = %s", [settings.BACKPLANE_CDC_SLOT])
        if cursor.fetchone() is None:
            cursor.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", [settings.BACKPLANE_CDC_SLOT])
            done.append(f"created replication slot {settings.BACKPLANE_CDC_SLOT}")
    return done


def cdc_teardown() -> list[str]:
    """Drop the slot (so it holds no WAL back once nobody reads it), the publication and the
    role's grant and the role; returns what was done. A slot still in use is refused."""
    done: list[str] = []
    with connection.cursor() as cursor:
        cursor.execute("SELECT active FROM pg_replication_slots WHERE slot_name = %s", [settings.BACKPLANE_CDC_SLOT])
        row = cursor.fetchone()
        if row is not None:
            if row[0]:
                raise CdcSetupError(f"replication slot {settings.BACKPLANE_CDC_SLOT} is in use: "
                                    "stop Kafka Connect first")
            cursor.execute("SELECT pg_drop_replication_slot(%s)", [settings.BACKPLANE_CDC_SLOT])
            done.append(f"dropped replication slot {settings.BACKPLANE_CDC_SLOT}")
    with transaction.atomic(), connection.cursor() as cursor:
        publication = sql.Identifier(settings.BACKPLANE_CDC_PUBLICATION)
        cursor.execute(sql.SQL("DROP PUBLICATION IF EXISTS {}").format(publication))
        cursor.execute(sql.SQL("ALTER TABLE {} DROP COLUMN IF EXISTS cdc_value").format(sql.Identifier(OUTBOX_TABLE)))
        cursor.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", [settings.BACKPLANE_CDC_ROLE])
        if cursor.fetchone() is not None:
            role = sql.Identifier(settings.BACKPLANE_CDC_ROLE)
            cursor.execute(sql.SQL("REVOKE ALL ON {} FROM {}").format(sql.Identifier(OUTBOX_TABLE), role))
            cursor.execute(sql.SQL("DROP ROLE {}").format(role))
            done.append(f"dropped role {settings.BACKPLANE_CDC_ROLE}")
    return done


# --- the slot's state, for /readyz --------------------------------------------------------


def cdc_problem(state: SlotState | None = None) -> str | None:
    """Why the CDC relay cannot publish, or None (always None in the polling mode); ``state``
    when the caller has read the slot already."""
    if not cdc_enabled():
        return None
    state = state or slot_state()
    slot = settings.BACKPLANE_CDC_SLOT
    if not state.exists:
        return f"cdc: replication slot {slot} is missing (manage.py cdc setup)"
    if state.wal_status == "lost":
        return f"cdc: replication slot {slot} was invalidated (it held back more than max_slot_wal_keep_size)"
    if state.lag_bytes > settings.BACKPLANE_CDC_MAX_LAG_BYTES:
        return (f"cdc: replication slot {slot} is {state.lag_bytes} bytes behind (limit "
                f"{settings.BACKPLANE_CDC_MAX_LAG_BYTES}); is Kafka Connect running?")
    return None


# --- marking what was published -------------------------------------------------------------


_MARK_PUBLISHED_SQL = f"""
UPDATE {OUTBOX_TABLE} SET status = 'delivered', delivered_at = now(), attempts = greatest(attempts, 1),
    last_error = '', claimed_until = NULL, claim_token = NULL
WHERE message_id = ANY(%s::uuid[]) AND status = 'pending' AND subscription_id IS NULL
"""


def outbox_mark_published(message_ids: Iterable[str]) -> int:
    """Mark delivered the pending broker rows of ``message_ids`` (found in Kafka); returns how many.
    A repeat, or a row a retention prune took, changes nothing."""
    ids = list(message_ids)
    if not ids:
        return 0
    with transaction.atomic(durable=True), connection.cursor() as cursor:
        cursor.execute(_MARK_PUBLISHED_SQL, [ids])
        marked = cursor.rowcount
    counters.deliveries_count(destination="broker", count=marked)
    return marked


class PublishedConfirmations:
    """Reads the Kafka topics Debezium publishes to, from a consumer group of its own, and marks
    the rows it finds there delivered. One per relay process, run by one lane job at a time
    (a consumer is not shared between threads). Offsets are committed after the marks: a crash
    in between reads the same records again, which marks nothing twice."""

    BATCH = 1000

    def __init__(self) -> None:
        self._consumer: Any = None

    def _ensure_consumer(self) -> Any:
        if self._consumer is None:
            from confluent_kafka import Consumer

            self._consumer = Consumer({
                **kafka_client_config(settings.BACKPLANE_OUTBOX_BROKER_URL),
                "group.id": settings.BACKPLANE_CDC_CONFIRM_GROUP,
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
                "logger": librdkafka_logger,
            })
            self._consumer.subscribe(settings_kafka_topics())
        return self._consumer

    def confirm(self, *, until: float, should_stop: Callable[[], bool] = lambda: False) -> int:
        """Read and mark until ``until`` (a monotonic time); returns how many rows were marked."""
        consumer = self._ensure_consumer()
        marked = 0
        while not should_stop() and time.monotonic() < until:
            records = consumer.consume(num_messages=self.BATCH, timeout=0.2)
            if not records:
                continue
            ids, consumed = [], False
            for record in records:
                if record.error() is not None:
                    # Partition end and the like; a real failure shows up as rows left pending.
                    logger.debug("cdc confirmations: %s", record.error())
                    continue
                consumed = True
                message_id = dict(record.headers() or []).get("message_id")
                if message_id:
                    ids.append(message_id.decode() if isinstance(message_id, bytes) else str(message_id))
            marked += outbox_mark_published(ids)
            if consumed:
                consumer.commit(asynchronous=False)
        return marked

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
        self._consumer = None
