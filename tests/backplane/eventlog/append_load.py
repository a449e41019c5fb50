"""Appends through the product's writer from a process of its own, for the partitioning test.

    python tests/backplane/eventlog/append_load.py fill TASKS EVENTS   # then seals them
    python tests/backplane/eventlog/append_load.py append TASKS STOP OUT
    python tests/backplane/eventlog/append_load.py finish TASKS            # then exports them

``fill`` writes EVENTS events on each of TASKS new tasks (a batch per call) and seals them
(``seal_new_events``, a signing key from the environment). ``append`` appends one event at a
time, round robin over TASKS new tasks, until the file STOP exists, and writes a line per
acknowledged append to OUT: task id, seq, position, hash and the append's seconds.
``finish`` writes TASKS new tasks of three events that complete them, settles their outbox
messages as the relay would, seals and exports them to ``BACKPLANE_AUDIT_DIR`` (what retention
needs before ``backplane_prune_task`` lets a task go), and prints their ids, one a line.
``DATABASE_URL`` names the database.
"""

from __future__ import annotations

import os
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "backplane.settings")

import django  # noqa: E402

django.setup()

from django.utils import timezone  # noqa: E402

from backplane.delivery.models import OutboxMessage, OutboxStatus  # noqa: E402
from backplane.eventlog import event_types, services  # noqa: E402
from backplane.eventlog.writer import EventDraft  # noqa: E402
from backplane.integrity.audit.export import audit_export_until_idle  # noqa: E402
from backplane.integrity.sealing import seal_new_events  # noqa: E402


def _draft(seq: int) -> EventDraft:
    # Every fourth event carries an idempotency key: the second unique key gets rows too.
    return EventDraft(type="Noted", payload={"step": seq, "thought": f"weigh option {seq % 7}"},
                      idempotency_key=f"step-{seq}" if seq % 4 == 0 else None)


def fill(tasks: int, events: int) -> None:
    for _ in range(tasks):
        task = services.task_create(namespace="acme", kind="partitioning", input={}, agent="filler").task
        for start in range(0, events, 100):
            drafts = [_draft(seq) for seq in range(start + 1, min(events, start + 100) + 1)]
            services.event_append_batch(namespace="acme", task_id=task.pk, drafts=drafts, agent="filler")
    while seal_new_events().sealed:
        pass


def finish(tasks: int) -> None:
    ids = []
    for _ in range(tasks):
        task = services.task_create(namespace="acme", kind="partitioning", input={}, agent="finisher").task
        services.event_append_batch(namespace="acme", task_id=task.pk, drafts=[_draft(1), _draft(2)], agent="finisher")
        services.event_append(namespace="acme", task_id=task.pk, agent="finisher",
                              draft=EventDraft(type=event_types.TASK_COMPLETED, payload={"output": {"ok": True}}))
        ids.append(task.pk)
    OutboxMessage.objects.filter(status=OutboxStatus.PENDING).update(status=OutboxStatus.DELIVERED,
                                                                     delivered_at=timezone.now())
    while seal_new_events().sealed:
        pass
    audit_export_until_idle()
    for task_id in ids:
        print(uuid.UUID(str(task_id)))


def append(tasks: int, stop: Path, out: Path) -> None:
    ids = [services.task_create(namespace="acme", kind="partitioning", input={}, agent="appender").task.pk
           for _ in range(tasks)]
    seqs = dict.fromkeys(ids, 0)
    with out.open("w") as lines:
        while not stop.exists():
            for task_id in ids:
                seqs[task_id] += 1
                started = time.monotonic()
                outcome = services.event_append(namespace="acme", task_id=task_id, draft=_draft(seqs[task_id]),
                                                agent="appender")
                took = time.monotonic() - started
                (event,) = outcome.events
                lines.write(f"{uuid.UUID(str(task_id))} {event.seq} {event.position} {event.hash} {took:.6f}\n")
                lines.flush()


if __name__ == "__main__":
    if sys.argv[1] == "fill":
        fill(int(sys.argv[2]), int(sys.argv[3]))
    elif sys.argv[1] == "finish":
        finish(int(sys.argv[2]))
    else:
        append(int(sys.argv[2]), Path(sys.argv[3]), Path(sys.argv[4]))
