"""The one reducer: what an event does to its task's projection.

``task_reduce(state, event) -> state`` is a pure function, and the only code that decides a
task's status, attempts, lease, output and error. The writer applies it to every event it
appends (in the same transaction as the insert), ``rebuild_projections`` and the periodic
integrity run replay whole logs through it, so the row is always what the log makes of it.

One input is not an event: a heartbeat extends the live lease's deadline without writing to
the log (``lease_extended``). Heartbeats are liveness, not history: an agent sends one every
few seconds, and an event each would bury the decisions in the log (Temporal keeps activity
heartbeats out of its event history for the same reason). So a replay gives the deadline the
claim set, and a row may hold a later one for the same live lease, never an earlier one; see
``projection_differences``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Protocol

from backplane.eventlog import event_types as et
from backplane.eventlog.chain import GENESIS_HASH

PENDING, RUNNING, COMPLETED, FAILED = "pending", "running", "completed", "failed"
DEAD_LETTERED, COMPENSATING, COMPENSATED = "dead_lettered", "compensating", "compensated"
CANCELLED = "cancelled"
# A task in one of these has finished (models.CLOSED_STATUSES, as the reducer spells them).
FINISHED = frozenset({COMPLETED, FAILED, DEAD_LETTERED, COMPENSATED, CANCELLED})


class EventFacts(Protocol):
    """What the reducer reads of an event: an ``Event`` row, or a row streamed from SQL."""

    @property
    def seq(self) -> int: ...
    @property
    def type(self) -> str: ...
    @property
    def payload(self) -> Mapping[str, Any]: ...
    @property
    def lamport(self) -> int: ...
    @property
    def recorded_at(self) -> datetime: ...
    @property
    def hash(self) -> str: ...


@dataclass(frozen=True, slots=True)
class TaskState:
    """The reducer's part of a task row; the defaults are a task before its first event."""

    status: str = PENDING
    attempts: int = 0
    max_attempts: int = 3
    lease_holder: str | None = None
    lease_epoch: int = 0
    lease_expires_at: datetime | None = None
    lease_seconds: int = 30
    output: Any = None
    error: str | None = None
    last_seq: int = 0
    head_hash: str = GENESIS_HASH
    lamport: int = 0
    last_event_at: datetime | None = None
    # ``last_event_at`` of a finished task, None while it runs: what retention orders finished
    # tasks by. A column of its own so that the retention indexes never change while a task
    # works: an append then updates no indexed column, and PostgreSQL can make it a HOT update
    # (no new entry in any of the task table's indexes).
    finished_last_event_at: datetime | None = None


# The task row's columns the reducer owns, in one place for the writer's UPDATE and the checks.
REDUCED_FIELDS: tuple[str, ...] = tuple(field.name for field in dataclasses.fields(TaskState))


def task_state_of(task: Any) -> TaskState:
    """The reducer's fields of a task row (or anything with those attributes)."""
    return TaskState(*(getattr(task, name) for name in REDUCED_FIELDS))


def task_state_apply(task: Any, state: TaskState) -> None:
    """Copy a state onto a task row in memory; the writer persists it with the events."""
    for name in REDUCED_FIELDS:
        setattr(task, name, getattr(state, name))


def _without_lease(state: TaskState, **changes: Any) -> TaskState:
    # The epoch stays: it is the fencing token the next lease increments.
    return dataclasses.replace(state, lease_holder=None, lease_expires_at=None, **changes)


def _claimed(state: TaskState, event: EventFacts) -> TaskState:
    payload = event.payload
    expires_at = datetime.fromisoformat(payload["expires_at"])
    lease_seconds = payload.get("lease_seconds")
    if lease_seconds is None:
        # Claims recorded before lease_seconds was in the payload: the claim computed its
        # expiry as its own recorded_at plus the lease, so the difference is exact.
        lease_seconds = round((expires_at - event.recorded_at).total_seconds())
    return dataclasses.replace(
        state,
        status=RUNNING,
        lease_holder=payload["agent"],
        lease_epoch=payload["lease_epoch"],
        lease_expires_at=expires_at,
        lease_seconds=lease_seconds,
    )


def _failed(state: TaskState, event: EventFacts) -> TaskState:
    attempts = state.attempts + 1
    retry = bool(event.payload["retryable"]) and attempts < state.max_attempts
    return _without_lease(state, attempts=attempts, error=event.payload["error"], status=PENDING if retry else FAILED)


def _dead_letter_requeued(state: TaskState, event: EventFacts) -> TaskState:
    # Only the task's own dead letter sends the task back to work, with fresh attempts; a
    # requeued outbox message or compensation is recorded in the log and changes nothing here.
    if event.payload.get("source") != "task":
        return state
    return _without_lease(state, status=PENDING, attempts=0)


def _dead_letter_discarded(state: TaskState, event: EventFacts) -> TaskState:
    # A discarded task stays dead-lettered, unless the reviewer asked for its side effects to
    # be undone: then it fails for good, which starts its saga.
    if event.payload.get("source") == "task" and event.payload.get("compensate"):
        return _without_lease(state, status=FAILED)
    return state


def _transition(state: TaskState, event: EventFacts) -> TaskState:
    kind = event.type
    if kind == et.TASK_STARTED:
        return _without_lease(
            state, status=PENDING, attempts=0, max_attempts=event.payload.get("max_attempts", state.max_attempts)
        )
    if kind == et.TASK_CLAIMED:
        return _claimed(state, event)
    if kind == et.LEASE_RELEASED:
        return _without_lease(state, status=PENDING)
    if kind == et.TASK_STALLED:
        # Fencing: the next lease gets a new epoch anyway, but bumping it now makes the old
        # holder's writes fail at once instead of landing on an unleased task.
        return _without_lease(state, status=PENDING, attempts=state.attempts + 1, lease_epoch=state.lease_epoch + 1)
    if kind == et.TASK_DEAD_LETTERED:
        return _without_lease(state, status=DEAD_LETTERED)
    if kind == et.TASK_COMPLETED:
        return _without_lease(state, status=COMPLETED, output=event.payload["output"], error=None)
    if kind == et.TASK_FAILED:
        return _failed(state, event)
    if kind == et.DEAD_LETTER_REQUEUED:
        return _dead_letter_requeued(state, event)
    if kind == et.DEAD_LETTER_DISCARDED:
        return _dead_letter_discarded(state, event)
    if kind == et.COMPENSATION_STARTED:
        return dataclasses.replace(state, status=COMPENSATING)
    if kind == et.TASK_COMPENSATED:
        return dataclasses.replace(state, status=COMPENSATED)
    if kind == et.PROJECTION_RECONCILED:
        return _reconciled(state, event)
    if kind == et.TASK_CANCELLED:
        return _without_lease(state, status=CANCELLED)
    if kind == et.TASK_RETRIED:
        return _without_lease(state, status=PENDING, attempts=0, error=None)
    return state


# What a reconciliation may set: the chain fields always come from the event itself.
RECONCILABLE_FIELDS = frozenset(REDUCED_FIELDS) - {
    "last_seq", "head_hash", "lamport", "last_event_at", "finished_last_event_at"}


def _reconciled(state: TaskState, event: EventFacts) -> TaskState:
    fields = {name: value for name, value in event.payload["fields"].items() if name in RECONCILABLE_FIELDS}
    if fields.get("lease_expires_at") is not None:  # the one time among them, stored as ISO 8601
        fields["lease_expires_at"] = datetime.fromisoformat(fields["lease_expires_at"])
    return dataclasses.replace(state, **fields)


# Event types that change more than the chain fields; every other type only advances the head.
TRANSITION_TYPES = frozenset(
    {
        et.TASK_STARTED,
        et.TASK_CLAIMED,
        et.LEASE_RELEASED,
        et.TASK_STALLED,
        et.TASK_DEAD_LETTERED,
        et.TASK_COMPLETED,
        et.TASK_FAILED,
        et.DEAD_LETTER_REQUEUED,
        et.DEAD_LETTER_DISCARDED,
        et.COMPENSATION_STARTED,
        et.TASK_COMPENSATED,
        et.PROJECTION_RECONCILED,
        et.TASK_CANCELLED,
        et.TASK_RETRIED,
    }
)


def task_reduce(state: TaskState, event: EventFacts) -> TaskState:
    """The projection after ``event``: its transition, then the head moved onto it."""
    if event.type in TRANSITION_TYPES:
        state = _transition(state, event)
    return dataclasses.replace(
        state, last_seq=event.seq, head_hash=event.hash, lamport=event.lamport, last_event_at=event.recorded_at,
        finished_last_event_at=event.recorded_at if state.status in FINISHED else None,
    )


def task_replay(events: Iterable[EventFacts], state: TaskState | None = None) -> TaskState:
    """Fold a log (in seq order) through the reducer, from scratch or from a checkpoint."""
    state = state or TaskState()
    for event in events:
        state = task_reduce(state, event)
    return state


def lease_extended(state: TaskState, *, now: datetime) -> TaskState:
    """A heartbeat: the live lease runs for another ``lease_seconds`` from ``now``."""
    return dataclasses.replace(state, lease_expires_at=now + timedelta(seconds=state.lease_seconds))


def projection_differences(row: TaskState, replayed: TaskState) -> dict[str, tuple[Any, Any]]:
    """``{field: (row value, replayed value)}`` for every field where the row is not what its
    log makes of it. A later lease deadline for the same live lease is no difference: that is
    what heartbeats do (see the module's docstring)."""
    differences = {}
    for name in REDUCED_FIELDS:
        in_row, in_log = getattr(row, name), getattr(replayed, name)
        if in_row == in_log:
            continue
        if name == "lease_expires_at" and _extended_by_heartbeats(row, replayed):
            continue
        differences[name] = (in_row, in_log)
    return differences


def _extended_by_heartbeats(row: TaskState, replayed: TaskState) -> bool:
    return (
        replayed.lease_holder is not None
        and row.lease_holder == replayed.lease_holder
        and row.lease_epoch == replayed.lease_epoch
        and row.lease_expires_at is not None
        and replayed.lease_expires_at is not None
        and row.lease_expires_at > replayed.lease_expires_at
    )


_TIMES = ("lease_expires_at", "last_event_at", "finished_last_event_at")


def task_state_as_json(state: TaskState) -> dict[str, Any]:
    """A state as JSON (a checkpoint the integrity run keeps with a verified head)."""
    data = dataclasses.asdict(state)
    for name in _TIMES:
        if data[name] is not None:
            data[name] = data[name].isoformat()
    return data


def task_state_from_json(data: Mapping[str, Any]) -> TaskState:
    values = dict(data)
    for name in _TIMES:
        if values.get(name) is not None:
            values[name] = datetime.fromisoformat(values[name])
    if "finished_last_event_at" not in values:  # a checkpoint kept before the field existed
        values["finished_last_event_at"] = values.get("last_event_at") if values.get("status") in FINISHED else None
    return TaskState(**{name: values[name] for name in REDUCED_FIELDS if name in values})
