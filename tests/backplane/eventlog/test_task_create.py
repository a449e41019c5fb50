"""Creating tasks: TaskStarted as seq 1, idempotent on task_id, even under a race."""

from __future__ import annotations

import threading
import uuid

import pytest
from django.db import connection

from backplane.eventlog import services
from backplane.eventlog.errors import InvalidInput, TaskExists
from backplane.eventlog.models import Event, Task


def create(**kwargs):  # type: ignore[no-untyped-def]
    kwargs.setdefault("namespace", "acme")
    kwargs.setdefault("kind", "lead-qualification")
    kwargs.setdefault("input", {"lead": "alice"})
    return services.task_create(agent="planner", **kwargs)


def test_it_creates_a_pending_task_with_its_first_event(db: None) -> None:
    outcome = create(max_attempts=5, metadata={"source": "crm"})
    task = outcome.task
    assert outcome.created
    assert (task.status, task.attempts, task.max_attempts, task.last_seq) == ("pending", 0, 5, 1)
    started = Event.objects.get(task=task)
    assert started.payload == {
        "kind": "lead-qualification",
        "input": {"lead": "alice"},
        "parent_task_id": None,
        "max_attempts": 5,
        "metadata": {"source": "crm"},
    }
    assert started.agent == "planner"


def test_it_returns_the_same_task_for_the_same_id_and_content(db: None, task_id: uuid.UUID) -> None:
    first = create(task_id=task_id)
    second = create(task_id=task_id)
    assert not second.created and second.task.pk == first.task.pk
    assert Event.objects.filter(task_id=task_id).count() == 1


def test_it_refuses_the_same_id_with_other_content(db: None, task_id: uuid.UUID) -> None:
    create(task_id=task_id)
    with pytest.raises(TaskExists):
        create(task_id=task_id, input={"lead": "bob"})
    with pytest.raises(TaskExists):
        create(task_id=task_id, kind="other")
    assert Event.objects.filter(task_id=task_id).count() == 1


def test_it_refuses_a_parent_from_another_namespace(db: None) -> None:
    parent = create(namespace="globex").task
    with pytest.raises(InvalidInput):
        create(parent_task_id=parent.pk)
    assert create(namespace="globex", parent_task_id=parent.pk).task.parent_id == parent.pk


@pytest.mark.django_db(transaction=True)
def test_concurrent_creates_of_one_id_make_one_task(committed_db: None, task_id: uuid.UUID) -> None:
    outcomes, errors = [], []
    barrier = threading.Barrier(8)

    def worker() -> None:
        try:
            barrier.wait()
            outcomes.append(create(task_id=task_id))
        except Exception as exc:  # noqa: BLE001 - collected and asserted below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert sum(o.created for o in outcomes) == 1
    assert Task.objects.filter(pk=task_id).count() == 1
    assert Event.objects.filter(task_id=task_id).count() == 1
