"""The CDC relay as real processes (backplane/delivery/cdc.py): the test database decoding the
outbox through the product's publication and slot, a Kafka node, Kafka Connect running
Debezium's connector from the files the product writes, ``manage.py relay`` marking what reached
Kafka, and an independent consumer counting every record.

What must hold: every broker message of the outbox reaches its Kafka topic with the relay's
envelope and headers, and is then marked delivered; webhook rows are never published; the role
Debezium logs in as reads the outbox table and nothing else; a SIGKILLed Connect worker loses no
message and reorders no key (a repeat is the same record); a slot that falls behind or
disappears turns /readyz red."""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.db import connection
from django.test import Client
from django.utils import timezone

from backplane.delivery import cdc
from backplane.delivery.models import OutboxMessage, OutboxStatus, WebhookSubscription
from backplane.delivery.outbox import outbox_enqueue
from backplane.delivery.selectors import slot_state
from tests.support.kafka import KafkaCluster, kafka_one_node  # noqa: F401 - the module's node (a fixture)
from tests.support.kafka_connect import ConnectWorker, connect_missing_reason

from .relay_harness import (
    Appender,
    RelayProcess,
    TopicCounter,
    check_every_message_arrived_once_in_order,
    crash_and_restart_embedded_postgres,
    enqueue_keyed_messages,
    wait_until,
)

pytestmark = [pytest.mark.slow]


@pytest.fixture
def cdc_settings(settings: Any, kafka_one_node: KafkaCluster) -> dict[str, str]:  # noqa: F811
    """This test's Kafka topic and the CDC mode, in this process and (as ``env``) in its children."""
    env = {
        "BACKPLANE_OUTBOX_BROKER_URL": f"kafka://{kafka_one_node.bootstrap}",
        "BACKPLANE_OUTBOX_KAFKA_TOPIC": f"cdc-{secrets.token_hex(4)}",
        "BACKPLANE_OUTBOX_RELAY_MODE": "cdc",
    }
    settings.BACKPLANE_OUTBOX_BROKER_URL = env["BACKPLANE_OUTBOX_BROKER_URL"]
    settings.BACKPLANE_OUTBOX_KAFKA_TOPIC = env["BACKPLANE_OUTBOX_KAFKA_TOPIC"]
    settings.BACKPLANE_OUTBOX_KAFKA_TOPICS = []
    settings.BACKPLANE_OUTBOX_RELAY_MODE = "cdc"
    return env


@pytest.fixture
def cdc_server(committed_db: None, cdc_settings: dict[str, str]) -> Iterator[None]:
    """The role, publication and slot; dropped afterwards, or the test database could not be."""
    if reason := connect_missing_reason():
        pytest.fail(reason)
    done = cdc.cdc_setup(password=None)
    assert done == ["added the column backplane_outboxmessage.cdc_value", "created role backplane_cdc",
                    "created publication backplane_outbox", "created replication slot backplane_outbox"], done
    assert cdc.cdc_setup(password=None) == []
    yield
    assert "dropped role backplane_cdc" in cdc.cdc_teardown()
    with connection.cursor() as cursor:
        cursor.execute("SELECT (SELECT count(*) FROM pg_publication), (SELECT count(*) FROM pg_replication_slots), "
                       "(SELECT count(*) FROM pg_roles WHERE rolname = 'backplane_cdc'), (SELECT count(*) "
                       "FROM pg_attribute WHERE attrelid = 'backplane_outboxmessage'::regclass "
                       "AND attname = 'cdc_value')")
        assert cursor.fetchone() == (0, 0, 0, 0)


@pytest.fixture
def worker(cdc_server: None, tmp_path: Path) -> Iterator[ConnectWorker]:
    """A Connect worker (not started) with the files ``manage.py cdc config`` writes."""
    directory = tmp_path / "connect"
    directory.mkdir()
    connect = ConnectWorker(directory)
    (directory / "worker.properties").write_text(
        cdc.properties_text(cdc.worker_properties(state_dir=directory, rest_port=connect.rest_port)))
    (directory / "connector.properties").write_text(cdc.properties_text(cdc.connector_properties()))
    yield connect
    connect.stop()


@pytest.fixture
def relays(committed_db: None) -> Iterator[list[RelayProcess]]:
    started: list[RelayProcess] = []
    yield started
    for relay in started:
        if relay.is_running():
            relay.kill()


def start_relay(relays: list[RelayProcess], tmp_path: Path, env: dict[str, str]) -> RelayProcess:
    relay = RelayProcess(tmp_path / f"relay-{len(relays)}.log", batch_size=50, poll_seconds=0.1, env=env).start()
    relays.append(relay)
    return relay


def test_debezium_publishes_the_outbox_and_the_relay_marks_what_reached_kafka(
        worker: ConnectWorker, cdc_settings: dict[str, str], relays: list[RelayProcess], tmp_path: Path,
        kafka_one_node: KafkaCluster) -> None:  # noqa: F811
    worker.start()
    topic = cdc_settings["BACKPLANE_OUTBOX_KAFKA_TOPIC"]
    counter = TopicCounter(kafka_one_node.bootstrap, topic)
    counter.start()
    enqueued = enqueue_keyed_messages(keys=["a", "b", "c"], per_key=20)
    # A message for the broker and a webhook: only the broker's row is Debezium's.
    WebhookSubscription.objects.create(name="cdc-hook", topic_pattern="cdc.#", url="http://127.0.0.1:9/",
                                       secret="s", max_attempts=1)
    rows = outbox_enqueue(topic="cdc.hooked", key="w", payload={"webhook": True}, headers={}, now=timezone.now())
    webhook_row = next(row for row in rows if row.subscription_id is not None)
    broker_rows = list(OutboxMessage.objects.filter(subscription__isnull=True).order_by("id"))
    expected = {str(row.message_id) for row in broker_rows}
    assert len(expected) == 3 * 20 + 2  # and the task's lifecycle message, and the hooked message's broker row
    wait_until(lambda: expected <= counter.message_ids(), timeout=60, what="Debezium publishes every broker row",
               on_timeout=worker.log_tail)

    # The value is the relay's envelope (relay.envelope), with attempt 1.
    by_id = {record[0]: record for record in counter.records}
    row = broker_rows[1]
    body = json.loads(by_id[str(row.message_id)][3])
    assert body == {"message_id": str(row.message_id), "topic": row.topic, "key": row.key, "payload": row.payload,
                    "headers": {**row.headers, "attempt": 1}}
    assert str(webhook_row.message_id) not in counter.message_ids()

    # Nothing is marked before it is found in Kafka: the polling relay does not claim broker rows here.
    assert OutboxMessage.objects.filter(subscription__isnull=True, status=OutboxStatus.PENDING).count() == len(
        expected)
    relay = start_relay(relays, tmp_path, cdc_settings)
    broker_pending = OutboxMessage.objects.filter(subscription__isnull=True, status=OutboxStatus.PENDING)
    wait_until(lambda: not broker_pending.exists(), timeout=60, what="the relay marks what reached Kafka",
               on_timeout=lambda: relay.log()[-3000:])
    assert all(row.attempts == 1 and row.delivered_at is not None
               for row in OutboxMessage.objects.filter(subscription__isnull=True))
    counter.stopping.set()
    counter.join(timeout=30)
    assert enqueued.per_key == 20
    state = slot_state()
    assert state.exists and state.active
    assert cdc.cdc_problem() is None


def test_the_cdc_role_reads_the_outbox_table_and_nothing_else(cdc_server: None) -> None:
    database = connection.settings_dict
    with psycopg.connect(dbname=database["NAME"], host=database["HOST"], port=database["PORT"] or 5432,
                         user="backplane_cdc", autocommit=True) as conn:
        conn.execute("SELECT count(*) FROM backplane_outboxmessage")
        for statement in ("SELECT count(*) FROM backplane_event", "SELECT count(*) FROM backplane_task",
                          "DELETE FROM backplane_outboxmessage",
                          "UPDATE backplane_outboxmessage SET status = 'delivered'"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(statement)


def test_a_killed_connect_worker_loses_nothing_and_reorders_nothing(
        worker: ConnectWorker, cdc_settings: dict[str, str], relays: list[RelayProcess], tmp_path: Path,
        kafka_one_node: KafkaCluster) -> None:  # noqa: F811
    worker.start()
    counter = TopicCounter(kafka_one_node.bootstrap, cdc_settings["BACKPLANE_OUTBOX_KAFKA_TOPIC"])
    counter.start()
    relay = start_relay(relays, tmp_path, cdc_settings)
    appender = Appender()
    appender.start()
    try:
        wait_until(lambda: len(counter.records) >= 300, timeout=90, what="Debezium publishes",
                   on_timeout=worker.log_tail)
        worker.kill()
        at_kill = len(counter.records)
        wait_until(lambda: appender.rounds >= 10 + at_kill // 40, timeout=60, what="appends go on without Connect")
        worker.start()
        wait_until(lambda: len(counter.records) >= at_kill + 300, timeout=120,
                   what="a restarted worker goes on from its offsets", on_timeout=worker.log_tail)
    finally:
        appender.stopping.set()
        appender.join(timeout=60)
    assert appender.error is None, appender.error

    check_every_message_arrived_once_in_order(counter, appender, label="cdc faults",
                                              where=f"records before Connect's kill {at_kill}",
                                              details=lambda: worker.log_tail() + relay.log()[-3000:])


def test_a_killed_postgresql_loses_nothing_and_reorders_nothing(
        worker: ConnectWorker, cdc_settings: dict[str, str], relays: list[RelayProcess], tmp_path: Path,
        kafka_one_node: KafkaCluster) -> None:  # noqa: F811
    pgdata = os.environ.get("BACKPLANE_TEST_PGDATA")
    if not pgdata:
        pytest.skip("the suite runs on an external DATABASE_URL; there is no embedded server to kill")
    worker.start()
    counter = TopicCounter(kafka_one_node.bootstrap, cdc_settings["BACKPLANE_OUTBOX_KAFKA_TOPIC"])
    counter.start()
    relay = start_relay(relays, tmp_path, cdc_settings)
    appender = Appender(ride_out_outages=True)
    appender.start()
    try:
        wait_until(lambda: len(counter.records) >= 300, timeout=90, what="Debezium publishes",
                   on_timeout=worker.log_tail)
        at_kill = len(counter.records)
        crash_and_restart_embedded_postgres(Path(pgdata))
        wait_until(lambda: len(counter.records) >= at_kill + 300, timeout=180,
                   what="Debezium goes on after PostgreSQL's restart", on_timeout=worker.log_tail)
        assert worker.task_state() == "RUNNING"
    finally:
        appender.stopping.set()
        appender.join(timeout=60)
    assert appender.error is None, appender.error
    assert appender.outage_errors > 0, "the appends never met the outage"
    check_every_message_arrived_once_in_order(counter, appender, label="cdc faults",
                                              where=f"records before PostgreSQL's kill {at_kill}, "
                                                    f"{appender.outage_errors} appends refused during the outage",
                                              details=lambda: worker.log_tail() + relay.log()[-3000:])


def test_readyz_turns_red_when_the_slot_falls_behind_or_is_gone(
        cdc_server: None, settings: Any, client: Client) -> None:
    settings.BACKPLANE_DUTY_WATCH = False
    settings.BACKPLANE_METRICS_TOKEN = "cdc-metrics"
    assert client.get("/readyz").status_code == 200
    metrics = _metrics(client)
    assert metrics["backplane_cdc_slot_present"] == 1.0
    assert metrics["backplane_cdc_slot_active"] == 0.0  # no Connect worker in this test

    # Nobody reads the slot: what is written from now on is WAL it holds back.
    settings.BACKPLANE_CDC_MAX_LAG_BYTES = 64 * 1024
    enqueue_keyed_messages(keys=["a", "b"], per_key=200)
    answer = client.get("/readyz", HTTP_AUTHORIZATION=f"Bearer {settings.BACKPLANE_METRICS_TOKEN}")
    assert answer.status_code == 503
    problems = answer.json()["error"]["details"]["problems"]
    assert any("replication slot backplane_outbox is" in p and "bytes behind" in p for p in problems), problems
    assert _metrics(client)["backplane_cdc_slot_lag_bytes"] > 64 * 1024

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_drop_replication_slot('backplane_outbox')")
    problems = client.get("/readyz", HTTP_AUTHORIZATION=f"Bearer {settings.BACKPLANE_METRICS_TOKEN}").json()[
        "error"]["details"]["problems"]
    assert "cdc: replication slot backplane_outbox is missing (manage.py cdc setup)" in problems


def _metrics(client: Client) -> dict[str, float]:
    from django.conf import settings

    text = client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {settings.BACKPLANE_METRICS_TOKEN}").content.decode()
    values: dict[str, Any] = {}
    for line in text.splitlines():
        if line.startswith("backplane_cdc_"):
            name, value = line.split(" ")
            values[name] = float(value)
    return values
