"""The database itself refuses to change or remove events, whatever the client."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from django.db import DatabaseError, connection, transaction

from backplane.eventlog import services
from backplane.eventlog.models import Event, Task


def run_sql(sql: str, params: list | None = None) -> None:
    # Each attempt in a savepoint so the failure leaves the test's transaction usable.
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(sql, params)


@pytest.mark.parametrize(
    "sql",
    [
        "UPDATE backplane_event SET payload = '{\"forged\": true}'::jsonb WHERE task_id = %s",
        "UPDATE backplane_event SET hash = repeat('0', 64) WHERE task_id = %s",
        "DELETE FROM backplane_event WHERE task_id = %s",
    ],
)
def test_it_rejects_update_and_delete_in_raw_sql(make_task: Callable[..., Task], sql: str) -> None:
    task = make_task()
    before = list(Event.objects.filter(task=task).values())
    with pytest.raises(DatabaseError, match="append-only"):
        run_sql(sql, [task.pk])
    assert list(Event.objects.filter(task=task).values()) == before


@pytest.mark.django_db(transaction=True)
def test_it_rejects_truncate(committed_db: None) -> None:
    # Committed first: inside the creating transaction PostgreSQL refuses TRUNCATE anyway
    # (pending deferred foreign-key checks), which would prove nothing about the trigger.
    services.task_create(namespace="acme", kind="k", input={})
    with pytest.raises(DatabaseError, match="append-only: TRUNCATE"):
        run_sql("TRUNCATE backplane_event CASCADE")
    assert Event.objects.count() == 1


def test_it_rejects_the_orm_too(make_task: Callable[..., Task]) -> None:
    make_task()
    with pytest.raises(DatabaseError, match="append-only"):
        with transaction.atomic():
            Event.objects.update(type="Forged")
    with pytest.raises(DatabaseError, match="append-only"):
        with transaction.atomic():
            Event.objects.all().delete()
    assert Event.objects.filter(type="TaskStarted").count() == 1
