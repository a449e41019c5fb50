"""Leases: claim (consume and lock the oldest pending task), heartbeat, release. One transaction each."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import psycopg
from django.db import connection, transaction
from django.utils import timezone

from backplane.eventlog import event_types as et
from backplane.eventlog.async_services import HandOff, lock_task_async, run_after_commit, write_events_async
from backplane.eventlog.errors import InvalidInput, StaleLease
from backplane.eventlog.models import Agent, Task, TaskStatus
from backplane.eventlog.reducer import lease_extended, task_state_apply, task_state_of
from backplane.eventlog.selectors import task_head_traces
from backplane.eventlog.writer import (
    TASK_ROWS,
    EventDraft,
    check_lease,
    lock_task,
    task_closed_error,
    write_events,
)
from backplane.telemetry.tracing import task_span, tracing_enabled
from recovery.breakers import CLOSED, breaker_gate_claim, breaker_trial_unused
from recovery.budgets import (
    BUDGET_ROWS,
    CLAIM_BUDGETS_SQL,
    budget_refusal,
    claim_budgets,
    claim_budgets_of,
    claim_budgets_params,
)
from recovery.models import ApprovalStatus, SignalStatus

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Claim:
    task: Task
    lease_epoch: int
    expires_at: datetime
    recovered: bool


def lease_claim(
    *, agent: Agent, kinds: Sequence[str] | None, lease_seconds: int, task_id: uuid.UUID | None = None
) -> Claim | None:
    """Give ``agent`` the oldest pending task of ``kinds`` under a new lease, or None.

    ``SKIP LOCKED`` makes concurrent claimers pass over rows another claimer is taking
    instead of queueing behind it, so two agents never win the same task and neither waits.
    Sandbox forks are never handed out this way: they are claimed by ``task_id`` (this very
    task, if it is pending and of an allowed kind), which is how a replay runs one.
    """
    allowed = _claimable_kinds(agent, kinds)
    now = timezone.now()
    # A spent namespace or agent budget refuses the claim before anything is taken.
    budgets = claim_budgets(namespace=agent.namespace, agent=agent.name, now=now)
    if budgets.spent is not None:
        raise budget_refusal(budgets.spent, now=now)
    # Before the claim's own transaction: see recovery/breakers.py on lock order.
    gate = breaker_gate_claim(agent_id=agent.pk)
    claim = _claim_oldest_pending(agent=agent, kinds=allowed, lease_seconds=lease_seconds, task_id=task_id,
                                  blocked_roots=budgets.blocked_roots)
    if claim is None and gate.trial:
        breaker_trial_unused(agent_id=agent.pk, trial_started_at=gate.trial_started_at)
    return claim


def _claim_oldest_pending(*, agent: Agent, kinds: list[str], lease_seconds: int, task_id: uuid.UUID | None,
                          blocked_roots: list[uuid.UUID]) -> Claim | None:
    with transaction.atomic(durable=True), connection.cursor() as cursor:
        task = TASK_ROWS.fetch_one(*_candidate(namespace=agent.namespace, kinds=kinds, task_id=task_id,
                                               blocked_roots=blocked_roots))
        if task is None:
            return None
        if _requeue_unknown(task):
            cursor.execute(_REQUEUED_SQL, [task.pk, et.DEAD_LETTER_REQUEUED])
            requeued = cursor.fetchone() is not None
        else:
            requeued = False
        now = timezone.now()
        claimed = _claimed(task, agent=agent.name, lease_seconds=lease_seconds, requeued=requeued, now=now)
        recovery_span = _recovery_span(task=task, agent=agent) if claimed.recovered else nullcontext()
        # The event is the claim: the reducer gives the task its new lease from it.
        with recovery_span:
            write_events(task, [claimed.draft], agent=agent.name, now=now)
        accepted = _accepted(task, agent=agent.name)
        if accepted is not None:
            assert task.parent_id is not None
            parent = lock_task(namespace=task.namespace, task_id=task.parent_id)
            write_events(parent, [accepted], agent=agent.name, now=now, allow_closed=True)
    return claimed.claim(task)


async def lease_claim_async(conn: psycopg.AsyncConnection[Any], *, agent: Agent, kinds: Sequence[str] | None,
                            lease_seconds: int, task_id: uuid.UUID | None = None) -> Claim | None:
    """``lease_claim`` for an agent on the event loop's connection (in autocommit): the same
    checks, statements and writes. ``HandOff`` before anything is written when the claim is the
    sync service's to make: a breaker that is not closed (a trial to take, or a refusal), a spent
    budget of the namespace or the agent (its 409 reads the spend), a recovery while tracing is on
    (its span continues the task's trace), or a write some follow-up hears of."""
    allowed = _claimable_kinds(agent, kinds)
    if agent.breaker_state != CLOSED:
        raise HandOff
    now = timezone.now()
    rows = await (await conn.execute(CLAIM_BUDGETS_SQL, claim_budgets_params(namespace=agent.namespace,
                                                                             agent=agent.name))).fetchall()
    budgets = claim_budgets_of([BUDGET_ROWS.load(row) for row in rows], now=now)
    if budgets.spent is not None:
        raise HandOff
    async with conn.transaction():
        row = await (await conn.execute(*_candidate(namespace=agent.namespace, kinds=allowed, task_id=task_id,
                                                    blocked_roots=budgets.blocked_roots))).fetchone()
        if row is None:
            return None
        task = TASK_ROWS.load(row)
        requeued = _requeue_unknown(task) and await (
            await conn.execute(_REQUEUED_SQL, [task.pk, et.DEAD_LETTER_REQUEUED])).fetchone() is not None
        now = timezone.now()
        claimed = _claimed(task, agent=agent.name, lease_seconds=lease_seconds, requeued=requeued, now=now)
        if claimed.recovered and tracing_enabled():
            raise HandOff
        plans = [await write_events_async(conn, task, [claimed.draft], agent=agent.name, now=now)]
        accepted = _accepted(task, agent=agent.name)
        if accepted is not None:
            assert task.parent_id is not None
            parent = await lock_task_async(conn, namespace=task.namespace, task_id=task.parent_id)
            plans.append(await write_events_async(conn, parent, [accepted], agent=agent.name, now=now,
                                                  allow_closed=True))
    run_after_commit(*plans)
    return claimed.claim(task)


def _claimable_kinds(agent: Agent, kinds: Sequence[str] | None) -> list[str]:
    """The kinds a claim takes: those asked for, by default the agent's (none: every kind)."""
    allowed = list(kinds) if kinds else list(agent.kinds)
    if agent.kinds and not set(allowed) <= set(agent.kinds):
        raise InvalidInput(
            "this agent may not claim some of these kinds",
            {"kinds": f"allowed: {sorted(agent.kinds)}"},
        )
    return allowed


# The claim's one read, on either driver: the oldest pending task of the namespace (of ``kinds``,
# when some are given), locked, passing over rows another claimer holds, the trees of spent task
# budgets (sub-agents and all) and paused work (recovery/selectors.py's ``pauses_holding_back``, the
# same rule: the namespace's own pause, or its kind's). The pauses are read in the claim's own
# statement: a pause committed before it started holds the task back; one committing meanwhile
# holds back every later claim, and leases already granted run on. A task waiting durably — its
# holder gave it back while a tool call waits for people's approval or the task for a signal — is
# not handed out until the decision, the signal or the deadline: a claimer could only wait again.
_CANDIDATE_SQL = f"""
WITH RECURSIVE passed_over(id) AS (
    SELECT id FROM backplane_task WHERE id = ANY(%(blocked_roots)s)
    UNION
    SELECT t.id FROM backplane_task t JOIN passed_over ON t.parent_id = passed_over.id
)
SELECT {TASK_ROWS.columns} FROM backplane_task
WHERE namespace = %(namespace)s AND status = '{TaskStatus.PENDING.value}' AND {{which}}
  AND (cardinality(%(kinds)s::text[]) = 0 OR kind = ANY(%(kinds)s::text[]))
  AND id NOT IN (SELECT id FROM passed_over)
  AND NOT EXISTS (SELECT 1 FROM recovery_pause AS pause
                  WHERE pause.namespace = backplane_task.namespace AND pause.resumed_at IS NULL
                    AND (pause.kind = '' OR pause.kind = backplane_task.kind))
  AND NOT EXISTS (SELECT 1 FROM recovery_approvalrequest AS request
                  WHERE request.task_id = backplane_task.id AND request.status = '{ApprovalStatus.PENDING.value}')
  AND NOT EXISTS (SELECT 1 FROM recovery_tasksignal AS signal
                  WHERE signal.task_id = backplane_task.id AND signal.status = '{SignalStatus.WAITING.value}')
ORDER BY created_at, id
LIMIT 1
FOR UPDATE OF backplane_task SKIP LOCKED
"""
# By kind, sandboxes are never handed out; by id, this very task.
_OLDEST_SQL = _CANDIDATE_SQL.format(which="NOT sandbox")
_BY_ID_SQL = _CANDIDATE_SQL.format(which="id = %(task_id)s")


def _candidate(*, namespace: str, kinds: list[str], task_id: uuid.UUID | None,
               blocked_roots: list[uuid.UUID]) -> tuple[str, dict[str, Any]]:
    params: dict[str, Any] = {"namespace": namespace, "kinds": kinds, "blocked_roots": blocked_roots}
    if task_id is None:
        return _OLDEST_SQL, params
    return _BY_ID_SQL, {**params, "task_id": task_id}


_REQUEUED_SQL = "SELECT 1 FROM backplane_event WHERE task_id = %s AND type = %s LIMIT 1"


def _requeue_unknown(task: Task) -> bool:
    """Whether a claim must read the log to know if ``task`` is a recovery: no attempt was counted,
    yet it was leased before (released, or requeued by a reviewer: ``_REQUEUED_SQL``)."""
    return task.attempts == 0 and task.lease_epoch > 0


@dataclass(frozen=True)
class _Claimed:
    draft: EventDraft
    recovered: bool

    def claim(self, task: Task) -> Claim:
        assert task.lease_expires_at is not None  # the claim's event gave the task its lease
        return Claim(task=task, lease_epoch=task.lease_epoch, expires_at=task.lease_expires_at,
                     recovered=self.recovered)


def _claimed(task: Task, *, agent: str, lease_seconds: int, requeued: bool, now: datetime) -> _Claimed:
    """The ``TaskClaimed`` that gives ``task`` its new lease.

    An attempt is counted when one stalls or fails, so any counted attempt means this claimer
    picks up work an earlier holder left unfinished. A reviewer's requeue of a dead-lettered task
    starts its attempts afresh, but the attempts before it failed all the same (a lease given
    back with ``release`` is no failure)."""
    recovered = task.attempts > 0 or requeued
    return _Claimed(draft=EventDraft(type=et.TASK_CLAIMED, payload={
        "agent": agent,
        "lease_epoch": task.lease_epoch + 1,
        "lease_seconds": lease_seconds,
        "expires_at": (now + timedelta(seconds=lease_seconds)).isoformat(),
        "attempt": task.attempts + 1,
        "recovered": recovered,
    }), recovered=recovered)


def _accepted(task: Task, *, agent: str) -> EventDraft | None:
    """A sub-task's first claim, told to its parent (after the claim's write: child, then parent,
    the lock order of every hand-off)."""
    if task.parent_id is None or task.lease_epoch != 1:
        return None
    return EventDraft(type=et.SUB_AGENT_ACCEPTED,
                      payload={"child_task_id": str(task.pk), "dispatch_key": task.dispatch_key, "agent": agent})


def _recovery_span(*, task: Task, agent: Agent) -> AbstractContextManager[None]:
    """A recovery continues the task's trace from its last event (the stall), linked to the
    claiming request's: one trace shows the crashed work, the stall, the recovery and the
    resumed work (telemetry/tracing.py). Nothing is read while tracing is off."""
    trace_id, span_id = task_head_traces([task]).get(task.pk, (None, None)) if tracing_enabled() else (None, None)
    return task_span("recover task", trace_id=trace_id, span_id=span_id, attributes={
        "backplane.task_id": str(task.pk), "backplane.task.kind": task.kind, "backplane.agent": agent.name,
        "backplane.lease_epoch": task.lease_epoch + 1, "backplane.attempt": task.attempts + 1,
    })


# Where a cancellation leaves a task: cancelled, or compensating and then compensated after one.
_ENDED_BY_OTHERS = frozenset({TaskStatus.CANCELLED, TaskStatus.COMPENSATING, TaskStatus.COMPENSATED})


def _ended_by_others(task: Task, lease_epoch: int) -> bool:
    """The lease ``lease_epoch`` names was taken by a cancellation (it keeps the epoch): its
    holder is told who cancelled the task, which takes a read of the log (``task_closed_error``)."""
    return not task.is_leased and task.lease_epoch == lease_epoch and task.status in _ENDED_BY_OTHERS


def _check_held(task: Task, lease_epoch: int, agent: str) -> None:
    """The checks of a lease's own operations that need nothing but the locked row: ``lease_epoch``
    is the live lease and ``agent`` holds it (409 stale_lease)."""
    if not task.is_leased or task.lease_epoch != lease_epoch:
        raise StaleLease("lease epoch is not the task's current lease", {"lease_epoch": lease_epoch})
    # Only the holder renews or gives back its lease; after the deadline a heartbeat does not
    # revive it, even before the detector sweeps it.
    check_lease(task, lease_epoch, agent=agent)


def _lock_leased(*, namespace: str | None, task_id: uuid.UUID, lease_epoch: int, agent: str) -> Task:
    task = lock_task(namespace=namespace, task_id=task_id)
    if _ended_by_others(task, lease_epoch):
        # The holder whose lease a cancellation took learns why its lease is gone: task_closed
        # naming the cancellation, not a stale_lease it would take for a lost race. Any other end
        # keeps the contract's stale_lease: the holder wrote that end itself, or was fenced off
        # earlier (a stall bumps the epoch).
        closed = task_closed_error(task)
        if "cancelled_by" in closed.details:
            raise closed
    _check_held(task, lease_epoch, agent)
    return task


def lease_heartbeat(*, namespace: str | None, task_id: uuid.UUID, lease_epoch: int, agent: str) -> Task:
    """Extend the current lease by its length. Holds the row lock, so the stall detector
    (which expires leases under the same lock) sees either the old or the new expiry.

    No event: a heartbeat is liveness, not history (see ``backplane.eventlog.reducer``); the
    reducer's ``lease_extended`` still decides the new deadline."""
    with transaction.atomic(durable=True), connection.cursor() as cursor:
        task = _lock_leased(namespace=namespace, task_id=task_id, lease_epoch=lease_epoch, agent=agent)
        cursor.execute(EXTEND_LEASE_SQL, _extended(task))
    return task


async def lease_heartbeat_async(conn: psycopg.AsyncConnection[Any], *, namespace: str, task_id: uuid.UUID,
                                lease_epoch: int, agent: str) -> Task:
    """``lease_heartbeat`` for an agent on the event loop's connection (api/agent_front.py, in
    autocommit): the same lock, checks and statement. ``HandOff``, before anything is written,
    when the lease was taken by a cancellation: ``lease_heartbeat`` answers that from the log."""
    async with conn.transaction():
        task = await lock_task_async(conn, namespace=namespace, task_id=task_id)
        if _ended_by_others(task, lease_epoch):
            raise HandOff
        _check_held(task, lease_epoch, agent)
        await conn.execute(EXTEND_LEASE_SQL, _extended(task))
    return task


# A heartbeat's one write: the live lease's new deadline, on the row its caller has locked.
EXTEND_LEASE_SQL = "UPDATE backplane_task SET lease_expires_at = %s WHERE id = %s"


def _extended(task: Task) -> list[Any]:
    """``task`` with its lease extended by the reducer, and ``EXTEND_LEASE_SQL``'s parameters."""
    task_state_apply(task, lease_extended(task_state_of(task), now=timezone.now()))
    return [task.lease_expires_at, task.pk]


def lease_release(*, namespace: str | None, task_id: uuid.UUID, lease_epoch: int, agent: str) -> Task:
    """Hand the task back to pending without counting an attempt (``LeaseReleased``)."""
    with transaction.atomic(durable=True):
        task = _lock_leased(namespace=namespace, task_id=task_id, lease_epoch=lease_epoch, agent=agent)
        write_events(task, [_released(task, lease_epoch)], agent=task.lease_holder, now=timezone.now())
    return task


async def lease_release_async(conn: psycopg.AsyncConnection[Any], *, namespace: str, task_id: uuid.UUID,
                              lease_epoch: int, agent: str) -> Task:
    """``lease_release`` for an agent on the event loop's connection (in autocommit): the same
    lock, checks and write. ``HandOff``, before anything is written, when the lease was taken by
    a cancellation (``lease_release`` answers that from the log) or a follow-up hears of the write."""
    async with conn.transaction():
        task = await lock_task_async(conn, namespace=namespace, task_id=task_id)
        if _ended_by_others(task, lease_epoch):
            raise HandOff
        _check_held(task, lease_epoch, agent)
        plan = await write_events_async(conn, task, [_released(task, lease_epoch)], agent=task.lease_holder,
                                        now=timezone.now())
    run_after_commit(plan)
    return task


def _released(task: Task, lease_epoch: int) -> EventDraft:
    return EventDraft(type=et.LEASE_RELEASED, payload={"agent": task.lease_holder, "lease_epoch": lease_epoch})
