"""The broker lane to Apache Kafka: the relay's sink when ``BACKPLANE_OUTBOX_BROKER_URL`` is a
``kafka://`` URL (docs/delivery.md, "Kafka").

The producer is confluent-kafka's (librdkafka, bundled in its wheel), chosen by measurement over
aiokafka (bench/kafka_clients.py, docs/benchmarks.md): more messages a second for a third of the
CPU, and a thread-safe synchronous API that fits the relay's threads without an event loop.

- Idempotent (``enable.idempotence``, hence ``acks=all``): a retry inside the producer never
  writes a message twice nor out of order. A retry by the relay (the row's next attempt) may:
  consumers drop repeats by the ``message_id`` header, as with every destination.
- The message key is the Kafka key, so a key's messages share a partition and keep their order.
- ``message_id``, ``namespace``, ``topic``, ``attempt`` and the W3C ``traceparent`` travel as
  headers as well as in the JSON envelope (the value), for consumers that route or trace
  without parsing it.
- A message counts as delivered only when its acknowledgement arrives: ``publish`` hands it to
  the producer and returns an ``Acknowledgement`` the relay waits for before marking the row
  (relay.py). librdkafka gives up on a message after the lane's timeout
  (``message.timeout.ms``), so every wait ends.

Kafka topics: a message goes to the first Kafka topic of ``BACKPLANE_OUTBOX_KAFKA_TOPICS`` whose
pattern matches its topic (AMQP patterns, as the queues' bindings), else to
``BACKPLANE_OUTBOX_KAFKA_TOPIC``. The set comes from settings, never from what agents send, so no
agent can make the cluster create topics; the sink creates the missing ones once, with the
cluster's default partitions and replication.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any
from urllib.parse import parse_qsl, unquote

from django.conf import settings

from backplane.delivery.models import OutboxMessage
from backplane.delivery.outbox import KAFKA_URL_SCHEME, broker_is_kafka, topic_matches
from backplane.delivery.relay import PublishError

logger = logging.getLogger(__name__)
# librdkafka's own lines (a broker down, a leader moved), through logging like every other line
# instead of raw on stderr; confluent-kafka hands them over inside poll() and flush().
librdkafka_logger = logging.getLogger("backplane.delivery.librdkafka")

# The properties the relay's guarantees rest on: a URL's query cannot change them.
_GUARANTEED = {"enable.idempotence": True, "acks": "all"}


def kafka_client_config(url: str) -> dict[str, Any]:
    """librdkafka's configuration from ``kafka://[user:password@]host:port[,host:port…][/?property=value…]``.

    The query names librdkafka properties (``security.protocol=SASL_SSL``,
    ``sasl.mechanism=SCRAM-SHA-512``, ``ssl.ca.location=…``); a user and password become
    ``sasl.username`` and ``sasl.password``."""
    if not broker_is_kafka(url):
        raise ValueError(f"not a Kafka URL (kafka://host:port,…): {url!r}")
    rest = url[len(KAFKA_URL_SCHEME):]
    location, _, query = rest.partition("?")
    location = location.rstrip("/")
    credentials, _, hosts = location.rpartition("@")
    if not hosts:
        raise ValueError(f"a Kafka URL names at least one host:port: {url!r}")
    config: dict[str, Any] = {"bootstrap.servers": hosts}
    if credentials:
        user, _, password = credentials.partition(":")
        config["sasl.username"], config["sasl.password"] = unquote(user), unquote(password)
    config.update(parse_qsl(query, keep_blank_values=False))
    return config


def settings_kafka_topics() -> list[str]:
    """Every Kafka topic the settings send messages to: the default and each route's."""
    return sorted({settings.BACKPLANE_OUTBOX_KAFKA_TOPIC,
                   *(kafka_topic for kafka_topic, _ in settings.BACKPLANE_OUTBOX_KAFKA_TOPICS)})


def create_missing_topics(client_config: dict[str, Any], names: list[str], *, timeout: float) -> None:
    """Create the Kafka topics of ``names`` that are missing, with the cluster's defaults. Best
    effort: where this principal may not create topics (ACLs), an operator has, and a topic that
    is still missing fails each publish to it, which is retried as always. A cluster that does not
    answer is a ``PublishError`` (timed out)."""
    from confluent_kafka.admin import AdminClient, NewTopic

    # confluent-kafka takes a logging.Logger as "logger", which its type stubs leave out.
    config: dict[str, Any] = {**client_config, "logger": librdkafka_logger,
                              "socket.connection.setup.timeout.ms": int(timeout * 1000)}
    admin = AdminClient(config)
    try:
        existing = set(admin.list_topics(timeout=timeout).topics)
        missing = [NewTopic(name, num_partitions=-1, replication_factor=-1) for name in names if name not in existing]
        for name, future in admin.create_topics(missing, request_timeout=timeout).items() if missing else ():
            try:
                future.result(timeout=timeout)
                logger.info("created Kafka topic %s", name)
            except Exception as exc:  # noqa: BLE001 - created by another process meanwhile, or not ours to create
                logger.info("Kafka topic %s not created: %s", name, exc)
    except Exception as exc:  # noqa: BLE001 - the cluster is not answering; the publishes say so too
        raise PublishError(f"kafka: the cluster at {client_config['bootstrap.servers']} did not answer: "
                           f"{exc}", timed_out=True) from exc


def producer_config(client_config: dict[str, Any], *, timeout: float) -> dict[str, Any]:
    """The producer of the outbox's sink and of the event stream (backplane/integrity/stream.py):
    the URL's settings, then what the guarantees rest on, which the URL cannot change."""
    timeout_ms = int(timeout * 1000)
    return {
        **client_config,
        # Gathers a claim's messages into few requests: its publishes come within a
        # millisecond of each other, and its acknowledgements are awaited together.
        "linger.ms": 5,
        # Java's partitioner (murmur2), which Kafka Connect's producer uses: a key's messages
        # keep their partition, hence their order, when the relay mode changes (cdc.py).
        "partitioner": "murmur2_random",
        "message.timeout.ms": timeout_ms,
        "socket.connection.setup.timeout.ms": timeout_ms,
        "logger": librdkafka_logger,
        **_GUARANTEED,
    }


class KafkaAcknowledgement:
    """One message's answer from the cluster, filled by the producer's delivery callback, which
    librdkafka runs inside ``poll``/``flush`` on the thread that calls them (the relay's)."""

    def __init__(self, producer: Any, kafka_topic: str) -> None:
        self._producer = producer
        self._kafka_topic = kafka_topic
        self._answered = False
        self._error: Any = None

    def on_delivery(self, error: Any, _message: Any) -> None:
        self._answered, self._error = True, error

    def wait(self, timeout: float) -> None:
        if not self._answered:
            # Serves every outstanding callback, so the claim's later acknowledgements are in too.
            self._producer.flush(timeout)
        if not self._answered:
            raise PublishError(f"kafka: no acknowledgement within {timeout:.0f} s (topic {self._kafka_topic!r})",
                               timed_out=True)
        if self._error is not None:
            from confluent_kafka import KafkaError

            raise PublishError(f"kafka: topic {self._kafka_topic!r}: {self._error.str()}",
                               timed_out=self._error.code() == KafkaError._MSG_TIMED_OUT)


class KafkaSink:
    """Publishes outbox messages to Kafka (module docstring). One per relay thread, like every
    sink: a producer per thread keeps each thread's waits its own."""

    def __init__(self, url: str | None = None, timeout: float | None = None) -> None:
        self.url = url or settings.BACKPLANE_OUTBOX_BROKER_URL
        self.timeout = float(timeout or settings.BACKPLANE_OUTBOX_BROKER_TIMEOUT_SECONDS)
        self.client_config = kafka_client_config(self.url)
        self.routes: list[tuple[str, str]] = list(settings.BACKPLANE_OUTBOX_KAFKA_TOPICS)
        self.default_topic: str = settings.BACKPLANE_OUTBOX_KAFKA_TOPIC
        self._producer: Any = None

    def kafka_topic(self, topic: str) -> str:
        return next((kafka_topic for kafka_topic, pattern in self.routes if topic_matches(pattern, topic)),
                    self.default_topic)

    def producer_config(self) -> dict[str, Any]:
        return producer_config(self.client_config, timeout=self.timeout)

    def _ensure_producer(self) -> Any:
        if self._producer is None:
            from confluent_kafka import Producer

            self._create_topics()
            self._producer = Producer(self.producer_config())
        return self._producer

    def _create_topics(self) -> None:
        create_missing_topics(self.client_config, settings_kafka_topics(), timeout=self.timeout)

    def publish(self, message: OutboxMessage, body: dict[str, Any]) -> KafkaAcknowledgement:
        from confluent_kafka import KafkaException

        producer = self._ensure_producer()
        kafka_topic = self.kafka_topic(message.topic)
        acknowledgement = KafkaAcknowledgement(producer, kafka_topic)
        headers = [("message_id", body["message_id"]), ("topic", message.topic),
                   ("attempt", str(body["headers"]["attempt"]))]
        if (namespace := message.headers.get("namespace")) is not None:
            headers.append(("namespace", str(namespace)))
        if traceparent := body["headers"].get("traceparent"):
            headers.append(("traceparent", traceparent))
        value = json.dumps(body, separators=(",", ":"), sort_keys=True).encode()
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                producer.produce(kafka_topic, value=value, key=message.key.encode() or None, headers=headers,
                                 on_delivery=acknowledgement.on_delivery)
                break
            except BufferError:
                # The producer's local queue is full: serve acknowledgements until there is room.
                if time.monotonic() >= deadline:
                    raise PublishError("kafka: the producer's queue stayed full", timed_out=True) from None
                producer.poll(0.05)
            except KafkaException as exc:
                raise PublishError(f"kafka: {exc}") from exc
        # Serve the callbacks of earlier messages that have their answers already.
        producer.poll(0)
        return acknowledgement

    def close(self) -> None:
        if self._producer is not None:
            # What is still in flight is acknowledged, or given up on and retried from its row.
            self._producer.flush(self.timeout)
        self._producer = None


# One per process, for /readyz: librdkafka's client keeps its connections and threads, so each
# probe is a metadata request, not a new client.
_probe_client: Any = None


def kafka_problem(timeout: float = 0.5) -> str | None:
    """Why the Kafka cluster of the broker URL cannot take messages now, or None: a metadata
    request within ``timeout`` seconds (the relay's rows wait meanwhile; /readyz says so)."""
    global _probe_client
    from confluent_kafka.admin import AdminClient

    config = kafka_client_config(settings.BACKPLANE_OUTBOX_BROKER_URL)
    if _probe_client is None or _probe_client[0] != config:
        # Silent: its answer is the probe's problem; the lines would repeat at every probe.
        _probe_client = (config, AdminClient({**config, "socket.connection.setup.timeout.ms": 1000, "log_level": 0}))
    try:
        metadata = _probe_client[1].list_topics(timeout=timeout)
    except Exception as exc:  # noqa: BLE001 - any client error means "cannot take messages"
        return f"outbox broker unreachable: Kafka at {config['bootstrap.servers']}: {exc.__class__.__name__}"
    if not metadata.brokers:
        return f"outbox broker unreachable: Kafka at {config['bootstrap.servers']}: no broker answers"
    return None
