"""Forks under real concurrent connections: one fork per id, one effect per step, one result per
adopter, whatever the interleaving."""

from __future__ import annotations

import threading
import uuid

import pytest

from backplane.eventlog import forks, services
from backplane.eventlog.errors import TaskExists
from backplane.eventlog.models import Event, Task
from backplane.eventlog.writer import EventDraft
from recovery import leases, subtasks, tool_calls
from recovery.models import ToolCall
from tests.backplane.eventlog.test_concurrent_appends import run_in_threads

pytestmark = pytest.mark.django_db(transaction=True)


def worked_task() -> Task:
    """A task that dispatched a mail and never heard back (seq 2), then failed (seq 3)."""
    task = services.task_create(namespace="acme", kind="k", input={"lead": 1}, agent="a", max_attempts=1).task
    tool_calls.tool_call_dispatch(namespace="acme", task_id=task.pk, step=1, tool="email-send", input={"to": "b"},
                                  agent="a", lease_epoch=None)
    services.event_append(namespace="acme", task_id=task.pk, agent="a",
                          draft=EventDraft(type="TaskFailed", payload={"error": "x", "retryable": False}))
    return Task.objects.get(pk=task.pk)


def test_concurrent_forks_under_one_id_make_one_fork(committed_db: None) -> None:
    source = worked_task()
    fork_id = uuid.uuid4()
    created: list[bool] = []
    lock = threading.Lock()

    def work(index: int) -> None:
        outcome = forks.task_fork(namespace="acme", source_task_id=source.pk, at_seq=2, reason="again",
                                  forked_by=f"agent-{index}", by_staff=False, task_id=fork_id)
        with lock:
            created.append(outcome.created)

    assert run_in_threads(6, work) == []
    assert sorted(created) == [False] * 5 + [True]
    assert Event.objects.filter(task_id=fork_id).count() == 2


def test_a_concurrent_fork_under_a_taken_id_is_refused(committed_db: None) -> None:
    source = worked_task()
    fork_id = uuid.uuid4()

    def work(index: int) -> None:
        forks.task_fork(namespace="acme", source_task_id=source.pk, at_seq=1 + index % 2, reason="again",
                        forked_by="a", by_staff=False, task_id=fork_id)

    errors = run_in_threads(4, work)
    # Two forks at seq 1 and two at seq 2 race: whichever lands first, the other two are refused.
    assert len(errors) == 2 and all(isinstance(e, TaskExists) for e in errors)
    assert Task.objects.filter(pk=fork_id).count() == 1


def test_racing_dispatches_of_an_inherited_step_share_the_sources_effect(committed_db: None) -> None:
    source = worked_task()
    forked = [forks.task_fork(namespace="acme", source_task_id=source.pk, at_seq=2, reason="again",
                              forked_by="a", by_staff=False).task for _ in range(3)]
    effect = tool_calls.tool_call_key(task_id=source.pk, step=1, tool="email-send")
    answers: list[str] = []
    lock = threading.Lock()

    def work(index: int) -> None:
        call = tool_calls.tool_call_dispatch(namespace="acme", task_id=forked[index % 3].pk, step=1,
                                             tool="email-send", input={"to": "b"}, agent="a", lease_epoch=None).call
        with lock:
            answers.append(call.effect_key)

    assert run_in_threads(9, work) == []
    assert answers == [effect] * 9
    # One record per fork, each under its own key, all naming the source's effect; no new dispatch.
    assert ToolCall.objects.filter(effect_key=effect).exclude(pk=effect).count() == 3
    assert Event.objects.filter(task__in=forked, type="ToolCallDispatched").count() == 0


def test_a_child_finishing_while_a_fork_adopts_it_reports_to_the_fork_once(committed_db: None) -> None:
    agent = services.agent_create(name="r", namespace="acme").agent
    for round_ in range(6):
        parent = services.task_create(namespace="acme", kind="plan", input={"round": round_}, agent="a").task
        child = subtasks.subtask_dispatch(namespace="acme", parent_task_id=parent.pk, step=1, kind="research",
                                          input={"n": round_}, agent="a", lease_epoch=None).child
        claim = leases.lease_claim(agent=agent, kinds=None, lease_seconds=60, task_id=child.pk)
        assert claim is not None
        at = Task.objects.get(pk=parent.pk).last_seq
        fork = forks.task_fork(namespace="acme", source_task_id=parent.pk, at_seq=at, reason="again",
                               forked_by="a", by_staff=False).task

        def work(index: int, fork: Task = fork, child: Task = child, epoch: int = claim.lease_epoch,
                 n: int = round_) -> None:
            if index == 0:
                services.event_append(namespace="acme", task_id=child.pk, agent="r", lease_epoch=epoch,
                                      draft=EventDraft(type="TaskCompleted", payload={"output": {"ok": 1}}))
            else:
                subtasks.subtask_dispatch(namespace="acme", parent_task_id=fork.pk, step=1, kind="research",
                                          input={"n": n}, agent="a", lease_epoch=None)

        assert run_in_threads(2, work) == []
        heard = Event.objects.filter(task=fork, type="SubAgentResultReceived", payload__child_task_id=str(child.pk))
        assert heard.count() == 1, round_
        assert Event.objects.filter(task=parent, type="SubAgentResultReceived").count() == 1
