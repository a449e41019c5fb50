"""/healthz says the process is up; /readyz says whether the database and broker answer."""

from __future__ import annotations

from typing import Any

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



def test_healthz_answers_without_touching_the_database(
    client: Client,
    db: None,
    django_assert_num_queries: DjangoAssertNumQueries,
) -> None:
    with django_assert_num_queries(0):
        response = client.get("/healthz")
    assert response.status_code == 200 and response.json() == {"status": "ok"}


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
