"""Sub-agent hand-off, first phase: the child task and ``SubAgentDispatched`` in the parent, together.

The second phase (the child's result entering the parent's log) is a follow-up of the child's
final event: see ``recovery.handlers``."""

from __future__ import annotations

import hashlib
import logging
import uuid
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from backplane.eventlog import event_types as et
from backplane.eventlog.errors import IdempotencyMismatch, TaskClosed
from backplane.eventlog.models import Task
from backplane.eventlog.services import ensure_storable_json, task_create_in_transaction
from backplane.eventlog.writer import EventDraft, check_lease, lock_task, write_events

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


