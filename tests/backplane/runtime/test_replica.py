"""The read replica's routing and verdict where no streaming replica is needed: none configured,
one that does not answer, one that is not a standby. The real replica's tests (replay paused,
lag, stopped and back) are in tests/e2e/test_read_replica.py."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.db import DEFAULT_DB_ALIAS, connection
from django.test import Client

from backplane.eventlog import services
from backplane.eventlog.models import Task
from backplane.runtime import replica
from backplane.runtime.replica import REPLICA, ReplicaRouter, lsn_value, reads_connection, replica_reads, replica_state
from tests.backplane.runtime.replica_support import replica_alias
from tests.backplane.telemetry.metrics_scrape import scrape
from tests.support.roles import staff_user

ROOT = Path(__file__).resolve().parents[3]


def settings_with(**environ: str) -> dict[str, object]:
    """The replica's DATABASES entry and the routers, as a process started with ``environ`` has them."""
    script = ("import django, json; django.setup(); from django.conf import settings; "
              "print(json.dumps({'replica': settings.DATABASES.get('replica'), "
              "'routers': settings.DATABASE_ROUTERS}, default=str))")
    env = {name: value for name, value in os.environ.items() if name != "DATABASE_REPLICA_URL"}
    env.update(DJANGO_SETTINGS_MODULE="backplane.settings", **environ)
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=60, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_settings_add_the_replica_and_its_router_only_when_its_url_is_set() -> None:
    assert settings_with() == {"replica": None, "routers": []}
    configured = settings_with(
        DATABASE_URL="postgresql://app:pw@db1:5432,db2:5432/backplane?target_session_attrs=read-write",
        DATABASE_REPLICA_URL="postgresql://app:pw@replica:5432/backplane", BACKPLANE_DB_POOL="1")
    replica_entry = configured["replica"]
    assert isinstance(replica_entry, dict)
    assert (replica_entry["HOST"], replica_entry["NAME"]) == ("replica", "backplane")
    # The primary's pool and timeout, not its read-write target, which every standby would refuse.
    assert set(replica_entry["OPTIONS"]) == {"connect_timeout", "pool"}
    assert replica_entry["TEST"]["MIRROR"] == "default"
    assert configured["routers"] == ["backplane.runtime.replica.ReplicaRouter"]


@pytest.fixture
def olivia_client(db: None) -> Client:
    client = Client()
    client.force_login(staff_user("olivia", "Operators", password="correct horse battery"))
    return client


def test_it_orders_wal_positions_like_postgresql() -> None:
    assert lsn_value("0/16B3748") == 0x16B3748
    assert lsn_value("1/0") > lsn_value("0/FFFFFFFF")


def test_without_a_replica_url_everything_reads_the_primary(olivia_client: Client) -> None:
    seen: list[str] = []

    @replica_reads
    def view() -> None:
        seen.append(reads_connection().alias)

    view()
    assert seen == [DEFAULT_DB_ALIAS]
    assert not replica_state().configured
    assert olivia_client.get("/readyz").json() == {"status": "ready"}
    assert not {name for name in scrape(olivia_client).names if name.startswith("backplane_replica_")}


def test_the_router_sends_every_write_to_the_primary_and_leaves_djangos_own_tables_alone(db: None) -> None:
    router = ReplicaRouter()
    task = Task(namespace="acme", kind="k")
    task._state.db = REPLICA  # as if a page had read it from the replica
    assert router.db_for_write(Task, instance=task) == DEFAULT_DB_ALIAS
    assert router.db_for_read(Task) == DEFAULT_DB_ALIAS  # outside replica_reads
    assert router.db_for_read(User) is None
    assert router.allow_migrate(REPLICA, "backplane") is False


def test_an_unreachable_replica_falls_back_to_the_primary_and_says_so(
    olivia_client: Client, caplog: pytest.LogCaptureFixture,
) -> None:
    services.task_create(namespace="acme", kind="fallback-visible", input={}, agent="planner")
    with replica_alias(host="/nonexistent-socket-dir", port="5499"), caplog.at_level(logging.WARNING):
        page = olivia_client.get("/tasks/")
        assert page.status_code == 200 and b"fallback-visible" in page.content
        ready = olivia_client.get("/readyz")
        assert ready.status_code == 200
        assert ready.json()["replica"].startswith("fallback: unreachable"), ready.json()
        metrics = scrape(olivia_client)
        assert metrics.value("backplane_replica_usable") == 0
        assert ("backplane_replica_lag_seconds", ()) not in metrics.samples
    warnings = [r for r in caplog.records if r.name == replica.__name__ and "fallback" in r.getMessage()]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]  # once per change, not per check


def test_a_replica_that_is_not_a_standby_is_not_used(db: None) -> None:
    # The primary itself, named as the replica: it is not in recovery, so it could be a promoted
    # former replica that no longer receives the primary's writes.
    settings = connection.settings_dict
    with replica_alias(host=settings["HOST"], port=settings["PORT"]):
        state = replica_state()
    assert (state.usable, state.summary) == (False, "fallback: not a standby (promoted, or not a replica)")


def test_a_verdict_is_reused_within_a_second_and_checked_again_after(db: None) -> None:
    with replica_alias(host="/nonexistent-socket-dir", port="5499"):
        first = replica_state()
        assert replica_state() is first  # the cached path: no check
        again = replica_state(max_age=0)  # the checking path
    assert again is not first and again.checked_at > first.checked_at
    assert again.problem == first.problem
