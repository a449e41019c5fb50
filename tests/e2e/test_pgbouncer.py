"""The product behind PgBouncer in transaction pooling mode (docs/production.md, "PgBouncer").

Real processes: a PostgreSQL of its own (the embedded wheel, in a temporary directory, so the
suite's server keeps running and can be spared the SIGKILL), a private PgBouncer in front of it
(tests/support/pgbouncer.py, a pool of ``POOL_SIZE`` server connections), and the web process,
Celery worker and beat exactly as ``make run`` starts them, with the settings production uses for
this layout: ``DATABASE_URL`` through PgBouncer, ``DATABASE_DIRECT_URL`` beside it,
``BACKPLANE_DB_POOLER=transaction``, the connection pools on. ``migrate`` runs with those settings
too, so it takes the direct URL by itself. The tests run in file order on one layout; each one
checks its own writes.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from kombu import Connection, Exchange, Queue

from backplane.runtime import embedded_db
from backplane.runtime.env import database_from_url
from tests.support.celery_processes import CeleryProcesses
from tests.support.cluster import kill_postmaster
from tests.support.live_server import ROOT, WebProcess
from tests.support.pgbouncer import PgBouncer, pgbouncer_in_front_of
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow

POOL_SIZE = 4
AGENTS = 40


def _embedded(action: str, pgdata: Path) -> str:
    """``embedded_db`` in a fresh interpreter (the wheel caches one server handle per process)."""
    done = subprocess.run([sys.executable, "-m", "backplane.runtime.embedded_db", action, "--pgdata", str(pgdata)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@dataclass
class Layout:
    root: Path
    pgdata: Path
    direct_url: str
    bouncer: PgBouncer
    env: dict[str, str]
    web: WebProcess
    token: str

    @property
    def database(self) -> str:
        return str(database_from_url(self.direct_url)["NAME"])

    def manage(self, *args: str) -> str:
        done = subprocess.run([sys.executable, str(ROOT / "manage.py"), *args], cwd=ROOT, env=self.env,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    def agent(self) -> httpx.Client:
        """An agent with its own TCP connection to the web process."""
        return httpx.Client(base_url=self.web.url, headers={"Authorization": f"Bearer {self.token}"}, timeout=15)

    def server_backends(self) -> tuple[int, int]:
        """(backends PgBouncer holds, all client backends of the database but this one), from
        ``pg_stat_activity`` on a direct connection."""
        pids = self.bouncer.server_pids(self.database)
        with psycopg.connect(self.direct_url, autocommit=True) as conn:
            rows = conn.execute("SELECT pid FROM pg_stat_activity WHERE datname = %s AND backend_type = "
                                "'client backend' AND pid <> pg_backend_pid()", [self.database]).fetchall()
        backends = {int(pid) for (pid,) in rows}
        return len(backends & pids), len(backends)


@pytest.fixture(scope="module")
def layout() -> Iterator[Layout]:
    root = Path(tempfile.mkdtemp(prefix="bp-pgbouncer-"))
    root.chmod(0o755)
    pgdata, var_dir = root / "pgdata", root / "var"
    var_dir.mkdir()
    direct_url = _embedded("start", pgdata)
    bouncers = contextlib.ExitStack()
    web: WebProcess | None = None
    try:
        bouncer = bouncers.enter_context(pgbouncer_in_front_of(direct_url, pool_size=POOL_SIZE))
        env = {k: v for k, v in os.environ.items() if k != "DJANGO_ALLOW_ASYNC_UNSAFE"}
        env.update(
            DATABASE_URL=bouncer.url(str(database_from_url(direct_url)["NAME"])), DATABASE_DIRECT_URL=direct_url,
            BACKPLANE_DB_POOLER="transaction", BACKPLANE_DB_POOL="1", BACKPLANE_ENV="development",
            BACKPLANE_VAR_DIR=str(var_dir), BACKPLANE_DUTY_WATCH="0", PYTHONUNBUFFERED="1", LOG_LEVEL="WARNING",
            BACKPLANE_DEMO="0",
        )
        layout = Layout(root=root, pgdata=pgdata, direct_url=direct_url, bouncer=bouncer, env=env,
                        web=WebProcess(name="pgbouncer-web", env=env), token="")
        layout.manage("migrate", "--noinput")
        layout.token = layout.manage("create_agent", "bouncer-agent", "--namespace", "acme").strip()
        web = layout.web.start()
        yield layout
    finally:
        if web is not None:
            web.close()
        bouncers.close()
        _embedded("stop", pgdata)
        shutil.rmtree(root, ignore_errors=True)


# --- many agents, few server connections ---------------------------------------------------------


def _agent_run(layout: Layout, n: int) -> dict[str, Any]:
    """One agent's task from creation to completion over every kind of agent route, each answer checked."""
    with layout.agent() as agent:
        kind = f"bounced-{n}"
        created = agent.post("/api/v1/tasks/", json={"kind": kind, "input": {"n": n}})
        assert created.status_code == 201, created.text
        task_id = created.json()["task_id"]
        claimed = agent.post("/api/v1/leases/", json={"kinds": [kind], "lease_seconds": 60})
        assert claimed.status_code == 200, claimed.text
        epoch = claimed.json()["lease_epoch"]
        events = f"/api/v1/tasks/{task_id}/events/"
        for step in range(8):  # more than psycopg's prepare threshold (5) on the same statements
            beat = agent.post(f"/api/v1/tasks/{task_id}/heartbeat/", json={"lease_epoch": epoch})
            assert beat.status_code == 200, beat.text
            body = {"type": "ReasoningStepCompleted", "payload": {"step": step}, "idempotency_key": f"s{step}",
                    "lease_epoch": epoch}
            written = agent.post(events, json=body)
            assert written.status_code == 201, written.text
            replayed = agent.post(events, json=body)
            assert replayed.status_code == 200 and replayed.json() == written.json(), replayed.text
        noted = [{"type": "Noted", "payload": {"i": i}} for i in range(3)]
        batch = agent.post(f"{events}batch/", json={"lease_epoch": epoch, "events": noted})
        assert batch.status_code == 201, batch.text
        call = {"step": 9, "tool": "crm.write", "input": {"lead": n}, "lease_epoch": epoch}
        dispatched = agent.post(f"/api/v1/tasks/{task_id}/tool-calls/", json=call)
        assert dispatched.status_code == 201, dispatched.text
        key = dispatched.json()["idempotency_key"]
        answered = agent.post(f"/api/v1/tool-calls/{key}/result/",
                              json={"status": "succeeded", "result": {"id": n}, "lease_epoch": epoch})
        assert answered.status_code == 201, answered.text
        context = agent.get(f"/api/v1/tasks/{task_id}/recovery-context/")
        assert context.status_code == 200 and context.json()["task_id"] == task_id, context.text
        done = agent.post(events, json={"type": "TaskCompleted", "payload": {"output": {"n": n}}, "lease_epoch": epoch})
        assert done.status_code == 201, done.text
        listed = agent.get(events)
        assert listed.status_code == 200, listed.text
        verified = agent.get(f"/api/v1/tasks/{task_id}/verify/")
        assert verified.status_code == 200 and verified.json()["valid"] is True, verified.text
        return {"task_id": task_id, "seqs": [e["seq"] for e in listed.json()["results"]],
                "status": agent.get(f"/api/v1/tasks/{task_id}/").json()["status"]}


def test_many_agents_at_once_are_served_through_a_few_server_connections(layout: Layout) -> None:
    samples: list[tuple[int, int, int]] = []  # (PgBouncer's clients, its server backends, all backends)
    running = threading.Event()
    running.set()

    def sample() -> None:
        while running.is_set():
            clients = layout.bouncer.client_count(layout.database)
            samples.append((clients, *layout.server_backends()))
            time.sleep(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        with ThreadPoolExecutor(AGENTS) as pool:
            runs = list(pool.map(lambda n: _agent_run(layout, n), range(AGENTS)))
    finally:
        running.clear()
        sampler.join(timeout=10)

    assert len(runs) == AGENTS and len({run["task_id"] for run in runs}) == AGENTS
    for run in runs:
        # claim 2, 8 steps, 3 noted, the call and its answer 2, completed 1 after TaskCreated 1
        assert run["seqs"] == list(range(1, 17)) and run["status"] == "completed", run
    most_clients = max(clients for clients, _, _ in samples)
    most_servers = max(servers for _, servers, _ in samples)
    most_backends = max(backends for _, _, backends in samples)
    print(f"\n{AGENTS} agents at once: up to {most_clients} connections of the web process's pools to PgBouncer, "
          f"up to {most_servers} PostgreSQL backends behind it (pool size {POOL_SIZE}); "
          f"{most_backends} client backends on the database in all (the channel layer's direct ones included)")
    assert most_clients > POOL_SIZE, samples  # the pools asked for more than PgBouncer gives PostgreSQL
    assert 1 <= most_servers <= POOL_SIZE, samples
    # What else reaches PostgreSQL is the direct URL's: the channel layer's pool (4) and its listener.
    assert most_backends <= POOL_SIZE + 5, samples


def test_a_statement_prepared_by_name_breaks_through_pgbouncer_and_the_settings_prepare_none(
    layout: Layout,
) -> None:
    """Why BACKPLANE_DB_POOLER=transaction turns preparing off: the product's own threshold (5) on
    connections through PgBouncer 1.18 fails once two clients take turns on one server connection."""
    url = layout.bouncer.url(layout.database)
    clients = [psycopg.connect(url, autocommit=True, prepare_threshold=5) for _ in range(2)]
    errors: list[str] = []
    try:
        for n in range(8):
            for conn in clients:
                try:
                    conn.execute("SELECT %s::int + 1", [n]).fetchone()
                except psycopg.errors.DuplicatePreparedStatement as exc:
                    errors.append(str(exc))
                except psycopg.errors.InvalidSqlStatementName as exc:
                    errors.append(str(exc))
    finally:
        for conn in clients:
            conn.close()
    assert errors, "named prepared statements went through PgBouncer unharmed: is it still transaction pooling 1.18?"

    # What the product's processes use with these settings: no statement prepared by name, in
    # Django's connections and in the async pool built from them; server-side cursors off.
    script = ("from django.db import connections; from django.conf import settings; "
              "from backplane.runtime.async_pool import _connection_kwargs; "
              "layer = settings.CHANNEL_LAYERS['default']['CONFIG']; "
              "print(connections['default'].get_connection_params()['prepare_threshold'], "
              "_connection_kwargs()['prepare_threshold'], "
              "settings.DATABASES['default']['DISABLE_SERVER_SIDE_CURSORS'], layer['HOST'])")
    printed = layout.manage("shell", "--no-imports", "-c", script).split()
    # The channel layer (LISTEN, session locks, statements it prepares itself) connects directly.
    assert printed == ["None", "None", "True", str(database_from_url(layout.direct_url)["HOST"])], printed


# --- crashes --------------------------------------------------------------------------------


@dataclass
class Appenders:
    """Agents appending as fast as they can, each to its own task, retrying an unanswered append
    with the same idempotency key (as an agent does while the product restarts); every
    acknowledged append is kept, to be found exactly once later."""

    layout: Layout
    count: int = 8
    tasks: list[str] = field(default_factory=list)
    acks: list[tuple[str, str, int, str]] = field(default_factory=list)  # task, key, seq, hash
    failures: Counter[str] = field(default_factory=Counter)
    running: threading.Event = field(default_factory=threading.Event)
    threads: list[threading.Thread] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> Appenders:
        with self.layout.agent() as agent:
            for _ in range(self.count):
                created = agent.post("/api/v1/tasks/", json={"kind": "appending", "input": {}})
                assert created.status_code == 201, created.text
                self.tasks.append(created.json()["task_id"])
        self.running.set()
        self.threads = [threading.Thread(target=self._append, args=(task_id,), daemon=True) for task_id in self.tasks]
        for thread in self.threads:
            thread.start()
        return self

    def _append(self, task_id: str) -> None:
        agent = self.layout.agent()
        step = 0
        while self.running.is_set():
            step += 1
            key = f"step-{step}"
            body = {"type": "ReasoningStepCompleted", "payload": {"step": step}, "idempotency_key": key}
            while self.running.is_set():
                try:
                    answer = agent.post(f"/api/v1/tasks/{task_id}/events/", json=body, timeout=5)
                except httpx.HTTPError as exc:
                    self._failed(type(exc).__name__)
                    agent.close()
                    agent = self.layout.agent()
                    time.sleep(0.05)
                    continue
                if answer.status_code in (200, 201):
                    event = answer.json()
                    with self.lock:
                        self.acks.append((task_id, key, event["seq"], event["hash"]))
                    break
                assert answer.status_code == 503, answer.text  # unavailable for a moment, never anything else
                self._failed("503")
                time.sleep(0.05)
        agent.close()

    def _failed(self, what: str) -> None:
        with self.lock:
            self.failures[what] += 1

    def acked(self) -> int:
        with self.lock:
            return len(self.acks)

    def wait_for_more(self, than: int, *, timeout: float, what: str) -> float:
        started = time.monotonic()
        def details() -> str:
            return f"{self.failures}\n{self.layout.web.log()[-4000:]}\n{self.layout.bouncer.log()[-3000:]}"

        wait_until(lambda: self.acked() >= than + self.count, timeout=timeout, what=what, interval=0.02,
                   details=details)
        return time.monotonic() - started

    def stop(self) -> None:
        self.running.clear()
        for thread in self.threads:
            thread.join(timeout=30)

    def check_every_acknowledged_append_is_stored_once(self) -> None:
        assert self.acks
        with psycopg.connect(self.layout.direct_url) as conn:
            for task_id, key, seq, digest in self.acks:
                rows = conn.execute("SELECT seq, hash FROM backplane_event WHERE task_id = %s"
                                    " AND idempotency_key = %s", [task_id, key]).fetchall()
                assert rows == [(seq, digest)], f"{task_id} {key} acknowledged as seq {seq}, stored as {rows}"
        with self.layout.agent() as agent:
            for task_id in self.tasks:
                verified = agent.get(f"/api/v1/tasks/{task_id}/verify/")
                assert verified.status_code == 200 and verified.json()["valid"] is True, verified.text


def test_a_web_process_killed_under_append_load_loses_no_acknowledged_append(layout: Layout) -> None:
    appenders = Appenders(layout).start()
    try:
        appenders.wait_for_more(200, timeout=60, what="200 appends acknowledged through PgBouncer")
        before = appenders.acked()
        layout.web.kill()
        layout.web.start()
        took = appenders.wait_for_more(appenders.acked(), timeout=30, what="every agent appends again after the kill")
    finally:
        appenders.stop()
    appenders.check_every_acknowledged_append_is_stored_once()
    print(f"\nweb SIGKILLed after {before} acknowledged appends; appending again {took:.1f} s after the restart; "
          f"{len(appenders.acks)} acknowledged in all, every one stored once; "
          f"unanswered tries: {dict(appenders.failures)}")


def test_postgresql_killed_under_append_load_is_used_again_through_the_same_pgbouncer(layout: Layout) -> None:
    bouncer_pid = layout.bouncer.process.pid if layout.bouncer.process else None
    appenders = Appenders(layout).start()
    try:
        appenders.wait_for_more(200, timeout=60, what="200 appends acknowledged through PgBouncer")
        servers_before = layout.bouncer.server_pids(layout.database)
        postmaster = embedded_db.postmaster_pid(layout.pgdata)
        assert postmaster is not None
        kill_postmaster(postmaster, timeout=30)  # the postmaster and every backend: a crash of the machine
        killed_at = appenders.acked()
        time.sleep(1.0)  # down for a moment, while the agents keep trying
        wait_until(lambda: _started(layout.pgdata), timeout=60, what="PostgreSQL starts again on its data")
        back = time.monotonic()
        took = appenders.wait_for_more(appenders.acked(), timeout=30,
                                       what="every agent appends again once PostgreSQL is back")
    finally:
        appenders.stop()
    assert layout.bouncer.process is not None and layout.bouncer.process.poll() is None
    assert layout.bouncer.process.pid == bouncer_pid  # the same PgBouncer, reconnected by itself
    assert not (layout.bouncer.server_pids(layout.database) & servers_before)  # new backends behind it
    appenders.check_every_acknowledged_append_is_stored_once()
    print(f"\nPostgreSQL SIGKILLed after {killed_at} acknowledged appends; every agent appending again "
          f"{took:.1f} s after it was back (started {time.monotonic() - back:.1f} s ago); "
          f"unanswered tries meanwhile: {dict(appenders.failures)}")


def _started(pgdata: Path) -> bool:
    done = subprocess.run([sys.executable, "-m", "backplane.runtime.embedded_db", "start", "--pgdata", str(pgdata)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    return done.returncode == 0


# --- worker, beat and the relay ---------------------------------------------------------------


def test_worker_beat_and_the_relay_run_their_duties_and_deliver_the_outbox_through_pgbouncer(layout: Layout) -> None:
    var_dir = Path(layout.env["BACKPLANE_VAR_DIR"])
    broker = var_dir / "broker"
    # The relay's messages go to the filesystem broker under the shared var dir; a message no
    # queue is bound for is unroutable and never marked delivered.
    conn = Connection("bpfilesystem://", transport_options={
        "data_folder_in": str(broker / "queue"), "data_folder_out": str(broker / "queue"),
        "control_folder": str(broker / "control"), "processed_folder": str(broker / "processed"),
        "store_processed": False})
    queue = Queue(f"pgbouncer-{uuid.uuid4().hex[:8]}", Exchange("backplane", type="topic"), routing_key="#")
    processes = CeleryProcesses(env={k: v for k, v in layout.env.items()
                                     if k.startswith(("DATABASE_", "BACKPLANE_"))})
    topics = [f"leads.scored.{n}" for n in range(20)]
    with conn.SimpleQueue(queue) as received:
        try:
            processes.start("worker")
            processes.start("beat")
            since = time.time()
            with layout.agent() as agent:
                created = agent.post("/api/v1/tasks/", json={"kind": "relayed", "input": {}})
                assert created.status_code == 201, created.text
                task_id = created.json()["task_id"]
                for topic in topics:
                    written = agent.post(f"/api/v1/tasks/{task_id}/events/", json={
                        "type": "Noted", "payload": {}, "outbox": [{"topic": topic, "payload": {"score": 7}}]})
                    assert written.status_code == 201, written.text

            def delivered() -> bool:
                with psycopg.connect(layout.direct_url) as db:
                    row = db.execute("SELECT count(*) FROM backplane_outboxmessage WHERE topic = ANY(%s) "
                                     "AND status = 'delivered'", [topics]).fetchone()
                return row is not None and row[0] == len(topics)

            wait_until(delivered, timeout=60, what="the relay delivers every outbox message",
                       details=lambda: processes.log("worker")[-4000:])
            got = []
            while True:
                try:
                    message = received.get(timeout=2)
                except received.Empty:
                    break
                message.ack()
                got.append(message.delivery_info.get("routing_key"))
            assert sorted(t for t in got if t in topics) == sorted(topics), got

            def duties_ran() -> bool:
                with psycopg.connect(layout.direct_url) as db:
                    rows = db.execute("SELECT name FROM backplane_duty"
                                      " WHERE extract(epoch FROM last_succeeded_at) > %s", [since]).fetchall()
                return {"relay-outbox", "detect-stalls", "seal-events"} <= {name for (name,) in rows}

            wait_until(duties_ran, timeout=60, what="beat's short duties succeed on the worker through PgBouncer",
                       details=lambda: processes.log("worker")[-4000:] + processes.log("beat")[-2000:])
            for name in ("worker", "beat"):
                assert "prepared statement" not in processes.log(name), processes.log(name)[-4000:]
        finally:
            processes.stop()
            queue.bind(conn.default_channel).delete()
            conn.release()
