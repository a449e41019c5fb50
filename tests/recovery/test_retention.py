"""Retention: finished tasks leave the database whole, and only once their events are exported.

Everything here runs the real sealer, the real audit export (to a directory) and the database's
own pruning function (recovery migration 0006); time moves by the ``now`` given to the batch.
"""

from __future__ import annotations

import hashlib
import logging
import re
import uuid
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.conf import settings
from django.db import DatabaseError, connection, transaction
from django.utils import timezone
from psycopg import errors

from backplane import celery_app
from backplane.delivery.models import DeadLetter, DeadLetterStatus, OutboxMessage, OutboxStatus
from backplane.eventlog.models import Event, IdempotentReplay, Task, TaskStatus
from backplane.integrity import merkle, sealing, verification
from backplane.integrity import tasks as integrity_tasks
from backplane.integrity.audit import export
from backplane.integrity.models import IntegrityAlert, MerkleLeaf, SignedTreeHead, VerifiedHead
from backplane.runtime import duties
from recovery import dead_letters, detector, retention
from recovery import tasks as recovery_tasks
from recovery.models import RetentionRule, ToolCall
from tests.api.conftest import AgentClient, claim, create_task
from tests.backplane.integrity.audit_support import as_attacker, run_verifier
from tests.backplane.test_database_roles import conninfo

# Every table whose rows refer to a task by foreign key, and so must be emptied of the task's
# rows by backplane_prune_task before the task row goes (recovery migration 0006).
PRUNED_WITH_THE_TASK = {
    "backplane_deadletter", "backplane_event", "backplane_idempotentreplay", "backplane_integrityalert",
    "backplane_outboxmessage", "backplane_task", "backplane_verifiedhead", "recovery_toolcall",
    "recovery_approvalrequest", "recovery_tasksignal",
}


# --- helpers ---------------------------------------------------------------------------------


def later(hours: float = 2) -> datetime:
    return timezone.now() + timedelta(hours=hours)


def finish(client: AgentClient, *, kind: str = "quick", with_tool_call: bool = False) -> uuid.UUID:
    """A task of ``kind`` created, claimed, (with one answered tool call), completed."""
    task = create_task(client, kind=kind, input={"n": uuid.uuid4().hex})
    epoch = claim(client, kinds=[kind])["lease_epoch"]
    task_id = task["task_id"]
    if with_tool_call:
        sent = client.post(f"/api/v1/tasks/{task_id}/tool-calls/",
                           {"step": 1, "tool": "send-email", "input": {"to": "bob"}, "lease_epoch": epoch},
                           format="json")
        assert sent.status_code == 201, sent.content
        answered = client.post(f"/api/v1/tool-calls/{sent.json()['idempotency_key']}/result/",
                               {"status": "succeeded", "result": {"id": "m-1"}, "lease_epoch": epoch}, format="json")
        assert answered.status_code == 201, answered.content
    done = client.post(f"/api/v1/tasks/{task_id}/events/",
                       {"type": "TaskCompleted", "payload": {"output": {"ok": True}}, "lease_epoch": epoch},
                       format="json")
    assert done.status_code == 201, done.content
    return uuid.UUID(task_id)


def deliver_outbox() -> None:
    """What the relay does once the broker took the messages."""
    OutboxMessage.objects.filter(status=OutboxStatus.PENDING).update(status=OutboxStatus.DELIVERED,
                                                                     delivered_at=timezone.now())


def seal_and_export() -> None:
    while sealing.seal_new_events().sealed:
        pass
    export.audit_export_until_idle()


def prune(now: datetime | None = None) -> int:
    total = 0
    while pruned := retention.retention_prune_batch(now=now or later()):
        total += pruned
    return total


def exists(task_id: uuid.UUID) -> bool:
    return Task.objects.filter(pk=task_id).exists()


def prune_task_sql(task_id: uuid.UUID) -> int | None:
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SELECT backplane_prune_task(%s)", [task_id])
        return cursor.fetchone()[0]


@pytest.fixture
def quick_rule(db: None) -> RetentionRule:
    return retention.retention_rule_ensure(namespace="acme", kind="quick", keep_seconds=3600)


@pytest.fixture(autouse=True)
def _exports_to_a_directory(audit_dir: Path) -> Path:
    return audit_dir


@pytest.fixture
def audit_dir(settings: Any, tmp_path: Path) -> Path:
    settings.BACKPLANE_AUDIT_DIR = tmp_path / "audit"
    settings.BACKPLANE_AUDIT_S3_BUCKET = ""
    return tmp_path / "audit"


# --- what goes ---------------------------------------------------------------------------------


def test_it_prunes_a_finished_exported_task_with_every_row_that_refers_to_it(
    alice: AgentClient, quick_rule: RetentionRule, caplog: pytest.LogCaptureFixture
) -> None:
    task_id = finish(alice, with_tool_call=True)
    deliver_outbox()
    seal_and_export()
    IdempotentReplay.objects.create(task_id=task_id, kind="event", minute=timezone.now(), count=1)
    integrity_tasks.verify_chains_incremental()  # a verified head
    positions = list(Event.objects.filter(task_id=task_id).values_list("position", flat=True))
    leaves = dict(MerkleLeaf.objects.filter(event_id__in=positions).values_list("event_id", "event_hash"))
    assert len(positions) == 5 and len(leaves) == 5
    assert ToolCall.objects.filter(task_id=task_id).count() == 1
    assert OutboxMessage.objects.filter(task_id=task_id).exists()
    assert VerifiedHead.objects.filter(task_id=task_id).exists()

    with caplog.at_level(logging.INFO, logger="recovery.retention"):
        assert retention.retention_prune_batch(now=later()) == 1

    assert not exists(task_id)
    assert not Event.objects.filter(position__in=positions).exists()
    assert not ToolCall.objects.filter(task_id=task_id).exists()
    assert not OutboxMessage.objects.filter(task_id=task_id).exists()
    assert not VerifiedHead.objects.filter(task_id=task_id).exists()
    assert not IdempotentReplay.objects.filter(task_id=task_id).exists()
    # The tree keeps every leaf, hash for hash.
    assert dict(MerkleLeaf.objects.filter(event_id__in=positions).values_list("event_id", "event_hash")) == leaves
    rule = RetentionRule.objects.get(pk=quick_rule.pk)
    assert (rule.tasks_pruned, rule.events_pruned) == (1, 5) and rule.last_pruned_at is not None
    assert "retention: pruned 1 task(s) and 5 event(s)" in caplog.text
    assert retention.retention_prune_batch(now=later()) == 0


def test_a_pruned_task_takes_its_approval_requests_and_decisions_with_it(
    alice: AgentClient, quick_rule: RetentionRule
) -> None:
    from recovery import approvals
    from recovery.models import ApprovalDecision, ApprovalRequest
    from tests.support.roles import staff_user

    approver = staff_user("ana", "Approvers")
    approvals.tool_policy_set(tool="send-email", approver_group="Approvers", set_by="user:olivia", reason="all mail")
    task = create_task(alice, kind="quick", input={"n": "approved"})
    epoch = claim(alice, kinds=["quick"])["lease_epoch"]
    call = {"step": 1, "tool": "send-email", "input": {"to": "bob"}, "lease_epoch": epoch}
    waiting = alice.post(f"/api/v1/tasks/{task['task_id']}/tool-calls/", call, format="json")
    assert waiting.status_code == 202, waiting.content
    approvals.approval_decide(approval_id=waiting.json()["approval_id"], user=approver, verdict="approve",
                              reason="fine")
    assert alice.post(f"/api/v1/tasks/{task['task_id']}/tool-calls/", call, format="json").status_code == 201
    assert alice.post(f"/api/v1/tasks/{task['task_id']}/events/", {
        "type": "TaskCompleted", "payload": {"output": {}}, "lease_epoch": epoch}, format="json").status_code == 201
    deliver_outbox()
    seal_and_export()
    assert prune() == 1
    assert not exists(uuid.UUID(task["task_id"]))
    assert not ApprovalRequest.objects.exists() and not ApprovalDecision.objects.exists()


def test_it_keeps_what_may_not_go_yet(settings: Any, make_agent: Any, alice: AgentClient,
                                      quick_rule: RetentionRule) -> None:
    """One task pruned beside one of each kind that must stay. The slow rule keeps its tasks
    three hours, so two hours later they are too young."""
    retention.retention_rule_ensure(namespace="acme", kind="slow", keep_seconds=3 * 3600)
    due = finish(alice)
    too_young = finish(alice, kind="slow")
    other_kind = finish(alice, kind="unruled")
    other_namespace = finish(make_agent("mallory", "globex"))
    awaiting_delivery = finish(alice)
    create_task(alice, kind="quick")
    running = uuid.UUID(claim(alice, kinds=["quick"])["task"]["task_id"])
    first_seal = sealing.seal_new_events()
    # Finished before the export below, but sealed after the head it ends at.
    not_exported = finish(alice)
    sealing.seal_new_events()
    # Finished before the export below, and not even sealed.
    not_sealed = finish(alice)
    deliver_outbox()
    OutboxMessage.objects.filter(task_id=awaiting_delivery).update(status=OutboxStatus.PENDING)
    settings.BACKPLANE_AUDIT_SEGMENT_MAX_EVENTS = first_seal.tree_size
    segment = export.audit_export_next_segment().segment
    assert segment is not None and segment.tree_size == first_seal.tree_size
    assert Task.objects.get(pk=running).status == TaskStatus.RUNNING

    assert prune() == 1

    assert not exists(due)
    for kept in (too_young, other_kind, other_namespace, running, awaiting_delivery, not_exported, not_sealed):
        assert exists(kept), kept
    # The database's own check refuses those that only it can tell (the rules decide the others).
    for kept in (running, awaiting_delivery, not_exported, not_sealed):
        assert prune_task_sql(kept) is None, kept
        assert exists(kept), kept


def test_a_task_sealed_but_outside_every_segment_stays(settings: Any, alice: AgentClient,
                                                      quick_rule: RetentionRule) -> None:
    first = finish(alice)
    deliver_outbox()
    first_seal = sealing.seal_new_events()
    second = finish(alice)
    deliver_outbox()
    sealing.seal_new_events()
    # One segment of the first head only, exported after both tasks finished.
    settings.BACKPLANE_AUDIT_SEGMENT_MAX_EVENTS = first_seal.tree_size
    segment = export.audit_export_next_segment().segment
    assert segment is not None and segment.tree_size == first_seal.tree_size
    assert MerkleLeaf.objects.filter(event__task_id=second).count() == Event.objects.filter(task_id=second).count()

    assert prune() == 1
    assert not exists(first) and exists(second)

    export.audit_export_until_idle()
    assert prune() == 1
    assert not exists(second)


def test_a_dead_lettered_task_stays_until_its_dead_letter_is_decided_and_the_decision_exported(
    alice: AgentClient,
) -> None:
    retention.retention_rule_ensure(namespace="acme", keep_seconds=3600)
    create_task(alice, kind="fragile", max_attempts=1)
    claimed = claim(alice, kinds=["fragile"])
    task_id = uuid.UUID(claimed["task"]["task_id"])
    detector.lease_expire_stalled(now=timezone.now() + timedelta(minutes=5))
    dead_letter = DeadLetter.objects.get(task_id=task_id)
    assert Task.objects.get(pk=task_id).status == TaskStatus.DEAD_LETTERED
    assert dead_letter.status == DeadLetterStatus.PENDING
    deliver_outbox()
    seal_and_export()

    assert prune() == 0
    assert prune_task_sql(task_id) is None and exists(task_id)

    dead_letters.dead_letter_discard(dead_letter_id=dead_letter.pk, decided_by="user:rita", reason="obsolete lead")
    deliver_outbox()
    assert prune() == 0  # the decision is an event of the task, not exported yet
    seal_and_export()
    assert prune() == 1
    assert not exists(task_id) and not DeadLetter.objects.filter(pk=dead_letter.pk).exists()


def test_an_unacknowledged_integrity_alert_keeps_its_task(alice: AgentClient, quick_rule: RetentionRule) -> None:
    task_id = finish(alice)
    deliver_outbox()
    seal_and_export()
    run = verification.verification_run_start(mode="incremental")
    alert = IntegrityAlert.objects.create(run=run, task_id=task_id, first_invalid_seq=1, problem="looked odd",
                                          created_at=timezone.now())

    assert prune() == 0 and exists(task_id)

    verification.integrity_alert_acknowledge(alert_id=alert.pk, by="user:rita", note="false alarm")
    assert prune() == 1
    assert not IntegrityAlert.objects.filter(pk=alert.pk).exists()


def test_an_inactive_rule_prunes_nothing(alice: AgentClient, quick_rule: RetentionRule) -> None:
    task_id = finish(alice)
    deliver_outbox()
    seal_and_export()
    RetentionRule.objects.filter(pk=quick_rule.pk).update(is_active=False)
    assert prune() == 0 and exists(task_id)
    RetentionRule.objects.filter(pk=quick_rule.pk).update(is_active=True, statuses=["failed"])
    assert prune() == 0 and exists(task_id)


# --- parents and children ----------------------------------------------------------------------


def dispatch_child(parent_client: AgentClient, child_client: AgentClient) -> tuple[uuid.UUID, uuid.UUID, int]:
    """A running parent (kind plan) with one child (kind research) that has completed."""
    parent = create_task(parent_client, kind="plan")
    epoch = claim(parent_client, kinds=["plan"])["lease_epoch"]
    sent = parent_client.post(f"/api/v1/tasks/{parent['task_id']}/subtasks/",
                              {"step": 1, "kind": "research", "input": {}, "lease_epoch": epoch}, format="json")
    assert sent.status_code == 201, sent.content
    child_id = sent.json()["task"]["task_id"]
    child_epoch = claim(child_client, kinds=["research"])["lease_epoch"]
    done = child_client.post(f"/api/v1/tasks/{child_id}/events/",
                             {"type": "TaskCompleted", "payload": {"output": {"found": 1}}, "lease_epoch": child_epoch},
                             format="json")
    assert done.status_code == 201, done.content
    return uuid.UUID(parent["task_id"]), uuid.UUID(child_id), epoch


def test_children_go_first_and_only_once_their_parent_is_finished(make_agent: Any) -> None:
    orchestrator = make_agent("orchestrator", "acme", kinds=("plan",))
    researcher = make_agent("researcher", "acme", kinds=("research",))
    retention.retention_rule_ensure(namespace="acme", keep_seconds=3600)
    parent_id, child_id, epoch = dispatch_child(orchestrator, researcher)
    deliver_outbox()
    seal_and_export()

    # The parent runs on: a repeated dispatch must find its child, so the child stays.
    assert retention.retention_prune_batch(now=later()) == 0
    assert exists(parent_id) and exists(child_id)

    done = orchestrator.post(f"/api/v1/tasks/{parent_id}/events/",
                             {"type": "TaskCompleted", "payload": {"output": {}}, "lease_epoch": epoch},
                             format="json")
    assert done.status_code == 201
    deliver_outbox()
    seal_and_export()
    # The parent has a child left, so the first batch takes only the child...
    assert prune_task_sql(parent_id) is None
    assert retention.retention_prune_batch(now=later()) == 1
    assert exists(parent_id) and not exists(child_id)
    # ...and the next one the parent.
    assert retention.retention_prune_batch(now=later()) == 1
    assert not exists(parent_id)


def test_a_parent_stays_while_a_child_no_rule_covers_is_there(make_agent: Any) -> None:
    orchestrator = make_agent("orchestrator", "acme", kinds=("plan",))
    researcher = make_agent("researcher", "acme", kinds=("research",))
    retention.retention_rule_ensure(namespace="acme", kind="plan", keep_seconds=3600)
    parent_id, child_id, epoch = dispatch_child(orchestrator, researcher)
    orchestrator.post(f"/api/v1/tasks/{parent_id}/events/",
                      {"type": "TaskCompleted", "payload": {"output": {}}, "lease_epoch": epoch}, format="json")
    deliver_outbox()
    seal_and_export()

    assert prune() == 0
    assert exists(parent_id) and exists(child_id)


def finish_fork(client: AgentClient, source: uuid.UUID, *, sandbox: bool) -> uuid.UUID:
    forked = client.post(f"/api/v1/tasks/{source}/fork/", {"at_seq": 1, "reason": "again", "sandbox": sandbox},
                         format="json")
    assert forked.status_code == 201, forked.content
    fork_id = forked.json()["task_id"]
    epoch = claim(client, task_id=fork_id)["lease_epoch"]
    done = client.post(f"/api/v1/tasks/{fork_id}/events/",
                       {"type": "TaskCompleted", "payload": {"output": {}}, "lease_epoch": epoch}, format="json")
    assert done.status_code == 201, done.content
    return uuid.UUID(fork_id)


def test_forks_go_first_and_sandboxes_are_kept_for_their_own_time(alice: AgentClient,
                                                                   quick_rule: RetentionRule) -> None:
    source = finish(alice)
    fork = finish_fork(alice, source, sandbox=False)
    sandbox = finish_fork(alice, source, sandbox=True)
    deliver_outbox()
    seal_and_export()

    # The rule takes the fork; the source waits for its forks; the sandbox is outside the rule.
    assert prune_task_sql(source) is None
    assert prune(now=later(hours=2)) == 1
    assert exists(source) and not exists(fork) and exists(sandbox)
    # Past the sandbox's own keep time it goes, and then its source.
    keep = timedelta(seconds=settings.BACKPLANE_SANDBOX_KEEP_SECONDS)
    assert prune(now=timezone.now() + keep + timedelta(hours=1)) == 2
    assert not exists(sandbox) and not exists(source)


# --- the tree, the seals and the export after pruning --------------------------------------------


def mth(leaves: list[bytes]) -> bytes:
    """RFC 6962 Merkle tree hash over leaf hashes (a test-side copy, independent of backplane.merkle)."""
    if len(leaves) == 1:
        return leaves[0]
    split = 1 << ((len(leaves) - 1).bit_length() - 1)
    return hashlib.sha256(b"\x01" + mth(leaves[:split]) + mth(leaves[split:])).digest()


def test_proofs_seals_and_the_offline_export_still_verify_after_pruning(
    alice: AgentClient, quick_rule: RetentionRule, audit_dir: Path
) -> None:
    pruned = [finish(alice, with_tool_call=True) for _ in range(3)]
    kept = finish(alice, kind="unruled")
    deliver_outbox()
    seal_and_export()
    first = SignedTreeHead.objects.order_by("-tree_size").first()
    assert first is not None
    assert integrity_tasks.verify_chains_full()["failures"] == 0

    assert prune() == 3
    gone = Event.objects.filter(task_id__in=pruned).count()
    assert gone == 0

    # New work after the pruning, sealed into a later head.
    newer = finish(alice, kind="unruled")
    deliver_outbox()
    sealing.seal_new_events()
    second = SignedTreeHead.objects.order_by("-tree_size").first()
    assert second is not None and second.tree_size > first.tree_size

    # Every head's root is still the tree of the leaf table's hashes.
    leaves = [merkle.event_leaf_hash(h) for h in MerkleLeaf.objects.order_by("leaf_index")
              .values_list("event_hash", flat=True)]
    assert len(leaves) == second.tree_size
    for head in SignedTreeHead.objects.all():
        assert mth(leaves[:head.tree_size]).hex() == head.root_hash
    # Inclusion proofs of the events still there, through the API, against both heads.
    for event in Event.objects.filter(task_id__in=[kept, newer]):
        for size in {first.tree_size, second.tree_size}:
            if MerkleLeaf.objects.get(event_id=event.position).leaf_index >= size:
                continue
            body = alice.get(f"/api/v1/events/{event.position}/proof/", {"tree_size": size}).json()
            root = SignedTreeHead.objects.get(tree_size=size).root_hash
            assert merkle.verify_inclusion(merkle.event_leaf_hash(event.hash), body["leaf_index"], size,
                                           [bytes.fromhex(h) for h in body["audit_path"]], bytes.fromhex(root))
    consistency = alice.get("/api/v1/seals/consistency/", {"first": first.tree_size, "second": second.tree_size})
    assert merkle.verify_consistency(first.tree_size, second.tree_size, bytes.fromhex(first.root_hash),
                                     bytes.fromhex(second.root_hash),
                                     [bytes.fromhex(h) for h in consistency.json()["proof"]])

    # The seal checks take the pruned leaves at their sealed hashes, and count them.
    checked = verification.seals_verify()
    assert checked.valid and checked.tree_size == second.tree_size and checked.pruned == 3 * 5
    head_check = sealing.seal_verify_against_head()
    assert head_check.valid and head_check.pruned == 3 * 5
    result = integrity_tasks.verify_chains_full()
    assert result["failures"] == 0 and not IntegrityAlert.objects.exists()
    assert integrity_tasks.verify_chains_incremental()["failures"] == 0

    # The auditor's copy still verifies, with no database.
    export.audit_export_until_idle()
    verified = run_verifier(audit_dir, sealing.public_key_hex())
    assert verified.returncode == 0, verified.stdout + verified.stderr


def test_a_missing_event_that_was_never_exported_is_still_reported(alice: AgentClient,
                                                                   quick_rule: RetentionRule) -> None:
    finish(alice)
    deliver_outbox()
    seal_and_export()
    assert prune() == 1
    victim = finish(alice, kind="unruled")
    sealing.seal_new_events()
    event = Event.objects.filter(task_id=victim).order_by("seq").last()
    assert event is not None
    leaf = MerkleLeaf.objects.get(event_id=event.position)
    as_attacker(("DELETE FROM backplane_event WHERE position = %s", [event.position]))

    checked = verification.seals_verify()
    assert not checked.valid and checked.finding is not None
    assert checked.finding.problem == f"the event of leaf {leaf.leaf_index} is missing (it was not exported)"
    head_check = sealing.seal_verify_against_head()
    assert not head_check.valid and "is missing" in (head_check.problem or "")


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("mode", ["full", "incremental"])
def test_a_verification_run_that_races_the_pruning_writes_nothing_for_the_pruned_task(
    committed_db: None, monkeypatch: pytest.MonkeyPatch, alice: AgentClient, audit_dir: Path, mode: str
) -> None:
    """The verifier reads a batch of tasks, retention prunes one of them (committed), then the
    verifier checks and records the batch: no alert, no failed run, nothing left referring to it."""
    retention.retention_rule_ensure(namespace="acme", kind="quick", keep_seconds=3600)
    task_id = finish(alice)
    other = finish(alice, kind="unruled")
    deliver_outbox()
    seal_and_export()
    read_heads = verification._heads_after

    def heads_then_pruned(**kwargs: Any) -> Any:
        heads = read_heads(**kwargs)
        if any(head.task_id == task_id for head in heads):
            assert retention.retention_prune_batch(now=later()) == 1
        return heads

    monkeypatch.setattr(verification, "_heads_after", heads_then_pruned)
    run = integrity_tasks.verify_chains_full() if mode == "full" else integrity_tasks.verify_chains_incremental()

    assert run["failures"] == 0 and run["alerts_raised"] == 0
    assert not exists(task_id) and not VerifiedHead.objects.filter(task_id=task_id).exists()
    assert VerifiedHead.objects.get(task_id=other).verified_seq == 3


# --- the database's guard ------------------------------------------------------------------------


def test_the_trigger_lets_a_delete_through_only_while_pruning_and_only_exported_events(
    alice: AgentClient, quick_rule: RetentionRule
) -> None:
    exported = finish(alice)
    deliver_outbox()
    seal_and_export()
    unexported = finish(alice)
    sealing.seal_new_events()

    def delete(task_id: uuid.UUID, *, pruning: bool) -> None:
        with transaction.atomic(), connection.cursor() as cursor:
            if pruning:
                cursor.execute("SELECT set_config('backplane.pruning', 'on', true)")
            cursor.execute("DELETE FROM backplane_event WHERE task_id = %s", [task_id])

    with pytest.raises(DatabaseError, match="append-only: DELETE"):
        delete(exported, pruning=False)
    with pytest.raises(DatabaseError, match="append-only: DELETE"):
        delete(unexported, pruning=True)
    with pytest.raises(DatabaseError, match="append-only: UPDATE"), transaction.atomic(), connection.cursor() as c:
        c.execute("SELECT set_config('backplane.pruning', 'on', true)")
        c.execute("UPDATE backplane_event SET payload = '{}'::jsonb WHERE task_id = %s", [exported])
    assert Event.objects.filter(task_id__in=[exported, unexported]).count() == 6
    # The function leaves the flag as it found it.
    assert prune_task_sql(exported) == 3
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_setting('backplane.pruning', true)")
        assert cursor.fetchone()[0] in (None, "", "off")


def test_every_table_that_refers_to_tasks_is_emptied_by_the_pruning_function(db: None) -> None:
    # conparentid = 0: the events' partitions hold clones of the parent's foreign key.
    with connection.cursor() as cursor:
        cursor.execute("SELECT conrelid::regclass::text FROM pg_constraint "
                       "WHERE contype = 'f' AND confrelid = 'backplane_task'::regclass AND conparentid = 0")
        referring = {row[0] for row in cursor.fetchall()}
        cursor.execute("SELECT conrelid::regclass::text FROM pg_constraint "
                       "WHERE contype = 'f' AND confrelid = 'backplane_event'::regclass")
        to_events = {row[0] for row in cursor.fetchall()}
        cursor.execute("SELECT prosrc FROM pg_proc WHERE proname = 'backplane_prune_task'")
        (source,) = cursor.fetchone()
    assert referring == PRUNED_WITH_THE_TASK, "extend backplane_prune_task (a new migration) and this list"
    assert to_events == set()  # leaves keep event_id without a foreign key
    for table in referring:
        assert re.search(rf"DELETE FROM {table}\s", source), table


@pytest.fixture
def app_login(committed_db: None) -> str:
    """The application's role, able to log in (as tests/backplane/test_database_roles.py does)."""
    from backplane.runtime.db_roles import RESTRICTED

    role = settings.BACKPLANE_DB_APP_ROLE
    with psycopg.connect(conninfo(connection.settings_dict["USER"]), autocommit=True) as owner:
        owner.execute(f'ALTER ROLE "{role}" LOGIN {RESTRICTED}')
    return role


@pytest.mark.django_db(transaction=True)
def test_the_application_role_prunes_through_the_function_and_still_cannot_delete_events(
    app_login: str, alice: AgentClient
) -> None:
    app_role = app_login
    retention.retention_rule_ensure(namespace="acme", kind="quick", keep_seconds=3600)
    kept = finish(alice)
    task_id = finish(alice)
    deliver_outbox()
    seal_and_export()
    with psycopg.connect(conninfo(app_role), autocommit=True, options="-c lock_timeout=2000") as app:
        assert app.execute("SELECT current_user").fetchone() == (app_role,)
        for statement in ("DELETE FROM backplane_event", "UPDATE backplane_event SET payload = '{}'",
                          "TRUNCATE backplane_event"):
            with pytest.raises(errors.InsufficientPrivilege):
                app.execute(statement)
        with pytest.raises(errors.InsufficientPrivilege), app.transaction():
            app.execute("SELECT set_config('backplane.pruning', 'on', true)")
            app.execute("DELETE FROM backplane_event WHERE task_id = %s", [kept])
        assert app.execute("SELECT backplane_prune_task(%s)", [task_id]).fetchone() == (3,)
        assert app.execute("SELECT count(*) FROM backplane_event WHERE task_id = %s", [kept]).fetchone() == (3,)
        # The application's own retention, as the role: the rest of the rule's due tasks.
        assert app.execute("SELECT backplane_prune_task(%s)", [kept]).fetchone() == (3,)
    assert not Task.objects.filter(pk__in=[kept, task_id]).exists()
    with connection.cursor() as cursor:
        cursor.execute("SELECT has_function_privilege('public', 'backplane_prune_task(uuid)', 'EXECUTE')")
        assert cursor.fetchone() == (False,)


# --- the duty ----------------------------------------------------------------------------------


def test_the_duty_is_scheduled_tracked_and_prunes(alice: AgentClient, quick_rule: RetentionRule) -> None:
    entry = settings.CELERY_BEAT_SCHEDULE["prune-retained-tasks"]
    assert entry["task"] == "recovery.tasks.prune_retained_tasks"
    assert entry["schedule"] == float(settings.BACKPLANE_RETENTION_SECONDS) == 60.0
    assert "recovery.tasks.prune_retained_tasks" in celery_app.tasks
    assert duties.scheduled_duties()["prune-retained-tasks"] == 60.0
    assert duties.duty_stamp(task_name="recovery.tasks.prune_retained_tasks", outcome="succeeded") == (
        "prune-retained-tasks")

    task_id = finish(alice)
    deliver_outbox()
    seal_and_export()
    assert recovery_tasks.prune_retained_tasks() == 0  # an hour is not over yet
    RetentionRule.objects.filter(pk=quick_rule.pk).update(keep_seconds=0)
    assert recovery_tasks.prune_retained_tasks() == 1
    assert not exists(task_id)


def test_rules_are_made_for_finished_statuses_only(db: None) -> None:
    from backplane.eventlog.errors import InvalidInput

    rule = retention.retention_rule_ensure(namespace="demo", keep_seconds=900)
    assert rule.statuses == ["completed", "failed", "dead_lettered", "compensated", "cancelled"] and rule.kind == ""
    again = retention.retention_rule_ensure(namespace="demo", keep_seconds=60, statuses=["completed"])
    assert again.pk == rule.pk and (again.keep_seconds, again.statuses) == (60, ["completed"])
    with pytest.raises(InvalidInput):
        retention.retention_rule_ensure(namespace="demo", keep_seconds=60, statuses=["running"])
    with pytest.raises(InvalidInput):
        retention.retention_rule_ensure(namespace="not a namespace", keep_seconds=60)
    with pytest.raises(DatabaseError), transaction.atomic():
        RetentionRule.objects.filter(pk=rule.pk).update(statuses=["pending"])


# --- the candidate query -------------------------------------------------------------------------


@pytest.mark.parametrize(("scope", "index"), [(retention.RULE_SCOPE, "task_retention_idx"),
                                               (retention.RULE_KIND_SCOPE, "task_retention_kind_idx"),
                                               (retention.SANDBOX_SCOPE, "task_sandbox_retention_idx")])
def test_a_page_of_candidates_is_read_from_a_retention_index(db: None, scope: str, index: str) -> None:
    kind = "quick"
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        # On an empty table the other retention indexes cost the same and the planner may take
        # one (filtering what it reads): without them, the plan shows whether this one serves
        # the query. Dropped in the test's transaction, which is rolled back.
        for other in {"task_retention_idx", "task_retention_kind_idx", "task_sandbox_retention_idx"} - {index}:
            cursor.execute(f"DROP INDEX {other}")
        cursor.execute("EXPLAIN " + retention._PAGE_SQL.format(scope=scope),
                       {"namespace": "acme", "kind": kind, "statuses": ["completed"], "cutoff": timezone.now(),
                        "after_at": timezone.now() - timedelta(days=1), "after_id": uuid.UUID(int=0), "page": 500})
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert f"using {index} on" in plan, plan


def test_candidates_are_found_past_a_page_of_tasks_that_must_stay(monkeypatch: pytest.MonkeyPatch,
                                                                  make_agent: Any, alice: AgentClient) -> None:
    """Two pages of dead-lettered tasks awaiting a decision come first; the due one behind them goes."""
    monkeypatch.setattr(retention, "PAGE_SIZE", 2)
    retention.retention_rule_ensure(namespace="acme", keep_seconds=3600)
    for n in range(4):
        flaky = make_agent(f"flaky-{n}", "acme")  # one stall each: no breaker opens
        create_task(flaky, kind="fragile", max_attempts=1)
        claim(flaky, kinds=["fragile"], lease_seconds=1)
    # The leases run out: moved into the past instead of waited for, so the events keep real times.
    Task.objects.filter(kind="fragile", status=TaskStatus.RUNNING).update(
        lease_expires_at=timezone.now() - timedelta(seconds=1))
    assert detector.lease_expire_stalled().dead_lettered == 4
    due = finish(alice)
    deliver_outbox()
    seal_and_export()
    assert DeadLetter.objects.filter(status=DeadLetterStatus.PENDING).count() == 4

    assert retention.retention_prune_batch(now=later()) == 1
    assert not exists(due)


# --- the admin -----------------------------------------------------------------------------------


def test_an_administrator_adds_a_rule_in_the_admin_and_the_totals_stay_the_duty_s(admin_client: Any) -> None:
    add = "/admin/recovery/retentionrule/add/"
    page = admin_client.get(add)
    assert page.status_code == 200 and b'name="statuses"' in page.content and b'name="tasks_pruned"' not in page.content
    refused = admin_client.post(add, {"namespace": "demo", "kind": "", "keep_seconds": 900, "statuses": ["running"],
                                      "is_active": "on", "tasks_pruned": 5})
    assert refused.status_code == 200 and not RetentionRule.objects.exists()

    added = admin_client.post(add, {"namespace": "demo", "kind": "", "keep_seconds": 900,
                                    "statuses": ["completed", "failed"], "is_active": "on", "tasks_pruned": 5})
    assert added.status_code == 302, added.content
    rule = RetentionRule.objects.get()
    assert (rule.namespace, rule.kind, rule.keep_seconds, rule.statuses, rule.is_active, rule.tasks_pruned) == (
        "demo", "", 900, ["completed", "failed"], True, 0)
    assert b"(every kind)" in admin_client.get("/admin/recovery/retentionrule/").content
