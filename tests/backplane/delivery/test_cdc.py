"""The CDC relay's parts that need no Kafka Connect (backplane/delivery/cdc.py): the routing its
transforms do, the files it writes, the envelope PostgreSQL computes, the relay's part in the
CDC mode and the server's guards. tests/backplane/delivery/test_cdc_relay.py runs the whole."""

from __future__ import annotations

import itertools
import json
import os
import re
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.core.management import call_command
from django.db import connection
from django.utils import timezone

from backplane.delivery import cdc, relay
from backplane.delivery.models import OutboxMessage, OutboxStatus, WebhookSubscription
from backplane.delivery.outbox import outbox_enqueue, topic_matches

WORDS = ["", "a", "b", "tasks", "a-b", "x+y", "(c)"]


def test_the_routing_regexes_match_exactly_what_the_relays_patterns_match() -> None:
    patterns = {".".join(p) for n in (1, 2, 3) for p in itertools.product(["a", "*", "#", "b", "a-b", "(c)"], repeat=n)}
    topics = {".".join(t) for n in (1, 2, 3, 4) for t in itertools.product(WORDS, repeat=n)}
    for pattern in patterns:
        regex = re.compile(cdc.pattern_regex(pattern))
        for topic in topics:
            assert bool(regex.fullmatch("." + topic)) == topic_matches(pattern, topic), (pattern, topic)


def test_the_transforms_route_as_the_kafka_sink_does(settings: Any) -> None:
    """Applied in order as Connect applies them (RegexRouter: a whole match replaces the topic),
    the chain sends each topic where KafkaSink.kafka_topic would."""
    settings.BACKPLANE_OUTBOX_KAFKA_TOPIC = "backplane.outbox"
    settings.BACKPLANE_OUTBOX_KAFKA_TOPICS = [("lifecycle", "backplane.tasks.#"), ("crm", "crm.*"), ("all", "a.#")]
    properties = cdc.connector_properties(password="")
    chain = properties["transforms"].split(",")
    assert chain[0] == "outbox" and chain[1:] == ["route0", "route1", "route2", "route3"]

    def routed(topic: str) -> str:
        kafka_topic = properties["transforms.outbox.route.topic.replacement"].replace("${routedByValue}", topic)
        for name in chain[1:]:
            if re.fullmatch(properties[f"transforms.{name}.regex"], kafka_topic):
                kafka_topic = properties[f"transforms.{name}.replacement"]
        return kafka_topic

    from backplane.delivery.kafka_sink import KafkaSink

    sink = KafkaSink(url="kafka://127.0.0.1:9092")
    for topic in ("backplane.tasks.research", "crm.scored", "crm.a.b", "a", "a.crm.x", "backplane.alerts", ""):
        assert routed(topic) == sink.kafka_topic(topic), topic


def test_a_unix_socket_is_reached_through_junixsocket_and_a_host_directly() -> None:
    socket = cdc.database_target({"NAME": "backplane", "HOST": "/tmp/pg", "PORT": ""})
    assert socket == cdc.DatabaseTarget(dbname="backplane", host="localhost", port=5432, socket="/tmp/pg/.s.PGSQL.5432")
    properties = cdc.connector_properties(password="pw", target=socket)
    assert properties["database.socketFactory"] == "org.newsclub.net.unix.AFUNIXSocketFactory$FactoryArg"
    assert properties["database.socketFactoryArg"] == "/tmp/pg/.s.PGSQL.5432"
    host = cdc.database_target({"NAME": "bp", "HOST": "db.internal", "PORT": "6432"})
    properties = cdc.connector_properties(password="pw", target=host)
    assert (properties["database.hostname"], properties["database.port"]) == ("db.internal", "6432")
    assert "database.socketFactory" not in properties
    assert properties["database.user"] == "backplane_cdc" and properties["database.password"] == "pw"


def test_a_properties_file_keeps_backslashes_and_escapes_what_a_key_may_not_hold() -> None:
    text = cdc.properties_text({"transforms.route0.regex": r"outbox:\.a(?:\.[^.]*)*", "a key=x": "line\nbreak"})
    assert text == "transforms.route0.regex=outbox:\\\\.a(?:\\\\.[^.]*)*\n" "a\\ key\\=x=line\\nbreak\n"


def test_manage_py_cdc_config_writes_the_worker_and_the_connector(tmp_path: Path, settings: Any) -> None:
    settings.BACKPLANE_OUTBOX_BROKER_URL = "kafka://127.0.0.1:19092,127.0.0.1:19093"
    settings.BACKPLANE_CDC_PASSWORD = "secret"
    call_command("cdc", "config", "--dir", str(tmp_path), "--rest-port", "18083")
    worker = (tmp_path / "worker.properties").read_text()
    assert "bootstrap.servers=127.0.0.1:19092,127.0.0.1:19093\n" in worker
    assert "producer.acks=all\n" in worker and "producer.enable.idempotence=true\n" in worker
    assert f"offset.storage.file.filename={tmp_path}/offsets\n" in worker
    connector = tmp_path / "connector.properties"
    assert "database.password=secret\n" in connector.read_text()
    assert connector.stat().st_mode & 0o077 == 0


def test_postgresql_computes_the_relays_envelope_for_debezium(db: None) -> None:
    assert cdc.add_envelope_column() is True
    assert cdc.add_envelope_column() is False
    [row] = outbox_enqueue(topic="orders.created", key="k", payload={"n": 1, "list": [1, "a", None], "x": 1.5},
                           headers={"namespace": "acme"}, now=timezone.now(), namespace="acme")
    with connection.cursor() as cursor:
        cursor.execute("SELECT cdc_value::text FROM backplane_outboxmessage WHERE id = %s", [row.pk])
        text = cursor.fetchone()[0]
    assert json.loads(text) == relay.envelope(row)
    # The polling relay's claim does not carry it.
    assert "cdc_value" not in relay._CLAIM_SQL


def test_in_the_cdc_mode_the_relay_claims_webhooks_only_and_marks_what_kafka_has(db: None, settings: Any) -> None:
    subscription = WebhookSubscription.objects.create(name="hook", topic_pattern="orders.#", url="http://127.0.0.1:9/",
                                                      secret="s")
    rows = outbox_enqueue(topic="orders.created", key="k", payload={}, headers={}, now=timezone.now())
    broker_row = next(row for row in rows if row.subscription_id is None)
    assert [policy.lane for policy in relay.outbox_lanes_due()] == [None, subscription.pk]
    settings.BACKPLANE_OUTBOX_BROKER_URL = "kafka://127.0.0.1:9092"
    settings.BACKPLANE_OUTBOX_RELAY_MODE = "cdc"
    assert [policy.lane for policy in relay.outbox_lanes_due()] == [subscription.pk]

    webhook_row = next(row for row in rows if row.subscription_id is not None)
    # A webhook's id, an unknown id and a repeat mark nothing.
    assert cdc.outbox_mark_published([str(broker_row.message_id), str(webhook_row.message_id),
                                      "00000000-0000-0000-0000-000000000000"]) == 1
    assert cdc.outbox_mark_published([str(broker_row.message_id)]) == 0
    broker_row.refresh_from_db()
    webhook_row.refresh_from_db()
    assert (broker_row.status, broker_row.attempts) == (OutboxStatus.DELIVERED, 1)
    assert broker_row.delivered_at is not None
    assert webhook_row.status == OutboxStatus.PENDING
    assert OutboxMessage.objects.filter(status=OutboxStatus.DELIVERED).count() == 1


@pytest.mark.skipif(not os.environ.get("BACKPLANE_TEST_PGDATA"),
                    reason="the server is DATABASE_URL's, not the embedded one")
def test_the_embedded_server_decodes_logically_and_caps_what_a_slot_holds_back() -> None:
    with psycopg.connect(_admin_url()) as conn:
        assert conn.execute("SHOW wal_level").fetchone() == ("logical",)
        assert conn.execute("SHOW max_slot_wal_keep_size").fetchone() == ("1GB",)


def test_setup_is_refused_without_a_cap_on_a_slots_wal_and_changes_nothing(transactional_db: None) -> None:
    with psycopg.connect(_admin_url(), autocommit=True) as conn:
        conn.execute("ALTER SYSTEM SET max_slot_wal_keep_size = -1")
        conn.execute("SELECT pg_reload_conf()")
        try:
            _wait_for_setting(conn, "max_slot_wal_keep_size", "-1")
            with pytest.raises(cdc.CdcSetupError, match="max_slot_wal_keep_size is unlimited"):
                cdc.cdc_setup()
        finally:
            conn.execute("ALTER SYSTEM SET max_slot_wal_keep_size = '1GB'")
            conn.execute("SELECT pg_reload_conf()")
            _wait_for_setting(conn, "max_slot_wal_keep_size", "1GB")
    with connection.cursor() as cursor:
        cursor.execute("SELECT (SELECT count(*) FROM pg_roles WHERE rolname = 'backplane_cdc'), "
                       "(SELECT count(*) FROM pg_publication), (SELECT count(*) FROM pg_replication_slots)")
        assert cursor.fetchone() == (0, 0, 0)


def test_in_the_polling_mode_nothing_reads_a_slot(db: None) -> None:
    assert cdc.cdc_problem() is None


def _admin_url() -> str:
    database = connection.settings_dict
    return psycopg.conninfo.make_conninfo(dbname=database["NAME"], host=database["HOST"],
                                          port=str(database["PORT"] or 5432), user=database["USER"])


def _wait_for_setting(conn: psycopg.Connection[Any], name: str, value: str) -> None:
    import time

    deadline = time.monotonic() + 5
    while conn.execute(f"SHOW {name}").fetchone() != (value,):
        assert time.monotonic() < deadline, f"{name} did not become {value}"
        time.sleep(0.05)
