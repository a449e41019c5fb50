"""The relay to Kafka through faults, as real processes: three KRaft nodes (replication factor 3,
``min.insync.replicas=2``), ``manage.py relay`` children publishing with the Kafka sink, appends
going on in a thread, and an independent consumer counting what reaches the topic. Mid-stream,
the partition leader is SIGKILLed, then the relay; both come back. Nothing the outbox holds may
be missing from the topic, a key's messages must arrive in the order they were written, and a
message that arrives twice must be the same record (same ``message_id``, same value)."""

from __future__ import annotations

import json
import secrets
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from backplane.delivery.models import OutboxMessage
from tests.support.kafka import KafkaCluster, kafka_three_nodes  # noqa: F401 - the module's nodes (a fixture)

from .relay_harness import Appender, RelayProcess, TopicCounter, pending_count, wait_until

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

    # Everything the outbox holds reaches the topic.
    wait_until(lambda: pending_count() == 0, timeout=120, what="the outbox is drained",
               on_timeout=lambda: relay.log()[-3000:])
    expected = {str(m) for m in OutboxMessage.objects.values_list("message_id", flat=True)}
    wait_until(lambda: expected <= counter.message_ids(), timeout=60, what="the counter reads every message")
    counter.stopping.set()
    counter.join(timeout=30)

    records = list(counter.records)
    first_seen: dict[str, tuple[str, int | None]] = {}
    values: dict[str, set[bytes]] = defaultdict(set)
    duplicates = 0
    for message_id, key, seq, value in records:
        values[message_id].add(_without_attempt(value))
        if message_id in first_seen:
            duplicates += 1
        else:
            first_seen[message_id] = (key, seq)
    per_key: dict[str, list[int]] = defaultdict(list)
    for key, seq in first_seen.values():
        if seq is not None:
            per_key[key].append(seq)
    print(f"\nkafka faults: {appender.rounds} append rounds, {len(expected)} messages in the outbox, "
          f"{len(records)} records read, {duplicates} duplicates, {len(expected - counter.message_ids())} lost; "
          f"records before the leader's kill {at_leader_kill}, before the relay's {at_relay_kill}")
    assert counter.message_ids() == expected
    assert all(len(v) == 1 for v in values.values()), "a repeat differs from its first delivery"
    # Records are read in partition order, and a key has one partition: its first deliveries
    # come in the order they were written.
    assert all(seqs == sorted(seqs) for seqs in per_key.values()), {k: s for k, s in per_key.items()
                                                                     if s != sorted(s)}
    assert sum(len(seqs) for seqs in per_key.values()) == appender.rounds * 5 * 8


def _without_attempt(value: bytes) -> bytes:
    """A repeat carries a higher ``attempt`` header; the rest of the record must be the same."""
    body: dict[str, Any] = json.loads(value)
    body["headers"].pop("attempt", None)
    body["headers"].pop("traceparent", None)
    return json.dumps(body, sort_keys=True).encode()
