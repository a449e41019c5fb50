"""/readyz tells an anonymous caller only ready or not; what is wrong (an overdue duty, the
database's error) only with the metrics token or a staff session (backplane/health.py)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from backplane.runtime import duties
from backplane.runtime.models import Duty
from tests.support.roles import staff_user

TOKEN = "readyz-token-for-tests"


@pytest.fixture
def overdue(db: None, settings: Any) -> None:
    """A duty that stopped running, and a deployment with a metrics token."""
    settings.BACKPLANE_DUTY_WATCH = True
    settings.BACKPLANE_METRICS_TOKEN = TOKEN
    duties.duties_watch_start()
    Duty.objects.filter(name="detect-stalls").update(watch_started_at=timezone.now() - timedelta(minutes=2))


def test_it_tells_an_anonymous_caller_only_that_it_is_not_ready(client: Client, overdue: None) -> None:
    response = client.get("/readyz")
    assert response.status_code == 503 and response["Retry-After"] == "5"
    assert response.json() == {"error": {"code": "unavailable", "message": "not ready", "details": {}}}
    assert b"detect-stalls" not in response.content


def test_it_refuses_the_details_to_a_wrong_token(client: Client, overdue: None) -> None:
    response = client.get("/readyz", HTTP_AUTHORIZATION="Bearer not-the-token")
    assert response.status_code == 503 and response.json()["error"]["details"] == {}


def test_it_names_the_overdue_duty_to_the_metrics_token(client: Client, overdue: None) -> None:
    response = client.get("/readyz", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert response.status_code == 503
    problems = response.json()["error"]["details"]["problems"]
    assert len(problems) == 1 and problems[0].startswith("duty detect-stalls overdue"), problems


def test_it_names_the_overdue_duty_to_a_staff_session(client: Client, overdue: None) -> None:
    client.force_login(staff_user("vera", "Viewers"))
    response = client.get("/readyz")
    assert response.status_code == 503
    assert response.json()["error"]["details"]["problems"][0].startswith("duty detect-stalls overdue")


def test_it_keeps_the_traffic_probe_as_it_was(client: Client, overdue: None) -> None:
    assert client.get("/readyz/traffic").status_code == 200
