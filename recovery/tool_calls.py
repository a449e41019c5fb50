"""The tool-call idempotency proxy: write before you act, acknowledge before you advance."""

from __future__ import annotations

import functools
import hashlib
import logging
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from backplane.eventlog import event_types as et
from backplane.eventlog.errors import IdempotencyMismatch, InvalidInput, TaskClosed
from backplane.eventlog.services import ensure_storable_json, replay_count
from backplane.eventlog.writer import EventDraft, check_lease, lock_task, write_events
from backplane.telemetry import counters
from recovery.models import ToolCall, ToolCallStatus
from recovery.sagas import saga_record_compensation_result
from recovery.selectors import tool_call_visible

logger = logging.getLogger(__name__)


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
            replay_count(task_id=task.pk, kind="tool_call", now=timezone.now())
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
                replay_count(task_id=task.pk, kind="tool_result", now=timezone.now())
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
        transaction.on_commit(functools.partial(counters.tool_call_result_count, tool=call.tool, status=status,
                                                seconds=(now - call.dispatched_at).total_seconds()))
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


