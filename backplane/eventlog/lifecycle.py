"""Lifecycle messages: the outbox announcement that a task became pending, completed, failed
or dead-lettered, written by the event writer in the transaction of the change."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from backplane.delivery.outbox import Message, outbox_enqueue_many
from backplane.eventlog.chain import format_timestamp
from backplane.eventlog.models import Task

LIFECYCLE_TOPIC = "backplane.tasks.{kind}"


def lifecycle_message(
    *, task: Task, previous_status: str | None, seq: int, event_hash: str, now: datetime
) -> Message | None:
    """The announcement that a task became pending, completed, failed or dead-lettered; None
    when its status did not change to one of those, and always for a sandbox (no consumer may
    act on a replay)."""
    if task.sandbox or task.status == previous_status or task.status not in LIFECYCLE_STATUSES:
        return None
    return Message(
        topic=LIFECYCLE_TOPIC.format(kind=task.kind),
        key=str(task.pk),
        payload=lifecycle_payload(task, previous_status),
        headers={"task_id": str(task.pk), "seq": seq, "event_hash": event_hash, "created_at": format_timestamp(now)},
        namespace=task.namespace,
        task_id=str(task.pk),
    )


# A cancellation is announced too: a subscriber waiting for a task's end must hear of it.
LIFECYCLE_STATUSES = frozenset({"pending", "completed", "failed", "dead_lettered", "cancelled"})


def lifecycle_payload(task: Task, previous_status: str | None) -> dict[str, Any]:
    return {
        "task_id": str(task.pk),
        "namespace": task.namespace,
        "kind": task.kind,
        "status": task.status,
        "previous_status": previous_status,
        "attempts": task.attempts,
        "output": task.output,
        "error": task.error,
    }


def enqueue_lifecycle_many(*, changes: Sequence[tuple[Task, str | None]], now: datetime) -> int:
    """The lifecycle messages of many tasks at once, each paired with its previous status; the
    headers carry each task's head (``last_seq``, ``head_hash``), as ``write_events`` passes them.
    Returns how many rows were written.

    The same rows as one ``write_events`` per task writes (``WritePlan.outbox_messages``), in
    the same id order (per task: the broker's row, then one per matching subscription), but the
    subscriptions are read once and every row goes in with one INSERT. Must run inside the transaction of the change.
    """
    messages = [
        lifecycle_message(task=task, previous_status=previous, seq=task.last_seq, event_hash=task.head_hash, now=now)
        for task, previous in changes
    ]
    return outbox_enqueue_many([m for m in messages if m is not None], now=now)
