"""Recovery's follow-ups to event writes, plugged into the event log's writer.

``RecoveryConfig.ready`` registers them with ``backplane.eventlog.writer.register_follow_up``;
the writer runs those a write concerns in this order inside its transaction, after the events
and the projection are in. They may lock more rows: the agent behind a completion or failure, a
sub-task's parent. Each one's ``concerns`` reads the write alone: a write that concerns none is
quiet, and an agent's quiet write is made on the event loop (eventlog/async_services.py).
"""

from __future__ import annotations

from typing import Any

import psycopg

from backplane.eventlog import event_types as et
from backplane.eventlog.models import Task, TaskStatus
from backplane.eventlog.writer import FollowUp, WrittenEvents, write_events
from recovery.breakers import AGENT_BREAKER_BUSY_SQL, breaker_record_failure, breaker_record_success
from recovery.sagas import saga_start_if_due
from recovery.subtasks import adopters_of, child_result_draft


def _breakers_concerned(written: WrittenEvents) -> bool:
    # A sandbox's (a replay's) end says nothing about the agent's production work.
    return not written.task.sandbox and any(event.type in (et.TASK_COMPLETED, et.TASK_FAILED)
                                            for event in written.events)


async def breakers_idle_async(conn: psycopg.AsyncConnection[Any], written: WrittenEvents) -> bool:
    """Whether ``feed_agent_breakers`` has nothing to do for the write: completions only, by
    agents whose breakers are closed with no failure counted (``breaker_count_success`` would
    match no row). A failure is always counted."""
    if any(event.type == et.TASK_FAILED for event in written.events):
        return False
    for agent in {event.agent for event in written.events if event.type == et.TASK_COMPLETED and event.agent}:
        busy = await conn.execute(AGENT_BREAKER_BUSY_SQL, [written.task.namespace, agent])
        if await busy.fetchone() is not None:
            return False
    return True


def feed_agent_breakers(written: WrittenEvents) -> None:
    """Completions and failures count towards the circuit breaker of the agent behind them.

    Expired leases count too, but the stall detector records those itself, once per agent
    per sweep and in id order, so concurrent sweeps cannot deadlock on agent rows."""
    task = written.task
    for event in written.events:
        if event.type == et.TASK_COMPLETED:
            breaker_record_success(namespace=task.namespace, agent_name=event.agent, task_id=task.pk,
                                   now=written.now)
        elif event.type == et.TASK_FAILED:
            breaker_record_failure(namespace=task.namespace, agent_name=event.agent, task_id=task.pk,
                                   now=written.now, reason=f"TaskFailed: {event.payload['error'][:200]}")


def _saga_due(written: WrittenEvents) -> bool:
    """A task that has just failed for good compensates what its tool calls did; so does one
    just cancelled by someone who asked for it (``TaskCancelled`` with ``compensate``)."""
    if written.previous_status != TaskStatus.FAILED and written.status == TaskStatus.FAILED:
        return True
    return written.was_open and written.status == TaskStatus.CANCELLED and any(
        event.type == et.TASK_CANCELLED and event.payload.get("compensate") for event in written.events)


def start_saga(written: WrittenEvents) -> None:
    saga_start_if_due(written.task, now=written.now)


# A child task in one of these has a result its parent must hear about.
REPORTED_TO_PARENT = frozenset({TaskStatus.COMPLETED, TaskStatus.FAILED, TaskStatus.DEAD_LETTERED,
                                TaskStatus.CANCELLED})


def _parent_concerned(written: WrittenEvents) -> bool:
    return written.was_open and written.status in REPORTED_TO_PARENT and written.task.parent_id is not None


def report_to_parent(written: WrittenEvents) -> None:
    """Two-phase hand-off, second phase: the child's result enters the parent's log in the
    transaction that ends the child, so it cannot be lost between the two.

    Lock order is always child, then parent (claims and completions); a dispatch locks
    only the parent and creates the child, which nobody else can hold yet.
    """
    child = written.task
    assert child.parent_id is not None  # _parent_concerned
    # What the child's final event made of it, even if its saga has begun since.
    result = child_result_draft(child, status=written.status)
    # A parent that already finished still gets the record: nothing is dropped.
    write_events(Task.objects.select_for_update().get(pk=child.parent_id), [result], agent=None, now=written.now,
                 allow_closed=True)
    # Then the forks of the parent that adopted the child (recovery/subtasks.py), locked in id order.
    for adopter in adopters_of(child):
        write_events(Task.objects.get(pk=adopter), [result], agent=None, now=written.now, allow_closed=True)


FOLLOW_UPS = (
    FollowUp(concerns=_breakers_concerned, run=feed_agent_breakers, idle_async=breakers_idle_async),
    FollowUp(concerns=_saga_due, run=start_saga),
    FollowUp(concerns=_parent_concerned, run=report_to_parent),
)
