"""Forks: a new task that continues another's history from any of its events.

A fork of S at ``at_seq`` is a new task of S's namespace and kind. Its log opens with its own
``TaskStarted`` (S's input, or a replacement) and ``TaskForked``, which names S, ``at_seq`` and
the hash of S's event there: anyone holding both logs can check where the fork came from, and
the fork's chain covers that hash. S's events up to ``at_seq`` are the fork's history, read
through S (``backplane.eventlog.lineage``), never copied and never written: forking costs two
events whatever the length of S, and S does not change.

The fork's own projection starts afresh (``pending``, no attempts): its history is what its
agent resumes from, through the recovery context, and what the tool-call proxy answers the
steps it already took from (recovery/tool_calls.py), so an effect happens once across a task
and all its forks.

A *sandbox* fork is for replaying an agent against the record: its tool calls are answered
only from the source's record (``tool_answers`` edits that record for the replay, and the
edit is in ``TaskForked``), it sends no message and runs no compensation, fleet agents never
claim it, and it can only be forked into another sandbox.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from django.db import connection, transaction
from django.utils import timezone

from backplane.eventlog import event_types as et
from backplane.eventlog.async_services import insert_task_async, run_after_commit, write_events_async
from backplane.eventlog.errors import InvalidInput, NotFound, SandboxRefused
from backplane.eventlog.lineage import MAX_FORK_DEPTH
from backplane.eventlog.models import Task
from backplane.eventlog.services import (
    ForkOrigin,
    TaskCreateOutcome,
    ensure_storable_json,
    new_task,
    started_drafts,
    task_create_in_transaction,
)
from backplane.eventlog.writer import TASK_ROWS


@dataclass(frozen=True)
class ToolAnswer:
    """An edit of the record for a sandbox: the answer its call of ``tool`` at ``step`` gets."""

    step: int
    tool: str
    status: str
    result: dict[str, Any]

    def as_json(self) -> dict[str, Any]:
        return {"step": self.step, "tool": self.tool, "status": self.status, "result": self.result}


def task_fork(
    *,
    namespace: str | None,
    source_task_id: uuid.UUID,
    at_seq: int,
    reason: str,
    forked_by: str,
    by_staff: bool,
    input: dict[str, Any] | None = None,
    task_id: uuid.UUID | None = None,
    sandbox: bool = False,
    tool_answers: Sequence[ToolAnswer] = (),
) -> TaskCreateOutcome:
    """Fork ``source_task_id`` after its event ``at_seq``. Idempotent on ``task_id`` like a
    create: the same fork again is the same task, anything else under that id is 409.

    ``namespace=None``: staff, any namespace; the fork is made in the source's namespace.
    """
    _check_fork_arguments(input=input, sandbox=sandbox, tool_answers=tool_answers)
    with transaction.atomic(durable=True):
        return task_fork_in_transaction(namespace=namespace, source_task_id=source_task_id, at_seq=at_seq,
                                        reason=reason, forked_by=forked_by, by_staff=by_staff, input=input,
                                        task_id=task_id, sandbox=sandbox, tool_answers=tool_answers)


def task_fork_in_transaction(
    *,
    namespace: str | None,
    source_task_id: uuid.UUID,
    at_seq: int,
    reason: str,
    forked_by: str,
    by_staff: bool,
    input: dict[str, Any] | None = None,
    task_id: uuid.UUID | None = None,
    sandbox: bool = False,
    tool_answers: Sequence[ToolAnswer] = (),
) -> TaskCreateOutcome:
    """``task_fork`` in the caller's transaction (a bulk job's chunk), its arguments checked."""
    with connection.cursor() as cursor:
        cursor.execute(_SOURCE_SQL, {"task_id": source_task_id, "namespace": namespace, "at_seq": at_seq})
        source, at_event = _source_for_fork(cursor.fetchone(), source_task_id=source_task_id, at_seq=at_seq,
                                            sandbox=sandbox)
    fork = _fork_origin(source, at_event, at_seq=at_seq, reason=reason, forked_by=forked_by, by_staff=by_staff,
                        input=input, sandbox=sandbox, tool_answers=tool_answers)
    return task_create_in_transaction(
        namespace=source.namespace,
        kind=source.kind,
        input=input if input is not None else source.input,
        agent=forked_by,
        task_id=task_id or uuid.uuid4(),
        parent_task_id=None,
        max_attempts=source.max_attempts,
        metadata=source.metadata,
        fork=fork,
    )


async def task_fork_async(
    conn: psycopg.AsyncConnection[Any],
    *,
    namespace: str,
    source_task_id: uuid.UUID,
    at_seq: int,
    reason: str,
    forked_by: str,
    input: dict[str, Any] | None = None,
    task_id: uuid.UUID | None = None,
    sandbox: bool = False,
    tool_answers: Sequence[ToolAnswer] = (),
) -> Task:
    """``task_fork`` by an agent, on the event loop's connection (in autocommit): the same checks,
    reads, INSERT and first events. ``HandOff`` when the fork's id is taken (its replay, or a
    conflict: the service answers either from the row there)."""
    _check_fork_arguments(input=input, sandbox=sandbox, tool_answers=tool_answers)
    async with conn.transaction():
        found = await conn.execute(_SOURCE_SQL, {"task_id": source_task_id, "namespace": namespace, "at_seq": at_seq})
        source, at_event = _source_for_fork(await found.fetchone(), source_task_id=source_task_id, at_seq=at_seq,
                                            sandbox=sandbox)
        fork = _fork_origin(source, at_event, at_seq=at_seq, reason=reason, forked_by=forked_by, by_staff=False,
                            input=input, sandbox=sandbox, tool_answers=tool_answers)
        now = timezone.now()
        task = new_task(namespace=source.namespace, kind=source.kind,
                        input=input if input is not None else source.input, agent=forked_by,
                        task_id=task_id or uuid.uuid4(), parent_task_id=None, max_attempts=source.max_attempts,
                        metadata=source.metadata, now=now, fork=fork)
        await insert_task_async(conn, task)
        plan = await write_events_async(conn, task, started_drafts(task, fork=fork), agent=forked_by, now=now)
    run_after_commit(plan)
    return task


def _check_fork_arguments(*, input: dict[str, Any] | None, sandbox: bool, tool_answers: Sequence[ToolAnswer]) -> None:
    if input is not None:
        ensure_storable_json(input, "input")
    if tool_answers and not sandbox:
        raise InvalidInput("only a sandbox takes edited tool answers; a fork's tools answer for real",
                           {"tool_answers": "allowed with sandbox: true"})
    for answer in tool_answers:
        ensure_storable_json(answer.result, "tool_answers")


# A fork's one read of its source, on either driver: the task (of the namespace; any, for staff:
# None), how deep its chain of sources is (itself included), and its event at ``at_seq``.
_SOURCE_SQL = f"""
SELECT {TASK_ROWS.columns},
       (WITH RECURSIVE chain(id, forked_from_id) AS (
            SELECT id, forked_from_id FROM backplane_task WHERE id = %(task_id)s
            UNION ALL
            SELECT t.id, t.forked_from_id FROM backplane_task t JOIN chain ON t.id = chain.forked_from_id
        ) SELECT count(*) FROM chain),
       at_event.hash, at_event.type
FROM backplane_task
LEFT JOIN backplane_event AS at_event ON at_event.task_id = backplane_task.id AND at_event.seq = %(at_seq)s
WHERE backplane_task.id = %(task_id)s AND (%(namespace)s::text IS NULL OR backplane_task.namespace = %(namespace)s)
"""


def _source_for_fork(row: Sequence[Any] | None, *, source_task_id: uuid.UUID, at_seq: int,
                     sandbox: bool) -> tuple[Task, tuple[str, str]]:
    """``_SOURCE_SQL``'s row checked: the source and its event at ``at_seq`` (hash, type)."""
    if row is None:
        raise NotFound("task not found", {"task_id": str(source_task_id)})
    columns = len(TASK_ROWS.attnames)
    source, depth, at_event = TASK_ROWS.load(row[:columns]), row[columns], row[columns + 1:]
    if source.sandbox and not sandbox:
        raise SandboxRefused(
            "a sandbox's history is a replay; it can only be forked into another sandbox",
            {"sandbox": "must be true when forking a sandbox", "source_task_id": str(source.pk)},
        )
    if not 1 <= at_seq <= source.last_seq:
        raise InvalidInput(
            f"at_seq must be between 1 and the task's last seq, {source.last_seq}",
            {"at_seq": f"between 1 and {source.last_seq}"},
        )
    if depth >= MAX_FORK_DEPTH:
        raise InvalidInput(f"forks may be {MAX_FORK_DEPTH} deep at most",
                           {"task_id": "fork the source of this fork instead"})
    return source, (at_event[0], at_event[1])


def _fork_origin(source: Task, at_event: tuple[str, str], *, at_seq: int, reason: str, forked_by: str,
                 by_staff: bool, input: dict[str, Any] | None, sandbox: bool,
                 tool_answers: Sequence[ToolAnswer]) -> ForkOrigin:
    at_hash, at_type = at_event
    return ForkOrigin(source=source, at_seq=at_seq, sandbox=sandbox, payload={
        "source_task_id": str(source.pk),
        "at_seq": at_seq,
        "source_hash": at_hash,
        "source_type": at_type,
        "reason": reason,
        "forked_by": forked_by,
        "by_staff": by_staff,
        "sandbox": sandbox,
        "input_replaced": input is not None and input != source.input,
        "tool_answers": [answer.as_json() for answer in tool_answers],
    })


# The events after which a task had failed (or been taken back) for the last time: a fork from
# failure continues from just before the last of them.
FAILURE_TYPES = (et.TASK_FAILED, et.TASK_STALLED, et.TASK_DEAD_LETTERED)


# Per task, the run of failure events its log ends its last failure with (a stall that
# dead-letters is two events, one failure): counted from the last failure event backwards, a
# row belongs to the run while its distance from the last equals its rank, so a gap ends it.
_FAILURE_POINTS_SQL = """
SELECT task_id, greatest(1, min(seq) - 1) FROM (
    SELECT task_id, seq,
           max(seq) OVER (PARTITION BY task_id) - seq AS distance,
           row_number() OVER (PARTITION BY task_id ORDER BY seq DESC) - 1 AS rank
      FROM backplane_event
     WHERE task_id = ANY(%s) AND type = ANY(%s)
) failures
WHERE distance = rank
GROUP BY task_id
"""


def failure_points(task_ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, int]:
    """The seq a fork "from failure" of each task continues after: the event before the task's
    last failure (``TaskFailed``, ``TaskStalled`` or ``TaskDeadLettered``); tasks that never
    failed are left out. One query for them all.

    So the fork keeps every step the failed attempt confirmed and redoes the rest; a
    ``TaskClaimed`` in that history is the failed attempt's and changes nothing in the fork.
    """
    if not task_ids:
        return {}
    with connection.cursor() as cursor:
        cursor.execute(_FAILURE_POINTS_SQL, [list(task_ids), list(FAILURE_TYPES)])
        return {task_id: seq for task_id, seq in cursor.fetchall()}


def failure_point(task: Task) -> int | None:
    """``failure_points`` of one task, or None when it never failed."""
    return failure_points([task.pk]).get(task.pk)
