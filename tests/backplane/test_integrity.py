"""Periodic chain verification: incremental and full runs, alerts raised once, acknowledged once."""

from __future__ import annotations

import json
import uuid

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from prometheus_client.parser import text_string_to_metric_families

from backplane import integrity, services, tasks
from backplane.chain import compute_hash, event_hashed_fields
from backplane.errors import AlreadyDecided, InvalidInput
from backplane.models import (
    Event,
    IntegrityAlert,
    Task,
    VerificationMode,
    VerificationRun,
    VerifiedHead,
)
from backplane.selectors import chain_verify
from backplane.services import EventDraft

INCREMENTAL = VerificationMode.INCREMENTAL
FULL = VerificationMode.FULL


def append_steps(task: Task, steps: int) -> Task:
    for n in range(steps):
        services.event_append(
            namespace=task.namespace,
            task_id=task.pk,
            draft=EventDraft(type="ReasoningStepCompleted", payload={"step": n}),
            agent="qualifier-1",
        )
    task.refresh_from_db()
    return task


@pytest.fixture
def build_task(make_task):  # type: ignore[no-untyped-def]
    def build(steps: int = 4) -> Task:
        return append_steps(make_task(), steps)

    return build


def as_attacker(sql: str, params: list) -> None:  # type: ignore[type-arg]
    """A superuser who switches the append-only triggers off for their session."""
    with connection.cursor() as cursor:
        cursor.execute("SET session_replication_role = replica")
        try:
            cursor.execute(sql, params)
        finally:
            cursor.execute("SET session_replication_role = origin")


def rewrite_and_rehash(task: Task, *, from_seq: int, payload: dict) -> None:  # type: ignore[type-arg]
    """The careful attacker: edits one event and recomputes every hash after it, the task's
    head_hash included, so the chain is consistent again."""
    prev_hash = Event.objects.get(task=task, seq=from_seq).prev_hash
    for event in Event.objects.filter(task=task, seq__gte=from_seq).order_by("seq"):
        if event.seq == from_seq:
            event.payload = payload
        event.prev_hash = prev_hash
        event.hash = compute_hash(event_hashed_fields(event))
        as_attacker(
            "UPDATE backplane_event SET payload = %s, prev_hash = %s, hash = %s WHERE position = %s",
            [json.dumps(event.payload), event.prev_hash, event.hash, event.position],
        )
        prev_hash = event.hash
    as_attacker("UPDATE backplane_task SET head_hash = %s WHERE id = %s", [prev_hash, task.pk])


def run(mode: str, batch_size: int = 2) -> VerificationRun:
    """What the Celery tasks do, with a small batch so every test crosses batch boundaries."""
    verification = integrity.verification_run_start(mode=mode)
    after: uuid.UUID | None = None
    while (step := integrity.verification_run_batch(run=verification, after_task_id=after,
                                                     batch_size=batch_size)).tasks_checked:
        after = step.last_task_id
    return integrity.verification_run_finish(run_id=verification.pk)


def figures(verification: VerificationRun) -> tuple[int, int, int]:
    return verification.tasks_checked, verification.events_checked, verification.failures


def test_it_verifies_only_what_is_new_since_the_last_run(build_task) -> None:  # type: ignore[no-untyped-def]
    first, second, third = build_task(4), build_task(2), build_task(0)
    # 5 + 3 + 1 events (TaskStarted and the steps).
    assert figures(run(INCREMENTAL)) == (3, 9, 0)
    heads = {h.task_id: (h.verified_seq, h.verified_hash) for h in VerifiedHead.objects.all()}
    assert heads == {t.pk: (t.last_seq, t.head_hash) for t in (first, second, third)}

    assert figures(run(INCREMENTAL)) == (3, 0, 0)

    append_steps(first, 3)
    append_steps(third, 1)
    assert figures(run(INCREMENTAL)) == (3, 4, 0)
    assert VerifiedHead.objects.get(task=first).verified_seq == 8
    assert not IntegrityAlert.objects.exists()


def test_a_run_is_recorded_with_its_mode_and_times(build_task) -> None:  # type: ignore[no-untyped-def]
    build_task(1)
    verification = run(FULL)
    assert verification.mode == FULL and verification.finished_at is not None
    assert verification.started_at <= verification.finished_at
    assert figures(verification) == (1, 2, 0)
    with pytest.raises(InvalidInput):
        integrity.verification_run_start(mode="sometimes")


def test_an_edited_new_event_raises_an_alert_with_its_seq(build_task) -> None:  # type: ignore[no-untyped-def]
    task = build_task(2)
    run(INCREMENTAL)
    append_steps(task, 3)  # seq 4..6, not verified yet
    as_attacker("UPDATE backplane_event SET payload = '{\"step\": 99}' WHERE task_id = %s AND seq = 5", [task.pk])

    verification = run(INCREMENTAL)
    # seq 4 checked, seq 5 is the first bad one.
    assert figures(verification) == (1, 1, 1)
    alert = IntegrityAlert.objects.get()
    assert (alert.task_id, alert.first_invalid_seq, alert.run_id) == (task.pk, 5, verification.pk)
    assert alert.problem == "hash does not match the event's content" and alert.acknowledged_at is None
    # The broken task's head stays where it was verified.
    assert VerifiedHead.objects.get(task=task).verified_seq == 3


def test_the_next_run_counts_the_break_but_raises_no_second_alert(build_task) -> None:  # type: ignore[no-untyped-def]
    task = build_task(3)
    as_attacker("DELETE FROM backplane_event WHERE task_id = %s AND seq = 2", [task.pk])
    first = run(INCREMENTAL)
    second = run(INCREMENTAL)
    assert (first.failures, second.failures) == (1, 1)
    alert = IntegrityAlert.objects.get()
    assert (alert.first_invalid_seq, alert.run_id) == (2, first.pk)
    assert alert.problem == "seq 2 is missing (next stored is 3)"

    integrity.integrity_alert_acknowledge(alert_id=alert.pk, by="user:alice", note="restoring from backup")
    assert run(INCREMENTAL).failures == 1
    assert IntegrityAlert.objects.count() == 1


def test_an_edit_behind_the_verified_head_is_caught_by_the_incremental_run(build_task) -> None:  # type: ignore[no-untyped-def]
    task = build_task(4)
    run(INCREMENTAL)
    # The last verified event gets new content and a recomputed hash of its own.
    event = Event.objects.get(task=task, seq=5)
    event.payload = {"step": 42}
    as_attacker("UPDATE backplane_event SET payload = '{\"step\": 42}', hash = %s WHERE position = %s",
                [compute_hash(event_hashed_fields(event)), event.position])

    verification = run(INCREMENTAL)
    assert verification.failures == 1
    alert = IntegrityAlert.objects.get()
    assert alert.first_invalid_seq == 5
    assert alert.problem == (
        "history verified through seq 5 has changed: the task's head_hash differs from the last event's hash"
    )


def test_a_rewrite_rehashed_to_the_head_is_caught_at_the_verified_head(build_task) -> None:  # type: ignore[no-untyped-def]
    task = build_task(4)
    run(INCREMENTAL)
    rewrite_and_rehash(task, from_seq=2, payload={"step": "forged"})
    # The chain is consistent again: only the head pinned by the earlier run shows the rewrite.
    assert chain_verify(task=Task.objects.get(pk=task.pk)).valid

    run(INCREMENTAL)
    alert = IntegrityAlert.objects.get()
    assert alert.first_invalid_seq == 5
    assert "the event at seq 5 no longer carries the verified hash" in alert.problem
    # A full pass neither launders it (moving the head to the forged hash) nor raises it again.
    assert run(FULL).failures == 1
    assert VerifiedHead.objects.get(task=task).verified_hash != Task.objects.get(pk=task.pk).head_hash
    assert IntegrityAlert.objects.count() == 1


def test_deleted_verified_events_are_caught(build_task) -> None:  # type: ignore[no-untyped-def]
    task = build_task(4)
    run(INCREMENTAL)
    as_attacker("DELETE FROM backplane_event WHERE task_id = %s AND seq >= 4", [task.pk])
    as_attacker("UPDATE backplane_task SET last_seq = 3, head_hash = (SELECT hash FROM backplane_event "
                "WHERE task_id = %s AND seq = 3) WHERE id = %s", [task.pk, task.pk])
    run(INCREMENTAL)
    alert = IntegrityAlert.objects.get()
    assert alert.first_invalid_seq == 5 and "the event at seq 5 is missing" in alert.problem


def test_the_full_pass_catches_what_the_incremental_run_skips(build_task) -> None:  # type: ignore[no-untyped-def]
    good, bad = build_task(3), build_task(3)
    run(INCREMENTAL)
    # Content edited behind the head, stored hashes left alone: the links and the pinned
    # head still match, only recomputing the hash of seq 2 shows it.
    as_attacker("UPDATE backplane_event SET payload = '{\"step\": 7}' WHERE task_id = %s AND seq = 2", [bad.pk])
    assert figures(run(INCREMENTAL)) == (2, 0, 0)
    assert not IntegrityAlert.objects.exists()

    verification = run(FULL)
    assert figures(verification) == (2, 4 + 1, 1)  # all of good, seq 1 of bad
    alert = IntegrityAlert.objects.get()
    assert (alert.task_id, alert.first_invalid_seq, alert.run_id) == (bad.pk, 2, verification.pk)
    assert VerifiedHead.objects.get(task=good).verified_seq == 4


def test_the_full_pass_sets_the_heads_the_incremental_run_continues_from(build_task) -> None:  # type: ignore[no-untyped-def]
    task = build_task(2)
    assert figures(run(FULL)) == (1, 3, 0)
    append_steps(task, 1)
    assert figures(run(INCREMENTAL)) == (1, 1, 0)


def test_a_stale_task_row_is_not_a_broken_chain(build_task) -> None:  # type: ignore[no-untyped-def]
    """chain_verify reads the task row before the log; an append in between must not raise."""
    task = build_task(1)
    stale = Task.objects.get(pk=task.pk)
    head = integrity._Head(task.pk, stale.last_seq, stale.head_hash, 0, "0" * 64, None)
    append_steps(task, 1)
    assert chain_verify(task=stale).valid  # checks the log only up to the seq the task row had
    outcome = integrity._verify_full(head, stale)
    # Verified as far as the row it read; the next run picks up the rest.
    assert outcome.broken is None and outcome.verified == (2, stale.head_hash)


def test_an_alert_is_acknowledged_once(build_task) -> None:  # type: ignore[no-untyped-def]
    task = build_task(2)
    as_attacker("UPDATE backplane_event SET prev_hash = %s WHERE task_id = %s AND seq = 2", ["0" * 64, task.pk])
    run(INCREMENTAL)
    alert = IntegrityAlert.objects.get()

    with pytest.raises(InvalidInput):
        integrity.integrity_alert_acknowledge(alert_id=alert.pk, by="user:alice", note="  ")
    acknowledged = integrity.integrity_alert_acknowledge(alert_id=alert.pk, by="user:alice", note="known, restored")
    assert (acknowledged.acknowledged_by, acknowledged.note) == ("user:alice", "known, restored")
    assert acknowledged.acknowledged_at is not None
    with pytest.raises(AlreadyDecided):
        integrity.integrity_alert_acknowledge(alert_id=alert.pk, by="user:bob", note="me too")
    assert IntegrityAlert.objects.get().acknowledged_by == "user:alice"


def test_the_summary_shows_the_last_finished_runs_and_open_alerts(  # type: ignore[no-untyped-def]
    build_task, django_assert_max_num_queries
) -> None:
    tampered = build_task(1)
    build_task(1)
    as_attacker("UPDATE backplane_event SET payload = '{\"x\": 1}' WHERE task_id = %s AND seq = 2", [tampered.pk])
    run(INCREMENTAL)
    last_incremental = run(INCREMENTAL)
    last_full = run(FULL)
    integrity.verification_run_start(mode=FULL)  # still running: not the last finished one

    with django_assert_max_num_queries(4):
        summary = integrity.integrity_summary()
        assert [str(a.task) for a in summary.open_alerts]
    assert (summary.last_incremental, summary.last_full) == (last_incremental, last_full)
    assert summary.open_alert_count == 1 and summary.open_alerts[0].first_invalid_seq == 2

    integrity.integrity_alert_acknowledge(alert_id=summary.open_alerts[0].pk, by="user:alice", note="seen")
    assert integrity.integrity_summary().open_alert_count == 0


def test_metrics_report_unacknowledged_alerts(client: Client, build_task) -> None:  # type: ignore[no-untyped-def]
    task = build_task(1)
    as_attacker("DELETE FROM backplane_event WHERE task_id = %s AND seq = 2", [task.pk])
    run(INCREMENTAL)
    samples = {
        sample.name: sample.value
        for family in text_string_to_metric_families(client.get("/metrics").content.decode())
        for sample in family.samples
    }
    assert samples["backplane_integrity_alerts_unacknowledged"] == 1


def test_the_celery_tasks_run_both_modes(build_task, caplog) -> None:  # type: ignore[no-untyped-def]
    task = build_task(2)
    result = tasks.verify_chains_incremental()
    assert {k: result[k] for k in ("tasks", "events", "failures", "alerts_raised")} == {
        "tasks": 1, "events": 3, "failures": 0, "alerts_raised": 0}

    as_attacker("UPDATE backplane_event SET payload = '{\"step\": 5}' WHERE task_id = %s AND seq = 1", [task.pk])
    result = tasks.verify_chains_full()
    assert {k: result[k] for k in ("tasks", "failures", "alerts_raised")} == {"tasks": 1, "failures": 1,
                                                                            "alerts_raised": 1}
    assert VerificationRun.objects.get(pk=result["run"]).mode == FULL
    assert IntegrityAlert.objects.get().first_invalid_seq == 1
    assert "chain broken at seq 1" in caplog.text and "1 broken chain(s)" in caplog.text
    assert VerificationRun.objects.filter(finished_at__isnull=True).count() == 0


def test_the_beat_schedule_runs_both() -> None:
    from django.conf import settings

    schedule = {entry["task"]: entry["schedule"] for entry in settings.CELERY_BEAT_SCHEDULE.values()}
    assert schedule["backplane.tasks.verify_chains_incremental"] == 60.0
    assert schedule["backplane.tasks.verify_chains_full"] == 6 * 3600.0


@pytest.fixture
def operator_client(db) -> Client:  # type: ignore[no-untyped-def]
    User.objects.create_superuser("root", "", "pw-for-tests-only")
    client = Client()
    client.login(username="root", password="pw-for-tests-only")
    return client


def test_the_admin_acknowledges_with_a_note_and_changes_nothing_else(  # type: ignore[no-untyped-def]
    operator_client: Client, build_task
) -> None:
    task = build_task(1)
    as_attacker("DELETE FROM backplane_event WHERE task_id = %s AND seq = 2", [task.pk])
    run(INCREMENTAL)
    alert = IntegrityAlert.objects.get()
    changelist = "/admin/backplane/integrityalert/"
    assert operator_client.get(changelist).status_code == 200
    assert operator_client.get("/admin/backplane/verificationrun/").status_code == 200
    assert operator_client.post(f"{changelist}{alert.pk}/change/", {"note": "x"}).status_code == 403
    assert operator_client.post(f"{changelist}{alert.pk}/delete/", {"post": "yes"}).status_code == 403

    action = {"action": "acknowledge", "_selected_action": [alert.pk], "index": 0}
    operator_client.post(changelist, {**action, "note": ""})
    assert IntegrityAlert.objects.get().acknowledged_at is None
    operator_client.post(changelist, {**action, "note": "restored from backup"})
    alert.refresh_from_db()
    assert (alert.acknowledged_by, alert.note) == ("user:root", "restored from backup")
