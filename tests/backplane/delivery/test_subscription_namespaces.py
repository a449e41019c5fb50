"""A webhook subscription limited to namespaces gets their messages only, as the real relay POSTs
them to a real HTTP endpoint; an empty list means every namespace's (docs/delivery.md)."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import transaction
from django.test import Client
from django.utils import timezone

from backplane.delivery import outbox, relay
from backplane.delivery.models import OutboxMessage, WebhookSubscription
from backplane.delivery.sinks import Sinks
from backplane.eventlog import services
from backplane.eventlog.models import Task
from backplane.eventlog.writer import EventDraft, OutboxDraft


class Receiver(BaseHTTPRequestHandler):
    """Records (path, topic, namespace header) of every POST and answers 204."""

    received: list[tuple[str, str, str | None]] = []
    lock = threading.Lock()

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with type(self).lock:
            type(self).received.append((self.path, body["topic"], body["headers"]["namespace"]))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass

    @classmethod
    def at(cls, path: str) -> list[tuple[str, str | None]]:
        with cls.lock:
            return sorted(((t, n) for p, t, n in cls.received if p == path), key=repr)


@pytest.fixture
def endpoint() -> Iterator[str]:
    Receiver.received = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def subscribe(name: str, url: str, namespaces: list[str]) -> WebhookSubscription:
    return WebhookSubscription.objects.create(name=name, topic_pattern="#", url=url, secret="s",
                                              namespaces=namespaces, max_attempts=1)


def note(task: Task) -> None:
    services.event_append(namespace=task.namespace, task_id=task.pk, agent="agent", draft=EventDraft(
        type="Noted", payload={}, outbox=(OutboxDraft(topic="leads.scored", payload={}, key="lead-1"),)))


def test_a_subscription_limited_to_a_namespace_gets_none_of_anothers_messages(
    endpoint: str, make_task: Callable[..., Task], broker_queue: Any
) -> None:
    subscribe("only-a", f"{endpoint}/a", ["acc-a"])
    subscribe("a-and-c", f"{endpoint}/ac", ["acc-a", "acc-c"])
    subscribe("everyone", f"{endpoint}/all", [])
    for namespace in ("acc-a", "acc-b"):
        note(make_task(namespace=namespace))  # its lifecycle message ("pending"), then the agent's
    with transaction.atomic():
        # An alert (recovery/alerts.py) concerns no namespace: only unlimited subscriptions get it.
        outbox.outbox_enqueue(topic="backplane.alerts", key="alert:1", payload={}, headers={}, now=timezone.now())

    relay.outbox_relay_until_idle(publish=Sinks(), budget_seconds=10)

    lifecycle = "backplane.tasks.lead-qualification"
    ours = [(lifecycle, "acc-a"), ("leads.scored", "acc-a")]
    assert Receiver.at("/a") == ours
    assert Receiver.at("/ac") == ours
    assert Receiver.at("/all") == sorted([*ours, (lifecycle, "acc-b"), ("leads.scored", "acc-b"),
                                          ("backplane.alerts", None)], key=repr)
    # The broker gets every message: consumers filter on the namespace header.
    assert OutboxMessage.objects.filter(subscription=None).count() == 5
    assert not OutboxMessage.objects.exclude(status="delivered").exists()


@pytest.fixture
def staff_client(db: None) -> Client:
    client = Client()
    client.force_login(User.objects.create_superuser("root", "", "pw-for-tests-only"))
    return client


def test_an_administrator_limits_a_subscription_to_namespaces_in_the_admin(staff_client: Client) -> None:
    form = {"name": "crm", "topic_pattern": "leads.#", "url": "https://crm.example.com/hook", "secret": "s",
            "is_active": "on", "ordering": "strict", "timeout_seconds": "5", "max_concurrency": "2"}
    assert 'name="namespaces"' in staff_client.get("/admin/backplane/webhooksubscription/add/").content.decode()
    response = staff_client.post("/admin/backplane/webhooksubscription/add/", {**form, "namespaces": "acc-a,acc-b"})
    assert response.status_code == 302, response.content.decode()[:2000]
    assert WebhookSubscription.objects.get(name="crm").namespaces == ["acc-a", "acc-b"]
    refused = staff_client.post("/admin/backplane/webhooksubscription/add/",
                                {**form, "name": "bad", "namespaces": "acc-a,not a namespace"})
    assert refused.status_code == 200 and not WebhookSubscription.objects.filter(name="bad").exists()
