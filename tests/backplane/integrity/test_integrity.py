"""Periodic chain verification: incremental and full runs, alerts raised once, acknowledged once."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from prometheus_client.parser import text_string_to_metric_families
from pytest_django import DjangoAssertNumQueries

from backplane.celery import app as celery_app
from backplane.eventlog import services
from backplane.eventlog.chain import compute_hash, event_hashed_fields
from backplane.eventlog.errors import AlreadyDecided, InvalidInput
from backplane.eventlog.models import Event, Task
from backplane.eventlog.reducer import task_state_as_json, task_state_from_json, task_state_of
from backplane.eventlog.writer import EventDraft
from backplane.integrity import tasks as integrity_tasks
from backplane.integrity import verification as integrity
from backplane.integrity.models import (
    IntegrityAlert,
    IntegrityAlertKind,
    VerificationMode,
    VerificationRun,
    VerifiedHead,
)
from backplane.integrity.verification import chain_check
from tests.conftest import celery_messages_taken

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


def as_attacker(sql: str, params: list) -> None:
    """A superuser who switches the append-only triggers off for their session."""
    with connection.cursor() as cursor:
        cursor.execute("SET session_replication_role = replica")
        try:
            cursor.execute(sql, params)
        finally:
            cursor.execute("SET session_replication_role = origin")


def rewrite_and_rehash(task: Task, *, from_seq: int, payload: dict) -> None:
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


def test_it_verifies_only_what_is_new_since_the_last_run(build_task: Callable[..., Task]) -> None:
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


def test_a_run_is_recorded_with_its_mode_and_times(build_task: Callable[..., Task]) -> None:
    build_task(1)
    verification = run(FULL)
    assert verification.mode == FULL and verification.finished_at is not None
    assert verification.started_at <= verification.finished_at
    assert figures(verification) == (1, 2, 0)
    with pytest.raises(InvalidInput):
        integrity.verification_run_start(mode="sometimes")


def test_an_edited_new_event_raises_an_alert_with_its_seq(build_task: Callable[..., Task]) -> None:
    task = build_task(2)
    run(INCREMENTAL)
    append_steps(task, 3)  # seq 4..6, not verified yet
    as_attacker("UPDATE backplane_event SET payload = '{\"step\": 99}' WHERE task_id = %s AND seq = 5", [task.pk])

    verification = run(INCREMENTAL)
    # seq 4 checked, seq 5 is the first bad one.
    assert figures(verification) == (1, 1, 1)
    alert = IntegrityAlert.objects.get()
    assert (alert.task_id, alert.kind, alert.first_invalid_seq, alert.run_id) == (
        task.pk, IntegrityAlertKind.CHAIN, 5, verification.pk)
    assert alert.problem == "hash does not match the event's content" and alert.acknowledged_at is None
    # The broken task's head stays where it was verified.
    assert VerifiedHead.objects.get(task=task).verified_seq == 3


def test_the_next_run_counts_the_break_but_raises_no_second_alert(build_task: Callable[..., Task]) -> None:
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


def test_an_edit_behind_the_verified_head_is_caught_by_the_incremental_run(build_task: Callable[..., Task]) -> None:
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


def test_a_rewrite_rehashed_to_the_head_is_caught_at_the_verified_head(build_task: Callable[..., Task]) -> None:
    task = build_task(4)
    run(INCREMENTAL)
    rewrite_and_rehash(task, from_seq=2, payload={"step": "forged"})
    # The chain is consistent again: only the head pinned by the earlier run shows the rewrite.
    assert chain_check(task=Task.objects.get(pk=task.pk)).valid

    run(INCREMENTAL)
    alert = IntegrityAlert.objects.get()
    assert alert.first_invalid_seq == 5
    assert "the event at seq 5 no longer carries the verified hash" in alert.problem
    # A full pass neither launders it (moving the head to the forged hash) nor raises it again.
    assert run(FULL).failures == 1
    assert VerifiedHead.objects.get(task=task).verified_hash != Task.objects.get(pk=task.pk).head_hash
    assert IntegrityAlert.objects.count() == 1


def test_deleted_verified_events_are_caught(build_task: Callable[..., Task]) -> None:
    task = build_task(4)
    run(INCREMENTAL)
    as_attacker("DELETE FROM backplane_event WHERE task_id = %s AND seq >= 4", [task.pk])
    as_attacker("UPDATE backplane_task SET last_seq = 3, head_hash = (SELECT hash FROM backplane_event "
                "WHERE task_id = %s AND seq = 3) WHERE id = %s", [task.pk, task.pk])
    run(INCREMENTAL)
    alert = IntegrityAlert.objects.get()
    assert alert.first_invalid_seq == 5 and "the event at seq 5 is missing" in alert.problem


def test_the_full_pass_catches_what_the_incremental_run_skips(build_task: Callable[..., Task]) -> None:
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


def test_the_full_pass_sets_the_heads_the_incremental_run_continues_from(build_task: Callable[..., Task]) -> None:
    task = build_task(2)
    assert figures(run(FULL)) == (1, 3, 0)
    append_steps(task, 1)
    assert figures(run(INCREMENTAL)) == (1, 1, 0)


def test_a_stale_task_row_is_not_a_broken_chain(build_task: Callable[..., Task]) -> None:
    """chain_verify reads the task row before the log; an append in between must not raise."""
    task = build_task(1)
    stale = Task.objects.get(pk=task.pk)
    head = integrity._Head(task.pk, task_state_of(stale), 0, "0" * 64, None)
    append_steps(task, 1)
    assert chain_check(task=stale).valid  # checks the log only up to the seq the task row had
    outcome = integrity._verify_full(head)
    # Verified as far as the row it read, and that row is its log's projection there; the
    # next run picks up the rest.
    assert outcome.broken is None and outcome.verified == (2, stale.head_hash)
    assert outcome.drifted is None and outcome.checkpoint == task_state_of(stale)


def test_an_alert_is_acknowledged_once(build_task: Callable[..., Task]) -> None:
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


def test_the_summary_shows_the_last_finished_runs_and_open_alerts(
    build_task: Callable[..., Task], django_assert_max_num_queries: DjangoAssertNumQueries
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


def test_metrics_report_unacknowledged_alerts(client: Client, build_task: Callable[..., Task]) -> None:
    task = build_task(1)
    as_attacker("DELETE FROM backplane_event WHERE task_id = %s AND seq = 2", [task.pk])
    run(INCREMENTAL)
    samples = {
        sample.name: sample.value
        for family in text_string_to_metric_families(client.get("/metrics").content.decode())
        for sample in family.samples
    }
    assert samples["backplane_integrity_alerts_unacknowledged"] == 1


def test_the_celery_tasks_run_both_modes(build_task: Callable[..., Task], caplog: pytest.LogCaptureFixture) -> None:
    task = build_task(2)
    result = integrity_tasks.verify_chains_incremental()
    assert {k: result[k] for k in ("tasks", "events", "failures", "alerts_raised")} == {
        "tasks": 1, "events": 3, "failures": 0, "alerts_raised": 0}

    as_attacker("UPDATE backplane_event SET payload = '{\"step\": 5}' WHERE task_id = %s AND seq = 1", [task.pk])
    result = integrity_tasks.verify_chains_full()
    assert {k: result[k] for k in ("tasks", "failures", "alerts_raised")} == {"tasks": 1, "failures": 1,
                                                                            "alerts_raised": 1}
    assert VerificationRun.objects.get(pk=result["run"]).mode == FULL
    assert IntegrityAlert.objects.get().first_invalid_seq == 1
    assert "chain broken at seq 1" in caplog.text and (
        "1 task(s) with a broken chain or a row that differs from its log" in caplog.text)
    assert VerificationRun.objects.filter(finished_at__isnull=True).count() == 0


def test_a_requested_full_run_is_queued_by_the_task_s_name(
    db: None, django_capture_on_commit_callbacks: Callable[..., Any]
) -> None:
    # verification.py enqueues it by its wire name (it cannot import the task module, which
    # imports it): a name the worker does not know would leave the run queued for ever.
    with django_capture_on_commit_callbacks(execute=True):
        run = integrity.verification_run_request_full(requested_by="rita")
    assert (integrity.VERIFY_CHAINS_REQUESTED, [run.pk]) in celery_messages_taken()
    assert celery_app.tasks[integrity.VERIFY_CHAINS_REQUESTED].run is integrity_tasks.verify_chains_requested.run


def test_the_beat_schedule_runs_both() -> None:
    from django.conf import settings

    schedule = {entry["task"]: entry["schedule"] for entry in settings.CELERY_BEAT_SCHEDULE.values()}
    assert schedule["backplane.tasks.verify_chains_incremental"] == 60.0
    assert schedule["backplane.tasks.verify_chains_full"] == 6 * 3600.0


@pytest.fixture
def operator_client(db: None) -> Client:
    client = Client()
    # force_login: the login check (django-axes) needs a request, which Client.login() does not pass.
    client.force_login(User.objects.create_superuser("root", "", "pw-for-tests-only"))
    return client


def test_the_admin_acknowledges_with_a_note_and_changes_nothing_else(
    operator_client: Client, build_task: Callable[..., Task]
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


# --- the row against its log ---------------------------------------------------------------------


def checkpoint_of(task: Task) -> dict:
    projection = VerifiedHead.objects.get(task=task).projection
    assert projection is not None
    return projection


def test_a_tampered_row_of_a_touched_task_raises_one_projection_alert(build_task: Callable[..., Task]) -> None:
    touched, untouched = build_task(2), build_task(2)
    run(INCREMENTAL)
    append_steps(touched, 2)  # seq 4, 5
    # A plain UPDATE of the rows, behind their logs' back; the chains stay intact.
    Task.objects.filter(pk__in=[touched.pk, untouched.pk]).update(status="completed")

    verification = run(INCREMENTAL)
    # Only the touched task is compared: 2 new events, 1 finding.
    assert figures(verification) == (2, 2, 1)
    alert = IntegrityAlert.objects.get()
    assert (alert.task_id, alert.kind, alert.first_invalid_seq, alert.run_id) == (
        touched.pk, IntegrityAlertKind.PROJECTION, 5, verification.pk)
    assert alert.problem == "status: row 'completed', log 'pending'"
    assert str(alert) == f"{touched.pk} row differs from its log at seq 5 (open)"
    # The chain is fine: its head moves, and the checkpoint is what the log says, not the row.
    head = VerifiedHead.objects.get(task=touched)
    assert (head.verified_seq, head.verified_hash) == (5, touched.head_hash)
    assert task_state_from_json(checkpoint_of(touched)) == task_state_of(touched)

    # Nothing new since: the next incremental run compares nothing and raises nothing.
    assert figures(run(INCREMENTAL)) == (2, 0, 0)
    # A full pass compares every row: the same finding is counted, not raised again.
    assert figures(run(FULL))[2] == 2
    assert figures(run(FULL))[2] == 2
    alerts = IntegrityAlert.objects.order_by("task_id")
    assert {(a.task_id, a.kind, a.first_invalid_seq) for a in alerts} == {
        (touched.pk, IntegrityAlertKind.PROJECTION, 5), (untouched.pk, IntegrityAlertKind.PROJECTION, 3)}


def test_a_chain_break_and_a_row_finding_at_the_same_seq_are_two_alerts(build_task: Callable[..., Task]) -> None:
    task = build_task(2)
    Task.objects.filter(pk=task.pk).update(attempts=1)
    assert figures(run(FULL)) == (1, 3, 1)
    as_attacker("UPDATE backplane_task SET head_hash = %s WHERE id = %s", ["f" * 64, task.pk])
    assert run(FULL).failures == 1
    assert sorted(IntegrityAlert.objects.values_list("kind", "first_invalid_seq")) == [
        (IntegrityAlertKind.CHAIN, 3), (IntegrityAlertKind.PROJECTION, 3)]


def test_the_next_incremental_run_folds_only_new_events_onto_the_checkpoint(build_task: Callable[..., Task]) -> None:
    task = build_task(3)
    run(INCREMENTAL)
    assert checkpoint_of(task) == task_state_as_json(task_state_of(task))

    # Plant a checkpoint no replay from seq 1 would give: if the next run folds the new
    # events onto it (and nothing before), the planted value reaches the comparison.
    VerifiedHead.objects.filter(task=task).update(projection={**checkpoint_of(task), "max_attempts": 9})
    task = append_steps(task, 2)
    verification = run(INCREMENTAL)
    assert figures(verification) == (1, 2, 1)
    alert = IntegrityAlert.objects.get()
    assert (alert.first_invalid_seq, alert.problem) == (6, "max_attempts: row 3, log 9")
    assert checkpoint_of(task) == {**task_state_as_json(task_state_of(task)), "max_attempts": 9}

    # A full run replays from scratch: the planted value is gone and the row is fine.
    assert run(FULL).failures == 0
    assert checkpoint_of(task) == task_state_as_json(task_state_of(task))


def test_a_head_verified_before_checkpoints_replays_its_task_once(build_task: Callable[..., Task]) -> None:
    task = build_task(3)
    run(INCREMENTAL)
    VerifiedHead.objects.filter(task=task).update(projection=None)
    assert figures(run(INCREMENTAL)) == (1, 0, 0)  # untouched: nothing to compare yet

    task = append_steps(task, 1)
    assert figures(run(INCREMENTAL)) == (1, 1, 0)  # the chain from the head; the projection from seq 1
    assert checkpoint_of(task) == task_state_as_json(task_state_of(task))


def test_transitions_and_a_heartbeat_extended_lease_are_checked_without_findings(
    make_task: Callable[..., Task],
) -> None:
    from recovery import leases

    worker = services.agent_create(name="qualifier-1", namespace="acme").agent
    task = make_task()
    run(INCREMENTAL)
    claim = leases.lease_claim(agent=worker, kinds=None, lease_seconds=30)
    assert claim is not None
    leases.lease_heartbeat(namespace="acme", task_id=task.pk, lease_epoch=claim.lease_epoch, agent=worker.name)
    assert figures(run(INCREMENTAL)) == (1, 1, 0)
    checkpoint = task_state_from_json(checkpoint_of(task))
    assert (checkpoint.status, checkpoint.lease_holder, checkpoint.lease_expires_at) == (
        "running", "qualifier-1", claim.expires_at)
    renewed_until = Task.objects.get(pk=task.pk).lease_expires_at
    assert renewed_until is not None and renewed_until > claim.expires_at

    failure = EventDraft(type="TaskFailed", payload={"error": "boom", "retryable": True})
    services.event_append(
        namespace="acme", task_id=task.pk, draft=failure, agent=worker.name, lease_epoch=claim.lease_epoch
    )
    assert figures(run(INCREMENTAL)) == (1, 1, 0)
    assert figures(run(FULL)) == (1, 3, 0)
    checkpoint = task_state_from_json(checkpoint_of(task))
    assert (checkpoint.status, checkpoint.attempts, checkpoint.error, checkpoint.lease_holder) == (
        "pending", 1, "boom", None)
    assert not IntegrityAlert.objects.exists()
