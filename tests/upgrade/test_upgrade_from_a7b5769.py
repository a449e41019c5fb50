"""A database made by commit a7b5769 upgrades with today's migrations and keeps its data.

``schema_a7b5769.sql.gz`` is a plain-SQL dump of a database that a7b5769's own services filled
(see ``make_fixture.py`` for what is in it and how to regenerate it). It is committed rather
than rebuilt from a checkout because CI clones may be shallow.

The test loads the dump into a fresh database on the suite's PostgreSQL server, runs the
current code's ``manage.py migrate`` over it (a subprocess: the upgrade exactly as an
operator runs it), checks that no model change lacks a migration, and then that nothing was
lost: the row counts measured when the fixture was made, the dead-letter reviewers' permission,
every event hash and chain link (recomputed with today's code, and by ``verify_chain``), and
the signed Merkle tree heads. The database is dropped afterwards (the append-only triggers
refuse DELETE and TRUNCATE, not DROP DATABASE).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote, urlsplit, urlunsplit

import psycopg
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from psycopg import sql

from backplane.eventlog.chain import GENESIS_HASH, stored_row_hash

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = Path(__file__).with_name("schema_a7b5769.sql.gz")

# Measured from the fixture (make_fixture.py prints them). Tables that today's migrations may
# legitimately add rows to (django_migrations, django_content_type, auth_permission) are left out.
EXPECTED_COUNTS = {
    "backplane_task": 11,
    "backplane_event": 52,
    "backplane_outboxmessage": 45,
    "backplane_deadletter": 4,
    "recovery_toolcall": 5,
    "backplane_agent": 7,
    "auth_user": 2,
    # The fixture's "dead-letter reviewers", backplane 0012's "Reviewers", recovery 0013's "Viewers" and
    # "Operators", recovery 0017's "Approvers", recovery 0021's "Privacy officers".
    "auth_group": 6,
    "auth_user_groups": 1,
    "backplane_webhooksubscription": 2,
    "backplane_breakertransition": 1,
    "backplane_merkleleaf": 51,
    "backplane_signedtreehead": 2,
    "backplane_auditsegment": 2,
    "backplane_verificationrun": 2,
    "backplane_verifiedhead": 11,
    "recovery_tool": 1,
}
EXPECTED_TASK_STATUSES = {
    "completed": 2,
    "pending": 4,
    "running": 1,
    "failed": 1,
    "compensated": 1,
    "dead_lettered": 2,
}
EXPECTED_DEAD_LETTERS = {("task", "pending"): 1, ("task", "requeued"): 1, ("task", "discarded"): 1,
                         ("outbox", "requeued"): 1}

# The columns stored_row_hash takes, in its order (chain.HASHED_COLUMNS), the payload as text.
_EVENTS_SQL = """
SELECT task_id, seq, type, payload::text, agent, idempotency_key, lamport, causation_id, correlation_id,
       trace_id, recorded_at, prev_hash, hash
FROM backplane_event ORDER BY task_id, seq
"""

_REVIEWER_PERMISSION_SQL = """
SELECT u.username FROM auth_user u
JOIN auth_user_groups ug ON ug.user_id = u.id
JOIN auth_group g ON g.id = ug.group_id
JOIN auth_group_permissions gp ON gp.group_id = g.id
JOIN auth_permission p ON p.id = gp.permission_id
JOIN django_content_type ct ON ct.id = p.content_type_id
WHERE ct.app_label = 'backplane' AND ct.model = 'deadletter' AND p.codename = 'review_deadletter'
  AND g.name = 'dead-letter reviewers' AND u.is_staff AND u.is_active
"""


def _with_database(url: str, name: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path="/" + quote(name)))


def _manage(*args: str, database_url: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DATABASE_URL": database_url}
    return subprocess.run(
        [sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=240
    )


@pytest.fixture
def upgraded_url() -> Iterator[str]:
    """A fresh database on the suite's server holding the a7b5769 dump, dropped afterwards."""
    server_url = os.environ["DATABASE_URL"]
    name = f"upgrade_a7b5769_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server_url, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        url = _with_database(server_url, name)
        dump = gzip.decompress(FIXTURE.read_bytes()).decode("utf-8")
        # No parameters: psycopg sends the script as one simple query, every statement in one
        # transaction, and leaves the '%' in it alone.
        with psycopg.connect(url) as conn:
            conn.execute(dump)
        yield url
    finally:
        with psycopg.connect(server_url, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def test_a7b5769_database_upgrades_without_losing_data(upgraded_url: str) -> None:
    migrate = _manage("migrate", "--no-input", database_url=upgraded_url)
    assert migrate.returncode == 0, f"migrate failed:\n{migrate.stdout}\n{migrate.stderr}"

    check = _manage("makemigrations", "--check", "--dry-run", database_url=upgraded_url)
    assert check.returncode == 0, f"models and migrations disagree:\n{check.stdout}\n{check.stderr}"

    with psycopg.connect(upgraded_url) as conn:
        counts = {table: _count_rows(conn, table) for table in EXPECTED_COUNTS}
        assert counts == EXPECTED_COUNTS

        statuses: dict[str, int] = dict(
            conn.execute("SELECT status, count(*) FROM backplane_task GROUP BY status").fetchall())
        assert statuses == EXPECTED_TASK_STATUSES
        letters = {
            (source, status): n
            for source, status, n in conn.execute(
                "SELECT source, status, count(*) FROM backplane_deadletter GROUP BY source, status"
            ).fetchall()
        }
        assert letters == EXPECTED_DEAD_LETTERS

        # Permissions survive: the staff operator reviews dead letters through its group.
        assert [row[0] for row in conn.execute(_REVIEWER_PERMISSION_SQL).fetchall()] == ["operator"]
        assert conn.execute("SELECT username FROM auth_user WHERE is_superuser").fetchall() == [("admin",)]
        # Migration 0012 adds the dashboard's Reviewers group, holding the same permission.
        assert conn.execute(
            "SELECT count(*) FROM auth_group g JOIN auth_group_permissions gp ON gp.group_id = g.id "
            "JOIN auth_permission p ON p.id = gp.permission_id "
            "WHERE g.name = 'Reviewers' AND p.codename = 'review_deadletter'"
        ).fetchone() == (1,)

        _assert_chains_verify(conn)
        _assert_tree_heads_verify(conn)

    verify = _manage("verify_chain", "--all", database_url=upgraded_url)
    assert verify.returncode == 0, f"verify_chain failed:\n{verify.stdout}\n{verify.stderr}"
    assert "BROKEN" not in verify.stdout, verify.stdout

    # a7b5769's sagas set `compensated` on the row only: the one history there that is not all
    # events. --check names exactly that task; an operator records the row in its log and the
    # check is clean, with the row unchanged and every chain still valid.
    drift = _manage("rebuild_projections", "--check", database_url=upgraded_url)
    assert drift.returncode == 1, drift.stdout + drift.stderr
    assert drift.stdout.count("differs from its log") == 1, drift.stdout
    assert "status: row='compensated' log='failed'" in drift.stdout, drift.stdout
    reconcile = _manage("rebuild_projections", "--reconcile", "--by", "user:admin", "--reason",
                        "sagas before the upgrade wrote no status events", database_url=upgraded_url)
    assert reconcile.returncode == 0 and "recorded 1 task row(s)" in reconcile.stdout, reconcile.stderr
    clean = _manage("rebuild_projections", "--check", database_url=upgraded_url)
    assert clean.returncode == 0, clean.stdout
    with psycopg.connect(upgraded_url) as conn:
        statuses = dict(conn.execute("SELECT status, count(*) FROM backplane_task GROUP BY status").fetchall())
        assert statuses == EXPECTED_TASK_STATUSES
        reconciled = conn.execute("SELECT count(*) FROM backplane_event WHERE type = 'ProjectionReconciled'")
        assert reconciled.fetchone() == (1,)
    verify = _manage("verify_chain", "--all", database_url=upgraded_url)
    assert verify.returncode == 0 and "BROKEN" not in verify.stdout, verify.stdout + verify.stderr


def _count_rows(conn: psycopg.Connection, table: str) -> int:
    [(count,)] = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(table))).fetchall()
    return count


def _assert_chains_verify(conn: psycopg.Connection) -> None:
    """Every stored event hash recomputes with today's code and links to the one before; every
    task's projection ends on its chain's head."""
    heads: dict[uuid.UUID, tuple[int, str]] = {}
    checked = 0
    for *hashed, stored_hash in conn.execute(_EVENTS_SQL).fetchall():
        task_id, seq, prev_hash = hashed[0], hashed[1], hashed[11]
        last_seq, last_hash = heads.get(task_id, (0, GENESIS_HASH))
        assert (seq, prev_hash) == (last_seq + 1, last_hash), f"task {task_id}: chain broken at seq {seq}"
        assert stored_row_hash(hashed) == stored_hash, f"task {task_id}: event {seq} no longer hashes to its hash"
        heads[task_id] = (seq, stored_hash)
        checked += 1
    assert checked == EXPECTED_COUNTS["backplane_event"]
    projections = {task_id: (last_seq, head_hash) for task_id, last_seq, head_hash in
                   conn.execute("SELECT id, last_seq, head_hash FROM backplane_task").fetchall()}
    assert projections == heads


def _mth(leaves: list[bytes]) -> bytes:
    """RFC 6962 Merkle tree hash over leaf hashes (a test-side copy, independent of backplane.merkle)."""
    if len(leaves) == 1:
        return leaves[0]
    split = 1 << ((len(leaves) - 1).bit_length() - 1)
    return hashlib.sha256(b"\x01" + _mth(leaves[:split]) + _mth(leaves[split:])).digest()


def _assert_tree_heads_verify(conn: psycopg.Connection) -> None:
    """Each signed tree head still matches the sealed events' hashes and its Ed25519 signature."""
    sealed = conn.execute(
        "SELECT l.leaf_index, l.event_hash, e.hash FROM backplane_merkleleaf l"
        " JOIN backplane_event e ON e.position = l.event_id ORDER BY l.leaf_index"
    ).fetchall()
    assert [index for index, _, _ in sealed] == list(range(len(sealed)))
    assert all(sealed_hash == event_hash for _, sealed_hash, event_hash in sealed)
    leaves = [hashlib.sha256(b"\x00" + bytes.fromhex(event_hash)).digest() for _, _, event_hash in sealed]
    heads = conn.execute(
        "SELECT tree_size, root_hash, signed_at, signature, public_key FROM backplane_signedtreehead"
        " ORDER BY tree_size"
    ).fetchall()
    assert heads
    for tree_size, root_hash, signed_at, signature, public_key in heads:
        assert _mth(leaves[:tree_size]).hex() == root_hash, f"tree head {tree_size}: root differs"
        # What is signed: RFC 8785 JSON of these three fields (keys sorted, no spaces).
        message = json.dumps({"root_hash": root_hash, "signed_at": signed_at, "tree_size": tree_size},
                             separators=(",", ":")).encode()
        Ed25519PublicKey.from_public_bytes(bytes.fromhex(public_key)).verify(bytes.fromhex(signature), message)
