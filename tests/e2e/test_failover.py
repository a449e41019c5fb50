"""Failover under append load: a three-member Patroni cluster (tests/support/cluster.py), the
product's web process, worker and beat, many agents appending; in the two supported layouts:

- ``direct``: ``DATABASE_URL`` is the multi-host URL, and libpq's ``target_session_attrs`` finds
  the primary;
- ``pgbouncer``: ``DATABASE_URL`` through a PgBouncer in transaction pooling mode
  (``BACKPLANE_DB_POOLER=transaction``, the multi-host URL as ``DATABASE_DIRECT_URL``), which the
  leader watch (backplane/runtime/leader_watch.py) keeps on the primary, run as a process of its own
  with the command line docs/production.md ("PgBouncer") gives operators.

Under load, the primary's postmaster is SIGKILLed, then (once the cluster is whole again) the new
leader's Patroni. Every acknowledged event (201, or 200 for a replay) must then be on the new
primary exactly once, with the seq and hash the agent was told; the chains verify; the web process
is the one started at the beginning. Each layout prints the seconds from each kill to the first
append the new primary acknowledged, and the module prints both layouts' figures side by side.
The figures go to docs/benchmarks.md ("Failover").
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess
import sys
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from tests.support.celery_processes import CeleryProcesses
from tests.support.cluster import PatroniCluster
from tests.support.live_server import WebProcess
from tests.support.pgbouncer import PgBouncer, pgbouncer_in_front_of
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

# httpx logs every request at INFO: thousands of lines that would bury a failure's report.
logging.getLogger("httpx").setLevel(logging.WARNING)

ROOT = Path(__file__).resolve().parents[2]
AGENTS = 12
STEPS_PER_TASK = 25
# Acknowledged appends to see between faults, so each fault lands on a fleet in full flow.
ACKS_BETWEEN_FAULTS = 300
# PgBouncer's server connections: fewer than the web process's pools alone hold, as in production.
POOL_SIZE = 8


@dataclass(frozen=True)
class Ack:
    task_id: str
    seq: int
    key: str
    hash: str


@dataclass(frozen=True)
class Outcome:
    started: float
    ended: float
    ok: bool
    append: bool


@dataclass
class Fleet:
    """Agents in threads, each appending to its own tasks with an idempotency key per step and
    sending the same request again after any error until it is acknowledged."""

    base_url: str
    tokens: list[str]
    stop: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)
    acks: list[Ack] = field(default_factory=list)
    outcomes: list[Outcome] = field(default_factory=list)
    statuses: dict[int | str, int] = field(default_factory=lambda: defaultdict(int))
    unexpected: list[str] = field(default_factory=list)
    threads: list[threading.Thread] = field(default_factory=list)

    def start(self) -> None:
        for index, token in enumerate(self.tokens):
            thread = threading.Thread(target=self._agent, args=(token,), name=f"agent-{index}", daemon=True)
            thread.start()
            self.threads.append(thread)

    def finish(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=30)
        assert not [t.name for t in self.threads if t.is_alive()], "an agent thread never finished"

    def ack_count(self) -> int:
        with self.lock:
            return len(self.acks)

    def _agent(self, token: str) -> None:
        with httpx.Client(base_url=self.base_url, headers={"Authorization": f"Bearer {token}"},
                          timeout=httpx.Timeout(10.0, connect=2.0)) as client:
            while not self.stop.is_set():
                task_id = str(uuid.uuid4())
                if self._send(client, "/api/v1/tasks/", {"task_id": task_id, "kind": "failover-drill",
                                                         "input": {"drill": True}}) is None:
                    return
                for step in range(1, STEPS_PER_TASK + 1):
                    key = f"{task_id}:{step}"
                    body = self._send(client, f"/api/v1/tasks/{task_id}/events/", {
                        "type": "ReasoningStepCompleted", "payload": {"step": step}, "idempotency_key": key})
                    if body is None:
                        return
                    with self.lock:
                        self.acks.append(Ack(task_id, int(body["seq"]), key, str(body["hash"])))

    def _send(self, client: httpx.Client, path: str, body: dict[str, Any]) -> dict[str, Any] | None:
        """POST until acknowledged; None once the fleet is stopping (the outcome is then unknown,
        so nothing is recorded as acknowledged)."""
        while not self.stop.is_set():
            started = time.monotonic()
            try:
                answer = client.post(path, json=body)
            except httpx.HTTPError as exc:
                self._note(path, started, ok=False, status=exc.__class__.__name__)
                time.sleep(0.05)
                continue
            if answer.status_code in (200, 201):
                self._note(path, started, ok=True, status=answer.status_code)
                return dict(answer.json())
            self._note(path, started, ok=False, status=answer.status_code)
            if answer.status_code == 429 or answer.status_code >= 500:
                time.sleep(0.05)
                continue
            with self.lock:
                self.unexpected.append(f"{path} {answer.status_code} {answer.text[:300]}")
            return None
        return None

    def _note(self, path: str, started: float, *, ok: bool, status: int | str) -> None:
        with self.lock:
            self.outcomes.append(Outcome(started, time.monotonic(), ok, path.endswith("/events/")))
            self.statuses[status] += 1

    def outage_after(self, moment: float) -> float:
        """Seconds from the first failed request that ended after ``moment`` to the first
        acknowledged request sent after that failure (0 when nothing failed)."""
        with self.lock:
            outcomes = list(self.outcomes)
        errors = [o.ended for o in outcomes if not o.ok and o.ended >= moment]
        if not errors:
            return 0.0
        first_error = min(errors)
        recovered = [o.ended for o in outcomes if o.ok and o.started >= first_error]
        assert recovered, "no request succeeded after the failover"
        return min(recovered) - first_error

    def first_append_after(self, kill: float) -> float:
        """Seconds from ``kill`` to the first append the new primary acknowledged: the first
        acknowledged append sent after the first failure that followed the kill. The failure marks
        the old primary's end: a SIGKILLed Patroni leaves its PostgreSQL taking appends until the
        watchdog fences it, and those are the old primary's, not the new one's."""
        with self.lock:
            outcomes = list(self.outcomes)
        errors = [o.ended for o in outcomes if not o.ok and o.ended >= kill]
        since = min(errors) if errors else kill
        acknowledged = [o.ended for o in outcomes if o.ok and o.append and o.started >= since]
        assert acknowledged, "no append was acknowledged after the failover"
        return min(acknowledged) - kill


def manage(env: dict[str, str], *args: str) -> str:
    result = subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, f"manage.py {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}"
    return result.stdout


CREATE_AGENTS = """
import json
from backplane.eventlog import services
print(json.dumps([services.agent_create(name=f"drill-{i}", namespace="drill").token for i in range({count})]))
"""


@pytest.fixture
def cluster() -> Iterator[PatroniCluster]:
    cluster = PatroniCluster()
    try:
        yield cluster.start()
    finally:
        cluster.stop()


@dataclass
class Layout:
    """How the product's processes reach the cluster: ``env`` holds their database settings."""

    name: str
    env: dict[str, str]
    bouncer: PgBouncer | None = None
    watch: subprocess.Popen[bytes] | None = None

    @property
    def watch_log_path(self) -> Path:
        assert self.bouncer is not None
        return self.bouncer.base / "leader-watch.log"

    def retargets(self) -> list[tuple[float, int]]:
        """(wall-clock time, PostgreSQL port) of each "now points at" line the leader watch logged."""
        moments = []
        for line in self.watch_log_path.read_text(errors="replace").splitlines():
            if " leader watch: PgBouncer now points at " in line:
                stamp, _, rest = line.partition(" leader watch: PgBouncer now points at ")
                moments.append((datetime.fromisoformat(stamp).timestamp(), int(rest.split()[0].rsplit(":", 1)[1])))
        return moments

    def bouncer_port(self) -> int:
        """The PostgreSQL port PgBouncer sends the ``backplane`` database to (``SHOW DATABASES``)."""
        assert self.bouncer is not None
        rows = [row for row in self.bouncer.admin("SHOW DATABASES") if row["name"] == "backplane"]
        assert len(rows) == 1, rows
        return int(rows[0]["port"])


@contextlib.contextmanager
def database_layout(name: str, cluster: PatroniCluster) -> Iterator[Layout]:
    direct = cluster.database_url()
    if name == "direct":
        yield Layout(name, {"DATABASE_URL": direct})
        return
    with pgbouncer_in_front_of(cluster.member_url(cluster.leader()), pool_size=POOL_SIZE) as bouncer:
        layout = Layout(name, {"DATABASE_URL": bouncer.url("backplane"), "DATABASE_DIRECT_URL": direct,
                               "BACKPLANE_DB_POOLER": "transaction"}, bouncer)
        # The operator's command line (docs/production.md, "PgBouncer"), interval and all.
        argv = [sys.executable, "-m", "backplane.runtime.leader_watch", "--databases-file", str(bouncer.databases_path),
                "--admin-url", bouncer.url("pgbouncer")]
        for member in cluster.watched_members():
            argv += ["--member", f"{member.api_url}={member.host}:{member.port}"]
        with layout.watch_log_path.open("ab") as log:
            layout.watch = subprocess.Popen(argv, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                            start_new_session=True)
        try:
            # Its first look points PgBouncer where it already points: the watch is then running.
            wait_until(layout.retargets, timeout=30, what="the leader watch finds the primary",
                       details=lambda: layout.watch_log_path.read_text(errors="replace"))
            yield layout
        finally:
            layout.watch.terminate()
            layout.watch.wait(timeout=15)


@pytest.fixture(scope="module")
def first_append_seconds() -> Iterator[dict[str, tuple[float, float]]]:
    """Each layout's seconds from each kill to the first append acknowledged after it, printed side
    by side once the module's tests ran."""
    figures: dict[str, tuple[float, float]] = {}
    yield figures
    print("\nkill to first append acknowledged by the new primary (postmaster SIGKILL, Patroni SIGKILL): "
          + "; ".join(f"{name} {first:.1f} s, {second:.1f} s" for name, (first, second) in figures.items()))


def first_traceback(log: str, size: int = 8000) -> str:
    """The log from its first traceback on (a 500's cause), or its tail when it holds none."""
    start = log.find("Traceback")
    return log[start:start + size] if start >= 0 else log[-size:]


def stored_events(cluster: PatroniCluster) -> dict[str, list[tuple[str, int, str]]]:
    """The events on the current primary, by idempotency key: [(task, seq, hash), …]."""
    rows: dict[str, list[tuple[str, int, str]]] = defaultdict(list)
    with psycopg.connect(cluster.member_url(cluster.leader())) as conn:
        in_recovery = conn.execute("SELECT pg_is_in_recovery()").fetchone()
        assert in_recovery == (False,), "the leader is not a primary"
        for task_id, seq, key, hash_ in conn.execute(
                "SELECT task_id::text, seq, idempotency_key, hash FROM backplane_event "
                "WHERE idempotency_key IS NOT NULL"):
            rows[key].append((task_id, seq, hash_))
    return rows


def undelivered(cluster: PatroniCluster) -> int:
    with psycopg.connect(cluster.member_url(cluster.leader())) as conn:
        row = conn.execute("SELECT count(*) FROM backplane_outboxmessage WHERE status <> 'delivered'").fetchone()
    assert row is not None
    return int(row[0])


@pytest.mark.parametrize("layout_name", ["direct", "pgbouncer"])
def test_every_acknowledged_append_survives_two_failovers_exactly_once(
        cluster: PatroniCluster, layout_name: str, first_append_seconds: dict[str, tuple[float, float]]) -> None:
    with database_layout(layout_name, cluster) as layout:
        _survive_two_failovers(cluster, layout, first_append_seconds)


def _survive_two_failovers(cluster: PatroniCluster, layout: Layout,
                           first_append_seconds: dict[str, tuple[float, float]]) -> None:
    env = {**os.environ, **layout.env, "BACKPLANE_ENV": "test", "PYTHONUNBUFFERED": "1"}
    manage(env, "migrate", "--noinput")
    tokens = json.loads(manage(env, "shell", "-c", CREATE_AGENTS.replace("{count}", str(AGENTS))).splitlines()[-1])
    # The pool on, as in production: a failover must not leave it handing out dead connections.
    web = WebProcess(name="failover-web", env={**layout.env, "BACKPLANE_DB_POOL": "1"})
    # The worker and beat too: the relay and every duty must come through both failovers on their
    # own. A queue bound to every topic, so the tasks' lifecycle messages are routable.
    background = CeleryProcesses(env={**layout.env, "BACKPLANE_DB_POOL": "1",
                                      "BACKPLANE_OUTBOX_QUEUES": "failover-drill=#"})
    fleet = Fleet(base_url=web.url, tokens=tokens)
    try:
        web.start()
        assert web.process is not None
        web_pid = web.process.pid
        worker_pid, beat_pid = background.start("worker").pid, background.start("beat").pid
        fleet.start()

        def acks_past(count: int) -> bool:
            return fleet.ack_count() >= count

        wait_until(lambda: acks_past(ACKS_BETWEEN_FAULTS), timeout=120, what="the fleet appends")

        # 1. The primary's postmaster dies; its Patroni hands the leader key to the sync standby.
        first = cluster.leader()
        first_kill, first_kill_at = time.monotonic(), time.time()
        cluster.kill_postmaster(first)
        wait_until(lambda: cluster.leader_name() not in (None, first.name), timeout=90, interval=0.25,
                   what="a new leader after the postmaster's death", details=cluster.logs)
        mark = fleet.ack_count()
        wait_until(lambda: acks_past(mark + ACKS_BETWEEN_FAULTS), timeout=120, what="appends go on after failover 1",
                   details=lambda: web.log()[-4000:])
        # The old primary rejoins (pg_rewind) before the next fault, so there is a sync standby to promote.
        cluster.wait_healthy(timeout=180)

        # 2. The new leader's Patroni dies; the harness's watchdog fences its PostgreSQL.
        second = cluster.leader()
        second_kill, second_kill_at = time.monotonic(), time.time()
        cluster.kill_patroni(second)
        wait_until(lambda: [m for m in cluster.cluster_view() if m.get("role") == "leader"
                            and m["name"] != second.name], timeout=120, interval=0.25,
                   what="a new leader after Patroni's death", details=cluster.logs)
        mark = fleet.ack_count()
        wait_until(lambda: acks_past(mark + ACKS_BETWEEN_FAULTS), timeout=120, what="appends go on after failover 2",
                   details=lambda: web.log()[-4000:])
        fleet.finish()
        # Everything the appends wrote to the outbox goes out once the relay's backoff is over.
        wait_until(lambda: undelivered(cluster) == 0, timeout=180, interval=1, what="the relay delivers the backlog",
                   details=lambda: background.log("worker")[-4000:])

        stored = stored_events(cluster)
        acknowledged = {ack.key: ack for ack in fleet.acks}
        # A replay (200) acknowledges the same event again: it must have said the same thing.
        assert len({(a.key, a.seq, a.hash) for a in fleet.acks}) == len(acknowledged)
        lost = [ack for ack in acknowledged.values() if (ack.task_id, ack.seq, ack.hash) not in stored.get(ack.key, [])]
        duplicates = {key: rows for key, rows in stored.items() if len(rows) > 1}
        manage(env, "verify_chain", "--all")
        outages = (fleet.outage_after(first_kill), fleet.outage_after(second_kill))
        first_appends = (fleet.first_append_after(first_kill), fleet.first_append_after(second_kill))
        first_append_seconds[layout.name] = first_appends
        print(f"\nfailover ({layout.name}): {len(acknowledged)} appends acknowledged by {AGENTS} agents "
              f"({len(stored)} stored), lost {len(lost)}, "
              f"duplicates {len(duplicates)}; first error to first success: {outages[0]:.1f} s after the "
              f"postmaster's SIGKILL ({first.name}), {outages[1]:.1f} s after Patroni's SIGKILL ({second.name}); "
              f"kill to first acknowledged append: {first_appends[0]:.1f} s, {first_appends[1]:.1f} s; "
              f"answers {dict(fleet.statuses)}")
        if layout.bouncer is not None:
            # The watch pointed PgBouncer at each new primary once, and PgBouncer points at the last.
            retargets = layout.retargets()
            third = cluster.leader()
            assert [port for _, port in retargets] == [first.pg_port, second.pg_port, third.pg_port], (
                retargets, layout.watch_log_path.read_text(errors="replace"))
            assert layout.bouncer_port() == third.pg_port
            print(f"leader watch: PgBouncer pointed at the new primary {retargets[1][0] - first_kill_at:.1f} s "
                  f"after the postmaster's SIGKILL, {retargets[2][0] - second_kill_at:.1f} s after Patroni's")

        assert not fleet.unexpected, fleet.unexpected[:5]
        assert not lost, lost[:5]
        assert not duplicates, list(duplicates.items())[:5]
        assert web.process.poll() is None and web.process.pid == web_pid, "the web process was restarted"
        for name, pid in (("worker", worker_pid), ("beat", beat_pid)):
            process = background.processes[name]
            assert process.poll() is None and process.pid == pid, f"the {name} died\n" + background.log(name)[-4000:]
        assert fleet.statuses.get(500, 0) == 0, ("a 500 during failover (the contract says 503)\n"
                                                 + first_traceback(web.log()))
    finally:
        fleet.finish()
        background.stop()
        web.close()
