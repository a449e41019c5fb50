"""Move ``backplane_event`` onto hash partitions of ``task_id`` while it keeps taking appends.

The design is docs/scaling.md, "Partitioning the events table"; docs/operations.md says how to
run it on a big table. Migration 0032 calls :func:`events_partition`, which runs these steps,
each its own transaction, each safe to run again after an interruption (a killed ``migrate``
is resumed by running ``migrate`` again):

1. **Prepare.** Create ``backplane_event_partitioned`` (``PARTITIONS`` hash partitions, the same
   columns, checks, identity, keys and indexes as the events table) and two triggers on the
   events table: every insert is copied into the new table in the same transaction (the
   mirror), and every delete (retention's ``backplane_prune_task``) records its task. Creating
   a trigger waits for the appends in flight and holds new ones back until it commits: the
   first short lock. In the same transaction the largest position is read: every event above
   it is mirrored, every event at or below it is committed (its append held the table before
   it drew its position, so it finished before the trigger could be created).
2. **Copy** the events at or below that position in position order, ``BATCH_EVENTS`` at a time,
   one transaction each, the progress recorded in the same transaction. An event the mirror
   already wrote is skipped (``ON CONFLICT``). Events never change, so the copy reads them
   while the product serves.
3. **Swap**, the second short lock: ``ACCESS EXCLUSIVE`` on the task and events tables (appends
   and every read of tasks or events wait; the old table's foreign key cannot go with less);
   the events of tasks retention deleted since step 1 are deleted from the copy (a batch may
   have read them before they went); the old table is dropped; the new one takes its name,
   its index names and its sequence, set past every position the old one gave out; the
   append-only triggers go on the parent (the row trigger is cloned to every partition) and on
   every partition (TRUNCATE triggers are per table); the foreign key to the task is added
   ``NOT VALID``. Before the old table goes, the two must hold the same events (a count and
   the sum of the positions): the copied ones are compared just before the lock, in one
   snapshot (the new table less the pruned tasks), the mirrored ones (above the copy's
   position) under it, after the pruned tasks' events went. A difference refuses the swap and
   leaves everything as it was. Nothing under the lock reads or writes more than the pruned
   tasks' events and the mirrored ones.
4. **Validate** the foreign key: a scan that takes no lock appends wait for.

Rows are copied whole, ``position`` included: every chain and every Merkle leaf stays
byte-identical (hashes do not cover ``position``, and leaves name their event by it).

Steps 1 and 3 wait at most ``LOCK_TIMEOUT`` for their lock and try again (``LOCK_ATTEMPTS``),
so a long transaction on the table delays the migration, never the appends behind it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.db import OperationalError, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from psycopg import errors, sql

logger = logging.getLogger(__name__)

# Fixed when the table is created: changing it means copying every event again.
PARTITIONS = 16
BATCH_EVENTS = 10_000
LOCK_TIMEOUT = "2s"
LOCK_ATTEMPTS = 30

EVENTS = "backplane_event"
NEW = "backplane_event_partitioned"
PROGRESS = "backplane_event_partitioning"
PRUNED = "backplane_event_partitioning_pruned"
SEQUENCE = "backplane_event_position_seq"


def partition_name(remainder: int) -> str:
    return f"{EVENTS}_p{remainder:02d}"


# The keys and indexes of the events table (Event.Meta and migration 0015), on the new table
# under a temporary name (index names are the schema's, and the old table holds them until the
# swap). Unique keys include the partition key, as PostgreSQL requires: ``position`` alone can
# no longer be the primary key; one sequence still gives every position once.
_KEYS_AND_INDEXES = (
    ("backplane_event_pkey", "ALTER TABLE {table} ADD CONSTRAINT {name} PRIMARY KEY (position, task_id)"),
    ("event_unique_seq_per_task", "ALTER TABLE {table} ADD CONSTRAINT {name} UNIQUE (task_id, seq)"),
    ("event_unique_idempotency_key_per_task",
     "CREATE UNIQUE INDEX {name} ON {table} (task_id, idempotency_key) WHERE idempotency_key IS NOT NULL"),
    ("event_type_idx", "CREATE INDEX {name} ON {table} (type)"),
    ("event_claims_by_agent_idx", "CREATE INDEX {name} ON {table} (agent, task_id) WHERE type = 'TaskClaimed'"),
    ("event_payload_search_idx",
     "CREATE INDEX {name} ON {table} USING gin (jsonb_to_tsvector('simple'::regconfig, payload, "
     "'[\"string\", \"numeric\"]'::jsonb)) WITH (fastupdate = off)"),
    ("event_recorded_at_brin", "CREATE INDEX {name} ON {table} USING brin (recorded_at)"),
)


def _temporary(name: str) -> str:
    return f"{name}_partitioned"


_CAPTURE = f"""
CREATE OR REPLACE FUNCTION {PROGRESS}_mirror() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO {NEW} SELECT * FROM inserted;
    RETURN NULL;
END
$$;
CREATE OR REPLACE FUNCTION {PROGRESS}_pruned() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO {PRUNED} SELECT DISTINCT task_id FROM deleted ON CONFLICT DO NOTHING;
    RETURN NULL;
END
$$;
DROP TRIGGER IF EXISTS {PROGRESS}_mirror ON {EVENTS};
CREATE TRIGGER {PROGRESS}_mirror AFTER INSERT ON {EVENTS} REFERENCING NEW TABLE AS inserted
    FOR EACH STATEMENT EXECUTE FUNCTION {PROGRESS}_mirror();
DROP TRIGGER IF EXISTS {PROGRESS}_pruned ON {EVENTS};
CREATE TRIGGER {PROGRESS}_pruned AFTER DELETE ON {EVENTS} REFERENCING OLD TABLE AS deleted
    FOR EACH STATEMENT EXECUTE FUNCTION {PROGRESS}_pruned();
"""

# 0002's TRUNCATE check, for the table the statement names: the parent or one partition (a
# statement trigger is not cloned, and a partition's TRUNCATE fires only the partition's).
_REJECT_TRUNCATE = r"""
CREATE OR REPLACE FUNCTION backplane_event_reject_truncate() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    holds_rows boolean;
BEGIN
    EXECUTE format('SELECT EXISTS (SELECT 1 FROM %I.%I)', TG_TABLE_SCHEMA, TG_TABLE_NAME) INTO holds_rows;
    IF holds_rows THEN
        RAISE EXCEPTION 'backplane_event is append-only: TRUNCATE is not allowed'
            USING ERRCODE = 'restrict_violation',
                  HINT = 'events are immutable; append a new event instead';
    END IF;
    RETURN NULL;
END
$$;
"""


@dataclass
class PartitionReport:
    """What a run did: the events it copied, how long, and how long each lock held appends."""

    copied: int = 0
    batches: int = 0
    copy_seconds: float = 0.0
    # From asking for the lock to the commit: the longest an append could have waited on it.
    capture_lock_seconds: float = 0.0
    swap_lock_seconds: float = 0.0
    steps: list[str] = field(default_factory=list)


def events_partitioned(connection: BaseDatabaseWrapper) -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT relkind FROM pg_class WHERE oid = to_regclass(%s)", [EVENTS])
        row = cursor.fetchone()
    return row is not None and row[0] == "p"


def events_partition(connection: BaseDatabaseWrapper, *, batch: int = BATCH_EVENTS) -> PartitionReport:
    """Run whatever of steps 1-4 (the module's docstring) is not done yet; ``connection`` must be
    in autocommit (a migration with ``atomic = False``)."""
    report = PartitionReport()
    with connection.cursor() as cursor:
        cursor.execute("SHOW server_version_num")
        (version,) = cursor.fetchone()
    if int(version) < 170000:
        raise RuntimeError("partitioning the events table needs PostgreSQL 17 or later (an identity column on a "
                           "partitioned table)")
    if not events_partitioned(connection):
        _prepare(connection, report)
        _copy(connection, report, batch=batch)
        _swap(connection, report)
    _validate(connection, report)
    logger.info("events partitioned: %s events copied in %d batches, %.1f s; appends held %.0f ms (capture) and "
                "%.0f ms (swap)", report.copied, report.batches, report.copy_seconds,
                report.capture_lock_seconds * 1000, report.swap_lock_seconds * 1000)
    return report


Statement = str | sql.Composable


def _execute(connection: BaseDatabaseWrapper, statement: Statement, params: list[Any] | None = None) -> None:
    with connection.cursor() as cursor:
        cursor.execute(statement, params)


def _one(connection: BaseDatabaseWrapper, statement: Statement, params: list[Any] | None = None) -> tuple[Any, ...]:
    with connection.cursor() as cursor:
        cursor.execute(statement, params)
        row = cursor.fetchone()
    assert row is not None
    return row


def _exists(connection: BaseDatabaseWrapper, relation: str) -> bool:
    return _one(connection, "SELECT to_regclass(%s) IS NOT NULL", [relation])[0]


def _under_lock(connection: BaseDatabaseWrapper, step: str, work: Callable[[BaseDatabaseWrapper], None]) -> float:
    """Run ``work(connection)`` in a transaction that waits at most LOCK_TIMEOUT for its lock,
    again until it gets one; return the seconds from its first statement to its commit."""
    for attempt in range(1, LOCK_ATTEMPTS + 1):
        started = time.monotonic()
        try:
            with transaction.atomic(using=connection.alias):
                _execute(connection, f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
                work(connection)
            return time.monotonic() - started
        except OperationalError as exc:
            if not isinstance(exc.__cause__, errors.LockNotAvailable) or attempt == LOCK_ATTEMPTS:
                raise
            logger.warning("partitioning, %s: the events table is busy (attempt %d), trying again", step, attempt)
            time.sleep(0.5)
    raise AssertionError("unreachable")


def _app_role_exists(connection: BaseDatabaseWrapper) -> bool:
    return _one(connection, "SELECT EXISTS (SELECT FROM pg_roles WHERE rolname = %s)",
                [settings.BACKPLANE_DB_APP_ROLE])[0]


def _create_new_table(connection: BaseDatabaseWrapper) -> None:
    """The partitioned table, empty, with everything but the triggers and the foreign key
    (added at the swap: the copy must be able to drop what retention deleted meanwhile)."""
    table = sql.Identifier(NEW)
    _execute(connection, sql.SQL(
        "CREATE TABLE {} (LIKE {} INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING IDENTITY INCLUDING STORAGE"
        " INCLUDING COMPRESSION) PARTITION BY HASH (task_id)").format(table, sql.Identifier(EVENTS)))
    for remainder in range(PARTITIONS):
        partition = sql.SQL("CREATE TABLE {} PARTITION OF {} FOR VALUES WITH (MODULUS {}, REMAINDER {})")
        _execute(connection, partition.format(
            sql.Identifier(partition_name(remainder)), table, sql.Literal(PARTITIONS), sql.Literal(remainder)))
    for name, definition in _KEYS_AND_INDEXES:
        _execute(connection, sql.SQL(definition).format(table=table, name=sql.Identifier(_temporary(name))))
    if _app_role_exists(connection):
        # As 0018 grants the events table: read and append, nothing else, and only through the
        # parent (a partition's privileges are not checked when the parent is named).
        role = sql.Identifier(settings.BACKPLANE_DB_APP_ROLE)
        (sequence,) = _one(connection, "SELECT pg_get_serial_sequence(%s, 'position')", [NEW])
        partitions = [sql.Identifier(partition_name(r)) for r in range(PARTITIONS)]
        _execute(connection, sql.SQL("REVOKE ALL ON {} FROM {}").format(
            sql.SQL(", ").join([table, *partitions]), role))
        _execute(connection, sql.SQL("GRANT SELECT, INSERT ON {} TO {}").format(table, role))
        _execute(connection, sql.SQL("GRANT USAGE, SELECT ON SEQUENCE {} TO {}").format(
            sql.SQL(sequence), role))


def _prepare(connection: BaseDatabaseWrapper, report: PartitionReport) -> None:
    """Step 1: the new table, and the triggers that keep it up to date from here on."""
    with transaction.atomic(using=connection.alias):
        if not _exists(connection, NEW):
            _create_new_table(connection)
            report.steps.append("created the partitioned table")
        _execute(connection, f"CREATE TABLE IF NOT EXISTS {PROGRESS} (id int PRIMARY KEY CHECK (id = 1),"
                             " copy_through bigint NOT NULL, copied_to bigint NOT NULL)")
        _execute(connection, f"CREATE TABLE IF NOT EXISTS {PRUNED} (task_id uuid PRIMARY KEY)")
        if _app_role_exists(connection):
            _execute(connection, sql.SQL("REVOKE ALL ON {}, {} FROM {}").format(
                sql.Identifier(PROGRESS), sql.Identifier(PRUNED), sql.Identifier(settings.BACKPLANE_DB_APP_ROLE)))
        if _one(connection, f"SELECT EXISTS (SELECT FROM {PROGRESS})")[0]:
            return  # the triggers were made with the progress row, by an earlier run

    def capture(conn: BaseDatabaseWrapper) -> None:
        _execute(conn, _CAPTURE)
        (through,) = _one(conn, f"SELECT coalesce(max(position), 0) FROM {EVENTS}")
        _execute(conn, f"INSERT INTO {PROGRESS} (id, copy_through, copied_to) VALUES (1, %s, 0)", [through])

    report.capture_lock_seconds = _under_lock(connection, "capture", capture)
    report.steps.append("mirrored appends and deletions")


def _copy(connection: BaseDatabaseWrapper, report: PartitionReport, *, batch: int) -> None:
    """Step 2: the events that were there before the mirror, a batch per transaction."""
    started = time.monotonic()
    while True:
        with transaction.atomic(using=connection.alias), connection.cursor() as cursor:
            cursor.execute(f"SELECT copy_through, copied_to FROM {PROGRESS} FOR UPDATE")
            through, copied_to = cursor.fetchone()
            if copied_to >= through:
                break
            cursor.execute(f"SELECT max(position) FROM (SELECT position FROM {EVENTS} WHERE position > %s"
                           " AND position <= %s ORDER BY position LIMIT %s) AS b", [copied_to, through, batch])
            upper = cursor.fetchone()[0] or through
            cursor.execute(f"INSERT INTO {NEW} SELECT * FROM {EVENTS} WHERE position > %s AND position <= %s"
                           " ON CONFLICT (position, task_id) DO NOTHING", [copied_to, upper])
            report.copied += cursor.rowcount
            cursor.execute(f"UPDATE {PROGRESS} SET copied_to = %s", [upper])
        report.batches += 1
    report.copy_seconds = time.monotonic() - started
    # The planner's statistics, before the table serves reads (ANALYZE lets appends through).
    _execute(connection, f"ANALYZE {NEW}")


# What the two tables hold (a count and the sum of the positions: a missing or extra event
# changes both), in one statement: one snapshot of both tables.
_TOTALS = """
SELECT old_rows.events, old_rows.positions, new_rows.events, new_rows.positions
FROM (SELECT count(*) AS events, coalesce(sum(position), 0) AS positions
      FROM {events} WHERE {range}) AS old_rows,
     (SELECT count(*) AS events, coalesce(sum(position), 0) AS positions
      FROM {new} AS n WHERE {range}{pruned}) AS new_rows
"""
# The copied events, before the lock: a pruning deletes a task's old rows and records the task
# in one transaction, so in one snapshot the old table holds the new one's less those tasks.
_COPIED_TOTALS = _TOTALS.format(events=EVENTS, new=NEW, range="position <= %s",
                                pruned=f" AND NOT EXISTS (SELECT FROM {PRUNED} p WHERE p.task_id = n.task_id)")
# The mirrored events, under the lock, once the pruned tasks' events are gone from the copy.
_MIRRORED_TOTALS = _TOTALS.format(events=EVENTS, new=NEW, range="position > %s", pruned="")


def _refuse_unless_equal(connection: BaseDatabaseWrapper, totals: str, *, through: int, which: str) -> None:
    """Raise, before anything is dropped, if the tables differ over the positions ``which`` names."""
    old_events, old_positions, new_events, new_positions = _one(connection, totals, [through, through])
    if (old_events, old_positions) != (new_events, new_positions):
        raise RuntimeError(
            f"partitioning refused the swap: {EVENTS} holds {old_events} events {which} position {through}"
            f" (positions summing to {old_positions}), {NEW} {new_events} (summing to {new_positions});"
            f" {EVENTS} is unchanged. Give this run up (docs/operations.md, \"Partitioning the events table\")"
            " and run migrate again")


def _swap(connection: BaseDatabaseWrapper, report: PartitionReport) -> None:
    """Step 3, under ACCESS EXCLUSIVE: the new table becomes the events table, if it holds the
    old one's events (compared in two parts, so that nothing under the lock reads the whole table)."""
    (through,) = _one(connection, f"SELECT copy_through FROM {PROGRESS}")
    # A full scan of both tables, which appends do not wait for (ACCESS SHARE).
    _refuse_unless_equal(connection, _COPIED_TOTALS, through=through, which="at or below")

    def swap(conn: BaseDatabaseWrapper) -> None:
        # The task table first, as an append takes its locks (the task's row, then the events):
        # dropping the old table's foreign key needs ACCESS EXCLUSIVE on backplane_task too, and
        # asking for it after the events' lock would deadlock with an append holding its task's row.
        _execute(conn, f"LOCK TABLE backplane_task, {EVENTS} IN ACCESS EXCLUSIVE MODE")
        through, copied_to = _one(conn, f"SELECT copy_through, copied_to FROM {PROGRESS}")
        if copied_to < through:
            raise RuntimeError(f"partitioning: the copy stopped at position {copied_to} of {through}")
        # A batch may have read a task's events before retention deleted them.
        _execute(conn, f"DELETE FROM {NEW} WHERE task_id IN (SELECT task_id FROM {PRUNED})")
        # The appends since step 1 (position index ranges): nothing changes either table now.
        _refuse_unless_equal(conn, _MIRRORED_TOTALS, through=through, which="above")
        (foreign_key,) = _one(conn, "SELECT conname FROM pg_constraint WHERE conrelid = %s::regclass AND contype = 'f'"
                                    " AND confrelid = 'backplane_task'::regclass", [EVENTS])
        (old_sequence,) = _one(conn, "SELECT pg_get_serial_sequence(%s, 'position')", [EVENTS])
        last_value, is_called = _one(conn, sql.SQL("SELECT last_value, is_called FROM {}").format(
            sql.SQL(old_sequence)))
        (new_sequence,) = _one(conn, "SELECT pg_get_serial_sequence(%s, 'position')", [NEW])
        # Its indexes, triggers, foreign key and identity sequence go with it; nothing else
        # refers to it (0019 dropped the leaves' foreign key), or this fails and changes nothing.
        _execute(conn, f"DROP TABLE {EVENTS}")
        _execute(conn, f"DROP FUNCTION {PROGRESS}_mirror(), {PROGRESS}_pruned()")
        _execute(conn, f"DROP TABLE {PRUNED}, {PROGRESS}")
        _execute(conn, f"ALTER TABLE {NEW} RENAME TO {EVENTS}")
        _execute(conn, sql.SQL("ALTER SEQUENCE {} RENAME TO {}").format(
            sql.SQL(new_sequence), sql.Identifier(SEQUENCE)))
        for name, _definition in _KEYS_AND_INDEXES:
            # Renaming a key's index renames the key.
            _execute(conn, sql.SQL("ALTER INDEX {} RENAME TO {}").format(
                sql.Identifier(_temporary(name)), sql.Identifier(name)))
        # Past every position the old sequence gave out, committed or not.
        (largest,) = _one(conn, f"SELECT max(position) FROM {EVENTS}")
        if is_called or largest is not None:
            _execute(conn, "SELECT setval(%s, %s, true)", [SEQUENCE, max(last_value, largest or 0)])
        _execute(conn, _REJECT_TRUNCATE)
        _execute(conn, f"CREATE TRIGGER backplane_event_no_update_or_delete BEFORE UPDATE OR DELETE ON {EVENTS}"
                       " FOR EACH ROW EXECUTE FUNCTION backplane_event_reject_change()")
        for table in (EVENTS, *(partition_name(r) for r in range(PARTITIONS))):
            _execute(conn, f"CREATE TRIGGER backplane_event_no_truncate BEFORE TRUNCATE ON {table}"
                           " FOR EACH STATEMENT EXECUTE FUNCTION backplane_event_reject_truncate()")
        # Checked for every append from now on; the rows already there, in step 4.
        _execute(conn, sql.SQL("ALTER TABLE {} ADD CONSTRAINT {} FOREIGN KEY (task_id) REFERENCES backplane_task (id)"
                               " DEFERRABLE INITIALLY DEFERRED NOT VALID").format(
            sql.Identifier(EVENTS), sql.Identifier(foreign_key)))

    report.swap_lock_seconds = _under_lock(connection, "swap", swap)
    report.steps.append("swapped the tables")


def _validate(connection: BaseDatabaseWrapper, report: PartitionReport) -> None:
    """Step 4: the foreign key checked over the copied rows (SHARE UPDATE EXCLUSIVE: appends go on)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT conname FROM pg_constraint WHERE conrelid = %s::regclass AND contype = 'f'"
                       " AND NOT convalidated", [EVENTS])
        pending = [name for (name,) in cursor.fetchall()]
    for name in pending:
        _execute(connection, sql.SQL("ALTER TABLE {} VALIDATE CONSTRAINT {}").format(
            sql.Identifier(EVENTS), sql.Identifier(name)))
        report.steps.append(f"validated {name}")
