"""Migration 0032 moves a filled events table onto hash partitions while appends go on.

A fresh database on the suite's server is migrated to 0031 (the unpartitioned table), filled
and sealed through the product's writer and sealer (``append_load.py``, its own processes);
then ``manage.py migrate`` runs, as an operator runs it, while four more processes append
through the writer on their own connections. Afterwards: every event from before is there,
column for column; every acknowledged append is there once; nothing else is; every chain
verifies; the Merkle leaves and the root over the positions from before are unchanged, and the
sealer goes on from them; the sequence gives positions above all the old ones; and the two
locks held appends back briefly.

The same holds when ``migrate`` is killed (SIGKILL) between two copy batches and again while
the swap waits for its lock, and retention deletes a task after each kill: the next ``migrate``
finishes, and the pruned tasks' events are not in the partitioned table. And an event taken out
of the copy behind the migration's back makes the swap refuse, the old table untouched.
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
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


@contextmanager
def _appending(env: dict[str, str], tmp_path: Path) -> Iterator[list[Path]]:
    """APPENDERS processes appending through the writer, each on its own connection, from when
    each has appended once until the block ends; yields the files of their acknowledged appends."""
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
        yield outs
    finally:
        stop.touch()
        for appender in appenders:
            appender.wait(timeout=60)
    for appender in appenders:
        assert appender.returncode == 0, appender.stderr.read() if appender.stderr else ""


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


def _assert_moved_whole(conn: psycopg.Connection, *, before: dict[int, str], leaves_before: list[tuple[Any, ...]],
                        root_before: bytes, acknowledged: list[tuple[str, int, int, str, float]], created: int,
                        pruned: frozenset[int] = frozenset(), figures: str = "") -> dict[int, str]:
    """The events table partitioned with nothing left over; every event from ``before`` there
    column for column but the ``pruned`` positions (retention's, during the migration); every
    acknowledged append once and ``created`` tasks' TaskCreated, nothing else; every chain; the
    leaves and the root over the positions from before. Returns the events after."""
    assert _relkind(conn) == "p"
    partitions = {row[0] for row in conn.execute(
        "SELECT inhrelid::regclass::text FROM pg_inherits WHERE inhparent = 'backplane_event'::regclass")}
    assert partitions == {partition_name(r) for r in range(PARTITIONS)}
    leftovers = ("SELECT to_regclass('backplane_event_partitioned'), to_regclass('backplane_event_partitioning'),"
                 " to_regclass('backplane_event_partitioning_pruned')")
    assert conn.execute(leftovers).fetchone() == (None, None, None)
    after: dict[int, str] = dict(conn.execute(_ROWS_SQL).fetchall())
    # Every event from before, column for column, position included; the pruned ones gone.
    assert {position: after.get(position) for position in before} == {
        position: None if position in pruned else row for position, row in before.items()}
    # Every acknowledged append once, where the writer said; nothing else.
    stored = {(str(task), seq): (position, hash_) for task, seq, position, hash_ in conn.execute(
        "SELECT task_id, seq, position, hash FROM backplane_event WHERE position <> ALL(%s)", [list(before)])
        if seq > 1}
    assert stored == {(task, seq): (position, hash_) for task, seq, position, hash_, _ in acknowledged}, figures
    assert len(after) == len(before) - len(pruned) + len(acknowledged) + created
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

    # The leaves, and the root over the positions from before, are unchanged: a pruned event's
    # leaf stays (retention keeps the tree), every other leaf is its event's hash.
    assert conn.execute("SELECT leaf_index, event_id, event_hash FROM backplane_merkleleaf WHERE leaf_index < %s"
                        " ORDER BY leaf_index", [len(leaves_before)]).fetchall() == leaves_before
    current: dict[int, str] = dict(conn.execute(
        "SELECT position, hash FROM backplane_event WHERE position <= %s", [max(before)]).fetchall())
    leaf_hashes = {event_id: event_hash for _, event_id, event_hash in leaves_before}
    hashes = [current[position] if position in current else leaf_hashes[position] for position in sorted(before)]
    assert _root(hashes) == root_before
    return after


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

    with _appending(env, tmp_path) as outs:
        started = time.monotonic()
        migrate = _manage("migrate", "--no-input", env=env)
        migrate_seconds = time.monotonic() - started
        time.sleep(1.0)  # appends after the swap, on the partitioned table
    assert migrate.returncode == 0, migrate.stdout + migrate.stderr

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
        after = _assert_moved_whole(conn, before=before, leaves_before=leaves_before, root_before=root_before,
                                    acknowledged=acknowledged, created=APPENDERS * TASKS_PER_APPENDER,
                                    figures=figures)

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


# --- interrupted, pruned meanwhile, refused ------------------------------------------------------

_PROGRESS_SQL = "SELECT copied_to, copy_through FROM backplane_event_partitioning"
# The statements the migration waits in (backplane/eventlog/partitioning.py): a copy batch's
# first, and the swap's lock.
_COPY_BATCH = "SELECT copy_through, copied_to FROM backplane_event_partitioning FOR UPDATE"
_SWAP_LOCK = "LOCK TABLE backplane_task, backplane_event IN ACCESS EXCLUSIVE MODE"
_MIRROR_TRIGGERS = {"backplane_event_partitioning_mirror", "backplane_event_partitioning_pruned"}
# docs/operations.md, "Partitioning the events table": giving a run up.
_GIVE_UP = """
DROP TRIGGER backplane_event_partitioning_mirror ON backplane_event;
DROP TRIGGER backplane_event_partitioning_pruned ON backplane_event;
DROP FUNCTION backplane_event_partitioning_mirror(), backplane_event_partitioning_pruned();
DROP TABLE backplane_event_partitioned, backplane_event_partitioning, backplane_event_partitioning_pruned;
"""


def _load(env: dict[str, str], *args: str) -> str:
    done = subprocess.run([sys.executable, str(LOAD), *args], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    return done.stdout


def _state(conn: psycopg.Connection) -> tuple[dict[int, str], list[tuple[Any, ...]], bytes]:
    """Every event as JSON by position, the Merkle leaves, and the root over the events."""
    events: dict[int, str] = dict(conn.execute(_ROWS_SQL).fetchall())
    leaves = conn.execute("SELECT leaf_index, event_id, event_hash FROM backplane_merkleleaf ORDER BY leaf_index"
                          ).fetchall()
    root = _root([h for (h,) in conn.execute("SELECT hash FROM backplane_event ORDER BY position")])
    return events, leaves, root


def _start_migrate(env: dict[str, str], log: Path) -> subprocess.Popen[str]:
    with log.open("w") as out:
        return subprocess.Popen([sys.executable, "manage.py", "migrate", "--no-input"], cwd=ROOT, env=env,
                                stdout=out, stderr=subprocess.STDOUT, text=True)


def _waiting_in(monitor: psycopg.Connection, migrate: subprocess.Popen[str], log: Path, statement: str) -> int:
    """The backend of ``migrate`` once it waits for a lock in ``statement``."""
    deadline = time.monotonic() + 120
    while True:
        # ``monitor`` is in autocommit: each query reads the activity afresh.
        waiting = monitor.execute("SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
                                  " AND wait_event_type = 'Lock' AND starts_with(query, %s)", [statement]).fetchall()
        if waiting:
            return int(waiting[0][0])
        assert migrate.poll() is None, log.read_text()
        assert time.monotonic() < deadline, f"migrate never waited in {statement!r}: {log.read_text()}"
        time.sleep(0.02)


def _kill(migrate: subprocess.Popen[str]) -> None:
    migrate.kill()  # SIGKILL: no handler runs, nothing is rolled back by the client
    assert migrate.wait(timeout=30) == -signal.SIGKILL


def _until_gone(monitor: psycopg.Connection, backend: int) -> None:
    """A killed client's backend ends (its transaction rolled back) once it next talks to it."""
    deadline = time.monotonic() + 60
    while monitor.execute("SELECT EXISTS (SELECT FROM pg_stat_activity WHERE pid = %s)", [backend]).fetchone() == (
            True,):
        assert time.monotonic() < deadline, f"backend {backend} outlived its client"
        time.sleep(0.05)


def _assert_not_swapped(conn: psycopg.Connection) -> None:
    """Before the swap, and nothing of it done: the old table serves with its own keys and
    triggers; the new one, the progress and the mirror are there for the next run."""
    assert _relkind(conn) == "r"
    assert conn.execute("SELECT to_regclass('backplane_event_partitioned') IS NOT NULL,"
                        " to_regclass('backplane_event_partitioning_pruned') IS NOT NULL").fetchone() == (True, True)
    triggers = {name for (name,) in conn.execute(
        "SELECT tgname FROM pg_trigger WHERE tgrelid = 'backplane_event'::regclass AND NOT tgisinternal")}
    assert triggers >= _MIRROR_TRIGGERS | {"backplane_event_no_update_or_delete"}, triggers
    assert conn.execute("SELECT conrelid::regclass::text FROM pg_constraint WHERE conname = 'backplane_event_pkey'"
                        ).fetchall() == [("backplane_event",)]
    assert conn.execute("SELECT count(*) FROM pg_constraint WHERE conrelid = 'backplane_event_partitioned'::regclass"
                        " AND contype = 'f'").fetchone() == (0,)
    assert conn.execute("SELECT pg_get_serial_sequence('backplane_event', 'position')").fetchone() == (
        "public.backplane_event_position_seq",)


def _held_at_the_swap(env: dict[str, str], monitor: psycopg.Connection, log: Path) -> None:
    """Run ``migrate`` while a transaction reads the tasks (so the swap's lock waits), and kill it
    there, its copy finished."""
    with psycopg.connect(env["DATABASE_URL"]) as reader:
        reader.execute("SELECT FROM backplane_task LIMIT 1")  # ACCESS SHARE until this block ends
        migrate = _start_migrate(env, log)
        try:
            backend = _waiting_in(monitor, migrate, log, _SWAP_LOCK)
            copied_to, through = monitor.execute(_PROGRESS_SQL).fetchone() or (None, None)
            assert copied_to == through, log.read_text()
        finally:
            if migrate.poll() is None:
                _kill(migrate)
    _until_gone(monitor, backend)


def _prune(monitor: psycopg.Connection, task_id: uuid.UUID, *, events: int) -> None:
    """Retention deletes the task (recovery migration 0006), its events already in the copy."""
    assert monitor.execute("SELECT count(*) FROM backplane_event_partitioned WHERE task_id = %s",
                           [task_id]).fetchone() == (events,)
    assert monitor.execute("SELECT backplane_prune_task(%s)", [task_id]).fetchone() == (events,)


def test_a_killed_migrate_resumes_and_leaves_out_the_tasks_retention_pruned_meanwhile(env: dict[str, str],
                                                                                       tmp_path: Path) -> None:
    env = {**env, "BACKPLANE_AUDIT_DIR": str(tmp_path / "audit")}
    # Two finished, sealed and exported tasks retention may delete, first in position order.
    first, second = (uuid.UUID(task) for task in _load(env, "finish", "2").split())
    _load(env, "fill", str(FILL_TASKS), str(FILL_EVENTS))
    with psycopg.connect(env["DATABASE_URL"], autocommit=True) as monitor:
        before, leaves_before, root_before = _state(monitor)
        assert len(leaves_before) == len(before)
        positions = {task: [p for (p,) in monitor.execute("SELECT position FROM backplane_event WHERE task_id = %s",
                                                           [task])] for task in (first, second)}

        with _appending(env, tmp_path) as outs:
            # 1. Killed between two copy batches: this connection takes the progress row as a
            #    batch commits, so the next one waits for it.
            log = tmp_path / "migrate-1.txt"
            migrate = _start_migrate(env, log)
            try:
                deadline = time.monotonic() + 120
                while not (monitor.execute("SELECT to_regclass('backplane_event_partitioning') IS NOT NULL"
                                           ).fetchone() == (True,) and
                           (monitor.execute(_PROGRESS_SQL).fetchone() or (0, 0))[0] > 0):
                    assert migrate.poll() is None, log.read_text()
                    assert time.monotonic() < deadline, log.read_text()
                    time.sleep(0.02)
                with psycopg.connect(env["DATABASE_URL"]) as holder:
                    held = holder.execute(_PROGRESS_SQL + " FOR UPDATE").fetchone()
                    assert held is not None and 0 < held[0] < held[1], held
                    backend = _waiting_in(monitor, migrate, log, _COPY_BATCH)
                    _kill(migrate)
            finally:
                if migrate.poll() is None:
                    _kill(migrate)
            _until_gone(monitor, backend)
            _assert_not_swapped(monitor)
            assert monitor.execute(_PROGRESS_SQL).fetchone() == held
            _prune(monitor, first, events=len(positions[first]))

            # 2. Killed while the swap waits for its lock, the copy done.
            _held_at_the_swap(env, monitor, tmp_path / "migrate-2.txt")
            _assert_not_swapped(monitor)
            _prune(monitor, second, events=len(positions[second]))

            # 3. Run again, to the end.
            migrate_done = _manage("migrate", "--no-input", env=env)
            time.sleep(1.0)  # appends after the swap, on the partitioned table
        assert migrate_done.returncode == 0, migrate_done.stdout + migrate_done.stderr
        assert "events partitioned" in migrate_done.stdout + migrate_done.stderr

        acknowledged = [row for out in outs for row in _acknowledged(out)]
        _assert_moved_whole(monitor, before=before, leaves_before=leaves_before, root_before=root_before,
                            acknowledged=acknowledged, created=APPENDERS * TASKS_PER_APPENDER,
                            pruned=frozenset(positions[first] + positions[second]))
        assert monitor.execute("SELECT count(*) FROM backplane_task WHERE id = ANY(%s)",
                               [[first, second]]).fetchone() == (0,)
    verify = _manage("verify_chain", "--all", env=env)
    assert verify.returncode == 0 and "BROKEN" not in verify.stdout, verify.stdout + verify.stderr


@pytest.mark.parametrize(("lost", "which"), [("copied", "at or below"), ("mirrored", "above")])
def test_the_swap_refuses_a_copy_that_lost_an_event_and_leaves_the_old_table(
    env: dict[str, str], tmp_path: Path, lost: str, which: str
) -> None:
    _load(env, "fill", "10", "100")
    with psycopg.connect(env["DATABASE_URL"], autocommit=True) as monitor:
        _held_at_the_swap(env, monitor, tmp_path / "migrate-1.txt")
        if lost == "mirrored":
            _load(env, "fill", "1", "3")  # appended after step 1: written to both tables by the mirror
        before, leaves_before, root_before = _state(monitor)
        # An event goes from the copy, behind the migration's back (triggers skipped).
        with psycopg.connect(env["DATABASE_URL"]) as tamper:
            tamper.execute("SET LOCAL session_replication_role = replica")
            extreme = "min" if lost == "copied" else "max"
            tamper.execute(f"DELETE FROM backplane_event_partitioned WHERE position = (SELECT {extreme}(position)"
                           " FROM backplane_event_partitioned)")

        for _run in range(2):  # refused, and again: nothing changed in between
            refused = _manage("migrate", "--no-input", env=env)
            assert refused.returncode != 0
            assert re.search(rf"partitioning refused the swap: backplane_event holds \d+ events {which} position"
                             r" \d+ .*backplane_event_partitioned", refused.stderr), refused.stdout + refused.stderr
            _assert_not_swapped(monitor)
            assert _state(monitor) == (before, leaves_before, root_before)

        # Given up as docs/operations.md says, the next run starts over and goes through.
        monitor.execute(_GIVE_UP)
        done = _manage("migrate", "--no-input", env=env)
        assert done.returncode == 0, done.stdout + done.stderr
        _assert_moved_whole(monitor, before=before, leaves_before=leaves_before, root_before=root_before,
                            acknowledged=[], created=0)
