"""Reads of the event log."""

from __future__ import annotations

import base64
import binascii
import dataclasses
import json
import uuid
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, NamedTuple

import psycopg
from django.db import connection
from django.db.models import Q, QuerySet
from django.db.models.expressions import RawSQL
from psycopg.postgres import types as psycopg_types

from backplane.eventlog import event_types as et
from backplane.eventlog.chain import GENESIS_HASH, api_time_sql
from backplane.eventlog.errors import InvalidInput, NotFound
from backplane.eventlog.models import Event, Task, TaskStatus
from backplane.eventlog.reducer import TRANSITION_TYPES, TaskState, task_reduce
from backplane.runtime.replica import reads_connection

# A task's log for chain_verify_range: the columns the hash covers, in seq order (an index
# range scan on (task, seq)).
_VERIFY_SQL = """
SELECT seq, type, payload, agent, idempotency_key, lamport, causation_id, correlation_id, trace_id,
       recorded_at, prev_hash, hash
FROM backplane_event
WHERE task_id = %s AND seq > %s AND seq <= %s
ORDER BY seq
"""
# The range is streamed ``chunk_size`` rows at a time: memory stays bounded and rows are
# hashed as they arrive. Chunks need libpq 17; with an older one, row by row.
STREAMS_IN_CHUNKS = psycopg.pq.version() >= 170000


def use_c_timestamp_loader(cursor: Any) -> None:
    """Let this cursor load timestamptz with psycopg's C loader instead of Django's, for
    loops that hash many events and for lists that show many times.

    Django's loader is a Python subclass that re-attaches the connection's time zone to every
    value: about 5 microseconds an event, as much as the rest of the fetch. The hash rule
    converts each time to UTC itself (``format_timestamp``), so the aware datetime the C loader
    gives (in the session's time zone) hashes the same; it is the same instant, and templates
    convert it to the viewer's zone as they convert any other.
    """
    raw = getattr(cursor, "cursor", cursor)  # Django's wrapper around the psycopg cursor
    adapters = getattr(raw, "adapters", None)
    if adapters is None:  # not psycopg 3
        return
    oid = psycopg_types["timestamptz"].oid
    adapters.register_loader(oid, psycopg.adapters.get_loader(oid, psycopg.pq.Format.TEXT))


class StreamedEvent(NamedTuple):
    """What the reducer reads of an event (``reducer.EventFacts``), from a row streamed by SQL."""

    seq: int
    type: str
    payload: Mapping[str, Any]
    lamport: int
    recorded_at: datetime
    hash: str


@dataclass(frozen=True)
class ChainVerification:
    task_id: uuid.UUID
    valid: bool
    checked: int
    head_hash: str
    first_invalid_seq: int | None
    problem: str | None = None
    # The projection folded on top of ``replay_from`` through the checked events; only for a
    # valid chain that was asked to replay (a broken one has no trustworthy projection).
    state: TaskState | None = None


def chain_verify(
    *,
    task: Task,
    replay_from: TaskState | None = None,
    chunk_size: int = 5000,
    row_hash: Callable[[Sequence[Any]], str],
) -> ChainVerification:
    """Recompute every hash of a task's log and check the links and the numbering, up to the
    head the task row records.

    ``head_hash`` is the hash the log's last event carries; ``first_invalid_seq`` is the
    first place where the log stops being the chain it claims to be. With ``replay_from``
    (``TaskState()`` for a replay from scratch) the log is also folded through the reducer.
    """
    return chain_verify_range(
        task_id=task.pk,
        after_seq=0,
        after_hash=GENESIS_HASH,
        through_seq=task.last_seq,
        through_hash=task.head_hash,
        replay_from=replay_from,
        chunk_size=chunk_size,
        row_hash=row_hash,
    )


def chain_verify_range(
    *,
    task_id: uuid.UUID,
    after_seq: int,
    after_hash: str,
    through_seq: int,
    through_hash: str,
    replay_from: TaskState | None = None,
    chunk_size: int = 5000,
    row_hash: Callable[[Sequence[Any]], str],
) -> ChainVerification:
    """Check the events ``after_seq + 1 .. through_seq`` of a task, continuing from a verified
    ``(after_seq, after_hash)``: numbering, links and recomputed hashes, as ``chain_verify`` does.

    ``through_seq`` and ``through_hash`` are the task's ``last_seq`` and ``head_hash`` read
    together from its row. Every event up to there committed with that row, so the bound
    makes an append racing this check invisible rather than a log longer than the task says.

    ``replay_from``, the projection as of ``after_seq`` (a checkpoint), makes the same pass
    fold the checked events through the reducer; ``state`` is the result when the chain holds.

    ``row_hash`` recomputes an event's hash from its stored columns (``chain.HASHED_COLUMNS``,
    in order, the payload as JSON text). It has no default: every check passes the independent
    implementation (``backplane.integrity.verification.chain_check``), so that a bug in the
    writer's hashing is not shared by the code that checks it.
    """
    task_key = str(task_id)
    expected_seq = after_seq + 1
    prev_hash = after_hash
    checked = 0
    state = replay_from
    transitions = TRANSITION_TYPES

    def broken(seq: int, problem: str) -> ChainVerification:
        return ChainVerification(task_id, False, checked, prev_hash, seq, problem)

    found: ChainVerification | None = None
    # Plain SQL, streamed, rather than the queryset API: at a few microseconds of hashing an
    # event, the ORM's per-row work and the server-side cursor's round trips cost as much as
    # the hashing. The payload arrives as JSON text, as JSONField receives it, and is decoded
    # the same way. After a break the rest of the stream is drained, not cancelled: a
    # cancelled statement would abort the caller's transaction.
    with connection.cursor() as cursor, connection.wrap_database_errors:
        use_c_timestamp_loader(cursor)
        rows = cursor.cursor.stream(
            _VERIFY_SQL, [task_id, after_seq, through_seq], size=chunk_size if STREAMS_IN_CHUNKS else 1
        )
        for seq, type_, payload, agent, key, lamport, causation, correlation, trace, recorded, link, stored in rows:
            if found is not None:
                continue
            if seq != expected_seq:
                found = broken(expected_seq, f"seq {expected_seq} is missing (next stored is {seq})")
                continue
            if link != prev_hash:
                found = broken(seq, "prev_hash does not match the previous event's hash")
                continue
            if row_hash(
                (task_key, seq, type_, payload, agent, key, lamport, causation, correlation, trace, recorded, link)
            ) != stored:
                found = broken(seq, "hash does not match the event's content")
                continue
            checked += 1
            prev_hash = stored
            expected_seq += 1
            # The fold costs nothing on most events: only TRANSITION_TYPES change more than the
            # head, and every event's head is overwritten by the next one's, so the others are
            # skipped here and the last event of the range is reduced once after the loop.
            # row_hash decoded the payload already, but only transitions (a few per
            # task) need it as a dict, so decoding them twice beats changing the hash path.
            if state is not None and type_ in transitions:
                state = task_reduce(state, StreamedEvent(seq, type_, json.loads(payload), lamport, recorded, stored))
    if found is not None:
        return found

    if expected_seq <= through_seq:
        return broken(expected_seq, f"the task records {through_seq} events but the log ends at seq {expected_seq - 1}")
    if prev_hash != through_hash:
        return broken(through_seq, "the task's head_hash differs from the last event's hash")
    if state is not None and checked and type_ not in transitions:
        # The loop's last row is the range's last event (the stream ended without a break).
        state = task_reduce(state, StreamedEvent(seq, type_, {}, lamport, recorded, stored))
    return ChainVerification(task_id, True, checked, prev_hash, None, state=state)


def tasks_visible(*, namespace: str | None) -> QuerySet[Task]:
    """Every task query of the API starts here: another namespace's task does not exist."""
    tasks = Task.objects.all()
    return tasks if namespace is None else tasks.filter(namespace=namespace)


def task_visible(*, namespace: str | None, task_id: uuid.UUID) -> Task:
    task = tasks_visible(namespace=namespace).filter(pk=task_id).first()
    if task is None:
        raise NotFound("task not found", {"task_id": str(task_id)})
    return task


class TaskRow(NamedTuple):
    """The columns of a task the API shows, named as on ``Task`` (``task_as_api_dict`` reads
    either): the hot read path builds its answer from one row without a model instance."""

    pk: uuid.UUID
    namespace: str
    kind: str
    status: str
    input: Any
    output: Any
    error: str | None
    parent_id: uuid.UUID | None
    attempts: int
    max_attempts: int
    lease_holder: str | None
    lease_epoch: int
    # The times already in the API's form (api_time_sql).
    lease_expires_at: str | None
    last_seq: int
    head_hash: str
    created_at: str
    updated_at: str
    last_event_at: str | None
    forked_from_id: uuid.UUID | None
    forked_at_seq: int | None
    sandbox: bool


# JSON columns as text (decoded once below, as the model's field would); a primary-key lookup.
# The API's task answer in one statement: run here on Django's connection, and on the event loop
# by the agents' reads (api/agent_front.py), each handing its row to ``task_row_from``.
_TASK_ROW_COLUMNS = f"""
       id, namespace, kind, status, input::text, output::text, error, parent_id, attempts, max_attempts,
       lease_holder, lease_epoch, {api_time_sql("lease_expires_at")}, last_seq, head_hash,
       {api_time_sql("created_at")}, {api_time_sql("updated_at")}, {api_time_sql("last_event_at")},
       forked_from_id, forked_at_seq, sandbox"""
TASK_ROW_SQL = f"SELECT {_TASK_ROW_COLUMNS} FROM backplane_task WHERE id = %s"


def task_row_visible(*, namespace: str | None, task_id: uuid.UUID) -> TaskRow:
    """``task_visible`` for the API's answer only: one statement, no queryset, no model."""
    with connection.cursor() as cursor:
        cursor.execute(TASK_ROW_SQL, [task_id])
        row = cursor.fetchone()
    return task_row_from(row, namespace=namespace, task_id=task_id)


def task_row_from(row: Sequence[Any] | None, *, namespace: str | None, task_id: uuid.UUID) -> TaskRow:
    """``TASK_ROW_SQL``'s row as a ``TaskRow``; NotFound when there is none, or it is another
    namespace's (``None``: staff, every namespace)."""
    if row is None or (namespace is not None and row[1] != namespace):
        raise NotFound("task not found", {"task_id": str(task_id)})
    return _task_row(row)


def _task_row(row: Sequence[Any]) -> TaskRow:
    values = list(row)
    values[4] = json.loads(values[4])
    values[5] = None if values[5] is None else json.loads(values[5])
    return TaskRow(*values)


@dataclass(frozen=True)
class TaskPage:
    tasks: list[TaskRow]
    next_cursor: str | None


def _encode_cursor(created_at: datetime, task_id: uuid.UUID) -> str:
    raw = json.dumps([created_at.astimezone(UTC).isoformat(), str(task_id)]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


# What ``_encode_cursor`` writes is about 90 characters; anything much longer is not ours, and is
# refused before it is decoded (a long cursor of ``[`` would otherwise recurse in json.loads).
CURSOR_MAX_CHARS = 200


def _decode_cursor(cursor: str) -> tuple[datetime, uuid.UUID]:
    try:
        if len(cursor) > CURSOR_MAX_CHARS:
            raise ValueError("too long")
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        created_at, task_id = json.loads(raw)
        if not isinstance(created_at, str) or not isinstance(task_id, str):
            raise ValueError("not two strings")
        moment = datetime.fromisoformat(created_at)
        if moment.tzinfo is None:
            raise ValueError("naive")
        return moment, uuid.UUID(task_id)
    except (ValueError, TypeError, binascii.Error, UnicodeDecodeError):
        raise InvalidInput("invalid cursor", {"cursor": "not a cursor this API gave out"}) from None


def task_list(
    *, namespace: str | None, status: str | None, kind: str | None, limit: int, cursor: str | None
) -> TaskPage:
    """Oldest first, keyset-paginated on (created_at, id) so pages stay stable under inserts; on
    the replica inside ``replica_reads`` (``reads_connection``)."""
    with reads_connection().cursor() as db:
        db.execute(*task_page_query(namespace=namespace, status=status, kind=kind, limit=limit, cursor=cursor))
        return task_page_from(db.fetchall(), limit=limit)


def task_page_query(
    *, namespace: str | None, status: str | None, kind: str | None, limit: int, cursor: str | None
) -> tuple[str, list[Any]]:
    """``task_list``'s statement and parameters, for either driver (an agent's list is read on
    the event loop, api/agent_front.py): one more row than the page, to know whether one follows."""
    conditions: list[str] = []
    params: list[Any] = []
    for column, value in (("namespace", namespace), ("status", status or None), ("kind", kind or None)):
        if value is not None:
            conditions.append(f"{column} = %s")
            params.append(value)
    if cursor:
        conditions.append("(created_at, id) > (%s, %s)")
        params.extend(_decode_cursor(cursor))
    where = f" WHERE {' AND '.join(conditions)}" if conditions else ""
    return (f"SELECT {_TASK_ROW_COLUMNS}, created_at FROM backplane_task{where} ORDER BY created_at, id LIMIT %s",
            [*params, limit + 1])


def task_page_from(rows: Sequence[Sequence[Any]], *, limit: int) -> TaskPage:
    """``task_page_query``'s rows as a page: its tasks, and the cursor of the next page (None: the last)."""
    page = rows[:limit]  # limit >= 1: a page is never empty when a row follows it
    return TaskPage(tasks=[_task_row(row[:-1]) for row in page],
                    next_cursor=_encode_cursor(page[-1][-1], page[-1][0]) if len(rows) > limit else None)


class EventRow(NamedTuple):
    """The columns of an event the API shows, named as on ``Event`` (``event_as_api_dict`` reads
    either): the events page builds its answer from rows without model instances."""

    task_id: uuid.UUID
    seq: int
    position: int
    type: str
    payload: Any
    agent: str | None
    idempotency_key: str | None
    lamport: int
    causation_id: str | None
    correlation_id: str | None
    trace_id: str | None
    recorded_at: str  # already in the API's form (api_time_sql)
    prev_hash: str
    hash: str


@dataclass(frozen=True)
class EventPage:
    events: list[EventRow]
    next_after_seq: int | None


# The task's namespace and a page of its events in one statement: the LEFT JOIN keeps the task's
# row when the page is empty (an unknown task has none: 404). The page is a range of the
# (task_id, seq) unique index, read in order and cut at the limit.
EVENT_PAGE_SQL = f"""
SELECT t.namespace, e.seq, e.position, e.type, e.payload::text, e.agent, e.idempotency_key, e.lamport,
       e.causation_id, e.correlation_id, e.trace_id, {api_time_sql("e.recorded_at")}, e.prev_hash, e.hash
FROM backplane_task t
LEFT JOIN LATERAL (
    SELECT * FROM backplane_event WHERE task_id = t.id AND seq > %s ORDER BY seq LIMIT %s
) e ON true
WHERE t.id = %s
ORDER BY e.seq
"""


def event_page_params(*, task_id: uuid.UUID, after_seq: int, limit: int) -> list[Any]:
    """``EVENT_PAGE_SQL``'s parameters: one event past the page, to tell whether there are more."""
    return [after_seq, limit + 1, task_id]


def event_page_visible(*, namespace: str | None, task_id: uuid.UUID, after_seq: int, limit: int) -> EventPage:
    """The events of a task visible in ``namespace`` (None: every namespace) after ``after_seq``,
    at most ``limit``, oldest first; ``next_after_seq`` when there are more."""
    with connection.cursor() as cursor:
        cursor.execute(EVENT_PAGE_SQL, event_page_params(task_id=task_id, after_seq=after_seq, limit=limit))
        rows = cursor.fetchall()
    return event_page_from(rows, namespace=namespace, task_id=task_id, limit=limit)


def event_page_from(rows: Sequence[Sequence[Any]], *, namespace: str | None, task_id: uuid.UUID,
                    limit: int) -> EventPage:
    """``EVENT_PAGE_SQL``'s rows as a page (on Django's connection here, on the event loop in
    api/agent_front.py); NotFound for no task, or another namespace's."""
    if not rows or (namespace is not None and rows[0][0] != namespace):
        raise NotFound("task not found", {"task_id": str(task_id)})
    events = [EventRow(task_id, seq, position, type_, json.loads(payload), *rest)
              for _, seq, position, type_, payload, *rest in rows if seq is not None]
    more = len(events) > limit
    events = events[:limit]
    return EventPage(events=events, next_after_seq=events[-1].seq if more and events else None)


def task_head_traces(tasks: Sequence[Task]) -> dict[uuid.UUID, tuple[str | None, str | None]]:
    """The trace and span that wrote each task's last event (``Event.trace_id``/``span_id``), by
    task id: what the backplane's own later work on the task continues (telemetry/tracing.py).
    One index lookup per task, in one statement."""
    if not tasks:
        return {}
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT e.task_id, e.trace_id, e.span_id FROM backplane_event e"
            " JOIN unnest(%s::uuid[], %s::int[]) AS head(task_id, seq) USING (task_id, seq)",
            [[task.pk for task in tasks], [task.last_seq for task in tasks]],
        )
        return {task_id: (trace_id, span_id) for task_id, trace_id, span_id in cursor.fetchall()}


# --- tasks by filter: the task list, bulk jobs, saved searches and alerts ---------------------


@dataclass(frozen=True)
class TaskFilters:
    q: str = ""
    status: str = ""
    kind: str = ""
    namespace: str = ""
    agent: str = ""
    created_after: datetime | None = None
    created_before: datetime | None = None
    updated_after: datetime | None = None
    updated_before: datetime | None = None
    stalled_since: datetime | None = None
    recovered_since: datetime | None = None
    replayed_since: datetime | None = None
    recovering: bool = False
    sandboxes: str = ""  # "": left out (the fleet's view), "with": shown too, "only": nothing else

    def as_json(self) -> dict[str, Any]:
        """The filters that are set, as JSON (times in ISO 8601): what a saved search or a bulk
        job keeps, and what ``task_filters_from_json`` reads back."""
        data: dict[str, Any] = {}
        for name in TASK_FILTER_FIELDS:
            value = getattr(self, name)
            if value:
                data[name] = value.isoformat() if isinstance(value, datetime) else value
        return data


TASK_FILTER_FIELDS = tuple(field.name for field in dataclasses.fields(TaskFilters))
_FILTER_TIMES = frozenset(name for name in TASK_FILTER_FIELDS if name.endswith(("_after", "_before", "_since")))


def filter_values_from_json(data: Any, *, known: Sequence[str], times: Collection[str] = (),
                            booleans: Collection[str] = ()) -> dict[str, Any]:
    """A list filter kept as JSON (a saved search, a bulk job's selection), read back: only the
    ``known`` keys; ``times`` as RFC 3339 with an offset, ``booleans`` as booleans, the rest as
    strings of at most 200 characters. Anything else is refused (400 with the field named)."""
    if not isinstance(data, Mapping):
        raise InvalidInput("filter must be an object", {"filter": f"keys: {', '.join(known)}"})
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise InvalidInput("filter has unknown keys",
                           {"filter": f"unknown {', '.join(unknown)}; known: {', '.join(known)}"})
    values: dict[str, Any] = {}
    for name, value in data.items():
        if name in booleans:
            if not isinstance(value, bool):
                raise InvalidInput(f"filter.{name} must be a boolean", {f"filter.{name}": "true or false"})
        elif name in times:
            try:
                value = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
            except ValueError:
                raise InvalidInput(f"filter.{name} is not a time", {f"filter.{name}": "RFC 3339"}) from None
            if value.tzinfo is None:
                raise InvalidInput(f"filter.{name} needs a timezone", {f"filter.{name}": "RFC 3339, with offset"})
        elif not isinstance(value, str) or len(value) > 200:
            raise InvalidInput(f"filter.{name} must be a string", {f"filter.{name}": "at most 200 characters"})
        values[name] = value
    return values


def task_filters_from_json(data: Mapping[str, Any]) -> TaskFilters:
    """``TaskFilters.as_json`` read back; anything else is refused (400 with the field named)."""
    values = filter_values_from_json(data, known=TASK_FILTER_FIELDS, times=_FILTER_TIMES, booleans=("recovering",))
    if values.get("sandboxes", "") not in ("", "with", "only"):
        raise InvalidInput("filter.sandboxes is not one of '', 'with', 'only'", {"filter.sandboxes": "'', with, only"})
    if values.get("status") and values["status"] not in TaskStatus.values:
        raise InvalidInput("filter.status is not a task status", {"filter.status": ", ".join(TaskStatus.values)})
    return TaskFilters(**values)


PAYLOAD_MATCH_SQL = (
    "SELECT task_id FROM backplane_event WHERE jsonb_to_tsvector('simple'::regconfig, payload, "
    "'[\"string\", \"numeric\"]'::jsonb) @@ phraseto_tsquery('simple', {phrase})"
)


def payload_match_sql(phrase: str) -> str:
    """``PAYLOAD_MATCH_SQL`` with ``phrase`` written into it as a quoted literal, not bound.

    How many events hold a phrase decides the plan: a word most tasks hold is found fastest by
    walking the newest tasks and probing each one's events; a value one task holds, through the
    payload index. A bound phrase makes the statement one prepared statement (settings:
    ``prepare_threshold``), and after five runs PostgreSQL may keep a generic plan made without
    the value: the walk, which for a value one task holds reads every event of every task
    (bench/scale_events.py measures both kinds of value). A literal is planned for its own value
    each time. psycopg quotes it; ``%`` is doubled because the statement is still formatted with the
    query's other parameters."""
    if "\x00" in phrase:  # psycopg could not quote it, and no payload holds one (the writer refuses NUL)
        raise InvalidInput("q must not contain NUL", {"q": "text without NUL characters"})
    quoted = psycopg.sql.Literal(phrase).as_string(None)
    return PAYLOAD_MATCH_SQL.format(phrase=quoted.replace("%", "%%"))


def tasks_filtered(filters: TaskFilters) -> QuerySet[Task]:
    tasks = Task.objects.all()
    if filters.q:
        # Words inside any event's payload (the task's input is in its TaskStarted), or the task's id.
        match = Q(pk__in=RawSQL(payload_match_sql(filters.q), []))
        try:
            match |= Q(pk=uuid.UUID(filters.q.strip()))
        except ValueError:
            pass
        tasks = tasks.filter(match)
    if filters.status:
        tasks = tasks.filter(status=filters.status)
    if filters.kind:
        tasks = tasks.filter(kind=filters.kind)
    if filters.namespace:
        tasks = tasks.filter(namespace=filters.namespace)
    if filters.agent:
        claimed = Event.objects.filter(type=et.TASK_CLAIMED, agent=filters.agent).values("task_id")
        tasks = tasks.filter(Q(pk__in=claimed) | Q(lease_holder=filters.agent) | Q(created_by=filters.agent))
    for name, lookup in (
        ("created_after", "created_at__gte"),
        ("created_before", "created_at__lt"),
        ("updated_after", "updated_at__gte"),
        ("updated_before", "updated_at__lt"),
    ):
        value = getattr(filters, name)
        if value is not None:
            tasks = tasks.filter(**{lookup: value})
    if filters.stalled_since is not None:
        stalled = Event.objects.filter(type=et.TASK_STALLED, recorded_at__gte=filters.stalled_since)
        tasks = tasks.filter(pk__in=stalled.values("task_id"))
    if filters.recovered_since is not None:
        recovered = Event.objects.filter(type=et.TASK_CLAIMED, recorded_at__gte=filters.recovered_since,
                                         payload__contains={"recovered": True})
        tasks = tasks.filter(pk__in=recovered.values("task_id"))
    if filters.replayed_since is not None:
        tasks = tasks.filter(
            pk__in=RawSQL("SELECT task_id FROM backplane_idempotentreplay WHERE minute >= %s",
                          [filters.replayed_since.replace(second=0, microsecond=0)])
        )
    if filters.recovering:
        tasks = tasks.filter(status__in=[TaskStatus.PENDING, TaskStatus.RUNNING], attempts__gt=0)
    if filters.sandboxes == "only":
        tasks = tasks.filter(sandbox=True)
    elif filters.sandboxes != "with":
        tasks = tasks.filter(sandbox=False)
    return tasks
