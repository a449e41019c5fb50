"""Leases, the tool-call idempotency proxy and sub-agent hand-off. One transaction each."""

from __future__ import annotations

import hashlib
import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import psycopg
from django.conf import settings
from django.db import OperationalError, transaction
from django.db.models import Q
from django.utils import timezone

from backplane import event_types as et
from backplane.breakers import breaker_gate_claim, breaker_record_failures, breaker_trial_unused
from backplane.chain import format_timestamp
from backplane.errors import IdempotencyMismatch, InvalidInput, StaleLease, TaskClosed
from backplane.models import Agent, DeadLetter, DeadLetterSource, Task, TaskStatus
from backplane.outbox import enqueue_lifecycle
from backplane.services import (
    EventDraft,
    TaskWrite,
    check_lease,
    ensure_storable_json,
    lock_task,
    task_create_in_transaction,
    write_events,
    write_events_many,
)
from recovery.models import ToolCall, ToolCallStatus
from recovery.sagas import saga_record_compensation_result
from recovery.selectors import tool_call_visible

logger = logging.getLogger(__name__)

# --- leases --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Claim:
    task: Task
    lease_epoch: int
    expires_at: datetime
    recovered: bool


def lease_claim(*, agent: Agent, kinds: Sequence[str] | None, lease_seconds: int) -> Claim | None:
    """Give ``agent`` the oldest pending task of ``kinds`` under a new lease, or None.

    ``SKIP LOCKED`` makes concurrent claimers pass over rows another claimer is taking
    instead of queueing behind it, so two agents never win the same task and neither waits.
    """
    allowed = list(kinds) if kinds else list(agent.kinds)
    if agent.kinds and not set(allowed) <= set(agent.kinds):
        raise InvalidInput(
            "this agent may not claim some of these kinds",
            {"kinds": f"allowed: {sorted(agent.kinds)}"},
        )
    # Before the claim's own transaction: see backplane/breakers.py on lock order.
    gate = breaker_gate_claim(agent_id=agent.pk)
    claim = _claim_oldest_pending(agent=agent, kinds=allowed, lease_seconds=lease_seconds)
    if claim is None and gate.trial:
        breaker_trial_unused(agent_id=agent.pk)
    return claim


def _claim_oldest_pending(*, agent: Agent, kinds: list[str], lease_seconds: int) -> Claim | None:
    with transaction.atomic(durable=True):
        candidates = Task.objects.select_for_update(skip_locked=True, of=("self",)).filter(
            namespace=agent.namespace, status=TaskStatus.PENDING
        )
        if kinds:
            candidates = candidates.filter(kind__in=kinds)
        task = candidates.order_by("created_at", "id").first()
        if task is None:
            return None
        now = timezone.now()
        # An attempt is counted when one stalls or fails, so any counted attempt means
        # this claimer picks up work an earlier holder left unfinished.
        recovered = task.attempts > 0
        task.lease_epoch += 1
        task.lease_holder = agent.name
        task.lease_seconds = lease_seconds
        task.lease_expires_at = now + timedelta(seconds=lease_seconds)
        task.status = TaskStatus.RUNNING
        task.save(update_fields=["lease_epoch", "lease_holder", "lease_seconds", "lease_expires_at", "status"])
        write_events(
            task,
            [
                EventDraft(
                    type=et.TASK_CLAIMED,
                    payload={
                        "agent": agent.name,
                        "lease_epoch": task.lease_epoch,
                        "expires_at": task.lease_expires_at.isoformat(),
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
    return Claim(task=task, lease_epoch=task.lease_epoch, expires_at=task.lease_expires_at, recovered=recovered)


def _lock_leased(*, namespace: str | None, task_id: uuid.UUID, lease_epoch: int) -> Task:
    task = lock_task(namespace=namespace, task_id=task_id)
    if not task.is_leased or task.lease_epoch != lease_epoch:
        raise StaleLease("lease epoch is not the task's current lease", {"lease_epoch": lease_epoch})
    return task


def lease_heartbeat(*, namespace: str | None, task_id: uuid.UUID, lease_epoch: int) -> Task:
    """Extend the current lease by its length. Holds the row lock, so the stall detector
    (which expires leases under the same lock) sees either the old or the new expiry."""
    with transaction.atomic(durable=True):
        task = _lock_leased(namespace=namespace, task_id=task_id, lease_epoch=lease_epoch)
        task.lease_expires_at = timezone.now() + timedelta(seconds=task.lease_seconds)
        task.save(update_fields=["lease_expires_at"])
    return task


def lease_release(*, namespace: str | None, task_id: uuid.UUID, lease_epoch: int) -> Task:
    """Hand the task back to pending without counting an attempt."""
    with transaction.atomic(durable=True):
        task = _lock_leased(namespace=namespace, task_id=task_id, lease_epoch=lease_epoch)
        previous_status = task.status
        task.lease_holder = None
        task.lease_expires_at = None
        task.status = TaskStatus.PENDING
        task.updated_at = timezone.now()
        task.save(update_fields=["lease_holder", "lease_expires_at", "status", "updated_at"])
        enqueue_lifecycle(
            task=task, previous_status=previous_status, seq=task.last_seq, event_hash=task.head_hash,
            now=task.updated_at,
        )
    return task


# --- the tool-call idempotency proxy --------------------------------------------------------


def tool_call_key(*, task_id: uuid.UUID, step: int, tool: str) -> str:
    """Stable, never random: a retry of the same step of the same tool finds the same record."""
    return hashlib.sha256(f"{task_id}:{step}:{tool}".encode()).hexdigest()


@dataclass(frozen=True)
class ToolCallOutcome:
    call: ToolCall
    replayed: bool


def tool_call_dispatch(
    *,
    namespace: str | None,
    task_id: uuid.UUID,
    step: int,
    tool: str,
    input: dict[str, Any],
    agent: str | None,
    lease_epoch: int | None,
    compensation: dict[str, Any] | None = None,
    ttl_seconds: int | None = None,
) -> ToolCallOutcome:
    """Record a tool call before the agent makes it (write before you act).

    ``ttl_seconds``: how long the record (the cached answer) is kept; default the global TTL.
    """
    ensure_storable_json(input, "input")
    ensure_storable_json(compensation, "compensation")
    key = tool_call_key(task_id=task_id, step=step, tool=tool)
    with transaction.atomic(durable=True):
        task = lock_task(namespace=namespace, task_id=task_id)
        check_lease(task, lease_epoch)
        existing = ToolCall.objects.filter(pk=key).first()
        if existing is not None:
            if existing.input != input or existing.compensation != compensation:
                raise IdempotencyMismatch(
                    "this step and tool were dispatched with a different input",
                    {"idempotency_key": key, "step": step, "tool": tool},
                )
            return ToolCallOutcome(call=existing, replayed=True)
        if task.is_closed:
            raise TaskClosed(f"task is {task.status}", {"status": task.status})
        now = timezone.now()
        call = ToolCall.objects.create(
            idempotency_key=key,
            task=task,
            step=step,
            tool=tool,
            input=input,
            compensation=compensation,
            dispatched_by=agent,
            dispatched_at=now,
            expires_at=now + timedelta(seconds=ttl_seconds or settings.BACKPLANE_TOOL_CALL_TTL_SECONDS),
        )
        write_events(
            task,
            [
                EventDraft(
                    type=et.TOOL_CALL_DISPATCHED,
                    payload={
                        "idempotency_key": key,
                        "step": step,
                        "tool": tool,
                        "input": input,
                        "compensation": compensation,
                    },
                )
            ],
            agent=agent,
            now=now,
        )
    return ToolCallOutcome(call=call, replayed=False)


def tool_call_record_result(
    *,
    namespace: str | None,
    key: str,
    status: str,
    result: dict[str, Any],
    agent: str | None,
    lease_epoch: int | None,
    fenced: bool = True,
) -> ToolCallOutcome:
    """Record a tool's answer once (acknowledge before you advance); an identical repeat is a replay.

    ``fenced=False``: the backplane records what a tool it called itself answered. That answer
    is a fact whichever lease is current by now; refusing it would make the next holder call
    the tool again.
    """
    if status not in (ToolCallStatus.SUCCEEDED, ToolCallStatus.FAILED):
        raise InvalidInput("status must be succeeded or failed", {"status": "must be succeeded or failed"})
    ensure_storable_json(result, "result")
    with transaction.atomic(durable=True):
        call = tool_call_visible(namespace=namespace, key=key)
        task = lock_task(namespace=namespace, task_id=call.task_id)
        if fenced:
            check_lease(task, lease_epoch)
        call = ToolCall.objects.select_for_update().get(pk=key)
        if call.status != ToolCallStatus.DISPATCHED:
            if call.status == status and call.result == result:
                return ToolCallOutcome(call=call, replayed=True)
            raise IdempotencyMismatch(
                "this tool call was already answered differently",
                {"idempotency_key": key, "status": call.status},
            )
        if task.is_closed:
            raise TaskClosed(f"task is {task.status}", {"status": task.status})
        now = timezone.now()
        call.status = status
        call.result = result
        call.completed_at = now
        call.save(update_fields=["status", "result", "completed_at"])
        if call.compensation_of is not None:
            saga_record_compensation_result(task, call, agent=agent, now=now)
            return ToolCallOutcome(call=call, replayed=False)
        write_events(
            task,
            [
                EventDraft(
                    type=et.TOOL_CALL_RESULT_RECEIVED,
                    payload={"idempotency_key": key, "step": call.step, "tool": call.tool, "status": status,
                             "result": result},
                )
            ],
            agent=agent,
            now=now,
        )
    return ToolCallOutcome(call=call, replayed=False)


def tool_call_purge_expired(*, now: datetime | None = None, batch_size: int = 1000) -> int:
    """Delete one batch of records past their TTL; returns how many went (0: nothing left)."""
    now = now or timezone.now()
    with transaction.atomic(durable=True):
        keys = list(
            ToolCall.objects.filter(expires_at__lte=now)
            .order_by("expires_at")
            .select_for_update(skip_locked=True)
            .values_list("pk", flat=True)[:batch_size]
        )
        if not keys:
            return 0
        deleted, _ = ToolCall.objects.filter(pk__in=keys).delete()
    return deleted


# --- sub-agents ----------------------------------------------------------------------------


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
) -> SubtaskOutcome:
    """First phase of the hand-off: the child task and ``SubAgentDispatched`` in the parent, together."""
    ensure_storable_json(input, "input")
    dispatch_key = hashlib.sha256(f"{parent_task_id}:{step}:subagent:{kind}".encode()).hexdigest()
    with transaction.atomic(durable=True):
        parent = lock_task(namespace=namespace, task_id=parent_task_id)
        check_lease(parent, lease_epoch)
        existing = Task.objects.filter(dispatch_key=dispatch_key).first()
        if existing is not None:
            if existing.input != input:
                raise IdempotencyMismatch(
                    "this step already dispatched a sub-agent of this kind with another input",
                    {"dispatch_key": dispatch_key, "child_task_id": str(existing.pk)},
                )
            return SubtaskOutcome(child=existing, dispatch_key=dispatch_key, created=False)
        if parent.is_closed:
            raise TaskClosed(f"task is {parent.status}", {"status": parent.status})
        child = task_create_in_transaction(
            namespace=parent.namespace,
            kind=kind,
            input=input,
            agent=agent,
            task_id=uuid.uuid4(),
            parent_task_id=parent.pk,
            max_attempts=settings.BACKPLANE_MAX_ATTEMPTS,
            metadata={"dispatch_key": dispatch_key, "step": step},
        ).task
        Task.objects.filter(pk=child.pk).update(dispatch_key=dispatch_key)
        child.dispatch_key = dispatch_key
        write_events(
            parent,
            [
                EventDraft(
                    type=et.SUB_AGENT_DISPATCHED,
                    payload={"child_task_id": str(child.pk), "dispatch_key": dispatch_key, "step": step,
                             "kind": kind, "input": input},
                )
            ],
            agent=agent,
            now=timezone.now(),
        )
    return SubtaskOutcome(child=child, dispatch_key=dispatch_key, created=True)


# --- the stall detector --------------------------------------------------------------------


@dataclass(frozen=True)
class StallSweep:
    expired: int
    requeued: int
    dead_lettered: int


def lease_expire_stalled(*, now: datetime | None = None, batch_size: int = 100) -> StallSweep:
    """Expire one batch of leases that ran out: fence the holder off and hand the task on.

    Races, and why they are safe:
    - a heartbeat and this sweep both lock the row. If the heartbeat holds it, SKIP LOCKED
      passes the row over this round; if it committed a moment ago, PostgreSQL re-checks
      the WHERE clause against the new row version and the extended lease no longer
      matches. Either way a renewed lease is never expired;
    - two sweeps at once (several workers) lock disjoint rows, so nothing is counted twice.

    The batch is written set-wise (a sweep after a crash of a busy agent can have thousands
    of leases to take back, and the lag until TaskStalled is the time to sweep them all):
    1. lock the batch's tasks (one SELECT ... FOR UPDATE SKIP LOCKED);
    2. ``write_events_many``: every TaskStalled (and TaskDeadLettered) with its projection in
       one statement, every lifecycle message in one more; the events are chained exactly as
       ``write_events`` chains them, each on its own task's head;
    3. the dead letters of the exhausted tasks in one INSERT;
    4. the holders' circuit breakers: every agent locked (in id order) and updated once.
    """
    now = now or timezone.now()
    with transaction.atomic(durable=True):
        silent_since = now - timedelta(seconds=settings.BACKPLANE_NO_PROGRESS_STALL_SECONDS)
        stalled = list(
            Task.objects.select_for_update(skip_locked=True)
            .filter(status=TaskStatus.RUNNING, lease_holder__isnull=False)
            # A lease that ran out, or one kept alive by heartbeats while nothing was written.
            .filter(Q(lease_expires_at__lt=now) | Q(last_event_at__lt=silent_since))
            .order_by("lease_expires_at")[:batch_size]
        )
        if not stalled:
            return StallSweep(expired=0, requeued=0, dead_lettered=0)
        writes: list[TaskWrite] = []
        # Read before the events release the lease: why each task stalled and who held it.
        stalls: list[tuple[Task, str, str | None, bool]] = []
        # (namespace, holder) -> (leases of it that stalled, the last of them)
        failed_holders: dict[tuple[str, str], tuple[int, uuid.UUID]] = {}
        for task in stalled:
            reason = "lease expired" if task.lease_expires_at < now else "no progress"
            exhausted = task.attempts + 1 >= task.max_attempts
            quiet_for = (now - (task.last_event_at or task.created_at)).total_seconds()
            drafts = [
                EventDraft(
                    type=et.TASK_STALLED,
                    payload={
                        "reason": reason,
                        "holder": task.lease_holder,
                        "lease_epoch": task.lease_epoch,
                        "lease_expired_at": format_timestamp(task.lease_expires_at),
                        "seconds_since_last_event": round(quiet_for, 3),
                        "attempt": task.attempts + 1,
                        "max_attempts": task.max_attempts,
                    },
                )
            ]
            if exhausted:
                drafts.append(
                    EventDraft(type=et.TASK_DEAD_LETTERED, payload={"reason": "attempts exhausted"})
                )
            # The events drive the projection: TaskStalled fences the holder off (epoch + 1),
            # counts the attempt and frees the task; TaskDeadLettered parks it for review.
            writes.append(TaskWrite(task=task, drafts=drafts))
            holder = task.lease_holder
            stalls.append((task, reason, holder, exhausted))
            if holder:
                count, _ = failed_holders.get((task.namespace, holder), (0, task.pk))
                failed_holders[(task.namespace, holder)] = (count + 1, task.pk)
        write_events_many(writes, agent=None, now=now)
        dead_letters = [
            DeadLetter(
                source=DeadLetterSource.TASK,
                reference=str(task.pk),
                task=task,
                topic=f"backplane.tasks.{task.kind}",
                payload={"task_id": str(task.pk), "kind": task.kind, "input": task.input},
                error=f"{reason} (holder {holder}); attempts exhausted ({task.attempts}/{task.max_attempts})",
                attempts=task.attempts,
                created_at=now,
            )
            for task, reason, holder, exhausted in stalls
            if exhausted
        ]
        DeadLetter.objects.bulk_create(dead_letters)
        dead_lettered = len(dead_letters)
        requeued = len(stalled) - dead_lettered
        # Breakers last, once per agent, locked in a fixed order: two sweeps running at once
        # cannot deadlock on agent rows (each locks only its own tasks), and an agent's claims
        # wait for its row only while this transaction commits.
        breaker_record_failures(failures=failed_holders, reason="lease expired", now=now)
    return StallSweep(expired=len(stalled), requeued=requeued, dead_lettered=dead_lettered)


# A batch PostgreSQL aborted to break a deadlock is retried at once, this many times in a row.
DEADLOCK_RETRIES = 5


def lease_expire_stalled_until_idle(*, batch_size: int = 100) -> StallSweep:
    """Sweep batch after batch until no lease is left to expire (what the beat task runs).

    Concurrent sweeps lock disjoint tasks, but writing a batch can lock more rows: the
    holders' agents (in id order), and the parent of a dead-lettered sub-task. Two sweeps whose
    batches hold each other's parents, or a sweep and an agent finishing a sub-task, can then
    wait on each other; PostgreSQL aborts one transaction. Nothing of that batch was written,
    its rows are unlocked again, and it is simply swept again.
    """
    totals = [0, 0, 0]
    deadlocks_in_a_row = 0
    while True:
        try:
            sweep = lease_expire_stalled(batch_size=batch_size)
        except OperationalError as exc:
            if not isinstance(exc.__cause__, psycopg.errors.DeadlockDetected) or (
                deadlocks_in_a_row >= DEADLOCK_RETRIES
            ):
                raise
            deadlocks_in_a_row += 1
            logger.warning("stall sweep batch aborted by a deadlock; sweeping it again (%d)", deadlocks_in_a_row)
            continue
        deadlocks_in_a_row = 0
        if not sweep.expired:
            return StallSweep(*totals)
        totals = [a + b for a, b in zip(totals, (sweep.expired, sweep.requeued, sweep.dead_lettered), strict=True)]
