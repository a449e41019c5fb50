"""The watchdog over periodic duties (backplane/runtime/duties.py): stamps, overdue, /readyz, /metrics."""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import pytest
from django.conf import settings
from django.db import connection
from django.test import Client
from django.utils import timezone

from backplane.celery import DUTY_SKIPPED, app
from backplane.runtime import duties
from backplane.runtime.models import Duty

# /readyz names its problems only to the metrics token or a staff session (backplane/health.py).
METRICS_TOKEN = "readyz-details-token-for-tests"
WITH_TOKEN = {"Authorization": f"Bearer {METRICS_TOKEN}"}


@pytest.fixture(autouse=True)
def metrics_token(settings: Any) -> None:
    settings.BACKPLANE_METRICS_TOKEN = METRICS_TOKEN



@pytest.fixture
def watched(settings: Any) -> None:
    settings.BACKPLANE_DUTY_WATCH = True


def test_beat_start_watches_every_scheduled_duty_and_forgets_the_rest(db: None) -> None:
    Duty.objects.create(name="a-duty-that-left-the-schedule", interval_seconds=5)
    assert duties.duties_watch_start() == len(settings.CELERY_BEAT_SCHEDULE)
    rows = {duty.name: duty for duty in Duty.objects.all()}
    assert set(rows) == set(settings.CELERY_BEAT_SCHEDULE)
    assert rows["detect-stalls"].interval_seconds == 2.0
    assert all(row.watch_started_at is not None and row.last_succeeded_at is None for row in rows.values())
    assert duties.duties_overdue() == []


def test_a_duty_run_through_celery_stamps_its_start_and_success(db: None) -> None:
    # The real task, run eagerly: Celery sends the same signals a worker does.
    app.tasks["backplane.tasks.seal_events"].apply()
    row = Duty.objects.get(name="seal-events")
    assert row.last_started_at is not None and row.last_succeeded_at is not None
    assert (row.runs_total, row.failures_total) == (1, 0)


def test_a_failed_run_is_counted_and_does_not_count_as_a_success(db: None) -> None:
    duties.duty_stamp(task_name="backplane.tasks.seal_events", outcome="failed", error="RuntimeError: no key")
    row = Duty.objects.get(name="seal-events")
    assert row.last_succeeded_at is None and row.last_error == "RuntimeError: no key"
    assert (row.runs_total, row.failures_total) == (1, 1)


def test_a_task_that_is_no_duty_is_not_stamped(db: None) -> None:
    assert duties.duty_stamp(task_name="backplane.tasks.verify_chains_requested", outcome="succeeded") is None
    assert not Duty.objects.exists()


def test_a_duty_is_overdue_after_three_intervals_and_never_before_the_floor(db: None) -> None:
    duties.duties_watch_start()
    now = timezone.now()
    # detect-stalls runs every 2 s: 3 intervals is under the floor, so the floor (10 s) decides.
    Duty.objects.filter(name="detect-stalls").update(watch_started_at=now - timedelta(seconds=9))
    # seal-events every 10 s: overdue after 30 s.
    Duty.objects.filter(name="seal-events").update(watch_started_at=now - timedelta(seconds=31),
                                                  last_succeeded_at=now - timedelta(seconds=31))
    assert [duty.name for duty in duties.duties_overdue(now=now)] == ["seal-events"]
    Duty.objects.filter(name="detect-stalls").update(watch_started_at=now - timedelta(seconds=11))
    assert [duty.name for duty in duties.duties_overdue(now=now)] == ["detect-stalls", "seal-events"]


def test_the_supervisor_sql_agrees_with_the_selector(db: None) -> None:
    from django.db import connection

    duties.duties_watch_start()
    Duty.objects.filter(name="relay-outbox").update(watch_started_at=timezone.now() - timedelta(minutes=5))
    with connection.cursor() as cursor:
        cursor.execute(duties.OVERDUE_SQL)
        rows = cursor.fetchall()
    assert [name for name, _age in rows] == ["relay-outbox"] == [d.name for d in duties.duties_overdue()]
    assert 299 < rows[0][1] < 400


def test_readyz_names_an_overdue_duty(client: Client, db: None, watched: None) -> None:
    duties.duties_watch_start()
    assert client.get("/readyz", headers=WITH_TOKEN).status_code == 200
    Duty.objects.filter(name="detect-stalls").update(watch_started_at=timezone.now() - timedelta(minutes=2))
    response = client.get("/readyz", headers=WITH_TOKEN)
    assert response.status_code == 503 and response["Retry-After"] == "5"
    problems = response.json()["error"]["details"]["problems"]
    assert len(problems) == 1 and problems[0].startswith("duty detect-stalls overdue"), problems


def test_the_traffic_probe_stays_green_while_a_duty_is_overdue(client: Client, db: None, watched: None) -> None:
    # The load balancer's probe: the API does not need beat, so a dead beat must not take the web out.
    Duty.objects.filter(name="detect-stalls").update(watch_started_at=timezone.now() - timedelta(minutes=2))
    assert client.get("/readyz", headers=WITH_TOKEN).status_code == 503
    assert client.get("/readyz/traffic").status_code == 200


def test_readyz_says_when_no_beat_ever_scheduled_the_duties(client: Client, db: None, watched: None) -> None:
    response = client.get("/readyz", headers=WITH_TOKEN)
    assert response.status_code == 503
    problems = response.json()["error"]["details"]["problems"]
    assert len(problems) == len(settings.CELERY_BEAT_SCHEDULE)
    assert all("is beat running?" in problem for problem in problems)


def test_readyz_quotes_the_error_of_a_duty_that_keeps_failing(
    client: Client, db: None, watched: None,
) -> None:
    duties.duties_watch_start()
    Duty.objects.filter(name="seal-events").update(watch_started_at=timezone.now() - timedelta(minutes=2))
    duties.duty_stamp(task_name="backplane.tasks.seal_events", outcome="failed", error="RuntimeError: no signing key")
    problems = client.get("/readyz", headers=WITH_TOKEN).json()["error"]["details"]["problems"]
    assert problems == [p for p in problems if "seal-events" in p] and "no signing key" in problems[0]


def test_metrics_export_each_duty_age_and_whether_it_is_overdue(client: Client, db: None) -> None:
    duties.duties_watch_start()
    Duty.objects.filter(name="relay-outbox").update(watch_started_at=timezone.now() - timedelta(minutes=1))
    text = client.get("/metrics", headers=WITH_TOKEN).content.decode()
    assert 'backplane_duty_overdue{duty="relay-outbox"} 1.0' in text
    assert 'backplane_duty_overdue{duty="detect-stalls"} 0.0' in text
    assert 'backplane_duty_last_success_age_seconds{duty="relay-outbox"}' in text
    assert 'backplane_duty_failures_total{duty="seal-events"} 0.0' in text


@pytest.mark.django_db(transaction=True)
def test_a_duty_whose_last_run_still_hangs_is_skipped_not_stacked() -> None:
    """Two runs of one duty in one worker process: the second returns at once, unstamped."""
    task = app.tasks["backplane.tasks.seal_events"]
    inside, release = threading.Event(), threading.Event()
    original = task.run

    def hanging_run(*args, **kwargs):  # type: ignore[no-untyped-def]
        inside.set()
        release.wait(10)
        return original(*args, **kwargs)

    def first_run() -> None:
        try:
            task.apply()
        finally:
            connection.close()  # this thread's own connection, before the test database is dropped

    task.run = hanging_run
    try:
        first = threading.Thread(target=first_run, daemon=True)
        first.start()
        assert inside.wait(10)
        assert task.apply().get() == DUTY_SKIPPED
        row = Duty.objects.get(name="seal-events")
        assert row.last_started_at is not None and row.last_succeeded_at is None
        release.set()
        first.join(10)
        assert Duty.objects.get(name="seal-events").last_succeeded_at is not None
    finally:
        release.set()
        first.join(10)
        task.run = original


def test_the_duties_command_lists_them_and_its_check_fails_on_an_overdue_one(db: None) -> None:
    import io

    from django.core.management import call_command

    duties.duties_watch_start()
    out = io.StringIO()
    call_command("duties", "--check", stdout=out)
    assert out.getvalue().count(" ok ") == len(settings.CELERY_BEAT_SCHEDULE)
    Duty.objects.filter(name="audit-export").update(watch_started_at=timezone.now() - timedelta(hours=4))
    out = io.StringIO()
    with pytest.raises(SystemExit) as exited:
        call_command("duties", "--check", stdout=out)
    assert exited.value.code == 1
    assert [line.split()[0] for line in out.getvalue().splitlines() if "OVERDUE" in line] == ["audit-export"]
