"""The task row as its log makes it: replay, check, rebuild.

A task row is a projection of its events (``backplane.eventlog.reducer``), written by the writer
in the same transaction as every append. These functions prove it and repair it:

- ``projection_replay`` folds a task's log through the reducer, streamed from SQL;
- ``projection_check`` compares rows with their replayed logs, without locks;
- ``projection_rebuild`` rewrites the rows that differ, each under its row lock.

``manage.py rebuild_projections`` runs the last two; the periodic integrity run makes the same
comparison for the tasks it verifies (``backplane.integrity.verification``).
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from backplane.eventlog import event_types as et
from backplane.eventlog.errors import InvalidInput, NotFound
from backplane.eventlog.models import Task
from backplane.eventlog.reducer import (
    REDUCED_FIELDS,
    TRANSITION_TYPES,
    TaskState,
    projection_differences,
    task_replay,
    task_state_apply,
    task_state_as_json,
    task_state_of,
)
from backplane.eventlog.selectors import STREAMS_IN_CHUNKS, StreamedEvent, use_c_timestamp_loader
from backplane.eventlog.writer import EventDraft, lock_task, write_events

# What the reducer reads of a task's events, in seq order (an index range scan on (task, seq)).
# Only transitions have their payload read (reducer.TRANSITION_TYPES): the others' payloads,
# most of a log's bytes, stay on the server.
_REPLAY_SQL = """
SELECT seq, type, CASE WHEN type = ANY(%s) THEN payload END, lamport, recorded_at, hash
FROM backplane_event
WHERE task_id = %s AND seq <= %s
ORDER BY seq
"""
_TRANSITION_TYPE_LIST = sorted(TRANSITION_TYPES)
# Beyond any seq (PositiveIntegerField): a replay of the whole log.
_WHOLE_LOG = 2**31 - 1


def projection_replay(*, task_id: uuid.UUID, through_seq: int | None = None, chunk_size: int = 2000) -> TaskState:
    """The reducer's fold of a task's events (``seq <= through_seq``, default all of them).

    The rows are streamed ``chunk_size`` at a time, so a long log takes bounded memory. The
    stream is read to its end even when the reducer raises: leaving it half-read would make
    psycopg cancel the statement, which aborts the caller's transaction.
    """
    params = [_TRANSITION_TYPE_LIST, task_id, _WHOLE_LOG if through_seq is None else through_seq]
    with connection.cursor() as cursor, connection.wrap_database_errors:
        use_c_timestamp_loader(cursor)
        rows = cursor.cursor.stream(_REPLAY_SQL, params, size=chunk_size if STREAMS_IN_CHUNKS else 1)
        events = (
            StreamedEvent(seq, type_, {} if payload is None else json.loads(payload), lamport, recorded_at, hash_)
            for seq, type_, payload, lamport, recorded_at, hash_ in rows
        )
        try:
            return task_replay(events)
        finally:
            for _ in rows:
                pass


@dataclass(frozen=True)
class ProjectionDrift:
    """A task row that is not what its log makes of it: ``{field: (row value, log value)}``."""

    task_id: uuid.UUID
    differences: dict[str, tuple[Any, Any]]


def projection_check(
    *, task_ids: Sequence[uuid.UUID] | None = None, batch_size: int = 500
) -> Iterator[ProjectionDrift]:
    """Every task (or the given ones) whose row differs from its replayed log, in id order.

    No lock is taken: each row is compared with its log only up to the row's own ``last_seq``.
    Events are append-only and every event up to ``last_seq`` committed with (or before) that
    version of the row, so an append racing the check is simply not seen, on either side.
    """
    for row in _rows(task_ids=task_ids, batch_size=batch_size):
        replayed = projection_replay(task_id=row.task_id, through_seq=row.state.last_seq)
        differences = projection_differences(row.state, replayed)
        if differences:
            yield ProjectionDrift(row.task_id, differences)


def projection_rebuild(*, task_ids: Sequence[uuid.UUID] | None = None, batch_size: int = 500) -> int:
    """Rewrite every task row (or the given ones) that differs from its log; how many changed.

    One transaction per task, holding its row lock: appends to that task wait, so the whole log
    is the one the row must match, and the write cannot overwrite a newer projection. A lease
    a heartbeat extended (no event) is kept as it is, like ``projection_differences`` keeps it.
    """
    changed = 0
    for row in _rows(task_ids=task_ids, batch_size=batch_size):
        changed += _rebuild_one(task_id=row.task_id)
    return changed


def _locked_drift(task_id: uuid.UUID) -> tuple[Task, TaskState, dict[str, tuple[Any, Any]]] | None:
    """Inside the caller's transaction: the task, locked (appends to it wait, so its whole log is
    the one the row must match), its replayed log and where the row differs; None when it
    matches or the task is gone."""
    try:
        task = lock_task(namespace=None, task_id=task_id)
    except NotFound:
        return None
    replayed = projection_replay(task_id=task_id)
    differences = projection_differences(task_state_of(task), replayed)
    return (task, replayed, differences) if differences else None


def _rebuild_one(*, task_id: uuid.UUID) -> int:
    with transaction.atomic(durable=True):
        drift = _locked_drift(task_id)
        if drift is None:
            return 0
        task, replayed, differences = drift
        if "lease_expires_at" not in differences:
            replayed = dataclasses.replace(replayed, lease_expires_at=task.lease_expires_at)
        task_state_apply(task, replayed)
        task.updated_at = timezone.now()
        task.save(update_fields=[*differences, "updated_at"])
    return 1


def projection_reconcile(*, task_ids: Sequence[uuid.UUID] | None = None, decided_by: str, reason: str,
                         batch_size: int = 500) -> int:
    """Record in the log what each differing row says, instead of rewriting the row; how many.

    For logs written before every transition was an event (a saga that set ``compensated`` on
    the row only, a release that wrote nothing): an operator who has checked that the row is
    right appends ``ProjectionReconciled`` with the row's values, the log's, who and why. The
    row keeps its values and from then on is what its log replays to. This is a decision with
    a name on it, never automatic: on a row edited behind the log's back it would record the
    edit, so ``--check`` comes first and ``rebuild`` is the answer to tampering.
    """
    reason = (reason or "").strip()
    if not reason:
        raise InvalidInput("a reason is required", {"reason": "required"})
    reconciled = 0
    for row in _rows(task_ids=task_ids, batch_size=batch_size):
        reconciled += _reconcile_one(task_id=row.task_id, decided_by=decided_by, reason=reason)
    return reconciled


def _reconcile_one(*, task_id: uuid.UUID, decided_by: str, reason: str) -> int:
    with transaction.atomic(durable=True):
        drift = _locked_drift(task_id)
        if drift is None:
            return 0
        task, replayed, differences = drift
        row_json, log_json = task_state_as_json(task_state_of(task)), task_state_as_json(replayed)
        write_events(
            task,
            [
                EventDraft(
                    type=et.PROJECTION_RECONCILED,
                    payload={"fields": {name: row_json[name] for name in differences},
                             "log_had": {name: log_json[name] for name in differences},
                             "decided_by": decided_by, "reason": reason},
                )
            ],
            agent=decided_by,
            now=timezone.now(),
            # Reconciling is bookkeeping of the backplane's own; a closed task gets it too.
            allow_closed=True,
        )
    return 1


def describe_differences(differences: dict[str, tuple[Any, Any]]) -> str:
    """``status: row 'completed', log 'running'; attempts: row 1, log 0``."""
    return "; ".join(
        f"{name}: row {shown_value(row)}, log {shown_value(log)}" for name, (row, log) in differences.items()
    )


def shown_value(value: Any) -> str:
    """A field's value for people: times in ISO 8601, anything else as Python writes it."""
    return value.isoformat() if isinstance(value, datetime) else repr(value)


@dataclass(frozen=True)
class _Row:
    task_id: uuid.UUID
    state: TaskState


def _rows(*, task_ids: Sequence[uuid.UUID] | None, batch_size: int) -> Iterator[_Row]:
    """The reducer's fields of every task (or of ``task_ids``), in id order, a batch per query."""
    after: uuid.UUID | None = None
    while True:
        tasks = Task.objects.order_by("pk")
        if task_ids is not None:
            tasks = tasks.filter(pk__in=task_ids)
        if after is not None:
            tasks = tasks.filter(pk__gt=after)
        batch = list(tasks.values_list("pk", *REDUCED_FIELDS)[:batch_size])
        for task_id, *values in batch:
            yield _Row(task_id, TaskState(**dict(zip(REDUCED_FIELDS, values, strict=True))))
        if len(batch) < batch_size:
            return
        after = batch[-1][0]
