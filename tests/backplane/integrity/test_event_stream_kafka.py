"""The event log as a stream, against a real Kafka node: the duty publishes every sealed event to
its namespace's topic, keyed by task, and a consumer that reads only the topics rebuilds each
task's chain, in seq order, and verifies it with the offline verifier."""

from __future__ import annotations

import json
import secrets
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer

from backplane.eventlog.models import Event
from backplane.integrity import sealing, stream
from backplane.integrity import tasks as integrity_tasks
from backplane.integrity.audit import verify
from tests.backplane.integrity.audit_support import append, seed
from tests.support.kafka import KafkaCluster, kafka_one_node  # noqa: F401 - the module's node (a fixture)

pytestmark = [pytest.mark.slow]


@pytest.fixture
def prefix(settings: Any, kafka_one_node: KafkaCluster) -> Iterator[str]:  # noqa: F811 - the imported fixture
    settings.BACKPLANE_OUTBOX_BROKER_URL = f"kafka://{kafka_one_node.bootstrap}"
    settings.BACKPLANE_EVENT_STREAM = True
    settings.BACKPLANE_EVENT_STREAM_TOPIC_PREFIX = f"events-{secrets.token_hex(3)}."
    stream._producer = None  # a process's producer is made from the settings of its first run
    yield settings.BACKPLANE_EVENT_STREAM_TOPIC_PREFIX
    stream._producer = None


def read_topic(bootstrap: str, topic: str, count: int) -> list[Any]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"read-{secrets.token_hex(4)}",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.subscribe([topic])
    records: list[Any] = []
    try:
        for _ in range(300):
            records += [m for m in consumer.consume(500, timeout=0.1) if m.error() is None]
            if len(records) >= count:
                break
        return records
    finally:
        consumer.close()


def test_a_consumer_rebuilds_and_verifies_every_chain_from_the_topics_alone(
        db: None, prefix: str, kafka_one_node: KafkaCluster) -> None:  # noqa: F811
    tasks = [seed(steps=4, namespace="acme"), seed(steps=3, namespace="beta"), seed(steps=2, namespace="acme")]
    append(tasks[0], 3)
    sealing.seal_new_events()
    assert integrity_tasks.stream_events() == {"published": Event.objects.count(), "next_leaf": Event.objects.count()}
    # Later events go on from the cursor.
    append(tasks[1], 2)
    sealing.seal_new_events()
    assert integrity_tasks.stream_events()["published"] == 2
    assert stream.event_stream_lag() == 0

    for namespace in ("acme", "beta"):
        expected = list(Event.objects.filter(task__namespace=namespace).order_by("leaf__leaf_index"))
        records = read_topic(kafka_one_node.bootstrap, prefix + namespace, len(expected))
        assert len(records) == len(expected)
        chains: dict[str, list[tuple[int, str]]] = defaultdict(list)
        for record in records:
            event = json.loads(record.value())
            assert record.key().decode() == event["task_id"]
            headers = {name: value.decode() for name, value in record.headers()}
            assert (headers["seq"], headers["hash"], headers["namespace"]) == (str(event["seq"]), event["hash"],
                                                                                namespace)
            chains[event["task_id"]].append((event["seq"], event["hash"]))
        # Each task's events came in seq order (one partition per key), and are the database's.
        for task_id, chain in chains.items():
            stored = list(Event.objects.filter(task_id=task_id).order_by("seq").values_list("seq", "hash"))
            assert chain == stored
        summary = verify.verify_event_lines([record.value() for record in records], source=prefix + namespace)
        assert (summary.events, summary.tasks, summary.repeats) == (len(expected), len(chains), 0)
