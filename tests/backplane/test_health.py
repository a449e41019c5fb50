"""/healthz says the process is up; /readyz says whether the database and broker answer."""

from __future__ import annotations

import asyncio
import socket
import time
from typing import Any

import httpx
import pytest
from django.db import connection
from django.test import Client
from pytest_django import DjangoAssertNumQueries

# /readyz names its problems only to the metrics token or a staff session (backplane/health.py).
METRICS_TOKEN = "readyz-details-token-for-tests"
WITH_TOKEN = {"Authorization": f"Bearer {METRICS_TOKEN}"}


@pytest.fixture(autouse=True)
def metrics_token(settings: Any) -> None:
    settings.BACKPLANE_METRICS_TOKEN = METRICS_TOKEN



class Front:
    """The HTTP front as the server runs it (backplane/asgi.py): its own routes, Django behind,
    called over ASGI."""

    def __init__(self) -> None:
        from backplane import asgi

        self.app = asgi.http_front

    def request(self, method: str, path: str) -> httpx.Response:
        async def call() -> httpx.Response:
            transport = httpx.ASGITransport(app=self.app)
            async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as http:
                return await http.request(method, path)

        return asyncio.run(call())

    def get(self, path: str) -> httpx.Response:
        return self.request("GET", path)


@pytest.fixture
def front() -> Front:
    return Front()


def test_healthz_answers_before_django_without_touching_the_database(
    front: Front,
    db: None,
    django_assert_num_queries: DjangoAssertNumQueries,
) -> None:
    with django_assert_num_queries(0):
        response = front.get("/healthz")
        head = front.request("HEAD", "/healthz")
    assert response.status_code == 200 and response.json() == {"status": "ok"}
    assert response.headers["content-type"] == "application/json"
    assert head.status_code == 200 and head.content == b""
    refused = front.request("POST", "/healthz")
    assert refused.status_code == 405 and set(refused.headers["allow"].split(", ")) == {"GET", "HEAD"}
    # Django never routes it: its URL conf has no such path.
    assert Client().get("/healthz").status_code == 404


def test_the_front_hands_every_other_path_to_django_as_it_came(front: Front, transactional_db: None) -> None:
    assert front.get("/readyz/traffic").json() == {"status": "ready"}
    # Not redirected to /healthz by the front: Django answers the path it was sent.
    assert front.get("/healthz/").status_code == 404
    api = front.get("/api/v1/tasks")
    assert api.status_code == 401 and api.json()["error"]["code"] == "not_authenticated"


def test_readyz_is_200_with_the_database_up(client: Client, db: None) -> None:
    response = client.get("/readyz", headers=WITH_TOKEN)
    assert response.status_code == 200, response.content


@pytest.mark.django_db(transaction=True)
def test_readyz_is_503_when_the_database_is_unreachable(client: Client) -> None:
    # Point this process's connection at a socket directory with no server in it: a real
    # connection failure, not a patched function.
    saved = dict(connection.settings_dict)
    connection.close()
    connection.settings_dict["HOST"] = "/nonexistent-socket-dir"
    connection.settings_dict["PORT"] = "5499"
    try:
        response = client.get("/readyz", headers=WITH_TOKEN)
    finally:
        connection.close()
        connection.settings_dict.clear()
        connection.settings_dict.update(saved)
    assert response.status_code == 503
    body = response.json()
    assert body["error"]["code"] == "unavailable"
    assert any("database" in p for p in body["error"]["details"]["problems"])
    assert response["Retry-After"] == "5"


def test_readyz_says_when_the_outbox_s_kafka_does_not_answer_and_traffic_still_flows(
    client: Client, db: None, settings: Any,
) -> None:
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    settings.BACKPLANE_OUTBOX_BROKER_URL = f"kafka://127.0.0.1:{port}"
    started = time.monotonic()
    response = client.get("/readyz", headers=WITH_TOKEN)
    assert time.monotonic() - started < 3
    assert response.status_code == 503
    assert response.json()["error"]["details"]["problems"] == [
        f"outbox broker unreachable: Kafka at 127.0.0.1:{port}: KafkaException"]
    # The API serves without it: the messages wait in the outbox.
    assert client.get("/readyz/traffic").status_code == 200
