"""The outbox in one process: rows per destination, lifecycle messages, relay steps against
the real filesystem broker, backoff and dead letters against an unreachable one, webhooks
against a real HTTP server that checks the signature, pruning and the delivery figures."""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
from collections.abc import Callable
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from django.db import transaction
from django.utils import timezone

from backplane.delivery import outbox, relay
from backplane.delivery import selectors as delivery_selectors
from backplane.delivery.models import DeadLetter, OutboxMessage, OutboxStatus, WebhookSubscription
from backplane.delivery.sinks import KombuSink, Sinks
from backplane.eventlog import services
from backplane.eventlog.models import Task
from backplane.eventlog.writer import EventDraft, OutboxDraft

UNREACHABLE_BROKER = "redis://127.0.0.1:1/0"


def drain(simple: Any, limit: int = 1000) -> list[dict[str, Any]]:
    received: list[dict[str, Any]] = []
    while len(received) < limit:
        try:
            message = simple.get(timeout=0.2)
        except simple.Empty:
            break
        received.append(message.payload)
        message.ack()
    return received


def append_with_outbox(task, topic: str, payload: dict, key: str | None = None):  # type: ignore[no-untyped-def]
    return services.event_append(
        namespace=task.namespace, task_id=task.pk, agent="a",
        draft=EventDraft(type="Noted", payload={}, outbox=(OutboxDraft(topic=topic, payload=payload, key=key),)),
    ).events[0]


@pytest.mark.parametrize(
    ("pattern", "topic", "expected"),
    [
        ("leads.*", "leads.scored", True),
        ("leads.*", "leads.scored.high", False),
        ("leads.#", "leads.scored.high", True),
        ("#", "anything.at.all", True),
        ("backplane.tasks.*", "backplane.tasks.lead-qualification", True),
        ("*.scored", "leads.scored", True),
        ("leads.scored", "leads.lost", False),
        ("#.high", "leads.scored.high", True),
    ],
)
def test_topic_patterns_match_like_amqp(pattern: str, topic: str, expected: bool) -> None:
    assert outbox.topic_matches(pattern, topic) is expected


def test_a_message_gets_one_row_per_destination(make_task: Callable[..., Task]) -> None:
    WebhookSubscription.objects.create(name="crm", topic_pattern="leads.*", url="http://127.0.0.1:9/", secret="s")
    WebhookSubscription.objects.create(name="other", topic_pattern="billing.#", url="http://127.0.0.1:9/", secret="s")
    WebhookSubscription.objects.create(name="off", topic_pattern="#", url="http://127.0.0.1:9/", secret="s",
                                       is_active=False)
    task = make_task()
    event = append_with_outbox(task, "leads.scored", {"score": 7})
    rows = OutboxMessage.objects.filter(topic="leads.scored").order_by("id")
    assert [(r.destination, r.subscription.name if r.subscription else None) for r in rows] == [
        ("broker", None), ("webhook", "crm")]
    assert {r.event_position for r in rows} == {event.position}
    assert rows[0].message_id != rows[1].message_id


def test_lifecycle_messages_announce_pending_completed_and_failed(make_task: Callable[..., Task]) -> None:
    done = make_task(kind="scoring")
    services.event_append(namespace="acme", task_id=done.pk, agent="a",
                          draft=EventDraft(type="TaskCompleted", payload={"output": {"ok": True}}))
    failed = make_task(kind="scoring", max_attempts=1)
    services.event_append(namespace="acme", task_id=failed.pk, agent="a",
                          draft=EventDraft(type="TaskFailed", payload={"error": "x", "retryable": True}))
    seen = list(OutboxMessage.objects.filter(topic="backplane.tasks.scoring").order_by("id")
                .values_list("key", "payload__status"))
    assert seen == [(str(done.pk), "pending"), (str(done.pk), "completed"),
                    (str(failed.pk), "pending"), (str(failed.pk), "failed")]


def test_the_relay_publishes_envelopes_to_the_broker(make_task, broker_queue) -> None:  # type: ignore[no-untyped-def]
    task = make_task()
    event = append_with_outbox(task, "leads.scored", {"score": 7})
    sinks = Sinks()
    try:
        step = relay.outbox_relay_until_idle(publish=sinks, budget_seconds=5)
    finally:
        sinks.close()
    assert step.delivered == 2 and step.failed == 0  # the lifecycle message and ours
    received = {m["topic"]: m for m in drain(broker_queue)}
    message = received["leads.scored"]
    row = OutboxMessage.objects.get(topic="leads.scored")
    assert message["message_id"] == str(row.message_id) and message["payload"] == {"score": 7}
    assert message["headers"]["event_hash"] == event.hash and message["headers"]["attempt"] == 1
    assert row.status == "delivered" and row.delivered_at is not None
    assert relay.outbox_relay_once(publish=sinks).claimed == 0


def test_an_unreachable_broker_backs_off_then_dead_letters_once(
    make_task: Callable[..., Task],
    settings: Any,
) -> None:
    settings.BACKPLANE_OUTBOX_MAX_ATTEMPTS = 3
    task = make_task()
    # The task's lifecycle message is the backplane's, ordered apart from the agent's (docs/delivery.md).
    OutboxMessage.objects.all().delete()
    append_with_outbox(task, "leads.scored", {"score": 7})
    append_with_outbox(task, "leads.scored", {"score": 8})
    OutboxMessage.objects.update(next_attempt_at=timezone.now())
    broken = Sinks(broker=KombuSink(url=UNREACHABLE_BROKER))
    for attempt in (1, 2):
        step = relay.outbox_relay_once(publish=broken)
        # Two rows of one key: the first fails, the second is not even claimed (per-key order).
        assert (step.claimed, step.failed, step.delivered) == (1, 1, 0)
        first = OutboxMessage.objects.earliest("id")
        assert first.next_attempt_at is not None
        assert first.attempts == attempt and first.next_attempt_at > timezone.now() and first.last_error
        OutboxMessage.objects.update(next_attempt_at=timezone.now())
    step = relay.outbox_relay_once(publish=broken)
    assert step.dead == 1
    first = OutboxMessage.objects.earliest("id")
    (dead_letter,) = DeadLetter.objects.all()
    assert first.status == "dead" and dead_letter.outbox_message_id == first.pk and dead_letter.attempts == 3
    assert dead_letter.source == "outbox" and dead_letter.task_id == task.pk and "broker" in dead_letter.error
    assert delivery_selectors.outbox_stats().dead_letters_pending == 1


def test_a_requeued_dead_letter_is_delivered_once(make_task, settings, broker_queue) -> None:  # type: ignore[no-untyped-def]
    from recovery import dead_letters

    settings.BACKPLANE_OUTBOX_MAX_ATTEMPTS = 1
    task = make_task()
    append_with_outbox(task, "leads.scored", {"score": 7})
    OutboxMessage.objects.filter(topic="leads.scored").update(key="separate-key")
    relay.outbox_relay_once(publish=Sinks(broker=KombuSink(url=UNREACHABLE_BROKER)))
    dead_letter = DeadLetter.objects.get(topic="leads.scored")
    dead_letters.dead_letter_requeue(dead_letter_id=dead_letter.pk, decided_by="user:op", reason="broker is back",
                                     payload={"score": 8})
    relay.outbox_relay_until_idle(publish=Sinks(), budget_seconds=5)
    received = [m for m in drain(broker_queue) if m["topic"] == "leads.scored"]
    assert len(received) == 1 and received[0]["payload"] == {"score": 8}
    assert OutboxMessage.objects.get(topic="leads.scored").status == "delivered"


def _enqueue_direct(key: str, count: int) -> list[int]:
    """Rows straight into the outbox (the relay's input), without tasks, in one transaction."""
    now = timezone.now()
    with transaction.atomic():
        return [
            outbox.outbox_enqueue(topic="bench.t", key=key, payload={"n": n}, headers={}, now=now)[0].pk
            for n in range(count)
        ]


class _Recorder:
    def __init__(self, failing_keys: set[str] = frozenset()) -> None:  # type: ignore[assignment]
        self.published: list[tuple[str, int]] = []
        self.failing_keys = failing_keys

    def __call__(self, message: OutboxMessage, body: dict[str, Any]) -> None:
        if message.key in self.failing_keys:
            raise relay.PublishError("refused")
        self.published.append((message.key, body["payload"]["n"]))


def test_a_batch_takes_the_head_of_every_key_and_keeps_key_order(db: None) -> None:
    for key in ("a", "b", "c"):
        _enqueue_direct(key, 5)
    recorder = _Recorder()
    first = relay.outbox_relay_once(publish=recorder, batch_size=100)
    assert first.claimed == 3 and sorted(recorder.published) == [("a", 0), ("b", 0), ("c", 0)]
    relay.outbox_relay_until_idle(publish=recorder, budget_seconds=10, batch_size=100)
    for key in ("a", "b", "c"):
        assert [n for k, n in recorder.published if k == key] == [0, 1, 2, 3, 4]


def test_a_key_backing_off_does_not_starve_keys_beyond_the_claim_window(db: None) -> None:
    # Key "stuck": its head fails and backs off; its 60 successors stay due and fill the
    # window (2 x batch 10 = 20 oldest due rows) without one of them being claimable.
    _enqueue_direct("stuck", 61)
    _enqueue_direct("late", 1)
    recorder = _Recorder(failing_keys={"stuck"})
    assert relay.outbox_relay_once(publish=recorder, batch_size=10).failed == 1
    recorder.failing_keys = set()
    step = relay.outbox_relay_once(publish=recorder, batch_size=10)
    assert step.delivered == 1 and recorder.published == [("late", 0)]
    assert OutboxMessage.objects.filter(key="stuck", status="pending").count() == 61


class _SignedReceiver(BaseHTTPRequestHandler):
    secret = "whsec-test"
    received: list[dict[str, Any]] = []
    status = 204

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        body = self.rfile.read(int(self.headers["Content-Length"]))
        fields = dict(part.split("=", 1) for part in self.headers["Backplane-Signature"].split(","))
        expected = hmac.new(self.secret.encode(), f"{fields['t']}.".encode() + body, hashlib.sha256).hexdigest()
        valid = hmac.compare_digest(expected, fields["v1"])
        type(self).received.append({"valid": valid, "body": json.loads(body),
                                    "message_id": self.headers["Backplane-Message-Id"]})
        self.send_response(type(self).status if valid else 400)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def webhook_server():  # type: ignore[no-untyped-def]
    _SignedReceiver.received = []
    _SignedReceiver.status = 204
    server = ThreadingHTTPServer(("127.0.0.1", 0), _SignedReceiver)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def test_webhooks_are_signed_and_2xx_means_delivered(make_task, webhook_server, settings) -> None:  # type: ignore[no-untyped-def]
    settings.BACKPLANE_OUTBOX_MAX_ATTEMPTS = 2
    url = f"http://127.0.0.1:{webhook_server.server_address[1]}/hook"
    WebhookSubscription.objects.create(name="crm", topic_pattern="leads.*", url=url, secret="whsec-test")
    task = make_task()
    append_with_outbox(task, "leads.scored", {"score": 7})
    sinks = Sinks()
    relay.outbox_relay_until_idle(publish=sinks, budget_seconds=5)
    (call,) = _SignedReceiver.received
    row = OutboxMessage.objects.get(destination="webhook")
    assert call["valid"] and call["message_id"] == str(row.message_id) and call["body"]["payload"] == {"score": 7}
    assert row.status == "delivered"

    # A receiver answering 500 is a failure: retried, then dead-lettered.
    _SignedReceiver.status = 500
    append_with_outbox(task, "leads.scored", {"score": 9})
    for _ in range(2):
        OutboxMessage.objects.filter(status="pending").update(next_attempt_at=timezone.now())
        relay.outbox_relay_until_idle(publish=sinks, budget_seconds=5)
    failed = OutboxMessage.objects.filter(destination="webhook").latest("id")
    assert failed.status == "dead" and "HTTP 500" in failed.last_error
    sinks.close()


def test_the_webhook_signature_is_verifiable_by_the_consumer_helper() -> None:
    from backplane.delivery.sinks import webhook_signature

    client = pytest.importorskip("backplane_client.signing")
    body = b'{"message_id":"m"}'
    header = webhook_signature("s3cret", body, 1_800_000_000)
    assert client.verify("s3cret", header, body, now=1_800_000_010) == 1_800_000_000


def test_delivered_rows_are_pruned_after_the_retention(make_task: Callable[..., Task], broker_queue: Any) -> None:
    make_task()
    relay.outbox_relay_until_idle(publish=Sinks(), budget_seconds=5)
    OutboxMessage.objects.update(delivered_at=timezone.now() - timedelta(days=2))
    assert relay.outbox_prune_delivered() == 1
    assert relay.outbox_prune_delivered() == 0 and not OutboxMessage.objects.exists()


def test_stats_report_lag_and_counts(make_task: Callable[..., Task], broker_queue: Any) -> None:
    make_task()
    OutboxMessage.objects.update(created_at=timezone.now() - timedelta(seconds=30))
    stats = delivery_selectors.outbox_stats()
    assert stats.pending == 1 and 29 <= stats.lag_seconds <= 60 and stats.delivered == 0
    relay.outbox_relay_until_idle(publish=Sinks(), budget_seconds=5)
    stats = delivery_selectors.outbox_stats()
    assert (stats.pending, stats.delivered, stats.lag_seconds) == (0, 1, 0.0)
    assert OutboxStatus.DELIVERED.value == "delivered"
