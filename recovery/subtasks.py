"""Sub-agent hand-off, first phase: the child task and ``SubAgentDispatched`` in the parent, together.

The second phase (the child's result entering the parent's log) is a follow-up of the child's
final event: see ``recovery.handlers``."""

from __future__ import annotations

import hashlib
import json
import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from backplane.eventlog import event_types as et
from backplane.eventlog.async_services import (
    HandOff,
    insert_task_async,
    lock_task_async,
    run_after_commit,
    write_events_async,
)
from backplane.eventlog.errors import IdempotencyMismatch, SandboxRefused
from backplane.eventlog.lineage import TO_HEAD, SeqRange, find_in_history, history_ranges, inherited_ranges
from backplane.eventlog.models import Task, TaskStatus
from backplane.eventlog.services import (
    ensure_storable_json,
    new_task,
    started_drafts,
    task_insert_sql,
)
from backplane.eventlog.writer import EventDraft, check_lease, lock_task, task_closed_error, write_events
from backplane.lib.sql_rows import row_insert_params

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SubtaskOutcome:
    child: Task
    dispatch_key: str
    created: bool


def subtask_dispatch(
    *,
    namespace: str | None,
    parent_task_id: uuid.UUID,
    step: int,
    kind: str,
    input: dict[str, Any],
    agent: str | None,
    lease_epoch: int | None,
    kinds: Sequence[str] = (),
) -> SubtaskOutcome:
    """First phase of the hand-off: the child task and ``SubAgentDispatched`` in the parent, together."""
    ensure_storable_json(input, "input")
    dispatch_key = _dispatch_key(parent_task_id, step=step, kind=kind)
    with transaction.atomic(durable=True):
        parent = lock_task(namespace=namespace, task_id=parent_task_id)
        check_lease(parent, lease_epoch, agent=agent, kinds=kinds)
        if parent.forked_from_id is not None:
            inherited = _inherited_child(parent, step=step, kind=kind, input=input, agent=agent)
            if inherited is None and parent.sandbox:
                inherited = _recorded_child(parent, step=step, kind=kind, input=input, agent=agent)
            if inherited is not None:
                return SubtaskOutcome(child=inherited, dispatch_key=dispatch_key, created=False)
        existing = Task.objects.filter(dispatch_key=dispatch_key).first()
        if existing is not None:
            if existing.input != input:
                raise IdempotencyMismatch(
                    "this step already dispatched a sub-agent of this kind with another input",
                    {"dispatch_key": dispatch_key, "child_task_id": str(existing.pk)},
                )
            return SubtaskOutcome(child=existing, dispatch_key=dispatch_key, created=False)
        if parent.is_closed:
            raise task_closed_error(parent)
        now = timezone.now()
        child = _new_child(parent, dispatch_key=dispatch_key, step=step, kind=kind, input=input, agent=agent, now=now)
        with connection.cursor() as cursor:
            # The parent's row lock serializes its dispatches: the key was looked up above.
            cursor.execute(task_insert_sql(), row_insert_params(child))
        write_events(child, started_drafts(child), agent=agent, now=now)
        write_events(parent, [_dispatched(child, step=step)], agent=agent, now=now)
    return SubtaskOutcome(child=child, dispatch_key=dispatch_key, created=True)


async def subtask_dispatch_async(
    conn: psycopg.AsyncConnection[Any],
    *,
    namespace: str,
    parent_task_id: uuid.UUID,
    step: int,
    kind: str,
    input: dict[str, Any],
    agent: str,
    lease_epoch: int | None,
    kinds: Sequence[str] = (),
) -> Task:
    """``subtask_dispatch`` of a new child by an agent, on the event loop's connection (in
    autocommit): the same lock, checks, INSERT and events. ``HandOff`` before anything is written
    for what the service answers from what it reads: a fork's hand-off (its record), a closed
    parent (who closed it), a step already dispatched (the replay, or another input's 422)."""
    ensure_storable_json(input, "input")
    dispatch_key = _dispatch_key(parent_task_id, step=step, kind=kind)
    async with conn.transaction():
        parent = await lock_task_async(conn, namespace=namespace, task_id=parent_task_id)
        check_lease(parent, lease_epoch, agent=agent, kinds=kinds)
        if parent.forked_from_id is not None or parent.is_closed:
            raise HandOff
        now = timezone.now()
        child = _new_child(parent, dispatch_key=dispatch_key, step=step, kind=kind, input=input, agent=agent, now=now)
        await insert_task_async(conn, child)  # HandOff: the dispatch key is taken
        plans = [await write_events_async(conn, child, started_drafts(child), agent=agent, now=now),
                 await write_events_async(conn, parent, [_dispatched(child, step=step)], agent=agent, now=now)]
    run_after_commit(*plans)
    return child


def _dispatch_key(parent_task_id: uuid.UUID, *, step: int, kind: str) -> str:
    return hashlib.sha256(f"{parent_task_id}:{step}:subagent:{kind}".encode()).hexdigest()


def _new_child(parent: Task, *, dispatch_key: str, step: int, kind: str, input: dict[str, Any], agent: str | None,
               now: datetime) -> Task:
    child = new_task(namespace=parent.namespace, kind=kind, input=input, agent=agent, task_id=uuid.uuid4(),
                     parent_task_id=parent.pk, max_attempts=settings.BACKPLANE_MAX_ATTEMPTS,
                     metadata={"dispatch_key": dispatch_key, "step": step}, now=now)
    child.dispatch_key = dispatch_key
    return child


def _dispatched(child: Task, *, step: int) -> EventDraft:
    return EventDraft(type=et.SUB_AGENT_DISPATCHED, payload={
        "child_task_id": str(child.pk), "dispatch_key": child.dispatch_key, "step": step, "kind": child.kind,
        "input": child.input})




# --- forks: a hand-off the source already made --------------------------------------------------


def _inherited_child(parent: Task, *, step: int, kind: str, input: dict[str, Any], agent: str | None) -> Task | None:
    """The child a fork's source dispatched for this step and kind before the fork point, or
    None when its history holds no such hand-off (then the fork dispatches its own child).

    There is one child for both: the source's. A finished child's result is written into the
    fork's log now, answered from the record; an unfinished one is adopted (a
    ``SubAgentDispatched`` of the same child in the fork's log), and its result reaches the
    fork too when it finishes (``report_to_adopters``). Its work is never started twice.
    """
    dispatched = find_in_history(inherited_ranges(parent), event_type=et.SUB_AGENT_DISPATCHED,
                                 matches=[{"step": step, "kind": kind}])
    if dispatched is None:
        return None
    if dispatched.payload["input"] != input:
        raise IdempotencyMismatch(
            "this step handed work of this kind to a sub-agent with another input before the fork point",
            {"child_task_id": dispatched.payload["child_task_id"], "source_task_id": str(dispatched.task_id)},
        )
    child = Task.objects.get(pk=dispatched.payload["child_task_id"])
    own_log = [SeqRange(parent.pk, 1, TO_HEAD)]
    if find_in_history(history_ranges(parent), event_type=et.SUB_AGENT_RESULT_RECEIVED,
                       matches=[{"child_task_id": str(child.pk)}]) is not None:
        return child  # its result is in the history already (before the fork point, or a repeat)
    if child.is_closed:
        write_events(parent, [child_result_draft(child, status=child.status)], agent=agent, now=timezone.now())
        return child
    if find_in_history(own_log, event_type=et.SUB_AGENT_DISPATCHED, matches=[{"child_task_id": str(child.pk)}]) is None:
        write_events(parent, [EventDraft(type=et.SUB_AGENT_DISPATCHED, payload={
            "child_task_id": str(child.pk), "dispatch_key": child.dispatch_key, "step": step, "kind": kind,
            "input": input, "adopted_from": str(dispatched.task_id)})], agent=agent, now=timezone.now())
    return child


def _recorded_child(parent: Task, *, step: int, kind: str, input: dict[str, Any], agent: str | None) -> Task:
    """A sandbox's hand-off, answered from its source's record: the recorded child's result, with
    the dispatch as the sandbox asked it (its input may differ; a diff shows it). A child with no
    result on record would need an agent to run it, which a sandbox never starts: refused."""
    assert parent.forked_from_id is not None  # a sandbox is a fork
    source = Task.objects.get(pk=parent.forked_from_id)
    dispatched = find_in_history(history_ranges(source), event_type=et.SUB_AGENT_DISPATCHED,
                                 matches=[{"step": step, "kind": kind}])
    child = Task.objects.get(pk=dispatched.payload["child_task_id"]) if dispatched is not None else None
    if child is None or not child.is_closed:
        raise SandboxRefused(
            f"the record has no finished {kind} sub-agent at step {step}, and a sandbox starts no agent",
            {"step": step, "kind": kind, "source_task_id": str(source.pk)},
        )
    if find_in_history([SeqRange(parent.pk, 1, TO_HEAD)], event_type=et.SUB_AGENT_RESULT_RECEIVED,
                       matches=[{"child_task_id": str(child.pk)}]) is None:
        recorded_from = {"task_id": str(dispatched.task_id), "seq": dispatched.seq} if dispatched else {}
        write_events(parent, [
            EventDraft(type=et.SUB_AGENT_DISPATCHED, payload={
                "child_task_id": str(child.pk), "dispatch_key": child.dispatch_key, "step": step, "kind": kind,
                "input": input, "recorded_from": recorded_from}),
            child_result_draft(child, status=child.status),
        ], agent=agent, now=timezone.now())
    return child


def child_result_draft(child: Task, *, status: str) -> EventDraft:
    """``SubAgentResultReceived``: what a child's final event made of it, for a parent's log.

    A cancelled child reports like a failed one: its error says who cancelled it and why (read
    from its ``TaskCancelled``, so the parent's agent can tell a cancellation from a crash)."""
    error = child.error
    if status == TaskStatus.CANCELLED:
        error = task_closed_error(child).message
    return EventDraft(
        type=et.SUB_AGENT_RESULT_RECEIVED,
        payload={
            "child_task_id": str(child.pk),
            "dispatch_key": child.dispatch_key,
            "kind": child.kind,
            "status": status,
            "output": child.output,
            "error": error,
        },
        causation_id=f"{child.pk}:{child.last_seq}",
    )


# Every fork of the child's parent, at any depth, locked: a fork adopting the child holds its own
# row's lock until it commits, so waiting here means its adoption is seen by the next statement.
_LOCK_FORKS_SQL = """
WITH RECURSIVE forks(id) AS (
    SELECT id FROM backplane_task WHERE forked_from_id = %s
    UNION
    SELECT t.id FROM backplane_task t JOIN forks f ON t.forked_from_id = f.id
)
SELECT id FROM backplane_task WHERE id IN (SELECT id FROM forks) ORDER BY id FOR UPDATE
"""
# Of those, the ones whose own log adopted the child and has not heard of its result yet.
_WAITING_SQL = """
SELECT t.id FROM unnest(%(forks)s::uuid[]) AS t(id)
 WHERE EXISTS (SELECT 1 FROM backplane_event e WHERE e.task_id = t.id AND e.type = 'SubAgentDispatched'
                  AND e.payload @> %(child)s::jsonb)
   AND NOT EXISTS (SELECT 1 FROM backplane_event e WHERE e.task_id = t.id AND e.type = 'SubAgentResultReceived'
                      AND e.payload @> %(child)s::jsonb)
 ORDER BY t.id
"""


def adopters_of(child: Task) -> list[uuid.UUID]:
    """The forks waiting on ``child`` besides its parent (``_inherited_child``), in id order.

    Runs in the child's finishing transaction, after the parent's result is written: lock
    order child, parent, then the forks (locked here, in id order).
    """
    if child.parent_id is None:
        return []
    with connection.cursor() as cursor:
        cursor.execute(_LOCK_FORKS_SQL, [child.parent_id])
        forks = [row[0] for row in cursor.fetchall()]
        if not forks:
            return []
        cursor.execute(_WAITING_SQL, {"forks": forks, "child": json.dumps({"child_task_id": str(child.pk)})})
        return [row[0] for row in cursor.fetchall()]
