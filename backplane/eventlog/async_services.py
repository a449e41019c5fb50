"""An agent's writes on the event loop: the HTTP front's (api/agent_front.py), on psycopg's
async pool (backplane/runtime/async_pool.py), so the commonest writes never wait for a thread.

``write_events_async`` is ``writer.write_events`` on an async connection: the one writer's plan
(``writer.write_plan``) and its statements (``insert_events_sql``, the outbox's
``outbox_insert_sql``), and the observers' actions once the transaction commits. Only the driver
differs. It takes a write no follow-up has work to do for: one that concerns none
(``WritePlan.follow_ups`` empty: a step, a lease claimed or given back, a new task), or whose follow-ups
find nothing to do (``FollowUp.idle_async``: an agent's completion, its breaker closed and no
failure counted); for any other it raises ``HandOff``, which rolls the transaction back before
anything is written, and the HTTP front runs the sync service instead, which decides the write
from scratch: the follow-ups run Django's ORM inside its transaction.

``event_append_batch_async`` is ``services.event_append_batch`` so, step for step: the client's
events checked (``validate_client_drafts``), the task locked, the lease checked, the
idempotency keys looked up, ``expected_seq`` checked, then the write. A replay (answered with the
original events as the ORM loads them) and a closed task's 409 (which reads who closed it) are
the sync service's too. ``task_create_async`` is ``services.task_create`` so (a replay of a
known id is the service's). recovery/leases.py drives the same writer for claims and releases.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import psycopg
from django.conf import settings
from django.utils import timezone

from backplane.delivery.outbox import (
    SUBSCRIPTIONS_SQL,
    outbox_insert_params,
    outbox_insert_sql,
    outbox_rows,
    subscriptions_from,
)
from backplane.eventlog import event_types as et
from backplane.eventlog.costs import RATES_SQL, llm_called_settled, rates_from, rates_wanted
from backplane.eventlog.errors import NotFound
from backplane.eventlog.models import Task, TaskStatus
from backplane.eventlog.services import (
    PARENT_IN_NAMESPACE_SQL,
    AppendOutcome,
    check_open_at,
    ensure_storable_json,
    kind_refused,
    new_task,
    parent_not_found,
    started_drafts,
    task_insert_sql,
    validate_client_drafts,
)
from backplane.eventlog.writer import (
    LOCK_TASK_IN_NAMESPACE_SQL,
    TASK_ROWS,
    EventDraft,
    WritePlan,
    after_commit_of,
    check_lease,
    insert_events_params,
    insert_events_sql,
    may_be_quiet,
    write_plan,
)
from backplane.lib.sql_rows import row_insert_params
from backplane.telemetry import counters

# Whether any of the keys was recorded on the task already (the replay is the sync service's).
_KNOWN_KEY_SQL = "SELECT 1 FROM backplane_event WHERE task_id = %s AND idempotency_key = ANY(%s) LIMIT 1"


async def lock_task_async(conn: psycopg.AsyncConnection[Any], *, namespace: str, task_id: uuid.UUID) -> Task:
    """``writer.lock_task`` on an async connection, inside its transaction: the agent's namespace only."""
    row = await (await conn.execute(LOCK_TASK_IN_NAMESPACE_SQL, [task_id, namespace])).fetchone()
    if row is None:
        raise NotFound("task not found", {"task_id": str(task_id)})
    return TASK_ROWS.load(row)


class HandOff(Exception):
    """Raised inside the transaction to roll it back: the write is the sync service's."""


async def write_events_async(conn: psycopg.AsyncConnection[Any], task: Task, drafts: Sequence[EventDraft], *,
                             agent: str | None, now: datetime, digests: Sequence[str | None] | None = None,
                             allow_closed: bool = False) -> WritePlan:
    """``writer.write_events`` on ``conn``, inside its transaction, on a task it has locked: the
    same plan and statements. ``HandOff`` when a follow-up the write concerns may have work to do
    (``FollowUp.idle_async``); once the transaction commits, the caller runs ``run_after_commit``."""
    plan = write_plan(task, drafts, agent=agent, now=now, digests=digests, allow_closed=allow_closed)
    for follow_up in plan.follow_ups:
        if follow_up.idle_async is None or not await follow_up.idle_async(conn, plan.written):
            raise HandOff
    inserted = await conn.execute(insert_events_sql(), insert_events_params([task], [plan.events]))
    plan.place(await inserted.fetchall())
    messages = plan.outbox_messages()
    if messages:
        subscriptions = subscriptions_from(await (await conn.execute(SUBSCRIPTIONS_SQL)).fetchall())
        await conn.execute(outbox_insert_sql(), outbox_insert_params(outbox_rows(messages, subscriptions), now=now))
    return plan


async def insert_task_async(conn: psycopg.AsyncConnection[Any], task: Task) -> None:
    """A new task's row (``services.task_insert_sql``) on ``conn``; ``HandOff`` when its id or its
    dispatch key is taken: a replay or a conflict, which the sync service answers from the row there."""
    if await (await conn.execute(task_insert_sql(), row_insert_params(task))).fetchone() is None:
        raise HandOff


def run_after_commit(*plans: WritePlan) -> None:
    """What the observers do once the writes of ``plans`` committed (``writer.after_commit_of``)."""
    for plan in plans:
        for action in after_commit_of(plan.written):
            action()


async def event_append_batch_async(
    conn: psycopg.AsyncConnection[Any],
    *,
    namespace: str,
    task_id: uuid.UUID,
    drafts: Sequence[EventDraft],
    agent: str,
    expected_seq: int | None = None,
    lease_epoch: int | None = None,
    kinds: Sequence[str] = (),
) -> AppendOutcome:
    """``services.event_append_batch`` for an agent, on ``conn`` (in autocommit, out of any
    transaction); ``HandOff`` when the sync service must make the write."""
    started = time.perf_counter()
    digests = validate_client_drafts(drafts)
    if not may_be_quiet(drafts):
        raise HandOff
    async with conn.transaction():
        task = await lock_task_async(conn, namespace=namespace, task_id=task_id)
        if task.is_closed or task.status == TaskStatus.COMPENSATING:
            raise HandOff
        check_lease(task, lease_epoch, agent=agent, kinds=kinds)
        keys = [draft.idempotency_key for draft in drafts if draft.idempotency_key is not None]
        if keys and await (await conn.execute(_KNOWN_KEY_SQL, [task_id, keys])).fetchone() is not None:
            raise HandOff
        check_open_at(task, expected_seq)
        now = timezone.now()
        settled = [await _settled_async(conn, draft, now=now) for draft in drafts]
        plan = await write_events_async(conn, task, settled, agent=agent, now=now, digests=digests)
    run_after_commit(plan)
    counters.append_duration_observe(time.perf_counter() - started)
    return AppendOutcome(events=plan.events, replayed=False)


async def task_create_async(
    conn: psycopg.AsyncConnection[Any],
    *,
    namespace: str,
    kind: str,
    input: dict[str, Any],
    agent: str,
    task_id: uuid.UUID | None = None,
    parent_task_id: uuid.UUID | None = None,
    max_attempts: int | None = None,
    metadata: dict[str, Any] | None = None,
    kinds: Sequence[str] = (),
) -> Task:
    """``services.task_create`` for an agent, on ``conn`` (in autocommit): the same checks, the
    same INSERT (``task_insert_sql``) and first events. ``HandOff`` when the id is taken (a
    replay, or a conflict: the service answers either from the row there), or when a sub-task of
    a kind the agent's token does not name needs its parent's kind read."""
    ensure_storable_json(input, "input")
    ensure_storable_json(metadata or {}, "metadata")
    if kinds and kind not in kinds:
        if parent_task_id is None:
            raise kind_refused(kind, kinds)
        raise HandOff
    async with conn.transaction():
        if parent_task_id is not None and await (
                await conn.execute(PARENT_IN_NAMESPACE_SQL, [parent_task_id, namespace])).fetchone() is None:
            raise parent_not_found()
        now = timezone.now()
        task = new_task(namespace=namespace, kind=kind, input=input, agent=agent, task_id=task_id or uuid.uuid4(),
                        parent_task_id=parent_task_id,
                        max_attempts=max_attempts if max_attempts is not None else settings.BACKPLANE_MAX_ATTEMPTS,
                        metadata=metadata or {}, now=now)
        await insert_task_async(conn, task)
        plan = await write_events_async(conn, task, started_drafts(task), agent=agent, now=now)
    run_after_commit(plan)
    return task


async def _settled_async(conn: psycopg.AsyncConnection[Any], draft: EventDraft, *, now: datetime) -> EventDraft:
    """``services._settled`` on ``conn``: a model call's cost settled from the same price table."""
    if draft.type != et.LLM_CALLED:
        return draft
    wanted = rates_wanted(draft.payload)
    rates = rates_from(await (await conn.execute(RATES_SQL, [*wanted, now, now])).fetchall()) if wanted else None
    return dataclasses.replace(draft, payload=llm_called_settled(draft.payload, rates))

