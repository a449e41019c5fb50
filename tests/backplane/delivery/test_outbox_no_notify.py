"""No commit waits on PostgreSQL's notification lock: writing an outbox row sends no NOTIFY.

A NOTIFY holds the database's one notification-queue lock from its transaction's pre-commit to
the end of the commit's WAL flush, so every append that wrote an outbox row used to commit after
the one before it (migration 0005's trigger; 0028 dropped it). A listener on the channel the
trigger used, on a connection of its own, hears nothing when such appends commit, while the
relay still finds and delivers the rows by polling.
"""

from __future__ import annotations

from collections.abc import Callable

import psycopg
from django.db import connection

from backplane.delivery.models import OutboxMessage, OutboxStatus
from backplane.eventlog import services
from backplane.eventlog.models import Task
from backplane.eventlog.writer import EventDraft, OutboxDraft

CHANNEL = "backplane_outbox"


def listener() -> psycopg.Connection:
    params = connection.get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("context", None)
    conn = psycopg.connect(**params, autocommit=True)
    conn.execute(f"LISTEN {CHANNEL}")
    return conn


def test_appends_with_outbox_messages_commit_without_a_notify(committed_db: None,
                                                              make_task: Callable[..., Task]) -> None:
    task = make_task()
    with listener() as conn:
        for n in range(3):
            services.event_append(
                namespace=task.namespace, task_id=task.pk, agent="a",
                draft=EventDraft(type="Noted", payload={"n": n},
                                 outbox=(OutboxDraft(topic="leads.scored", payload={"n": n}),)),
            )
        heard = list(conn.notifies(timeout=0.5, stop_after=1))
    assert heard == []
    assert OutboxMessage.objects.filter(topic="leads.scored", status=OutboxStatus.PENDING).count() == 3


def test_no_trigger_on_the_outbox_calls_pg_notify(db: None) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT t.tgname FROM pg_trigger t JOIN pg_proc p ON p.oid = t.tgfoid
            WHERE t.tgrelid = 'backplane_outboxmessage'::regclass AND p.prosrc ILIKE '%%notify%%'
            """
        )
        assert cursor.fetchall() == []
