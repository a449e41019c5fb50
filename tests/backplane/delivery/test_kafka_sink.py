"""The relay publishing to a real Kafka (one private KRaft node), and the client's Kafka consumer
helper reading it into a real PostgreSQL: every message acknowledged before its row is marked,
keyed and in order per key, with its headers; the product's own messages routed by the settings;
and a consumer that processes each message once whatever it is sent twice or fails on."""

from __future__ import annotations

import json
import secrets
import time
import uuid
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from django.db import transaction
from django.utils import timezone

from backplane.delivery import outbox, relay
from backplane.delivery.kafka_sink import KafkaSink
from backplane.delivery.models import OutboxMessage
from backplane.delivery.sinks import Sinks
from backplane.eventlog import services
from backplane.eventlog.models import Task
from backplane.eventlog.writer import EventDraft
from backplane_client.consumer import handle_kafka_message
from tests.client.test_consumer import connect, consumer_url  # noqa: F401 - fixtures: the consumer's own database
from tests.support.kafka import KafkaCluster, kafka_one_node  # noqa: F401 - the module's node (a fixture)

pytestmark = [pytest.mark.slow]


@pytest.fixture
def kafka_outbox(kafka_one_node: KafkaCluster, settings: Any) -> str:  # noqa: F811 - the imported fixture
    """The broker lane on the module's node, to a default topic of this test's own; returns it."""
    topic = f"outbox-{secrets.token_hex(4)}"
    settings.BACKPLANE_OUTBOX_BROKER_URL = f"kafka://{kafka_one_node.bootstrap}"
    settings.BACKPLANE_OUTBOX_KAFKA_TOPIC = topic
    settings.BACKPLANE_OUTBOX_KAFKA_TOPICS = []
    settings.BACKPLANE_OUTBOX_BROKER_TIMEOUT_SECONDS = 10
    return topic


def consume(bootstrap: str, topic: str, count: int, timeout: float = 60) -> list[Any]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"test-{secrets.token_hex(4)}",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.subscribe([topic])
    received: list[Any] = []
    deadline = time.monotonic() + timeout
    try:
        while len(received) < count and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                received.append(message)
    finally:
        consumer.close()
    return received


def relay_all() -> relay.RelayStep:
    sinks = Sinks()
    try:
        return relay.outbox_relay_until_idle(publish=sinks, budget_seconds=60)
    finally:
        sinks.close()


def test_every_message_arrives_keyed_in_order_per_key_with_its_headers(
        db: None, kafka_one_node: KafkaCluster, kafka_outbox: str) -> None:  # noqa: F811
    now = timezone.now()
    with transaction.atomic():
        for n in range(300):
            outbox.outbox_enqueue(topic="crm.scored", key=f"lead-{n % 20}", payload={"n": n}, headers={}, now=now,
                                  namespace="sales")
    step = relay_all()
    assert (step.delivered, step.failed) == (300, 0)
    assert set(OutboxMessage.objects.values_list("status", flat=True)) == {"delivered"}

    received = consume(kafka_one_node.bootstrap, kafka_outbox, 300)
    assert len(received) == 300
    by_key: dict[str, list[int]] = defaultdict(list)
    for message in received:
        body = json.loads(message.value())
        headers = {name: value.decode() for name, value in message.headers()}
        assert message.key().decode() == body["key"]
        assert headers == {"message_id": body["message_id"], "topic": "crm.scored", "namespace": "sales",
                           "attempt": "1"}
        by_key[body["key"]].append(body["payload"]["n"])
    assert len({json.loads(m.value())["message_id"] for m in received}) == 300
    # One key, one partition: the order the rows were written in.
    assert all(numbers == sorted(numbers) for numbers in by_key.values()) and len(by_key) == 20
    partitions = {key: {m.partition() for m in received if m.key().decode() == key} for key in by_key}
    assert all(len(p) == 1 for p in partitions.values())


def test_the_product_s_messages_go_to_kafka_by_route_without_a_declared_queue(
        kafka_one_node: KafkaCluster, kafka_outbox: str, settings: Any,  # noqa: F811
        make_task: Callable[..., Task]) -> None:
    lifecycle = f"lifecycle-{secrets.token_hex(4)}"
    settings.BACKPLANE_OUTBOX_KAFKA_TOPICS = [(lifecycle, "backplane.tasks.#")]
    settings.BACKPLANE_OUTBOX_QUEUES = []
    settings.BACKPLANE_OUTBOX_BROKER_TOPICS = []
    task = make_task(kind="kafka-routed")
    services.event_append(namespace=task.namespace, task_id=task.pk, agent="a",
                          draft=EventDraft(type="TaskCompleted", payload={"output": {}}))
    OutboxMessage.objects.exclude(task_id=task.pk).delete()
    while relay_all().delivered:  # the second message of the key waits for the first
        pass

    received = consume(kafka_one_node.bootstrap, lifecycle, 2)
    assert [json.loads(m.value())["payload"]["status"] for m in received] == ["pending", "completed"]
    assert {m.key().decode() for m in received} == {str(task.pk)}


def test_a_refused_message_stays_pending_with_kafka_s_reason(
        db: None, kafka_one_node: KafkaCluster, kafka_outbox: str, settings: Any) -> None:  # noqa: F811
    # Larger than the topic takes: the cluster refuses it (the producer's own limit is higher).
    name = f"small-{secrets.token_hex(4)}"
    kafka_one_node.tool("org.apache.kafka.tools.TopicCommand", "--bootstrap-server", kafka_one_node.bootstrap,
                        "--create", "--topic", name, "--config", "max.message.bytes=2000")
    settings.BACKPLANE_OUTBOX_KAFKA_TOPIC = name
    now = timezone.now()
    with transaction.atomic():
        outbox.outbox_enqueue(topic="crm.big", key="k1", payload={"text": "x" * 5000}, headers={}, now=now)
        outbox.outbox_enqueue(topic="crm.small", key="k2", payload={"text": "x"}, headers={}, now=now)

    def relay_once() -> relay.RelayStep:
        sink = Sinks(broker=KafkaSink(url=settings.BACKPLANE_OUTBOX_BROKER_URL))
        try:
            return relay.outbox_relay_once(publish=sink)
        finally:
            sink.close()

    # Kafka refuses a record batch as a whole: the small message, batched with the big one on
    # their partition, is refused with it. Neither is marked; both keep Kafka's reason.
    step = relay_once()
    assert (step.delivered, step.failed) == (0, 2)
    for row in OutboxMessage.objects.all():
        assert row.status == "pending" and "too large" in row.last_error.lower(), row.last_error
    # Their next attempts come at different times (the backoff's jitter): alone, the small one goes.
    OutboxMessage.objects.filter(key="k2").update(next_attempt_at=timezone.now())
    assert relay_once().delivered == 1
    assert dict(OutboxMessage.objects.values_list("key", "status")) == {"k1": "pending", "k2": "delivered"}


def test_the_consumer_helper_processes_each_message_once_and_commits_after_its_transaction(
        kafka_one_node: KafkaCluster, connect: Callable[..., psycopg.Connection[Any]]) -> None:  # noqa: F811
    topic = f"consumed-{secrets.token_hex(4)}"
    kafka_one_node.create_topic(topic, partitions=2)
    envelopes: list[dict[str, Any]] = [{"message_id": str(uuid.uuid4()), "topic": "crm.scored", "key": f"k{n % 3}",
                  "payload": {"n": n}, "headers": {"attempt": 1}} for n in range(12)]
    producer = Producer({"bootstrap.servers": kafka_one_node.bootstrap, "enable.idempotence": True})
    # Every message twice, as a relay that redelivers after a lost acknowledgement sends it.
    for body in [*envelopes, *envelopes]:
        producer.produce(topic, key=body["key"].encode(), value=json.dumps(body).encode())
    assert producer.flush(30) == 0

    conn = connect()
    failed_once: set[int] = set()

    def handler(conn: psycopg.Connection[Any], envelope: Any) -> None:
        conn.execute("INSERT INTO effects (message_id, value) VALUES (%s, %s)",
                     (envelope["message_id"], str(envelope["payload"]["n"])))
        if envelope["payload"]["n"] % 5 == 4 and envelope["payload"]["n"] not in failed_once:
            failed_once.add(envelope["payload"]["n"])
            raise RuntimeError("the handler's first try fails")

    group = f"group-{secrets.token_hex(4)}"
    consumer = Consumer({"bootstrap.servers": kafka_one_node.bootstrap, "group.id": group,
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.subscribe([topic])
    outcomes: list[bool] = []
    failures = 0
    deadline = time.monotonic() + 60
    try:
        while len(outcomes) < 24 and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None or message.error() is not None:
                continue
            try:
                outcomes.append(handle_kafka_message(conn, consumer, message, handler))
            except RuntimeError:
                failures += 1
        committed = consumer.committed([TopicPartition(topic, p) for p in (0, 1)], timeout=10)
        ends = [consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in (0, 1)]
    finally:
        consumer.close()

    assert failures == 2  # n = 4 and n = 9, each read again after its failure
    assert sorted(outcomes) == [False] * 12 + [True] * 12
    rows = conn.execute("SELECT value FROM effects ORDER BY id").fetchall()
    assert sorted(int(value) for (value,) in rows) == list(range(12))  # the failed tries rolled back
    # Everything processed is committed, nothing more (a partition no key hashed to has no offset).
    assert [tp.offset if end else 0 for tp, end in zip(committed, ends, strict=True)] == ends


def test_readyz_is_green_while_the_outbox_s_kafka_answers(
        db: None, kafka_outbox: str, settings: Any, client: Any) -> None:
    settings.BACKPLANE_METRICS_TOKEN = "kafka-readyz"
    response = client.get("/readyz", headers={"Authorization": "Bearer kafka-readyz"})
    assert response.status_code == 200, response.content
