"""A webhook endpoint that hangs for 30 s delays neither broker deliveries nor the stall detector,
and no transaction stays open while anything is delivered.

Real processes: a Celery worker (threads, concurrency 2, as ``make run`` starts it) and Celery
beat on the test database, the kombu filesystem broker shared with this process, a broker
consumer (relay_harness.BrokerConsumer) stamping when each message arrives, and a local HTTP
endpoint that holds every POST until the hang is over. Throughout the hang this process:
- commits a broker-only message every second and measures how long it takes to arrive;
- hands out leases of one second that nobody renews and measures how long after their expiry
  the stall detector (a beat duty in the same worker) records ``TaskStalled``;
- samples ``pg_stat_activity`` every 50 ms for the worker's backends (``PGAPPNAME``) and keeps
  the age of the oldest open transaction it sees.

Before this design the relay held its row locks (one transaction) while it POSTed, in a Celery
worker thread: the hanging endpoint held a transaction open for the whole hang and took worker
threads the detector needed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.db import transaction
from django.utils import timezone

from backplane.delivery import outbox
from backplane.delivery.models import OutboxMessage, OutboxStatus, WebhookSubscription
from backplane.eventlog import event_types as et
from backplane.eventlog import services
from backplane.eventlog.models import Event
from recovery import leases

from .relay_harness import (
    PROJECT_DIR,
    TEST_TOPIC,
    BrokerConsumer,
    ConsumerDatabase,
    relay_database_url,
    wait_until,
)

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

HANG_SECONDS = 30.0
WORKER_APP = "bp-isolation-worker"


# --- the hanging endpoint ---------------------------------------------------------------------


class HangingEndpoint(BaseHTTPRequestHandler):
    """Holds every POST until ``release_at`` (time.monotonic()), then answers 204."""

    release_at = 0.0
    arrivals: list[float] = []
    answered: list[float] = []

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        self.rfile.read(int(self.headers["Content-Length"]))
        type(self).arrivals.append(time.monotonic())
        while time.monotonic() < type(self).release_at:
            time.sleep(0.05)
        self.send_response(204)
        self.end_headers()
        type(self).answered.append(time.monotonic())

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def hanging_endpoint() -> Iterator[str]:
    HangingEndpoint.release_at, HangingEndpoint.arrivals, HangingEndpoint.answered = 0.0, [], []
    server = ThreadingHTTPServer(("127.0.0.1", 0), HangingEndpoint)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/hook"
    HangingEndpoint.release_at = 0.0
    server.shutdown()
    server.server_close()


# --- the worker and beat ----------------------------------------------------------------------


class CeleryProcess:
    def __init__(self, name: str, argv: list[str], log_path: Path, env: dict[str, str]) -> None:
        self.name, self.log_path = name, log_path
        with log_path.open("ab") as log:
            self.process = subprocess.Popen(argv, cwd=PROJECT_DIR, env=env, stdout=log, stderr=subprocess.STDOUT,
                                            start_new_session=True)

    def stop(self, timeout: float = 30) -> None:
        if self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]


@pytest.fixture
def celery(tmp_path: Path) -> Iterator[Callable[[], list[CeleryProcess]]]:
    """Start the worker (as the launcher does: the threads pool, concurrency 2) and beat."""
    started: list[CeleryProcess] = []
    env = {
        **os.environ,
        "DATABASE_URL": relay_database_url(),
        "BACKPLANE_ENV": "test",
        "BACKPLANE_VAR_DIR": os.environ["BACKPLANE_VAR_DIR"],
        "BACKPLANE_DB_POOL": "0",
        "PYTHONUNBUFFERED": "1",
        "LOG_LEVEL": "INFO",
    }
    python = sys.executable

    def start() -> list[CeleryProcess]:
        started.append(CeleryProcess(
            "worker",
            [python, "-m", "celery", "-A", "backplane", "worker", "--loglevel", "INFO", "--concurrency", "2",
             "--hostname", f"isolation-{os.getpid()}@%h"],
            tmp_path / "worker.log", {**env, "PGAPPNAME": WORKER_APP},
        ))
        started.append(CeleryProcess(
            "beat",
            [python, "-m", "celery", "-A", "backplane", "beat", "--loglevel", "INFO",
             "--schedule", str(tmp_path / "celerybeat-schedule"), "--pidfile", ""],
            tmp_path / "beat.log", {**env, "PGAPPNAME": "bp-isolation-beat"},
        ))
        return started

    yield start
    for process in started:
        process.stop()


@pytest.fixture
def consumer() -> Iterator[BrokerConsumer]:
    database = ConsumerDatabase().create()
    broker_consumer = BrokerConsumer(database).start()
    try:
        yield broker_consumer
    finally:
        broker_consumer.stop()
        database.drop()


# --- measuring ---------------------------------------------------------------------------------


@dataclass
class TransactionSampler:
    """Every 50 ms: the oldest open transaction among the worker's backends."""

    url: str
    max_age: float = 0.0
    worst: tuple[Any, ...] = ()
    samples: int = 0
    backends_seen: set[int] = field(default_factory=set)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> TransactionSampler:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        assert self._thread is not None
        self._thread.join(timeout=10)

    def _run(self) -> None:
        with psycopg.connect(self.url, autocommit=True) as conn:
            while not self._stop.is_set():
                rows = conn.execute(
                    "SELECT pid, extract(epoch FROM clock_timestamp() - xact_start)::float, state, left(query, 200)"
                    " FROM pg_stat_activity WHERE application_name = %s", [WORKER_APP]
                ).fetchall()
                self.samples += 1
                for pid, age, state, query in rows:
                    self.backends_seen.add(pid)
                    if age is not None and age > self.max_age:
                        self.max_age, self.worst = age, (pid, age, state, query)
                time.sleep(0.05)


def enqueue(topic: str, key: str, payload: dict[str, Any]) -> float:
    """Commit one message; returns time.time() right after the commit."""
    with transaction.atomic():
        outbox.outbox_enqueue(topic=topic, key=key, payload=payload, headers={}, now=timezone.now())
    return time.time()


@dataclass
class Stall:
    task_id: Any
    expires_at: datetime


def lease_that_will_stall(n: int) -> Stall:
    """A task claimed under a one-second lease that nobody renews (an agent of its own: three
    stalls of one agent would open its circuit breaker)."""
    agent = services.agent_create(name=f"sleeper-{n}", namespace="iso", kinds=[f"stalls-{n}"]).agent
    services.task_create(namespace="iso", kind=f"stalls-{n}", input={"n": n}, agent="planner")
    claim = leases.lease_claim(agent=agent, kinds=None, lease_seconds=1)
    assert claim is not None
    return Stall(claim.task.pk, claim.expires_at)


def stalled_at(stall: Stall) -> datetime | None:
    event = Event.objects.filter(task_id=stall.task_id, type=et.TASK_STALLED).order_by("seq").first()
    return event.recorded_at if event else None


def test_a_hanging_webhook_delays_neither_the_broker_nor_the_stall_detector(
    committed_db: None, hanging_endpoint: str, consumer: BrokerConsumer,
    celery: Callable[[], list[CeleryProcess]],
) -> None:
    WebhookSubscription.objects.create(name="hangs", topic_pattern="hooks.#", url=hanging_endpoint, secret="s",
                                       timeout_seconds=int(HANG_SECONDS) + 15, max_concurrency=2)
    processes = celery()
    logs = lambda: "\n".join(f"--- {p.name} ---\n{p.log()}" for p in processes)  # noqa: E731

    # The worker and beat are up once a message goes all the way to the consumer.
    enqueue(TEST_TOPIC, "warm-up", {"seq": -1})
    wait_until(lambda: consumer.delivery_count() >= 1, timeout=90, what="the worker relays a first message",
               interval=0.1, on_timeout=logs)

    # The hang begins: webhook messages on six keys; the destination's two threads take one each.
    HangingEndpoint.release_at = time.monotonic() + HANG_SECONDS
    for n in range(6):
        enqueue("hooks.created", f"hook-{n}", {"seq": n})
    wait_until(lambda: len(HangingEndpoint.arrivals) >= 2, timeout=10, what="the endpoint holds two POSTs",
               interval=0.05, on_timeout=logs)
    sampler = TransactionSampler(relay_database_url()).start()
    try:
        sent: dict[str, float] = {}
        stalls: list[Stall] = []
        n = 0
        while time.monotonic() < HangingEndpoint.release_at - 2:
            sent[f"probe-{n}"] = enqueue(TEST_TOPIC, f"probe-{n}", {"seq": n})
            if n % 6 == 0:
                stalls.append(lease_that_will_stall(n))
            n += 1
            time.sleep(1.0)
        hung_posts = len(HangingEndpoint.arrivals)

        # Everything arrives; the held POSTs are answered at the end of the hang.
        wait_until(lambda: {d.key for d in consumer.snapshot()} >= set(sent), timeout=20,
                   what="every probe reaches the consumer", interval=0.1, on_timeout=logs)
        wait_until(lambda: all(stalled_at(stall) for stall in stalls), timeout=20,
                   what="every lease is recovered", interval=0.1, on_timeout=logs)
        wait_until(lambda: not OutboxMessage.objects.filter(subscription__isnull=False)
                   .exclude(status=OutboxStatus.DELIVERED).exists(),
                   timeout=60, what="the webhook messages are delivered after the hang", interval=0.2,
                   on_timeout=logs)
    finally:
        sampler.stop()

    arrived = {d.key: d.received_at for d in consumer.snapshot() if d.key in sent}
    latencies = sorted(arrived[key] - at for key, at in sent.items())
    recoveries = sorted((stalled_at(stall) - stall.expires_at).total_seconds() for stall in stalls)  # type: ignore[operator]
    print(f"\nhang {HANG_SECONDS:.0f} s, {hung_posts} POSTs held; broker probes {len(latencies)}: latency "
          f"median {latencies[len(latencies) // 2]:.2f} s, max {latencies[-1]:.2f} s; "
          f"detector recovered {len(recoveries)} leases {recoveries[-1]:.2f} s after expiry at most "
          f"(median {recoveries[len(recoveries) // 2]:.2f} s); "
          f"oldest transaction on the worker's {len(sampler.backends_seen)} backends "
          f"{sampler.max_age:.3f} s over {sampler.samples} samples {sampler.worst}")

    assert hung_posts >= 2 and HangingEndpoint.answered[0] >= HangingEndpoint.arrivals[0] + HANG_SECONDS - 5
    assert len(latencies) >= 20
    # Beat ticks once a second and the filesystem broker is polled: about 1-2 s end to end.
    assert latencies[-1] < 3.5, latencies
    # The detector runs every 2 s: a lease is taken back within about 2-3 s of its expiry.
    assert recoveries[-1] < 4.5, recoveries
    assert sampler.max_age < 1.0, sampler.worst
    assert sampler.samples > 300
    assert all(timedelta(0) < (stalled_at(s) - s.expires_at) for s in stalls)  # type: ignore[operator]
