"""Every chain check recomputes hashes with the independent implementation, never the writer's.

A writer whose hashing has a bug (here: it leaves the payload out, the mistake that would let
anyone edit payloads unseen) writes chains that its own hashing calls valid. Each check below
must call them broken: the API's verify, the periodic runs, ``manage.py verify_chain`` and the
offline verifier of the audit export.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError, call_command

from backplane.eventlog import chain
from backplane.eventlog.canonical import canonical_sha256
from backplane.eventlog.models import Task
from backplane.integrity import sealing
from backplane.integrity import tasks as integrity_tasks
from backplane.integrity.audit import export
from backplane.integrity.audit.verify import main
from backplane.integrity.verification import chain_check
from tests.backplane.integrity.audit_support import seed


def _hash_without_payload(value: Any) -> str:
    return canonical_sha256({k: v for k, v in value.items() if k != "payload"})


@pytest.fixture
def buggy_writer(db: None, monkeypatch: pytest.MonkeyPatch) -> Iterator[Task]:
    """A task written while the writer's hashing (backplane.eventlog.chain) left payloads out;
    the bug stays in place while the checks run, as it would in a deployed writer."""
    monkeypatch.setattr(chain, "canonical_sha256", _hash_without_payload)
    yield seed(steps=3)


def test_it_finds_a_chain_the_writers_hashing_calls_valid(buggy_writer: Task) -> None:
    result = chain_check(task=buggy_writer)
    assert (result.valid, result.first_invalid_seq) == (False, 1)


def test_manage_py_verify_chain_uses_the_independent_hashing(buggy_writer: Task) -> None:
    with pytest.raises(CommandError, match="broken chain"):
        call_command("verify_chain", "--all", stdout=io.StringIO())


def test_the_periodic_full_run_uses_the_independent_hashing(buggy_writer: Task) -> None:
    assert integrity_tasks.verify_chains_full()["failures"] >= 1


def test_the_api_verify_uses_the_independent_hashing(buggy_writer: Task, client: Any) -> None:
    from backplane.eventlog import services

    token = services.agent_create(name="auditor", namespace=buggy_writer.namespace).token
    answer = client.get(f"/api/v1/tasks/{buggy_writer.pk}/verify/", HTTP_AUTHORIZATION=f"Bearer {token}")
    assert answer.status_code == 200
    assert (answer.json()["valid"], answer.json()["first_invalid_seq"]) == (False, 1)


def test_the_audit_exports_verifier_uses_the_independent_hashing(
    buggy_writer: Task, audit_dir: Path, public_key: str, capsys: pytest.CaptureFixture[str]
) -> None:
    sealing.seal_new_events()
    assert export.audit_export_until_idle().segments
    code = main(["verify", str(audit_dir), "--public-key", public_key])
    out = capsys.readouterr()
    assert code != 0
    assert "the hash recomputed from its content" in out.out + out.err
