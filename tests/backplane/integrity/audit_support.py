"""Shared by the audit export and verifier tests: seeded events, the attacker, the verifier process."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from django.db import connection

from backplane.eventlog import services
from backplane.eventlog.chain import compute_hash, event_hashed_fields
from backplane.eventlog.models import Event, Task
from backplane.eventlog.writer import EventDraft
from backplane.integrity import sealing
from backplane.integrity.audit import export
from backplane.integrity.audit import manifest as fmt

REPO = Path(__file__).resolve().parents[3]

# What an auditor's machine does not have: no database, no Django settings.
_WITHHELD = ("DATABASE_URL", "DJANGO_SETTINGS_MODULE", "BACKPLANE_ENV", "BACKPLANE_VAR_DIR", "BACKPLANE_TEST_PGDATA")


def seed(steps: int = 3, namespace: str = "acme") -> Task:
    task = services.task_create(namespace=namespace, kind="k", input={"n": steps}, agent="planner").task
    append(task, steps)
    return task


def append(task: Task, steps: int) -> Task:
    for n in range(steps):
        services.event_append(namespace=task.namespace, task_id=task.pk, agent="a",
                              draft=EventDraft(type="ReasoningStepCompleted", payload={"step": n, "note": "ünïcode"}))
    task.refresh_from_db()
    return task


def as_attacker(*statements: tuple[str, list[Any]]) -> None:
    """A superuser with triggers skipped (session_replication_role = replica skips every user trigger)."""
    with connection.cursor() as cursor:
        cursor.execute("SET session_replication_role = replica")
        try:
            for sql, params in statements:
                cursor.execute(sql, params)
        finally:
            cursor.execute("SET session_replication_role = origin")


def rewrite_history(task: Task, *, seq: int, payload: dict[str, Any]) -> None:
    """Edit one event and recompute the task's whole chain after it (and the leaf table's copies),
    so that the chain alone verifies again."""
    events = list(Event.objects.filter(task=task).order_by("seq"))
    events[seq - 1].payload = payload
    prev = events[seq - 2].hash if seq > 1 else events[0].prev_hash
    statements: list[tuple[str, list[Any]]] = []
    for event in events[seq - 1:]:
        event.prev_hash = prev
        event.hash = compute_hash(event_hashed_fields(event))
        prev = event.hash
        statements.append((
            "UPDATE backplane_event SET payload = %s::jsonb, prev_hash = %s, hash = %s WHERE position = %s",
            [json.dumps(event.payload), event.prev_hash, event.hash, event.position],
        ))
        statements.append(("UPDATE backplane_merkleleaf SET event_hash = %s WHERE event_id = %s",
                           [event.hash, event.position]))
    statements.append(("UPDATE backplane_task SET head_hash = %s WHERE id = %s", [prev, task.pk]))
    as_attacker(*statements)


def verifier_env(**extra: str) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if key not in _WITHHELD}
    env.update(extra)
    return env


def run_verifier(location: str | Path, *keys: str, env: dict[str, str] | None = None,
                 args: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    """The verifier as an auditor runs it: its own process, no database, no settings."""
    command = [sys.executable, "-m", "backplane.integrity.audit", "verify", str(location), *args]
    for key in keys:
        command += ["--public-key", key]
    return subprocess.run(command, cwd=REPO, env=env or verifier_env(), capture_output=True, text=True, timeout=120)


def resign(path: Path, number: int, change: Callable[[dict[str, Any]], None],
           key: Ed25519PrivateKey | None = None) -> None:
    """Change a manifest and sign it again: with the real key (an insider who has it) or another."""
    file = path / fmt.manifest_name(number)
    manifest = json.loads(file.read_bytes())
    change(manifest)
    key = key or sealing.signing_key()
    manifest["signature"] = key.sign(fmt.manifest_message(manifest)).hex()
    file.chmod(0o644)
    file.write_bytes(fmt.encode_manifest(manifest))


@pytest.fixture
def audit_dir(settings: Any, tmp_path: Path) -> Path:
    """Exports go to a fresh directory (the default destination)."""
    settings.BACKPLANE_AUDIT_DIR = tmp_path / "audit"
    settings.BACKPLANE_AUDIT_S3_BUCKET = ""
    return tmp_path / "audit"


@pytest.fixture
def public_key() -> str:
    """The sealer's public key, which an auditor gets out of band (GET /api/v1/seals/latest/)."""
    return sealing.public_key_hex()



@dataclass
class Exported:
    path: Path
    public_key: str
    tasks: list[Task]


@pytest.fixture
def exported(db: None, audit_dir: Path, public_key: str) -> Exported:
    """Two segments; segment 2 holds two tasks' later events and a new task, interleaved."""
    first, second = seed(steps=2), seed(steps=2)
    sealing.seal_new_events()
    export.audit_export_until_idle()
    third = seed(steps=1)
    for _ in range(2):
        append(first, 1)
        append(second, 1)
    sealing.seal_new_events()
    assert len(export.audit_export_until_idle().segments) == 1
    return Exported(audit_dir, public_key, [first, second, third])


def writable(path: Path) -> Path:
    path.chmod(0o644)
    return path


def segment_lines(exported: Exported, number: int) -> list[bytes]:
    return (exported.path / fmt.segment_name(number)).read_bytes().splitlines(keepends=True)


def write_lines(exported: Exported, number: int, lines: list[bytes]) -> None:
    writable(exported.path / fmt.segment_name(number)).write_bytes(b"".join(lines))


def reseal(exported: Exported, number: int) -> None:
    """An insider with the signing key puts the segment file's new SHA-256 in a re-signed manifest."""
    digest = hashlib.sha256((exported.path / fmt.segment_name(number)).read_bytes()).hexdigest()
    resign(exported.path, number, lambda manifest: manifest.update(segment_sha256=digest))


# --- S3 with Object Lock, against moto's S3 server on 127.0.0.1 -------------------------------------

S3_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                  "AWS_DEFAULT_REGION": "us-east-1"}


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()
