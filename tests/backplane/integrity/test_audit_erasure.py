"""Erasure against the audit promise (docs/privacy.md): after a data subject is erased, every
exported segment is the same bytes and verifies with the offline verifier, every chain, the
signed tree head and an inclusion proof hold as before, and the sealed value can no longer be
opened anywhere; the export never held it in clear."""

from __future__ import annotations

from pathlib import Path

import pytest
from rest_framework.test import APIClient

from backplane.eventlog import services
from backplane.eventlog.models import Event
from backplane.eventlog.writer import EventDraft
from backplane.integrity import merkle, sealing, verification
from backplane.integrity.audit import export
from backplane.privacy.sealing import seal_personal
from backplane.privacy.services import personal_open, subject_erase
from tests.backplane.integrity.audit_support import run_verifier

pytestmark = pytest.mark.django_db

EMAIL = "ada.lovelace@example.com"


def files_of(directory: Path) -> dict[str, bytes]:
    return {str(path.relative_to(directory)): path.read_bytes() for path in sorted(directory.rglob("*"))
            if path.is_file()}


def test_an_erased_subject_leaves_every_chain_seal_proof_and_segment_as_it_was(
    audit_dir: Path, public_key: str,
) -> None:
    agent = services.agent_create(name="qualifier", namespace="acme")
    task = services.task_create(namespace="acme", kind="lead", agent="qualifier",
                                input=seal_personal("acme", {"lead": {"$personal": {"subject": "lead:8812",
                                                                                    "value": EMAIL}}})).task
    payload = seal_personal("acme", {"step": 1, "email": {"$personal": {"subject": "lead:8812", "value": EMAIL}}})
    services.event_append(namespace="acme", task_id=task.pk, agent="qualifier",
                          draft=EventDraft(type="ReasoningStepCompleted", payload=payload))
    head = sealing.seal_new_events()
    assert head is not None
    export.audit_export_until_idle()
    exported = files_of(audit_dir)
    assert exported and not any(EMAIL.encode() in content for content in exported.values())
    event = Event.objects.get(task=task, seq=2)
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {agent.token}")
    proof_before = api.get(f"/api/v1/events/{event.position}/proof/?tree_size={head.tree_size}").json()
    seal_before = api.get("/api/v1/seals/latest/").json()
    assert personal_open("acme", event.payload, reader=None, where_read="test").value["email"] == EMAIL

    subject_erase(namespace="acme", subject="lead:8812", reason="art. 17", erased_by="user:priya")

    assert files_of(audit_dir) == exported  # byte for byte
    result = run_verifier(audit_dir, public_key)
    assert result.returncode == 0, result.stderr
    assert all(check.valid for check in verification.chains_check(task_ids=[task.pk]))
    assert api.get("/api/v1/seals/latest/").json() == seal_before
    proof = api.get(f"/api/v1/events/{event.position}/proof/?tree_size={head.tree_size}").json()
    assert proof == proof_before
    assert merkle.verify_inclusion(merkle.event_leaf_hash(event.hash), proof["leaf_index"], proof["tree_size"],
                                   [merkle.hash_from_hex(h) for h in proof["audit_path"]],
                                   merkle.hash_from_hex(seal_before["root_hash"]))
    erased = personal_open("acme", Event.objects.get(pk=event.pk).payload, reader=None, where_read="test").value
    assert set(erased["email"]["$personal"]) == {"subject", "erased_at"}
    # A later segment exports the events after the erasure alike; the whole export still verifies.
    services.event_append(namespace="acme", task_id=task.pk, agent="qualifier",
                          draft=EventDraft(type="ReasoningStepCompleted", payload={"step": 2}))
    sealing.seal_new_events()
    export.audit_export_until_idle()
    assert run_verifier(audit_dir, public_key).returncode == 0
