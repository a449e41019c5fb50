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
from django.db.models import Exists, OuterRef
from django.db.models.expressions import RawSQL
from django.utils import timezone

from backplane.eventlog import event_types as et
from backplane.eventlog.async_services import lock_task_async
from backplane.eventlog.errors import InvalidInput, StaleLease
from backplane.eventlog.models import Agent, Event, Task, TaskStatus
from backplane.eventlog.reducer import lease_extended, task_state_apply, task_state_of
from backplane.eventlog.selectors import task_head_traces
from backplane.eventlog.writer import EventDraft, check_lease, lock_task, task_closed_error, write_events
from backplane.telemetry.tracing import task_span, tracing_enabled
from recovery.breakers import breaker_gate_claim, breaker_trial_unused
from recovery.budgets import blocked_roots, budget_gate
from recovery.fleet import pauses_holding_back

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
    allowed = list(kinds) if kinds else list(agent.kinds)
    if agent.kinds and not set(allowed) <= set(agent.kinds):
        raise InvalidInput(
            "this agent may not claim some of these kinds",
            {"kinds": f"allowed: {sorted(agent.kinds)}"},
        )
    # A spent namespace or agent budget refuses the claim before anything is taken.
    budget_gate(namespace=agent.namespace, agent=agent.name, task=None)
    # Before the claim's own transaction: see recovery/breakers.py on lock order.
    gate = breaker_gate_claim(agent_id=agent.pk)
    claim = _claim_oldest_pending(agent=agent, kinds=allowed, lease_seconds=lease_seconds, task_id=task_id)
    if claim is None and gate.trial:
        breaker_trial_unused(agent_id=agent.pk, trial_started_at=gate.trial_started_at)
    return claim


def _claim_oldest_pending(
    *, agent: Agent, kinds: list[str], lease_seconds: int, task_id: uuid.UUID | None
) -> Claim | None:
    with transaction.atomic(durable=True):
        candidates = Task.objects.select_for_update(skip_locked=True, of=("self",)).filter(
            namespace=agent.namespace, status=TaskStatus.PENDING
        )
        candidates = candidates.filter(pk=task_id) if task_id is not None else candidates.filter(sandbox=False)
        blocked = blocked_roots()
        if blocked:
            # The trees of spent task budgets are passed over, sub-agents and all.
            candidates = candidates.exclude(pk__in=RawSQL(_TREES_SQL, [blocked]))
        if kinds:
            candidates = candidates.filter(kind__in=kinds)
        # Paused work is passed over (recovery/fleet.py), in the claim's own statement: a pause
        # committed before it started holds the task back; one committing meanwhile holds back
        # every later claim, and leases already granted run on.
        candidates = candidates.exclude(Exists(pauses_holding_back(OuterRef("namespace"), OuterRef("kind"))))
        task = candidates.order_by("created_at", "id").first()
        if task is None:
            return None
        now = timezone.now()
        # An attempt is counted when one stalls or fails, so any counted attempt means
        # this claimer picks up work an earlier holder left unfinished. A reviewer's requeue
        # of a dead-lettered task starts its attempts afresh, but the attempts before it failed
        # all the same (a lease given back with ``release`` is no failure).
        recovered = task.attempts > 0 or (
            task.lease_epoch > 0
            and Event.objects.filter(task_id=task.pk, type=et.DEAD_LETTER_REQUEUED).exists()
        )
        recovery_span = _recovery_span(task=task, agent=agent) if recovered else nullcontext()
        # The event is the claim: the reducer gives the task its new lease from it.
        with recovery_span:
            write_events(
                task,
                [
                    EventDraft(
                        type=et.TASK_CLAIMED,
                        payload={
                            "agent": agent.name,
                            "lease_epoch": task.lease_epoch + 1,
                            "lease_seconds": lease_seconds,
                            "expires_at": (now + timedelta(seconds=lease_seconds)).isoformat(),
                            "attempt": task.attempts + 1,
                            "recovered": recovered,
                        },
                    )
                ],
                agent=agent.name,
                now=now,
            )
        if task.parent_id is not None and task.lease_epoch == 1:
            parent = Task.objects.select_for_update().get(pk=task.parent_id)
            write_events(
                parent,
                [
                    EventDraft(
                        type=et.SUB_AGENT_ACCEPTED,
                        payload={"child_task_id": str(task.pk), "dispatch_key": task.dispatch_key, "agent": agent.name},
                    )
                ],
                agent=agent.name,
                now=now,
                allow_closed=True,
            )
    assert task.lease_expires_at is not None  # the claim's event gave the task its lease
    return Claim(task=task, lease_epoch=task.lease_epoch, expires_at=task.lease_expires_at, recovered=recovered)


_TREES_SQL = """
WITH RECURSIVE tree(id) AS (
    SELECT id FROM backplane_task WHERE id = ANY(%s)
    UNION
    SELECT t.id FROM backplane_task t JOIN tree ON t.parent_id = tree.id
)
SELECT id FROM tree
"""


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
                                lease_epoch: int, agent: str) -> Task | None:
    """``lease_heartbeat`` for an agent on the event loop's connection (api/agent_front.py, in
    autocommit): the same lock, checks and statement. None, before anything is written, when the
    lease was taken by a cancellation: ``lease_heartbeat`` answers that from the log."""
    async with conn.transaction():
        task = await lock_task_async(conn, namespace=namespace, task_id=task_id)
        if _ended_by_others(task, lease_epoch):
            return None
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
        write_events(
            task,
            [EventDraft(type=et.LEASE_RELEASED, payload={"agent": task.lease_holder, "lease_epoch": lease_epoch})],
            agent=task.lease_holder,
            now=timezone.now(),
        )
    return task
