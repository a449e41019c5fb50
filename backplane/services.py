"""Writes to the event log. Every public function here is one transaction.

The append path (DESIGN.md) in one place:
1. lock the task row, so appends to one task serialize and different tasks run in parallel;
2. check the lease epoch (a fenced-off holder gets 409, never a silent write);
3. answer a known idempotency key with the original event (another body is 422);
4. refuse appends to a closed task, then check ``expected_seq`` (optimistic concurrency);
5. number, clock and hash the events, insert them, update the projection; commit.
"""

from __future__ import annotations

import json
import secrets
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from backplane import event_types as et
from backplane.breakers import breaker_record_failure, breaker_record_success
from backplane.canonical import CanonicalizationError, canonical_json, canonical_sha256
from backplane.chain import compute_hash, event_hashed_fields, format_timestamp
from backplane.errors import (
    IdempotencyMismatch,
    InvalidInput,
    NotFound,
    SeqConflict,
    StaleLease,
    TaskClosed,
    TaskExists,
)
from backplane.models import Agent, Event, Task, TaskStatus, hash_token
from backplane.outbox import Message, enqueue_lifecycle, enqueue_lifecycle_many, lifecycle_message, outbox_enqueue_many
from backplane.sql_rows import RowLoader


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


@dataclass(frozen=True)
class AppendOutcome:
    events: list[Event]
    replayed: bool


@dataclass(frozen=True)
class TaskCreateOutcome:
    task: Task
    created: bool


@dataclass(frozen=True)
class AgentCreated:
    agent: Agent
    token: str


# --- tasks ---------------------------------------------------------------------------------


def task_create(
    *,
    namespace: str,
    kind: str,
    input: dict[str, Any],
    agent: str | None = None,
    task_id: uuid.UUID | None = None,
    parent_task_id: uuid.UUID | None = None,
    max_attempts: int | None = None,
    metadata: dict[str, Any] | None = None,
) -> TaskCreateOutcome:
    """Create a task with ``TaskStarted`` as event 1. Idempotent on ``task_id``."""
    ensure_storable_json(input, "input")
    ensure_storable_json(metadata or {}, "metadata")
    with transaction.atomic(durable=True):
        return task_create_in_transaction(
            namespace=namespace,
            kind=kind,
            input=input,
            agent=agent,
            task_id=task_id or uuid.uuid4(),
            parent_task_id=parent_task_id,
            max_attempts=max_attempts if max_attempts is not None else settings.BACKPLANE_MAX_ATTEMPTS,
            metadata=metadata or {},
        )


def task_create_in_transaction(
    *,
    namespace: str,
    kind: str,
    input: dict[str, Any],
    agent: str | None,
    task_id: uuid.UUID,
    parent_task_id: uuid.UUID | None,
    max_attempts: int,
    metadata: dict[str, Any],
) -> TaskCreateOutcome:
    parent = None
    if parent_task_id is not None:
        parent = Task.objects.filter(pk=parent_task_id, namespace=namespace).first()
        if parent is None:
            raise InvalidInput("parent task not found", {"parent_task_id": "no such task in this namespace"})

    now = timezone.now()
    try:
        # The savepoint keeps the outer transaction usable when a concurrent create of
        # the same task_id wins the race and our INSERT hits the primary key.
        with transaction.atomic():
            task = Task.objects.create(
                id=task_id,
                namespace=namespace,
                kind=kind,
                input=input,
                metadata=metadata,
                parent=parent,
                max_attempts=max_attempts,
                created_by=agent,
                created_at=now,
                updated_at=now,
            )
    except IntegrityError:
        existing = Task.objects.filter(pk=task_id).first()
        if existing is None:  # pragma: no cover - the conflicting row must exist once we see the error
            raise
        if existing.namespace != namespace or existing.kind != kind or existing.input != input:
            raise TaskExists(
                "a task with this task_id exists with a different kind or input",
                {"task_id": str(task_id)},
            ) from None
        return TaskCreateOutcome(task=existing, created=False)

    write_events(
        task,
        [
            EventDraft(
                type=et.TASK_STARTED,
                payload={
                    "kind": kind,
                    "input": input,
                    "parent_task_id": str(parent.pk) if parent else None,
                    "max_attempts": max_attempts,
                    "metadata": metadata,
                },
            )
        ],
        agent=agent,
        now=now,
    )
    enqueue_lifecycle(task=task, previous_status=None, seq=task.last_seq, event_hash=task.head_hash, now=now)
    return TaskCreateOutcome(task=task, created=True)


# --- appends -------------------------------------------------------------------------------


def event_append(
    *,
    namespace: str | None,
    task_id: uuid.UUID,
    draft: EventDraft,
    agent: str | None,
    expected_seq: int | None = None,
    lease_epoch: int | None = None,
) -> AppendOutcome:
    """Append one client event to a task's log."""
    return event_append_batch(
        namespace=namespace,
        task_id=task_id,
        drafts=[draft],
        agent=agent,
        expected_seq=expected_seq,
        lease_epoch=lease_epoch,
    )


def event_append_batch(
    *,
    namespace: str | None,
    task_id: uuid.UUID,
    drafts: Sequence[EventDraft],
    agent: str | None,
    expected_seq: int | None = None,
    lease_epoch: int | None = None,
) -> AppendOutcome:
    """Append client events to one task, all or nothing."""
    if not drafts:
        raise InvalidInput("events must not be empty", {"events": "at least one event is required"})
    if len(drafts) > settings.BACKPLANE_BATCH_MAX_EVENTS:
        raise InvalidInput(
            "too many events in one batch",
            {"events": f"at most {settings.BACKPLANE_BATCH_MAX_EVENTS} events per batch"},
        )
    digests = _validate_client_drafts(drafts)
    with transaction.atomic(durable=True):
        task = lock_task(namespace=namespace, task_id=task_id)
        check_lease(task, lease_epoch)
        replay = _find_replay(task, drafts, digests)
        if replay is not None:
            return AppendOutcome(events=replay, replayed=True)
        if task.is_closed:
            raise TaskClosed(f"task is {task.status}", {"status": task.status})
        if expected_seq is not None and expected_seq != task.last_seq:
            raise SeqConflict(
                f"expected_seq {expected_seq} but the task is at {task.last_seq}",
                {"last_seq": task.last_seq, "expected_seq": expected_seq},
            )
        events = write_events(task, drafts, agent=agent, now=timezone.now(), digests=digests)
    return AppendOutcome(events=events, replayed=False)


def _validate_client_drafts(drafts: Sequence[EventDraft]) -> list[str | None]:
    """Check every draft before any lock is taken; return each keyed draft's request digest."""
    digests: list[str | None] = []
    seen_keys: set[str] = set()
    for index, draft in enumerate(drafts):
        prefix = f"events[{index}]." if len(drafts) > 1 else ""
        try:
            et.validate_client_event(draft.type, draft.payload)
            # Only a keyed draft needs its digest; an unkeyed one is canonicalised here all
            # the same, so a payload JSON cannot hash is refused before any lock is taken.
            digest = draft.request_digest() if draft.idempotency_key is not None else None
            if digest is None:
                canonical_json(draft.payload)
            _reject_nul(draft.payload, "payload")
            for item in draft.outbox:
                _reject_nul(item.payload, "outbox")
        except InvalidInput as exc:
            raise InvalidInput(exc.message, {prefix + k: v for k, v in exc.details.items()}) from None
        except CanonicalizationError as exc:
            raise InvalidInput(
                "payload cannot be represented as canonical JSON",
                {prefix + "payload": str(exc)},
            ) from None
        key = draft.idempotency_key
        if key is not None:
            if key in seen_keys:
                raise InvalidInput(
                    "an idempotency_key appears twice in one batch",
                    {prefix + "idempotency_key": "duplicate within the batch"},
                )
            seen_keys.add(key)
        digests.append(digest)
    return digests


# The append path is the product's hot loop. Measured on the 2-core machine, building
# these three statements through the queryset API cost about 1.5 ms of Python each, three
# times the database's own work, so they are written as SQL (docs/benchmarks.md).
_TASK_ROWS = RowLoader(Task)
_LOCK_TASK_SQL = f"SELECT {_TASK_ROWS.columns} FROM backplane_task WHERE id = %s FOR UPDATE"
_LOCK_TASK_IN_NAMESPACE_SQL = (
    f"SELECT {_TASK_ROWS.columns} FROM backplane_task WHERE id = %s AND namespace = %s FOR UPDATE"
)


def lock_task(*, namespace: str | None, task_id: uuid.UUID) -> Task:
    """Lock a task row for the rest of the transaction. ``namespace=None``: staff, any namespace."""
    if namespace is None:
        task = _TASK_ROWS.fetch_one(_LOCK_TASK_SQL, [task_id])
    else:
        task = _TASK_ROWS.fetch_one(_LOCK_TASK_IN_NAMESPACE_SQL, [task_id, namespace])
    if task is None:
        raise NotFound("task not found", {"task_id": str(task_id)})
    return task


def check_lease(task: Task, lease_epoch: int | None) -> None:
    """Fencing: a leased task takes writes only with its current epoch.

    Without a lease anyone in the namespace may write, but an epoch that is sent must
    still be current: its holder may not know yet that its lease expired or was released.
    """
    if task.is_leased and lease_epoch is None:
        raise StaleLease(
            "the task is leased; send lease_epoch",
            {"lease_epoch": "required while the task is leased"},
        )
    if lease_epoch is not None and lease_epoch != task.lease_epoch:
        raise StaleLease(
            "lease epoch is not the task's current one",
            {"lease_epoch": lease_epoch},
        )


def _find_replay(task: Task, drafts: Sequence[EventDraft], digests: list[str | None]) -> list[Event] | None:
    """The original events when this request was already applied; None when it is new."""
    keys = [d.idempotency_key for d in drafts if d.idempotency_key is not None]
    if not keys:
        return None
    found = {e.idempotency_key: e for e in Event.objects.filter(task=task, idempotency_key__in=keys)}
    if not found:
        return None
    for draft, digest in zip(drafts, digests, strict=True):
        original = found.get(draft.idempotency_key) if draft.idempotency_key else None
        if original is None:
            raise IdempotencyMismatch(
                "this batch mixes events already recorded with new ones",
                {"idempotency_key": draft.idempotency_key},
            )
        if original.request_digest != digest:
            raise IdempotencyMismatch(
                "idempotency_key was used with a different body",
                {"idempotency_key": draft.idempotency_key, "seq": original.seq},
            )
    return [found[d.idempotency_key] for d in drafts if d.idempotency_key]


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
    was_open = not task.is_closed
    previous_status = task.status
    events: list[Event] = []
    for index, draft in enumerate(drafts):
        if task.is_closed and not allow_closed:
            raise TaskClosed(f"task is {task.status}", {"status": task.status})
        events.append(_number_event(task, draft, agent=agent, now=now, digest=digests[index] if digests else None))
    task.last_event_at = now
    task.updated_at = now
    _insert_events_and_update_projections([task], [events])
    # The events' own messages, then the lifecycle announcement: one INSERT for the whole write.
    messages = [
        Message(
            topic=item.topic,
            key=item.key or str(task.pk),
            payload=item.payload,
            headers=outbox_headers(task, event, now),
            task_id=str(task.pk),
            event_position=event.position,
        )
        for draft, event in zip(drafts, events, strict=True)
        for item in draft.outbox
    ]
    lifecycle = lifecycle_message(
        task=task, previous_status=previous_status, seq=task.last_seq, event_hash=task.head_hash, now=now
    )
    outbox_enqueue_many(messages if lifecycle is None else [*messages, lifecycle], now=now)
    _follow_up(task, events, previous_status=previous_status, was_open=was_open, now=now)
    return events


def _follow_up(task: Task, events: list[Event], *, previous_status: str, was_open: bool, now: datetime) -> None:
    """What events cause beyond the task itself, once they are in: breakers, sagas, the parent.
    These may lock more rows (the agent behind a completion or failure, a sub-task's parent)."""
    _feed_breakers(task, events, now=now)
    if previous_status != TaskStatus.FAILED and task.status == TaskStatus.FAILED:
        _start_saga(task, now=now)
    if was_open and task.status in REPORTED_TO_PARENT and task.parent_id is not None:
        _report_to_parent(task, now=now)


def _start_saga(task: Task, *, now: datetime) -> None:
    # Imported here: sagas live with recovery, which builds on this module.
    from recovery.sagas import saga_start_if_due

    saga_start_if_due(task, now=now)


def _feed_breakers(task: Task, events: list[Event], *, now: datetime) -> None:
    """Completions and failures count towards the circuit breaker of the agent behind them.

    Expired leases count too, but the stall detector records those itself, once per agent
    per sweep and in id order, so concurrent sweeps cannot deadlock on agent rows."""
    for event in events:
        if event.type == et.TASK_COMPLETED:
            breaker_record_success(namespace=task.namespace, agent_name=event.agent, task_id=task.pk, now=now)
        elif event.type == et.TASK_FAILED:
            breaker_record_failure(namespace=task.namespace, agent_name=event.agent, task_id=task.pk, now=now,
                                   reason=f"TaskFailed: {event.payload['error'][:200]}")


# A child task in one of these has a result its parent must hear about.
REPORTED_TO_PARENT = frozenset({TaskStatus.COMPLETED, TaskStatus.FAILED, TaskStatus.DEAD_LETTERED})


def _report_to_parent(child: Task, *, now: datetime) -> None:
    """Two-phase hand-off, second phase: the child's result enters the parent's log in the
    transaction that ends the child, so it cannot be lost between the two.

    Lock order is always child, then parent (claims and completions); a dispatch locks
    only the parent and creates the child, which nobody else can hold yet.
    """
    assert child.parent_id is not None
    parent = Task.objects.select_for_update().get(pk=child.parent_id)
    write_events(
        parent,
        [
            EventDraft(
                type=et.SUB_AGENT_RESULT_RECEIVED,
                payload={
                    "child_task_id": str(child.pk),
                    "dispatch_key": child.dispatch_key,
                    "kind": child.kind,
                    "status": child.status,
                    "output": child.output,
                    "error": child.error,
                },
                causation_id=f"{child.pk}:{child.last_seq}",
            )
        ],
        agent=None,
        now=now,
        # A parent that already finished still gets the record: nothing is dropped.
        allow_closed=True,
    )


def outbox_headers(task: Task, event: Event, now: datetime) -> dict[str, Any]:
    headers: dict[str, Any] = {
        "task_id": str(task.pk),
        "seq": event.seq,
        "event_hash": event.hash,
        "agent": event.agent,
        "created_at": format_timestamp(now),
    }
    if event.trace_id and len(event.trace_id) == 32:
        # W3C trace context; the parent span is not known here, so a fresh one is minted.
        headers["traceparent"] = f"00-{event.trace_id}-{secrets.token_hex(8)}-01"
    return headers


def _release_lease(task: Task) -> None:
    # The epoch stays: it is the fencing token the next lease increments.
    task.lease_holder = None
    task.lease_expires_at = None


def _apply_to_projection(task: Task, event: Event) -> None:
    """What an event does to the task's status and results."""
    if event.type == et.TASK_STALLED:
        # Fencing: the next lease gets a new epoch anyway, but bumping it now makes the old
        # holder's writes fail at once instead of landing on an unleased task.
        task.lease_epoch += 1
        task.attempts += 1
        task.status = TaskStatus.PENDING
        _release_lease(task)
    elif event.type == et.TASK_DEAD_LETTERED:
        task.status = TaskStatus.DEAD_LETTERED
        _release_lease(task)
    elif event.type == et.TASK_COMPLETED:
        task.status = TaskStatus.COMPLETED
        task.output = event.payload["output"]
        task.error = None
        _release_lease(task)
    elif event.type == et.TASK_FAILED:
        task.attempts += 1
        task.error = event.payload["error"]
        retry = event.payload["retryable"] and task.attempts < task.max_attempts
        task.status = TaskStatus.PENDING if retry else TaskStatus.FAILED
        _release_lease(task)


def ensure_storable_json(value: Any, name: str) -> None:
    """Refuse JSON we could neither hash canonically nor store in JSONB, as bad input."""
    try:
        canonical_sha256(value)
    except CanonicalizationError as exc:
        raise InvalidInput(f"{name} cannot be represented as canonical JSON", {name: str(exc)}) from None
    _reject_nul(value, name)


def _reject_nul(value: Any, name: str) -> None:
    """PostgreSQL's JSONB cannot store U+0000; refuse it as bad input rather than fail at INSERT."""
    if isinstance(value, str):
        if "\x00" in value:
            raise InvalidInput(f"{name} contains U+0000, which cannot be stored", {name: "contains U+0000"})
    elif isinstance(value, dict):
        for key, item in value.items():
            _reject_nul(key, name)
            _reject_nul(item, name)
    elif isinstance(value, list):
        for item in value:
            _reject_nul(item, name)


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
    previous_status: list[str] = []
    was_open: list[bool] = []
    written: list[list[Event]] = []
    for write in writes:
        task = write.task
        if any(draft.outbox for draft in write.drafts):
            raise ValueError("write_events_many does not enqueue draft outbox messages; use write_events")
        previous_status.append(task.status)
        was_open.append(not task.is_closed)
        events: list[Event] = []
        for draft in write.drafts:
            if task.is_closed:
                raise TaskClosed(f"task is {task.status}", {"status": task.status})
            events.append(_number_event(task, draft, agent=agent, now=now))
        task.last_event_at = now
        task.updated_at = now
        written.append(events)
    _insert_events_and_update_projections([write.task for write in writes], written)
    enqueue_lifecycle_many(changes=[(write.task, before) for write, before in zip(writes, previous_status,
                                                                                   strict=True)], now=now)
    # Then, per task in the order given, what write_events does after its insert.
    for write, events, before, opened in zip(writes, written, previous_status, was_open, strict=True):
        _follow_up(write.task, events, previous_status=before, was_open=opened, now=now)
    return written


def _number_event(
    task: Task, draft: EventDraft, *, agent: str | None, now: datetime, digest: str | None = None
) -> Event:
    """Place, clock and hash one event on ``task`` and apply it to the in-memory projection."""
    seq = task.last_seq + 1
    lamport = max(task.lamport, draft.lamport or 0) + 1
    event = Event(
        task=task,
        seq=seq,
        type=draft.type,
        payload=draft.payload,
        agent=agent,
        idempotency_key=draft.idempotency_key,
        request_digest=digest,
        lamport=lamport,
        causation_id=draft.causation_id,
        correlation_id=draft.correlation_id,
        trace_id=draft.trace_id,
        recorded_at=now,
        prev_hash=task.head_hash,
    )
    event.hash = compute_hash(event_hashed_fields(event))
    task.last_seq = seq
    task.lamport = lamport
    task.head_hash = event.hash
    _apply_to_projection(task, event)
    return event


# Every write of events (one client event, a client batch, a sweep over many tasks) is this
# one round trip: the events and the projections go in as two JSON arrays of records. Other
# spellings cost more Python than the database's work: through the queryset API ~1.5 ms a
# statement; a VALUES list 16 ms of query splitting per 100 events; unnest() arrays ~20 ms per
# 100 rows, since the client-side binding quotes each element, while a JSON text is quoted once.
_INSERT_EVENTS_OF_TASKS_SQL = """
WITH inserted AS (
    INSERT INTO backplane_event (task_id, seq, type, payload, agent, idempotency_key, request_digest, lamport,
                                 causation_id, correlation_id, trace_id, recorded_at, prev_hash, hash)
    SELECT e.task_id, e.seq, e.type, e.payload, e.agent, e.idempotency_key, e.request_digest, e.lamport,
           e.causation_id, e.correlation_id, e.trace_id, e.recorded_at, e.prev_hash, e.hash
    FROM jsonb_to_recordset(%s::jsonb) AS e(task_id uuid, seq int, type text, payload jsonb, agent text,
                                            idempotency_key text, request_digest text, lamport bigint,
                                            causation_id text, correlation_id text, trace_id text,
                                            recorded_at timestamptz, prev_hash text, hash text)
    RETURNING task_id, seq, position
),
projection AS (
    UPDATE backplane_task AS t
    SET last_seq = p.last_seq, lamport = p.lamport, head_hash = p.head_hash, last_event_at = p.last_event_at,
        updated_at = p.updated_at, status = p.status, output = p.output, error = p.error, attempts = p.attempts,
        lease_holder = p.lease_holder, lease_expires_at = p.lease_expires_at, lease_epoch = p.lease_epoch
    FROM jsonb_to_recordset(%s::jsonb) AS p(id uuid, last_seq int, lamport bigint, head_hash text,
                                            last_event_at timestamptz, updated_at timestamptz, status text,
                                            output jsonb, error text, attempts int, lease_holder text,
                                            lease_expires_at timestamptz, lease_epoch bigint)
    WHERE t.id = p.id
)
SELECT task_id, seq, position FROM inserted
"""


def _as_json_value(value: Any) -> Any:
    """UUIDs and times for a JSON record; timestamptz reads the ISO form back to the microsecond."""
    if isinstance(value, datetime):
        return value.isoformat()
    return str(value)


def _insert_events_and_update_projections(tasks: list[Task], events_of: list[list[Event]]) -> None:
    if not tasks:
        return
    events = [event for events in events_of for event in events]
    event_rows = [
        {
            "task_id": e.task_id, "seq": e.seq, "type": e.type, "payload": e.payload, "agent": e.agent,
            "idempotency_key": e.idempotency_key, "request_digest": e.request_digest, "lamport": e.lamport,
            "causation_id": e.causation_id,
            "correlation_id": e.correlation_id, "trace_id": e.trace_id, "recorded_at": e.recorded_at,
            "prev_hash": e.prev_hash, "hash": e.hash,
        }
        for e in events
    ]
    # Tasks without events still get their projection written, as write_events does.
    projection_rows = [
        {
            "id": t.pk, "last_seq": t.last_seq, "lamport": t.lamport, "head_hash": t.head_hash,
            "last_event_at": t.last_event_at, "updated_at": t.updated_at, "status": t.status, "output": t.output,
            "error": t.error, "attempts": t.attempts, "lease_holder": t.lease_holder,
            "lease_expires_at": t.lease_expires_at, "lease_epoch": t.lease_epoch,
        }
        for t in tasks
    ]
    params = [json.dumps(event_rows, default=_as_json_value), json.dumps(projection_rows, default=_as_json_value)]
    with connection.cursor() as cursor:
        cursor.execute(_INSERT_EVENTS_OF_TASKS_SQL, params)
        positions = {(task_id, seq): position for task_id, seq, position in cursor.fetchall()}
    for event in events:
        event.position = positions[(event.task_id, event.seq)]
        event._state.adding = False
        event._state.db = "default"


# --- agents --------------------------------------------------------------------------------


def agent_token_issue() -> tuple[str, str]:
    """A new random agent token and the hash that is all we keep of it."""
    token = "bp_" + secrets.token_urlsafe(32)
    return token, hash_token(token)


def agent_create(*, name: str, namespace: str, kinds: Sequence[str] = ()) -> AgentCreated:
    """Register an agent and return its token; only the token's hash is stored."""
    token, token_hash = agent_token_issue()
    with transaction.atomic(durable=True):
        if Agent.objects.filter(namespace=namespace, name=name).exists():
            raise InvalidInput("an agent with this name exists in the namespace", {"name": name})
        agent = Agent(name=name, namespace=namespace, kinds=list(kinds), token_hash=token_hash)
        try:
            agent.full_clean()
        except ValidationError as exc:
            raise InvalidInput("invalid agent", {k: " ".join(v) for k, v in exc.message_dict.items()}) from None
        agent.save()
    return AgentCreated(agent=agent, token=token)


def agent_rotate_token(*, agent_id: int) -> AgentCreated:
    """Issue a new token for an agent; the old one stops working at commit."""
    token, token_hash = agent_token_issue()
    with transaction.atomic(durable=True):
        agent = Agent.objects.select_for_update().get(pk=agent_id)
        agent.token_hash = token_hash
        agent.save(update_fields=["token_hash"])
    return AgentCreated(agent=agent, token=token)
