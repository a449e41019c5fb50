"""process_once against a real PostgreSQL: the consumer's own throw-away database, real threads.

These tests do not touch Django's test database: a downstream consumer has its own database,
so each test creates one on the suite's server (DATABASE_URL) and drops it afterwards.
"""

from __future__ import annotations

import json
import os
import queue
import random
import secrets
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest

from backplane_client.consumer import (
    DEFAULT_TABLE,
    Envelope,
    ensure_processed_table,
    handle_kombu_message,
    process_once,
)

Conn = psycopg.Connection[Any]


@pytest.fixture
def consumer_url() -> Iterator[str]:
    """A fresh database standing for the consumer's own, dropped (connections and all) at teardown."""
    server_url = os.environ["DATABASE_URL"]
    name = f"consumer_{secrets.token_hex(6)}"
    with psycopg.connect(server_url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    url = urlunsplit(urlsplit(server_url)._replace(path=f"/{name}"))
    with psycopg.connect(url, autocommit=True) as conn:
        ensure_processed_table(conn)
        conn.execute("CREATE TABLE effects (id bigserial PRIMARY KEY, message_id uuid NOT NULL, value text)")
    try:
        yield url
    finally:
        with psycopg.connect(server_url, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def connect(consumer_url: str) -> Iterator[Callable[..., Conn]]:
    """Open connections to the consumer database; all are closed at teardown."""
    opened: list[Conn] = []

    def open_(autocommit: bool = True) -> Conn:
        conn = psycopg.connect(consumer_url, autocommit=autocommit)
        opened.append(conn)
        return conn

    yield open_
    for conn in opened:
        conn.close()


def envelope(message_id: uuid.UUID | None = None, value: str = "x") -> dict[str, Any]:
    return {
        "message_id": str(message_id or uuid.uuid4()),
        "topic": "task.completed",
        "key": "task-1",
        "payload": {"value": value},
        "headers": {"trace_id": "t-1"},
    }


def apply_effect(conn: Conn, env: Envelope) -> None:
    conn.execute(
        "INSERT INTO effects (message_id, value) VALUES (%s, %s)", (env["message_id"], env["payload"]["value"])
    )


def effects(conn: Conn) -> list[tuple[uuid.UUID, str]]:
    return [(row[0], row[1]) for row in conn.execute("SELECT message_id, value FROM effects ORDER BY id")]


def processed_ids(conn: Conn) -> set[uuid.UUID]:
    return {row[0] for row in conn.execute(f"SELECT message_id FROM {DEFAULT_TABLE}")}


@pytest.mark.parametrize("autocommit", [True, False], ids=["autocommit", "manual-commit"])
def test_it_runs_the_handler_once_and_records_the_id(connect: Callable[..., Conn], autocommit: bool) -> None:
    conn, observer = connect(autocommit=autocommit), connect()
    env = envelope(value="first")
    calls: list[Envelope] = []

    def handler(c: Conn, e: Envelope) -> None:
        calls.append(e)
        apply_effect(c, e)

    assert process_once(conn, env, handler) is True
    # Committed: visible from another connection, and the handler's connection is idle again.
    assert effects(observer) == [(uuid.UUID(env["message_id"]), "first")]
    row = observer.execute(f"SELECT topic, processed_at FROM {DEFAULT_TABLE}").fetchone()
    assert row is not None and row[0] == "task.completed" and row[1] is not None
    assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE

    assert process_once(conn, env, handler) is False
    assert process_once(conn, dict(env), handler) is False  # a redelivered copy, not the same object
    assert len(calls) == 1
    assert len(effects(observer)) == 1
    assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE


def test_it_accepts_a_uuid_object_as_the_message_id(connect: Callable[..., Conn]) -> None:
    conn = connect()
    message_id = uuid.uuid4()
    assert process_once(conn, envelope(message_id), apply_effect) is True
    assert process_once(conn, {**envelope(), "message_id": message_id}, apply_effect) is False
    assert processed_ids(conn) == {message_id}


@pytest.mark.parametrize("autocommit", [True, False], ids=["autocommit", "manual-commit"])
def test_it_records_nothing_when_the_handler_raises_and_a_retry_succeeds(
    connect: Callable[..., Conn], autocommit: bool
) -> None:
    conn, observer = connect(autocommit=autocommit), connect()
    env = envelope()

    def failing(c: Conn, e: Envelope) -> None:
        apply_effect(c, e)  # written, then rolled back with the id
        raise RuntimeError("downstream is down")

    with pytest.raises(RuntimeError, match="downstream is down"):
        process_once(conn, env, failing)
    assert processed_ids(observer) == set()
    assert effects(observer) == []
    assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE

    assert process_once(conn, env, apply_effect) is True
    assert processed_ids(observer) == {uuid.UUID(env["message_id"])}
    assert len(effects(observer)) == 1


def test_it_refuses_a_connection_with_an_open_transaction(connect: Callable[..., Conn]) -> None:
    conn = connect(autocommit=False)
    conn.execute("SELECT 1")  # psycopg opened a transaction implicitly
    with pytest.raises(RuntimeError, match="idle connection"):
        process_once(conn, envelope(), apply_effect)
    conn.rollback()
    assert process_once(conn, envelope(), apply_effect) is True


@pytest.mark.parametrize(
    "bad",
    [{}, {"message_id": None}, {"message_id": "not-a-uuid"}, {"message_id": 42}],
    ids=["missing", "none", "garbage", "int"],
)
def test_it_rejects_an_envelope_without_a_valid_message_id(connect: Callable[..., Conn], bad: dict[str, Any]) -> None:
    conn = connect()
    with pytest.raises(ValueError, match="message_id"):
        process_once(conn, {**envelope(), **bad} if bad else {"topic": "t"}, apply_effect)
    assert processed_ids(conn) == set()


@pytest.mark.parametrize(
    "table", ["", "Processed", "1abc", "a-b", 'x"; DROP TABLE effects; --', "a.b.c", "x" * 64, "a b"]
)
def test_it_validates_the_table_name(connect: Callable[..., Conn], table: str) -> None:
    conn = connect()
    with pytest.raises(ValueError, match="invalid table name"):
        ensure_processed_table(conn, table=table)
    with pytest.raises(ValueError, match="invalid table name"):
        process_once(conn, envelope(), apply_effect, table=table)
    assert effects(conn) == []


def test_it_supports_a_custom_and_schema_qualified_table(connect: Callable[..., Conn]) -> None:
    conn = connect()
    conn.execute("CREATE SCHEMA inbox")
    ensure_processed_table(conn, table="inbox.seen")
    ensure_processed_table(conn, table="inbox.seen")  # idempotent
    env = envelope()
    assert process_once(conn, env, apply_effect, table="inbox.seen") is True
    assert process_once(conn, env, apply_effect, table="inbox.seen") is False
    assert conn.execute("SELECT count(*) FROM inbox.seen").fetchone() == (1,)
    assert processed_ids(conn) == set()  # the default table was not used


def test_it_runs_the_handler_exactly_once_under_real_concurrency(connect: Callable[..., Conn]) -> None:
    """8 processes receive the same message at the same moment: one handler run, seven duplicates."""
    threads_count = 8
    env = envelope()
    connections = [connect() for _ in range(threads_count)]
    barrier = threading.Barrier(threads_count)
    results: list[bool] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def handler(c: Conn, e: Envelope) -> None:
        apply_effect(c, e)
        time.sleep(0.3)  # hold the uncommitted row so the others really queue behind it

    def worker(conn: Conn) -> None:
        try:
            barrier.wait(timeout=30)
            result = process_once(conn, env, handler)
            with lock:
                results.append(result)
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            with lock:
                errors.append(exc)

    threads = [threading.Thread(target=worker, args=(c,)) for c in connections]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors, errors
    assert sorted(results) == [False] * (threads_count - 1) + [True]
    observer = connect()
    assert len(effects(observer)) == 1
    assert processed_ids(observer) == {uuid.UUID(env["message_id"])}


def test_it_lets_a_waiting_duplicate_take_over_when_the_first_handler_fails(connect: Callable[..., Conn]) -> None:
    """The second delivery waits on the first's uncommitted id; the first fails, so the second does the work."""
    env = envelope()
    first_inserted = threading.Event()
    release_first = threading.Event()
    outcome: dict[str, Any] = {}
    first_conn, second_conn, monitor = connect(), connect(), connect()
    second_pid = second_conn.info.backend_pid

    def failing(c: Conn, e: Envelope) -> None:
        apply_effect(c, e)
        first_inserted.set()
        release_first.wait(timeout=30)
        raise RuntimeError("first consumer crashed")

    def first() -> None:
        try:
            process_once(first_conn, env, failing)
        except RuntimeError as exc:
            outcome["first"] = exc

    def second() -> None:
        outcome["second"] = process_once(second_conn, env, apply_effect)

    t1 = threading.Thread(target=first)
    t1.start()
    assert first_inserted.wait(timeout=30)
    t2 = threading.Thread(target=second)
    t2.start()
    # Wait until the second backend is blocked on the first one's row lock.
    deadline = time.monotonic() + 30
    while True:
        row = monitor.execute("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", (second_pid,)).fetchone()
        if row is not None and row[0] == "Lock":
            break
        assert time.monotonic() < deadline, "the second delivery never waited for the first"
        time.sleep(0.02)
    assert "second" not in outcome
    release_first.set()
    t1.join(timeout=30)
    t2.join(timeout=30)
    assert isinstance(outcome["first"], RuntimeError)
    assert outcome["second"] is True
    assert len(effects(monitor)) == 1
    assert processed_ids(monitor) == {uuid.UUID(env["message_id"])}


def test_it_applies_each_of_many_redelivered_messages_exactly_once(connect: Callable[..., Conn]) -> None:
    """200 messages, each delivered 1 to 3 times in shuffled order, consumed by 4 threads."""
    rng = random.Random(20240611)
    messages = [envelope(value=f"v{i}") for i in range(200)]
    deliveries = [copy for m in messages for copy in [dict(m)] * rng.randint(1, 3)]
    rng.shuffle(deliveries)
    inbox: queue.SimpleQueue[dict[str, Any]] = queue.SimpleQueue()
    for delivery in deliveries:
        inbox.put(delivery)
    processed: list[bool] = []
    errors: list[BaseException] = []
    lock = threading.Lock()
    barrier = threading.Barrier(4)

    def worker(conn: Conn) -> None:
        try:
            barrier.wait(timeout=30)
            while True:
                try:
                    delivery = inbox.get_nowait()
                except queue.Empty:
                    return
                result = process_once(conn, delivery, apply_effect)
                with lock:
                    processed.append(result)
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            with lock:
                errors.append(exc)

    threads = [threading.Thread(target=worker, args=(connect(autocommit=i % 2 == 0),)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors, errors
    assert len(processed) == len(deliveries) > len(messages)
    assert processed.count(True) == len(messages)
    observer = connect()
    rows = effects(observer)
    assert sorted(rows) == sorted((uuid.UUID(m["message_id"]), m["payload"]["value"]) for m in messages)
    assert processed_ids(observer) == {uuid.UUID(m["message_id"]) for m in messages}


class FakeMessage:
    """Stands in for kombu.Message; records whether the effect was committed when ack() ran."""

    def __init__(self, observer: Conn) -> None:
        self.observer = observer
        self.acks = 0
        self.effects_at_ack: int | None = None

    def ack(self) -> None:
        self.acks += 1
        self.effects_at_ack = len(effects(self.observer))


@pytest.mark.parametrize(
    "encode", [lambda e: e, json.dumps, lambda e: json.dumps(e).encode()], ids=["dict", "str", "bytes"]
)
def test_it_acks_a_kombu_message_only_after_the_commit(
    connect: Callable[..., Conn], encode: Callable[[dict[str, Any]], Any]
) -> None:
    conn, observer = connect(), connect()
    env = envelope()
    first = FakeMessage(observer)
    assert handle_kombu_message(conn, encode(env), first, apply_effect) is True
    assert (first.acks, first.effects_at_ack) == (1, 1)  # another connection saw the effect at ack time

    redelivered = FakeMessage(observer)
    assert handle_kombu_message(conn, encode(env), redelivered, apply_effect) is False
    assert redelivered.acks == 1  # duplicates are acknowledged too
    assert len(effects(observer)) == 1


def test_it_does_not_ack_a_kombu_message_whose_handler_fails(connect: Callable[..., Conn]) -> None:
    conn, observer = connect(), connect()
    message = FakeMessage(observer)

    def failing(c: Conn, e: Envelope) -> None:
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        handle_kombu_message(conn, envelope(), message, failing)
    with pytest.raises(ValueError, match="not valid JSON"):
        handle_kombu_message(conn, "{not json", message, apply_effect)
    with pytest.raises(ValueError, match="JSON object"):
        handle_kombu_message(conn, "[1, 2]", message, apply_effect)
    assert message.acks == 0
    assert processed_ids(observer) == set()
