"""Audit export: sealed ranges become signed, chained segments in a directory or in S3 with
Object Lock; failures are retried, then dead-lettered; a crash never yields two versions of a segment."""

from __future__ import annotations

import hashlib
import json
import socket
import stat
from datetime import UTC, datetime
from io import StringIO
from pathlib import Path
from typing import Any

import boto3
import pytest
from django.core.management import call_command
from pytest_django import DjangoCaptureOnCommitCallbacks

from backplane import celery_app
from backplane.delivery.models import DeadLetter, DeadLetterSource, DeadLetterStatus
from backplane.eventlog.models import Event
from backplane.integrity import sealing
from backplane.integrity import tasks as integrity_tasks
from backplane.integrity.audit import export
from backplane.integrity.audit import manifest as fmt
from backplane.integrity.models import AuditSegment, SignedTreeHead
from recovery.dead_letters import dead_letter_requeue
from tests.backplane.integrity.audit_support import (
    S3_CREDENTIALS,
    append,
    as_attacker,
    run_verifier,
    seed,
    verifier_env,
)


def read_manifest(path: Path, number: int) -> dict[str, Any]:
    return json.loads((path / fmt.manifest_name(number)).read_bytes())


def test_it_exports_sealed_events_to_read_only_files_that_verify_offline(
    db: None,
    audit_dir: Path,
    public_key: str,
) -> None:
    first, second = seed(steps=3), seed(steps=2)
    seal = sealing.seal_new_events()

    step = export.audit_export_next_segment()

    segment = step.segment
    assert segment is not None and (segment.number, segment.first_leaf, segment.tree_size) == (1, 0, seal.tree_size)
    assert sorted(p.name for p in audit_dir.iterdir()) == ["segment-00000001.jsonl", "segment-00000001.manifest.json"]
    for file in audit_dir.iterdir():
        assert stat.S_IMODE(file.stat().st_mode) == 0o444
    lines = (audit_dir / "segment-00000001.jsonl").read_bytes().splitlines()
    leaves = Event.objects.order_by("leaf__leaf_index")
    assert [json.loads(line)["position"] for line in lines] == [e.position for e in leaves]
    manifest = read_manifest(audit_dir, 1)
    head = SignedTreeHead.objects.get(tree_size=seal.tree_size)
    assert manifest["signed_tree_head"] == {"tree_size": head.tree_size, "root_hash": head.root_hash,
                                            "signed_at": head.signed_at, "signature": head.signature,
                                            "public_key": head.public_key}
    assert manifest["previous_manifest_sha256"] == "0" * 64 and manifest["public_key"] == public_key
    assert manifest["segment_sha256"] == hashlib.sha256((audit_dir / fmt.segment_name(1)).read_bytes()).hexdigest()
    assert segment.manifest_sha256 == hashlib.sha256((audit_dir / fmt.manifest_name(1)).read_bytes()).hexdigest()

    verified = run_verifier(audit_dir, public_key)

    assert verified.returncode == 0, verified.stderr
    assert f"1 segment(s), {first.last_seq + second.last_seq} event(s), 2 task(s)" in verified.stdout
    assert f"tree size {seal.tree_size}, root {head.root_hash}" in verified.stdout


def test_a_second_export_writes_only_the_new_range_and_chains_to_the_previous_manifest(
    db: None, audit_dir: Path, public_key: str
) -> None:
    task = seed(steps=3)
    first = sealing.seal_new_events()
    export.audit_export_until_idle()
    append(task, 2)  # the same task's chain continues in the next segment
    seed(steps=1)
    second = sealing.seal_new_events()

    run = export.audit_export_until_idle()

    assert [(s.number, s.first_leaf, s.tree_size) for s in run.segments] == [(2, first.tree_size, second.tree_size)]
    assert len((audit_dir / fmt.segment_name(2)).read_bytes().splitlines()) == second.tree_size - first.tree_size
    first_manifest = (audit_dir / fmt.manifest_name(1)).read_bytes()
    assert read_manifest(audit_dir, 2)["previous_manifest_sha256"] == hashlib.sha256(first_manifest).hexdigest()
    assert export.audit_export_until_idle().segments == []  # nothing new: nothing written
    assert len(list(audit_dir.iterdir())) == 4
    verified = run_verifier(audit_dir, public_key)
    assert verified.returncode == 0, verified.stderr
    assert f"2 segment(s), {Event.objects.count()} event(s), 2 task(s)" in verified.stdout


def test_segments_end_at_signed_heads_within_the_size_limit(
    db: None,
    audit_dir: Path,
    settings: Any,
) -> None:
    for _ in range(4):
        seed(steps=2)  # 3 events per task: 12 in all
    while sealing.seal_new_events(batch_size=3).sealed:
        pass
    assert list(SignedTreeHead.objects.order_by("tree_size").values_list("tree_size", flat=True)) == [3, 6, 9, 12]
    settings.BACKPLANE_AUDIT_SEGMENT_MAX_EVENTS = 7

    run = export.audit_export_until_idle()

    assert [(s.first_leaf, s.tree_size) for s in run.segments] == [(0, 6), (6, 12)]
    settings.BACKPLANE_AUDIT_SEGMENT_MAX_EVENTS = 1  # smaller than one seal run: the nearest head wins
    seed(steps=4)
    sealing.seal_new_events()
    assert [(s.first_leaf, s.tree_size) for s in export.audit_export_until_idle().segments] == [(12, 17)]


def test_nothing_sealed_means_nothing_exported(db: None, audit_dir: Path) -> None:
    seed()
    assert export.audit_export_next_segment() == export.ExportStep(ran=True, segment=None)
    assert not audit_dir.exists() or not list(audit_dir.iterdir())


def forget_recorded_segments() -> None:
    """What a crash between writing the objects and committing leaves behind: objects, no rows."""
    as_attacker(("DELETE FROM backplane_auditsegment", []))


def test_a_segment_written_but_not_recorded_is_recorded_as_it_was_not_duplicated(
    db: None,
    audit_dir: Path,
    public_key: str,
) -> None:
    seed()
    sealing.seal_new_events()
    original = export.audit_export_next_segment().segment
    assert original is not None
    manifest_before = (audit_dir / fmt.manifest_name(1)).read_bytes()
    forget_recorded_segments()
    seed()
    later = sealing.seal_new_events()  # a newer head must not stretch the already written segment

    run = export.audit_export_until_idle()

    assert [(s.number, s.first_leaf, s.tree_size) for s in run.segments] == [
        (1, 0, original.tree_size), (2, original.tree_size, later.tree_size)
    ]
    assert run.segments[0].manifest_sha256 == original.manifest_sha256
    assert (audit_dir / fmt.manifest_name(1)).read_bytes() == manifest_before
    assert len(list(audit_dir.iterdir())) == 4
    assert run_verifier(audit_dir, public_key).returncode == 0


def test_an_orphan_segment_file_gets_its_identical_manifest(db: None, audit_dir: Path, public_key: str) -> None:
    seed()
    sealing.seal_new_events()
    export.audit_export_next_segment()
    manifest_before = (audit_dir / fmt.manifest_name(1)).read_bytes()
    forget_recorded_segments()
    (audit_dir / fmt.manifest_name(1)).unlink()  # the crash came between the two writes
    seed()
    sealing.seal_new_events()

    first = export.audit_export_next_segment().segment

    assert first is not None and first.number == 1
    assert (audit_dir / fmt.manifest_name(1)).read_bytes() == manifest_before


def test_an_object_with_other_content_is_left_alone_and_nothing_recorded(db: None, audit_dir: Path) -> None:
    seed()
    sealing.seal_new_events()
    audit_dir.mkdir()
    stranger = audit_dir / fmt.segment_name(1)
    stranger.write_bytes(b'{"not": "ours"}\n')

    with pytest.raises(export.AuditExportFailed, match="left alone") as failure:
        export.audit_export_next_segment()

    assert failure.value.segment == 1
    assert stranger.read_bytes() == b'{"not": "ours"}\n'
    assert not AuditSegment.objects.exists()


def test_only_one_exporter_runs_at_a_time(db: None, audit_dir: Path) -> None:
    from django.db import connections

    seed()
    sealing.seal_new_events()
    other = connections.create_connection("default")  # another worker's session holding the lock
    try:
        with other.cursor() as cursor:
            cursor.execute("BEGIN")
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [export.EXPORTER_LOCK_KEY])
            assert export.audit_export_until_idle() == export.ExportRun(segments=[], locked_out=True)
            cursor.execute("ROLLBACK")
    finally:
        other.close()
    assert len(export.audit_export_until_idle().segments) == 1


def test_the_command_prints_what_it_exported(db: None, audit_dir: Path) -> None:
    seed(steps=2)
    seal = sealing.seal_new_events()
    out = StringIO()

    call_command("audit_export", stdout=out)

    assert f"exported segment 1: leaves 0-{seal.tree_size - 1} (tree size {seal.tree_size}" in out.getvalue()
    assert audit_dir.as_uri() in out.getvalue()
    out = StringIO()
    call_command("audit_export", stdout=out)
    assert out.getvalue().startswith("nothing new to export")


# --- failures: retried, then one dead letter; fixed, the export catches up ------------------------


def test_an_unwritable_directory_ends_in_one_dead_letter_then_exports_once_fixed(
    db: None, settings: Any, tmp_path: Path, public_key: str
) -> None:
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("a file where the audit directory's parent should be")
    settings.BACKPLANE_AUDIT_DIR = blocker / "audit"
    seed()
    seal = sealing.seal_new_events()

    result = integrity_tasks.audit_export.apply()  # eagerly, with every retry

    assert result.failed()
    dead = DeadLetter.objects.get()
    assert (dead.source, dead.status, dead.attempts) == (DeadLetterSource.AUDIT_EXPORT, DeadLetterStatus.PENDING, 5)
    assert dead.reference == f"segment 1 (leaves 0-{seal.tree_size - 1})"
    assert "Not a directory" in dead.error and str(blocker) in dead.error
    assert not AuditSegment.objects.exists()
    assert integrity_tasks.audit_export.apply().failed()  # the next hourly run fails again: still one dead letter
    assert DeadLetter.objects.get().attempts == 10

    blocker.unlink()
    assert integrity_tasks.audit_export.apply().get() == [1]
    assert AuditSegment.objects.get().tree_size == seal.tree_size
    assert run_verifier(blocker / "audit", public_key).returncode == 0


def test_requeueing_an_audit_export_dead_letter_runs_the_export(
    db: None, audit_dir: Path, django_capture_on_commit_callbacks: DjangoCaptureOnCommitCallbacks
) -> None:
    seed()
    sealing.seal_new_events()
    failure = export.AuditExportFailed("boom", segment=1, first_leaf=0, last_leaf=3, destination="file:///x")
    dead = export.audit_export_record_failure(error=failure, attempts=5)
    eager = celery_app.conf.task_always_eager
    celery_app.conf.task_always_eager = True
    try:
        with django_capture_on_commit_callbacks(execute=True) as callbacks:
            dead_letter_requeue(dead_letter_id=dead.pk, decided_by="auditor", reason="the disk is back")
    finally:
        celery_app.conf.task_always_eager = eager
    # After the commit: the export, once (and the decision counted on /metrics).
    assert [getattr(callback, "__self__", None) for callback in callbacks].count(integrity_tasks.audit_export) == 1
    assert DeadLetter.objects.get().status == DeadLetterStatus.REQUEUED
    assert AuditSegment.objects.count() == 1


# --- S3 with Object Lock, against moto's S3 server on 127.0.0.1 -------------------------------------


@pytest.fixture
def s3_bucket(
    s3_endpoint: str,
    settings: Any,
    monkeypatch: pytest.MonkeyPatch,
    request: pytest.FixtureRequest,
) -> Any:
    """A fresh Object Lock bucket, configured as the audit destination."""
    for name, value in S3_CREDENTIALS.items():
        monkeypatch.setenv(name, value)
    client = boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1")
    bucket = f"audit-{request.node.name.replace('_', '-')[:40]}".lower().rstrip("-")
    client.create_bucket(Bucket=bucket, ObjectLockEnabledForBucket=True)
    settings.BACKPLANE_AUDIT_S3_BUCKET = bucket
    settings.BACKPLANE_AUDIT_S3_PREFIX = "backplane/audit"
    settings.BACKPLANE_AUDIT_S3_ENDPOINT_URL = s3_endpoint
    settings.BACKPLANE_AUDIT_S3_REGION = "us-east-1"
    settings.BACKPLANE_AUDIT_S3_RETENTION_DAYS = 30
    return client


def test_it_exports_to_s3_with_a_compliance_lock_and_the_verifier_reads_it_there(
    db: None, s3_bucket: Any, s3_endpoint: str, settings: Any, public_key: str
) -> None:
    bucket = settings.BACKPLANE_AUDIT_S3_BUCKET
    task = seed(steps=3)
    sealing.seal_new_events()
    export.audit_export_until_idle()
    append(task, 2)
    sealing.seal_new_events()

    run = export.audit_export_until_idle()

    assert [s.number for s in run.segments] == [2]
    assert run.segments[0].destination == f"s3://{bucket}/backplane/audit/"
    keys = sorted(o["Key"] for o in s3_bucket.list_objects_v2(Bucket=bucket)["Contents"])
    names = (fmt.segment_name, fmt.manifest_name)
    assert keys == sorted(f"backplane/audit/{name(n)}" for n in (1, 2) for name in names)
    for key in keys:
        # moto's server does not implement GetObjectRetention; HEAD returns the same lock state.
        head = s3_bucket.head_object(Bucket=bucket, Key=key)
        assert head["ObjectLockMode"] == "COMPLIANCE"
        assert (head["ObjectLockRetainUntilDate"] - datetime.now(UTC)).days in (29, 30)
        version = s3_bucket.list_object_versions(Bucket=bucket, Prefix=key)["Versions"][0]["VersionId"]
        with pytest.raises(s3_bucket.exceptions.ClientError, match="AccessDenied"):
            s3_bucket.delete_object(Bucket=bucket, Key=key, VersionId=version)

    verified = run_verifier(f"s3://{bucket}/backplane/audit", public_key, env=verifier_env(**S3_CREDENTIALS),
                            args=("--endpoint-url", s3_endpoint))

    assert verified.returncode == 0, verified.stderr
    assert "2 segment(s), 6 event(s), 1 task(s)" in verified.stdout


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_an_unreachable_s3_endpoint_ends_in_one_dead_letter_then_exports_once_reachable(
    db: None, s3_bucket: Any, s3_endpoint: str, settings: Any
) -> None:
    seed()
    sealing.seal_new_events()
    settings.BACKPLANE_AUDIT_S3_ENDPOINT_URL = f"http://127.0.0.1:{closed_port()}"

    assert integrity_tasks.audit_export.apply().failed()

    dead = DeadLetter.objects.get(source=DeadLetterSource.AUDIT_EXPORT)
    assert dead.attempts == 5 and "Could not connect" in dead.error
    assert not AuditSegment.objects.exists()
    settings.BACKPLANE_AUDIT_S3_ENDPOINT_URL = s3_endpoint
    assert integrity_tasks.audit_export.apply().get() == [1]
    assert DeadLetter.objects.count() == 1


def test_a_bucket_without_object_lock_is_refused_loudly(db: None, s3_bucket: Any, settings: Any) -> None:
    s3_bucket.create_bucket(Bucket="no-lock-here")
    settings.BACKPLANE_AUDIT_S3_BUCKET = "no-lock-here"
    seed()
    sealing.seal_new_events()

    with pytest.raises(export.AuditExportFailed, match="ObjectLockConfiguration"):
        export.audit_export_next_segment()
    assert not AuditSegment.objects.exists()
