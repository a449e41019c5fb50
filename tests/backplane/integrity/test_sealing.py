"""The sealer and the integrity API: signed tree heads, proofs any RFC 6962 client can check,
tamper evidence that survives a recomputed chain, late commits sealed once."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection, transaction
from django.utils import timezone

from backplane.eventlog import services, writer
from backplane.eventlog.models import Event
from backplane.eventlog.writer import EventDraft
from backplane.integrity import merkle, sealing
from backplane.integrity.models import MerkleLeaf, SignedTreeHead
from backplane.integrity.verification import chain_check
from tests.api.conftest import assert_error
from tests.backplane.integrity.audit_support import rewrite_history


def seed(steps: int = 3, namespace: str = "acme"):  # type: ignore[no-untyped-def]
    task = services.task_create(namespace=namespace, kind="k", input={"n": steps}, agent="planner").task
    for n in range(steps):
        services.event_append(namespace=namespace, task_id=task.pk, agent="a",
                              draft=EventDraft(type="ReasoningStepCompleted", payload={"step": n}))
    task.refresh_from_db()
    return task


def test_sealing_signs_a_head_over_every_committed_event(db: None) -> None:
    seed()
    step = sealing.seal_new_events()
    assert step.ran and step.sealed == Event.objects.count() == step.tree_size
    head = SignedTreeHead.objects.get()
    assert sealing.verify_tree_head(tree_size=head.tree_size, root_hash=head.root_hash, signed_at=head.signed_at,
                                    signature=head.signature, public_key=head.public_key)
    hashes = [merkle.event_leaf_hash(h) for h in Event.objects.order_by("position").values_list("hash", flat=True)]
    assert head.root_hash == merkle.root_from_leaf_hashes(hashes).hex()
    assert sealing.seal_new_events().sealed == 0  # nothing new: no new head either
    assert SignedTreeHead.objects.count() == 1


def test_the_api_serves_heads_and_proofs_that_verify(db, alice) -> None:  # type: ignore[no-untyped-def]
    seed()
    first = sealing.seal_new_events()
    seed(steps=5)
    second = sealing.seal_new_events()
    head = alice.get("/api/v1/seals/latest/").json()
    assert head["tree_size"] == second.tree_size and len(head["signature"]) == 128 and len(head["public_key"]) == 64
    assert sealing.verify_tree_head(**head)
    for event in Event.objects.filter(task__namespace="acme"):
        proof = alice.get(f"/api/v1/events/{event.position}/proof/").json()
        path = [bytes.fromhex(h) for h in proof["audit_path"]]
        assert merkle.verify_inclusion(merkle.event_leaf_hash(event.hash), proof["leaf_index"], proof["tree_size"],
                                       path, bytes.fromhex(head["root_hash"]))
    old_root = SignedTreeHead.objects.get(tree_size=first.tree_size).root_hash
    body = alice.get("/api/v1/seals/consistency/", {"first": first.tree_size, "second": second.tree_size}).json()
    assert merkle.verify_consistency(first.tree_size, second.tree_size, bytes.fromhex(old_root),
                                     bytes.fromhex(head["root_hash"]), [bytes.fromhex(h) for h in body["proof"]])
    assert_error(alice.get("/api/v1/seals/consistency/", {"first": 2, "second": 1}), 400, "validation_error")
    assert_error(alice.get("/api/v1/seals/consistency/", {"first": 1, "second": second.tree_size}), 404, "not_found")


def test_another_namespace_gets_no_proof(db, alice, mallory) -> None:  # type: ignore[no-untyped-def]
    task = seed()
    sealing.seal_new_events()
    event = Event.objects.filter(task=task).first()
    assert event is not None
    position = event.position
    assert_error(mallory.get(f"/api/v1/events/{position}/proof/"), 404, "not_found")


def test_a_rewritten_history_fails_the_consistency_check(db: None) -> None:
    seed()
    first = sealing.seal_new_events()
    first_root = bytes.fromhex(SignedTreeHead.objects.get(tree_size=first.tree_size).root_hash)
    seed()
    second = sealing.seal_new_events()
    proof_hex = sealing.consistency_proof_between(first=first.tree_size, second=second.tree_size)
    proof = [bytes.fromhex(h) for h in proof_hex]
    second_root = bytes.fromhex(SignedTreeHead.objects.get(tree_size=second.tree_size).root_hash)
    assert merkle.verify_consistency(first.tree_size, second.tree_size, first_root, second_root, proof)
    forged_first = merkle.root_from_leaf_hashes([merkle.leaf_hash(b"forged")] * first.tree_size)
    assert not merkle.verify_consistency(first.tree_size, second.tree_size, forged_first, second_root, proof)


def test_an_edit_with_a_recomputed_chain_is_still_caught_by_the_signed_root(db: None) -> None:
    task = seed(steps=4)
    sealing.seal_new_events()
    assert sealing.seal_verify_against_head().valid
    # The attacker edits seq 2 and recomputes every later hash and the projection: the chain
    # verifies again, and they even rewrite the leaf table's copies of the hashes.
    rewrite_history(task, seq=2, payload={"step": 999})
    task.refresh_from_db()
    assert chain_check(task=task).valid  # the chain alone no longer tells
    result = sealing.seal_verify_against_head()
    assert not result.valid and "signed root" in (result.problem or "")


def test_leaf_assignments_are_append_only(db: None) -> None:
    from django.db import DatabaseError

    seed()
    sealing.seal_new_events()
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        MerkleLeaf.objects.filter(leaf_index=0).update(leaf_index=99)
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        SignedTreeHead.objects.all().delete()


@pytest.mark.django_db(transaction=True)
def test_a_late_committing_event_is_sealed_once_never_twice_never_skipped(committed_db: None) -> None:
    slow_task = seed()
    fast_task = seed()
    holding = threading.Event()
    release = threading.Event()

    # An append that takes its position first but commits last.
    def slow_append() -> None:
        with transaction.atomic():
            writer.write_events(writer.lock_task(namespace="acme", task_id=slow_task.pk),
                                  [EventDraft(type="Noted", payload={"late": True})], agent="a",
                                  now=timezone.now())
            holding.set()
            release.wait(10)
        connection.close()

    thread = threading.Thread(target=slow_append)
    thread.start()
    assert holding.wait(10)
    services.event_append(namespace="acme", task_id=fast_task.pk, agent="a", draft=EventDraft(type="Noted"))
    before = sealing.seal_new_events()
    release.set()
    thread.join()
    after = sealing.seal_new_events()
    late = Event.objects.get(payload__late=True)
    later = Event.objects.filter(task=fast_task, type="Noted").get()
    assert late.position < later.position  # took its position first...
    leaves = dict(MerkleLeaf.objects.values_list("event_id", "leaf_index"))
    assert leaves[late.position] > leaves[later.position]  # ...and was sealed after it
    assert len(leaves) == Event.objects.count() == after.tree_size and after.sealed == 1 and before.sealed > 0
    assert sealing.seal_new_events().sealed == 0
    assert sealing.seal_verify_against_head().valid


@pytest.mark.django_db(transaction=True)
def test_an_event_in_flight_over_several_runs_is_sealed_when_it_commits(committed_db: None) -> None:
    slow_task = seed()
    fast_task = seed()
    sealing.seal_new_events()  # everything so far: behind the floor once the next runs see it
    holding = threading.Event()
    release = threading.Event()
    late_positions: list[int] = []

    def slow_append() -> None:
        with transaction.atomic():
            events = writer.write_events(writer.lock_task(namespace="acme", task_id=slow_task.pk),
                                           [EventDraft(type="Noted", payload={"late": True})], agent="a",
                                           now=timezone.now())
            late_positions.append(events[0].position)
            holding.set()
            release.wait(10)
        connection.close()

    thread = threading.Thread(target=slow_append)
    thread.start()
    try:
        assert holding.wait(10)
        sealed_while_in_flight = 0
        for n in range(3):  # runs that pass the late event's position while it is invisible
            services.event_append(namespace="acme", task_id=fast_task.pk, agent="a",
                                  draft=EventDraft(type="Noted", payload={"n": n}))
            sealed_while_in_flight += sealing.seal_new_events().sealed
        assert sealed_while_in_flight == 3
        # The runs learned a floor (late commits are no longer searched from position 0)... A run's
        # snapshot xmin is the whole cluster's: another test database's transaction, older than the
        # first run, holds the floor back until it ends. More runs, then, each learning from the last.
        deadline = time.monotonic() + 10
        n = 3
        while sealing._current_floor() == 0 and time.monotonic() < deadline:
            services.event_append(namespace="acme", task_id=fast_task.pk, agent="a",
                                  draft=EventDraft(type="Noted", payload={"n": n}))
            assert sealing.seal_new_events().sealed == 1
            n += 1
        assert 0 < sealing._current_floor() < late_positions[0]
    finally:
        release.set()
        thread.join()
    # ...which still lies below the late event.
    assert sealing.seal_new_events().sealed == 1
    assert sealing.seal_new_events().sealed == 0
    assert MerkleLeaf.objects.count() == Event.objects.count()
    assert MerkleLeaf.objects.filter(event_id=late_positions[0]).count() == 1
    assert sealing.seal_verify_against_head().valid


@pytest.mark.django_db(transaction=True)
def test_two_sealers_at_once_seal_each_event_once(committed_db: None) -> None:
    for _ in range(5):
        seed()
    results: list[sealing.SealStep] = []
    barrier = threading.Barrier(3)

    def run() -> None:
        barrier.wait()
        results.append(sealing.seal_new_events(batch_size=7))
        connection.close()

    threads = [threading.Thread(target=run) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    while sealing.seal_new_events(batch_size=7).sealed:
        pass
    assert MerkleLeaf.objects.count() == Event.objects.count()
    assert sorted(MerkleLeaf.objects.values_list("leaf_index", flat=True)) == list(range(Event.objects.count()))
    assert sealing.seal_verify_against_head().valid
