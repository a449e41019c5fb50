"""The relay to Kafka through faults, as real processes: three KRaft nodes (replication factor 3,
``min.insync.replicas=2``), ``manage.py relay`` children publishing with the Kafka sink, appends
going on in a thread, and an independent consumer counting what reaches the topic. Mid-stream,
the partition leader is SIGKILLed, then the relay, and both come back; in another test,
PostgreSQL. Nothing the outbox holds may be missing from the topic, a key's messages must arrive
in the order they were written, and a message that arrives twice must be the same record (same
``message_id``, same value)."""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.kafka import KafkaCluster, kafka_three_nodes  # noqa: F401 - the module's nodes (a fixture)

from .relay_harness import (
    Appender,
    RelayProcess,
    TopicCounter,
    check_every_message_arrived_once_in_order,
    crash_and_restart_embedded_postgres,
    wait_until,
)

pytestmark = [pytest.mark.slow]

PARTITIONS = 3


@pytest.fixture
def topic(kafka_three_nodes: KafkaCluster) -> str:  # noqa: F811 - the imported fixture
    name = f"faults-{secrets.token_hex(4)}"
    kafka_three_nodes.create_topic(name, partitions=PARTITIONS)
    return name


@pytest.fixture
def relays(committed_db: None, tmp_path: Path) -> Iterator[list[RelayProcess]]:
    """Relay processes; any still running is SIGKILLed before the database is cleaned."""
    started: list[RelayProcess] = []
    yield started
    for relay in started:
        if relay.is_running():
            relay.kill()


def start_relay(relays: list[RelayProcess], tmp_path: Path, cluster: KafkaCluster, topic: str) -> RelayProcess:
    relay = RelayProcess(tmp_path / f"relay-{len(relays)}.log", batch_size=50, poll_seconds=0.1, env={
        "BACKPLANE_OUTBOX_BROKER_URL": f"kafka://{cluster.bootstrap}",
        "BACKPLANE_OUTBOX_KAFKA_TOPIC": topic,
        # A leader's election takes seconds: a publish waits that long rather than failing.
        "BACKPLANE_OUTBOX_BROKER_TIMEOUT_SECONDS": "15",
        "BACKPLANE_OUTBOX_CLAIM_SECONDS": "20",
        "BACKPLANE_OUTBOX_BACKOFF_BASE_SECONDS": "1",
    }).start()
    relays.append(relay)
    return relay


def test_a_killed_leader_and_a_killed_relay_lose_nothing_and_reorder_nothing(
        kafka_three_nodes: KafkaCluster, topic: str, relays: list[RelayProcess], tmp_path: Path) -> None:  # noqa: F811
    cluster = kafka_three_nodes
    counter = TopicCounter(cluster.bootstrap, topic)
    counter.start()
    appender = Appender()
    appender.start()
    try:
        relay = start_relay(relays, tmp_path, cluster, topic)
        wait_until(lambda: len(counter.records) >= 200, timeout=90, what="the relay publishes",
                   on_timeout=lambda: relay.log()[-3000:])

        leader_id = cluster.describe_topic(topic)[0].leader
        assert leader_id is not None
        cluster.node(leader_id).kill()
        at_leader_kill = len(counter.records)
        wait_until(lambda: len(counter.records) >= at_leader_kill + 200, timeout=120,
                   what="deliveries go on with the leader dead", on_timeout=lambda: relay.log()[-3000:])

        relay.kill()
        at_relay_kill = len(counter.records)
        relay = start_relay(relays, tmp_path, cluster, topic)
        cluster.node(leader_id).start()
        wait_until(lambda: len(counter.records) >= at_relay_kill + 200, timeout=120,
                   what="a new relay takes over", on_timeout=lambda: relay.log()[-3000:])
    finally:
        appender.stopping.set()
        appender.join(timeout=60)
    assert appender.error is None, appender.error

    check_every_message_arrived_once_in_order(
        counter, appender, label="kafka faults", details=lambda: relay.log()[-3000:], same_record=_without_attempt,
        where=f"records before the leader's kill {at_leader_kill}, before the relay's {at_relay_kill}")


def test_a_killed_postgresql_under_the_kafka_relay_loses_nothing_and_reorders_nothing(
        kafka_three_nodes: KafkaCluster, topic: str, relays: list[RelayProcess], tmp_path: Path) -> None:  # noqa: F811
    pgdata = os.environ.get("BACKPLANE_TEST_PGDATA")
    if not pgdata:
        pytest.skip("the suite runs on an external DATABASE_URL; there is no embedded server to kill")
    counter = TopicCounter(kafka_three_nodes.bootstrap, topic)
    counter.start()
    appender = Appender(ride_out_outages=True)
    appender.start()
    try:
        relay = start_relay(relays, tmp_path, kafka_three_nodes, topic)
        wait_until(lambda: len(counter.records) >= 300, timeout=90, what="the relay publishes",
                   on_timeout=lambda: relay.log()[-3000:])
        at_kill = len(counter.records)
        crash_and_restart_embedded_postgres(Path(pgdata))
        wait_until(lambda: len(counter.records) >= at_kill + 300, timeout=120,
                   what="the relay goes on after PostgreSQL's restart", on_timeout=lambda: relay.log()[-3000:])
        assert relay.is_running(), "the relay exited instead of riding out the outage"
    finally:
        appender.stopping.set()
        appender.join(timeout=60)
    assert appender.error is None, appender.error
    assert appender.outage_errors > 0, "the appends never met the outage"
    check_every_message_arrived_once_in_order(
        counter, appender, label="kafka faults", details=lambda: relay.log()[-3000:], same_record=_without_attempt,
        where=f"records before PostgreSQL's kill {at_kill}, {appender.outage_errors} appends refused during the outage")


def _without_attempt(value: bytes) -> bytes:
    """A repeat carries a higher ``attempt`` header; the rest of the record must be the same."""
    body: dict[str, Any] = json.loads(value)
    body["headers"].pop("attempt", None)
    body["headers"].pop("traceparent", None)
    return json.dumps(body, sort_keys=True).encode()
