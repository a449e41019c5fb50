"""The log is the truth: every kind of transition a task can go through is an event, and after
all of them every task's row is exactly what its log replays to (``rebuild_projections --check``).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.test import override_settings
from django.utils import timezone

from backplane.delivery import relay
from backplane.delivery.models import DeadLetter, OutboxMessage
from backplane.eventlog import event_types as et
from backplane.eventlog import services
from backplane.eventlog.models import Agent, Event, Task
from backplane.eventlog.writer import EventDraft, OutboxDraft
from recovery import dead_letters, detector, leases, subtasks, tool_calls
from recovery.models import ToolCall
from tests.conftest import check_projections

pytestmark = pytest.mark.django_db


def types_of(task_id: Any) -> list[str]:
    return list(Event.objects.filter(task_id=task_id).order_by("seq").values_list("type", flat=True))


def status_of(task_id: Any) -> str:
    return Task.objects.get(pk=task_id).status


def expire_lease(task_id: Any) -> None:
    # Only the deadline is moved, as time passing would; the stall detector does the rest.
    Task.objects.filter(pk=task_id).update(lease_expires_at=timezone.now() - timedelta(seconds=1))


def append(task: Task, type_: str, payload: dict[str, Any], *, epoch: int | None = None, **extra: Any) -> None:
    services.event_append(namespace="acme", task_id=task.pk, draft=EventDraft(type=type_, payload=payload, **extra),
                          agent="worker", lease_epoch=epoch)


@pytest.fixture
def worker(db: None) -> Agent:
    return services.agent_create(name="worker", namespace="acme").agent


def create(kind: str = "job", **kwargs: Any) -> Task:
    return services.task_create(namespace="acme", kind=kind, input={"n": 1}, agent="planner", **kwargs).task


def claim(worker: Agent, kind: str = "job") -> leases.Claim:
    got = leases.lease_claim(agent=worker, kinds=[kind], lease_seconds=30)
    assert got is not None
    return got


def dispatch_and_succeed(task: Task, epoch: int | None, step: int, tool: str) -> None:
    call = tool_calls.tool_call_dispatch(
        namespace="acme", task_id=task.pk, step=step, tool=tool, input={"step": step}, agent="worker",
        lease_epoch=epoch, compensation={"tool": f"undo-{tool}", "input": {"step": step}},
    ).call
    tool_calls.tool_call_record_result(namespace="acme", key=call.pk, status="succeeded", result={"ok": step},
                                       agent="worker", lease_epoch=epoch)


def latest_compensation_key(task: Task) -> str:
    event = Event.objects.filter(task=task, type=et.COMPENSATION_REQUESTED).order_by("-seq").first()
    assert event is not None
    return str(event.payload["compensation_key"])


def answer_compensation(task: Task, status: str) -> None:
    tool_calls.tool_call_record_result(namespace="acme", key=latest_compensation_key(task), status=status,
                                       result={"status": status}, agent="undoer", lease_epoch=None)


def fail_for_good_with_two_compensations(worker: Agent, kind: str) -> Task:
    task = create(kind)
    lease = claim(worker, kind)
    dispatch_and_succeed(task, lease.lease_epoch, 1, "reserve")
    dispatch_and_succeed(task, lease.lease_epoch, 2, "charge")
    append(task, et.TASK_FAILED, {"error": "declined", "retryable": False}, epoch=lease.lease_epoch)
    assert status_of(task.pk) == "compensating"
    return task


# One worker goes through every scenario, stalls and failures included: its circuit breaker
# must not open part-way (breakers have tests of their own).
@override_settings(BACKPLANE_OUTBOX_MAX_ATTEMPTS=1, BACKPLANE_BREAKER_THRESHOLD=1000)
def test_every_kind_of_transition_leaves_every_row_equal_to_its_replayed_log(worker: Agent) -> None:
    # Claim, heartbeat, release.
    released = create("release")
    lease = claim(worker, "release")
    leases.lease_heartbeat(namespace="acme", task_id=released.pk, lease_epoch=lease.lease_epoch, agent=worker.name)
    leases.lease_release(namespace="acme", task_id=released.pk, lease_epoch=lease.lease_epoch, agent=worker.name)
    assert types_of(released.pk) == [et.TASK_STARTED, et.TASK_CLAIMED, et.LEASE_RELEASED]
    assert status_of(released.pk) == "pending"

    # A heartbeat alone moves the deadline: not an event, and not drift.
    beating = create("beat")
    lease = claim(worker, "beat")
    before = Task.objects.get(pk=beating.pk).lease_expires_at
    leases.lease_heartbeat(namespace="acme", task_id=beating.pk, lease_epoch=lease.lease_epoch, agent=worker.name)
    after = Task.objects.get(pk=beating.pk).lease_expires_at
    assert before is not None and after is not None and after > before
    assert types_of(beating.pk) == [et.TASK_STARTED, et.TASK_CLAIMED]

    # Stall, then fail and retry, then complete.
    finished = create("finish")
    claim(worker, "finish")
    expire_lease(finished.pk)
    detector.lease_expire_stalled()
    lease = claim(worker, "finish")
    append(finished, et.TASK_FAILED, {"error": "flaky", "retryable": True}, epoch=lease.lease_epoch)
    assert status_of(finished.pk) == "pending"
    lease = claim(worker, "finish")
    append(finished, et.TASK_COMPLETED, {"output": {"done": True}}, epoch=lease.lease_epoch)
    assert types_of(finished.pk)[1:] == [et.TASK_CLAIMED, et.TASK_STALLED, et.TASK_CLAIMED, et.TASK_FAILED,
                                         et.TASK_CLAIMED, et.TASK_COMPLETED]
    row = Task.objects.get(pk=finished.pk)
    assert (row.status, row.attempts, row.output, row.lease_holder) == ("completed", 2, {"done": True}, None)

    # Dead-lettered, then requeued by a reviewer: back to pending with fresh attempts.
    requeued = create("requeue", max_attempts=1)
    claim(worker, "requeue")
    expire_lease(requeued.pk)
    detector.lease_expire_stalled()
    assert status_of(requeued.pk) == "dead_lettered"
    dead_letters.dead_letter_requeue(dead_letter_id=DeadLetter.objects.get(task=requeued).pk,
                                     decided_by="user:olga", reason="the partner API is back")
    row = Task.objects.get(pk=requeued.pk)
    assert (row.status, row.attempts) == ("pending", 0)
    requeue = Event.objects.get(task=requeued, type=et.DEAD_LETTER_REQUEUED)
    assert (requeue.payload["decided_by"], requeue.payload["reason"]) == ("user:olga", "the partner API is back")

    # Dead-lettered, then discarded: stays dead-lettered, the decision on record.
    discarded = create("discard", max_attempts=1)
    claim(worker, "discard")
    expire_lease(discarded.pk)
    detector.lease_expire_stalled()
    dead_letters.dead_letter_discard(dead_letter_id=DeadLetter.objects.get(task=discarded).pk,
                                     decided_by="user:olga", reason="duplicate lead")
    assert status_of(discarded.pk) == "dead_lettered"
    assert types_of(discarded.pk)[-1] == et.DEAD_LETTER_DISCARDED

    # An outbox message that died, edited and requeued: the task's log records the decision
    # and the edited copy; the task itself does not change.
    noisy = create("notify")
    append(noisy, "LeadScored", {"score": 7}, outbox=(OutboxDraft(topic="crm.score", payload={"score": 7}),))

    def refuse(message: OutboxMessage, envelope: dict[str, Any]) -> None:
        # Only the CRM's topic: under strict ordering a dead lifecycle message of the same task
        # would hold its key, and the CRM message would wait behind it instead of failing.
        if message.topic == "crm.score":
            raise relay.PublishError("crm is down")

    while relay.outbox_relay_once(publish=refuse).claimed:
        pass
    dead = DeadLetter.objects.get(source="outbox", topic="crm.score")
    dead_letters.dead_letter_requeue(dead_letter_id=dead.pk, decided_by="user:olga", reason="fixed the score",
                                     payload={"score": 8})
    edit = Event.objects.get(task=noisy, type=et.DEAD_LETTER_REQUEUED)
    assert edit.payload["edited_payload"] is True and edit.payload["payload"] == {"score": 8}
    assert edit.payload["original_payload"] == {"score": 7}
    assert dead.outbox_message_id is not None
    assert OutboxMessage.objects.get(pk=dead.outbox_message_id).payload == {"score": 8}
    assert status_of(noisy.pk) == "pending"

    # Sub-task hand-off: dispatched, accepted when claimed, the result in the parent's log.
    parent = create("orchestrate")
    parent_lease = claim(worker, "orchestrate")
    child = subtasks.subtask_dispatch(namespace="acme", parent_task_id=parent.pk, step=1, kind="research",
                                      input={"q": "x"}, agent="worker", lease_epoch=parent_lease.lease_epoch).child
    child_lease = claim(worker, "research")
    services.event_append(namespace="acme", task_id=child.pk,
                          draft=EventDraft(type=et.TASK_COMPLETED, payload={"output": {"a": 1}}),
                          agent="worker", lease_epoch=child_lease.lease_epoch)
    assert types_of(parent.pk)[-3:] == [et.SUB_AGENT_DISPATCHED, et.SUB_AGENT_ACCEPTED, et.SUB_AGENT_RESULT_RECEIVED]

    # Saga: every compensation succeeds.
    saga = fail_for_good_with_two_compensations(worker, "saga-ok")
    answer_compensation(saga, "succeeded")
    answer_compensation(saga, "succeeded")
    assert status_of(saga.pk) == "compensated"
    assert types_of(saga.pk)[-7:] == [
        et.TASK_FAILED, et.COMPENSATION_STARTED, et.COMPENSATION_REQUESTED, et.COMPENSATION_COMPLETED,
        et.COMPENSATION_REQUESTED, et.COMPENSATION_COMPLETED, et.TASK_COMPENSATED,
    ]

    # Saga: a compensation fails, a reviewer requeues it, then it succeeds.
    retried = fail_for_good_with_two_compensations(worker, "saga-retry")
    answer_compensation(retried, "failed")
    dead_letters.dead_letter_requeue(dead_letter_id=DeadLetter.objects.get(task=retried, source="compensation").pk,
                                     decided_by="user:olga", reason="retry the refund")
    answer_compensation(retried, "succeeded")
    answer_compensation(retried, "succeeded")
    assert status_of(retried.pk) == "compensated"

    # Saga: a compensation fails and a reviewer discards it: the saga goes on and ends,
    # naming what was skipped.
    skipped = fail_for_good_with_two_compensations(worker, "saga-skip")
    skipped_key = latest_compensation_key(skipped)
    answer_compensation(skipped, "failed")
    dead_letters.dead_letter_discard(dead_letter_id=DeadLetter.objects.get(task=skipped, source="compensation").pk,
                                     decided_by="user:olga", reason="the room was never booked")
    answer_compensation(skipped, "succeeded")
    assert status_of(skipped.pk) == "compensated"
    assert Event.objects.get(task=skipped, type=et.TASK_COMPENSATED).payload["skipped"] == [skipped_key]

    # Saga from a reviewer's decision: a dead-lettered task discarded with compensate.
    by_reviewer = create("saga-review", max_attempts=1)
    lease = claim(worker, "saga-review")
    dispatch_and_succeed(by_reviewer, lease.lease_epoch, 1, "reserve")
    expire_lease(by_reviewer.pk)
    detector.lease_expire_stalled()
    dead_letters.dead_letter_discard(dead_letter_id=DeadLetter.objects.get(task=by_reviewer).pk,
                                     decided_by="user:olga", reason="undo it", compensate=True)
    assert status_of(by_reviewer.pk) == "compensating"
    answer_compensation(by_reviewer, "succeeded")
    assert status_of(by_reviewer.pk) == "compensated"

    # A failure with nothing to compensate just fails.
    plain = create("plain-fail")
    lease = claim(worker, "plain-fail")
    append(plain, et.TASK_FAILED, {"error": "bad input", "retryable": False}, epoch=lease.lease_epoch)
    assert status_of(plain.pk) == "failed"

    assert ToolCall.objects.filter(compensation_of__isnull=False).count() >= 7
    code, report = check_projections()
    assert code == 0, report


def test_a_row_edited_behind_the_logs_back_is_reported(worker: Agent) -> None:
    honest, edited = create("a"), create("b")
    claim(worker, "b")
    Task.objects.filter(pk=edited.pk).update(status="completed", attempts=5)

    code, report = check_projections()

    assert code == 1
    assert str(edited.pk) in report and str(honest.pk) not in report
    assert "status" in report and "attempts" in report
