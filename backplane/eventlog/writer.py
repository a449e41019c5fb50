"""The one writer of the event log: every event, client or server, goes in through here.

``write_events`` (and its batched twin ``write_events_many`` for the backplane's own sweeps)
runs inside the caller's transaction, on a task row the caller has locked (``lock_task``):

1. plan the write (``write_plan``, no I/O): number, clock and hash each event on the task's
   head, and apply the reducer (``backplane.eventlog.reducer``), the only code that decides a
   task's status, attempts, lease, output and error;
2. insert the events, write the projection and add what they cost into the cost rollups
   (backplane.eventlog.costs) in one statement (``insert_events_sql``), and write the events'
   outbox messages plus the lifecycle announcement in one more;
3. run the follow-ups other parts registered (``register_follow_up``) that the write concerns,
   in registration order, still inside the transaction: recovery plugs its circuit breakers,
   sagas, budgets and the report of a sub-task's result to its parent in here, so the event log
   never imports recovery; then tell the observers (``register_observer``), whose actions run
   once the transaction commits.

The plan and the statements are the same for the other driver of a write, an agent's quiet
write on the event loop (one no follow-up has work for: backplane/eventlog/async_services.py),
which runs them on an async connection.
"""

from __future__ import annotations

import functools
import secrets
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import psycopg
from django.db import connection, transaction
from django.utils import timezone

from backplane.delivery.outbox import Message, outbox_enqueue_many
from backplane.eventlog import event_types as et
from backplane.eventlog.canonical import canonical_sha256
from backplane.eventlog.chain import compute_hash, event_hashed_fields, format_timestamp
from backplane.eventlog.costs import ROLLUP_UPSERT_SQL, rollup_records
from backplane.eventlog.errors import KindRefused, NotFound, SandboxRefused, StaleLease, TaskClosed
from backplane.eventlog.lifecycle import enqueue_lifecycle_many, lifecycle_message
from backplane.eventlog.models import CLOSED_STATUSES, Event, Task, TaskStatus
from backplane.eventlog.reducer import (
    REDUCED_FIELDS,
    TaskState,
    task_reduce,
    task_state_apply,
    task_state_of,
)
from backplane.lib.sql_rows import RowLoader, recordset, recordset_json
from backplane.telemetry.tracing import current_trace_ids, span_annotate_write, traceparent


@dataclass(frozen=True)
class OutboxDraft:
    """A message to publish once the event commits; ``key`` orders delivery (default: the task)."""

    topic: str
    payload: dict[str, Any]
    key: str | None = None


@dataclass(frozen=True)
class EventDraft:
    """An event as a writer asks for it, before the log gives it a place."""

    type: str
    payload: dict[str, Any] = field(default_factory=dict)
    idempotency_key: str | None = None
    lamport: int | None = None
    causation_id: str | None = None
    correlation_id: str | None = None
    trace_id: str | None = None
    outbox: tuple[OutboxDraft, ...] = ()
    # The span the backplane wrote the event in, when that is not the current one (the stall
    # detector writes many tasks' events at once, each in its own task's trace). Not part of the
    # request: never in the digest, never sent by a client.
    span_id: str | None = None

    def request_digest(self) -> str:
        # The parts that make a request "the same" for idempotency. The lease epoch,
        # expected_seq and lamport are left out on purpose: a recovered agent retrying
        # a write under a newer lease is still asking for the same event.
        return canonical_sha256(
            {
                "type": self.type,
                "payload": self.payload,
                "causation_id": self.causation_id,
                "correlation_id": self.correlation_id,
                "trace_id": self.trace_id,
                "outbox": [{"topic": o.topic, "payload": o.payload, "key": o.key} for o in self.outbox],
            }
        )


# The append path is the product's hot loop: building these statements through the queryset
# API costs more Python than the database's own work, so they are written as SQL.
TASK_ROWS = RowLoader(Task)
_LOCK_TASK_SQL = f"SELECT {TASK_ROWS.columns} FROM backplane_task WHERE id = %s FOR UPDATE"
_LOCK_TASKS_SQL = f"SELECT {TASK_ROWS.columns} FROM backplane_task WHERE id = ANY(%s) ORDER BY id FOR UPDATE"
LOCK_TASK_IN_NAMESPACE_SQL = (
    f"SELECT {TASK_ROWS.columns} FROM backplane_task WHERE id = %s AND namespace = %s FOR UPDATE"
)


def lock_task(*, namespace: str | None, task_id: uuid.UUID) -> Task:
    """Lock a task row for the rest of the transaction. ``namespace=None``: staff, any namespace."""
    if namespace is None:
        task = TASK_ROWS.fetch_one(_LOCK_TASK_SQL, [task_id])
    else:
        task = TASK_ROWS.fetch_one(LOCK_TASK_IN_NAMESPACE_SQL, [task_id, namespace])
    if task is None:
        raise NotFound("task not found", {"task_id": str(task_id)})
    return task


def lock_tasks(task_ids: Sequence[uuid.UUID]) -> list[Task]:
    """Lock many task rows for the rest of the transaction, in id order (the order every
    multi-task write takes them in, so two never deadlock); the ones that exist, in that order."""
    return TASK_ROWS.fetch_all(_LOCK_TASKS_SQL, [list(task_ids)])


def check_kind(task: Task, *, agent: str | None, kinds: Sequence[str]) -> None:
    """A token limited to ``kinds`` writes only tasks of those kinds, and the tasks it created
    itself (the sub-tasks it dispatched): another kind is 403. ``check_lease``'s first rule, and
    the whole rule for a write that needs no lease (a signal sent to a task)."""
    if kinds and task.kind not in kinds and (agent is None or task.created_by != agent):
        raise KindRefused(
            f"this agent writes only tasks of its kinds ({', '.join(kinds)})",
            {"kind": task.kind},
        )


def check_lease(
    task: Task,
    lease_epoch: int | None,
    *,
    agent: str | None,
    kinds: Sequence[str] = (),
    now: datetime | None = None,
) -> None:
    """Fencing and confinement: who may write to ``task`` now (docs/api.md, "Tasks and events").

    ``agent`` is the writing agent's name; None only for the backplane itself (a sweep, the
    answer a tool the gateway called gave), which no lease fences. In order:

    1. a token limited to ``kinds`` writes only tasks of those kinds, and the tasks it created
       itself (the sub-tasks it dispatched): another kind is 403, whatever the lease says;
    2. a leased task takes writes only from its holder, with its current epoch, and only
       until the lease expires: anyone else is 409 stale_lease even with the right epoch (the
       epoch is on every reader's copy of the task, so alone it proves nothing);
    3. without a lease anyone in the namespace may write, but an epoch that is sent must
       still be current: its holder may not know yet that its lease expired or was released.

    Expiry is checked here, at the write, not left to the stall detector: between the
    deadline and the detector's next sweep the holder is already presumed dead, and a write
    it makes then could interleave with the next holder's work.
    """
    check_kind(task, agent=agent, kinds=kinds)
    if task.is_leased and lease_epoch is None:
        raise StaleLease(
            "the task is leased; send lease_epoch",
            {"lease_epoch": "required while the task is leased"},
        )
    if task.is_leased and agent is not None and agent != task.lease_holder:
        raise StaleLease(
            "the task is leased by another agent; only the holder writes",
            {"lease_epoch": lease_epoch},
        )
    if lease_epoch is not None and lease_epoch != task.lease_epoch:
        raise StaleLease(
            "lease epoch is not the task's current one",
            {"lease_epoch": lease_epoch},
        )
    if lease_epoch is not None and not task.is_leased and task.status == TaskStatus.COMPENSATING:
        # A saga runs after the task failed for good or was cancelled: the lease that epoch
        # names has ended with the task's work, and the holder hears why.
        raise task_closed_error(task)
    if lease_epoch is not None and lease_expired(task, now=now):
        assert task.lease_expires_at is not None
        raise StaleLease(
            "the lease expired; claim the task again",
            {"lease_epoch": lease_epoch, "expired_at": task.lease_expires_at.isoformat()},
        )


def task_closed_error(task: Task) -> TaskClosed:
    """The 409 for a write that meets a closed task. A cancelled one (or one compensating, or
    compensated, after its cancellation) names who cancelled it, why and when, so its lease
    holder learns why its work stopped; the ``TaskCancelled`` event is read only here, on the
    error path."""
    details: dict[str, Any] = {"status": task.status}
    if task.status in (TaskStatus.CANCELLED, TaskStatus.COMPENSATING, TaskStatus.COMPENSATED):
        cancelled = (Event.objects.filter(task_id=task.pk, type=et.TASK_CANCELLED)
                     .only("payload", "recorded_at").order_by("-seq").first())
        if cancelled is not None:
            details.update(cancelled_by=cancelled.payload.get("cancelled_by"), reason=cancelled.payload.get("reason"),
                           cancelled_at=cancelled.recorded_at.isoformat())
            return TaskClosed(f"task was cancelled by {details['cancelled_by']}: {details['reason']}", details)
    return TaskClosed(f"task is {task.status}", details)


def lease_expired(task: Task, *, now: datetime | None = None) -> bool:
    """A lease past its deadline, whether or not the stall detector has swept it yet."""
    return task.is_leased and task.lease_expires_at is not None and task.lease_expires_at <= (now or timezone.now())


def write_events(
    task: Task,
    drafts: Sequence[EventDraft],
    *,
    agent: str | None,
    now: datetime,
    digests: Sequence[str | None] | None = None,
    allow_closed: bool = False,
) -> list[Event]:
    """Number, clock, hash and insert events on a locked task, and update its projection.

    The caller holds the task's row lock and has done every check but one: an event
    after the task closed (e.g. the second half of a batch) is refused here, unless the
    backplane itself records something that arrived late (``allow_closed``).
    """
    plan = write_plan(task, drafts, agent=agent, now=now, digests=digests, allow_closed=allow_closed)
    plan.place(_insert_events_and_update_projections([plan]))
    outbox_enqueue_many(plan.outbox_messages(), now=now)
    _follow_up(plan)
    return plan.events


@dataclass
class WritePlan:
    """One task's write worked out before any statement runs (``write_plan``): its events
    numbered, clocked and hashed, the task's projection reduced in memory, and the follow-ups
    it concerns. Both drivers run the same statements from it: ``write_events`` on Django's
    connection and backplane/eventlog/async_services.py on the event loop's."""

    task: Task
    events: list[Event]
    drafts: Sequence[EventDraft]
    written: WrittenEvents
    follow_ups: list[FollowUp]  # none: a quiet write, of which only the observers are told

    def place(self, rows: Sequence[tuple[Any, int, int]]) -> None:
        """The events' positions, from ``insert_events_sql``'s rows."""
        place_events(self.events, rows)
        span_annotate_write(task_id=self.task.pk, kind=self.task.kind, seq=self.task.last_seq, events=self.events,
                            agent=self.events[0].agent if self.events else None, lease_epoch=self.task.lease_epoch)

    def outbox_messages(self) -> list[Message]:
        """The events' own messages, then the lifecycle announcement (once placed: a message
        names its event's position): one INSERT for the whole write."""
        task, now = self.task, self.written.now
        messages = [
            Message(
                topic=item.topic,
                key=item.key or str(task.pk),
                payload=item.payload,
                headers=outbox_headers(task, event, now),
                namespace=task.namespace,  # the outbox puts it in the headers and scopes the key's order by it
                task_id=str(task.pk),
                event_position=event.position,
            )
            for draft, event in zip(self.drafts, self.events, strict=True)
            for item in draft.outbox
        ]
        lifecycle = lifecycle_message(task=task, previous_status=self.written.previous_status, seq=task.last_seq,
                                      event_hash=task.head_hash, now=now)
        return messages if lifecycle is None else [*messages, lifecycle]


def write_plan(
    task: Task,
    drafts: Sequence[EventDraft],
    *,
    agent: str | None,
    now: datetime,
    digests: Sequence[str | None] | None = None,
    allow_closed: bool = False,
) -> WritePlan:
    """``write_events``' work before its statements: the events placed on the task's head,
    hashed and reduced into ``task`` (which it updates in memory), and the follow-ups it
    concerns. No I/O, but for the error of a write that meets a closed task, which reads who
    closed it (``task_closed_error``)."""
    if task.sandbox and any(draft.outbox for draft in drafts):
        raise SandboxRefused("a sandbox sends no messages: replay the agent without its outbox",
                             {"outbox": "not accepted on a sandbox task"})
    was_open = not task.is_closed
    # A task's first write finds it with no status yet: it is announced as new (lifecycle.py).
    previous_status = task.status if task.last_seq else None
    # The events are reduced onto the task's state, which is copied onto the task once, after
    # the last: a batch's hundred events pay for one copy, not one each.
    state = task_state_of(task)
    events: list[Event] = []
    for index, draft in enumerate(drafts):
        if state.status in CLOSED_STATUSES and not allow_closed:
            task_state_apply(task, state)
            raise task_closed_error(task)
        event = _number_event(task, state, draft, agent=agent, now=now, digest=digests[index] if digests else None)
        state = task_reduce(state, event)
        events.append(event)
    task_state_apply(task, state)
    task.updated_at = now
    written = WrittenEvents(task=task, events=events, previous_status=previous_status, status=task.status,
                            was_open=was_open, now=now)
    return WritePlan(task=task, events=events, drafts=drafts, written=written,
                     follow_ups=[f for f in _follow_ups if f.concerns(written)])


# --- quiet writes: no follow-up has work to do for them -----------------------------------------


def may_be_quiet(drafts: Sequence[EventDraft]) -> bool:
    """Whether a client's write of ``drafts`` may be made on the event loop, known before the task
    is read: the loop hands any other to the sync service at once, without a round trip. A
    failure is always counted by the breakers (recovery/handlers.py)."""
    return not any(draft.type == et.TASK_FAILED for draft in drafts)




# --- follow-ups: what other parts do when events are written ---------------------------------


@dataclass(frozen=True)
class WrittenEvents:
    """What a follow-up is told: a task (locked, its projection already updated) and the
    events just written to it, with the task's status before them."""

    task: Task
    events: list[Event]
    previous_status: str | None  # None: the task's first events
    # The status these events left the task in. ``task.status`` may move on while follow-ups
    # run (a saga's own events make a failed task compensating); this one does not.
    status: str
    was_open: bool
    now: datetime


@dataclass(frozen=True)
class FollowUp:
    """What another part does when events are written (``register_follow_up``): ``run``, for a
    write that ``concerns`` it. ``concerns`` reads only the write (no I/O), so whether a write
    concerns any follow-up is known from its plan, before a statement runs, on either driver.

    The event loop's driver (async_services.py) runs no follow-up: a write that concerns one is
    made there only when its ``idle_async``, one read on the loop's connection inside the write's
    transaction, finds it nothing to do (None: never known there)."""

    concerns: Callable[[WrittenEvents], bool]
    run: Callable[[WrittenEvents], None]
    idle_async: Callable[[psycopg.AsyncConnection[Any], WrittenEvents], Awaitable[bool]] | None = None


# An observer is told of a write and answers what to do once, and only if, it commits.
Observer = Callable[[WrittenEvents], Callable[[], None] | None]
_follow_ups: list[FollowUp] = []
_observers: list[Observer] = []


def register_follow_up(follow_up: FollowUp) -> None:
    """Run ``follow_up`` after every write that concerns it, in the writer's transaction, in
    registration order.

    Registered by an app's ``AppConfig.ready`` (recovery registers its circuit breakers,
    sagas, parent reports and budgets). A follow-up may lock more rows and write more events
    (through ``write_events``); an exception it raises rolls the whole write back.
    """
    if follow_up not in _follow_ups:
        _follow_ups.append(follow_up)


def register_observer(observer: Observer) -> None:
    """Tell ``observer`` of every write, quiet or not, on either driver: what it answers (the
    dashboard's live notice, a count on /metrics) runs once the write commits. It reads what it
    needs from the write when told, so a task that moves on later in the transaction does not
    change what it reports; it writes nothing."""
    if observer not in _observers:
        _observers.append(observer)


def after_commit_of(written: WrittenEvents) -> list[Callable[[], None]]:
    """What the observers will do once ``written`` commits (the async driver runs them itself)."""
    return [action for observer in _observers if (action := observer(written)) is not None]


def _follow_up(plan: WritePlan) -> None:
    written = plan.written
    for follow_up in plan.follow_ups:
        follow_up.run(written)
    for action in after_commit_of(written):
        transaction.on_commit(action)


def outbox_headers(task: Task, event: Event, now: datetime) -> dict[str, Any]:
    headers: dict[str, Any] = {
        "task_id": str(task.pk),
        "seq": event.seq,
        "event_hash": event.hash,
        "agent": event.agent,
        "created_at": format_timestamp(now),
    }
    if event.trace_id and len(event.trace_id) == 32:
        # W3C trace context naming the span that wrote the event: the relay's publish span is its
        # child. An event written outside any span (a client's own trace id) gets a fresh one.
        headers["traceparent"] = traceparent(event.trace_id, event.span_id or secrets.token_hex(8))
    return headers


# --- many tasks at once (the backplane's own sweeps) ----------------------------------------


@dataclass(frozen=True)
class TaskWrite:
    """The events ``write_events_many`` appends to one locked task."""

    task: Task
    drafts: Sequence[EventDraft]


def write_events_many(writes: Sequence[TaskWrite], *, agent: str | None, now: datetime) -> list[list[Event]]:
    """``write_events`` for many locked tasks: the same events, hashes, projections, lifecycle
    messages and follow-ups (breakers, sagas, reports to parents) as one call per task, but
    every event and projection is written by one statement and every lifecycle message by
    one more, instead of a few statements per task.

    For the backplane's own writes (the stall detector), not client appends: no request
    digests are stored, and drafts with outbox messages are refused (use ``write_events``).
    """
    for write in writes:
        if any(draft.outbox for draft in write.drafts):
            raise ValueError("write_events_many does not enqueue draft outbox messages; use write_events")
    plans = [write_plan(write.task, write.drafts, agent=agent, now=now) for write in writes]
    if plans:
        place_events([event for plan in plans for event in plan.events], _insert_events_and_update_projections(plans))
    enqueue_lifecycle_many(changes=[(plan.task, plan.written.previous_status) for plan in plans], now=now)
    # Then, per task in the order given, what write_events does after its insert.
    for plan in plans:
        _follow_up(plan)
    return [plan.events for plan in plans]


# ``Event``'s concrete fields (attnames) in their order, which ``_number_event`` passes positionally:
# Django's positional construction skips the keyword path's lookup of every field by name, which a
# 100-event batch would pay a hundred times; tests/backplane/eventlog/test_event_append.py holds
# this order to the model's.
EVENT_FIELDS = (
    "position", "task_id", "seq", "type", "payload", "agent", "idempotency_key", "request_digest", "lamport",
    "causation_id", "correlation_id", "trace_id", "span_id", "recorded_at", "prev_hash", "hash",
)
_EVENT_TASK = Event.task.field
# Typed as a plain callable: django-stubs checks a model's positional arguments against another order.
_new_event: Callable[..., Event] = Event


def _number_event(
    task: Task, state: TaskState, draft: EventDraft, *, agent: str | None, now: datetime, digest: str | None = None
) -> Event:
    """Place, clock and hash one event on the head of ``state`` (``task``'s, as the events before
    it left it); the caller reduces it."""
    seq = state.last_seq + 1
    lamport = max(state.lamport, draft.lamport or 0) + 1
    # The trace the write runs in (telemetry/tracing.py): an event the client gave no trace id
    # gets the request's, and the current span is kept only when it belongs to the event's trace.
    ambient_trace_id, ambient_span_id = current_trace_ids()
    trace_id = draft.trace_id or ambient_trace_id
    span_id = draft.span_id or (ambient_span_id if trace_id == ambient_trace_id else None)
    event = _new_event(
        None, task.pk, seq, draft.type, draft.payload, agent, draft.idempotency_key, digest, lamport,
        draft.causation_id, draft.correlation_id, trace_id, span_id, now, state.head_hash, "",
    )
    _EVENT_TASK.set_cached_value(event, task)
    event.hash = compute_hash(event_hashed_fields(event))
    return event


# Every write of events (one client event, a client batch, a sweep over many tasks) is this
# one round trip: the events, the projections and the cost rollups' increments go in as three
# JSON arrays of records. The
# queryset API, a VALUES list or unnest() arrays all have the client-side binding compile or
# quote every value in Python, while a JSON text is quoted once.
# The columns come from the models (``recordset``); the projection's are the reducer's fields.
_EVENT_COLUMNS = (
    "task", "seq", "type", "payload", "agent", "idempotency_key", "request_digest", "lamport", "causation_id",
    "correlation_id", "trace_id", "span_id", "recorded_at", "prev_hash", "hash",
)
_PROJECTION_COLUMNS = ("id", *REDUCED_FIELDS, "updated_at")


@functools.cache
def insert_events_sql() -> str:
    """The one statement of every write (``insert_events_params``); it answers each event's
    (task, seq, position), for ``place_events``."""
    events = recordset(Event, _EVENT_COLUMNS)
    projection = recordset(Task, _PROJECTION_COLUMNS)
    assignments = ", ".join(f"{column} = p.{column}" for column in projection.columns[1:])
    return f"""
WITH inserted AS (
    INSERT INTO backplane_event ({events.column_list})
    SELECT {events.column_list} FROM jsonb_to_recordset(%s::jsonb) AS {events.definition('e')}
    RETURNING task_id, seq, position
),
projection AS (
    UPDATE backplane_task AS t SET {assignments}
    FROM jsonb_to_recordset(%s::jsonb) AS {projection.definition('p')}
    WHERE t.id = p.id
),
rollups AS ({ROLLUP_UPSERT_SQL})
SELECT task_id, seq, position FROM inserted
"""


def insert_events_params(tasks: list[Task], events_of: list[list[Event]]) -> list[str]:
    """The events of ``tasks`` (``events_of``, task by task), their projections (a task
    without events gets its projection written all the same) and what they cost."""
    event_columns = recordset(Event, _EVENT_COLUMNS).attnames
    event_rows = [{name: getattr(e, name) for name in event_columns} for events in events_of for e in events]
    projection_rows = [{name: getattr(t, name) for name in _PROJECTION_COLUMNS} for t in tasks]
    # What the events cost, added into the rollups (eventlog/costs.py); most writes add nothing.
    rollups = rollup_records(zip(tasks, events_of, strict=True))
    return [recordset_json(event_rows), recordset_json(projection_rows), recordset_json(rollups)]


def _insert_events_and_update_projections(plans: list[WritePlan]) -> list[tuple[Any, int, int]]:
    with connection.cursor() as cursor:
        cursor.execute(insert_events_sql(), insert_events_params([p.task for p in plans], [p.events for p in plans]))
        return cursor.fetchall()


def place_events(events: Sequence[Event], rows: Sequence[tuple[Any, int, int]]) -> None:
    """Each event's position, from ``insert_events_sql``'s rows, and the event marked as stored."""
    positions = {(task_id, seq): position for task_id, seq, position in rows}
    for event in events:
        event.position = positions[(event.task_id, event.seq)]
        event._state.adding = False
        event._state.db = "default"
