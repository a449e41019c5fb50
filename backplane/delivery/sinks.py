"""Where relayed messages go: the broker through kombu (or Kafka: kafka_sink.py), and signed webhooks."""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import socket
import time
from typing import Any

import httpx
from django.conf import settings
from kombu import Connection, Exchange, Queue

from backplane.delivery.kafka_sink import KafkaSink
from backplane.delivery.models import OutboxDestination, OutboxMessage
from backplane.delivery.outbound import OutboundRefused, outbound_client
from backplane.delivery.outbox import broker_is_kafka
from backplane.delivery.relay import Acknowledgement, PublishError

logger = logging.getLogger(__name__)


def webhook_signature(secret: str, body: bytes, timestamp: int) -> str:
    """``t=<unix seconds>,v1=<hex HMAC-SHA256 over "<t>." + body>``, in the style of Stripe's."""
    digest = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={timestamp},v1={digest}"


def _transport_headers(body: dict[str, Any], headers: dict[str, str]) -> dict[str, str]:
    """The transport's own headers plus the envelope's W3C ``traceparent``, where consumers'
    instrumentations look for it (a broker message's headers, an HTTP request's). While tracing
    is on, httpx's instrumentation replaces the webhook's with its client span's, the child."""
    traceparent = body.get("headers", {}).get("traceparent")
    return {**headers, "traceparent": traceparent} if traceparent else headers


# RabbitMQ through py-amqp: publisher confirms and mandatory publishes (KombuSink).
AMQP_URL_SCHEMES = ("amqp://", "amqps://", "pyamqp://")


class KombuSink:
    """Publishes to a topic exchange, routing key = topic, persistent messages.

    Keeps one connection (per relay thread) and reconnects after a failure; a publish that
    fails raises PublishError so the relay backs the row off. On every connect it declares the
    exchange and the queues of ``BACKPLANE_OUTBOX_QUEUES`` with their bindings.

    A topic exchange drops a message that no bound queue matches and still accepts the publish,
    so "published" is not "delivered". When no queue takes the topic, the publish fails as
    *unroutable* and the message waits on the relay's backoff like any failed attempt, then
    becomes a dead letter, instead of being marked delivered. Consumers declare their queues
    before the product publishes what they need (docs/delivery.md). How the sink learns it:

    - on RabbitMQ (``amqp://``, ``amqps://``, ``pyamqp://``) each publish is ``mandatory`` and
      waits for the broker's publisher confirm; an unroutable message comes back as a
      ``basic.return`` before its confirm, and a publish that is not confirmed (nacked, timed
      out, connection lost) fails. The queues it declares there are durable quorum queues;
    - on kombu's virtual transports (filesystem, Redis) it asks the broker's binding table
      before each publish (``_routes_to_a_queue``).
    """

    def __init__(self, url: str | None = None, exchange_name: str | None = None,
                 queues: list[tuple[str, str]] | None = None, timeout: float | None = None) -> None:
        self.url = url or settings.BACKPLANE_OUTBOX_BROKER_URL
        self.exchange = Exchange(exchange_name or settings.BACKPLANE_OUTBOX_EXCHANGE, type="topic", durable=True)
        self.confirms = self.url.startswith(AMQP_URL_SCHEMES)
        # Quorum queues only on RabbitMQ: the virtual transports have no queue types, and
        # RabbitMQ refuses to redeclare an existing queue with another type.
        queue_arguments = {"x-queue-type": "quorum"} if self.confirms else None
        self.queues = [
            Queue(name, self.exchange, routing_key=binding, durable=True, queue_arguments=queue_arguments)
            for name, binding in (settings.BACKPLANE_OUTBOX_QUEUES if queues is None else queues)
        ]
        self.timeout = float(timeout or settings.BACKPLANE_OUTBOX_BROKER_TIMEOUT_SECONDS)
        self._connection: Connection | None = None
        self._producer: Any = None
        # message_id of each message RabbitMQ returned as unroutable, until its publish reads it.
        self._returned: set[str] = set()

    def _ensure_producer(self) -> Any:
        if self._producer is None:
            options = dict(settings.CELERY_BROKER_TRANSPORT_OPTIONS) if self.url == settings.CELERY_BROKER_URL else {}
            if self.url.startswith(("redis://", "rediss://")):
                # The publish deadline: a Redis that stops answering fails the publish instead of
                # holding the relay's thread for the operating system's TCP timeout.
                options.setdefault("socket_timeout", self.timeout)
                options.setdefault("socket_connect_timeout", self.timeout)
            if self.confirms:
                # py-amqp then waits for the broker's basic.ack after each basic.publish and
                # raises MessageNacked on a basic.nack.
                options["confirm_publish"] = True
            self._connection = Connection(self.url, transport_options=options, connect_timeout=self.timeout)
            # No retries here: the relay's backoff is the retry policy.
            self._connection.ensure_connection(max_retries=0, timeout=self.timeout)
            self._returned.clear()
            # Only py-amqp's channels deliver returns (kombu's virtual channels have no events).
            on_return = self._on_return if self.confirms else None
            self._producer = self._connection.Producer(serializer="json", on_return=on_return)
            channel = self._producer.channel
            self.exchange(channel).declare()
            for queue in self.queues:
                queue(channel).declare()
        return self._producer

    def publish(self, message: OutboxMessage, body: dict[str, Any]) -> None:
        try:
            producer = self._ensure_producer()
            message_id = str(message.message_id)
            if not self.confirms and not self._routes_to_a_queue(producer.channel, message.topic):
                raise self._unroutable(message.topic)
            producer.publish(
                body,
                exchange=self.exchange,
                routing_key=message.topic,
                delivery_mode=2,
                message_id=message_id,
                headers=_transport_headers(body, {"backplane-message-id": message_id}),
                retry=False,
                mandatory=self.confirms,
                # With confirms, the wait for the broker's basic.ack is bounded by this too.
                timeout=self.timeout if self.confirms else None,
            )
            # RabbitMQ sends an unroutable mandatory message's basic.return before its basic.ack,
            # on the same channel, and the publish above returned only after reading that ack:
            # a return for this message has been seen by now. Publishes on a channel are one at
            # a time, and the return is matched by message_id all the same, so a return is never
            # blamed on another message.
            if message_id in self._returned:
                self._returned.discard(message_id)
                raise self._unroutable(message.topic)
        except PublishError:
            raise
        except Exception as exc:  # noqa: BLE001 - kombu raises many transport-specific errors
            self.close()
            timed_out = isinstance(exc, (TimeoutError, socket.timeout)) or "timed out" in str(exc).lower()
            raise PublishError(f"broker: {exc.__class__.__name__}: {exc}", timed_out=timed_out) from exc

    def _on_return(self, exc: Exception, exchange: str, routing_key: str, returned: Any) -> None:
        """py-amqp's ``basic_return`` handler: called while a publish waits for its confirm.

        Without a handler py-amqp raises the return from inside that wait, leaving the message's
        basic.ack unread on the channel, where the next publish would take it for its own.
        """
        message_id = (getattr(returned, "properties", None) or {}).get("message_id")
        logger.info("broker returned message %s (exchange %r, routing key %r): %s",
                    message_id, exchange, routing_key, exc)
        if message_id:
            self._returned.add(str(message_id))

    def _unroutable(self, topic: str) -> PublishError:
        return PublishError(
            f"unroutable: no queue is bound to exchange {self.exchange.name!r} for topic "
            f"{topic!r}; declare the consumer's queue (docs/delivery.md) and the "
            "message goes out at its next attempt")

    def _routes_to_a_queue(self, channel: Any, topic: str) -> bool:
        """Whether a queue is bound for ``topic`` now, read from the broker's own binding table.

        The Redis and filesystem transports (kombu's virtual transports, the ones this product
        runs on) keep the bindings in the broker, shared by every process, and route in the
        publisher with ``_lookup``; it is kombu's private method, pinned with kombu and covered
        by tests/backplane/delivery/test_outbox_unroutable.py. A binding removed between this check and
        the publish still loses that one message: the broker gives no answer to wait for.
        """
        lookup = getattr(channel, "_lookup", None)
        if lookup is None:
            # Neither a virtual transport nor AMQP (whose confirms and returns say it instead).
            raise PublishError(f"broker: the {type(channel).__module__} transport cannot say whether a message "
                               "is routed, so the relay does not publish to it")
        return bool(lookup(self.exchange.name, topic))

    def close(self) -> None:
        if self._connection is not None:
            try:
                self._connection.release()
            except Exception:  # noqa: BLE001 - the connection is being thrown away anyway
                logger.debug("closing a broken broker connection failed", exc_info=True)
        self._connection = None
        self._producer = None


class WebhookSink:
    """POSTs the envelope with a Backplane-Signature header; any 2xx means delivered.

    The subscription's ``timeout_seconds`` is the deadline of the whole delivery: httpx's
    timeouts apply to each network operation (connect, send, each read), so the answer is read
    in chunks against the deadline as well (httpx has no total timeout, encode/httpx#1450).
    """

    # Enough of an answer to show in an error; the rest is not read.
    ANSWER_BYTES_KEPT = 4096

    def __init__(self) -> None:
        # Connects only to public or allowed addresses, never follows a redirect (outbound.py).
        self.client = outbound_client()

    def publish(self, message: OutboxMessage, body: dict[str, Any]) -> None:
        subscription = message.subscription
        if subscription is None:
            raise PublishError("webhook message without a subscription")
        raw = json.dumps(body, separators=(",", ":"), sort_keys=True).encode()
        headers = {
            "Content-Type": "application/json",
            "Backplane-Signature": webhook_signature(subscription.secret, raw, int(time.time())),
            "Backplane-Message-Id": str(message.message_id),
            "User-Agent": "agent-backplane-relay/1",
        }
        headers = _transport_headers(body, headers)
        timeout = float(max(1, subscription.timeout_seconds))
        deadline = time.monotonic() + timeout
        try:
            with self.client.stream("POST", subscription.url, content=raw, headers=headers,
                                    timeout=timeout) as response:
                answer = b""
                for chunk in response.iter_raw():
                    if time.monotonic() > deadline:
                        raise httpx.ReadTimeout("the answer took longer than the deadline")
                    answer += chunk[: self.ANSWER_BYTES_KEPT - len(answer)]
                    if len(answer) >= self.ANSWER_BYTES_KEPT:
                        break
        except OutboundRefused as exc:
            # A failed attempt like a refused connection: retried, then a dead letter, with the reason.
            raise PublishError(f"webhook {subscription.name}: {exc}") from exc
        except httpx.HTTPError as exc:
            raise PublishError(f"webhook {subscription.name}: {exc.__class__.__name__}: {exc}",
                               timed_out=isinstance(exc, httpx.TimeoutException)) from exc
        if not 200 <= response.status_code < 300:
            text = answer.decode(errors="replace")[:200]
            raise PublishError(f"webhook {subscription.name}: HTTP {response.status_code}: {text}")

    def close(self) -> None:
        self.client.close()


class Sinks:
    """A publisher for the relay: sends each message to the sink its destination names. Not
    thread-safe: each relay thread has its own (backplane/delivery/lanes.py)."""

    def __init__(self, broker: KombuSink | KafkaSink | None = None, webhooks: WebhookSink | None = None) -> None:
        # The broker URL's scheme says which: kafka:// for Kafka, any other for kombu.
        self.broker = broker or (KafkaSink() if broker_is_kafka() else KombuSink())
        self.webhooks = webhooks or WebhookSink()

    def __call__(self, message: OutboxMessage, body: dict[str, Any]) -> Acknowledgement | None:
        if message.destination == OutboxDestination.WEBHOOK:
            self.webhooks.publish(message, body)
            return None
        return self.broker.publish(message, body)

    def close(self) -> None:
        self.broker.close()
        self.webhooks.close()
