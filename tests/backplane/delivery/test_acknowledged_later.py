"""Sinks that acknowledge after the publish call (Kafka): the relay hands over a whole claim,
awaits every acknowledgement before it marks a row, and records a refusal or a silence on that
message's row alone. And the Kafka sink's own edges that need no cluster: its URL, its topic
routes, a cluster that is not there, and which messages the broker lane takes when it is Kafka.
Kafka itself: test_kafka_sink.py (slow tier)."""

from __future__ import annotations

import socket
import time
from collections.abc import Set
from typing import Any

import pytest
from django.db import transaction
from django.utils import timezone

from backplane.delivery import outbox, relay
from backplane.delivery.kafka_sink import KafkaSink, kafka_client_config
from backplane.delivery.models import OutboxMessage, OutboxStatus
from backplane.delivery.outbox import broker_takes
from backplane.delivery.policy import broker_policy
from backplane.delivery.sinks import KombuSink, Sinks


def enqueue(keys: list[str], topic: str = "crm.scored") -> None:
    now = timezone.now()
    with transaction.atomic():
        for n, key in enumerate(keys):
            outbox.outbox_enqueue(topic=topic, key=key, payload={"n": n}, headers={}, now=now, namespace="ns")


class Later:
    """An acknowledgement its sink answers when the relay waits for it."""

    def __init__(self, sink: LaterSink, key: str) -> None:
        self.sink, self.key = sink, key

    def wait(self, timeout: float) -> None:
        self.sink.waited.append(self.key)
        if self.key in self.sink.refused:
            raise relay.PublishError("refused by the cluster")
        if self.key in self.sink.silent:
            raise relay.PublishError("no acknowledgement", timed_out=True)


class LaterSink:
    def __init__(self, refused: Set[str] = frozenset(), silent: Set[str] = frozenset()) -> None:
        self.refused, self.silent = refused, silent
        self.handed: list[str] = []
        self.waited: list[str] = []

    def __call__(self, message: OutboxMessage, body: dict[str, Any]) -> Later:
        self.handed.append(message.key)
        return Later(self, message.key)


def status_by_key() -> dict[str, str]:
    return dict(OutboxMessage.objects.values_list("key", "status"))


def test_a_claim_is_handed_over_whole_and_marked_only_once_acknowledged(db: None) -> None:
    enqueue(["a", "b", "c", "d"])
    sink = LaterSink(refused={"b"})
    step = relay.outbox_relay_once(publish=sink)
    assert sink.handed == ["a", "b", "c", "d"] and sink.waited == ["a", "b", "c", "d"]
    assert (step.claimed, step.delivered, step.failed) == (4, 3, 1)
    assert status_by_key() == {"a": "delivered", "b": "pending", "c": "delivered", "d": "delivered"}
    refused = OutboxMessage.objects.get(key="b")
    assert refused.last_error == "refused by the cluster" and refused.claim_token is None


def test_a_silent_acknowledgement_puts_the_destination_on_trial(db: None) -> None:
    enqueue(["a", "b", "c"])
    step = relay.outbox_relay_once(publish=LaterSink(silent={"a", "b", "c"}))
    assert step.timed_out and step.failed == 3 and step.delivered == 0
    assert set(status_by_key().values()) == {OutboxStatus.PENDING}
    assert all(row.next_attempt_at > timezone.now() for row in OutboxMessage.objects.all())


def test_a_sink_that_answers_within_the_call_is_marked_as_before(db: None) -> None:
    enqueue(["a", "b"])
    published: list[str] = []
    step = relay.outbox_relay_once(publish=lambda message, body: published.append(message.key))
    assert (step.delivered, published) == (2, ["a", "b"])


# --- the Kafka sink without a cluster -----------------------------------------------------------


@pytest.mark.parametrize(("url", "config"), [
    ("kafka://127.0.0.1:9092", {"bootstrap.servers": "127.0.0.1:9092"}),
    ("kafka://a:9092,b:9092/", {"bootstrap.servers": "a:9092,b:9092"}),
    ("kafka://relay:p%40ss@a:9093/?security.protocol=SASL_SSL&sasl.mechanism=SCRAM-SHA-512",
     {"bootstrap.servers": "a:9093", "sasl.username": "relay", "sasl.password": "p@ss",
      "security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512"}),
])
def test_the_url_says_where_and_how(url: str, config: dict[str, str]) -> None:
    assert kafka_client_config(url) == config


@pytest.mark.parametrize("url", ["amqp://localhost", "kafka://", "kafka:///?acks=0"])
def test_a_url_that_names_no_cluster_is_refused(url: str) -> None:
    with pytest.raises(ValueError):
        kafka_client_config(url)


def test_the_guarantees_cannot_be_turned_off_by_the_url() -> None:
    config = KafkaSink(url="kafka://127.0.0.1:1/?acks=0&enable.idempotence=false&linger.ms=50",
                       timeout=3).producer_config()
    assert (config["acks"], config["enable.idempotence"], config["message.timeout.ms"]) == ("all", True, 3000)


def test_messages_go_to_the_first_matching_route_else_the_default(settings: Any) -> None:
    settings.BACKPLANE_OUTBOX_KAFKA_TOPIC = "backplane.outbox"
    settings.BACKPLANE_OUTBOX_KAFKA_TOPICS = [("lifecycle", "backplane.tasks.#"), ("crm", "crm.*"), ("all", "#")]
    sink = KafkaSink(url="kafka://127.0.0.1:9092")
    assert [sink.kafka_topic(t) for t in ("backplane.tasks.research", "crm.scored", "crm.a.b")] == [
        "lifecycle", "crm", "all"]
    settings.BACKPLANE_OUTBOX_KAFKA_TOPICS = []
    assert KafkaSink(url="kafka://127.0.0.1:9092").kafka_topic("crm.scored") == "backplane.outbox"


def test_a_cluster_that_is_not_there_is_a_timed_out_attempt_on_the_row(db: None, settings: Any) -> None:
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    settings.BACKPLANE_OUTBOX_BROKER_URL = f"kafka://127.0.0.1:{port}"
    settings.BACKPLANE_OUTBOX_BROKER_TIMEOUT_SECONDS = 1
    enqueue(["a", "b"])
    sinks = Sinks()
    assert isinstance(sinks.broker, KafkaSink)
    started = time.monotonic()
    try:
        step = relay.outbox_relay_lane_once(policy=broker_policy(), publish=sinks, batch_size=100)
    finally:
        sinks.close()
    assert time.monotonic() - started < 8  # the lane's deadline, not the operating system's
    assert step.timed_out and step.failed == 1 and step.released == 1 and step.delivered == 0
    failed = OutboxMessage.objects.get(key="a")
    assert failed.status == "pending" and "did not answer" in failed.last_error and failed.attempts == 1
    assert OutboxMessage.objects.get(key="b").attempts == 0  # given back untried


def test_the_broker_lane_is_kombu_unless_the_url_is_kafka(settings: Any) -> None:
    settings.BACKPLANE_OUTBOX_BROKER_URL = "bpfilesystem://"
    assert isinstance(Sinks().broker, KombuSink)


def test_kafka_takes_the_product_s_own_messages_without_a_declared_route(settings: Any) -> None:
    settings.BACKPLANE_OUTBOX_QUEUES = []
    settings.BACKPLANE_OUTBOX_BROKER_TOPICS = []
    assert not broker_takes("backplane.tasks.research")
    settings.BACKPLANE_OUTBOX_BROKER_URL = "kafka://127.0.0.1:9092"
    assert broker_takes("backplane.tasks.research") and broker_takes("crm.scored")
