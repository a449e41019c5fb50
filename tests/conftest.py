"""Fixtures shared by the whole suite. Every test runs against the real PostgreSQL."""

from __future__ import annotations

import io
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.conf import settings
from django.core.management import call_command
from django.db import connection
from kombu import Connection, Exchange, Queue

from backplane.eventlog import services
from backplane.eventlog.models import Task


@pytest.fixture(autouse=True)
def _no_live_notices_unless_asked(settings: Any) -> None:
    """Live notices (dashboard/live.py) are off in the test process: its channel layer is
    configured with the database's original name, not pytest-django's test database. The
    tests of live updates turn them on with ``live_channel_layer``; servers the tests start
    as processes read their own environment and have them on."""
    settings.BACKPLANE_LIVE_NOTICES = False


@pytest.fixture(autouse=True)
def _database_gate_open() -> None:
    """The database gate (backplane/runtime/database_gate.py) is one fact per process: a test
    that made the database unreachable must not leave the next test answered with 503s."""
    from backplane.runtime.database_gate import gate

    gate.mark_up()


@pytest.fixture
def committed_db(transactional_db: None) -> Iterator[None]:
    """Like ``transactional_db`` (real commits, visible to other connections and threads).

    The event table refuses DELETE and TRUNCATE, so before pytest-django's flush
    truncates everything, the events are removed as a superuser with triggers skipped
    (``session_replication_role = replica``). Truncating the then empty table is allowed.
    """
    yield
    with connection.cursor() as cursor:
        cursor.execute("SET session_replication_role = replica")
        cursor.execute("DELETE FROM backplane_event")
        cursor.execute("SET session_replication_role = origin")


@pytest.fixture
def make_task(db: None) -> Callable[..., Task]:
    def make(namespace: str = "acme", kind: str = "lead-qualification", **kwargs: Any) -> Task:
        kwargs.setdefault("input", {"lead": "alice@example.com"})
        return services.task_create(namespace=namespace, kind=kind, agent="planner", **kwargs).task

    return make


@pytest.fixture
def task_id() -> uuid.UUID:
    return uuid.uuid4()


def check_projections() -> tuple[int, str]:
    """Run ``manage.py rebuild_projections --check`` in process: (exit code, what it printed)."""
    out = io.StringIO()
    try:
        call_command("rebuild_projections", "--check", stdout=out, stderr=out)
    except SystemExit as exc:
        return int(exc.code or 0), out.getvalue()
    return 0, out.getvalue()


def celery_messages_taken() -> list[tuple[str, list[Any]]]:
    """Every task message on Celery's default queue of the real broker, taken off it: (the task's
    name, its positional arguments). The fast tier runs no worker, so nothing else takes them."""
    from backplane.celery import app

    taken: list[tuple[str, list[Any]]] = []
    with app.connection_for_read() as conn, conn.SimpleQueue(app.conf.task_default_queue) as queue:
        while True:
            try:
                message = queue.get(timeout=0.5)
            except queue.Empty:
                return taken
            message.ack()
            taken.append((message.headers["task"], message.payload[0]))


@pytest.fixture
def broker_queue() -> Iterator[Any]:
    """A queue bound to every topic on the real (filesystem) broker the relay publishes to: a
    message no queue is bound for is unroutable and never marked delivered."""
    conn = Connection(settings.BACKPLANE_OUTBOX_BROKER_URL, transport_options=settings.CELERY_BROKER_TRANSPORT_OPTIONS)
    queue = Queue(f"test-{uuid.uuid4().hex[:8]}", Exchange(settings.BACKPLANE_OUTBOX_EXCHANGE, type="topic"),
                  routing_key="#")
    with conn.SimpleQueue(queue) as simple:
        simple.clear()
        yield simple
    # Unbind, or every later publish in the session also writes a file for this queue.
    queue.bind(conn.default_channel).delete()
    conn.release()
