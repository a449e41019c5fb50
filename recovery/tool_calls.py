"""The tool-call idempotency proxy: write before you act, acknowledge before you advance."""

from __future__ import annotations

import functools
import hashlib
import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import psycopg
from django.conf import settings
from django.db import connection, transaction
from django.db.models import Q
from django.utils import timezone

from backplane.eventlog import event_types as et
from backplane.eventlog.async_services import HandOff, lock_task_async, run_after_commit, write_events_async
from backplane.eventlog.costs import decimal_text
from backplane.eventlog.errors import IdempotencyMismatch, InvalidInput, SandboxRefused
from backplane.eventlog.event_types import reported_cost
from backplane.eventlog.lineage import (
    TO_HEAD,
    HistoryEvent,
    SeqRange,
    find_in_history,
    fork_point_event,
    history_ranges,
    inherited_ranges,
)
from backplane.eventlog.models import Task
from backplane.eventlog.services import ensure_storable_json, replay_count
from backplane.eventlog.writer import EventDraft, check_lease, lock_task, task_closed_error, write_events
from backplane.lib.sql_rows import json_text, row_insert_params, row_insert_sql
from backplane.telemetry import counters
from recovery.approvals import approval_gate, approval_gate_async
from recovery.budgets import budget_gate, budget_gate_async
from recovery.errors import ApprovalPending
from recovery.models import ApprovalStatus, ToolCall, ToolCallStatus
from recovery.sagas import saga_record_compensation_result
from recovery.selectors import TOOL_CALL_ROWS, TOOL_CALL_VISIBLE_SQL, tool_call_from, tool_call_visible

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
    kinds: Sequence[str] = (),
    reason: str = "",
) -> ToolCallOutcome:
    """Record a tool call before the agent makes it (write before you act).

    ``ttl_seconds``: how long the record (the cached answer) is kept; default the global TTL.
    A call a tool policy gates is recorded only once people approved it, with these arguments
    (recovery/approvals.py): until then this commits (or finds) its approval request, with the
    agent's ``reason``, and raises ``ApprovalPending``.
    """
    ensure_storable_json(input, "input")
    ensure_storable_json(compensation, "compensation")
    key = tool_call_key(task_id=task_id, step=step, tool=tool)
    with transaction.atomic(durable=True):
        task = lock_task(namespace=namespace, task_id=task_id)
        check_lease(task, lease_epoch, agent=agent, kinds=kinds)
        existing = ToolCall.objects.filter(pk=key).first()
        if existing is not None:
            # A call answered from a fork's record keeps no compensation (the effect and its undo
            # are the source's), so only a call that made its own effect compares one.
            owns_effect = existing.effect_key == key and not task.sandbox
            if existing.input != input or (owns_effect and existing.compensation != compensation):
                raise IdempotencyMismatch(
                    "this step and tool were dispatched with a different input",
                    {"idempotency_key": key, "step": step, "tool": tool},
                )
            replay_count(task_id=task.pk, kind="tool_call", now=timezone.now())
            return ToolCallOutcome(call=existing, replayed=True)
        if task.is_closed:
            raise task_closed_error(task)
        now = timezone.now()
        ttl = timedelta(seconds=ttl_seconds or settings.BACKPLANE_TOOL_CALL_TTL_SECONDS)
        if task.forked_from_id is not None:
            recorded = recorded_call(task, step=step, tool=tool)
            if task.sandbox and (recorded is None or recorded.status is None):
                raise SandboxRefused(
                    f"the record has no answer for {tool} at step {step}, and a sandbox never calls a tool",
                    {"step": step, "tool": tool, "source_task_id": str(task.forked_from_id)},
                )
            if recorded is not None:
                call = _answer_from_record(task, key=key, step=step, tool=tool, recorded=recorded, input=input,
                                           compensation=compensation, agent=agent, now=now, ttl=ttl)
                return ToolCallOutcome(call=call, replayed=True)
        # A new call spends: a spent budget of its scope refuses it (answers on record cost nothing).
        budget_gate(namespace=task.namespace, agent=agent, task=task, now=now)
        approval = approval_gate(task, key=key, step=step, tool=tool, input=input, reason=reason, agent=agent,
                                 now=now)
        if approval is None or approval.status == ApprovalStatus.GRANTED:
            call = new_call(task, key=key, step=step, tool=tool, input=input, compensation=compensation,
                            agent=agent, now=now, ttl=ttl)
            with connection.cursor() as cursor:
                # The task's row lock serializes the dispatches of its calls: the key is free.
                cursor.execute(tool_call_insert_sql(), row_insert_params(call))
            write_events(task, [dispatched(call, approval_id=approval.pk if approval else None)], agent=agent,
                         now=now)
            return ToolCallOutcome(call=call, replayed=False)
    # Raised once the request is committed: the agent comes back when people have decided.
    raise ApprovalPending(approval)


async def tool_call_dispatch_async(
    conn: psycopg.AsyncConnection[Any],
    *,
    namespace: str,
    task_id: uuid.UUID,
    step: int,
    tool: str,
    input: dict[str, Any],
    agent: str,
    lease_epoch: int | None,
    compensation: dict[str, Any] | None = None,
    kinds: Sequence[str] = (),
    reason: str = "",
) -> ToolCall:
    """``tool_call_dispatch`` of a new call by an agent, on the event loop's connection (in
    autocommit): the same lock, checks, statements and events, the approval gate's too
    (``ApprovalPending`` once a request is written). ``HandOff`` before anything is written for
    what the service answers from what it reads: a key already dispatched (a replay, or another
    input's 422), a closed task (who closed it), a fork's call (its record), a spent budget (the
    spend), a request already pending or refused."""
    ensure_storable_json(input, "input")
    ensure_storable_json(compensation, "compensation")
    key = tool_call_key(task_id=task_id, step=step, tool=tool)
    async with conn.transaction():
        task = await lock_task_async(conn, namespace=namespace, task_id=task_id)
        check_lease(task, lease_epoch, agent=agent, kinds=kinds)
        if task.is_closed or task.forked_from_id is not None:
            raise HandOff
        now = timezone.now()
        await budget_gate_async(conn, namespace=task.namespace, agent=agent, task=task, now=now)
        approval, asked = await approval_gate_async(conn, task, key=key, step=step, tool=tool, input=input,
                                                    reason=reason, agent=agent, now=now)
        if asked is None:
            call = new_call(task, key=key, step=step, tool=tool, input=input, compensation=compensation, agent=agent,
                            now=now, ttl=timedelta(seconds=settings.BACKPLANE_TOOL_CALL_TTL_SECONDS))
            if await (await conn.execute(tool_call_insert_sql(), row_insert_params(call))).fetchone() is None:
                raise HandOff
            made = dispatched(call, approval_id=approval.pk if approval is not None else None)
            plan = await write_events_async(conn, task, [made], agent=agent, now=now)
    if asked is not None:
        assert approval is not None
        run_after_commit(asked)
        # Once the request is committed, as the service raises it: the agent comes back when people decided.
        raise ApprovalPending(approval)
    run_after_commit(plan)
    return call


def new_call(task: Task, *, key: str, step: int, tool: str, input: dict[str, Any],
             compensation: dict[str, Any] | None, agent: str | None, now: datetime, ttl: timedelta) -> ToolCall:
    """A call the task makes itself (its effect's key is its own), as ``tool_call_insert_sql`` inserts it."""
    return ToolCall(idempotency_key=key, effect_key=key, task=task, step=step, tool=tool, input=input,
                    compensation=compensation, dispatched_by=agent, dispatched_at=now, expires_at=now + ttl)


def dispatched(call: ToolCall, *, approval_id: uuid.UUID | None = None) -> EventDraft:
    payload = {"idempotency_key": call.idempotency_key, "step": call.step, "tool": call.tool, "input": call.input,
               "compensation": call.compensation}
    if approval_id is not None:
        # The granted request this call was made under: its events in the same chain hold the
        # arguments' hash, the policy version and who approved (docs/approvals.md).
        payload["approval_id"] = str(approval_id)
    return EventDraft(type=et.TOOL_CALL_DISPATCHED, payload=payload)


# A new call's one INSERT, on either driver; no row comes back when its key is taken.
def tool_call_insert_sql() -> str:
    return row_insert_sql(ToolCall, "ON CONFLICT (idempotency_key) DO NOTHING RETURNING idempotency_key")


def tool_call_record_result(
    *,
    namespace: str | None,
    key: str,
    status: str,
    result: dict[str, Any],
    agent: str | None,
    lease_epoch: int | None,
    fenced: bool = True,
    cost: dict[str, Any] | None = None,
    kinds: Sequence[str] = (),
) -> ToolCallOutcome:
    """Record a tool's answer once (acknowledge before you advance); an identical repeat is a replay.

    ``fenced=False``: the backplane records what a tool it called itself answered. That answer
    is a fact whichever lease is current by now; refusing it would make the next holder call
    the tool again.
    """
    charged = _checked_answer(status, result, cost)
    with transaction.atomic(durable=True), connection.cursor() as cursor:
        call = tool_call_visible(namespace=namespace, key=key)
        task = lock_task(namespace=namespace, task_id=call.task_id)
        if fenced:
            check_lease(task, lease_epoch, agent=agent, kinds=kinds)
        cursor.execute(LOCK_TOOL_CALL_SQL, [key])
        # Expired meanwhile (the sweep deletes records past their TTL): 404, as if never read.
        call = tool_call_from(cursor.fetchone(), key=key)
        if call.status != ToolCallStatus.DISPATCHED:
            if call.status == status and call.result == result:
                replay_count(task_id=task.pk, kind="tool_result", now=timezone.now())
                return ToolCallOutcome(call=call, replayed=True)
            raise IdempotencyMismatch(
                "this tool call was already answered differently",
                {"idempotency_key": key, "status": call.status},
            )
        if task.is_closed:
            raise task_closed_error(task)
        now = timezone.now()
        cursor.execute(ANSWER_SQL, _answered(call, status=status, result=result, now=now))
        transaction.on_commit(functools.partial(_count_result, call))
        if call.compensation_of is not None:
            saga_record_compensation_result(task, call, agent=agent, now=now)
            return ToolCallOutcome(call=call, replayed=False)
        write_events(task, [_result_received(call, charged)], agent=agent, now=now)
    return ToolCallOutcome(call=call, replayed=False)


async def tool_call_record_result_async(
    conn: psycopg.AsyncConnection[Any],
    *,
    namespace: str,
    key: str,
    status: str,
    result: dict[str, Any],
    agent: str,
    lease_epoch: int | None,
    cost: dict[str, Any] | None = None,
    kinds: Sequence[str] = (),
) -> ToolCall:
    """``tool_call_record_result`` of an agent's first answer to a call of its task, on the
    event loop's connection (in autocommit): the same reads, lock, checks, statements and event.
    ``HandOff`` before anything is written for what the service answers from what it reads: a
    call answered already (a replay, or another answer's 422), a closed task (who closed it), a
    compensation (the saga's record), a paid answer (budgets hear of it)."""
    if _checked_answer(status, result, cost) is not None:
        raise HandOff  # a paid answer is never quiet: budgets hear of what it costs
    async with conn.transaction():
        visible = await conn.execute(TOOL_CALL_VISIBLE_SQL, {"key": key, "namespace": namespace})
        call = tool_call_from(await visible.fetchone(), key=key)
        task = await lock_task_async(conn, namespace=namespace, task_id=call.task_id)
        check_lease(task, lease_epoch, agent=agent, kinds=kinds)
        # Expired meanwhile (the sweep deletes records past their TTL): 404, as if never read.
        call = tool_call_from(await (await conn.execute(LOCK_TOOL_CALL_SQL, [key])).fetchone(), key=key)
        if call.status != ToolCallStatus.DISPATCHED or task.is_closed or call.compensation_of is not None:
            raise HandOff
        now = timezone.now()
        await conn.execute(ANSWER_SQL, _answered(call, status=status, result=result, now=now))
        plan = await write_events_async(conn, task, [_result_received(call, None)], agent=agent, now=now)
    run_after_commit(plan)
    _count_result(call)
    return call


def _checked_answer(status: str, result: dict[str, Any], cost: dict[str, Any] | None) -> dict[str, Any] | None:
    """An answer's status and result checked before any lock is taken; what a paid tool's answer
    costs, as the event records it (None: nothing reported)."""
    if status not in (ToolCallStatus.SUCCEEDED, ToolCallStatus.FAILED):
        raise InvalidInput("status must be succeeded or failed", {"status": "must be succeeded or failed"})
    ensure_storable_json(result, "result")
    if cost is None:
        return None
    try:
        amount, currency = reported_cost(cost)
    except InvalidInput as exc:  # the same rules as a model call's, named for this body
        raise InvalidInput(exc.message.replace("payload.", ""),
                           {k.replace("payload.", ""): v for k, v in exc.details.items()}) from None
    return {"amount": decimal_text(amount), "currency": currency, "source": "provider"}


# The call's row, locked; and its answer, written once: on either driver.
LOCK_TOOL_CALL_SQL = f"SELECT {TOOL_CALL_ROWS.columns} FROM recovery_toolcall WHERE idempotency_key = %s FOR UPDATE"
ANSWER_SQL = ("UPDATE recovery_toolcall SET status = %s, result = %s::jsonb, completed_at = %s "
              "WHERE idempotency_key = %s")


def _answered(call: ToolCall, *, status: str, result: dict[str, Any], now: datetime) -> list[Any]:
    """``call`` answered, and ``ANSWER_SQL``'s parameters."""
    call.status, call.result, call.completed_at = status, result, now
    return [status, json_text(result), now, call.idempotency_key]


def _count_result(call: ToolCall) -> None:
    assert call.completed_at is not None
    counters.tool_call_result_count(tool=call.tool, status=call.status,
                                    seconds=(call.completed_at - call.dispatched_at).total_seconds())


def _result_received(call: ToolCall, charged: dict[str, Any] | None) -> EventDraft:
    payload = {"idempotency_key": call.idempotency_key, "step": call.step, "tool": call.tool, "status": call.status,
               "result": call.result}
    if call.effect_key != call.idempotency_key:
        # A fork's answer to a call its source dispatched: the key the tool saw, so the
        # recovery context pairs this answer with the inherited dispatch.
        payload["effect_key"] = call.effect_key
    if charged is not None:
        payload["cost"] = charged  # a paid tool: summed into the cost rollups with the event
    return EventDraft(type=et.TOOL_CALL_RESULT_RECEIVED, payload=payload)


# --- forks: calls answered from the record -------------------------------------------------------


@dataclass(frozen=True)
class RecordedCall:
    """A call of the same step and tool found in the record a fork answers from."""

    dispatch: HistoryEvent | None  # None: only an edit of a sandbox's record answers it
    effect_key: str
    inherited: bool  # in the fork's history (confirmed), not only in a sandbox's recording
    status: str | None  # None: the record has no answer yet (it was in flight)
    result: dict[str, Any] | None
    answer_in_history: bool
    answered_by: dict[str, Any] | None


def recorded_call(task: Task, *, step: int, tool: str) -> RecordedCall | None:
    """What the record says about ``tool`` at ``step`` for a fork, or None when it says nothing.

    1. A dispatch in the fork's history (its sources up to where it was forked) is the fork's
       own past: it is answered from whatever answer the effect got anywhere — in the history,
       later in the source's log, or in a sibling fork's record — and stays in flight, under the
       source's key, when none did.
    2. Otherwise a sandbox answers from its source's whole record, with the edits its
       ``TaskForked`` carries (``tool_answers``) in place of the recorded answers.
    """
    inherited = inherited_ranges(task)
    asked = [{"step": step, "tool": tool}]
    dispatch = find_in_history(inherited, event_type=et.TOOL_CALL_DISPATCHED, matches=asked)
    if dispatch is not None:
        return _effect_answer(dispatch, inherited, inherited=True)
    if not task.sandbox:
        return None
    assert task.forked_from_id is not None  # a sandbox is a fork
    recording = history_ranges(Task.objects.get(pk=task.forked_from_id))
    dispatch = find_in_history(recording, event_type=et.TOOL_CALL_DISPATCHED, matches=asked)
    edit = _sandbox_edit(task, step=step, tool=tool)
    if edit is not None:
        effect = dispatch.payload["idempotency_key"] if dispatch else tool_call_key(task_id=task.pk, step=step,
                                                                                    tool=tool)
        return RecordedCall(dispatch=dispatch, effect_key=effect, inherited=False, status=edit["status"],
                            result=edit["result"], answer_in_history=False, answered_by={"tool_answers": True})
    return None if dispatch is None else _effect_answer(dispatch, recording, inherited=False)


def _effect_answer(dispatch: HistoryEvent, ranges: list[SeqRange], *, inherited: bool) -> RecordedCall:
    """The one answer the effect ``dispatch`` started has, wherever it was recorded, if any."""
    effect = dispatch.payload["idempotency_key"]

    def found(status: str, result: dict[str, Any], *, in_history: bool, by: dict[str, Any]) -> RecordedCall:
        return RecordedCall(dispatch=dispatch, effect_key=effect, inherited=inherited, status=status,
                            result=result, answer_in_history=in_history, answered_by=by)

    answer = find_in_history(ranges, event_type=et.TOOL_CALL_RESULT_RECEIVED,
                             matches=[{"idempotency_key": effect}, {"effect_key": effect}])
    if answer is not None:
        # In a fork's history it is already the fork's past; a sandbox's replay records it anew.
        return found(answer.payload["status"], answer.payload["result"], in_history=inherited,
                     by={"task_id": str(answer.task_id), "seq": answer.seq})
    # Past the fork point: the source may have recorded the answer later, or a sibling fork may
    # have (its record is kept for the tool's TTL); either is the one answer the effect has.
    later = find_in_history([SeqRange(dispatch.task_id, dispatch.seq + 1, TO_HEAD)],
                            event_type=et.TOOL_CALL_RESULT_RECEIVED, matches=[{"idempotency_key": effect}])
    if later is not None:
        return found(later.payload["status"], later.payload["result"], in_history=False,
                     by={"task_id": str(later.task_id), "seq": later.seq})
    # Only real tasks' records answer an effect: a sandbox's record may hold an answer its fork
    # request made up (``tool_answers``), which is that sandbox's alone and never happened.
    record = (ToolCall.objects.filter(Q(pk=effect) | Q(effect_key=effect))
              .exclude(status=ToolCallStatus.DISPATCHED).exclude(task__sandbox=True)
              .order_by("completed_at").first())
    if record is not None and record.result is not None:
        return found(record.status, record.result, in_history=False,
                     by={"task_id": str(record.task_id), "idempotency_key": record.pk})
    return RecordedCall(dispatch=dispatch, effect_key=effect, inherited=inherited, status=None, result=None,
                        answer_in_history=False, answered_by=None)


def _sandbox_edit(task: Task, *, step: int, tool: str) -> dict[str, Any] | None:
    forked = fork_point_event(task)
    assert forked is not None  # a sandbox is a fork
    return next((answer for answer in forked.payload.get("tool_answers", [])
                 if answer["step"] == step and answer["tool"] == tool), None)


def _answer_from_record(
    task: Task, *, key: str, step: int, tool: str, recorded: RecordedCall, input: dict[str, Any],
    compensation: dict[str, Any] | None, agent: str | None, now: datetime, ttl: timedelta,
) -> ToolCall:
    """Record a fork's call of a step its record holds, without calling the tool.

    A call in the fork's history must be asked with the input it was made with (it happened;
    another input is 422, as for any key). A sandbox's call may differ from the recording's:
    the replay gets the recorded answer and its own dispatch shows what it asked, which is
    what a diff then points at. No compensation is kept on the record (no saga of the fork's
    ever undoes it): the effect is its source's, and so is undoing it. A sandbox's dispatch
    event still shows the compensation its agent asked for, as the source's did.
    """
    if recorded.inherited and recorded.dispatch is not None and recorded.dispatch.payload["input"] != input:
        raise IdempotencyMismatch(
            "this step and tool were dispatched with a different input before the fork point",
            {"idempotency_key": recorded.effect_key, "step": recorded.dispatch.payload["step"],
             "tool": recorded.dispatch.payload["tool"], "source_task_id": str(recorded.dispatch.task_id)},
        )
    answered = recorded.status is not None
    call = ToolCall.objects.create(
        idempotency_key=key,
        effect_key=recorded.effect_key,
        task=task,
        step=step,
        tool=tool,
        input=input,
        compensation=None,
        status=recorded.status or ToolCallStatus.DISPATCHED,
        result=recorded.result,
        dispatched_by=agent,
        dispatched_at=now,
        completed_at=now if answered else None,
        expires_at=now + ttl,
    )
    drafts = []
    provenance = recorded.answered_by or {}
    if not recorded.inherited:
        # A sandbox's own run: the dispatch as it asked, then the recorded answer.
        drafts.append(EventDraft(type=et.TOOL_CALL_DISPATCHED, payload={
            "idempotency_key": key, "step": call.step, "tool": call.tool, "input": input,
            "compensation": compensation, "recorded_from": provenance}))
    if answered and not recorded.answer_in_history:
        drafts.append(EventDraft(type=et.TOOL_CALL_RESULT_RECEIVED, payload={
            "idempotency_key": key, "effect_key": recorded.effect_key, "step": call.step, "tool": call.tool,
            "status": recorded.status, "result": recorded.result, "recorded_from": provenance}))
    if drafts:
        write_events(task, drafts, agent=agent, now=now)
    return call


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


