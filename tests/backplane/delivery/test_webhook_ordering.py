"""Strict and best-effort ordering against a real HTTP endpoint, delivered by the lanes
(backplane/delivery/lanes.py) in their threads, as the worker delivers.

The endpoint is down long enough for the first message of a key to become a dead letter (the
subscriptions retry twice, without delay). Then it is back: the strict subscription gets none of
that key's later messages until a reviewer decides the dead letter, and after a requeue the key
arrives in its original order; the best-effort subscription gets them at once, and the requeued
message after them, as docs/delivery.md says.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from django.db import transaction
from django.utils import timezone

from backplane.delivery import outbox
from backplane.delivery import selectors as delivery_selectors
from backplane.delivery.lanes import LaneRunner
from backplane.delivery.models import DeadLetter, OutboxMessage, WebhookSubscription
from recovery import dead_letters

from .relay_harness import wait_until

pytestmark = pytest.mark.django_db(transaction=True)


class Endpoint(BaseHTTPRequestHandler):
    """Answers 503 while ``down``; otherwise records (path, key, n, attempt) and answers 204."""

    down = True
    received: list[tuple[str, str, int, int]] = []
    lock = threading.Lock()

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if type(self).down:
            self.send_response(503)
        else:
            with type(self).lock:
                type(self).received.append((self.path, body["key"], body["payload"]["n"], body["headers"]["attempt"]))
            self.send_response(204)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass

    @classmethod
    def keys_at(cls, path: str, key: str) -> list[int]:
        with cls.lock:
            return [n for p, k, n, _ in cls.received if p == path and k == key]


@pytest.fixture
def endpoint() -> Iterator[str]:
    Endpoint.down, Endpoint.received = True, []
    server = ThreadingHTTPServer(("127.0.0.1", 0), Endpoint)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture
def lanes() -> Iterator[LaneRunner]:
    runner = LaneRunner(threads=6, batch_size=20)
    yield runner
    runner.stop()


def enqueue(key: str, numbers: range) -> None:
    now = timezone.now()
    with transaction.atomic():
        for n in numbers:
            outbox.outbox_enqueue(topic=f"orders.{key}", key=key, payload={"n": n}, headers={}, now=now)


def tick_until(lanes: LaneRunner, condition: Any, what: str, timeout: float = 30) -> None:
    def ticked() -> bool:
        lanes.tick()
        return bool(condition())

    wait_until(ticked, timeout=timeout, what=what, interval=0.05)


def tick_for(lanes: LaneRunner, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        lanes.tick()
        time.sleep(0.05)


def test_strict_holds_a_key_behind_its_dead_letter_and_best_effort_lets_it_go_on(
    endpoint: str, lanes: LaneRunner
) -> None:
    retries = {"max_attempts": 2, "retry_base_seconds": 0, "timeout_seconds": 2, "secret": "s",
               "topic_pattern": "orders.#"}
    strict = WebhookSubscription.objects.create(name="strict", url=f"{endpoint}/strict", ordering="strict", **retries)
    best = WebhookSubscription.objects.create(name="best", url=f"{endpoint}/best", ordering="best_effort", **retries)

    # 1. The endpoint is down: the first message of key "k" dies at both subscriptions. (Only
    #    the head: later ones enqueued now would die too at the best-effort one, which goes on.)
    enqueue("k", range(1))
    tick_until(lanes, lambda: DeadLetter.objects.count() == 2, "the head of k is dead at both")
    strict_letter = DeadLetter.objects.get(outbox_message__subscription=strict)
    best_letter = DeadLetter.objects.get(outbox_message__subscription=best)
    assert strict_letter.attempts == best_letter.attempts == 2

    # 2. It is back. Key "l" goes through at both; k's later messages only at the best-effort one.
    Endpoint.down = False
    enqueue("k", range(1, 3))
    enqueue("l", range(2))
    tick_until(lanes, lambda: Endpoint.keys_at("/strict", "l") == [0, 1] and Endpoint.keys_at("/best", "k") == [1, 2],
               "l everywhere and k at the best-effort endpoint")
    tick_for(lanes, 1.0)  # time enough for a wrong delivery of k to the strict endpoint
    assert Endpoint.keys_at("/strict", "k") == []
    assert delivery_selectors.dead_letter_waiting_behind(strict_letter.pk) == 2
    assert delivery_selectors.dead_letter_waiting_behind(best_letter.pk) == 0

    # 3. Requeued: at the strict endpoint the key arrives in its original order, from attempt 1;
    #    at the best-effort one the requeued message comes after the ones that went on.
    dead_letters.dead_letter_requeue(dead_letter_id=strict_letter.pk, decided_by="user:rita", reason="endpoint back")
    dead_letters.dead_letter_requeue(dead_letter_id=best_letter.pk, decided_by="user:rita", reason="endpoint back")
    tick_until(lanes, lambda: len(Endpoint.keys_at("/strict", "k")) == 3 and len(Endpoint.keys_at("/best", "k")) == 3,
               "the requeued messages are delivered")
    assert Endpoint.keys_at("/strict", "k") == [0, 1, 2]
    assert Endpoint.keys_at("/best", "k") == [1, 2, 0]
    with Endpoint.lock:
        first_attempts = {(p, n): a for p, k, n, a in Endpoint.received if k == "k" and n == 0}
    assert first_attempts == {("/strict", 0): 1, ("/best", 0): 1}
    # The endpoint records a message before it answers: the relay marks it delivered just after.
    tick_until(lanes, lambda: not OutboxMessage.objects.filter(status="pending").exclude(subscription=None).exists(),
               "every webhook message is marked delivered")
