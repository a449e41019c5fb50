"""Migration 0032 moves a filled events table onto hash partitions while appends go on.

A fresh database on the suite's server is migrated to 0031 (the unpartitioned table), filled
and sealed through the product's writer and sealer (``append_load.py``, its own processes);
then ``manage.py migrate`` runs, as an operator runs it, while four more processes append
through the writer on their own connections. Afterwards: every event from before is there,
column for column; every acknowledged append is there once; nothing else is; every chain
verifies; the Merkle leaves and the root over the positions from before are unchanged, and the
sealer goes on from them; the sequence gives positions above all the old ones; and the two
locks held appends back briefly.
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

import psycopg
import pytest
from psycopg import sql

from backplane.eventlog.chain import GENESIS_HASH, stored_row_hash
from backplane.eventlog.partitioning import PARTITIONS, partition_name

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[3]
LOAD = Path(__file__).with_name("append_load.py")
# 40 000 events: four copy batches, so appends land between them.
FILL_TASKS, FILL_EVENTS = 80, 500
APPENDERS, TASKS_PER_APPENDER = 4, 5
# What "a short lock" means here: far below a client's timeout.
LOCK_LIMIT_SECONDS = 1.0

_ROWS_SQL = "SELECT position, row_to_json(e)::text FROM backplane_event e ORDER BY position"
_HASHED_SQL = """
SELECT task_id, seq, type, payload::text, agent, idempotency_key, lamport, causation_id, correlation_id,
       trace_id, recorded_at, prev_hash, hash
FROM backplane_event ORDER BY task_id, seq
"""


def _with_database(url: str, name: str) -> str:
    return urlunsplit(urlsplit(url)._replace(path="/" + quote(name)))


def _manage(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)


@pytest.fixture
def env() -> Iterator[dict[str, str]]:
    """A fresh database migrated to 0031 (events unpartitioned), dropped afterwards."""
    server_url = os.environ["DATABASE_URL"]
    name = f"partitioning_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server_url, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        environment = {**os.environ, "DATABASE_URL": _with_database(server_url, name),
                       "BACKPLANE_SIGNING_KEY": secrets.token_hex(32), "BACKPLANE_DB_POOL": "0"}
        for args in (("backplane", "0031_personal_data"), ("recovery",)):
            done = _manage("migrate", "--no-input", *args, env=environment)
            assert done.returncode == 0, done.stdout + done.stderr
        yield environment
    finally:
        with psycopg.connect(server_url, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def _relkind(conn: psycopg.Connection) -> str:
    [(kind,)] = conn.execute("SELECT relkind::text FROM pg_class WHERE oid = 'backplane_event'::regclass").fetchall()
    return kind


def _root(hashes: list[str]) -> bytes:
    """RFC 6962 over event hashes (a test-side copy, independent of backplane.integrity.merkle)."""
    nodes = [hashlib.sha256(b"\x00" + bytes.fromhex(h)).digest() for h in hashes]

    def mth(leaves: list[bytes]) -> bytes:
        if len(leaves) == 1:
            return leaves[0]
        split = 1 << ((len(leaves) - 1).bit_length() - 1)
        return hashlib.sha256(b"\x01" + mth(leaves[:split]) + mth(leaves[split:])).digest()

    return mth(nodes)


def _acknowledged(out: Path) -> list[tuple[str, int, int, str, float]]:
    rows = []
    for line in out.read_text().splitlines():
        task, seq, position, hash_, took = line.split()
        rows.append((task, int(seq), int(position), hash_, float(took)))
    return rows


def test_the_migration_partitions_a_filled_table_while_appends_go_on(env: dict[str, str], tmp_path: Path) -> None:
    fill = subprocess.run([sys.executable, str(LOAD), "fill", str(FILL_TASKS), str(FILL_EVENTS)], env=env,
                          capture_output=True, text=True, timeout=600)
    assert fill.returncode == 0, fill.stderr
    with psycopg.connect(env["DATABASE_URL"]) as conn:
        assert _relkind(conn) == "r"
        before: dict[int, str] = dict(conn.execute(_ROWS_SQL).fetchall())
        leaves_before = conn.execute(
            "SELECT leaf_index, event_id, event_hash FROM backplane_merkleleaf ORDER BY leaf_index").fetchall()
        root_before = _root([h for (h,) in conn.execute("SELECT hash FROM backplane_event ORDER BY position")])
    assert len(before) == FILL_TASKS * (FILL_EVENTS + 1)  # and each task's TaskCreated
    assert len(leaves_before) == len(before)

    stop = tmp_path / "stop"
    outs = [tmp_path / f"appender-{n}.txt" for n in range(APPENDERS)]
    appenders = [subprocess.Popen([sys.executable, str(LOAD), "append", str(TASKS_PER_APPENDER), str(stop), str(out)],
                                  env=env, stderr=subprocess.PIPE, text=True) for out in outs]
    try:
        deadline = time.monotonic() + 60
        while not all(out.exists() and out.stat().st_size > 0 for out in outs):
            assert time.monotonic() < deadline, "the appenders did not start"
            assert all(a.poll() is None for a in appenders), [a.stderr.read() for a in appenders if a.stderr]
            time.sleep(0.05)
        started = time.monotonic()
        migrate = _manage("migrate", "--no-input", env=env)
        migrate_seconds = time.monotonic() - started
        time.sleep(1.0)  # appends after the swap, on the partitioned table
    finally:
        stop.touch()
        for appender in appenders:
            appender.wait(timeout=60)
    assert migrate.returncode == 0, migrate.stdout + migrate.stderr
    for appender in appenders:
        assert appender.returncode == 0, appender.stderr.read() if appender.stderr else ""

    held = re.search(r"events partitioned: .* appends held (\d+) ms \(capture\) and (\d+) ms \(swap\)",
                     migrate.stdout + migrate.stderr)
    assert held, migrate.stdout + migrate.stderr
    capture_ms, swap_ms = int(held[1]), int(held[2])
    acknowledged = [row for out in outs for row in _acknowledged(out)]
    slowest = max(took for *_, took in acknowledged)
    figures = (f"migrate {migrate_seconds:.1f} s for {len(before)} events ({held[0]}); "
               f"{len(acknowledged)} appends meanwhile, the slowest {slowest * 1000:.0f} ms")
    assert capture_ms < LOCK_LIMIT_SECONDS * 1000 and swap_ms < LOCK_LIMIT_SECONDS * 1000, figures
    assert slowest < 2 * LOCK_LIMIT_SECONDS, figures
    assert "copied" in migrate.stdout + migrate.stderr

    with psycopg.connect(env["DATABASE_URL"]) as conn:
        assert _relkind(conn) == "p"
        partitions = {row[0] for row in conn.execute(
            "SELECT inhrelid::regclass::text FROM pg_inherits WHERE inhparent = 'backplane_event'::regclass")}
        assert partitions == {partition_name(r) for r in range(PARTITIONS)}
        leftovers = "SELECT to_regclass('backplane_event_partitioned'), to_regclass('backplane_event_partitioning')"
        assert conn.execute(leftovers).fetchone() == (None, None)
        after: dict[int, str] = dict(conn.execute(_ROWS_SQL).fetchall())
        # Every event from before, column for column, position included.
        assert {position: after.get(position) for position in before} == before
        # Every acknowledged append once, where the writer said; nothing else.
        stored = {(str(task), seq): (position, hash_) for task, seq, position, hash_ in conn.execute(
            "SELECT task_id, seq, position, hash FROM backplane_event WHERE position <> ALL(%s)", [list(before)])
            if seq > 1}
        assert stored == {(task, seq): (position, hash_) for task, seq, position, hash_, _ in acknowledged}, figures
        created = APPENDERS * TASKS_PER_APPENDER  # each appender's tasks' TaskCreated
        assert len(after) == len(before) + len(acknowledged) + created
        assert conn.execute("SELECT count(DISTINCT position) FROM backplane_event").fetchone() == (len(after),)
        assert conn.execute("SELECT convalidated FROM pg_constraint WHERE conrelid = 'backplane_event'::regclass"
                            " AND contype = 'f'").fetchall() == [(True,)]

        # Every chain links and hashes, with today's code.
        heads: dict[Any, tuple[int, str]] = {}
        for *hashed, stored_hash in conn.execute(_HASHED_SQL).fetchall():
            task_id, seq, prev_hash = hashed[0], hashed[1], hashed[11]
            assert (seq, prev_hash) == (heads.get(task_id, (0, GENESIS_HASH))[0] + 1,
                                        heads.get(task_id, (0, GENESIS_HASH))[1]), f"{task_id} broken at {seq}"
            assert stored_row_hash(hashed) == stored_hash
            heads[task_id] = (seq, stored_hash)
        projections = dict((task_id, (last_seq, head)) for task_id, last_seq, head in conn.execute(
            "SELECT id, last_seq, head_hash FROM backplane_task").fetchall())
        assert projections == heads

        # The leaves, and the root over the positions from before, are unchanged.
        assert conn.execute("SELECT leaf_index, event_id, event_hash FROM backplane_merkleleaf WHERE leaf_index < %s"
                            " ORDER BY leaf_index", [len(leaves_before)]).fetchall() == leaves_before
        hashes = [h for (h,) in conn.execute("SELECT hash FROM backplane_event WHERE position <= %s ORDER BY position",
                                             [max(before)]).fetchall()]
        assert _root(hashes) == root_before

    # The product goes on: an append gets a position above all, the sealer seals the rest, and
    # its signed head is the root over every event in position order.
    more = subprocess.run([sys.executable, str(LOAD), "fill", "1", "3"], env=env, capture_output=True, text=True,
                          timeout=120)
    assert more.returncode == 0, more.stderr
    with psycopg.connect(env["DATABASE_URL"]) as conn:
        [(newest,)] = conn.execute("SELECT min(position) FROM backplane_event WHERE task_id = (SELECT id"
                                 " FROM backplane_task WHERE created_by = 'filler' ORDER BY created_at DESC LIMIT 1)"
                                 ).fetchall()
        assert newest > max(after)
        [(events,)] = conn.execute("SELECT count(*) FROM backplane_event").fetchall()
        sealed = [h for (h,) in conn.execute("SELECT e.hash FROM backplane_merkleleaf l JOIN backplane_event e"
                                             " ON e.position = l.event_id ORDER BY l.leaf_index")]
        [(tree_size, root_hash)] = conn.execute(
            "SELECT tree_size, root_hash FROM backplane_signedtreehead ORDER BY tree_size DESC LIMIT 1").fetchall()
        assert tree_size == len(sealed) == events
        assert _root(sealed).hex() == root_hash
    verify = _manage("verify_chain", "--all", env=env)
    assert verify.returncode == 0 and "BROKEN" not in verify.stdout, verify.stdout + verify.stderr
