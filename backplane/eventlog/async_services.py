"""An agent's appends on the event loop: the HTTP front's (api/agent_front.py), on psycopg's
async pool (backplane/runtime/async_pool.py), so the commonest write never waits for a thread.

The same write as ``services.event_append_batch``, step for step: the client's events checked
(``validate_client_drafts``), the task locked, the lease checked, the idempotency keys looked up,
``expected_seq`` checked, then the one writer's plan (``writer.write_plan``) and its statements
(``insert_events_sql``, the outbox's ``outbox_insert_sql``), in one transaction, and the
observers' actions once it commits. Only the driver differs: an async connection for Django's.

Taken for the common write only, a step recorded on an open task: nothing replayed, no transition
of the reducer's, nothing that costs (``writer.write_is_quiet``). Anything else returns None
before anything is written, and the caller runs the sync service, which decides it from scratch:
a replay answers with the original events as the ORM loads them, a closed task's 409 reads who
closed it, and the follow-ups of a write that moves the task (breakers, sagas, parents,
budgets) run Django's ORM inside its transaction.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from typing import Any

import psycopg
from django.utils import timezone

from backplane.delivery.outbox import (
    SUBSCRIPTIONS_SQL,
    outbox_insert_params,
    outbox_insert_sql,
    outbox_rows,
    subscriptions_from,
)
from backplane.eventlog.errors import NotFound
from backplane.eventlog.models import Task, TaskStatus
from backplane.eventlog.services import AppendOutcome, check_open_at, validate_client_drafts
from backplane.eventlog.writer import (
    LOCK_TASK_IN_NAMESPACE_SQL,
    TASK_ROWS,
    EventDraft,
    after_commit_of,
    check_lease,
    insert_events_params,
    insert_events_sql,
    may_be_quiet,
    write_plan,
)
from backplane.telemetry import counters

# Whether any of the keys was recorded on the task already (the replay is the sync service's).
_KNOWN_KEY_SQL = "SELECT 1 FROM backplane_event WHERE task_id = %s AND idempotency_key = ANY(%s) LIMIT 1"


async def lock_task_async(conn: psycopg.AsyncConnection[Any], *, namespace: str, task_id: uuid.UUID) -> Task:
    """``writer.lock_task`` on an async connection, inside its transaction: the agent's namespace only."""
    row = await (await conn.execute(LOCK_TASK_IN_NAMESPACE_SQL, [task_id, namespace])).fetchone()
    if row is None:
        raise NotFound("task not found", {"task_id": str(task_id)})
    return TASK_ROWS.load(row)


class _HandOff(Exception):
    """Raised inside the transaction to roll it back: the write is the sync service's."""


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
) -> AppendOutcome | None:
    """``services.event_append_batch`` for an agent, on ``conn`` (in autocommit, out of any
    transaction); None when the write is not a quiet step and the sync service must make it."""
    started = time.perf_counter()
    digests = validate_client_drafts(drafts)
    if not may_be_quiet(drafts):
        return None
    try:
        async with conn.transaction():
            task = await lock_task_async(conn, namespace=namespace, task_id=task_id)
            if task.is_closed or task.status == TaskStatus.COMPENSATING:
                raise _HandOff
            check_lease(task, lease_epoch, agent=agent, kinds=kinds)
            keys = [draft.idempotency_key for draft in drafts if draft.idempotency_key is not None]
            if keys and await (await conn.execute(_KNOWN_KEY_SQL, [task_id, keys])).fetchone() is not None:
                raise _HandOff
            check_open_at(task, expected_seq)
            now = timezone.now()
            plan = write_plan(task, drafts, agent=agent, now=now, digests=digests)
            if not plan.quiet:
                raise _HandOff
            inserted = await conn.execute(insert_events_sql(), insert_events_params([task], [plan.events]))
            plan.place(await inserted.fetchall())
            messages = plan.outbox_messages()
            if messages:
                subscriptions = subscriptions_from(await (await conn.execute(SUBSCRIPTIONS_SQL)).fetchall())
                await conn.execute(outbox_insert_sql(), outbox_insert_params(outbox_rows(messages, subscriptions),
                                                                             now=now))
    except _HandOff:
        return None
    for action in after_commit_of(plan.written):
        action()
    counters.append_duration_observe(time.perf_counter() - started)
    return AppendOutcome(events=plan.events, replayed=False)
