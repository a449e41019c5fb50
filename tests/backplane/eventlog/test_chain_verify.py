"""chain_verify and `manage.py verify_chain` find every kind of broken link."""

from __future__ import annotations

import io
from collections.abc import Callable

import pytest
from django.core.management import CommandError, call_command
from django.db import connection

from backplane.eventlog import services
from backplane.eventlog.chain import GENESIS_HASH, compute_hash, hashed_fields
from backplane.eventlog.models import Event, Task
from backplane.eventlog.writer import EventDraft
from backplane.integrity.verification import chain_check


def build_task(make_task: Callable[..., Task], steps: int = 4) -> Task:
    task = make_task()
    for n in range(1, steps + 1):
        services.event_append(
            namespace=task.namespace,
            task_id=task.pk,
            draft=EventDraft(type="ReasoningStepCompleted", payload={"step": n}),
            agent="qualifier-1",
        )
    task.refresh_from_db()
    return task


def as_attacker(sql: str, params: list) -> None:
    """A superuser who switches the append-only triggers off for their session."""
    with connection.cursor() as cursor:
        cursor.execute("SET session_replication_role = replica")
        try:
            cursor.execute(sql, params)
        finally:
            cursor.execute("SET session_replication_role = origin")


def test_an_untouched_chain_is_valid(make_task: Callable[..., Task]) -> None:
    task = build_task(make_task)
    result = chain_check(task=task)
    assert (result.valid, result.checked, result.first_invalid_seq, result.head_hash) == (True, 5, None, task.head_hash)


def test_it_finds_an_edited_payload(make_task: Callable[..., Task]) -> None:
    task = build_task(make_task)
    as_attacker("UPDATE backplane_event SET payload = '{\"step\": 99}' WHERE task_id = %s AND seq = 3", [task.pk])
    result = chain_check(task=task)
    assert (result.valid, result.first_invalid_seq, result.checked) == (False, 3, 2)


def test_it_finds_a_deleted_event_in_the_middle_and_at_the_end(make_task: Callable[..., Task]) -> None:
    task = build_task(make_task)
    as_attacker("DELETE FROM backplane_event WHERE task_id = %s AND seq = 3", [task.pk])
    assert chain_check(task=task).first_invalid_seq == 3

    other = build_task(make_task)
    as_attacker("DELETE FROM backplane_event WHERE task_id = %s AND seq = 5", [other.pk])
    result = chain_check(task=other)
    assert (result.valid, result.first_invalid_seq) == (False, 5)


def test_it_finds_a_rewritten_event_whose_own_hash_was_recomputed(make_task: Callable[..., Task]) -> None:
    task = build_task(make_task)
    event = Event.objects.get(task=task, seq=2)
    forged = hashed_fields(
        task_id=str(task.pk), seq=2, type=event.type, payload={"step": 42}, agent=event.agent,
        idempotency_key=None, lamport=event.lamport, causation_id=None, correlation_id=None, trace_id=None,
        recorded_at=event.recorded_at, prev_hash=event.prev_hash,
    )
    as_attacker(
        "UPDATE backplane_event SET payload = '{\"step\": 42}', hash = %s WHERE task_id = %s AND seq = 2",
        [compute_hash(forged), task.pk],
    )
    # The next event still points at the original hash.
    assert chain_check(task=task).first_invalid_seq == 3


def test_the_command_prints_a_summary_and_fails_on_a_broken_chain(make_task: Callable[..., Task]) -> None:
    good = build_task(make_task)
    out = io.StringIO()
    call_command("verify_chain", "--all", stdout=out)
    assert "verified 1 task(s), 5 event(s): 1 valid, 0 broken" in out.getvalue()

    bad = build_task(make_task)
    as_attacker("UPDATE backplane_event SET prev_hash = %s WHERE task_id = %s AND seq = 2", [GENESIS_HASH, bad.pk])
    out = io.StringIO()
    with pytest.raises(CommandError, match="1 broken chain"):
        call_command("verify_chain", "--all", stdout=out)
    assert f"BROKEN task {bad.pk}: first invalid seq 2" in out.getvalue()

    call_command("verify_chain", "--task", str(good.pk), stdout=io.StringIO())
    with pytest.raises(CommandError):
        call_command("verify_chain", "--task", str(bad.pk), stdout=io.StringIO())


def test_the_command_with_seals_checks_the_signed_head_against_the_events(make_task: Callable[..., Task]) -> None:
    from backplane.integrity import sealing

    task = build_task(make_task)
    out = io.StringIO()
    call_command("verify_chain", "--all", "--seals", stdout=out)
    assert "seals: nothing sealed yet" in out.getvalue()

    sealing.seal_new_events()
    out = io.StringIO()
    call_command("verify_chain", "--all", "--seals", stdout=out)
    assert "seals: the signed tree head of size 5 verifies against the events" in out.getvalue()

    # The payload and every hash after it rewritten: the chain verifies, the seal does not.
    as_attacker("UPDATE backplane_event SET payload = '{\"step\": 99}' WHERE task_id = %s AND seq = 5", [task.pk])
    event = Event.objects.get(task=task, seq=5)
    forged = hashed_fields(
        task_id=str(task.pk), seq=5, type=event.type, payload={"step": 99}, agent=event.agent,
        idempotency_key=None, lamport=event.lamport, causation_id=None, correlation_id=None, trace_id=None,
        recorded_at=event.recorded_at, prev_hash=event.prev_hash,
    )
    as_attacker("UPDATE backplane_event SET hash = %s WHERE task_id = %s AND seq = 5", [compute_hash(forged), task.pk])
    as_attacker("UPDATE backplane_task SET head_hash = %s WHERE id = %s", [compute_hash(forged), task.pk])
    out = io.StringIO()
    with pytest.raises(CommandError, match="signed tree head does not match"):
        call_command("verify_chain", "--all", "--seals", stdout=out)
    assert "verified 1 task(s), 5 event(s): 1 valid, 0 broken" in out.getvalue()
    assert "BROKEN seals at tree size 5" in out.getvalue()
