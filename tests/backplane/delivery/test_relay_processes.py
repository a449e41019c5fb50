"""The relay as real processes: SIGKILLed mid-publish, facing a dead broker, outliving a
PostgreSQL restart, and running twice at once.

Everything is real: ``manage.py relay`` child processes on the test database, the kombu
filesystem broker under ``BACKPLANE_VAR_DIR`` (shared with this process), and a consumer thread
that applies each envelope with ``backplane_client.consumer.process_once`` into a database of
its own. Raw deliveries (duplicates included) are counted apart from applied effects: the relay
promises at least once, the consumer helper turns that into exactly once.
"""

from __future__ import annotations

import os
import signal
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from backplane.delivery.models import DeadLetter, DeadLetterStatus, OutboxMessage, OutboxStatus
from recovery.dead_letters import dead_letter_requeue

from .relay_harness import (
    TEST_TOPIC,
    UNREACHABLE_BROKER_URL,
    BrokerConsumer,
    ConsumerDatabase,
    Delivery,
    RelayProcess,
    enqueue_keyed_messages,
    outbox_message_ids,
    outbox_status_counts,
    pending_count,
    reconnect_django,
    restart_embedded_postgres,
    wait_until,
)

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

StartRelay = Callable[..., RelayProcess]


@pytest.fixture
def consumer_db() -> Iterator[ConsumerDatabase]:
    database = ConsumerDatabase().create()
    try:
        yield database
    finally:
        database.drop()


@pytest.fixture
def consumer(consumer_db: ConsumerDatabase) -> Iterator[BrokerConsumer]:
    """Bound to the exchange before any relay starts, so no publish can miss the queue."""
    broker_consumer = BrokerConsumer(consumer_db).start()
    try:
        yield broker_consumer
    finally:
        broker_consumer.stop()


@pytest.fixture
def start_relay(tmp_path: Path) -> Iterator[StartRelay]:
    """Start relay processes; any still running at teardown is SIGKILLed (before the DB flush)."""
    started: list[RelayProcess] = []

    def start(**options: Any) -> RelayProcess:
        relay = RelayProcess(tmp_path / f"relay-{len(started)}.log", **options).start()
        started.append(relay)
        return relay

    yield start
    for relay in started:
        if relay.is_running():
            relay.kill()


def relay_logs(*relays: RelayProcess) -> Callable[[], str]:
    """For failure messages: the tail of each relay's log."""
    return lambda: "\n".join(f"--- relay pid {r.pid} ---\n{r.log()[-3000:]}" for r in relays)


def assert_each_message_applied_once(consumer: BrokerConsumer, consumer_db: ConsumerDatabase,
                                     expected_ids: set[str]) -> None:
    assert consumer.errors == []
    assert set(consumer.deliveries_per_message()) == expected_ids, "some message never reached the consumer"
    assert consumer.applied == len(expected_ids), "process_once ran the handler for a duplicate"
    effects = consumer_db.effects_per_message()
    assert set(effects) == expected_ids
    assert {count for count in effects.values()} == {1}, "an effect was applied twice"
    assert consumer_db.processed_ids() == expected_ids


def seqs_per_key_in_delivery_order(deliveries: list[Delivery]) -> dict[str, list[int]]:
    per_key: dict[str, list[int]] = defaultdict(list)
    for delivery in deliveries:
        if delivery.topic == TEST_TOPIC:
            assert delivery.seq is not None
            per_key[delivery.key].append(delivery.seq)
    return dict(per_key)


# --- 1. SIGKILL mid-publish -----------------------------------------------------------------


def start_relay_and_kill_it_mid_run(consumer: BrokerConsumer, start_relay: StartRelay, *, batch_size: int,
                                    after_a_commit: bool) -> int:
    """One round: a fresh relay, SIGKILLed while it is publishing. Returns the round's deliveries.

    The kill comes as soon as its first messages reach the consumer (the relay is then inside
    its first batch, between publishing and committing), or, with ``after_a_commit``, once a
    batch has also been committed (it is then somewhere in a later one), so that rounds make
    progress and the kills land at varied points of the backlog.
    """
    # Everything the previous (killed) relay published is in, so what arrives next is new.
    consumer.wait_until_drained()
    seen_before, pending_before = consumer.delivery_count(), pending_count()
    relay = start_relay(batch_size=batch_size)
    wait_until(lambda: consumer.delivery_count() > seen_before or not relay.is_running(),
               timeout=60, what="the relay publishes", interval=0.001, on_timeout=relay_logs(relay))
    if after_a_commit:
        wait_until(lambda: pending_count() < pending_before or not relay.is_running(),
                   timeout=60, what="the relay commits a batch", interval=0.001, on_timeout=relay_logs(relay))
    assert relay.is_running(), relay.log()
    assert relay.kill() == -signal.SIGKILL
    return consumer.delivery_count() - seen_before


def test_killing_the_relay_mid_publish_20_times_loses_nothing(
    committed_db: None, consumer: BrokerConsumer, consumer_db: ConsumerDatabase, start_relay: StartRelay
) -> None:
    # 25 keys, so a batch really holds 25 heads (the relay only claims the oldest pending
    # message of each key) and publishing a batch takes long enough for kills to land inside.
    keys = [f"key-{i:02d}" for i in range(25)]
    enqueue_keyed_messages(keys=keys, per_key=40)
    expected_ids = outbox_message_ids()
    assert len(expected_ids) == 25 * 40 + 1  # plus the task's lifecycle message

    new_per_run = [start_relay_and_kill_it_mid_run(consumer, start_relay, batch_size=25, after_a_commit=bool(i % 2))
                   for i in range(20)]

    left = pending_count()
    assert 0 < left < len(expected_ids), f"{left} left; deliveries per killed run: {new_per_run}"

    final = start_relay(batch_size=25)
    wait_until(lambda: pending_count() == 0, timeout=120, what="the last relay delivers everything",
               interval=0.05, on_timeout=relay_logs(final))
    assert final.stop() == 0
    consumer.wait_until_drained()

    assert outbox_status_counts() == {OutboxStatus.DELIVERED: len(expected_ids)}
    assert_each_message_applied_once(consumer, consumer_db, expected_ids)
    raw = consumer.delivery_count()
    # Proof the kills hit the window between publish and commit at least once (else this
    # test would not have exercised redelivery at all); process_once absorbed the repeats.
    assert raw > len(expected_ids), f"no redelivery in 20 kills; deliveries per run: {new_per_run}"
    print(f"\n{len(expected_ids)} messages, {raw} raw deliveries, {left} left for the last run, "
          f"new deliveries per killed run: {new_per_run}")


# --- 2. A dead broker: backoff, dead letters, requeue ---------------------------------------


def test_an_unreachable_broker_backs_off_then_dead_letters_each_message_once_and_requeue_delivers_it_once(
    committed_db: None, consumer: BrokerConsumer, consumer_db: ConsumerDatabase, start_relay: StartRelay
) -> None:
    # Four rows: the task's lifecycle message and one message on each of three keys.
    enqueue_keyed_messages(keys=["key-a", "key-b", "key-c"], per_key=1)
    rows = list(OutboxMessage.objects.order_by("id"))
    assert len(rows) == 4
    requeued = next(row for row in rows if row.key == "key-b")

    max_attempts, backoff_base = 3, 1
    relay = start_relay(batch_size=10, env={
        "BACKPLANE_OUTBOX_BROKER_URL": UNREACHABLE_BROKER_URL,
        "BACKPLANE_OUTBOX_MAX_ATTEMPTS": str(max_attempts),
        "BACKPLANE_OUTBOX_BACKOFF_BASE_SECONDS": str(backoff_base),
    })

    # Polled throughout: attempts only ever go up, one claim at a time, and no row is ever
    # delivered; the relay keeps no transaction open between claiming and recording.
    seen_attempts: dict[int, list[int]] = {row.pk: [0] for row in rows}

    def record_attempts() -> bool:
        done = True
        for pk, attempts, status in OutboxMessage.objects.values_list("pk", "attempts", "status"):
            if seen_attempts[pk][-1] != attempts:
                seen_attempts[pk].append(attempts)
            done = done and status == OutboxStatus.DEAD
        return done

    wait_until(record_attempts, timeout=90, what="every row is dead", interval=0.02, on_timeout=relay_logs(relay))
    assert relay.stop() == 0

    for row in rows:
        assert seen_attempts[row.pk] == sorted(set(seen_attempts[row.pk])), seen_attempts[row.pk]
        row.refresh_from_db()
        assert (row.status, row.attempts, row.holds_key) == (OutboxStatus.DEAD, max_attempts, True)
        assert row.claimed_until is None and row.claim_token is None
        # Every failed attempt is on the row, counted when it was claimed: 1, 2, 3.
        assert [f["attempt"] for f in row.failures] == [1, 2, 3], row.failures
        assert all("broker:" in f["error"] and "127.0.0.1:1" in f["error"] for f in row.failures), row.failures
        # Backoff: attempt n is not retried before ceiling/2 = base * 2**(n-1) / 2 seconds after it
        # failed (equal jitter keeps the delay in [ceiling/2, ceiling]).
        failed_at = [datetime.fromisoformat(f["at"]) for f in row.failures]
        assert (failed_at[1] - failed_at[0]).total_seconds() >= backoff_base * 0.5
        assert (failed_at[2] - failed_at[1]).total_seconds() >= backoff_base * 1.0
        dead_letters = list(DeadLetter.objects.filter(outbox_message_id=row.pk))
        assert len(dead_letters) == 1, "one dead letter per message, however often the relay looked at it"
        assert dead_letters[0].attempts == max_attempts
        assert dead_letters[0].reference == str(row.message_id)
        assert dead_letters[0].status == DeadLetterStatus.PENDING
        assert [h["attempt"] for h in dead_letters[0].history] == [1, 2, 3]
    assert DeadLetter.objects.count() == len(rows)
    assert consumer.delivery_count() == 0

    # An operator requeues one message; the broker is back (the relay's default broker).
    dead_letter = DeadLetter.objects.get(outbox_message_id=requeued.pk)
    dead_letter_requeue(dead_letter_id=dead_letter.pk, decided_by="operator", reason="broker is back")
    relay = start_relay(batch_size=10)
    wait_until(lambda: OutboxMessage.objects.get(pk=requeued.pk).status == OutboxStatus.DELIVERED, timeout=60,
               what="the requeued message is delivered", interval=0.02, on_timeout=relay_logs(relay))
    # Give a (wrong) second delivery the chance to happen before the relay stops.
    time.sleep(0.5)
    assert relay.stop() == 0
    consumer.wait_until_drained()

    assert consumer.deliveries_per_message() == {str(requeued.message_id): 1}
    assert_each_message_applied_once(consumer, consumer_db, {str(requeued.message_id)})
    dead_letter.refresh_from_db()
    assert dead_letter.status == DeadLetterStatus.REQUEUED
    assert DeadLetter.objects.count() == len(rows)  # no new dead letter on the way
    assert outbox_status_counts() == {OutboxStatus.DEAD: len(rows) - 1, OutboxStatus.DELIVERED: 1}


# --- 3. PostgreSQL restarts under a running relay -------------------------------------------


def test_a_postgresql_restart_during_a_relay_run_is_survived(
    committed_db: None, consumer: BrokerConsumer, consumer_db: ConsumerDatabase, start_relay: StartRelay
) -> None:
    pgdata = os.environ.get("BACKPLANE_TEST_PGDATA")
    if not pgdata:
        pytest.skip("the suite runs on an external DATABASE_URL; there is no embedded server to restart")
    keys = [f"key-{i}" for i in range(5)]
    relay = start_relay(batch_size=20, env={"PGAPPNAME": "relay-under-restart"})
    pid = relay.pid
    first = enqueue_keyed_messages(keys=keys, per_key=20)
    wait_until(lambda: pending_count() == 0, timeout=60, what="the first messages are delivered",
               interval=0.05, on_timeout=relay_logs(relay))

    # A backlog (5 messages per transaction, one per key) keeps the relay busy, so the server
    # usually goes away under a batch that is published but not yet committed.
    enqueue_keyed_messages(keys=keys, per_key=100, first_seq=20, task=first.task)
    seen = consumer.delivery_count()
    wait_until(lambda: consumer.delivery_count() > seen, timeout=60, what="the relay works on the backlog",
               interval=0.001, on_timeout=relay_logs(relay))
    # The restart terminates every connection: the relay's, the consumer thread's and ours.
    reconnect_django()
    restart_embedded_postgres(Path(pgdata))
    reconnect_django()
    left_at_restart = pending_count()
    # The relay's NOTIFY listener died with the server, so it must have noticed the outage.
    wait_until(lambda: "database unavailable" in relay.log(), timeout=30,
               what="the relay reports the outage", on_timeout=relay_logs(relay))

    enqueue_keyed_messages(keys=keys, per_key=20, first_seq=120, task=first.task)
    wait_until(lambda: pending_count() == 0, timeout=120, what="messages after the restart are delivered",
               interval=0.05, on_timeout=relay_logs(relay))
    assert relay.is_running() and relay.pid == pid, "the relay exited instead of riding out the restart"
    with connection.cursor() as cursor:  # it reconnected to the restarted server
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = 'relay-under-restart'")
        assert cursor.fetchone()[0] >= 1
    assert relay.stop() == 0  # the same process, still healthy enough for a clean stop
    consumer.wait_until_drained()

    expected_ids = outbox_message_ids()
    assert len(expected_ids) == len(keys) * 140 + 1
    assert outbox_status_counts() == {OutboxStatus.DELIVERED: len(expected_ids)}
    # At least once: a batch cut off by the restart is published again; process_once drops it.
    assert_each_message_applied_once(consumer, consumer_db, expected_ids)
    for key, seqs in seqs_per_key_in_delivery_order(consumer.snapshot()).items():
        assert list(dict.fromkeys(seqs)) == list(range(140)), f"{key} out of order"
    print(f"\n{left_at_restart} messages pending after the restart, "
          f"{consumer.delivery_count() - len(expected_ids)} delivered twice")


# --- 4. Two relays at once ------------------------------------------------------------------


def test_two_relays_deliver_everything_in_key_order_and_nothing_twice(
    committed_db: None, consumer: BrokerConsumer, consumer_db: ConsumerDatabase, start_relay: StartRelay
) -> None:
    keys = [f"key-{i}" for i in range(10)]
    per_key = 200
    enqueue_keyed_messages(keys=keys, per_key=per_key)
    expected_ids = outbox_message_ids()

    # Batches of 5 over 10 keys: each relay can hold half the keys' heads, so both get work.
    relays = [start_relay(batch_size=5, env={"PGAPPNAME": name}) for name in ("relay-a", "relay-b")]

    # Evidence that both relays claimed rows: a transaction that locked rows has an xid.
    xids: dict[str, set[str]] = {"relay-a": set(), "relay-b": set()}

    def sample_and_check_done() -> bool:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT application_name, backend_xid::text FROM pg_stat_activity"
                " WHERE datname = current_database() AND backend_xid IS NOT NULL"
                " AND application_name IN ('relay-a', 'relay-b')"
            )
            for name, xid in cursor.fetchall():
                xids[name].add(xid)
        return pending_count() == 0

    wait_until(sample_and_check_done, timeout=180, what="two relays deliver everything",
               interval=0.01, on_timeout=relay_logs(*relays))
    assert [relay.stop() for relay in relays] == [0, 0]
    consumer.wait_until_drained()

    assert all(xids.values()), f"one relay never claimed anything: {xids}"
    assert outbox_status_counts() == {OutboxStatus.DELIVERED: len(expected_ids)}
    # No crash, so no redelivery: SKIP LOCKED kept the two relays off each other's rows.
    assert consumer.delivery_count() == len(expected_ids)
    assert_each_message_applied_once(consumer, consumer_db, expected_ids)
    seqs_by_key = seqs_per_key_in_delivery_order(consumer.snapshot())
    assert sorted(seqs_by_key) == keys
    for key, seqs in seqs_by_key.items():
        assert seqs == sorted(seqs), f"{key} arrived out of order"
        assert seqs == list(range(per_key)), key
    print(f"\ntransactions that claimed rows: relay-a {len(xids['relay-a'])}, relay-b {len(xids['relay-b'])}")
