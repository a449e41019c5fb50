"""Reads of a task's history across forks: where it came from and the events it stands on.

A fork (``backplane.eventlog.forks``) does not copy its source's events: its log opens with its
own ``TaskStarted`` and a ``TaskForked`` naming the source, ``at_seq`` and the source's hash
there, and its *history* is read through the source. The history of a task is

- for a task that is no fork: its log;
- for a fork of S at n: the fork's ``TaskStarted`` (its input may replace the source's), then
  S's history up to and including S's event n without S's own ``TaskStarted``, then the fork's
  log from its ``TaskForked`` on.

So a fork of a fork stands on both sources, each cut where its fork was made, and a history is
a few ranges of seqs in a few logs (``history_ranges``), read in order with the (task, seq) index.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from django.db import connection

from backplane.eventlog import event_types as et
from backplane.eventlog.drift import Drift, HistoryEntry, drift_as_json, runs_diff
from backplane.eventlog.models import Task
from backplane.eventlog.selectors import task_visible, use_c_timestamp_loader

# Forks of forks of ...: deeper than this is refused at fork time, so a history is a bounded
# number of ranges however it was built.
MAX_FORK_DEPTH = 64

# A range without an upper bound runs to the task's head as it is when read.
TO_HEAD = 2**31 - 1


@dataclass(frozen=True, slots=True)
class SeqRange:
    """The events ``first``..``last`` (inclusive) of one task's log."""

    task_id: uuid.UUID
    first: int
    last: int


@dataclass(frozen=True, slots=True)
class HistoryEvent:
    """One event of a history: where it is recorded (task, seq) and what it says."""

    task_id: uuid.UUID
    seq: int
    type: str
    payload: dict[str, Any]
    recorded_at: Any
    hash: str
    agent: str | None


def fork_chain(task: Task) -> list[Task]:
    """The task and its sources, nearest first: ``[task, source, source's source, ...]``.

    One query per level; a chain is at most ``MAX_FORK_DEPTH`` deep (refused beyond at fork time).
    """
    chain = [task]
    while chain[-1].forked_from_id is not None and len(chain) <= MAX_FORK_DEPTH:
        chain.append(Task.objects.get(pk=chain[-1].forked_from_id))
    return chain


def history_ranges(task: Task) -> list[SeqRange]:
    """The history of ``task`` as ranges of seqs, in order (see the module's docstring)."""
    chain = fork_chain(task)
    root = chain[-1]
    ranges = [SeqRange(root.pk, 1, TO_HEAD)]
    # Walk from the root back down to the task: each fork cuts its source's history at its
    # seq, replaces the source's TaskStarted with its own and continues with its own log.
    for source, fork in zip(reversed(chain), list(reversed(chain))[1:], strict=False):
        assert fork.forked_at_seq is not None  # a fork always has one (task_fork_has_seq)
        cut = _cut(ranges, task_id=source.pk, at_seq=fork.forked_at_seq)
        ranges = [SeqRange(fork.pk, 1, 1), *_without_first_event(cut), SeqRange(fork.pk, 2, TO_HEAD)]
    return ranges


def _cut(ranges: Sequence[SeqRange], *, task_id: uuid.UUID, at_seq: int) -> list[SeqRange]:
    """The ranges up to and including event ``at_seq`` of ``task_id`` (its own log is the last
    ranges of its history, so the cut always falls in one of them)."""
    kept: list[SeqRange] = []
    for seq_range in ranges:
        if seq_range.task_id == task_id and seq_range.first <= at_seq <= seq_range.last:
            kept.append(SeqRange(task_id, seq_range.first, at_seq))
            return kept
        kept.append(seq_range)
    raise ValueError(f"event {at_seq} of {task_id} is not in this history")


def _without_first_event(ranges: list[SeqRange]) -> list[SeqRange]:
    first = ranges[0]
    rest = [SeqRange(first.task_id, first.first + 1, first.last)] if first.last > first.first else []
    return rest + ranges[1:]


def inherited_ranges(task: Task) -> list[SeqRange]:
    """The part of a fork's history read from its sources (empty for a task that is no fork)."""
    return [r for r in history_ranges(task) if r.task_id != task.pk]


# The payload as text, decoded by orjson: a history is read in thousands of rows at a time.
_HISTORY_COLUMNS = "task_id, seq, type, payload::text, recorded_at, hash, agent"


def ranges_condition(ranges: Sequence[SeqRange]) -> tuple[str, list[Any]]:
    """A WHERE clause selecting the events of ``ranges`` (each an index range on (task, seq))."""
    if not ranges:
        return "false", []
    clauses = " OR ".join("(task_id = %s AND seq BETWEEN %s AND %s)" for _ in ranges)
    params: list[Any] = []
    for seq_range in ranges:
        params += [seq_range.task_id, seq_range.first, seq_range.last]
    return f"({clauses})", params


def history_of(task: Task, *, chunk_size: int = 5000) -> Iterator[HistoryEvent]:
    """Every event of the task's history, in order, streamed range by range."""
    for seq_range in history_ranges(task):
        after = seq_range.first - 1
        while True:
            with connection.cursor() as cursor:
                use_c_timestamp_loader(cursor)
                cursor.execute(
                    f"SELECT {_HISTORY_COLUMNS} FROM backplane_event"
                    " WHERE task_id = %s AND seq > %s AND seq <= %s ORDER BY seq LIMIT %s",
                    [seq_range.task_id, after, seq_range.last, chunk_size],
                )
                rows = cursor.fetchall()
            for task_id, seq, type_, payload, recorded_at, hash_, agent in rows:
                yield HistoryEvent(task_id, seq, type_, _json(payload), recorded_at, hash_, agent)
            if len(rows) < chunk_size:
                break
            after = rows[-1][1]


def _json(text: str) -> dict[str, Any]:
    decoded: dict[str, Any] = orjson.loads(text)
    return decoded


def find_in_history(
    ranges: Sequence[SeqRange], *, event_type: str, matches: Sequence[dict[str, Any]]
) -> HistoryEvent | None:
    """The last event of ``event_type`` in ``ranges`` whose payload contains one of ``matches``
    (JSONB containment; ``{}`` matches any), or None."""
    if not ranges:
        return None
    condition, params = ranges_condition(ranges)
    # Later ranges are later in the history, whatever their tasks' seqs.
    order = " ".join(f"WHEN task_id = %s AND seq BETWEEN %s AND %s THEN {index}" for index, _ in enumerate(ranges))
    order_params: list[Any] = []
    for seq_range in ranges:
        order_params += [seq_range.task_id, seq_range.first, seq_range.last]
    contains = " OR ".join("payload @> %s::jsonb" for _ in matches)
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT {_HISTORY_COLUMNS} FROM backplane_event WHERE {condition} AND type = %s AND ({contains})"
            f" ORDER BY CASE {order} END DESC, seq DESC LIMIT 1",
            [*params, event_type, *(json.dumps(match) for match in matches), *order_params],
        )
        row = cursor.fetchone()
    if row is None:
        return None
    task_id, seq, type_, payload, recorded_at, hash_, agent = row
    return HistoryEvent(task_id, seq, type_, _json(payload), recorded_at, hash_, agent)


def fork_point_event(task: Task) -> HistoryEvent | None:
    """A fork's ``TaskForked`` event (its seq 2), or None for a task that is no fork."""
    if task.forked_from_id is None:
        return None
    return find_in_history([SeqRange(task.pk, 2, 2)], event_type=et.TASK_FORKED, matches=[{}])


# --- drift -----------------------------------------------------------------------------------


def history_entries(task: Task) -> list[HistoryEntry]:
    """The task's history as the drift comparison reads it."""
    return [HistoryEntry(str(e.task_id), e.seq, e.type, e.payload) for e in history_of(task)]


def tasks_drift(*, namespace: str | None, a_id: uuid.UUID, b_id: uuid.UUID) -> Drift:
    """Where the histories of two tasks of the namespace drift apart (``drift.runs_diff``)."""
    a = task_visible(namespace=namespace, task_id=a_id)
    b = task_visible(namespace=namespace, task_id=b_id)
    return runs_diff(history_entries(a), history_entries(b))


def tasks_diff(*, namespace: str | None, a_id: uuid.UUID, b_id: uuid.UUID) -> dict[str, Any]:
    """``tasks_drift`` as the API answers it: the first divergence and the counts."""
    return drift_as_json(tasks_drift(namespace=namespace, a_id=a_id, b_id=b_id))


def fork_provenance_holds(task: Task) -> bool:
    """For a fork: its ``TaskForked`` names the source and seq its row does, and the hash of the
    source's event there is the one recorded. True for a task that is no fork."""
    if task.forked_from_id is None:
        return True
    forked = fork_point_event(task)
    if forked is None:
        return False
    payload = forked.payload
    with connection.cursor() as cursor:
        cursor.execute("SELECT hash FROM backplane_event WHERE task_id = %s AND seq = %s",
                       [task.forked_from_id, task.forked_at_seq])
        row = cursor.fetchone()
    return (
        row is not None
        and payload.get("source_task_id") == str(task.forked_from_id)
        and payload.get("at_seq") == task.forked_at_seq
        and payload.get("source_hash") == row[0]
    )
