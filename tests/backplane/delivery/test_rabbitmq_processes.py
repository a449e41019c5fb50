"""RabbitMQ as the broker: the relay's publisher confirms and mandatory publishes, and SIGKILLs
of a relay process, of a Celery worker running the relay duty, and of the RabbitMQ node itself.

Everything is real: a private node of Debian's rabbitmq-server (tests/support/rabbitmq.py, one
per module), ``manage.py relay`` and ``celery worker``/``beat`` child processes on the test
database, and an independent kombu consumer in this process, on its own connection to a quorum
queue bound to every topic, which records every raw delivery and acks it after recording. From
what it received the tests count, per outbox ``message_id``, what was lost and what came twice,
and check that each key's messages arrived in order (the relay's ordering is ``strict``).
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.utils import timezone
from kombu import Connection, Exchange, Queue

from backplane.delivery import relay
from backplane.delivery.models import OutboxMessage, OutboxStatus
from backplane.delivery.sinks import KombuSink, Sinks
from backplane.eventlog import services
from backplane.eventlog.writer import EventDraft, OutboxDraft
from backplane_client.consumer import parse_envelope
from tests.support.celery_processes import CeleryProcesses
from tests.support.rabbitmq import RabbitNode, rabbit_node  # noqa: F401 - the module's node (a fixture)

from .relay_harness import (
    TEST_TOPIC,
    RelayProcess,
    enqueue_keyed_messages,
    outbox_message_ids,
    outbox_status_counts,
    pending_count,
    wait_until,
)

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

QUORUM = {"x-queue-type": "quorum"}


def outbox_exchange() -> Exchange:
    return Exchange(settings.BACKPLANE_OUTBOX_EXCHANGE, type="topic", durable=True)


# --- the independent consumer --------------------------------------------------------------


@dataclass(frozen=True)
class Received:
    message_id: str
    topic: str
    key: str
    seq: int | None


class RabbitConsumer:
    """A kombu consumer in a thread: records each raw delivery, then acks it.

    The queue is declared (quorum, bound to ``#``) in ``start``, before any relay publishes. When
    the node goes away the thread reconnects until it is back; a message whose ack was lost with
    the node is delivered again, which the figures count as a duplicate of its ``message_id``.
    """

    def __init__(self, url: str) -> None:
        self.url = url
        self.queue = Queue(f"rabbittest-{secrets.token_hex(4)}", outbox_exchange(), routing_key="#", durable=True,
                           queue_arguments=QUORUM)
        self.received: list[Received] = []
        self.reconnects = 0
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rabbit-consumer", daemon=True)
        self._last_empty_poll = 0.0

    def start(self) -> RabbitConsumer:
        with Connection(self.url) as conn:
            self.queue(conn.default_channel).declare()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join(timeout=30)
        try:
            with Connection(self.url, connect_timeout=2) as conn:
                self.queue(conn.default_channel).delete()
        except Exception:  # noqa: BLE001 - the node may be gone already; its folder goes with it
            pass

    def count(self) -> int:
        with self._lock:
            return len(self.received)

    def snapshot(self) -> list[Received]:
        with self._lock:
            return list(self.received)

    def wait_until_drained(self, stall_timeout: float = 60) -> None:
        """Wait for an empty poll that started after this call; fail if nothing arrives for ``stall_timeout``."""
        asked_at = time.monotonic()
        progress = [self.count(), asked_at]

        def drained() -> bool:
            if self._last_empty_poll > asked_at:
                return True
            if self.count() != progress[0]:
                progress[:] = [self.count(), time.monotonic()]
            if time.monotonic() - progress[1] > stall_timeout:
                raise AssertionError(f"the consumer made no progress for {stall_timeout:.0f} s ({self.count()} so far)")
            return False

        wait_until(drained, timeout=3600, what="the consumer has drained its queue", interval=0.005)

    def _run(self) -> None:
        conn: Connection | None = None
        bound: Any = None
        while not self._stopping.is_set():
            polled_at = time.monotonic()
            try:
                if bound is None:
                    conn = Connection(self.url, connect_timeout=2)
                    conn.ensure_connection(max_retries=0, timeout=2)
                    bound = self.queue(conn.channel())
                    bound.declare()
                message = bound.get(no_ack=False)
                if message is None:
                    self._last_empty_poll = polled_at
                    time.sleep(0.002)
                    continue
                envelope = parse_envelope(message.payload)
                payload = envelope.get("payload") or {}
                with self._lock:
                    self.received.append(Received(envelope["message_id"], envelope["topic"], envelope["key"],
                                                  payload.get("seq")))
                message.ack()
            except Exception:  # noqa: BLE001 - the node is down or restarting: connect again
                if conn is not None:
                    conn.release()
                conn, bound = None, None
                self.reconnects += 1
                time.sleep(0.2)
        if conn is not None:
            conn.release()


@dataclass(frozen=True)
class Figures:
    messages: int
    delivered: int
    lost: int
    duplicates: int
    order_violations: int

    def line(self, name: str) -> str:
        return (f"\n{name}: {self.messages} messages, {self.delivered} delivered, lost={self.lost}, "
                f"duplicates={self.duplicates}, order violations={self.order_violations}")


def figures_of(received: list[Received], expected_ids: set[str]) -> Figures:
    """Loss, duplicates and per-key order from the consumer's raw deliveries.

    A duplicate must be a message the outbox holds, carrying the same key and seq every time it
    comes. Order: within a key, the first deliveries must be seq 0, 1, 2, … (a repeat after a
    crash may come later; a consumer drops it by ``message_id``); each seq out of place counts.
    """
    by_id: dict[str, set[tuple[str, str, int | None]]] = defaultdict(set)
    for item in received:
        by_id[item.message_id].add((item.topic, item.key, item.seq))
    strangers = set(by_id) - expected_ids
    assert not strangers, f"deliveries of messages the outbox does not hold: {sorted(strangers)[:5]}"
    assert all(len(contents) == 1 for contents in by_id.values()), "two deliveries of one message_id differ"

    first_seqs: dict[str, list[int]] = defaultdict(list)
    seen: set[str] = set()
    for item in received:
        if item.message_id in seen:
            continue
        seen.add(item.message_id)
        if item.topic == TEST_TOPIC:
            assert item.seq is not None
            first_seqs[item.key].append(item.seq)
    violations = sum(1 for seqs in first_seqs.values() for position, seq in enumerate(seqs) if seq != position)
    return Figures(messages=len(expected_ids), delivered=len(set(by_id) & expected_ids),
                   lost=len(expected_ids - set(by_id)), duplicates=len(received) - len(by_id),
                   order_violations=violations)


# --- fixtures ------------------------------------------------------------------------------


@pytest.fixture
def consumer(rabbit_node: RabbitNode) -> Iterator[RabbitConsumer]:  # noqa: F811 - the imported fixture
    rabbit_consumer = RabbitConsumer(rabbit_node.url).start()
    try:
        yield rabbit_consumer
    finally:
        rabbit_consumer.stop()


StartRelay = Callable[..., RelayProcess]


@pytest.fixture
def start_relay(tmp_path: Path, rabbit_node: RabbitNode) -> Iterator[StartRelay]:  # noqa: F811
    """``manage.py relay`` processes publishing to the node; any still running at teardown is SIGKILLed."""
    started: list[RelayProcess] = []

    def start(*, env: dict[str, str] | None = None, **options: Any) -> RelayProcess:
        process = RelayProcess(tmp_path / f"relay-{len(started)}.log", **options,
                               env={"BACKPLANE_OUTBOX_BROKER_URL": rabbit_node.url, **(env or {})}).start()
        started.append(process)
        return process

    try:
        yield start
    finally:
        for process in started:
            if process.is_running():
                process.kill()


def relay_logs(*relays: RelayProcess) -> Callable[[], str]:
    return lambda: "\n".join(f"--- relay pid {r.pid} ---\n{r.log()[-3000:]}" for r in relays)


# --- 1. unroutable --------------------------------------------------------------------------


def test_an_unroutable_message_is_returned_fails_as_unroutable_and_goes_out_once_a_queue_is_bound(
    committed_db: None, rabbit_node: RabbitNode,  # noqa: F811
) -> None:
    unbound, bound = f"unbound-{secrets.token_hex(4)}.scored", f"bound-{secrets.token_hex(4)}.scored"
    task = services.task_create(namespace="rabbittest", kind="unroutable", input={}, agent="a").task
    # One append, the unroutable message first: both go out in one claim, one after the other on
    # the sink's channel, so a return blamed on the wrong message would show here.
    services.event_append(namespace=task.namespace, task_id=task.pk, agent="a", draft=EventDraft(
        type="Noted", payload={}, outbox=(OutboxDraft(topic=unbound, payload={"n": 1}, key="k1"),
                                          OutboxDraft(topic=bound, payload={"n": 2}, key="k2"))))
    OutboxMessage.objects.exclude(topic__in=[unbound, bound]).delete()  # the task's lifecycle message
    first, second = OutboxMessage.objects.get(topic=unbound), OutboxMessage.objects.get(topic=bound)

    with Connection(rabbit_node.url) as conn:
        channel = conn.default_channel
        bound_queue = Queue(f"bound-{secrets.token_hex(4)}", outbox_exchange(), routing_key=bound, durable=True,
                            queue_arguments=QUORUM)
        bound_queue(channel).declare()
        sinks = Sinks(broker=KombuSink(url=rabbit_node.url))
        try:
            step = relay.outbox_relay_once(publish=sinks)
            assert (step.claimed, step.delivered, step.failed) == (2, 1, 1)
            first.refresh_from_db()
            second.refresh_from_db()
            assert first.status == OutboxStatus.PENDING and first.delivered_at is None
            assert first.last_error.startswith("unroutable: no queue is bound") and unbound in first.last_error
            assert second.status == OutboxStatus.DELIVERED

            late_queue = Queue(f"late-{secrets.token_hex(4)}", outbox_exchange(), routing_key=unbound, durable=True,
                               queue_arguments=QUORUM)
            late_queue(channel).declare()
            OutboxMessage.objects.filter(pk=first.pk).update(next_attempt_at=timezone.now())
            assert relay.outbox_relay_once(publish=sinks).delivered == 1
        finally:
            sinks.close()
        first.refresh_from_db()
        assert first.status == OutboxStatus.DELIVERED
        for queue, message in ((bound_queue, second), (late_queue, first)):
            with conn.SimpleQueue(queue) as simple:
                received: Any = simple.get(timeout=5)
                assert received.payload["message_id"] == str(message.message_id)
                received.ack()
                assert simple.qsize() == 0
            queue(conn.default_channel).delete()
    print("\nunroutable: 2 messages, 1 returned as unroutable then delivered once bound, 1 delivered at once")


# --- 2. SIGKILL of relay processes ----------------------------------------------------------


def start_relay_and_kill_it_mid_run(consumer: RabbitConsumer, start_relay: StartRelay, *, after_a_commit: bool) -> None:
    """A fresh relay, SIGKILLed once its first messages reach the consumer (it is then inside a
    batch, between publishing and committing) or, with ``after_a_commit``, once it has also
    committed a batch, so that rounds make progress and kills land at varied points."""
    seen_before, pending_before = consumer.count(), pending_count()
    process = start_relay(batch_size=25)
    wait_until(lambda: consumer.count() > seen_before or not process.is_running(), timeout=60,
               what="the relay publishes", interval=0.001, on_timeout=relay_logs(process))
    if after_a_commit:
        wait_until(lambda: pending_count() < pending_before or not process.is_running(), timeout=60,
                   what="the relay commits a batch", interval=0.001, on_timeout=relay_logs(process))
    assert process.is_running(), process.log()
    assert process.kill() == -signal.SIGKILL


def test_killing_the_relay_mid_publish_loses_nothing_and_keeps_key_order(
    committed_db: None, consumer: RabbitConsumer, start_relay: StartRelay
) -> None:
    keys = [f"key-{i:02d}" for i in range(25)]
    enqueue_keyed_messages(keys=keys, per_key=40)
    expected_ids = outbox_message_ids()

    kills = 10
    for round_number in range(kills):
        start_relay_and_kill_it_mid_run(consumer, start_relay, after_a_commit=bool(round_number % 2))
    left = pending_count()
    assert left > 0, "the relays finished before the last kill; the kills tested nothing"

    final = start_relay(batch_size=25)
    wait_until(lambda: pending_count() == 0, timeout=180, what="the last relay delivers everything",
               interval=0.05, on_timeout=relay_logs(final))
    assert final.stop() == 0
    consumer.wait_until_drained()

    assert outbox_status_counts() == {OutboxStatus.DELIVERED: len(expected_ids)}
    figures = figures_of(consumer.snapshot(), expected_ids)
    print(figures.line(f"relay killed {kills} times") + f", {left} left for the last relay")
    assert (figures.lost, figures.order_violations) == (0, 0)


# --- 3. SIGKILL of a Celery worker running the relay duty ----------------------------------


def start_worker_and_kill_it_mid_run(consumer: RabbitConsumer, processes: CeleryProcesses, name: str,
                                     logs: Callable[[], str], *, after_a_commit: bool) -> None:
    """A fresh worker, SIGKILLed (its whole process group) once it has relayed a few messages
    (inside its first batch) or, with ``after_a_commit``, once it has also recorded a batch."""
    seen_before, pending_before = consumer.count(), pending_count()
    worker = processes.start(name)
    wait_until(lambda: consumer.count() > seen_before + 5, timeout=120, what=f"{name} relays messages",
               interval=0.005, on_timeout=logs)
    if after_a_commit:
        wait_until(lambda: pending_count() < pending_before, timeout=120, what=f"{name} records a batch",
                   interval=0.005, on_timeout=logs)
    assert worker.poll() is None, logs()
    os.killpg(worker.pid, signal.SIGKILL)
    assert worker.wait(timeout=30) == -signal.SIGKILL


def test_killing_a_celery_worker_that_runs_the_relay_duty_loses_nothing_and_keeps_key_order(
    committed_db: None, consumer: RabbitConsumer, rabbit_node: RabbitNode  # noqa: F811
) -> None:
    keys = [f"key-{i:02d}" for i in range(10)]
    enqueue_keyed_messages(keys=keys, per_key=100)
    expected_ids = outbox_message_ids()
    # Celery itself on RabbitMQ too (its quorum queue and confirmed enqueues, settings.py): beat
    # sends the relay duty every second, the worker runs it in its delivery lanes.
    processes = CeleryProcesses(env={
        "BACKPLANE_BROKER_URL": rabbit_node.url,
        "BACKPLANE_OUTBOX_CLAIM_SECONDS": "2",
        "BACKPLANE_OUTBOX_BROKER_TIMEOUT_SECONDS": "1",
    })

    def logs() -> str:
        return "\n".join(f"--- {name} ---\n{processes.log(name)[-3000:]}" for name in processes.processes)

    kills = 0
    try:
        processes.start("beat")
        for round_number in range(3):
            start_worker_and_kill_it_mid_run(consumer, processes, f"worker{round_number}", logs,
                                             after_a_commit=round_number == 1)
            kills += 1
        left = pending_count()
        assert left > 0, "the workers finished before the last kill; the kills tested nothing"
        processes.start("worker-last")
        wait_until(lambda: pending_count() == 0, timeout=240, what="the last worker delivers everything",
                   interval=0.1, on_timeout=logs)
        queue_types = rabbit_node.ctl("list_queues", "--quiet", "--no-table-headers", "name", "type").stdout.split()
        assert queue_types[queue_types.index("celery") + 1] == "quorum", queue_types
    finally:
        processes.stop()
        shutil.rmtree(processes.var_dir, ignore_errors=True)
    consumer.wait_until_drained()

    assert outbox_status_counts() == {OutboxStatus.DELIVERED: len(expected_ids)}
    figures = figures_of(consumer.snapshot(), expected_ids)
    print(figures.line(f"Celery worker killed {kills} times") + f", {left} left for the last worker")
    assert (figures.lost, figures.order_violations) == (0, 0)


# --- 4. SIGKILL of the RabbitMQ node --------------------------------------------------------


def test_killing_the_rabbitmq_node_mid_publish_loses_no_confirmed_message(
    committed_db: None, consumer: RabbitConsumer, start_relay: StartRelay, rabbit_node: RabbitNode  # noqa: F811
) -> None:
    keys = [f"key-{i:02d}" for i in range(10)]
    enqueue_keyed_messages(keys=keys, per_key=100)
    expected_ids = outbox_message_ids()
    rabbit_node.save_queue_metadata()  # the consumer's queue was declared a moment ago
    process = start_relay(batch_size=10, env={
        # Retries come quickly once the node is back (doubling from 1 s, at most 2 s apart).
        "BACKPLANE_OUTBOX_BACKOFF_BASE_SECONDS": "1",
        "BACKPLANE_OUTBOX_BACKOFF_MAX_SECONDS": "2",
    })
    wait_until(lambda: consumer.count() > 100, timeout=120, what="the relay is publishing",
               interval=0.002, on_timeout=relay_logs(process))
    try:
        rabbit_node.kill()
        assert pending_count() > 0, "the relay finished before the kill; the kill tested nothing"
        # What the relay recorded as delivered, it recorded after RabbitMQ confirmed the publish,
        # and a quorum queue confirms only what it has written and synced to its log: so each of
        # these must come out of the queue after the restart (or have been consumed before the
        # kill). Publishes the node never confirmed failed and stay pending for a retry.
        wait_until(lambda: OutboxMessage.objects.filter(status=OutboxStatus.PENDING).exclude(failures=[]).exists(),
                   timeout=60, what="the relay records failed publishes", interval=0.05,
                   on_timeout=relay_logs(process))
        delivered_at_kill = {str(mid) for mid in OutboxMessage.objects.filter(status=OutboxStatus.DELIVERED)
                             .values_list("message_id", flat=True)}
        left_at_kill = pending_count()
    finally:
        rabbit_node.start()

    wait_until(lambda: pending_count() == 0, timeout=240, what="the relay delivers everything after the restart",
               interval=0.05, on_timeout=relay_logs(process))
    assert process.is_running(), "the relay exited instead of riding out the broker's restart"
    assert process.stop() == 0
    consumer.wait_until_drained()

    received = consumer.snapshot()
    missing = delivered_at_kill - {item.message_id for item in received}
    assert not missing, f"{len(missing)} messages recorded as delivered before the kill never reached the consumer"
    retried = OutboxMessage.objects.exclude(failures=[]).count()
    assert retried > 0
    assert outbox_status_counts() == {OutboxStatus.DELIVERED: len(expected_ids)}
    figures = figures_of(received, expected_ids)
    print(figures.line("RabbitMQ node killed once") + f", {len(delivered_at_kill)} delivered before the kill, "
          f"{left_at_kill} pending at the kill, {retried} retried after a failed publish, "
          f"consumer reconnects {consumer.reconnects}")
    assert (figures.lost, figures.order_violations) == (0, 0)
