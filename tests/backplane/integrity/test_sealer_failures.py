"""A sealer that cannot seal is seen: a dead letter per distinct failure, /readyz, /metrics, and
in production no process starts without a signing key."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.test import Client
from django.utils import timezone

from backplane.celery import app
from backplane.delivery.models import DeadLetter, DeadLetterSource, DeadLetterStatus
from backplane.eventlog.models import Task
from backplane.integrity import sealing
from backplane.integrity.checks import check_signing_key
from backplane.runtime import duties
from backplane.runtime.models import Duty

REPO = Path(__file__).resolve().parents[3]
SEAL = "backplane.tasks.seal_events"


@pytest.fixture
def production_without_a_key(settings: Any) -> Iterator[None]:
    settings.IS_LOCAL = False
    settings.BACKPLANE_SIGNING_KEY = ""
    sealing.signing_key.cache_clear()
    yield
    sealing.signing_key.cache_clear()


def seal_once() -> None:
    # The real task, run eagerly: Celery sends the signals a worker sends, so the duty is stamped.
    result = app.tasks[SEAL].apply()
    assert result.failed()


def sealer_dead_letters() -> list[DeadLetter]:
    return list(DeadLetter.objects.filter(source=DeadLetterSource.AUDIT_EXPORT, reference__startswith="sealer: "))


def test_a_failing_sealer_is_one_dead_letter_however_often_it_runs(
    make_task: Callable[..., Task], production_without_a_key: None
) -> None:
    make_task()
    for _ in range(3):
        seal_once()
    [dead_letter] = sealer_dead_letters()
    assert dead_letter.status == DeadLetterStatus.PENDING
    assert dead_letter.attempts == 3
    assert dead_letter.error.startswith("ImproperlyConfigured: BACKPLANE_SIGNING_KEY must be set")
    assert dead_letter.payload == {"stage": "sealing"}
    assert Duty.objects.get(name="seal-events").failures_total == 3


def test_another_failure_is_another_dead_letter(make_task: Callable[..., Task], settings: Any) -> None:
    make_task()
    settings.BACKPLANE_SIGNING_KEY = "not hex"
    sealing.signing_key.cache_clear()
    try:
        seal_once()
        settings.BACKPLANE_SIGNING_KEY = "ab" * 31  # 31 bytes: hex, but not a seed
        sealing.signing_key.cache_clear()
        seal_once()
    finally:
        sealing.signing_key.cache_clear()
    assert sorted(d.reference.split(":")[1].strip() for d in sealer_dead_letters()) == ["ImproperlyConfigured"] * 2
    assert len({d.reference for d in sealer_dead_letters()}) == 2


def test_readyz_and_metrics_name_the_failing_sealer_and_its_error(
    client: Client, make_task: Callable[..., Task], production_without_a_key: None, settings: Any
) -> None:
    settings.BACKPLANE_DUTY_WATCH = True
    settings.BACKPLANE_METRICS_TOKEN = "scrape-token"
    duties.duties_watch_start()
    Duty.objects.update(watch_started_at=timezone.now() - timedelta(minutes=5))
    # The other duties are fine; only the sealer fails.
    Duty.objects.exclude(name="seal-events").update(last_succeeded_at=timezone.now())
    make_task()
    seal_once()

    # The details are for the scraper (its token) and staff; anonymous callers hear only "not ready".
    answer = client.get("/readyz", HTTP_AUTHORIZATION="Bearer scrape-token")
    assert answer.status_code == 503
    problems = answer.json()["error"]["details"]["problems"]
    assert len(problems) == 1
    assert problems[0].startswith("duty seal-events overdue")
    assert "last error: ImproperlyConfigured: BACKPLANE_SIGNING_KEY must be set" in problems[0]
    metrics = client.get("/metrics", HTTP_AUTHORIZATION="Bearer scrape-token").content.decode()
    assert 'backplane_duty_failures_total{duty="seal-events"} 1.0' in metrics
    assert 'backplane_duty_overdue{duty="seal-events"} 1.0' in metrics


def test_the_system_check_fails_in_production_without_a_key(production_without_a_key: None) -> None:
    [error] = check_signing_key()
    assert error.id == "backplane.E001" and "BACKPLANE_SIGNING_KEY" in error.msg
    with pytest.raises(SystemCheckError, match="backplane.E001"):
        call_command("check")


def test_the_system_check_passes_with_a_key_or_outside_production(settings: Any) -> None:
    assert check_signing_key() == []  # tests generate a key under var/
    settings.IS_LOCAL = False
    settings.BACKPLANE_SIGNING_KEY = "11" * 32
    sealing.signing_key.cache_clear()
    try:
        assert check_signing_key() == []
    finally:
        sealing.signing_key.cache_clear()


@pytest.mark.parametrize("key", ["", "11" * 32])
def test_the_web_application_refuses_to_load_in_production_without_a_key(tmp_path: Path, key: str) -> None:
    env = {
        "PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path), "BACKPLANE_VAR_DIR": str(tmp_path / "var"),
        "BACKPLANE_ENV": "production", "DATABASE_URL": "postgresql://app@localhost/backplane",
        "SECRET_KEY": "test", "ALLOWED_HOSTS": "localhost", "REDIS_URL": "redis://localhost:6379/0",
        "BACKPLANE_SIGNING_KEY": key,
    }
    done = subprocess.run([sys.executable, "-c", "import backplane.asgi"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
    if key:
        assert done.returncode == 0, done.stderr
    else:
        assert done.returncode != 0
        assert "ImproperlyConfigured: BACKPLANE_SIGNING_KEY must be set" in done.stderr
