"""Client writes to the event log: tasks, appends, agents. Every public function is one transaction.

The append path (docs/design.md), from the request to the writer (``backplane.eventlog.writer``):
1. lock the task row, so appends to one task serialize and different tasks run in parallel;
2. check the lease epoch (a fenced-off holder gets 409, never a silent write);
3. answer a known idempotency key with the original event (another body is 422);
4. refuse appends to a closed task, then check ``expected_seq`` (optimistic concurrency);
5. number, clock and hash the events, insert them, update the projection; commit.
"""

from __future__ import annotations

import dataclasses
import functools
import secrets
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import connection, transaction
from django.utils import timezone

from backplane.delivery.outbox import RESERVED_TOPIC_WORD, topic_is_reserved
from backplane.eventlog import costs
from backplane.eventlog import event_types as et
from backplane.eventlog.canonical import CanonicalizationError, canonical_json, canonical_sha256
from backplane.eventlog.errors import IdempotencyMismatch, InvalidInput, KindRefused, SeqConflict, TaskExists
from backplane.eventlog.models import Agent, Event, Task, TaskStatus, hash_token
from backplane.eventlog.writer import EventDraft, check_lease, lock_task, task_closed_error, write_events
from backplane.lib.sql_rows import row_insert_params, row_insert_sql
from backplane.telemetry import counters


@dataclass(frozen=True)
class AppendOutcome:
    events: list[Event]
    replayed: bool


@dataclass(frozen=True)
class TaskCreateOutcome:
    task: Task
    created: bool


@dataclass(frozen=True)
class ForkOrigin:
    """What a fork continues from (``backplane.eventlog.forks``): its ``TaskForked`` payload
    names the source, ``at_seq`` and the source's hash there."""

    source: Task
    at_seq: int
    sandbox: bool
    payload: dict[str, Any]


@dataclass(frozen=True)
class AgentCreated:
    agent: Agent
    token: str


# --- tasks ---------------------------------------------------------------------------------


TASK_ID_TAKEN = "this task_id is not available for this task; create it under a new UUID"


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
    kinds: Sequence[str] = (),
) -> TaskCreateOutcome:
    """Create a task with ``TaskStarted`` as event 1. Idempotent on ``task_id``.

    An agent limited to ``kinds`` creates tasks of those kinds, and sub-tasks (``parent_task_id``)
    of a task it may write (``check_lease``'s first rule)."""
    ensure_storable_json(input, "input")
    ensure_storable_json(metadata or {}, "metadata")
    if kinds and kind not in kinds:
        parent = (Task.objects.filter(pk=parent_task_id, namespace=namespace).only("kind", "created_by").first()
                  if parent_task_id is not None else None)
        # A parent that does not exist is the create's own 400, below.
        if parent_task_id is None or (parent is not None and parent.kind not in kinds and parent.created_by != agent):
            raise kind_refused(kind, kinds)
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


def kind_refused(kind: str, kinds: Sequence[str]) -> KindRefused:
    return KindRefused(f"this agent creates only tasks of its kinds ({', '.join(kinds)}) and their sub-tasks",
                       {"kind": kind})


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
    fork: ForkOrigin | None = None,
) -> TaskCreateOutcome:
    """Create the task row and its first events (``TaskStarted``, then ``TaskForked`` for a
    fork) in the caller's transaction; an existing ``task_id`` with the same content is a replay."""
    with connection.cursor() as cursor:
        if parent_task_id is not None:
            cursor.execute(PARENT_IN_NAMESPACE_SQL, [parent_task_id, namespace])
            if cursor.fetchone() is None:
                raise parent_not_found()
        now = timezone.now()
        task = new_task(namespace=namespace, kind=kind, input=input, agent=agent, task_id=task_id,
                        parent_task_id=parent_task_id, max_attempts=max_attempts, metadata=metadata, now=now,
                        fork=fork)
        # A concurrent create of the same task_id that committed first leaves no row here; one
        # still in flight makes this statement wait for its end.
        cursor.execute(task_insert_sql(), row_insert_params(task))
        inserted = cursor.fetchone() is not None
    if inserted:
        write_events(task, started_drafts(task, fork=fork), agent=agent, now=now)
        return TaskCreateOutcome(task=task, created=True)
    existing = Task.objects.filter(pk=task_id).first()
    # Task ids are global (the primary key), so an id can be taken by another namespace. That
    # conflict answers word for word like a same-namespace one with other content, whatever the
    # content: the caller learns that the id is not available, never where it is used, nor whether
    # its kind or input match (identical content elsewhere is not a replay). A free id could only
    # answer alike with a second row under the same id. One taken and deleted since (retention)
    # was taken all the same.
    origin = (fork.source.pk, fork.at_seq, fork.sandbox) if fork else (None, None, False)
    if (existing is None or existing.namespace != namespace or existing.kind != kind or existing.input != input
            or (existing.forked_from_id, existing.forked_at_seq, existing.sandbox) != origin):
        raise TaskExists(TASK_ID_TAKEN, {"task_id": "already taken; use a new UUID"})
    replay_count(task_id=existing.pk, kind="task_create", now=now)
    return TaskCreateOutcome(task=existing, created=False)


# Whether the parent a task names is a task of its namespace (``parent_not_found`` if not).
PARENT_IN_NAMESPACE_SQL = "SELECT 1 FROM backplane_task WHERE id = %s AND namespace = %s"


def parent_not_found() -> InvalidInput:
    return InvalidInput("parent task not found", {"parent_task_id": "no such task in this namespace"})


def new_task(*, namespace: str, kind: str, input: dict[str, Any], agent: str | None, task_id: uuid.UUID,
             parent_task_id: uuid.UUID | None, max_attempts: int, metadata: dict[str, Any], now: datetime,
             fork: ForkOrigin | None = None) -> Task:
    """The row a create inserts (``task_insert_sql``): the model's defaults for everything else."""
    return Task(id=task_id, namespace=namespace, kind=kind, input=input, metadata=metadata, parent_id=parent_task_id,
                max_attempts=max_attempts, forked_from=fork.source if fork else None,
                forked_at_seq=fork.at_seq if fork else None, sandbox=fork.sandbox if fork else False,
                created_by=agent, created_at=now, updated_at=now)


def started_drafts(task: Task, *, fork: ForkOrigin | None = None) -> list[EventDraft]:
    """A new task's first events: ``TaskStarted``, then ``TaskForked`` for a fork. The writer
    announces the new task (its lifecycle message), as it announces every task now pending."""
    return [
        EventDraft(
            type=et.TASK_STARTED,
            payload={
                "kind": task.kind,
                "input": task.input,
                "parent_task_id": str(task.parent_id) if task.parent_id else None,
                "max_attempts": task.max_attempts,
                "metadata": task.metadata,
            },
        ),
        *([EventDraft(type=et.TASK_FORKED, payload=fork.payload)] if fork else []),
    ]


def task_insert_sql() -> str:
    """Every create's one INSERT, on either driver (with ``row_insert_params``): the row, unless
    its id (or its dispatch key, for a sub-task) is taken: then no row comes back."""
    return row_insert_sql(Task, "ON CONFLICT DO NOTHING RETURNING id")


# --- appends -------------------------------------------------------------------------------


def event_append(
    *,
    namespace: str | None,
    task_id: uuid.UUID,
    draft: EventDraft,
    agent: str | None,
    expected_seq: int | None = None,
    lease_epoch: int | None = None,
    kinds: Sequence[str] = (),
) -> AppendOutcome:
    """Append one client event to a task's log."""
    return event_append_batch(
        namespace=namespace,
        task_id=task_id,
        drafts=[draft],
        agent=agent,
        expected_seq=expected_seq,
        lease_epoch=lease_epoch,
        kinds=kinds,
    )


@counters.observe_append_duration
def event_append_batch(
    *,
    namespace: str | None,
    task_id: uuid.UUID,
    drafts: Sequence[EventDraft],
    agent: str | None,
    expected_seq: int | None = None,
    lease_epoch: int | None = None,
    kinds: Sequence[str] = (),
) -> AppendOutcome:
    """Append client events to one task, all or nothing, as ``agent`` (limited to ``kinds``,
    when given: ``check_lease``)."""
    digests = validate_client_drafts(drafts)
    with transaction.atomic(durable=True):
        task = lock_task(namespace=namespace, task_id=task_id)
        check_lease(task, lease_epoch, agent=agent, kinds=kinds)
        replay = _find_replay(task, drafts, digests)
        if replay is not None:
            replay_count(task_id=task.pk, kind="event", now=timezone.now())
            return AppendOutcome(events=replay, replayed=True)
        check_open_at(task, expected_seq)
        now = timezone.now()
        events = write_events(task, [_settled(draft, now=now) for draft in drafts], agent=agent, now=now,
                              digests=digests)
    return AppendOutcome(events=events, replayed=False)


def _settled(draft: EventDraft, *, now: datetime) -> EventDraft:
    """A model call's draft with its cost settled when it is recorded (eventlog/costs.py); the
    request's digest was taken before, so a replay of the same request still matches."""
    if draft.type != et.LLM_CALLED:
        return draft
    return dataclasses.replace(draft, payload=costs.llm_called_priced(draft.payload, at=now))


def check_open_at(task: Task, expected_seq: int | None) -> None:
    """409 for a closed task, then for an ``expected_seq`` that is not the task's ``last_seq``.

    A compensating task is refused client events too: its work ended (it failed for good or was
    cancelled) and its saga speaks only through the compensations' results."""
    if task.is_closed or task.status == TaskStatus.COMPENSATING:
        raise task_closed_error(task)
    if expected_seq is not None and expected_seq != task.last_seq:
        raise SeqConflict(
            f"expected_seq {expected_seq} but the task is at {task.last_seq}",
            {"last_seq": task.last_seq, "expected_seq": expected_seq},
        )


def replay_count(*, task_id: uuid.UUID, kind: str, now: datetime) -> None:
    """Count a request answered from what was already recorded (``IdempotentReplay``; on
    /metrics too, once the transaction commits).

    Runs inside the caller's transaction, so a replay is counted exactly when its answer is
    given. Rows are per task and minute, so concurrent replays of different tasks never wait
    on one counter row.
    """
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO backplane_idempotentreplay (task_id, kind, minute, count)
            VALUES (%s, %s, date_trunc('minute', %s::timestamptz), 1)
            ON CONFLICT (task_id, kind, minute) DO UPDATE SET count = backplane_idempotentreplay.count + 1
            """,
            [task_id, kind, now],
        )
    transaction.on_commit(functools.partial(counters.idempotent_replay_count, kind=kind))


def validate_client_drafts(drafts: Sequence[EventDraft]) -> list[str | None]:
    """Check a client's events (one, or a batch's) before any lock is taken; return each keyed
    draft's request digest."""
    if not drafts:
        raise InvalidInput("events must not be empty", {"events": "at least one event is required"})
    if len(drafts) > settings.BACKPLANE_BATCH_MAX_EVENTS:
        raise InvalidInput(
            "too many events in one batch",
            {"events": f"at most {settings.BACKPLANE_BATCH_MAX_EVENTS} events per batch"},
        )
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
            for number, item in enumerate(draft.outbox):
                _reject_nul(item.payload, "outbox")
                _refuse_reserved_topic(item.topic, f"outbox[{number}].topic")
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


def ensure_storable_json(value: Any, name: str) -> None:
    """Refuse JSON we could neither hash canonically nor store in JSONB, as bad input."""
    try:
        canonical_sha256(value)
    except CanonicalizationError as exc:
        raise InvalidInput(f"{name} cannot be represented as canonical JSON", {name: str(exc)}) from None
    _reject_nul(value, name)


def _refuse_reserved_topic(topic: str, name: str) -> None:
    """The backplane's topics (``backplane.*``: lifecycle, alerts, budgets, compensations) are
    the server's: a client message on one would reach every namespace's subscribers as the
    backplane's word (delivery/outbox.py, ``topic_is_reserved``)."""
    if topic_is_reserved(topic):
        raise InvalidInput(f"outbox topic {topic!r} is reserved for the backplane",
                           {name: f"topics beginning with '{RESERVED_TOPIC_WORD}.' belong to the server"})


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
