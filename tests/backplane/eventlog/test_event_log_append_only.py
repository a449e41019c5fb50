"""The database itself refuses to change or remove events, whatever the client."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from django.db import DatabaseError, connection, transaction

from backplane.eventlog import services
from backplane.eventlog.models import Event, Task
from backplane.eventlog.partitioning import PARTITIONS, partition_name


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


def _partition_of(task: Task) -> str:
    with connection.cursor() as cursor:
        cursor.execute("SELECT tableoid::regclass::text FROM backplane_event WHERE task_id = %s LIMIT 1", [task.pk])
        (partition,) = cursor.fetchone()
    return partition


def test_the_events_are_hash_partitioned_by_task(make_task: Callable[..., Task]) -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT partstrat, partnatts FROM pg_partitioned_table"
                       " WHERE partrelid = 'backplane_event'::regclass")
        assert cursor.fetchone() == ("h", 1)
        cursor.execute("SELECT inhrelid::regclass::text FROM pg_inherits WHERE inhparent = 'backplane_event'::regclass")
        assert {row[0] for row in cursor.fetchall()} == {partition_name(r) for r in range(PARTITIONS)}
    task = make_task()
    # A task's whole chain lies in one partition.
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(DISTINCT tableoid) FROM backplane_event WHERE task_id = %s", [task.pk])
        assert cursor.fetchone() == (1,)


@pytest.mark.parametrize("remainder", [0, PARTITIONS - 1])
@pytest.mark.parametrize("statement", [
    "UPDATE {partition} SET payload = '{{\"forged\": true}}'::jsonb WHERE task_id = %s",
    "DELETE FROM {partition} WHERE task_id = %s",
])
def test_every_partition_rejects_update_and_delete(db: None, statement: str, remainder: int) -> None:
    # Each partition is named directly, so its own (cloned) row trigger must refuse. One task
    # per partition: made until the wanted partition holds one.
    while True:
        task = services.task_create(namespace="acme", kind="k", input={}).task
        if _partition_of(task) == partition_name(remainder):
            break
    before = list(Event.objects.filter(task=task).values())
    with pytest.raises(DatabaseError, match="append-only"):
        run_sql(statement.format(partition=partition_name(remainder)), [task.pk])
    assert list(Event.objects.filter(task=task).values()) == before


@pytest.mark.django_db(transaction=True)
def test_every_partition_rejects_truncate_of_its_rows(committed_db: None) -> None:
    # Statement triggers are not cloned: each partition has its own, which checks its own rows.
    held: set[str] = set()
    created = 0
    while len(held) < 3:
        held.add(_partition_of(services.task_create(namespace="acme", kind="k", input={}).task))
        created += 1
    for partition in sorted(held):
        with pytest.raises(DatabaseError, match="append-only: TRUNCATE"):
            run_sql(f"TRUNCATE {partition}")
    empty = next(partition_name(r) for r in range(PARTITIONS) if partition_name(r) not in held)
    run_sql(f"TRUNCATE {empty}")  # an empty partition destroys nothing
    assert Event.objects.count() == created  # one TaskCreated each
