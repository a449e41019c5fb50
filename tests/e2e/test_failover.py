"""Failover under append load: a three-member Patroni cluster (tests/support/cluster.py), the
product's web process connected through a multi-host ``DATABASE_URL``, many agents appending.

Under load, the primary's postmaster is SIGKILLed, then (once the cluster is whole again) the new
leader's Patroni. Every acknowledged event (201, or 200 for a replay) must then be on the new
primary exactly once, with the seq and hash the agent was told; the chains verify; the web process
is the one started at the beginning. The figures go to docs/benchmarks.md ("Failover").
"""

from __future__ import annotations

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
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from tests.support.celery_processes import CeleryProcesses
from tests.support.cluster import PatroniCluster
from tests.support.live_server import WebProcess
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

# httpx logs every request at INFO: thousands of lines that would bury a failure's report.
logging.getLogger("httpx").setLevel(logging.WARNING)

ROOT = Path(__file__).resolve().parents[2]
AGENTS = 12
STEPS_PER_TASK = 25
# Acknowledged appends to see between faults, so each fault lands on a fleet in full flow.
ACKS_BETWEEN_FAULTS = 300


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
                self._note(started, ok=False, status=exc.__class__.__name__)
                time.sleep(0.05)
                continue
            if answer.status_code in (200, 201):
                self._note(started, ok=True, status=answer.status_code)
                return dict(answer.json())
            self._note(started, ok=False, status=answer.status_code)
            if answer.status_code == 429 or answer.status_code >= 500:
                time.sleep(0.05)
                continue
            with self.lock:
                self.unexpected.append(f"{path} {answer.status_code} {answer.text[:300]}")
            return None
        return None

    def _note(self, started: float, *, ok: bool, status: int | str) -> None:
        with self.lock:
            self.outcomes.append(Outcome(started, time.monotonic(), ok))
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


def test_every_acknowledged_append_survives_two_failovers_exactly_once(cluster: PatroniCluster) -> None:
    url = cluster.database_url()
    env = {**os.environ, "DATABASE_URL": url, "BACKPLANE_ENV": "test", "PYTHONUNBUFFERED": "1"}
    manage(env, "migrate", "--noinput")
    tokens = json.loads(manage(env, "shell", "-c", CREATE_AGENTS.replace("{count}", str(AGENTS))).splitlines()[-1])
    # The pool on, as in production: a failover must not leave it handing out dead connections.
    web = WebProcess(name="failover-web", env={"DATABASE_URL": url, "BACKPLANE_DB_POOL": "1"})
    # The worker and beat too: the relay and every duty must come through both failovers on their
    # own. A queue bound to every topic, so the tasks' lifecycle messages are routable.
    background = CeleryProcesses(env={"DATABASE_URL": url, "BACKPLANE_DB_POOL": "1",
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
        first_kill = time.monotonic()
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
        second_kill = time.monotonic()
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
        print(f"\nfailover: {len(acknowledged)} appends acknowledged by {AGENTS} agents ({len(stored)} stored), "
              f"lost {len(lost)}, "
              f"duplicates {len(duplicates)}; first error to first success: {outages[0]:.1f} s after the "
              f"postmaster's SIGKILL ({first.name}), {outages[1]:.1f} s after Patroni's SIGKILL ({second.name}); "
              f"answers {dict(fleet.statuses)}")

        assert not fleet.unexpected, fleet.unexpected[:5]
        assert not lost, lost[:5]
        assert not duplicates, list(duplicates.items())[:5]
        assert web.process.poll() is None and web.process.pid == web_pid, "the web process was restarted"
        for name, pid in (("worker", worker_pid), ("beat", beat_pid)):
            process = background.processes[name]
            assert process.poll() is None and process.pid == pid, f"the {name} died\n" + background.log(name)[-4000:]
        assert fleet.statuses.get(500, 0) == 0, "a 500 during failover (the contract says 503)\n" + web.log()[-4000:]
    finally:
        fleet.finish()
        background.stop()
        web.close()
